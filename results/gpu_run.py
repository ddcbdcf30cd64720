"""The paper's protocol on a lent GPU, BabyAI, Fruitbot or MiniHack, inside one command's time budget
(results/<env>/gpu_run.sh call this).

A lent GPU comes for ~15 minutes, at most 10 per command, and only 8 files of at most 16 MiB come back, so a run
must finish inside the command and bring back what analysis needs (eval.csv, metrics.csv, config.json, and the
small parameter files), never the replay-holding checkpoints. This driver trains the paper protocol (every script's
defaults: BabyAI 5M env steps, Fruitbot 10M, MiniHack 3M, at replay ratio 6) for --num-seeds vmapped seeds per
method, one method at a time by default (two runs on one GPU do not overlap: 72-75 min per BabyAI method side by side
against 39 alone, measured on an H200), in the order the paper's claims need them, skipping the methods whose
full-protocol run is already committed (results/<env>/paper_protocol/<method>/ with an evaluation at the protocol's
last step: no run resumes across lent GPUs, so the next method is the first one without). On a GPU, Fruitbot trains
as many seeds as fit its memory (seeds_that_fit). Each run stops itself by --max-minutes before the budget ends,
evaluates, and writes its parameters; a run that finishes early frees its slot for the next method. Then, in the
time kept back (--analysis-seconds), results.analyze plays the saved agents of every seed (Table A, the cumulants'
quality; only a few seeds' parameters can come back, so this runs here); figures need only eval.csv and
metrics.csv and are drawn where the files land. What share of the protocol each method reached is written to
summary.json and to each method's run_summary.json, with the device.

    python -m results.gpu_run BUDGET_SECONDS OUT_DIR [--env fruitbot|minihack] [--num-seeds 10] [--extra "..."]

OUT_DIR then holds at most 8 files: summary.json, results.tar.gz (every run's config.json, metrics.csv, eval.csv,
run_summary.json, log and analysis/) and up to six params_<method>[_<k>].tar.gz of at most 15 MiB, shared among the
methods that ran. Unpacked under results/<env>/paper_protocol/, a finished run is the full-protocol folder of its
method.
"""

from __future__ import annotations

