"""The benchmarks build their inputs from the scripts' own types: a change to a replay item must not break them
unnoticed (benchmarks/learner.py once did, found only on a lent GPU). Timings are never asserted."""

import jax
import pytest

from benchmarks import learner


@pytest.mark.parametrize("name", list(learner.METHODS))
def test_learner_benchmark_batch_is_a_valid_replay_item(name):
    script, flags = learner.METHODS[name]
    args = script.Args(**flags, replay_size=64, min_replay_size=8)
    batch = jax.eval_shape(lambda key: learner.random_batch(script, args, key), jax.random.PRNGKey(0))
    assert set(batch.steps._fields) == set(script.Step._fields)
    assert batch.steps.obs.shape[:2] == (args.batch_size, args.sequence_length)


def test_minihack_benchmark_runs_its_env_rows(capsys):
    """The MiniHack observation benchmark's env rows on a few steps, worker processes included (the training-loop row
    compiles the Impala network: left to the benchmark itself)."""
    from benchmarks import minihack_env

    minihack_env.main(minihack_env.Args(num_envs=4, steps=3, repeats=1, train_loop=False))
    out = capsys.readouterr().out
    assert "NLE + pixel_crop" in out and "tile crops + jitted render" in out and "worker processes" in out


def test_the_sgd_variants_command_runs_its_rows_and_survives_an_unknown_xla_flag(tmp_path):
    """benchmarks/sgd_variants.py as a lent GPU runs it, at tiny sizes: the reference, old and new rows run in their
    own processes and report their compiled programs' loops, the new step's gradient against the reference; a row
    with an XLA flag this XLA does not know fails alone, with the flag named; the files come back."""
    import json
    import subprocess
    import sys

    out = tmp_path / "out"
    done = subprocess.run([sys.executable, "-m", "benchmarks.sgd_variants", "--tiny", "--seeds", "2", "--calls", "2",
                           "--budget-seconds", "400", "--rows", "old", "new", "--custom-flags=--xla_no_such_flag=1",
                           "--out", str(out), "--work-dir", str(tmp_path / "work")],
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    rows = {r["row"]: r for r in json.loads((out / "results.json").read_text())["rows"]}
    assert [rows[n]["status"] for n in ("reference_babyai_k2", "old", "new")] == ["ok"] * 3
    assert "Unknown flag" in rows["custom"]["status"] and "--xla_no_such_flag" in rows["custom"]["status"]
    old, new = rows["old"], rows["new"]
    assert len(old["loops"]) == len(new["loops"]) == 3 and new["ops_per_iteration"] < old["ops_per_iteration"]
    assert new["grad_error"] < 1e-4 and new["priority_error"] < 1e-4 and not new["nan"]
    assert "fastest exact row" in done.stdout and "| custom |" in done.stdout
    assert {p.name for p in out.iterdir()} <= {"results.json", "sgd_variants.log", "hlo_old.txt.gz",
                                                "hlo_new.txt.gz"}
