"""The prepared Fruitbot GPU command (results/fruitbot/gpu_run.sh): it runs end to end here on a tiny budget and
brings back what analysis needs; bad input is refused with one line; the seed count fits the device's memory."""

import json
import os
import shutil
import subprocess
import sys
import tarfile
import time
from pathlib import Path

import pytest
import tyro

import common.fruitbot  # noqa: F401  (procgen imports gym, whose banner on stderr is not the line checked)
from common.run import ConfigError
from results import gpu_run

ROOT = Path(__file__).resolve().parent.parent
TINY = ["--num-envs", "4", "--sequence-period", "8", "--sequence-length", "9", "--replay-size", "64",
        "--min-replay-size", "8", "--batch-size", "4", "--samples-per-insert", "1.0", "--target-update-period", "3",
        "--eval-episodes", "1", "--num-modules", "2", "--module-size", "8", "--attention-heads", "1",
        "--psi-hidden", "8", "--phi-hidden", "8", "--max-levels", "1"]
GIB = 2**30


def test_fruitbot_gpu_run_trains_msfa_within_its_budget_and_leaves_what_can_come_back(tmp_path):
    """One method (MSFA), one seed, a 96-step protocol with one evaluation at its end."""
    out, work = tmp_path / "out", tmp_path / "work"
    extra = " ".join([*TINY, "--total-timesteps", "96", "--log-every", "32", "--eval-every", "96"])
    budget = 150
    start = time.time()
    done = subprocess.run(
        ["bash", "results/fruitbot/gpu_run.sh", str(budget), str(out), "--methods", "msfa", "--num-seeds", "1",
         f"--extra={extra}", "--work-dir", str(work), "--reserve-seconds", "30", "--min-run-seconds", "30"],
        cwd=ROOT, env=os.environ | {"PYTHON": sys.executable}, capture_output=True, text=True,
        timeout=budget + 120)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert time.time() - start <= budget + 5
    files = sorted(p for p in out.rglob("*") if p.is_file())
    assert 2 <= len(files) <= 8 and all(p.stat().st_size <= 16 * 2**20 and p.parent == out for p in files), files
    summary = json.loads((out / "summary.json").read_text())
    assert summary["env"] == "fruitbot" and summary["num_seeds"] == 1 and summary["concurrency"] == 1
    assert "device_bytes_limit" not in summary  # a CPU: no device memory decides the seeds
    msfa = summary["msfa"]
    assert msfa["command"] == "msfa_fruitbot.py" and msfa["exit_status"] == 0, msfa
    assert msfa["steps_per_seed"] == msfa["total_timesteps"] == 96 and msfa["share_of_protocol"] == 1.0
    assert msfa["params_seeds"] == [1] and list(summary)[-1] == "msfa"  # the one method asked for
    with tarfile.open(out / "results.tar.gz") as tar:
        assert {"msfa/config.json", "msfa/metrics.csv", "msfa/eval.csv", "msfa/train.log"} <= set(tar.getnames())
        config = json.load(tar.extractfile("msfa/config.json"))
        eval_csv = tar.extractfile("msfa/eval.csv").read().decode().splitlines()
    assert config["args"]["num_envs"] == 4 and config["args"]["checkpoint"] is False
    assert len(eval_csv) == 1 + 2 * 10 and all(line.startswith("96,1,") for line in eval_csv[1:])  # GPI x tasks
    with tarfile.open(out / "params_msfa.tar.gz") as tar:
        assert tar.getnames() == ["msfa/params_seed1.eqx"]


