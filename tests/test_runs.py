"""Runs that never lose work (run plumbing in common/run/, driven by each script's main): Ctrl-C and resume give
the uninterrupted run's results, a used run directory is refused, a moved run resumes from its saved settings, a
finished run is left alone, bad input gets one line and exit status 2 before anything is written or compiled, and a
NaN stops the run keeping the last good checkpoint."""

import csv
import hashlib
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import msfa_babyai as msfa
import uvfa
from common.run import ConfigError, parse_args
from helpers import TINY_MSFA

ROOT = Path(__file__).resolve().parent.parent
SHORT = TINY_MSFA | dict(total_timesteps=128, log_every=64, eval_every=64)
FLAGS = ["--num-envs", "4", "--sequence-period", "8", "--sequence-length", "9", "--replay-size", "64",
         "--min-replay-size", "8", "--batch-size", "4", "--samples-per-insert", "2.0", "--target-update-period", "3",
         "--eval-episodes", "2", "--num-modules", "2", "--module-size", "16", "--attention-heads", "1",
         "--psi-hidden", "8", "--phi-hidden", "8"]


def read(path: Path, drop=("sps", "rss_gb")):
    with path.open() as f:
        return [{k: v for k, v in row.items() if k not in drop} for row in csv.DictReader(f)]


def digests(path: Path) -> dict:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(path.iterdir()) if p.is_file()}


def one_line_exit(capsys, fn, code=2) -> str:
    """Run fn, expecting SystemExit(code) and exactly one line on stderr (no traceback); return the line."""
    with pytest.raises(SystemExit) as exit_info:
        fn()
    assert exit_info.value.code == code
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    return err[0]


@pytest.fixture(scope="module")
def finished(tmp_path_factory):
    """A finished tiny MSFA run of 128 steps (2 chunks, evaluated at 64 and 128)."""
    run_dir = tmp_path_factory.mktemp("finished") / "run"
    msfa.main(msfa.Args(**(SHORT | dict(run_dir=str(run_dir)))))
    return run_dir


