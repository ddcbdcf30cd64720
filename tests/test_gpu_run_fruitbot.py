"""The prepared Fruitbot GPU command (results/fruitbot/gpu_run.sh, results/gpu_run.py --env fruitbot), and
MiniHack's: one method at a time with time kept for the final evaluation; bad input is refused with one line; the
seed count fits the device's memory; the saved agents are hidden from what travels to the GPU and restored."""

import json
import shutil
import subprocess
import tarfile
from pathlib import Path

import pytest
import tyro

import common.fruitbot  # noqa: F401  (procgen imports gym, whose banner on stderr is not the line checked)
from common.run import ConfigError
from results import gpu_run

ROOT = Path(__file__).resolve().parent.parent
GIB = 2**30


@pytest.mark.parametrize("env, reserve", [("fruitbot", 120), ("minihack", 180)])
def test_host_env_commands_run_one_method_at_a_time_and_keep_time_for_the_final_evaluation(env, reserve, tmp_path,
                                                                                           monkeypatch):
    """Fruitbot's and MiniHack's defaults, with stand-in runs that only sleep (tests/fake_training_run.py; the shared
    command runs a real script end to end in test_scale.py, and each script's tiny run is in its own tests): one method
    at a time (Fruitbot's replay of frames fills a GPU; MiniHack's SGD step of 10 seeds needs 42 GiB), each told to
    stop the env's reserve before the budget ends (--max-minutes: the host envs' final evaluation is slow), no device
    memory on a CPU to decide the seeds, and the two runs' files packed."""
    fake = "tests/fake_training_run.py"
    monkeypatch.setitem(gpu_run.METHODS, env, {"msfa": f"{fake} --sleep 2", "usfa": f"{fake} --sleep 0"})
    # the env benchmark (Fruitbot's first 90 s on a GPU) stands in as its table
    monkeypatch.setattr(gpu_run, "env_benchmark", lambda args: f"table of {args.env}")
    out, work = tmp_path / "out", tmp_path / "work"
    gpu_run.main(gpu_run.Args(300, str(out), env=env, num_seeds=1, work_dir=str(work), min_run_seconds=30))
    summary = json.loads((out / "summary.json").read_text())
    assert summary["env_throughput"] == f"table of {env}"
    assert summary["env"] == env and summary["num_seeds"] == 1 and summary["concurrency"] == 1
    assert "device_bytes_limit" not in summary  # a CPU: no device memory decides the seeds
    assert [m for m in ("msfa", "usfa") if m in summary] == ["msfa", "usfa"] and summary["not_started"] == []
    assert all(summary[m]["exit_status"] == 0 and summary[m]["params_seeds"] == [1] for m in ("msfa", "usfa"))
    with tarfile.open(out / "results.tar.gz") as tar:
        configs = {m: json.load(tar.extractfile(f"{m}/config.json")) for m in ("msfa", "usfa")}
    assert configs["usfa"]["started"] >= configs["msfa"]["started"] + 2  # usfa waited for msfa's slot
    assert (300 - reserve - 5) / 60 < configs["msfa"]["args"]["max_minutes"] <= (300 - reserve) / 60  # reserve kept
    assert sorted(p.name for p in out.iterdir()) == ["params_msfa.tar.gz", "params_usfa.tar.gz", "results.tar.gz",
                                                     "summary.json"]


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