@pytest.mark.parametrize("flags, message", [
    (["--env", "atari"], "unknown --env 'atari'; choose from babyai, fruitbot, minihack"),
    (["--env", "fruitbot", "--methods", "msfa", "ppo"], "unknown methods ['ppo'] for --env fruitbot; choose from msfa"),
], ids=["env", "method"])
def test_bad_env_or_method_is_refused_with_one_line(flags, message, tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_info:
        gpu_run.main(tyro.cli(gpu_run.Args, args=["300", str(tmp_path / "out"), *flags]))
    err = capsys.readouterr().err.strip().splitlines()
    assert exit_info.value.code == 2 and len(err) == 1 and message in err[0], err
    assert not (tmp_path / "out").exists()


def test_seed_count_fits_the_device_memory():
    """70% of the memory for the replays of the methods running at once: with 33 GiB per seed (the paper's 70k
    sequences), 1 seed on an H100 (about 60 GiB allocatable), 2 on an H200 (about 105 GiB); none at two methods at
    once on an H100; no limit known (a CPU): 10, or what was asked."""
    per_seed = 33 * GIB
    assert gpu_run.choose_num_seeds(None, per_seed, 1, 60 * GIB) == 1
    assert gpu_run.choose_num_seeds(None, per_seed, 1, 105 * GIB) == 2
    assert gpu_run.choose_num_seeds(2, per_seed, 1, 105 * GIB) == 2
    assert gpu_run.choose_num_seeds(None, GIB, 1, 80 * GIB) == 10  # never more than the paper's 10
    assert gpu_run.choose_num_seeds(None, None, 2, None) == 10 and gpu_run.choose_num_seeds(3, per_seed, 1, None) == 3
    with pytest.raises(ConfigError, match=r"--num-seeds 2 does not fit: .* allows at most 1 seed\(s\)"):
        gpu_run.choose_num_seeds(2, per_seed, 1, 60 * GIB)
    with pytest.raises(ConfigError, match="not even one seed fits"):
        gpu_run.choose_num_seeds(None, per_seed, 2, 60 * GIB)


def test_a_seed_count_that_cannot_fit_is_refused_before_anything_runs(tmp_path, capsys, monkeypatch):
    """On a (fake) device allowing 60 GiB, the scripts' own replay sizes at the paper's settings (33 GiB per seed)
    leave room for one seed: --num-seeds 2 is refused with one line saying so."""
    monkeypatch.setattr(gpu_run, "device_memory_limit", lambda: 60 * GIB)
    with pytest.raises(SystemExit) as exit_info:
        gpu_run.main(tyro.cli(gpu_run.Args, args=["300", str(tmp_path / "out"), "--env", "fruitbot",
                                                   "--num-seeds", "2"]))
    err = capsys.readouterr().err.strip().splitlines()
    assert exit_info.value.code == 2 and len(err) == 1, err
    assert "--num-seeds 2 does not fit: 33.0 GiB of replay per seed x 1 method(s) at once allows at most 1" in err[0]
    assert not (tmp_path / "out").exists()


def test_gpu_carry_hides_the_saved_agents_from_what_travels_and_restores_them(tmp_path):
    """hide: the tracked params_seed*.eqx leave git's index and are ignored (so they do not travel), the files stay
    on disk; restore: the index and .git/info/exclude are as before. hide refuses staged changes and a second hide."""
    clone = tmp_path / "clone"
    subprocess.run(["git", "clone", "-q", str(ROOT), str(clone)], check=True)
    git = lambda *a: subprocess.run(["git", *a], cwd=clone, capture_output=True, text=True, check=True).stdout  # noqa: E731
    carry = lambda verb: subprocess.run(["bash", "results/fruitbot/gpu_carry.sh", verb], cwd=clone,  # noqa: E731
                                        capture_output=True, text=True)
    shutil.copy(ROOT / "results/fruitbot/gpu_carry.sh", clone / "results/fruitbot/gpu_carry.sh")  # as in the work tree
    if git("status", "--porcelain"):
        git("add", "-A")
        git("-c", "user.name=test", "-c", "user.email=test@example.com", "commit", "-q", "-m", "this work tree")
    params = git("ls-files", "results/**/params_seed*.eqx").split()
    exclude_before = (clone / ".git/info/exclude").read_text()
    assert params and git("status", "--porcelain") == ""
    hidden = carry("hide")
    assert hidden.returncode == 0 and f"hid {len(params)} parameter files" in hidden.stdout, hidden.stderr
    assert not set(params) & set(git("ls-files").split())
    assert git("status", "--porcelain", "--untracked-files=all").split() == [x for p in params for x in ("D", p)]
    assert all((clone / p).exists() for p in params)
    again = carry("hide")
    assert again.returncode == 2 and again.stderr.strip().startswith("error: changes are staged")
    restored = carry("restore")
    assert restored.returncode == 0 and f"restored {len(params)}" in restored.stdout
    assert git("status", "--porcelain", "--untracked-files=all") == ""
    assert (clone / ".git/info/exclude").read_text() == exclude_before
    assert carry("restore").stdout.strip() == "nothing hidden"