# ------------------------------------------------------------------------------------------ Ctrl-C, then resume
def test_sigint_at_a_random_moment_then_resume_gives_the_uninterrupted_run(tmp_path):
    total = ["--total-timesteps", str(64 * 40), "--log-every", "64", "--eval-every", "100000", "--seed", "5"]
    env = os.environ | {"PYTHONPATH": str(ROOT)}  # with conftest.py's compilation cache
    run_dir = tmp_path / "interrupted"
    command = [sys.executable, "msfa_babyai.py", *FLAGS, *total, "--run-dir", str(run_dir)]
    process = subprocess.Popen(command, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 600
    while not (run_dir / "metrics.csv").exists() or len((run_dir / "metrics.csv").read_text().splitlines()) < 2:
        assert process.poll() is None and time.time() < deadline, process.communicate()
        time.sleep(0.05)
    delay = random.Random().uniform(0.0, 1.0)  # a random moment after the first chunk
    time.sleep(delay)
    process.send_signal(signal.SIGINT)
    out, err = process.communicate(timeout=600)
    assert process.returncode == 128 + signal.SIGINT, (delay, out[-2000:], err[-2000:])
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    assert err.strip().endswith(f"resume with: python msfa_babyai.py --resume --run-dir {run_dir}"), err
    stopped_at = json.loads((run_dir / "checkpoint.eqx").open("rb").readline())["step"]
    assert 64 <= stopped_at < 64 * 40  # a chunk takes ~0.3 s here: the signal lands within a few

    resumed = subprocess.run([sys.executable, "msfa_babyai.py", "--resume", "--run-dir", str(run_dir)], cwd=ROOT,
                             env=env, capture_output=True, text=True, timeout=600)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert f"resumed {run_dir} at step {stopped_at:,}" in resumed.stdout

    whole = tmp_path / "whole"
    msfa.main(parse_args(msfa.Args, [*FLAGS, *total, "--run-dir", str(whole)]))
    assert read(run_dir / "metrics.csv") == read(whole / "metrics.csv")
    assert read(run_dir / "eval.csv") == read(whole / "eval.csv")
    config = json.loads((run_dir / "config.json").read_text())
    assert [r["step"] for r in config["resumes"]] == [stopped_at]


def test_a_run_killed_before_its_first_checkpoint_starts_over_on_resume(tmp_path):
    """SIGKILL while the run compiles (config.json and the logs' headers written, nothing saved): the command
    without --resume is refused with the one that works, and --resume starts the run over from step 0 with its saved
    settings, saying so in one line; it ends with the uninterrupted run's metrics and evaluations, and the killed
    start's logs are kept aside."""
    total = ["--total-timesteps", "256", "--log-every", "64", "--eval-every", "128", "--seed", "5"]
    env = os.environ | {"PYTHONPATH": str(ROOT)}
    run_dir = tmp_path / "killed"
    command = [sys.executable, "msfa_babyai.py", *FLAGS, *total, "--run-dir", str(run_dir)]
    process = subprocess.Popen(command, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 600
    while not (run_dir / "metrics.csv").exists():  # its logs opened (a header, no rows yet): it compiles
        assert process.poll() is None and time.time() < deadline
        time.sleep(0.02)
    process.kill()
    process.wait()
    assert not (run_dir / "checkpoint.eqx").exists()
    again = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    err = again.stderr.strip().splitlines()
    assert again.returncode == 2 and len(err) == 1, again.stderr[-2000:]
    assert f"continue it with --resume --run-dir {run_dir}" in err[0]
    resumed = subprocess.run([sys.executable, "msfa_babyai.py", "--resume", "--run-dir", str(run_dir)], cwd=ROOT,
                             env=env, capture_output=True, text=True, timeout=600)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert f"no checkpoint yet: starting {run_dir} over from step 0 with its saved settings" in resumed.stdout
    whole = tmp_path / "whole"
    msfa.main(parse_args(msfa.Args, [*FLAGS, *total, "--run-dir", str(whole)]))
    assert read(run_dir / "metrics.csv") == read(whole / "metrics.csv")
    assert read(run_dir / "eval.csv") == read(whole / "eval.csv")
    assert "started_over" in json.loads((run_dir / "config.json").read_text())
    [aside] = run_dir.glob("started-over-*")
    assert "metrics.csv" in {p.name for p in aside.iterdir()}


def test_resume_without_settings_says_the_one_command_that_works(tmp_path, capsys):
    """--resume where there is nothing to continue: no run at all (start one without --resume), or run files without
    their settings (--overwrite starts anew); neither message sends the user back to the other command."""
    line = one_line_exit(capsys, lambda: msfa.main(msfa.Args(**(SHORT | dict(run_dir=str(tmp_path / "none"),
                                                                             resume=True)))))
    assert "there is no run in" in line and "start one there without --resume" in line
    half = tmp_path / "half"
    half.mkdir()
    (half / "metrics.csv").write_text("step,seed\n")
    line = one_line_exit(capsys, lambda: msfa.main(msfa.Args(**(SHORT | dict(run_dir=str(half), resume=True)))))
    assert "has no readable config.json" in line and "--overwrite (without --resume)" in line


# ------------------------------------------------------------------------------------ never mix two runs
def test_a_second_run_into_a_used_directory_is_refused_and_leaves_it_untouched(finished, capsys):
    before = digests(finished)
    line = one_line_exit(capsys, lambda: msfa.main(msfa.Args(**(SHORT | dict(run_dir=str(finished), seed=9)))))
    assert "already holds a run" in line and "config.json" in line and "--resume" in line and "--run-dir" in line
    assert digests(finished) == before


def test_a_half_written_directory_is_refused_too(tmp_path, capsys):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "metrics.csv").write_text("step,seed\n64,1\n")  # a run that died before its first checkpoint
    line = one_line_exit(capsys, lambda: msfa.main(msfa.Args(**(SHORT | dict(run_dir=str(run_dir))))))
    assert "holds run files without their settings (metrics.csv): --overwrite moves them aside" in line
    assert (run_dir / "metrics.csv").read_text() == "step,seed\n64,1\n"


def test_overwrite_moves_the_old_run_aside(finished, tmp_path):
    run_dir = tmp_path / "run"
    shutil.copytree(finished, run_dir)
    before = digests(run_dir)
    msfa.main(msfa.Args(**(SHORT | dict(run_dir=str(run_dir), total_timesteps=64, overwrite=True))))
    [aside] = [p for p in tmp_path.iterdir() if p.name.startswith("run.replaced-")]
    assert digests(aside) == before
    assert [r["step"] for r in read(run_dir / "metrics.csv")] == ["64"]


# ---------------------------------------------------------------------------------------------- resuming
def test_a_moved_run_resumes_from_its_saved_settings_alone(finished, tmp_path):
    """Stop at 64, move the directory, resume with --resume --run-dir only (extending to 128): same as finished."""
    first = tmp_path / "first"
    msfa.main(msfa.Args(**(SHORT | dict(run_dir=str(first), total_timesteps=64))))
    moved = tmp_path / "elsewhere" / "moved"
    moved.parent.mkdir()
    first.rename(moved)
    msfa.main(parse_args(msfa.Args, ["--resume", "--run-dir", str(moved), "--total-timesteps", "128"]))
    assert read(moved / "metrics.csv") == read(finished / "metrics.csv")
    assert read(moved / "eval.csv") == read(finished / "eval.csv")
    config = json.loads((moved / "config.json").read_text())
    assert config["args"]["total_timesteps"] == 128  # extended, and recorded
    assert config["resumes"][0]["step"] == 64 and config["resumes"][0]["changed"] == {"total_timesteps": [64, 128]}
    assert config["args"]["run_dir"] == "."  # (its own folder, wherever that is: the location is not a setting)
    assert str(tmp_path) not in (moved / "config.json").read_text()  # no folder of this machine is written


def test_resuming_a_finished_run_says_so_and_changes_nothing(finished, capsys):
    before = digests(finished)
    line = one_line_exit(capsys, lambda: msfa.main(parse_args(msfa.Args, ["--resume", "--run-dir", str(finished)])),
                         code=0)
    assert "finished at step 128" in line and "--total-timesteps" in line
    assert digests(finished) == before


def test_a_run_saved_before_a_setting_existed_resumes_with_its_default(finished, tmp_path, capsys):
    """config.json of an older script version lacks the newer flags: they were at their defaults, so resuming is
    not refused as a change (here the run is finished, which is said, not refused)."""
    old = tmp_path / "old"
    shutil.copytree(finished, old)
    config = json.loads((old / "config.json").read_text())
    for name in ("time_limit_is_termination", "priority_from_q"):
        del config["args"][name]
    (old / "config.json").write_text(json.dumps(config))
    line = one_line_exit(capsys, lambda: msfa.main(parse_args(msfa.Args, ["--resume", "--run-dir", str(old)])),
                         code=0)
    assert "finished at step 128" in line
    config["args"]["priority_from_q"] = True  # a saved value that differs from the command line is still refused
    (old / "config.json").write_text(json.dumps(config))
    line = one_line_exit(capsys, lambda: msfa.main(parse_args(msfa.Args, ["--resume", "--run-dir", str(old),
                                                                          "--no-priority-from-q"])), code=2)
    assert "priority_from_q" in line and "cannot change" in line


def test_resume_refuses_a_changed_setting_that_is_not_safe_to_change(finished, capsys):
    before = digests(finished)
    line = one_line_exit(capsys, lambda: msfa.main(parse_args(
        msfa.Args, ["--resume", "--run-dir", str(finished), "--learning-rate", "0.01", "--total-timesteps", "256"])))
    assert "learning_rate cannot change in a resumed run" in line and "--total-timesteps" in line
    assert digests(finished) == before


# ---------------------------------------------------------------------------------------------------- bad input
def checkpoint_variants(finished: Path, tmp_path: Path):
    def copy_with(name, mutate):
        d = tmp_path / name
        shutil.copytree(finished, d)
        mutate(d / "checkpoint.eqx")
        return d

    data = (finished / "checkpoint.eqx").read_bytes()
    return {
        "missing": (copy_with("missing", os.remove), "no checkpoint"),
        "empty": (copy_with("empty", lambda p: p.write_bytes(b"")), "is empty or not a checkpoint"),
        "truncated": (copy_with("truncated", lambda p: p.write_bytes(data[: len(data) // 2])), "is truncated"),
        "longer": (copy_with("longer", lambda p: p.write_bytes(data + b"\0" * 64)), "is longer than this run"),
    }


@pytest.mark.parametrize("case", ["missing", "empty", "truncated", "longer"])
def test_a_broken_checkpoint_gets_one_line_and_the_csvs_are_untouched(case, finished, tmp_path, capsys):
    run_dir, message = checkpoint_variants(finished, tmp_path)[case]
    before = digests(run_dir)
    line = one_line_exit(capsys, lambda: msfa.main(parse_args(
        msfa.Args, ["--resume", "--run-dir", str(run_dir), "--total-timesteps", "256"])))
    assert message in line, line
    assert digests(run_dir) == before


def test_another_methods_checkpoint_is_refused(finished, capsys):
    args = ["--resume", "--run-dir", str(finished), "--total-timesteps", "256"]
    line = one_line_exit(capsys, lambda: uvfa.main(parse_args(uvfa.Args, args)))
    assert "config.json has settings this script does not know" in line


def file_valued(tmp_path):
    (tmp_path / "a_file").write_text("x")
    return str(tmp_path / "a_file")


BAD = {  # settings -> message; each must stop before anything is written
    "run dir is a file": (lambda t: dict(run_dir=file_valued(t)), "is a file"),
    "run dir under a file": (lambda t: dict(run_dir=file_valued(t) + "/run"), "cannot be created"),
    "replay smaller than an insert": (lambda t: dict(replay_size=8, min_replay_size=4, num_envs=16),
                                      "--replay-size must hold one insert of --num-envs"),
    "batch larger than min replay": (lambda t: dict(batch_size=16), "--min-replay-size must be at least --batch-size"),
    "negative learning rate": (lambda t: dict(learning_rate=-1.0), "--learning-rate must be positive"),
    "zero adam eps": (lambda t: dict(adam_eps=0.0), "--adam-eps must be positive"),
    "gamma above 1": (lambda t: dict(gamma=1.01), "--gamma must be in (0, 1]"),
    "gamma zero": (lambda t: dict(gamma=0.0), "--gamma must be in (0, 1]"),
    "negative coefficient": (lambda t: dict(phi_coeff=-1.0), "--phi-coeff must not be negative"),
    "priority weight above 1": (lambda t: dict(max_priority_weight=2.0), "--max-priority-weight must be in [0, 1]"),
    "zero checkpoint minutes": (lambda t: dict(checkpoint_minutes=0.0), "--checkpoint-minutes must be positive"),
    "resume and overwrite": (lambda t: dict(resume=True, overwrite=True), "exclude each other"),
}


@pytest.mark.parametrize("case", list(BAD))
def test_bad_input_gets_one_line_and_writes_nothing(case, tmp_path, capsys):
    make, message = BAD[case]
    overrides = {"run_dir": str(tmp_path / "run")} | make(tmp_path)
    line = one_line_exit(capsys, lambda: msfa.main(msfa.Args(**(SHORT | overrides))))
    assert message in line, line
    assert not (tmp_path / "run").exists()


def test_bad_input_on_the_command_line_gets_one_line(tmp_path, capsys):
    line = one_line_exit(capsys, lambda: msfa.main(parse_args(
        msfa.Args, [*FLAGS, "--learning-rate", "-1", "--run-dir", str(tmp_path / "run")])))
    assert line == "error: --learning-rate must be positive, got -1.0"


# ------------------------------------------------------------------------------- NaN, and checkpoints by time
def test_a_nan_stops_the_run_and_keeps_the_last_good_checkpoint_written_by_time(tmp_path, capsys, monkeypatch):
    """From the third SGD step on, the parameters and the loss turn NaN (planted). The first chunk (64 steps) is good
    and, with --checkpoint-minutes ~ 0, checkpointed by time (no evaluation before the end); the second chunk shows
    the NaN: the run stops with one line naming the step and the loss, and keeps the checkpoint of step 64."""
    import jax

    original = msfa.sgd_step

    def poisoned(setup, args, state, key):
        new_state, metrics = original(setup, args, state, key)
        poison = jnp.where(state.sgd_steps >= 2, jnp.nan, 0.0)
        params = jax.tree.map(lambda p: p + poison, new_state.params)
        losses = metrics.losses | {"loss": metrics.losses["loss"] + poison}
        return new_state._replace(params=params), metrics._replace(losses=losses)

    monkeypatch.setattr(msfa, "sgd_step", poisoned)
    run_dir = tmp_path / "run"
    line = one_line_exit(capsys, lambda: msfa.main(msfa.Args(**(SHORT | dict(
        run_dir=str(run_dir), total_timesteps=256, eval_every=10_000, checkpoint_minutes=1e-9)))), code=1)
    assert line.startswith("error: step 128: loss became nan (seed 1)") and "last good state" in line, line
    assert json.loads((run_dir / "checkpoint.eqx").open("rb").readline())["step"] == 64
    assert read(run_dir / "eval.csv") == []  # so the checkpoint of step 64 was written by time
    assert [r["step"] for r in read(run_dir / "metrics.csv")] == ["64", "128"]


# ------------------------------------------------------------------------ saved agents (tools/evaluate.py)
def test_a_saved_agent_evaluates_on_any_task_and_reproduces_its_runs_evaluation(finished, capsys, tmp_path):
    from tools import evaluate

    assert sorted(p.name for p in finished.glob("params_seed*.eqx")) == ["params_seed1.eqx"]
    assert (finished / "params_seed1.eqx").stat().st_size < 16 * 2**20
    # the run's own evaluation at step 128 used the key 10000 + 128: the same seed gives the same rows
    evaluate.main(evaluate.Args(run_dir=str(finished), tasks="train;test", episodes=2, seed=10_128,
                                out=str(tmp_path / "again.csv")))
    last = [r for r in read(finished / "eval.csv") if r["step"] == "128"]
    assert read(tmp_path / "again.csv") == last
    # any task vector, GPI off only
    evaluate.main(evaluate.Args(run_dir=str(finished), tasks="1,1,0,0;-1,1,-1,1", episodes=3, gpi="off"))
    rows = list(csv.DictReader(capsys.readouterr().out.splitlines()))
    assert [(r["task"], r["gpi"], r["episodes"], r["split"]) for r in rows] == [
        ("1,1,0,0", "0", "3", "test"), ("-1,1,-1,1", "0", "3", "test")]


def test_one_gpi_setting_alone_gives_that_settings_rows_of_both(tmp_path):
    """--gpi on|off plays one setting (half the cost) with that setting's own keys: the same rows as --gpi both.
    On the committed H200 MSFA agent, whose returns differ from episode to episode (a tiny run's are all 0)."""
    from tools import evaluate

    agent = ROOT / "results/babyai/paper_protocol_h200/msfa"
    rows = {}
    for gpi in ("both", "on", "off"):
        evaluate.main(evaluate.Args(run_dir=str(agent), tasks="1,1,0,0", episodes=3, seed=4, gpi=gpi,
                                    out=str(tmp_path / f"{gpi}.csv")))
        rows[gpi] = read(tmp_path / f"{gpi}.csv")
    assert [r["gpi"] for r in rows["both"]] == ["0", "1"] and float(rows["both"][1]["return_std"]) > 0
    assert rows["off"] == rows["both"][:1] and rows["on"] == rows["both"][1:]


def test_evaluate_plays_only_the_gpi_settings_asked_for():
    """tools.evaluate hands the settings to make_evaluate (every script takes gpi_settings: docs/contract.md); a
    UVFA, which has no GPI, refuses any but its one setting."""
    from types import SimpleNamespace

    import uvfa
    from tools.evaluate import play

    asked = []
    returns = np.stack([np.full((2, 3), 10.0), np.full((2, 3), 11.0)])  # [GPI setting, task, episode]

    def make_evaluate(setup, args, tasks, gpi_settings=(0, 1)):
        asked.append(gpi_settings)
        return lambda params, key: returns[list(gpi_settings)]

    script = SimpleNamespace(GPI_SETTINGS=(0, 1), make_setup=lambda args: None, make_evaluate=make_evaluate)
    assert (play(script, None, None, None, (1,), None) == 11.0).all()
    assert (play(script, None, None, None, (0,), None) == 10.0).all()
    assert play(script, None, None, None, (0, 1), None).shape == (2, 2, 3)
    assert asked == [(1,), (0,), (0, 1)]
    with pytest.raises(ConfigError, match="a UVFA has no GPI"):
        uvfa.make_evaluate(None, None, None, gpi_settings=(0, 1))


@pytest.mark.parametrize("overrides, message", [
    (dict(tasks="1,1,0"), "has 3 weights"),
    (dict(tasks="1,a,0,0"), "is not a task vector"),
    (dict(gpi="maybe"), "--gpi must be both, on or off"),
    (dict(run_dir="/nonexistent"), "no params_seed<N>.eqx"),
])
def test_evaluate_bad_input_gets_one_line(overrides, message, finished, capsys):
    from tools import evaluate

    line = one_line_exit(capsys, lambda: evaluate.main(evaluate.Args(**({"run_dir": str(finished)} | overrides))))
    assert message in line, line


# --------------------------------------------------------------------------------------------- CSV logs (CsvLog)
def test_a_csv_written_by_an_older_version_keeps_its_columns(tmp_path):
    """A run resumed by a newer script version goes on under the file's own header, without the new columns."""
    from common.run import CsvLog

    path = tmp_path / "metrics.csv"
    path.write_text("step,seed,loss\n10,1,0.5\n")
    CsvLog(path, ["step", "seed", "loss", "phi_corr_1"]).write([{"step": 20, "seed": 1, "loss": 0.25,
                                                                  "phi_corr_1": 0.9}])
    assert path.read_text() == "step,seed,loss\n10,1,0.5\n20,1,0.25\n"


def test_a_csv_without_a_header_is_refused(tmp_path):
    """A file whose first line is data (another process appended to a removed run's file) is not taken as a header."""
    from common.run import ConfigError, CsvLog

    path = tmp_path / "metrics.csv"
    path.write_text("30720,1,84.1\n")
    with pytest.raises(ConfigError, match="does not start with a header line"):
        CsvLog(path, ["step", "seed", "sps"])
    assert path.read_text() == "30720,1,84.1\n"


def test_the_run_records_its_env_where_the_tools_read_it(finished):
    """config.json and every parameter file's header say the env (the tools no longer guess it from the argument
    names, which they still do for runs saved before it was recorded)."""
    from common.run.checkpoint import read_checkpoint_header
    from tools.run_reader import RunReader, recorded_env

    assert json.loads((finished / "config.json").read_text())["env"] == "babyai" == RunReader(finished).env
    assert read_checkpoint_header(finished / "params_seed1.eqx")["env"] == "babyai"
    assert recorded_env({"args": {"room_size": 5}}) == "minihack"  # a run saved before: read by its settings
    assert recorded_env({"env": "fruitbot", "args": {}}) == "fruitbot"


def test_config_records_a_missing_package_as_none():
    """A MiniHack-only install has no minigrid: config.json records None for it instead of stopping the run
    (as it once did, before any step, on an H200)."""
    from common.run import versions

    recorded = versions(("jax", "no-such-package-for-msfa-jax"))
    assert recorded["jax"] == jax.__version__ and recorded["no-such-package-for-msfa-jax"] is None
    assert recorded["git_commit"]


# --------------------------------------------------------------------------------------------- metrics.csv rows
def test_metric_rows_hand_worked():
    """One seed, a chunk of 2 iterations, 2 train tasks: iteration 0 learned and ended 1 episode of task 0 (return 1,
    length 30); iteration 1 did not learn and ended 2 of task 0 (returns 0, 2) and 1 of task 1 (return 4), lengths
    40 + 50 + 80. Losses average the learning iteration only; returns and lengths pool the chunk's episodes."""
    from common.run import IterationMetrics, SGDMetrics, metric_fields, metric_rows, progress_line

    metrics = jax.tree.map(lambda v: np.asarray(v)[None], IterationMetrics(
        sgd=SGDMetrics({"loss": [0.5, 0.0]}), learning=[1.0, 0.0], epsilon=[0.1, 0.3],
        return_sum=[[1.0, 0.0], [2.0, 4.0]], return_count=[[1, 0], [2, 1]], length_sum=[30, 170]),
        is_leaf=lambda x: isinstance(x, list))
    row, = metric_rows(metrics, np.asarray([7]), [3], 640, 12.0, ("loss",), ["1,0", "0,1"])
    assert set(row) <= set(metric_fields(("loss",), ["1,0", "0,1"]))
    assert (row["step"], row["seed"], row["sgd_steps"], row["loss"]) == (640, 3, 7, 0.5)
    assert row["epsilon"] == pytest.approx(0.2)
    assert row["episode_length"] == 50.0  # (30 + 170) / 4 episodes
    assert row["return_train_1,0"] == 1.0 and row["return_train_0,1"] == 4.0  # (1 + 2) / 3 and 4 / 1
    assert row["episodes_train_1,0"] == 3 and row["episodes_train_0,1"] == 1
    assert "train return 2.50 | episode length 50 | loss 0.5000" in progress_line([row], 6400, 60.0)
    quiet = metrics._replace(return_count=np.zeros((1, 2, 2)), return_sum=np.zeros((1, 2, 2)),
                             length_sum=np.zeros((1, 2)))
    row, = metric_rows(quiet, np.asarray([7]), [3], 640, 12.0, ("loss",), ["1,0", "0,1"])
    assert row["episode_length"] == "" and row["return_train_1,0"] == ""  # no episode ended in the chunk
    assert row["episodes_train_1,0"] == 0


# ------------------------------------------------------------------------------------------ a full disk
def test_a_save_on_a_full_disk_stops_with_one_line_and_loses_nothing(finished, tmp_path, capsys, monkeypatch):
    """The next checkpoint's write fails half way with ENOSPC: one line (the file, the reason, the space needed
    against the free space, the kept checkpoint, the resume command), exit status 1, no partial file left, and the
    old checkpoint intact: it resumes once the write works again."""
    import errno

    import equinox as eqx

    run_dir = tmp_path / "run"
    shutil.copytree(finished, run_dir)
    before = (run_dir / "checkpoint.eqx").read_bytes()
    serialise = eqx.tree_serialise_leaves

    def full_disk(f, tree, *args, **kwargs):
        f.write(b"\0" * 4096)  # a partial write, then the disk is full
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(eqx, "tree_serialise_leaves", full_disk)
    args = ["--resume", "--run-dir", str(run_dir), "--total-timesteps", "256"]
    line = one_line_exit(capsys, lambda: msfa.main(parse_args(msfa.Args, args)), code=1)
    # the evaluation at 192 writes the parameter files first: the first write to fail
    assert "could not write" in line and "params_seed1.eqx: No space left on device (it needs" in line, line
    assert " free); the last good params_seed1.eqx (step 128) is kept" in line and "--resume --run-dir" in line, line
    assert not any(p.suffix == ".tmp" for p in run_dir.iterdir())
    assert (run_dir / "checkpoint.eqx").read_bytes() == before
    monkeypatch.setattr(eqx, "tree_serialise_leaves", serialise)
    msfa.main(parse_args(msfa.Args, args))  # space freed: it resumes from the kept checkpoint
    assert int(read(run_dir / "metrics.csv")[-1]["step"]) == 256


# ------------------------------------------------------------------------------------------ exact step budgets
def test_a_run_trains_the_steps_asked_and_evaluates_where_asked(tmp_path, capsys):
    """32 env steps an iteration (4 envs x 8): --total-timesteps 150 trains 160 (5 iterations, not a whole extra log
    chunk), --eval-every 90 evaluates at 96 and at the end, and the chunks stop there (logging every 64 steps)."""
    run_dir = tmp_path / "run"
    msfa.main(msfa.Args(**(TINY_MSFA | dict(total_timesteps=150, log_every=64, eval_every=90,
                                             run_dir=str(run_dir)))))
    out = capsys.readouterr().out
    assert "rounded up to whole iterations of 32 env steps: --total-timesteps 150 -> 160; --eval-every 90 -> 96" in out
    assert [int(r["step"]) for r in read(run_dir / "metrics.csv")] == [64, 96, 160]
    assert sorted({int(r["step"]) for r in read(run_dir / "eval.csv")}) == [96, 160]


def test_a_config_written_with_the_retired_speed_settings_still_loads_without_them(tmp_path):
    """Runs saved before --core-backend recorded --learner-unroll, --joint-target-unroll and --lstm-grad-after-loop
    (results/fruitbot/paper_cpu_msfa/ among the committed ones): they changed the speed, not the function, so
    `--resume` and the tools take such a config with them dropped; any other unknown setting is refused."""
    from common.run import ConfigError
    from common.run.settings import _as_args

    saved = json.loads(json.dumps(msfa.Args(run_dir=str(tmp_path)).__dict__))
    old = saved | {"learner_unroll": 1, "joint_target_unroll": True, "lstm_grad_after_loop": False}
    del old["core_backend"]
    assert _as_args(msfa.Args, old).core_backend is None
    with pytest.raises(ConfigError, match="does not know"):
        _as_args(msfa.Args, old | {"no_such_setting": 1})
