"""The paper's protocol for one environment: every method in the paper's order (or --methods), each with --seeds
vmapped seeds at its script's defaults (the paper's settings), resumable, one method per device at a time. On a CPU
each seed trains in its own process instead, pinned to one core with XLA single-threaded, one per core at a time:
on a 2-core machine that trains 1.25x the env steps of one process using both cores, and vmapped seeds gain nothing
there (benchmarks/cpu_seeds.py, docs/scale.md); the seeds' runs (OUT_DIR/<method>/seed<k>/) are merged into
OUT_DIR/<method>/ when all are complete, so every tool reads it as one run of all its seeds.

    python -m results.protocol OUT_DIR --env babyai                   # the nine BabyAI methods, 10 seeds each
    python -m results.protocol OUT_DIR --env babyai --devices 0 1 2 3  # four GPUs: four methods at a time
    python -m results.protocol OUT_DIR --resume                        # continue where it stopped
    python -m results.protocol OUT_DIR --env minihack --max-minutes 120 --methods msfa usfa_learned

OUT_DIR/<method>/ is each method's own run directory (config.json, metrics.csv, eval.csv, checkpoint.eqx, the
per-seed parameter files, TensorBoard files); OUT_DIR/<method>.log its output, which the terminal also shows, each line
prefixed with the method. A method whose eval.csv reaches its protocol's last step is complete and is skipped; one
that stopped (Ctrl-C, --max-minutes, a crash) resumes from its checkpoint. Ctrl-C or SIGTERM stops every run cleanly
(each checkpoints first); `--resume OUT_DIR` then continues with the same settings (OUT_DIR/protocol.json).

At the end, results.analyze plays every method's saved agents where an analysis exists for the env (BabyAI: the
reward-prediction table, the cumulants' quality), into OUT_DIR/<method>/analysis/; OUT_DIR/summary.json records the
device and, per method, the env steps reached, the share of the protocol, the wall time and the exit status. Figures
and tables: `python -m results.plot OUT_DIR/<method>` and `python -m results.summarize OUT_DIR/*/`.

Memory: one method's runs hold --seeds replays (docs/scale.md gives the bytes per seed); for Fruitbot the seeds default
to as many as fit the device by each script's replay_bytes (at most 10: a replay of game states, 0.33-0.39 GiB per
seed, lets all 10 fit; one of frames, with --extra "--replay-frames", 33 GiB per seed, 1 on an 80 GB GPU).
"""

from __future__ import annotations

import dataclasses
import importlib
import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import threading
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
    "minihack": {  # USFA with hand-designed cumulants has no cumulants here (docs/protocol.md)
        "msfa": "msfa_minihack.py",
        "usfa_learned": "usfa.py --env minihack --learned-cumulants",
        "uvfa_farm": "uvfa.py --env minihack --farm",
        "msfa_entangled_psi": "msfa_minihack.py --entangled-psi",
        "msfa_entangled_phi": "msfa_minihack.py --entangled-phi",
        "msfa_entangled_both": "msfa_minihack.py --entangled-psi --entangled-phi",
        "uvfa": "uvfa.py --env minihack",
        "mvfa": "uvfa.py --env minihack --modular",
    },
}
SCALES = {
    "paper": {},
    # The miniature BabyAI: the paper's methods, losses, n-step, replay ratio, batch, optimiser, epsilon schedule and
    # GPI, in a smaller room with every network's widths divided by 4 and a budget at which MSFA and USFA with the
    # env's cumulants both reach 80% of the BFS oracle's train-task return and settle (docs/babyai.md: every setting
    # tried); replay capacity and target-network period scaled as the paper's are.
    "mini": {"babyai": {
        "all": "--grid-size 6 --objects-per-category 1 --episode-steps 50 --torso-channels 8 16 16 "
               "--total-timesteps 2560000 --replay-size 30000 --target-update-period 750 --eval-every 51200",
        "msfa": "--module-size 38 --projection-dim 4 --psi-hidden 32 --phi-hidden 64 64",
        "msfa_entangled_psi": "--module-size 38 --projection-dim 4 --psi-hidden 32 --phi-hidden 64 64",
        "msfa_entangled_phi": "--module-size 35 --projection-dim 4 --psi-hidden 32 --phi-hidden 64 64",
        "msfa_entangled_both": "--module-size 35 --projection-dim 4 --psi-hidden 32 --phi-hidden 64 64",
        "usfa_learned": "--lstm-size 128 --psi-hidden 32 --phi-hidden 64 64",
        "usfa": "--lstm-size 128 --psi-hidden 32",
        "uvfa_farm": "--module-size 38 --projection-dim 4 --q-hidden 32",
        "uvfa": "--lstm-size 128 --q-hidden 32",
        "mvfa": "--module-size 38 --projection-dim 4 --q-hidden 32",
    }},
}
"""--scale: flags added to every method's command ("all") and to each method's own (its networks' sizes), before
--extra; "paper" adds none (the scripts' defaults are the paper's settings)"""
HOST_ENVS = ("minihack",)
"""envs stepped by C++ on the host (NLE): their runs get --env-workers processes per seed's envs"""
ANALYSES = ("babyai",)
"""envs results.analyze plays (GotoAvoid)"""
FIT_SEEDS = ("fruitbot",)
"""envs whose replay may limit the seeds a device holds (Fruitbot's, where it keeps 64x64x3 frames)"""
PAPER_SEEDS = 10
REPLAY_SHARE = 0.7
"""share of a device's memory one method's replays may take (the rest: the learner's activations, parameters,
optimiser state, and the transient copy while a replay is allocated)"""


