"""tools.protocol --slurm against a real SLURM: a single-node cluster started on this machine for these tests
(tests/slurm_cluster.py; .ci/run installs SLURM and MUNGE, and there these tests must run: MSFA_REQUIRE_SLURM=1)."""

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import slurm_cluster
from test_scale import SMALL_NET, TINY, read

ROOT = Path(__file__).resolve().parent.parent
EXTRA = [*TINY, *SMALL_NET, "--total-timesteps", "2048", "--log-every", "32", "--eval-every", "128",
         "--checkpoint-minutes", "0.01"]
ON_THIS_NODE = ["--slurm", "--slurm-gpus", "0", "--slurm-cpus", "1"]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    why = slurm_cluster.missing()
    if why is not None:
        if os.environ.get("MSFA_REQUIRE_SLURM"):
            pytest.fail(f"MSFA_REQUIRE_SLURM is set but {why}")
        pytest.skip(why)
    with slurm_cluster.SlurmCluster(tmp_path_factory.mktemp("slurm")) as running:
        yield running


@pytest.fixture(autouse=True)
def empty_queue(cluster):
    """Each test starts with no jobs and leaves none (a failed test's jobs are cancelled)."""
    yield
    subprocess.run(["scancel", "--user=root"], env=cluster.env, capture_output=True)
    wait_for(lambda: not subprocess.run(["squeue", "-h"], env=cluster.env, capture_output=True,
                                        text=True).stdout.strip(), "the queue to empty", seconds=120)


def protocol(cluster, *args, timeout=120):
    return subprocess.run([sys.executable, "-m", "tools.protocol", *map(str, args)], cwd=ROOT, env=cluster.env,
                          capture_output=True, text=True, timeout=timeout)


def job_state(cluster, job_id: str) -> str:
    shown = subprocess.run(["scontrol", "show", "job", "--oneliner", job_id], env=cluster.env, capture_output=True,
                           text=True).stdout
    return next((f.split("=", 1)[1] for f in shown.split() if f.startswith("JobState=")), "")


def status(cluster, out: Path) -> dict[str, str]:
    shown = protocol(cluster, out, "--status")
    assert shown.returncode == 0, shown.stderr
    return {line.split()[1]: line for line in shown.stdout.splitlines()[1:] if line.startswith("babyai")} | {
        "error": "\n".join(line for line in shown.stdout.splitlines() if "error:" in line)}


def wait_for(condition, what: str, seconds: float = 300):
    deadline = time.time() + seconds
    while not condition():
        assert time.time() < deadline, f"timed out waiting for {what}"
        time.sleep(0.5)


def requeued(cluster, out: Path, job_id: str, restarts: int) -> None:
    """Once the requeued job is pending, --status says so; then it starts at once (SLURM would hold it ~2 minutes
    before it is eligible)."""
    wait_for(lambda: job_state(cluster, job_id) == "PENDING", f"job {job_id} pending again")
    assert f"requeued (restarts {restarts})" in status(cluster, out)["msfa"]
    subprocess.run(["scontrol", "update", f"JobId={job_id}", "StartTime=now"], env=cluster.env, check=True)


def hold(conditions: dict, not_pids=()) -> dict[Path, int]:
    """SIGSTOP each run's script (not one of not_pids) as soon as its condition holds, polled every 10 ms: a tiny
    run trains in seconds, and held it cannot finish before the test acts on it. Returns their pids."""
    held, deadline = {}, time.time() + 300
    while len(held) < len(conditions):
        assert time.time() < deadline, f"timed out holding {set(conditions) - set(held)}"
        for run_dir, condition in conditions.items():
            pid = None if run_dir in held else pid_of_run(run_dir)
            if pid is not None and pid not in not_pids and condition():
                os.kill(pid, signal.SIGSTOP)
                held[run_dir] = pid
        time.sleep(0.01)
    return held


def last_job_log(log: Path) -> str:
    return log.read_text().split("[job ")[-1] if log.exists() else ""


def pid_of_run(run_dir: Path) -> int | None:
    """The process of msfa_babyai.py whose --run-dir is run_dir (the argument itself: one run's folder may be the
    start of another's, msfa of msfa_entangled_psi)."""
    for proc in Path("/proc").iterdir():
        try:
            argv = (proc / "cmdline").read_bytes().decode().split("\0")
        except OSError:
            continue
        if proc.name.isdigit() and any(a.endswith("msfa_babyai.py") for a in argv) and any(
                a == "--run-dir" and b == str(run_dir) for a, b in zip(argv, argv[1:])):
            return int(proc.name)
    return None


