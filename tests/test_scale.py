"""Paper scale: seeds spread over several devices give the single-device results; the protocol runner
(tools/protocol/) trains real methods here at tiny settings, is interrupted and resumes; its scheduling (the
paper's order, one method per device, skipping complete methods, --max-minutes, Ctrl-C) is checked with stand-in runs
whose timeline does not depend on this machine's speed."""

import csv
import json
import lzma
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest

import msfa_babyai as msfa
from common.run import ConfigError, parse_args
from tools import protocol

ROOT = Path(__file__).resolve().parent.parent
TINY = ["--num-envs", "4", "--sequence-period", "8", "--sequence-length", "9", "--replay-size", "64",
        "--min-replay-size", "8", "--batch-size", "4", "--samples-per-insert", "2.0", "--target-update-period", "3",
        "--eval-episodes", "2"]
SMALL_NET = ["--num-modules", "2", "--module-size", "16", "--attention-heads", "1", "--psi-hidden", "8",
             "--phi-hidden", "8"]


def read(path: Path):
    with path.open() as f:
        return list(csv.DictReader(f))


def test_seeds_over_two_devices_give_the_single_device_results(tmp_path):
    flags = [*TINY, *SMALL_NET, "--seed", "3", "--num-seeds", "2", "--total-timesteps", "128", "--log-every", "64",
             "--eval-every", "64"]
    two_devices = f"{os.environ.get('XLA_FLAGS', '')} --xla_force_host_platform_device_count=2"  # any set kept
    two = subprocess.run([sys.executable, "msfa_babyai.py", *flags, "--run-dir", str(tmp_path / "two")], cwd=ROOT,
                         env=os.environ | {"XLA_FLAGS": two_devices},
                         capture_output=True, text=True, timeout=900)
    assert two.returncode == 0, two.stderr[-3000:]
    assert "2 seeds over 2 devices" in two.stdout
    msfa.main(parse_args(msfa.Args, [*flags, "--run-dir", str(tmp_path / "one")]))
    one_metrics, two_metrics = read(tmp_path / "one" / "metrics.csv"), read(tmp_path / "two" / "metrics.csv")
    assert [(r["step"], r["seed"], r["sgd_steps"]) for r in one_metrics] == \
           [(r["step"], r["seed"], r["sgd_steps"]) for r in two_metrics]
    for name in ("loss", "loss_q", "loss_psi", "loss_phi", "q_mean", "grad_norm", "epsilon"):
        a = [float(r[name]) for r in one_metrics if r[name]]
        b = [float(r[name]) for r in two_metrics if r[name]]
        np.testing.assert_allclose(a, b, rtol=1e-5, err_msg=name)  # partitioned reductions may round differently
    assert read(tmp_path / "one" / "eval.csv") == read(tmp_path / "two" / "eval.csv")


FAKE = "tests/fake_training_run.py"  # writes a run's files step by step and sleeps; no JAX


def fake_methods(monkeypatch, **methods):
    monkeypatch.setitem(protocol.METHODS, "babyai", {name: f"{FAKE} {flags}" for name, flags in methods.items()})
    monkeypatch.setattr(protocol.ledger, "device_name", lambda: "fake device")
    monkeypatch.setattr(protocol.methods, "ANALYSES", ())  # tools.analyze is tested on real runs (below)


def read_summary(out: Path) -> dict:
    return json.loads((out / "summary.json").read_text())


def test_the_protocol_runs_one_method_per_device_in_order_and_skips_complete_ones_when_resumed(tmp_path, monkeypatch):
    """Stand-in runs (tests/fake_training_run.py): four methods on two devices, each device given its own method
    (CUDA_VISIBLE_DEVICES) in the order asked; one fails: the protocol says so (exit 1) and the others complete; with
    --resume the complete ones are skipped and the failed one continues from its checkpoint."""
    fake_methods(monkeypatch, a="--total-timesteps 3", b="--total-timesteps 6", c="--total-timesteps 3 --fail",
                 d="--total-timesteps 2")
    out = tmp_path / "protocol"
    with pytest.raises(SystemExit) as stopped:
        protocol.main(protocol.Args(str(out), env="babyai", seeds=2, devices=("0", "1"), analysis_episodes=1,
                                    seeds_apart=False))
    assert stopped.value.code == 1
    summary = read_summary(out)["methods"]
    assert [m for m, e in summary.items() if e["complete"]] == ["a", "b", "d"]
    assert summary["c"]["exit_status"] == 1 and summary["c"]["env_steps_per_seed"] == 1
    devices = {m: json.loads((out / m / "config.json").read_text())["device"] for m in "abcd"}
    assert devices["a"] != devices["b"] and {devices["a"], devices["b"]} == {"0", "1"}
    assert (out / "a.log").read_text().strip() == "step 3"
    monkeypatch.setitem(protocol.METHODS["babyai"], "c", f"{FAKE} --total-timesteps 3")  # the failure mended
    protocol.main(protocol.Args(str(out), resume=True, devices=("0", "1")))
    summary = read_summary(out)["methods"]
    assert all(e["complete"] for e in summary.values()) and set(summary) == set("abcd")
    assert [r["step"] for r in json.loads((out / "c" / "config.json").read_text())["resumes"]] == [1]
    assert summary["a"]["exit_status"] == 0 and "earlier" not in summary["a"]  # skipped (complete): its record kept
    assert summary["c"]["exit_status"] == 0 and [r["exit_status"] for r in summary["c"]["earlier"]] == [1]