@dataclass
class Args:
    out_dir: tyro.conf.Positional[str]
    """the protocol's folder: one run directory per method, their logs, protocol.json and summary.json"""
    env: str | None = None
    """babyai, fruitbot or minihack (with --resume: the saved one)"""
    methods: tuple[str, ...] = ()
    """methods to run, in this order (default: every method of --env, in the paper's order)"""
    seeds: int | None = None
    """vmapped seeds per method (seeds 1..seeds); default 10, and with --env fruitbot on a GPU as many as fit (<= 10)"""
    devices: tuple[str, ...] = ()
    """GPUs to use, one method on each at a time (CUDA_VISIBLE_DEVICES of its run); on a CPU the cores to use, one
    seed's run pinned to each (default: one run at a time on whatever JAX sees; on a CPU every core)"""
    seeds_apart: bool | None = None
    """train each seed in its own single-threaded process, one per core, instead of vmapping a method's seeds in one
    process (default: on a CPU, where it trains the most seeds per hour: benchmarks/cpu_seeds.py, docs/scale.md)"""
    env_workers: int | None = None
    """MiniHack: worker processes stepping each seed's envs (default 8; with --resume: the saved number)"""
    scale: str | None = None
    """paper (the default: the scripts' defaults, the paper's settings), or mini: the miniature BabyAI, sized to be
    trained on a CPU (SCALES; docs/babyai.md, "The miniature BabyAI"); with --resume: the saved one"""
    extra: str = ""
    """flags added to every run's command line, after --scale's (e.g. "--core-backend pallas", tiny test settings)"""
    max_minutes: float | None = None
    """stop every run cleanly after this many minutes (each evaluates and checkpoints first); --resume continues"""
    resume: bool = False
    """continue the protocol in OUT_DIR with its saved settings (protocol.json)"""
    analysis_episodes: int = 40
    """greedy episodes per task and seed of results.analyze at the end (the paper's Table A: 40)"""


SAVED = ("env", "methods", "seeds", "env_workers", "scale", "extra", "seeds_apart")
"""the settings protocol.json keeps for --resume"""


def jobs(args: Args, name: str) -> list[tuple[str, int, int]]:
    """A method's runs: (job name, first seed, seeds): one with every seed vmapped, or with seeds_apart one per
    seed, in OUT_DIR/<method>/seed<k>/ (merged into OUT_DIR/<method>/ when all are complete)."""
    if not args.seeds_apart:
        return [(name, 1, args.seeds)]
    return [(f"{name}/seed{k}", k, 1) for k in range(1, args.seeds + 1)]