import dataclasses
import importlib
import json
import os
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
METHODS = {  # per env, in the order the paper's claims need them: name -> script and flags
    "babyai": {
        "msfa": "msfa_babyai.py",
        "usfa_learned": "usfa.py --learned-cumulants",
        "usfa": "usfa.py",
        "uvfa_farm": "uvfa.py --farm",
        "msfa_entangled_psi": "msfa_babyai.py --entangled-psi",
        "msfa_entangled_phi": "msfa_babyai.py --entangled-phi",
        "msfa_entangled_both": "msfa_babyai.py --entangled-psi --entangled-phi",
        "uvfa": "uvfa.py",
        "mvfa": "uvfa.py --modular",
    },
    "fruitbot": {
        "msfa": "msfa_fruitbot.py",
        "usfa_learned": "usfa.py --env fruitbot --learned-cumulants",
        "usfa": "usfa.py --env fruitbot",
        "uvfa_farm": "uvfa.py --env fruitbot --farm",
        "msfa_entangled_psi": "msfa_fruitbot.py --entangled-psi",
        "msfa_entangled_phi": "msfa_fruitbot.py --entangled-phi",
        "msfa_entangled_both": "msfa_fruitbot.py --entangled-psi --entangled-phi",
        "uvfa": "uvfa.py --env fruitbot",
        "mvfa": "uvfa.py --env fruitbot --modular",
    },
    # USFA with hand-designed cumulants has no phi here (docs/protocol.md); each seed's 32 envs step in 8 worker
    # processes (the lent GPU machine has 16 cores; in one process they step one seed at a time on one core)
    "minihack": {
        "msfa": "msfa_minihack.py --env-workers 8",
        "usfa_learned": "usfa.py --env minihack --learned-cumulants --env-workers 8",
        "uvfa_farm": "uvfa.py --env minihack --farm --env-workers 8",
        "msfa_entangled_psi": "msfa_minihack.py --entangled-psi --env-workers 8",
        "msfa_entangled_phi": "msfa_minihack.py --entangled-phi --env-workers 8",
        "msfa_entangled_both": "msfa_minihack.py --entangled-psi --entangled-phi --env-workers 8",
        "uvfa": "uvfa.py --env minihack --env-workers 8",
        "mvfa": "uvfa.py --env minihack --modular --env-workers 8",
    },
}
CONCURRENCY = {"babyai": 1, "fruitbot": 1, "minihack": 1}
"""methods trained at once unless --concurrency says otherwise. BabyAI: two runs on one H200 did not overlap (72-75
min per method side by side against 39 alone, 2026-11-27), so one at a time finishes a method sooner and the
methods in order. Fruitbot: one replay of frames fills a GPU. MiniHack:
an SGD step of 10 vmapped seeds needs 42 GiB of scratch (4.2 GiB per seed, XLA's memory analysis; the Impala torso
on 8 x 41 crops and their final views), and two at once did not fit an H200 (2026-11-27: MSFA stopped with
RESOURCE_EXHAUSTED while USFA-learned ran beside it)"""
RESERVE_SECONDS = {"babyai": 60.0, "fruitbot": 120.0, "minihack": 180.0}
"""kept back at the end unless --reserve-seconds says otherwise. The host envs' final evaluation is slow: Fruitbot's
plays 200 lifetimes of up to 4,000 steps per seed; MiniHack's makes 80 fresh NLE envs per seed and GPI setting and
plays them to the end (~14 s per seed on this repository's 2-core CPU, so ~140 s for 10 seeds; a 60 s reserve saw
both runs killed mid-evaluation on the H200)"""
FIT_SEEDS = ("fruitbot",)
"""envs whose replay (64x64x3 frames: 33 GiB per seed at the paper's 70k sequences) limits the seeds a GPU holds"""
ANALYSIS_SECONDS = {"babyai": 60.0, "fruitbot": 0.0, "minihack": 0.0}
"""kept back at the end, on top of the reserve, for results.analyze of the saved agents (unless --analysis-seconds
says otherwise): Table A and the cumulants' quality need every seed's parameters, which cannot all come back. Only
BabyAI's analysis exists (results/analyze.py plays GotoAvoid)"""
PAPER_SEEDS = 10
REPLAY_SHARE = 0.7
"""share of the device's memory the replays of all concurrently running methods may take (the rest: activations,
parameters, optimiser state, and the transient copy while a replay is allocated)"""
MAX_FILE_BYTES = 15 * 2**20
PARAMS_ARCHIVES = 6


@dataclass
class Args:
    budget_seconds: tyro.conf.Positional[float]
    """wall time for everything, start-up and packing included"""
    out_dir: tyro.conf.Positional[str]
    """where the (at most 8, at most 16 MiB each) result files go"""
    env: str = "babyai"
    """babyai, fruitbot or minihack"""
    num_seeds: int | None = None
    """vmapped seeds per method (seeds 1..num_seeds); default 10, or with --env fruitbot on a GPU as many as fit (up to
    10): a count whose replays cannot fit is refused"""
    methods: tuple[str, ...] = ()
    """methods in the order to run them (default: the methods of --env whose full-protocol run is not committed under
    results/<env>/paper_protocol/, in the order the paper's claims need them)"""
    concurrency: int | None = None
    """methods trained at the same time on the one GPU (default 1)"""
    extra: str = ""
    """flags added to every run (tests use tiny settings here; the GPU run uses the paper's defaults)"""
    work_dir: str = "/tmp/msfa-gpu-runs"
    """where the run directories go (outside out_dir: they hold more files than can come back)"""
    reserve_seconds: float | None = None
    """kept back at the end for the runs' final evaluation and for packing (default 60 for babyai, 120 for fruitbot,
    180 for minihack)"""
    min_run_seconds: float = 90.0
    """a method is started only with at least this much time left (start-up and compilation take about a minute)"""
    analysis_seconds: float | None = None
    """kept back after the runs for results.analyze of their saved agents (default 60 for babyai; 0: no analysis)"""
    analysis_episodes: int = 40
    """greedy episodes per task and seed of that analysis (the paper's Table A: 40)"""
    env_benchmark_seconds: float | None = None
    """spent first on benchmarks/env_throughput.py for the env (default 90 for fruitbot: the JAX game at 32, 256
    and 4,096 envs against raw procgen; 0 elsewhere); its table goes into summary.json"""