def test_the_protocol_stops_cleanly_at_max_minutes_or_ctrl_c_and_resumes(tmp_path, monkeypatch):
    """--max-minutes: the running method is told its remaining time and stops with its checkpoint; no method starts
    near the end. Ctrl-C (SIGINT to the protocol): every run gets SIGTERM, checkpoints and stops; the protocol exits
    with 130 and says how to continue; --resume finishes the runs where they stopped."""
    fake_methods(monkeypatch, a="--total-timesteps 40 --seconds-per-step 0.25", b="--total-timesteps 2")
    out = tmp_path / "protocol"
    protocol.main(protocol.Args(str(out), env="babyai", seeds=1, max_minutes=0.08, analysis_episodes=1,
                                seeds_apart=False))
    summary = read_summary(out)["methods"]
    assert 0 < summary["a"]["share_of_protocol"] < 1 and summary["a"]["exit_status"] == 0
    assert summary["b"]["status"] == "not started" and not (out / "b").exists()
    threading.Timer(1.5, lambda: os.kill(os.getpid(), signal.SIGINT)).start()
    with pytest.raises(SystemExit) as stopped:
        protocol.main(protocol.Args(str(out), resume=True))
    assert stopped.value.code == 128 + signal.SIGINT
    steps = read_summary(out)["methods"]["a"]["env_steps_per_seed"]
    assert steps < 40 and json.loads((out / "a" / "config.json").read_text())["resumes"]
    protocol.main(protocol.Args(str(out), resume=True))
    summary = read_summary(out)["methods"]
    assert summary["a"]["complete"] and summary["b"]["complete"]


def test_a_stopped_protocol_keeps_what_the_analyses_said_and_names_the_seeds_left(tmp_path, monkeypatch):
    """Ctrl-C as a's first seed is played: summary.json still says "1 of 3 seeds played" (what this invocation's
    analyses said), and a's status names its seeds left to run where the untouched b is "not started". Resumed and
    stopped again before anything is played, the earlier invocation's word stays."""
    fake_methods(monkeypatch, a="--total-timesteps 2 --seconds-per-step 0.05", b="--total-timesteps 2")
    monkeypatch.setattr(protocol.methods, "ANALYSES", ("babyai",))

    def played_then_ctrl_c(command, **kwargs):  # stands in for `python -m tools.analyze ... --out DIR`
        out_dir = Path(command[command.index("--out") + 1])
        out_dir.mkdir(parents=True, exist_ok=True)
        (out_dir / "records.json").write_text("[]")
        os.kill(os.getpid(), signal.SIGINT)
        return subprocess.CompletedProcess(command, 0)

    monkeypatch.setattr(protocol.analysis.subprocess, "run", played_then_ctrl_c)
    out = tmp_path / "protocol"
    with pytest.raises(SystemExit) as stopped:
        protocol.main(protocol.Args(str(out), env="babyai", seeds=3, devices=("0",), analysis_episodes=1))
    assert stopped.value.code == 128 + signal.SIGINT
    summary = read_summary(out)["methods"]
    assert summary["a"]["analysis"] == "1 of 3 seeds played" and summary["a"]["status"] == "seeds to run: seed2, seed3"
    assert summary["b"]["status"] == "not started" and "analysis" not in summary["b"]
    monkeypatch.setitem(protocol.METHODS["babyai"], "a", f"{FAKE} --total-timesteps 2 --seconds-per-step 4")
    threading.Timer(2.0, lambda: os.kill(os.getpid(), signal.SIGINT)).start()  # during a's seed 2
    with pytest.raises(SystemExit):
        protocol.main(protocol.Args(str(out), resume=True, devices=("0",)))
    summary = read_summary(out)["methods"]
    assert "a/seed2" in summary["a"]["seed_runs"] and not summary["a"]["complete"]  # stopped during its seed 2
    assert summary["a"]["analysis"] == "1 of 3 seeds played" and summary["a"]["status"] == "seeds to run: seed2, seed3"


def test_a_whole_method_begun_earlier_but_not_reached_is_to_continue(tmp_path, monkeypatch):
    """Whole-method runs (not seeds apart): a and b begun side by side on two devices and stopped; resumed on one
    device and stopped during a, b's turn has not come, but its run holds a checkpoint: "to continue", not "not
    started"."""
    fake_methods(monkeypatch, a="--total-timesteps 40 --seconds-per-step 0.25",
                 b="--total-timesteps 40 --seconds-per-step 0.25")
    out = tmp_path / "protocol"
    threading.Timer(1.5, lambda: os.kill(os.getpid(), signal.SIGINT)).start()
    with pytest.raises(SystemExit):
        protocol.main(protocol.Args(str(out), env="babyai", seeds=1, devices=("0", "1"), analysis_episodes=1,
                                    seeds_apart=False))
    summary = read_summary(out)["methods"]
    assert "status" not in summary["a"] and "status" not in summary["b"]  # both ran, both stopped
    threading.Timer(1.5, lambda: os.kill(os.getpid(), signal.SIGINT)).start()
    with pytest.raises(SystemExit):
        protocol.main(protocol.Args(str(out), resume=True, devices=("0",)))
    summary = read_summary(out)["methods"]
    assert "status" not in summary["a"] and summary["b"]["status"] == "to continue"