def run_flags(args: Args, name: str, seed: int = 1, seeds: int | None = None) -> list[str]:
    """The method's script and flags (its defaults are the paper's settings), plus the protocol's."""
    script, *flags = shlex.split(METHODS[args.env][name])
    if args.env in HOST_ENVS:
        flags += ["--env-workers", str(args.env_workers)]
    scale = SCALES[args.scale].get(args.env, {})
    flags += shlex.split(scale.get("all", "")) + shlex.split(scale.get(name, ""))
    return [str(ROOT / script), *flags, "--seed", str(seed), "--num-seeds", str(seeds or args.seeds),
            *shlex.split(args.extra)]


def progress(run_dir: Path) -> tuple[int, int | None]:
    """(env steps per seed reached: the last metrics row, the protocol's total: config.json)."""
    steps = 0
    metrics = run_dir / "metrics.csv"
    if metrics.exists():
        lines = metrics.read_text().splitlines()
        steps = int(lines[-1].split(",")[0]) if len(lines) > 1 else 0
    config = run_dir / "config.json"
    total = json.loads(config.read_text()).get("args", {}).get("total_timesteps") if config.exists() else None
    return steps, total


def complete(run_dir: Path) -> bool:
    """The run evaluated at (or past: whole iterations) its protocol's last step."""
    _, total = progress(run_dir)
    evaluated = run_dir / "eval.csv"
    steps = [int(line.split(",")[0]) for line in evaluated.read_text().splitlines()[1:]] if evaluated.exists() else []
    return bool(total and steps and max(steps) >= total)


def command_for(args: Args, job: tuple[str, int, int], deadline: float | None) -> list[str]:
    """The run's command: a new run, or --resume (from its checkpoint; a run stopped before its first checkpoint
    starts over with its saved settings); a folder with run files but no settings is started anew (--overwrite moves
    it aside)."""
    name, seed, seeds = job
    run_dir = Path(args.out_dir) / name
    command = [sys.executable, *run_flags(args, name.split("/")[0], seed, seeds), "--run-dir", str(run_dir)]
    if (run_dir / "checkpoint.eqx").exists() or (run_dir / "config.json").exists():
        command.append("--resume")
    elif run_dir.exists() and any(run_dir.iterdir()):
        command.append("--overwrite")
    if deadline is not None:
        command += ["--max-minutes", f"{max(deadline - time.time(), 1.0) / 60:.2f}"]
    return command


SINGLE_THREADED = "--xla_cpu_multi_thread_eigen=false"
"""XLA_FLAGS of a seed's run pinned to one core (XLA:CPU's ops stay on its thread)"""


def merge_seeds(args: Args, name: str) -> bool:
    """With seeds_apart: once every seed's run of a method is complete, OUT_DIR/<method>/ gets them as one run of
    all its seeds (the first seed's config.json with num_seeds set; every seed's metrics.csv and eval.csv rows; their
    parameter files, hard-linked), so that the results tools read it as they read a run of vmapped seeds. Returns
    whether the method is complete."""
    out = Path(args.out_dir) / name
    seed_dirs = [Path(args.out_dir) / job for job, _, _ in jobs(args, name)]
    if complete(out) or not all(complete(d) for d in seed_dirs):
        return complete(out)
    for table in ("metrics.csv", "eval.csv"):  # rows by (step, seed), as a vmapped run writes them
        parts = [(d / table).read_text().splitlines() for d in seed_dirs]
        rows = sorted((r for p in parts for r in p[1:]), key=lambda r: tuple(int(x) for x in r.split(",")[:2]))
        (out / table).write_text("\n".join([parts[0][0], *rows]) + "\n")
    for d in seed_dirs:
        for params in d.glob("params_seed*.eqx"):
            (out / params.name).unlink(missing_ok=True)
            os.link(params, out / params.name)
    config = json.loads((seed_dirs[0] / "config.json").read_text())
    config["args"] |= {"seed": 1, "num_seeds": args.seeds, "run_dir": str(out)}
    config["seeds_trained_apart"] = [str(d.relative_to(out)) for d in seed_dirs]
    (out / "config.json").write_text(json.dumps(config, indent=2))  # last: complete() reads it
    return True


