"""The benchmarks build their inputs from the scripts' own types: a change to a replay item must not break them
unnoticed (benchmarks/learner.py once did, found only on a GPU). Timings are never asserted."""

import jax
import pytest

from benchmarks import learner


def test_the_flop_count_goes_through_loops():
    """benchmarks/hlo.py counts a matmul inside a 7-step scan 7 times (XLA's cost analysis counts its body once), a
    matmul inside a fusion, and a nested loop by the product of the trip counts."""
    import jax.numpy as jnp

    from benchmarks.hlo import matmul_flops

    a, b = jnp.ones((16, 32)), jnp.ones((32, 32))
    one = 2 * 16 * 32 * 32

    def inner(x):
        return jax.lax.scan(lambda c, _: (jnp.tanh(c @ b), None), x, None, length=3)[0]

    def program(x):
        x = jnp.tanh(x @ b) + 1.0  # one outside the loops
        x = jax.lax.scan(lambda c, _: (jnp.tanh(c @ b), None), x, None, length=7)[0]
        return jax.lax.scan(lambda c, _: (inner(c), None), x, None, length=5)[0]

    compiled = jax.jit(program).lower(a).compile()
    assert matmul_flops(compiled.as_text()) == (1 + 7 + 5 * 3) * one


@pytest.mark.parametrize("method", ["msfa", "usfa"])
def test_the_learner_benchmark_runs_tiny(method, capsys):
    """A FARM method's rows (both backends) and an LSTM method's at tiny sizes: the scripts' own sgd_step in a scan,
    its FLOPs through the loops, end to end (the other methods run the same code with other scripts' Args)."""
    learner.main(learner.Args(method=method, tiny=True, steps=2, repeats=1, matmul_size=64, replay_size=64,
                              json=True))
    rows = [__import__("json").loads(line[4:]) for line in capsys.readouterr().out.splitlines()
            if line.startswith("ROW ")]
    assert [r["backend"] for r in rows] == (["plain", "fused"] if method == "msfa" else ["-"])
    assert all(r["gflop"] > r["xla_gflop_per_body"] > 0 and r["env_sps_per_seed"] > 0 for r in rows)


def test_minihack_benchmark_runs_its_env_rows(capsys):
    """The MiniHack observation benchmark's env rows on a few steps, worker processes included (the training-loop row
    compiles the Impala network: left to the benchmark itself)."""
    from benchmarks import minihack_env

    minihack_env.main(minihack_env.Args(num_envs=4, steps=3, repeats=1, train_loop=False))
    out = capsys.readouterr().out
    assert "NLE + pixel_crop" in out and "tile crops + jitted render" in out and "worker processes" in out


def test_the_sgd_variants_command_runs_its_rows_and_survives_an_unknown_xla_flag(tmp_path):
    """benchmarks/sgd_variants.py at tiny sizes: an xla and a pallas row share a process and report their compiled
    programs and the pallas gradient's difference from the xla row's; a training-loop slice reports env steps/s;
    a row with an XLA flag this XLA does not know fails alone, with the flag named; the table and files come out."""
    import json
    import subprocess
    import sys

    out = tmp_path / "out"
    done = subprocess.run([sys.executable, "-m", "benchmarks.sgd_variants", "--tiny", "--seeds", "1", "--calls", "1",
                           "--budget-seconds", "500", "--rows", "pallas", "train_fused",
                           "--custom-flags=--xla_no_such_flag=1", "--out", str(out), "--work-dir",
                           str(tmp_path / "work")], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    rows = {r["row"]: r for r in json.loads((out / "results.json").read_text())["rows"]}
    assert list(rows) == ["fused", "pallas", "train_fused", "custom"]  # the pallas row's fused partner comes first
    assert [rows[n]["status"] for n in ("fused", "pallas", "train_fused")] == ["ok"] * 3, rows
    assert "Unknown flag" in rows["custom"]["error"] and "--xla_no_such_flag" in rows["custom"]["error"]
    assert rows["pallas"]["grad_diff"] < 1e-5 and rows["pallas"]["priority_diff"] < 1e-5 and not rows["pallas"]["nan"]
    assert rows["train_fused"]["env_sps_per_seed"] > 0 and rows["train_fused"]["learning"]
    assert rows["pallas"]["gflop"] > 0
    assert "fastest exact backend here" in done.stdout and "| custom |" in done.stdout
    assert {p.name for p in out.iterdir()} == {"results.json", "sgd_variants.log", "hlo_fused.txt.gz",
                                               "hlo_pallas.txt.gz"}


def test_the_sgd_variants_fruitbot_rows_time_drawing_against_stored_frames():
    """The fruitbot_states rows' batch holds the script's GameViews of its own level pool, and the step they time
    draws frames from them as msfa_fruitbot.py's sgd_step does (traced, not run; the fruitbot rows read frames)."""
    import dataclasses

    from benchmarks import sgd_variants
    from common.envs.fruitbot_jax import GameView

    bench = sgd_variants.Args(tiny=True)
    script, args = sgd_variants.script_args(sgd_variants.Row("s", problem="msfa_fruitbot_states"), bench)
    args = dataclasses.replace(args, train_levels=4)
    setup = script.make_setup(args)
    batch = sgd_variants.random_batch(script, args, "fruitbot-states", jax.random.PRNGKey(0), setup=setup)
    assert isinstance(batch.steps.obs, GameView) and batch.steps.obs.level.shape == (args.batch_size,
                                                                                     args.sequence_length)
    steps = jax.eval_shape(lambda s: script.replay_frames(setup, s), batch.steps)
    assert steps.obs.shape == (args.batch_size, args.sequence_length, 64, 64, 3)
    assert "fruitbot_states_fused" in {r.name for r in sgd_variants.ROWS}