def test_a_protocol_that_dies_before_its_end_keeps_the_records_of_the_runs_it_finished(tmp_path, monkeypatch):
    """summary.json is written as each run ends, not only at the protocol's end: a protocol that dies before its end
    (here its end raises, as a machine restarting under it would cut it) leaves the records of the runs it finished,
    marked in progress; the next invocation keeps them (a complete run's as it is, a failed run's under "earlier")."""
    fake_methods(monkeypatch, a="--total-timesteps 3", b="--total-timesteps 2 --fail")
    out = tmp_path / "protocol"

    def machine_restarts(*args, **kwargs):
        raise RuntimeError("the machine restarted")

    with monkeypatch.context() as restart:
        restart.setattr(protocol.orchestration, "finish", machine_restarts)
        with pytest.raises(RuntimeError, match="restarted"):
            protocol.main(protocol.Args(str(out), env="babyai", seeds=1, analysis_episodes=1, seeds_apart=False))
    summary = read_summary(out)
    assert summary["in_progress"] and summary["methods"]["a"]["complete"]
    assert summary["methods"]["a"]["exit_status"] == 0 and summary["methods"]["b"]["exit_status"] == 1
    a = {k: summary["methods"]["a"][k] for k in ("exit_status", "wall_seconds", "ended")}
    monkeypatch.setitem(protocol.METHODS["babyai"], "b", f"{FAKE} --total-timesteps 2")  # the failure mended
    protocol.main(protocol.Args(str(out), resume=True))
    summary = read_summary(out)
    assert not summary["in_progress"] and all(e["complete"] for e in summary["methods"].values())
    assert {k: summary["methods"]["a"][k] for k in a} == a and "earlier" not in summary["methods"]["a"]
    assert summary["methods"]["b"]["exit_status"] == 0
    assert [r["exit_status"] for r in summary["methods"]["b"]["earlier"]] == [1]


def test_the_runs_share_one_cache_of_compiled_programs_unless_one_is_named(tmp_path, monkeypatch):
    from tools.protocol.runners import Run, run_environment

    run = Run("msfa/seed2", ["python", "msfa_babyai.py"], tmp_path / "msfa" / "seed2", tmp_path / "msfa.seed2.log")
    monkeypatch.delenv("JAX_COMPILATION_CACHE_DIR", raising=False)
    env = run_environment(run, "1", cpu_core=True)
    assert env["JAX_COMPILATION_CACHE_DIR"] == str(tmp_path / ".xla_cache")  # beside the logs, not one of OUT_DIR/*/
    assert env["JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"] == "0"
    monkeypatch.setenv("JAX_COMPILATION_CACHE_DIR", str(tmp_path / "mine"))
    assert run_environment(run)["JAX_COMPILATION_CACHE_DIR"] == str(tmp_path / "mine")


@pytest.mark.skipif(not Path("/proc/self/autogroup").exists(), reason="this kernel does not group sessions")
def test_a_niced_protocols_runs_are_as_nice_against_the_machines_other_sessions(tmp_path):
    """`nice -n 7 python -m tools.protocol ...`: each run is a session of its own, which a kernel that schedules
    sessions as groups (autogroup) would give an equal share of the cores; the protocol gives its runs' sessions its
    niceness. (A session's niceness can only be raised without privileges, so this runs in a niced subprocess.)"""
    code = ("from pathlib import Path; from tools.protocol.runners import LocalProcess, Run; "
            f"run = Run('r', [], Path({str(tmp_path)!r}), Path({str(tmp_path / 'r.log')!r})); "
            "p = LocalProcess(run, ['sleep', '60'], None, False); "
            "print(Path(f'/proc/{p.process.pid}/autogroup').read_text().split()[-1]); p.process.kill()")
    own = os.nice(0)
    for nice, expected in (("7", str(min(own + 7, 19))), ("0", str(own))):
        shown = subprocess.run(["nice", "-n", nice, sys.executable, "-c", code], cwd=ROOT, capture_output=True,
                               text=True, timeout=120)
        assert shown.returncode == 0, shown.stderr[-2000:]
        assert shown.stdout.strip().splitlines()[-1] == expected, shown.stdout


def test_on_a_cpu_each_seed_trains_in_its_own_pinned_process_and_the_seeds_are_merged(tmp_path, monkeypatch):
    """The CPU's default (seeds_apart): every (method, seed) is a single-seed run in OUT_DIR/<method>/seed<k>/,
    pinned to one of the cores with XLA single-threaded, as many at once as cores; when a method's seeds are all
    complete, OUT_DIR/<method>/ holds them as one run of every seed (the rows of each, its parameter files, the
    first seed's config with num_seeds), which the tools read; --resume skips it."""
    fake_methods(monkeypatch, a="--total-timesteps 3", b="--total-timesteps 2")
    out = tmp_path / "protocol"
    protocol.main(protocol.Args(str(out), env="babyai", seeds=3, devices=("0", "1"), analysis_episodes=1))
    summary = read_summary(out)
    assert summary["seeds_apart"] and all(e["complete"] for e in summary["methods"].values())
    for method, steps in (("a", 3), ("b", 2)):
        for k in (1, 2, 3):
            config = json.loads((out / method / f"seed{k}" / "config.json").read_text())
            assert config["args"]["seed"] == k and config["args"]["num_seeds"] == 1
            assert len(config["cores"]) == 1 and config["cores"][0] in (0, 1) and config["device"] is None
            assert protocol.SINGLE_THREADED in config["xla_flags"]
        merged = json.loads((out / method / "config.json").read_text())
        assert merged["args"]["num_seeds"] == 3 and merged["seeds_trained_apart"] == ["seed1", "seed2", "seed3"]
        rows = (out / method / "eval.csv").read_text().splitlines()[1:]
        assert rows == [f"{step},{seed}" for step in range(1, steps + 1) for seed in (1, 2, 3)][-3:]
        assert sorted(p.name for p in (out / method).glob("params_seed*.eqx")) == [
            "params_seed1.eqx", "params_seed2.eqx", "params_seed3.eqx"]
        assert set(summary["methods"][method]["seed_runs"]) == {f"{method}/seed{k}" for k in (1, 2, 3)}
    assert len({json.loads((out / "a" / f"seed{k}" / "config.json").read_text())["cores"][0] for k in (1, 2)}) == 2
    protocol.main(protocol.Args(str(out), resume=True, devices=("0", "1")))  # nothing to run: the records stay
    assert read_summary(out)["methods"]["a"]["seed_runs"] == summary["methods"]["a"]["seed_runs"]