def seeds_that_fit(replay_bytes_per_seed: int, concurrency: int, bytes_limit: int) -> int:
    """Seeds per method whose replays, for `concurrency` methods running at once, take at most REPLAY_SHARE of the
    device's memory."""
    return int(REPLAY_SHARE * bytes_limit) // (concurrency * replay_bytes_per_seed)


def choose_num_seeds(requested: int | None, replay_bytes_per_seed: int | None, concurrency: int,
                     bytes_limit: int | None) -> int:
    """--num-seeds, or PAPER_SEEDS, or as many as fit where the replay and the device's memory are known; a count
    that cannot fit is refused with one line saying what fits."""
    if replay_bytes_per_seed is None or bytes_limit is None:
        return PAPER_SEEDS if requested is None else requested
    fit = seeds_that_fit(replay_bytes_per_seed, concurrency, bytes_limit)
    gib = f"{replay_bytes_per_seed / 2**30:.1f} GiB of replay per seed x {concurrency} method(s) at once"
    room = f"{REPLAY_SHARE:.0%} of the device's {bytes_limit / 2**30:.1f} GiB"
    require(fit > 0, f"not even one seed fits: {gib} is more than {room}; lower --replay-size (--extra) or "
                     f"--concurrency")
    require(requested is None or requested <= fit,
            f"--num-seeds {requested} does not fit: {gib} allows at most {fit} seed(s) in {room}")
    return min(PAPER_SEEDS, fit) if requested is None else requested


def device_memory_limit() -> int | None:
    """Bytes the accelerator lets this process allocate (None on a CPU, or where the device does not say)."""
    import jax

    if jax.default_backend() == "cpu":
        return None
    return (jax.devices()[0].memory_stats() or {}).get("bytes_limit")


def replay_bytes_per_seed(methods: dict[str, str], names: list[str], extra: str) -> int:
    """The largest replay per seed among the methods, from each script's own replay_bytes at its flags + extra."""
    sizes = []
    for name in names:
        script, *flags = shlex.split(methods[name])
        module = importlib.import_module(Path(script).stem)
        sizes.append(module.replay_bytes(tyro.cli(module.Args, args=[*flags, *shlex.split(extra)])))
    return max(sizes)


def launch(name: str, args: Args, work: Path, minutes: float) -> subprocess.Popen:
    script, *flags = shlex.split(METHODS[args.env][name])
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


ENV_BENCHMARK_SECONDS = {"fruitbot": 90.0}


def env_benchmark(args: Args) -> str:
    """benchmarks/env_throughput.py's table for the env on this device (for Fruitbot: the JAX game, frames
    included, at 32, 256 and 4,096 envs against raw procgen), within --env-benchmark-seconds; "" when none."""
    seconds = args.env_benchmark_seconds
    if seconds is None:
        seconds = ENV_BENCHMARK_SECONDS.get(args.env, 0.0)
    if seconds <= 0:
        return ""
    command = [sys.executable, "-m", "benchmarks.env_throughput", "--env", args.env, "--batch-sizes", "32", "256",
               "4096", "--repeats", "3", "--no-training-share"]
    try:
        done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=seconds)
        text = done.stdout + (f"\n(exit {done.returncode}: {done.stderr.strip().splitlines()[-1:]})"
                              if done.returncode else "")
    except subprocess.TimeoutExpired as timeout:
        text = (timeout.stdout.decode() if isinstance(timeout.stdout, bytes) else timeout.stdout or "") + \
            f"\n(stopped after {seconds:.0f} s)"
    print(f"[gpu_run] env throughput:\n{text}", flush=True)
    return text


