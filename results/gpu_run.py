"""The paper's BabyAI protocol on a lent GPU, inside one command's time budget (results/babyai/gpu_run.sh calls this).

A lent GPU comes for ~15 minutes, at most 10 per command, and only 8 files of at most 16 MiB come back, so a run
must finish inside the command and bring back what analysis needs (eval.csv, metrics.csv, config.json, and the
small parameter files), never the replay-holding checkpoints. This driver trains the paper protocol (every script's
defaults: 5M env steps at replay ratio 6) for --num-seeds vmapped seeds per method, in the order the paper's claims
need most, --concurrency methods at a time on the one GPU (an SGD step is latency-bound, so two processes overlap
well). Each run stops itself by --max-minutes before the budget ends, evaluates, and writes its parameters; a run
that finishes early frees its slot for the next method. What share of the protocol each method reached is written
to summary.json.

    python -m results.gpu_run BUDGET_SECONDS OUT_DIR [--num-seeds 10] [--extra "--num-envs 4 ..."]

OUT_DIR then holds at most 8 files: summary.json, results.tar.gz (every run's config.json, metrics.csv, eval.csv
and log) and up to six params_<method>[_<k>].tar.gz of at most 15 MiB, shared among the methods that ran.
"""

from __future__ import annotations

import json
import shlex
import subprocess
import sys
import tarfile
import time
from dataclasses import dataclass
from pathlib import Path

import tyro

from common.run import exit_on_config_error, require

ROOT = Path(__file__).resolve().parent.parent
METHODS = {  # in the order the paper's claims need them: name -> script and flags
    "msfa": "msfa_babyai.py",
    "usfa_learned": "usfa.py --learned-cumulants",
    "usfa": "usfa.py",
    "uvfa_farm": "uvfa.py --farm",
    "msfa_entangled_psi": "msfa_babyai.py --entangled-psi",
    "msfa_entangled_phi": "msfa_babyai.py --entangled-phi",
    "msfa_entangled_both": "msfa_babyai.py --entangled-psi --entangled-phi",
    "uvfa": "uvfa.py",
    "mvfa": "uvfa.py --modular",
}
MAX_FILE_BYTES = 15 * 2**20
PARAMS_ARCHIVES = 6


@dataclass
class Args:
    budget_seconds: tyro.conf.Positional[float]
    """wall time for everything, start-up and packing included"""
    out_dir: tyro.conf.Positional[str]
    """where the (at most 8, at most 16 MiB each) result files go"""
    num_seeds: int = 10
    """vmapped seeds per method (seeds 1..num_seeds)"""
    methods: tuple[str, ...] = tuple(METHODS)
    """methods in the order to run them"""
    concurrency: int = 2
    """methods trained at the same time on the one GPU"""
    extra: str = ""
    """flags added to every run (tests use tiny settings here; the GPU run uses the paper's defaults)"""
    work_dir: str = "/tmp/msfa-gpu-runs"
    """where the run directories go (outside out_dir: they hold more files than can come back)"""
    reserve_seconds: float = 60.0
    """kept back at the end for the runs' final evaluation and for packing"""
    min_run_seconds: float = 90.0
    """a method is started only with at least this much time left (start-up and compilation take about a minute)"""


def launch(name: str, args: Args, work: Path, minutes: float) -> subprocess.Popen:
    script, *flags = shlex.split(METHODS[name])
    command = [sys.executable, str(ROOT / script), *flags, "--seed", "1", "--num-seeds", str(args.num_seeds),
               "--run-dir", str(work / name), "--max-minutes", f"{minutes:.2f}", "--no-checkpoint",
               *shlex.split(args.extra)]
    print(f"[gpu_run] {time.strftime('%H:%M:%S')} start {name} for at most {minutes:.1f} min: {' '.join(command)}",
          flush=True)
    log = (work / f"{name}.log").open("w")
    return subprocess.Popen(command, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT)


def last_step(run_dir: Path) -> int:
    metrics = run_dir / "metrics.csv"
    if not metrics.exists():
        return 0
    lines = metrics.read_text().splitlines()
    return int(lines[-1].split(",")[0]) if len(lines) > 1 else 0