def test_every_job_of_a_run_is_recorded_however_alike_and_a_slurm_job_recorded_again_is_updated():
    """summary.json's record of a run (protocol.run_record): a local job whose record equals an earlier job's to the
    0.1 s and the second (two short runs do that) is still another job, kept under "earlier"; a SLURM job is known
    by its id, so recording it again (seen running, then ended) updates it."""
    done = {"exit_status": 0, "wall_seconds": 0.5, "ended": "2026-12-03 12:00:00"}
    assert protocol.run_record(done, dict(done)) == {**done, "earlier": [done]}
    assert protocol.run_record(None, done) == done and protocol.run_record(done, None) == done
    stopped = {"exit_status": 143, "wall_seconds": 9.0}
    assert protocol.run_record({**done, "earlier": [stopped]}, dict(done))["earlier"] == [stopped, done]
    running, ended = {"job_id": "17"}, {"job_id": "17", **done}
    assert protocol.run_record(running, ended) == ended
    failed = {"job_id": "12", "exit_status": 1}
    assert protocol.run_record({**ended, "earlier": [failed]}, dict(ended)) == {**ended, "earlier": [failed]}
    assert protocol.run_record(ended, {**done, "job_id": "18"})["earlier"] == [ended]


def test_a_protocol_stopped_part_way_is_exported_without_checkpoints_and_continues_from_the_export(
        tmp_path, monkeypatch, capsys):
    """Each seed is analysed (played) as it completes, and each method reported from its seeds' records once it is
    complete, each once. tools.export of a protocol stopped part way (a complete; b's seed 1 played, seed 2
    complete but not played, seed 3 not complete) carries a's results and analysis (its agents only when asked), b's
    seed 1 with its records and seed 2 with its agent compacted, and no checkpoint. A copy of the export resumes:
    seed 3 trains from scratch, seed 2 is played, b is reported; exported again, the carried seeds and the agents not
    asked for are gone."""
    from tools.compact_agents import decompress
    from tools.export import export

    fake_methods(monkeypatch, a="--total-timesteps 2", b="--total-timesteps 2")
    monkeypatch.setattr(protocol.methods, "ANALYSES", ("babyai",))
    analysed = []

    def fake_analysis(command, **kwargs):  # stands in for `python -m tools.analyze ... --out DIR`
        out_dir = Path(command[command.index("--out") + 1])
        analysed.append(out_dir.parent.name if "--records" in command else
                        f"{out_dir.parent.parent.name}/{out_dir.parent.name}")
        out_dir.mkdir(parents=True, exist_ok=True)
        (out_dir / "records.json").write_text("[]")
        return subprocess.CompletedProcess(command, 0)

    monkeypatch.setattr(protocol.analysis.subprocess, "run", fake_analysis)
    out = tmp_path / "protocol"
    protocol.main(protocol.Args(str(out), env="babyai", seeds=3, devices=("0", "1"), analysis_episodes=1))
    assert sorted(analysed) == ["a", "a/seed1", "a/seed2", "a/seed3", "b", "b/seed1", "b/seed2", "b/seed3"]
    assert all(analysed.index(m) > analysed.index(f"{m}/seed{k}") for m in "ab" for k in (1, 2, 3))
    assert read_summary(out)["methods"]["b"]["analysis"] == "ok"
    for name in ("config.json", "metrics.csv", "eval.csv", "analysis"):  # b as if stopped during its seed 3
        shutil.rmtree(out / "b" / name) if name == "analysis" else (out / "b" / name).unlink()
    for params in (out / "b").glob("params_seed*.eqx"):
        params.unlink()
    shutil.rmtree(out / "b" / "seed2" / "analysis")  # ... and before seed 2 was played
    eval_csv = out / "b" / "seed3" / "eval.csv"
    eval_csv.write_text(eval_csv.read_text().splitlines()[0] + "\n")

    dest = tmp_path / "exported"
    export(out, dest, agents=("a",))
    files = sorted(str(p.relative_to(dest)) for p in dest.rglob("*") if p.is_file())
    assert files == ["a/analysis/records.json", "a/config.json", "a/eval.csv.xz", "a/metrics.csv.xz",
                     "a/params_seed1.eqz", "a/params_seed2.eqz", "a/params_seed3.eqz", "b/seed1/analysis/records.json",
                     "b/seed1/config.json", "b/seed1/eval.csv.xz", "b/seed1/metrics.csv.xz", "b/seed2/config.json",
                     "b/seed2/eval.csv.xz", "b/seed2/metrics.csv.xz", "b/seed2/params_seed2.eqz", "protocol.json",
                     "summary.json"]
    for table in ("metrics.csv", "eval.csv"):  # packed as they were written, byte for byte
        assert lzma.decompress((dest / "a" / f"{table}.xz").read_bytes()) == (out / "a" / table).read_bytes()
    assert decompress((dest / "a" / "params_seed2.eqz").read_bytes()) == (out / "a" / "params_seed2.eqx").read_bytes()
    assert "left out" in capsys.readouterr().out

    again = tmp_path / "continued"
    shutil.copytree(dest, again)
    analysed.clear()
    protocol.main(protocol.Args(str(again), resume=True, devices=("0", "1")))
    summary = read_summary(again)["methods"]
    assert summary["a"]["complete"] and summary["b"]["complete"] and analysed == ["b/seed2", "b/seed3", "b"]
    seed_runs = summary["b"]["seed_runs"]  # seeds 1 and 2 came complete (their records from the export's summary)
    assert set(seed_runs) == {"b/seed1", "b/seed2", "b/seed3"} and "earlier" not in seed_runs["b/seed1"]
    assert [r["exit_status"] for r in [seed_runs["b/seed3"], *seed_runs["b/seed3"]["earlier"]]] == [0, 0]  # again
    assert "resumes" not in json.loads((again / "b" / "seed3" / "config.json").read_text())
    assert sorted(p.name for p in (again / "b").glob("params_seed*")) == ["params_seed2.eqz", "params_seed3.eqx"]
    assert (again / "b" / "metrics.csv").read_text().count("\n") == 1 + 3 * 2  # every seed's rows, merged

    export(again, dest)
    files = sorted(str(p.relative_to(dest)) for p in dest.rglob("*") if p.is_file())
    assert files == ["a/analysis/records.json", "a/config.json", "a/eval.csv.xz", "a/metrics.csv.xz",
                     "b/analysis/records.json", "b/config.json", "b/eval.csv.xz", "b/metrics.csv.xz", "protocol.json",
                     "summary.json"]
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "notes.txt").write_text("mine")
    with pytest.raises(ConfigError, match="holds no exported protocol"):
        export(out, tmp_path / "other")