def method_progress(args: Args, name: str) -> tuple[int, int | None]:
    """(env steps per seed every seed reached, the protocol's total) of a method."""
    if not args.seeds_apart or complete(Path(args.out_dir) / name):
        return progress(Path(args.out_dir) / name)
    reached = [progress(Path(args.out_dir) / job) for job, _, _ in jobs(args, name)]
    return min(r[0] for r in reached), next((r[1] for r in reached if r[1]), None)


class Run:
    """One run's process, its output copied to the terminal (prefixed) and to OUT_DIR/<job>.log. device: a GPU
    (CUDA_VISIBLE_DEVICES), or with cpu_core a core the process is pinned to, single-threaded."""

    def __init__(self, name: str, command: list[str], device: str | None, out: Path, cpu_core: bool = False):
        env = dict(os.environ, PYTHONUNBUFFERED="1")
        if device is not None and cpu_core:
            env["XLA_FLAGS"] = (env.get("XLA_FLAGS", "") + " " + SINGLE_THREADED).strip()
            if shutil.which("taskset"):  # util-linux: the run's process and its threads on that core only
                command = ["taskset", "--cpu-list", device, *command]
        elif device is not None:
            env["CUDA_VISIBLE_DEVICES"] = device
        env.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")  # runs (and the analysis) may share a device
        self.name, self.device, self.started = name, device, time.time()
        where = f" on {'core' if cpu_core else 'device'} {device}" if device is not None else ""
        print(f"[protocol] {time.strftime('%H:%M:%S')} {name}{where}: {shlex.join(command)}", flush=True)
        self.log = (out / f"{name.replace('/', '.')}.log").open("a")
        self.process = subprocess.Popen(command, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                        text=True, start_new_session=True)  # Ctrl-C reaches it through us, once
        self.copier = threading.Thread(target=self._copy, daemon=True)
        self.copier.start()

    def _copy(self):
        for line in self.process.stdout:
            self.log.write(line)
            self.log.flush()
            print(f"[{self.name}] {line}", end="", flush=True)

    def finished(self) -> bool:
        if self.process.poll() is None:
            return False
        self.copier.join()
        self.log.close()
        return True


def analyze(args: Args, names: list[str]) -> dict[str, str]:
    """results.analyze of each method's saved agents into OUT_DIR/<method>/analysis/ (where the env has one)."""
    outcome = {}
    for name in names:
        run_dir = Path(args.out_dir) / name
        if args.env not in ANALYSES:
            outcome[name] = f"none for {args.env}"
            continue
        if not list(run_dir.glob("params_seed*.eqx")):
            outcome[name] = "no saved agents"
            continue
        command = [sys.executable, "-m", "results.analyze", str(run_dir), "--out", str(run_dir / "analysis"),
                   "--episodes", str(args.analysis_episodes)]
        print(f"[protocol] {time.strftime('%H:%M:%S')} analyse {name}: {shlex.join(command)}", flush=True)
        with (Path(args.out_dir) / f"{name}.analysis.log").open("w") as log:
            done = subprocess.run(command, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT)
        outcome[name] = "ok" if done.returncode == 0 else f"failed (exit {done.returncode}: {name}.analysis.log)"
    return outcome


# ------------------------------------------------------------------------------------------------- seeds that fit
def device_memory_limit() -> int | None:
    """Bytes the accelerator lets a process allocate (None on a CPU, or where the device does not say)."""
    import jax

    if jax.default_backend() == "cpu":
        return None
    return (jax.devices()[0].memory_stats() or {}).get("bytes_limit")


def choose_seeds(requested: int | None, replay_bytes_per_seed: int | None, bytes_limit: int | None) -> int:
    """--seeds, or PAPER_SEEDS, or as many as fit where the replay and the device's memory are known; a count that
    cannot fit is refused with one line saying what fits."""
    if replay_bytes_per_seed is None or bytes_limit is None:
        return PAPER_SEEDS if requested is None else requested
    fit = int(REPLAY_SHARE * bytes_limit) // replay_bytes_per_seed
    gib = f"{replay_bytes_per_seed / 2**30:.1f} GiB of replay per seed"
    room = f"{REPLAY_SHARE:.0%} of the device's {bytes_limit / 2**30:.1f} GiB"
    require(fit > 0, f"not even one seed fits: {gib} is more than {room}; lower --replay-size (--extra)")
    require(requested is None or requested <= fit, f"--seeds {requested} does not fit: {gib} allows at most {fit} "
                                                   f"seed(s) in {room}")
    return min(PAPER_SEEDS, fit) if requested is None else requested