def test_on_slurm_requeued_and_killed_runs_complete_and_the_requeued_one_equals_the_uninterrupted_run(
        cluster, tmp_path):
    """Two tiny methods as SLURM jobs. MSFA's job is requeued by SLURM while it trains (`scontrol requeue`: the
    script gets SIGTERM and checkpoints) and then preempted (`scancel --signal USR2`, the warning submitit handles:
    it checkpoints the run and requeues the job); its ablation's script is SIGKILLed (no warning: the job fails) and
    `--resume --slurm` submits it again. Both complete; MSFA's metrics (but timing) and evaluations equal those of
    the same run uninterrupted; --status shows the states on the way."""
    out = tmp_path / "p"
    whole = tmp_path / "whole"  # the uninterrupted run, beside the jobs
    reference = subprocess.Popen([sys.executable, "msfa_babyai.py", "--seed", "1", "--num-seeds", "1", *EXTRA,
                                  "--run-dir", str(whole)], cwd=ROOT, stdout=subprocess.DEVNULL,
                                 stderr=subprocess.STDOUT)
    submitted = protocol(cluster, out, "--env", "babyai", "--methods", "msfa", "msfa_entangled_psi", "--seeds", 1,
                         *ON_THIS_NODE, f"--extra={' '.join(EXTRA)}", "--analysis-episodes", 2)
    assert submitted.returncode == 0, submitted.stderr
    assert "submitted 2 run(s) as SLURM jobs" in submitted.stdout
    record = json.loads((out / "jobs.json").read_text())
    msfa, ablation = record["jobs"]["msfa"], record["jobs"]["msfa_entangled_psi"]
    held = hold({out / name: (lambda name=name: (out / name / "checkpoint.eqx").exists())
                 for name in ("msfa", "msfa_entangled_psi")})  # SLURM's kill sends SIGCONT before SIGTERM
    assert "running" in status(cluster, out)["msfa"]

    os.kill(held[out / "msfa_entangled_psi"], signal.SIGKILL)
    wait_for(lambda: job_state(cluster, ablation) == "FAILED", "the ablation's job failing")
    shown = status(cluster, out)
    assert "failed" in shown["msfa_entangled_psi"] and "exited with status -9" in shown["error"], shown

    subprocess.run(["scontrol", "requeue", msfa], env=cluster.env, check=True)
    requeued(cluster, out, msfa, restarts=1)
    again = hold({out / "msfa": lambda: "resumed" in last_job_log(out / "msfa.log")}, not_pids=held.values())
    os.kill(again[out / "msfa"], signal.SIGCONT)
    subprocess.run(["scancel", "--signal", "USR2", msfa], env=cluster.env, check=True)
    requeued(cluster, out, msfa, restarts=2)

    resumed = protocol(cluster, out, "--resume", *ON_THIS_NODE, "--analysis-episodes", 2)
    assert resumed.returncode == 0, resumed.stderr
    assert "submitted 1 run(s) as SLURM jobs" in resumed.stdout  # MSFA's job still runs: not submitted again
    finish = json.loads((out / "jobs.json").read_text())["finish"]
    wait_for(lambda: job_state(cluster, finish) in ("COMPLETED", "FAILED"), "the analysis job", seconds=600)
    assert job_state(cluster, finish) == "COMPLETED", (out / "slurm").glob(f"{finish}/*.out")
    shown = status(cluster, out)
    assert "done" in shown["msfa"] and "done" in shown["msfa_entangled_psi"], shown
    summary = json.loads((out / "summary.json").read_text())
    for name in ("msfa", "msfa_entangled_psi"):
        entry = summary["methods"][name]
        assert entry["complete"] and entry["analysis"] == "ok" and entry["exit_status"] == 0, entry
    last_job = last_job_log(out / "msfa_entangled_psi.log")
    assert int(re.search(r"resumed \S+ at step (\d+)", last_job).group(1)) > 0  # from its last checkpoint

    assert reference.wait(timeout=600) == 0
    drop = ("sps", "rss_gb")
    for table in ("metrics.csv", "eval.csv"):
        rows = [[{k: v for k, v in r.items() if k not in drop} for r in read(run / table)]
                for run in (out / "msfa", whole)]
        assert rows[0] == rows[1] and rows[0], table
    # resumed, not restarted (once or twice: the preemption may stop the second job before it records its start)
    assert json.loads((out / "msfa" / "config.json").read_text())["resumes"]


def test_slurm_refuses_bad_input_with_one_line_and_submits_nothing(cluster, tmp_path, monkeypatch):
    cases = [
        ([tmp_path / "a", "--env", "babyai", "--slurm", "--slurm-gpus", "0", "--slurm-partition", "nope"],
         "sbatch refused the job: sbatch: error: invalid partition specified: nope"),
        ([tmp_path / "b", "--env", "babyai", "--methods", "nope", "--slurm"], "unknown methods ['nope']"),
        ([tmp_path / "c", "--env", "babyai", "--slurm-partition", "debug"], "--slurm-partition without --slurm"),
        ([tmp_path / "d", "--env", "babyai", "--slurm", "--slurm-sbatch", "mem"], "--slurm-sbatch takes KEY=VALUE"),
    ]
    (tmp_path / "e").mkdir()
    (tmp_path / "e" / "protocol.json").write_text(json.dumps({"env": "babyai", "methods": ["msfa"], "seeds": 1}))
    cases.append(([tmp_path / "e", "--env", "babyai", "--slurm"], "continue it with --resume"))
    for args, message in cases:
        refused = protocol(cluster, *args)
        assert refused.returncode == 2 and message in refused.stderr, (args, refused.stderr)
        assert len(refused.stderr.strip().splitlines()) == 1, refused.stderr
    no_sbatch = dict(cluster.env, PATH=os.path.dirname(sys.executable))
    refused = subprocess.run([sys.executable, "-m", "tools.protocol", str(tmp_path / "f"), "--env", "babyai",
                              "--slurm"], cwd=ROOT, env=no_sbatch, capture_output=True, text=True)
    assert refused.returncode == 2 and "sbatch is not on PATH" in refused.stderr, refused.stderr
    queue = subprocess.run(["squeue", "-h"], env=cluster.env, capture_output=True, text=True).stdout
    assert queue.strip() == "", queue  # nothing submitted