def test_an_export_never_puts_an_older_claims_or_figure_back(tmp_path):
    """`cp -r DEST OUT`, claims.md made again in DEST, then an export: OUT's copy is older and differs, so the export
    stops before writing anything; once OUT's copy is made again (newer), it goes."""
    from tools.export import export

    out, dest = tmp_path / "out", tmp_path / "dest"
    (out / "figures").mkdir(parents=True)
    (out / "protocol.json").write_text(json.dumps({"env": "babyai", "methods": []}))
    (out / "claims.md").write_text("claims of 6 methods")
    (out / "figures" / "aggregate.png").write_bytes(b"6 methods")
    (out / "summary.json").write_text('{"run": 1}')
    export(out, dest)
    assert (dest / "claims.md").read_text() == "claims of 6 methods"
    made = (out / "claims.md").stat().st_mtime
    for name, again in (("claims.md", "claims of 7 methods"), ("figures/aggregate.png", "7 methods")):
        (dest / name).write_text(again)
        os.utime(dest / name, (made + 10, made + 10))
        (out / "summary.json").write_text('{"run": 2}')  # what the export would write first, were it to go on
        with pytest.raises(ConfigError, match=f"{name} differs from .* and was written after it"):
            export(out, dest)
        assert (dest / name).read_text() == again and (dest / "summary.json").read_text() == '{"run": 1}'
        (dest / name).write_text("6 methods" if name.startswith("figures") else "claims of 6 methods")
    os.utime(dest / "claims.md", (made + 10, made + 10))  # newer but the same: nothing is lost, it goes
    export(out, dest)
    (out / "claims.md").write_text("claims of 8 methods")
    os.utime(out / "claims.md", (made + 20, made + 20))
    export(out, dest)
    assert (dest / "claims.md").read_text() == "claims of 8 methods"


def test_the_protocol_refuses_bad_input_with_one_line(tmp_path, monkeypatch, capsys):
    fake_methods(monkeypatch, a="--total-timesteps 1")
    cases = [(protocol.Args(str(tmp_path / "x"), env="atari"), "--env must be one of"),
             (protocol.Args(str(tmp_path / "x"), env="babyai", methods=("b",)), "unknown methods ['b']"),
             (protocol.Args(str(tmp_path / "x"), resume=True), "does not exist; start the protocol there first")]
    for args, message in cases:
        with pytest.raises(SystemExit) as stopped:
            protocol.main(args)
        assert stopped.value.code == 2 and message in capsys.readouterr().err
    protocol.main(protocol.Args(str(tmp_path / "p"), env="babyai", seeds=1))
    for args, message in [(protocol.Args(str(tmp_path / "p"), env="babyai"), "continue it with --resume"),
                          (protocol.Args(str(tmp_path / "p"), resume=True, seeds=3), "these differ: --seeds")]:
        with pytest.raises(SystemExit) as stopped:
            protocol.main(args)
        assert stopped.value.code == 2 and message in capsys.readouterr().err


def test_resume_takes_every_saved_setting_the_command_line_leaves_out(tmp_path):
    """`--resume OUT_DIR` alone continues a protocol started with settings other than the defaults (here --scale
    mini and --env-workers 3), and names the one that differs when it is given."""
    out = tmp_path / "p"
    out.mkdir()
    saved = {"env": "babyai", "methods": ["msfa"], "seeds": 2, "env_workers": 3, "scale": "mini", "extra": "",
             "seeds_apart": True}
    (out / "protocol.json").write_text(json.dumps(saved))
    resolved = protocol.resolve(protocol.Args(str(out), resume=True))
    assert {k: getattr(resolved, k) for k in saved} == saved | {"methods": ("msfa",)}
    with pytest.raises(ConfigError, match="these differ: --scale$"):
        protocol.resolve(protocol.Args(str(out), resume=True, scale="paper"))