def replay_bytes_per_seed(args: Args) -> int:
    """The largest replay per seed among the methods, from each script's own replay_bytes at its flags + --extra."""
    sizes = []
    for name in args.methods:
        script, *flags = shlex.split(METHODS[args.env][name])
        module = importlib.import_module(Path(script).stem)
        sizes.append(module.replay_bytes(tyro.cli(module.Args, args=run_flags(args, name, seeds=1)[1:])))
    return max(sizes)


# ------------------------------------------------------------------------------------------------------- settings
def resolve(args: Args) -> Args:
    """The settings: the saved ones with --resume, else the command line's with the env's defaults; checked."""
    out = Path(args.out_dir)
    saved_file = out / "protocol.json"
    if args.resume:
        require(saved_file.exists(), f"--resume: {saved_file} does not exist; start the protocol there first "
                                     "(without --resume, with --env)")
        saved = {"seeds_apart": False, "scale": "paper"} | json.loads(saved_file.read_text())  # (older ones lack these)
        given = {k: getattr(args, k) for k in SAVED if getattr(args, k) not in (None, (), "")}
        differs = {k: v for k, v in given.items() if (tuple(v) if isinstance(v, list) else v) !=
                   (tuple(saved[k]) if isinstance(saved[k], list) else saved[k])}
        require(not differs, f"--resume keeps the protocol's settings ({saved_file}); these differ: "
                             f"{', '.join(f'--{k.replace(chr(95), chr(45))}' for k in differs)}")
        return dataclasses.replace(args, **{k: tuple(v) if isinstance(v, list) else v for k, v in saved.items()})
    require(args.env in METHODS, f"--env must be one of {', '.join(METHODS)}, got {args.env}")
    args = dataclasses.replace(args, scale=args.scale or "paper", env_workers=8 if args.env_workers is None else args.env_workers)
    require(args.scale in SCALES, f"--scale must be one of {', '.join(SCALES)}, got {args.scale!r}")
    require(args.scale == "paper" or args.env in SCALES[args.scale],
            f"--scale {args.scale} exists for {', '.join(SCALES[args.scale])} only, not --env {args.env}")
    require(not (saved_file.exists() or (out.exists() and any(out.iterdir()))),
            f"{out} already holds a protocol or other files; continue it with --resume, or pass a new OUT_DIR")
    known = METHODS[args.env]
    unknown = [m for m in args.methods if m not in known]
    require(not unknown, f"unknown methods {unknown} for --env {args.env}; choose from {', '.join(known)}")
    require(args.seeds is None or args.seeds > 0, f"--seeds must be positive, got {args.seeds}")
    require(args.env_workers > 0 and args.analysis_episodes > 0,
            "--env-workers and --analysis-episodes must be positive")
    require(len(set(args.devices)) == len(args.devices), f"--devices repeats a device: {' '.join(args.devices)}")
    args = dataclasses.replace(args, methods=args.methods or tuple(known))
    if args.seeds_apart is None:
        import jax

        args = dataclasses.replace(args, seeds_apart=jax.default_backend() == "cpu")
    limit = device_memory_limit() if args.env in FIT_SEEDS else None
    per_seed = replay_bytes_per_seed(args) if limit is not None else None
    return dataclasses.replace(args, seeds=choose_seeds(args.seeds, per_seed, limit))


def device_name() -> str:
    import jax

    devices = jax.devices()
    return f"{len(devices)} x {devices[0].device_kind} ({jax.default_backend()}), jax {jax.__version__}"