def pack(work: Path, out: Path, started: list[str], summary: dict) -> None:
    """results.tar.gz with every run's small files; and the parameter files, in archives of at most 15 MiB, the six
    archive slots (8 files at most: summary, results and six) shared among the methods that wrote any, in order:
    params_<method>.tar.gz, params_<method>_2.tar.gz, ... (a method's seeds in order; the seeds packed are noted in
    summary). One MSFA seed is 8.7 MB, so one archive holds one seed: two methods bring back three seeds each."""
    with tarfile.open(out / "results.tar.gz", "w:gz") as tar:
        for name in started:
            for f in ("config.json", "metrics.csv", "eval.csv", "run_summary.json", "analysis"):
                if (work / name / f).exists():
                    tar.add(work / name / f, arcname=f"{name}/{f}")
            tar.add(work / f"{name}.log", arcname=f"{name}/train.log")
            if (work / f"{name}.analysis.log").exists():
                tar.add(work / f"{name}.analysis.log", arcname=f"{name}/analysis.log")
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


def full_protocol_methods(env: str, results: Path = ROOT / "results") -> set[str]:
    """Methods whose full-protocol run is committed: results/<env>/paper_protocol/<method>/ whose eval.csv has an
    evaluation at the protocol's last step (config.json's total_timesteps). Partial runs of earlier leases (the
    paper_protocol_<device>/ folders) do not count: no run resumes across lent GPUs."""
    done = set()
    for config in (results / env / "paper_protocol").glob("*/config.json"):
        total = json.loads(config.read_text()).get("args", {}).get("total_timesteps")
        evaluated = config.parent / "eval.csv"
        steps = [int(line.split(",")[0]) for line in evaluated.read_text().splitlines()[1:]] \
            if evaluated.exists() else []
        if total and steps and max(steps) >= total:
            done.add(config.parent.name)
    return done


def default_order(env: str, results: Path = ROOT / "results") -> tuple[str, ...]:
    """The methods of env without a committed full-protocol run, in the order the paper's claims need them."""
    done = full_protocol_methods(env, results)
    return tuple(m for m in METHODS[env] if m not in done)


def analyze(work: Path, names: list[str], deadline: float, episodes: int) -> dict[str, str]:
    """results.analyze of each run's saved agents into <run>/analysis/, in order, while time is left before the
    deadline; returns each method's outcome (for summary.json)."""
    outcome = {}
    for name in names:
        left = deadline - time.time()
        if not list((work / name).glob("params_seed*.eqx")):
            outcome[name] = "no saved agents"
            continue
        if left < 20:
            outcome[name] = "not run: out of time"
            continue
        command = [sys.executable, "-m", "results.analyze", str(work / name), "--out", str(work / name / "analysis"),
                   "--episodes", str(episodes)]
        print(f"[gpu_run] {time.strftime('%H:%M:%S')} analyse {name} (at most {left:.0f} s)", flush=True)
        try:
            with (work / f"{name}.analysis.log").open("w") as log:
                done = subprocess.run(command, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, timeout=left)
            outcome[name] = "ok" if done.returncode == 0 else f"failed (exit {done.returncode})"
        except subprocess.TimeoutExpired:
            outcome[name] = f"timed out after {left:.0f} s"
    return outcome


def resolve(args: Args) -> tuple[Args, dict]:
    """args with --env's defaults filled in (methods, concurrency, reserve, seeds), checked; and what the seed count
    was decided from (for summary.json). Imports jax (the device's memory decides Fruitbot's seeds)."""
    require(args.env in METHODS, f"unknown --env {args.env!r}; choose from {', '.join(METHODS)}")
    methods = args.methods or default_order(args.env)
    require(methods, f"every {args.env} method has a full-protocol run under results/{args.env}/paper_protocol/; "
                     f"pass --methods to run one again")
    args = dataclasses.replace(
        args, methods=methods,
        concurrency=CONCURRENCY[args.env] if args.concurrency is None else args.concurrency,
        reserve_seconds=RESERVE_SECONDS[args.env] if args.reserve_seconds is None else args.reserve_seconds,
        analysis_seconds=ANALYSIS_SECONDS[args.env] if args.analysis_seconds is None else args.analysis_seconds)
    kept = args.reserve_seconds + args.analysis_seconds
    require(args.budget_seconds > kept + args.min_run_seconds,
            f"the budget must exceed --reserve-seconds + --analysis-seconds + --min-run-seconds "
            f"({kept + args.min_run_seconds:.0f} s), got {args.budget_seconds:.0f}")
    require(args.analysis_seconds >= 0 and args.analysis_episodes > 0,
            "--analysis-seconds must be non-negative and --analysis-episodes positive")
    known = METHODS[args.env]
    unknown = [m for m in args.methods if m not in known]
    require(not unknown, f"unknown methods {unknown} for --env {args.env}; choose from {', '.join(known)}")
    require((args.num_seeds is None or args.num_seeds > 0) and args.concurrency > 0,
            "--num-seeds and --concurrency must be positive")
    limit = device_memory_limit() if args.env in FIT_SEEDS else None
    per_seed = replay_bytes_per_seed(known, list(args.methods), args.extra) if limit is not None else None
    args = dataclasses.replace(args, num_seeds=choose_num_seeds(args.num_seeds, per_seed, args.concurrency, limit))
    memory = {} if limit is None else {"device_bytes_limit": limit, "replay_bytes_per_seed": per_seed}
    return args, memory


