"""Paper scale: seeds spread over several devices give the single-device results; the prepared GPU command
(results/babyai/gpu_run.sh) runs end to end here at tiny settings; its scheduling (priority order, methods at once,
stopping inside the budget) is checked with stand-in runs whose timeline does not depend on this machine's speed; and
it leaves only what can come back from a lent GPU (at most 8 files of at most 16 MiB)."""

import csv
import json
import os
import signal
import subprocess
import sys
import tarfile
import time
from pathlib import Path

import numpy as np
import pytest

import msfa_babyai as msfa
from common.run import parse_args
from results import gpu_run

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


FAKE = "tests/fake_training_run.py"  # writes a run's files and sleeps; no JAX


def test_gpu_run_trains_in_priority_order_within_its_budget_and_leaves_what_can_come_back(tmp_path, monkeypatch):
    """The scheduling, with stand-in runs that only sleep (tests/fake_training_run.py), so that the timeline does not
    depend on this machine's speed: budget 40 s, 20 s reserved (methods start until 20 s), a method started only with
    10 s left, two at a time. quick (1 s) and hangs start at once; quick's slot goes to slow (15 s), which ends with
    under 10 s left, so late never starts; hangs overruns its limit and ignores the SIGTERM sent 15 s before the end,
    so it is killed 5 s before the end, and what it wrote is packed: the whole command ends inside its budget."""
    monkeypatch.setitem(gpu_run.METHODS, "babyai", {"quick": f"{FAKE} --sleep 1", "hangs": f"{FAKE} --hang",
                                                    "slow": f"{FAKE} --sleep 15", "late": f"{FAKE} --sleep 1"})
    out, work = tmp_path / "out", tmp_path / "work"
    budget = 40
    start = time.time()
    gpu_run.main(gpu_run.Args(budget, str(out), num_seeds=2, methods=("quick", "hangs", "slow", "late"),
                              work_dir=str(work), reserve_seconds=20, min_run_seconds=10, concurrency=2,
                              analysis_seconds=0))
    assert time.time() - start <= budget
    files = sorted(p for p in out.rglob("*") if p.is_file())
    assert 2 <= len(files) <= 8 and all(p.stat().st_size <= 16 * 2**20 and p.parent == out for p in files), files
    summary = json.loads((out / "summary.json").read_text())
    assert summary["num_seeds"] == 2 and "cpu" in summary["device"] and summary["concurrency"] == 2
    assert [m for m in ("quick", "hangs", "slow", "late") if m in summary] == ["quick", "hangs", "slow"]
    assert summary["not_started"] == ["late"]
    assert [summary[m]["exit_status"] for m in ("quick", "hangs", "slow")] == [0, -signal.SIGKILL, 0]
    assert [summary[m]["share_of_protocol"] for m in ("quick", "hangs", "slow")] == [1.0, 0.5, 1.0]
    assert all(summary[m]["params_seeds"] == [1, 2] for m in ("quick", "hangs", "slow"))
    assert summary["hangs"]["wall_seconds"] >= budget - 6  # it ran until the kill, 5 s before the end
    with tarfile.open(out / "results.tar.gz") as tar:
        names = set(tar.getnames())
    assert {f"{m}/{f}" for m in ("quick", "hangs", "slow") for f in ("config.json", "metrics.csv", "eval.csv",
                                                                      "run_summary.json", "train.log")} == names
    with tarfile.open(out / "params_slow.tar.gz") as tar:
        assert tar.getnames() == ["slow/params_seed1.eqx", "slow/params_seed2.eqx"]