@exit_on_config_error
def main(args: Args) -> None:
    require(args.max_minutes is None or args.max_minutes > 0, f"--max-minutes must be positive, got {args.max_minutes}")
    os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")  # this process only reads the devices
    args = resolve(args)
    out = Path(args.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / "protocol.json").write_text(json.dumps({k: getattr(args, k) for k in SAVED}, indent=1))
    start = time.time()
    deadline = None if args.max_minutes is None else start + 60 * args.max_minutes
    device = device_name()
    done = [m for m in args.methods if complete(out / m) or (args.seeds_apart and merge_seeds(args, m))]
    queue = [job for m in args.methods if m not in done for job in jobs(args, m) if not complete(out / job[0])]
    slots = list(args.devices) or ([str(c) for c in sorted(os.sched_getaffinity(0))] if args.seeds_apart else [None])
    how = f"each seed apart, {len(slots)} at a time (one per core)" if args.seeds_apart else f"{len(slots)} at a time"
    print(f"[protocol] {device}; {args.env}; {args.seeds} seeds per method, {how}; "
          f"complete: {', '.join(done) or 'none'}"
          f"; to run: {', '.join(dict.fromkeys(j[0].split('/')[0] for j in queue)) or 'none'}", flush=True)

    stop = []

    def on_signal(signum, frame):  # every run checkpoints and stops (the scripts handle SIGTERM); no new ones start
        stop.append(signum)
        for run in running.values():
            if run.process.poll() is None:
                run.process.send_signal(signal.SIGTERM)

    running: dict[str, Run] = {}
    results: dict[str, dict] = {}
    previous = {signum: signal.signal(signum, on_signal) for signum in (signal.SIGINT, signal.SIGTERM)}
    try:
        while queue or running:
            for name, run in list(running.items()):
                if run.finished():
                    results[name] = {"exit_status": run.process.returncode,
                                     "wall_seconds": round(time.time() - run.started, 1)}
                    slots.append(run.device)
                    del running[name]
                    if args.seeds_apart:
                        merge_seeds(args, name.split("/")[0])
            out_of_time = deadline is not None and time.time() > deadline - min(30.0, 0.25 * 60 * args.max_minutes)
            while queue and slots and not stop and not out_of_time:
                job = queue.pop(0)
                running[job[0]] = Run(job[0], command_for(args, job, deadline), slots.pop(0), out,
                                      cpu_core=bool(args.seeds_apart))
            if not running and (stop or out_of_time or not queue):
                break
            time.sleep(0.5)
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)

    analysis = analyze(args, [m for m in args.methods if (out / m).exists()]) if not stop else {}
    summary = {"device": device, "env": args.env, "scale": args.scale, "seeds": args.seeds,
               "seeds_apart": args.seeds_apart,
               "extra": args.extra,
               "devices": list(args.devices), "wall_seconds": round(time.time() - start, 1), "methods": {}}
    for name in args.methods:
        steps, total = method_progress(args, name)
        script, *flags = run_flags(args, name)
        entry = {"command": shlex.join([str(Path(script).relative_to(ROOT)), *flags]), "env_steps_per_seed": steps,
                 "total_timesteps": total,
                 "share_of_protocol": round(steps / total, 4) if total else 0.0,
                 "complete": complete(out / name), **results.get(name, {})}
        if args.seeds_apart:
            entry["seed_runs"] = {job: results[job] for job, _, _ in jobs(args, name) if job in results}
        if name in analysis:
            entry["analysis"] = analysis[name]
        if any(job[0].split("/")[0] == name for job in queue):
            entry["status"] = "not started"
        summary["methods"][name] = entry
    (out / "summary.json").write_text(json.dumps(summary, indent=1))
    for name, entry in summary["methods"].items():
        print(f"[protocol] {name}: {entry['env_steps_per_seed']:,} env steps per seed ({entry['share_of_protocol']:.0%}"
              f" of the protocol){', exit ' + str(entry['exit_status']) if 'exit_status' in entry else ''}",
              flush=True)
    unfinished = [m for m, e in summary["methods"].items() if not e["complete"]]
    if unfinished:
        print(f"[protocol] not complete: {', '.join(unfinished)}; continue with: python -m results.protocol "
              f"{shlex.quote(str(out))} --resume", flush=True)
    if stop:
        raise SystemExit(128 + stop[0])
    if any(e.get("exit_status") not in (None, 0) for e in summary["methods"].values()):
        raise SystemExit(1)


if __name__ == "__main__":
    main(tyro.cli(Args))