def pack(work: Path, out: Path, started: list[str], summary: dict) -> None:
    """results.tar.gz with every run's small files; and the parameter files, in archives of at most 15 MiB, the six
    archive slots (8 files at most: summary, results and six) shared among the methods that wrote any, in order:
    params_<method>.tar.gz, params_<method>_2.tar.gz, ... (a method's seeds in order; the seeds packed are noted in
    summary). One MSFA seed is 8.7 MB, so one archive holds one seed: two methods bring back three seeds each."""
    with tarfile.open(out / "results.tar.gz", "w:gz") as tar:
        for name in started:
            for f in ("config.json", "metrics.csv", "eval.csv"):
                if (work / name / f).exists():
                    tar.add(work / name / f, arcname=f"{name}/{f}")
            tar.add(work / f"{name}.log", arcname=f"{name}/train.log")
    params = {name: sorted((work / name).glob("params_seed*.eqx"), key=lambda p: int(p.stem.split("seed")[1]))
              for name in started}
    with_params = [name for name in started if params[name]]
    for i, name in enumerate(with_params):
        slots = PARAMS_ARCHIVES // len(with_params) + (i < PARAMS_ARCHIVES % len(with_params))
        groups, size = [[]], 0
        for f in params[name]:
            if f.stat().st_size > MAX_FILE_BYTES:
                break
            if size + f.stat().st_size > MAX_FILE_BYTES:
                groups.append([])
                size = 0
            groups[-1].append(f)
            size += f.stat().st_size
        groups = [g for g in groups if g][:slots]
        for k, group in enumerate(groups):
            with tarfile.open(out / f"params_{name}{'' if k == 0 else f'_{k + 1}'}.tar.gz", "w:gz") as tar:
                for f in group:
                    tar.add(f, arcname=f"{name}/{f.name}")
        summary[name]["params_seeds"] = [int(f.stem.split("seed")[1]) for g in groups for f in g]
    for name in started:
        summary[name].setdefault("params_seeds", [])


@exit_on_config_error
def main(args: Args) -> None:
    start = time.time()
    require(args.budget_seconds > args.reserve_seconds + args.min_run_seconds,
            f"the budget must exceed --reserve-seconds + --min-run-seconds "
            f"({args.reserve_seconds + args.min_run_seconds:.0f} s), got {args.budget_seconds:.0f}")
    unknown = [m for m in args.methods if m not in METHODS]
    require(not unknown, f"unknown methods {unknown}; choose from {', '.join(METHODS)}")
    require(args.num_seeds > 0 and args.concurrency > 0, "--num-seeds and --concurrency must be positive")
    out, work = Path(args.out_dir), Path(args.work_dir)
    out.mkdir(parents=True, exist_ok=True)
    require(not any(out.iterdir()), f"{out} is not empty; pass an empty or new OUT_DIR")
    work.mkdir(parents=True, exist_ok=True)
    deadline = start + args.budget_seconds - args.reserve_seconds

    import jax

    device = f"{jax.devices()[0].device_kind} ({jax.default_backend()}), jax {jax.__version__}"
    print(f"[gpu_run] {device}; budget {args.budget_seconds:.0f} s; {args.num_seeds} seeds per method", flush=True)
    queue, running, started = list(args.methods), {}, []
    summary, stopping = {}, False
    while queue or running:
        for name, process in list(running.items()):
            if process.poll() is not None:
                summary[name]["exit_status"] = process.returncode
                summary[name]["wall_seconds"] = round(time.time() - summary[name].pop("_start"), 1)
                del running[name]
        left = deadline - time.time()
        while queue and len(running) < args.concurrency and left >= args.min_run_seconds:
            name = queue.pop(0)
            running[name] = launch(name, args, work, left / 60)
            started.append(name)
            summary[name] = {"command": METHODS[name], "_start": time.time()}
        if not running and (not queue or left < args.min_run_seconds):
            break
        if time.time() > start + args.budget_seconds - 15 and not stopping:  # the runs overran their own limit
            stopping = True
            for process in running.values():
                process.terminate()
        time.sleep(1.0)

    for name in started:
        config = json.loads((work / name / "config.json").read_text()) if (work / name / "config.json").exists() else {}
        total = config.get("args", {}).get("total_timesteps")
        steps = last_step(work / name)
        summary[name].update({"steps_per_seed": steps, "total_timesteps": total,
                              "share_of_protocol": round(steps / total, 4) if total else None})
        summary[name].pop("_start", None)
    pack(work, out, started, summary)
    summary = {"device": device, "budget_seconds": args.budget_seconds, "num_seeds": args.num_seeds,
               "extra_flags": args.extra, "not_started": queue, **summary}
    (out / "summary.json").write_text(json.dumps(summary, indent=2))
    for name in started:
        print(f"[gpu_run] {name}: {summary[name]['steps_per_seed']:,} steps per seed "
              f"({summary[name]['share_of_protocol']} of the protocol), exit {summary[name].get('exit_status')}")
    print(f"[gpu_run] done in {time.time() - start:.0f} s; files in {out}: "
          f"{', '.join(sorted(p.name for p in out.iterdir()))}", flush=True)


if __name__ == "__main__":
    main(tyro.cli(Args))