def test_gpu_run_runs_a_real_script_end_to_end(tmp_path):
    """The prepared command itself (results/babyai/gpu_run.sh) on the CPU: MSFA with two vmapped seeds at tiny
    settings finishes its protocol, its saved agents are analysed (Table A, the cumulants' quality), and it brings
    back its small files, the analysis, a summary naming the device, and both seeds' parameters, writing no
    replay-sized checkpoint. The budget is generous: the command ends when the run does (the budget's timeline is
    tested above)."""
    out, work = tmp_path / "out", tmp_path / "work"
    extra = " ".join([*TINY, *SMALL_NET, "--total-timesteps", "128", "--log-every", "64", "--eval-every", "64"])
    done = subprocess.run(
        ["bash", "results/babyai/gpu_run.sh", "900", str(out), "--num-seeds", "2", f"--extra={extra}",
         "--work-dir", str(work), "--methods", "msfa", "--reserve-seconds", "30", "--min-run-seconds", "30",
         "--analysis-seconds", "240", "--analysis-episodes", "2"],
        cwd=ROOT, env=os.environ | {"PYTHON": sys.executable}, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert sorted(p.name for p in out.iterdir()) == ["params_msfa.tar.gz", "results.tar.gz", "summary.json"]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["msfa"]["exit_status"] == 0 and summary["msfa"]["share_of_protocol"] == 1.0, summary["msfa"]
    assert summary["msfa"]["params_seeds"] == [1, 2] and summary["num_seeds"] == 2
    assert summary["msfa"]["analysis"] == "ok" and summary["concurrency"] == 1
    with tarfile.open(out / "results.tar.gz") as tar:
        assert {f"msfa/{f}" for f in ("config.json", "metrics.csv", "eval.csv", "run_summary.json", "train.log",
                                      "analysis.log", "analysis/analysis.md")} <= set(tar.getnames())
        run_summary = json.loads(tar.extractfile("msfa/run_summary.json").read())
        analysis = tar.extractfile("msfa/analysis/analysis.md").read().decode()
    assert "cpu" in run_summary["device"] and run_summary["share_of_protocol"] == 1.0
    assert "Table A" in analysis
    with tarfile.open(out / "params_msfa.tar.gz") as tar:
        assert sorted(tar.getnames()) == ["msfa/params_seed1.eqx", "msfa/params_seed2.eqx"]
        header = json.loads(tar.extractfile("msfa/params_seed2.eqx").readline())
    assert header["seed"] == 2 and header["step"] == 128 and header["method"] == "MSFA"
    assert not (work / "msfa" / "checkpoint.eqx").exists()  # --no-checkpoint: no replay-sized files


@pytest.mark.parametrize("methods, expected", [
    (["msfa", "usfa_learned"], {"msfa": [1, 2, 3], "usfa_learned": [1, 2, 3]}),
    (list(gpu_run.METHODS["babyai"]), {m: [1] if i < 6 else [] for i, m in enumerate(gpu_run.METHODS["babyai"])}),
], ids=["two methods", "nine methods"])
def test_parameter_archives_share_the_six_slots(methods, expected, tmp_path, monkeypatch):
    """One seed per archive (files of 60 bytes, archives of at most 100): the six slots go round the methods."""
    monkeypatch.setattr(gpu_run, "MAX_FILE_BYTES", 100)
    work, out = tmp_path / "work", tmp_path / "out"
    out.mkdir()
    for name in methods:
        (work / name).mkdir(parents=True)
        (work / f"{name}.log").write_text("log")
        for seed in range(1, 5):
            (work / name / f"params_seed{seed}.eqx").write_bytes(bytes(60))
    summary = {name: {} for name in methods}
    gpu_run.pack(work, out, methods, summary)
    assert {name: summary[name]["params_seeds"] for name in methods} == expected
    archives = sorted(p.name for p in out.glob("params_*"))
    assert len(archives) == 6 and len(list(out.iterdir())) == 7
    if len(methods) == 2:
        assert "params_msfa_3.tar.gz" in archives and "params_usfa_learned_4.tar.gz" not in archives
        with tarfile.open(out / "params_usfa_learned_2.tar.gz") as tar:
            assert tar.getnames() == ["usfa_learned/params_seed2.eqx"]


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
    """A lent GPU machine gets one env's wheels only (results/<env>/gpu_run.sh): BabyAI's carry neither procgen nor
    NLE, MiniHack's neither minigrid nor its pygame (12 MB). The scripts that run an env must import, and check its
    settings, with the other envs' packages missing."""
    block = f"import sys\nfor name in {blocked!r}:\n    sys.modules[name] = None\n"
    done = subprocess.run([sys.executable, "-c", block + code], cwd=ROOT, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]


def test_the_next_method_is_the_first_without_a_full_protocol_run(tmp_path):
    """No run resumes across lent GPUs: the default order is the paper's, less the methods whose full-protocol run is
    committed (results/<env>/paper_protocol/<method>/ with an evaluation at config.json's total_timesteps); partial
    runs of earlier leases (paper_protocol_<device>/) and a run cut short do not count."""
    def run(folder, name, last_step, total=5_000_000):
        (tmp_path / "babyai" / folder / name).mkdir(parents=True)
        config = {"args": {"total_timesteps": total}}
        (tmp_path / "babyai" / folder / name / "config.json").write_text(json.dumps(config))
        (tmp_path / "babyai" / folder / name / "eval.csv").write_text(f"step,seed\n250880,1\n{last_step},1\n")

    run("paper_protocol", "msfa", 5_000_960)  # whole iterations: a little past the total
    run("paper_protocol", "usfa_learned", 4_000_000)  # stopped by the budget
    run("paper_protocol_h100", "usfa", 5_000_960)  # an old lease's folder
    assert gpu_run.default_order("babyai", tmp_path) == tuple(m for m in gpu_run.METHODS["babyai"] if m != "msfa")
    assert gpu_run.default_order("minihack", tmp_path) == tuple(gpu_run.METHODS["minihack"])
    for name in gpu_run.METHODS["babyai"]:
        if name not in ("msfa", "usfa_learned"):
            run("paper_protocol", name, 5_000_960)
    (tmp_path / "babyai" / "paper_protocol" / "usfa_learned" / "eval.csv").write_text("step,seed\n5000960,1\n")
    assert gpu_run.default_order("babyai", tmp_path) == ()  # every method done


def test_gpu_run_says_when_every_method_has_its_full_run(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(gpu_run, "default_order", lambda env: ())
    with pytest.raises(SystemExit):
        gpu_run.main(gpu_run.Args(540, str(tmp_path / "out")))
    assert "every babyai method has a full-protocol run" in capsys.readouterr().err


@pytest.mark.parametrize("env", list(gpu_run.METHODS))
def test_every_gpu_run_command_is_valid_for_its_script(env):
    """Each method's script accepts its flags and its checks pass them (what a lent GPU would otherwise find out)."""
    import importlib

    import tyro

    for name, command in gpu_run.METHODS[env].items():
        script, *flags = command.split()
        module = importlib.import_module(Path(script).stem)
        args = tyro.cli(module.Args, args=[*flags, "--num-seeds", "10", "--no-checkpoint", "--max-minutes", "1"])
        module.check_args(args)
        assert getattr(args, "env", env) == env, name