@exit_on_config_error
def main(args: Args) -> None:
    start = time.time()
    args, memory = resolve(args)
    out, work = Path(args.out_dir), Path(args.work_dir)
    out.mkdir(parents=True, exist_ok=True)
    require(not any(out.iterdir()), f"{out} is not empty; pass an empty or new OUT_DIR")
    work.mkdir(parents=True, exist_ok=True)
    deadline = start + args.budget_seconds - args.reserve_seconds - args.analysis_seconds  # for training
    env_throughput = env_benchmark(args)

    import jax

    device = f"{jax.devices()[0].device_kind} ({jax.default_backend()}), jax {jax.__version__}"
    fitted = (f" (replay {memory['replay_bytes_per_seed'] / 2**30:.1f} GiB per seed; the device allows "
              f"{memory['device_bytes_limit'] / 2**30:.1f} GiB)" if memory else "")
    print(f"[gpu_run] {device}; {args.env}; budget {args.budget_seconds:.0f} s; {args.num_seeds} seeds per method"
          f"{fitted}, {args.concurrency} method(s) at a time; order: {', '.join(args.methods)}", flush=True)
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
            summary[name] = {"command": METHODS[args.env][name], "_start": time.time()}
        if not running and (not queue or left < args.min_run_seconds):
            break
        now = time.time()
        if now > start + args.budget_seconds - 15 and not stopping:  # the runs overran their own limit
            stopping = True
            for process in running.values():
                process.terminate()
        if now > start + args.budget_seconds - 5:  # and did not stop: what they wrote is packed inside the budget
            for process in running.values():
                process.kill()
        time.sleep(1.0)

    for name in started:
        config = json.loads((work / name / "config.json").read_text()) if (work / name / "config.json").exists() else {}
        total = config.get("args", {}).get("total_timesteps")
        steps = last_step(work / name)
        summary[name].update({"steps_per_seed": steps, "total_timesteps": total,
                              "share_of_protocol": round(steps / total, 4) if total else None})
        summary[name].pop("_start", None)
    if args.analysis_seconds > 0:
        outcome = analyze(work, started, start + args.budget_seconds - args.reserve_seconds, args.analysis_episodes)
        for name in started:
            summary[name]["analysis"] = outcome[name]
    settings = {"device": device, "env": args.env, "budget_seconds": args.budget_seconds,
                "num_seeds": args.num_seeds, "concurrency": args.concurrency, **memory, "extra_flags": args.extra,
                "xla_flags": os.environ.get("XLA_FLAGS", ""), "env_throughput": env_throughput}
    for name in started:  # each method's folder names its device and how far it got
        (work / name).mkdir(parents=True, exist_ok=True)
        (work / name / "run_summary.json").write_text(json.dumps({"method": name, **settings, **summary[name]},
                                                                 indent=2))
    pack(work, out, started, summary)
    summary = {**settings, "not_started": queue, **summary}
    (out / "summary.json").write_text(json.dumps(summary, indent=2))
    for name in started:
        print(f"[gpu_run] {name}: {summary[name]['steps_per_seed']:,} steps per seed "
              f"({summary[name]['share_of_protocol']} of the protocol), exit {summary[name].get('exit_status')}")
    print(f"[gpu_run] done in {time.time() - start:.0f} s; files in {out}: "
          f"{', '.join(sorted(p.name for p in out.iterdir()))}", flush=True)


if __name__ == "__main__":
    main(tyro.cli(Args))