def test_the_protocol_trains_two_real_methods_is_interrupted_resumes_and_completes(tmp_path):
    """python -m tools.protocol on this CPU with tiny settings: MSFA and its entangled-psi ablation, one seed
    each in its own pinned process (the CPU's default: both at once on 2 cores); SIGTERM to the protocol once
    MSFA's seed has a checkpoint; --resume completes both, gives each method its seed's run (merging several seeds
    is the stand-in runs' test above) and analyses their saved agents."""
    out = tmp_path / "protocol"
    extra = " ".join([*TINY, *SMALL_NET, "--total-timesteps", "256", "--log-every", "32", "--eval-every", "64",
                      "--checkpoint-minutes", "0.01"])
    command = [sys.executable, "-m", "tools.protocol", str(out), "--env", "babyai", "--methods", "msfa",
               "msfa_entangled_psi", "--seeds", "1", f"--extra={extra}", "--analysis-episodes", "2"]
    first = subprocess.Popen(command, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    deadline = time.time() + 600
    while not (out / "msfa" / "seed1" / "checkpoint.eqx").exists() and first.poll() is None and time.time() < deadline:
        time.sleep(0.5)
    first.send_signal(signal.SIGTERM)  # (as a scheduler stops it; Ctrl-C's SIGINT: the stand-in runs' test above)
    output = first.communicate(timeout=300)[0]
    assert first.returncode == 128 + signal.SIGTERM, output[-3000:]
    assert "continue with: python -m tools.protocol" in output and "[msfa/seed1] step" in output
    stopped = read_summary(out)["methods"]
    assert not stopped["msfa"]["complete"] and not stopped["msfa_entangled_psi"]["complete"]  # one on each core
    done = subprocess.run([sys.executable, "-m", "tools.protocol", str(out), "--resume"], cwd=ROOT,
                          capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    summary = read_summary(out)
    assert "cpu" in summary["device"] and summary["seeds"] == 1
    for name in ("msfa", "msfa_entangled_psi"):
        entry = summary["methods"][name]
        assert entry["complete"] and entry["share_of_protocol"] >= 1 and entry["analysis"] == "ok", entry
        assert "Table A" in (out / name / "analysis" / "analysis.md").read_text()
        assert [p.name for p in (out / name).glob("params_seed*.eqx")] == ["params_seed1.eqx"]
    assert json.loads((out / "msfa" / "config.json").read_text())["resumes"]  # continued, not restarted


def _kill_runs_in(folder: Path) -> int:
    """SIGKILL every process whose command line names `folder` (the protocol's runs are their own sessions)."""
    killed = 0
    for proc in Path("/proc").iterdir():
        try:
            if proc.name.isdigit() and str(folder) in (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode():
                os.kill(int(proc.name), signal.SIGKILL)
                killed += 1
        except (OSError, ProcessLookupError):
            pass
    return killed


def test_a_protocol_killed_before_its_first_checkpoint_resumes_and_gives_the_uninterrupted_run(tmp_path):
    """The protocol and its run SIGKILLed while the run compiles (config.json written, nothing saved): --resume
    starts that run over with its saved settings; its metrics (but timing) and evaluations equal those of the same
    protocol run without interruption."""
    extra = " ".join([*TINY, *SMALL_NET, "--total-timesteps", "64", "--log-every", "32", "--eval-every", "64"])
    command = lambda out: [sys.executable, "-m", "tools.protocol", str(out), "--env", "babyai", "--methods",  # noqa
                           "msfa", "--seeds", "1", f"--extra={extra}", "--analysis-episodes", "1"]
    killed = tmp_path / "killed"
    first = subprocess.Popen(command(killed), cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 600
    while not (killed / "msfa" / "seed1" / "config.json").exists():
        assert first.poll() is None and time.time() < deadline
        time.sleep(0.02)
    first.kill()
    assert _kill_runs_in(killed) >= 1
    first.wait()
    assert not (killed / "msfa" / "seed1" / "checkpoint.eqx").exists()
    resumed = subprocess.run([sys.executable, "-m", "tools.protocol", str(killed), "--resume"], cwd=ROOT,
                             capture_output=True, text=True, timeout=900)
    assert resumed.returncode == 0, resumed.stdout[-3000:] + resumed.stderr[-3000:]
    assert "no checkpoint yet: starting" in resumed.stdout
    assert json.loads((killed / "msfa" / "config.json").read_text())["started_over"]
    whole = tmp_path / "whole"
    done = subprocess.run(command(whole), cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stdout[-3000:]
    drop = ("sps", "rss_gb")
    for table in ("metrics.csv", "eval.csv"):
        rows = [[{k: v for k, v in r.items() if k not in drop} for r in read(out / "msfa" / table)]
                for out in (killed, whole)]
        assert rows[0] == rows[1] and rows[0], table


@pytest.mark.parametrize("blocked, code", [
    (("procgen", "gym3", "nle", "minihack"),
     "import msfa_babyai, usfa, uvfa\n"
     "usfa.check_args(usfa.Args(learned_cumulants=True)); uvfa.check_args(uvfa.Args(farm=True))\n"),
    (("minigrid", "pygame", "procgen", "gym3"),
     "import msfa_minihack, usfa, uvfa\n"
     "usfa.check_args(usfa.Args(env='minihack', learned_cumulants=True))\n"
     "uvfa.check_args(uvfa.Args(env='minihack', farm=True))\n"),
], ids=["babyai without procgen or nle", "minihack without minigrid or pygame"])
def test_the_scripts_import_without_the_other_envs_packages(blocked, code):
    """A machine set up for one env needs only its packages: BabyAI's runs need neither procgen nor NLE, MiniHack's
    neither minigrid nor its pygame. The scripts that run an env import, and check its settings, with the other
    envs' packages missing."""
    block = f"import sys\nfor name in {blocked!r}:\n    sys.modules[name] = None\n"
    done = subprocess.run([sys.executable, "-c", block + code], cwd=ROOT, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]


@pytest.mark.parametrize("env, scale", [(env, "paper") for env in protocol.METHODS] + [("babyai", "mini")])
def test_every_protocol_command_is_valid_for_its_script(env, scale):
    """Each method's script accepts the protocol's flags for it (at the paper's scale, and the miniature BabyAI's)
    and its checks pass them."""
    import importlib

    import tyro

    for name in protocol.METHODS[env]:
        script, *flags = protocol.run_flags(protocol.Protocol(Path("out"), env, seeds=10, scale=scale), name)
        module = importlib.import_module(Path(script).stem)
        args = tyro.cli(module.Args, args=[*flags, "--max-minutes", "1"])
        module.check_args(args)
        assert getattr(args, "env", env) == env, name


GIB = 2**30


def test_fruitbots_seed_count_fits_the_device_memory():
    """70% of the device's memory for one method's replays: with 33 GiB per seed (frames, the paper's 70k
    sequences), 1 seed on an H100 (about 60 GiB allocatable), 2 on an H200 (about 105 GiB); no limit known (a CPU):
    10, or what was asked; a count that cannot fit is refused with one line."""
    per_seed = 33 * GIB
    assert protocol.choose_seeds(None, per_seed, 60 * GIB) == 1
    assert protocol.choose_seeds(None, per_seed, 105 * GIB) == 2 and protocol.choose_seeds(2, per_seed, 105 * GIB) == 2
    assert protocol.choose_seeds(None, GIB, 80 * GIB) == 10  # never more than the paper's 10
    assert protocol.choose_seeds(None, None, None) == 10 and protocol.choose_seeds(3, per_seed, None) == 3
    with pytest.raises(ConfigError, match=r"--seeds 2 does not fit: .* allows at most 1 seed\(s\)"):
        protocol.choose_seeds(2, per_seed, 60 * GIB)
    with pytest.raises(ConfigError, match="not even one seed fits"):
        protocol.choose_seeds(None, per_seed, 30 * GIB)


def test_a_fruitbot_seed_count_that_cannot_fit_is_refused_before_anything_runs(tmp_path, capsys, monkeypatch):
    """On a (fake) device allowing 60 GiB, the scripts' own replay sizes at the paper's settings: their replays of game
    states (at most 0.39 GiB per seed) let the paper's 10 seeds fit; replays of frames (--extra "--replay-frames", 33
    GiB per seed) leave room for one, and --seeds 2 is refused with one line, before any folder is made."""
    import common.envs.fruitbot  # noqa: F401  (procgen imports gym, whose banner on stderr is not the line checked)

    monkeypatch.setattr(protocol.settings, "device_memory_limit", lambda: 60 * GIB)
    assert protocol.resolve(protocol.Args(str(tmp_path / "states"), env="fruitbot")).seeds == 10
    assert protocol.replay_bytes_per_seed(protocol.resolve(protocol.Args(str(tmp_path / "s"), env="fruitbot"))) < (
        0.4 * GIB)
    with pytest.raises(SystemExit) as exit_info:
        protocol.main(protocol.Args(str(tmp_path / "out"), env="fruitbot", seeds=2, extra="--replay-frames"))
    err = capsys.readouterr().err.strip().splitlines()
    assert exit_info.value.code == 2 and len(err) == 1, err
    assert "--seeds 2 does not fit: 33.1 GiB of replay per seed allows at most 1" in err[0]
    assert not (tmp_path / "out").exists()


def test_a_run_cut_off_with_the_protocol_keeps_its_wall_time(tmp_path, monkeypatch):
    """A machine or session that ends kills the protocol and its runs together: no exit status is recorded. The next
    invocation finds them in jobs.json (each run's process and start) and records each, under the run's earlier
    records, as cut off, its wall time from its start to its log's last line; a run whose process is alive, or
    whose record ended after it started, gets none; whole methods and seeds trained apart alike."""
    from tools.protocol.ledger import CUT_OFF, JobsRecord

    fake_methods(monkeypatch, a="--total-timesteps 2", b="--total-timesteps 2")
    out = tmp_path / "protocol"
    protocol.main(protocol.Args(str(out), env="babyai", seeds=2, analysis_episodes=1, seeds_apart=True,
                                devices=("0",)))
    assert set(JobsRecord.read(out).started) == {"a/seed1", "a/seed2", "b/seed1", "b/seed2"}
    first = read_summary(out)["methods"]
    dead = subprocess.Popen(["true"])
    dead.wait()
    time.sleep(1.0)  # (records end to the second)
    began = time.time()
    for job in ("a/seed2", "b/seed1"):  # as if run again from now, and cut off 900 s later
        log = out / f"{job.replace('/', '.')}.log"
        os.utime(log, (began + 900.0, began + 900.0))
    JobsRecord("local", dead.pid, {"a/seed2": dead.pid, "b/seed1": os.getpid(), "b/seed2": dead.pid},
               started={"a/seed2": began, "b/seed1": began, "b/seed2": 0.0}).write(out)  # b/seed1: alive;
    protocol.main(protocol.Args(str(out), resume=True))  # b/seed2: its record ended after it started
    seed_runs = read_summary(out)["methods"]["a"]["seed_runs"]
    assert seed_runs["a/seed1"] == first["a"]["seed_runs"]["a/seed1"]
    cut = seed_runs["a/seed2"]
    assert cut["result"] == CUT_OFF and cut["wall_seconds"] == 900.0 and "exit_status" not in cut
    assert cut["ended"] == time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(began + 900.0))
    assert cut["earlier"] == [first["a"]["seed_runs"]["a/seed2"]]
    assert read_summary(out)["methods"]["b"] == first["b"]
    protocol.main(protocol.Args(str(out), resume=True))  # counted once: jobs.json was written anew
    assert read_summary(out)["methods"]["a"]["seed_runs"]["a/seed2"] == cut

    whole = tmp_path / "whole"  # a method trained whole: its record is the method entry's own
    protocol.main(protocol.Args(str(whole), env="babyai", methods=("a",), seeds=1, analysis_episodes=1,
                                seeds_apart=False))
    first = read_summary(whole)["methods"]["a"]
    time.sleep(1.0)
    began = time.time()
    os.utime(whole / "a.log", (began + 60.0, began + 60.0))
    JobsRecord("local", dead.pid, {"a": dead.pid}, started={"a": began}).write(whole)
    protocol.main(protocol.Args(str(whole), resume=True))
    entry = read_summary(whole)["methods"]["a"]
    assert entry["result"] == CUT_OFF and entry["wall_seconds"] == 60.0 and "seed_runs" not in entry
    assert entry["earlier"] == [{k: first[k] for k in ("exit_status", "wall_seconds", "ended")}]


def test_method_steps_extends_a_finished_method_from_its_checkpoints_and_keeps_the_earlier_analysis(
        tmp_path, monkeypatch):
    """`--resume --method-steps a=4` takes a finished method's runs further (here from 2 to 4 env steps): each seed
    resumes from its checkpoint with --total-timesteps 4, the seeds are merged again at the new end, the analyses
    made at the earlier end are kept as analysis_at_2/ (and exported), the other methods are left as they were,
    later --resume keep the new end, and a method the protocol does not run, or fewer steps, is refused."""
    from tools import export

    fake_methods(monkeypatch, a="--total-timesteps 2", b="--total-timesteps 2")
    out = tmp_path / "protocol"
    protocol.main(protocol.Args(str(out), env="babyai", seeds=2, analysis_episodes=1, seeds_apart=True,
                                devices=("0",)))
    for run in (out / "a", out / "a" / "seed1"):  # (analyses stand in: ANALYSES is empty for the fake methods)
        (run / "analysis").mkdir()
        (run / "analysis" / "records.json").write_text(f'[{{"at": 2, "run": "{run.name}"}}]')
    b_before = (out / "b" / "eval.csv").read_text()

    protocol.main(protocol.Args(str(out), resume=True, method_steps=("a=4",)))
    assert json.loads((out / "protocol.json").read_text())["method_steps"] == ["a=4"]
    for k in (1, 2):
        config = json.loads((out / "a" / f"seed{k}" / "config.json").read_text())
        assert config["resumes"] == [{"step": 2, "changed": {"total_timesteps": [2, 4]}}]
        assert config["args"]["total_timesteps"] == 4
    assert (out / "a" / "eval.csv").read_text().splitlines()[1:] == ["2,1", "2,2", "4,1", "4,2"]
    assert json.loads((out / "a" / "config.json").read_text())["args"]["total_timesteps"] == 4
    assert json.loads((out / "a" / "analysis_at_2" / "records.json").read_text()) == [{"at": 2, "run": "a"}]
    assert (out / "a" / "seed1" / "analysis_at_2" / "records.json").exists()
    assert not (out / "a" / "analysis").exists() and not (out / "a" / "seed1" / "analysis").exists()
    assert (out / "b" / "eval.csv").read_text() == b_before and "resumes" not in json.loads(
        (out / "b" / "seed1" / "config.json").read_text())
    entry = read_summary(out)["methods"]["a"]
    assert entry["complete"] and entry["env_steps_per_seed"] == 4 and entry["total_timesteps"] == 4
    assert protocol.run_flags(protocol.resolve(protocol.Args(str(out), resume=True)), "a")[-2:] == [
        "--total-timesteps", "4"]
    protocol.main(protocol.Args(str(out), resume=True))  # the new end is kept: nothing to run
    assert len(json.loads((out / "a" / "seed1" / "config.json").read_text())["resumes"]) == 1
    export.export(out, tmp_path / "exported")
    assert (tmp_path / "exported" / "a" / "analysis_at_2" / "records.json").exists()

    for given, message in [(("a=3",), "a=3 is fewer env steps than its runs already go to (4)"),
                           (("z=9",), "names methods this protocol does not run: ['z']"),
                           (("a=x",), "--method-steps takes METHOD=N with N a positive number")]:
        with pytest.raises(ConfigError, match=re.escape(message)):
            protocol.resolve(protocol.Args(str(out), resume=True, method_steps=given))
