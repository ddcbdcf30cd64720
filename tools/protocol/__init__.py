"""The paper's protocol for one environment: every method in the paper's order (or --methods), each with --seeds
vmapped seeds at its script's defaults (the paper's settings), resumable, one method per device at a time. On a CPU
each seed trains in its own process instead, pinned to one core with XLA single-threaded, one per core at a time:
on a 2-core machine that trains 1.25x the env steps of one process using both cores, and vmapped seeds gain nothing
there (benchmarks/cpu_seeds.py, docs/scale.md); the seeds' runs (OUT_DIR/<method>/seed<k>/) are merged into
OUT_DIR/<method>/ when all are complete, so every tool reads it as one run of all its seeds.

    python -m tools.protocol OUT_DIR --env babyai                   # the nine BabyAI methods, 10 seeds each
    python -m tools.protocol OUT_DIR --env babyai --devices 0 1 2 3  # four GPUs: four methods at a time
    python -m tools.protocol OUT_DIR --resume                        # continue where it stopped
    python -m tools.protocol OUT_DIR --env minihack --max-minutes 120 --methods msfa usfa_learned
    python -m tools.protocol OUT_DIR --env babyai fruitbot minihack --slurm --slurm-partition gpu  # a cluster
    python -m tools.protocol OUT_DIR --status                        # each run's job, state, progress, log

With --slurm every run is a SLURM job submitted through submitit, all at once (SLURM schedules them; preempted and
timed-out jobs checkpoint, requeue and resume), and the analysis a job after them; tools/protocol/runners.py says how, and
docs/scale.md what each job asks for. Without it the runs run here, one per device or core at a time. Several --env
make one protocol per env, in OUT_DIR/<env>/.

OUT_DIR/<method>/ is each method's own run directory (config.json, metrics.csv, eval.csv, checkpoint.eqx, the
per-seed parameter files, TensorBoard files); OUT_DIR/<method>.log its output, which the terminal also shows, each line
prefixed with the method. A method whose eval.csv reaches its protocol's last step is complete and is skipped; one
that stopped (Ctrl-C, --max-minutes, a crash) resumes from its checkpoint. Ctrl-C or SIGTERM stops every run cleanly
(each checkpoints first); `--resume OUT_DIR` then continues with the same settings (OUT_DIR/protocol.json).

Where the env has an analysis (BabyAI: the reward-prediction table, the cumulants' quality), tools.analyze plays
each run's saved agents as it completes (on SLURM: at the end), and a method trained seed by seed is reported from its
seeds' records into OUT_DIR/<method>/analysis/, once; OUT_DIR/summary.json records the device and, per method, the
env steps reached, the share of the protocol, the wall time and the exit status, what its analysis last said (kept
through stops and resumes), and, where it was left to run, which seeds. Figures and tables: `python -m
tools.plot OUT_DIR/<method>` and `python -m tools.summarize OUT_DIR/*/`. `python -m tools.export OUT_DIR DEST`
copies what is small enough to commit (no checkpoints), a folder in which `--resume` continues the protocol: its
complete runs are kept, the others start over.

Memory: one method's runs hold --seeds replays (docs/scale.md gives the bytes per seed); for Fruitbot the seeds default
to as many as fit the device by each script's replay_bytes (at most 10: a replay of game states, 0.33-0.39 GiB per
seed, lets all 10 fit; one of frames, with --extra "--replay-frames", 33 GiB per seed, 1 on an 80 GB GPU).
"""

from __future__ import annotations

import csv
import dataclasses
import importlib
import json
import os
import shlex
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import tyro

from common.run import (ROOT, ConfigError, exit_on_config_error, open_table, portable_config, read_table, require,
                        table_path)
from tools.protocol.runners import LIVE_STATES, SINGLE_THREADED, LocalRunner, Run, SlurmOptions  # noqa: F401 (SINGLE_THREADED)
from tools.protocol import runners

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
BLIND = "_blind"
"""<method>_blind is the method with --reward-input off: its recurrent core cannot read the reward, so neither can
cumulants learned from its state (docs/cumulants.md); e.g. msfa_blind, usfa_learned_blind. Named with --methods; the
default methods are the paper's."""
for _methods in METHODS.values():
    _methods.update({name + BLIND: command + " --reward-input off" for name, command in list(_methods.items())})


def paper_methods(env: str) -> tuple[str, ...]:
    """An env's methods as the paper has them, in its order (not the reward-blind forms): what a protocol runs when
    --methods names none."""
    return tuple(name for name in METHODS[env] if not name.endswith(BLIND))


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
ENV_WORKERS = 8
"""--env-workers' default: worker processes stepping each seed's NLE envs"""
"""envs stepped by C++ on the host (NLE): their runs get --env-workers processes per seed's envs"""
ANALYSES = ("babyai",)
"""envs tools.analyze plays (GotoAvoid)"""
FIT_SEEDS = ("fruitbot",)
"""envs whose replay may limit the seeds a device holds (Fruitbot's, where it keeps 64x64x3 frames)"""
PAPER_SEEDS = 10
REPLAY_SHARE = 0.7
"""share of a device's memory one method's replays may take (the rest: the learner's activations, parameters,
optimiser state, and the transient copy while a replay is allocated)"""


@dataclass
class Args:
    out_dir: tyro.conf.Positional[str]
    """the protocol's folder: one run directory per method, their logs, protocol.json and summary.json (with several
    --env: one such folder per env, OUT_DIR/<env>/)"""
    env: tuple[str, ...] = ()
    """babyai, fruitbot and/or minihack (several: one protocol per env; with --resume: the saved ones)"""
    methods: tuple[str, ...] = ()
    """methods to run, in this order (default: every method of --env, in the paper's order)"""
    seeds: int | None = None
    """vmapped seeds per method (seeds 1..seeds); default 10, and with --env fruitbot on a GPU as many as fit (<= 10)"""
    method_seeds: tuple[str, ...] = ()
    """other seed counts for some methods, as METHOD=N (e.g. msfa_blind=10 msfa=3): those methods train seeds 1..N,
    the others --seeds"""
    devices: tuple[str, ...] = ()
    """GPUs to use, one method on each at a time (CUDA_VISIBLE_DEVICES of its run); on a CPU the cores to use, one
    seed's run pinned to each (default: one run at a time on whatever JAX sees; on a CPU every core)"""
    seeds_apart: bool | None = None
    """train each seed in its own single-threaded process, one per core, instead of vmapping a method's seeds in one
    process (default: on a CPU without --slurm, where it trains the most seeds per hour: benchmarks/cpu_seeds.py,
    docs/scale.md)"""
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
    """greedy episodes per task and seed of tools.analyze (the paper's Table A: 40)"""
    status: bool = False
    """print one line per (env, method): its job and state, env steps reached, the last evaluation, its log; then
    exit (submits and runs nothing)"""
    slurm: bool = False
    """submit every run as a SLURM job through submitit (all at once; SLURM schedules them, requeues preempted and
    timed-out ones, which resume from their checkpoints) and return; the analysis is a job that waits for them"""
    slurm_partition: str | None = None
    """--slurm: sbatch's --partition (default: the cluster's default partition)"""
    slurm_account: str | None = None
    """--slurm: sbatch's --account"""
    slurm_qos: str | None = None
    """--slurm: sbatch's --qos"""
    slurm_time: int = 240
    """--slurm: the time limit of each job in minutes; a run longer than that continues in its requeued job"""
    slurm_gpus: int = 1
    """--slurm: GPUs per job (0: a CPU job)"""
    slurm_cpus: int = 8
    """--slurm: CPUs per job (MiniHack's env workers are processes: give it --env-workers + 2)"""
    slurm_mem: str | None = None
    """--slurm: sbatch's --mem (e.g. 64G; docs/scale.md gives each method's replay per seed)"""
    slurm_sbatch: tuple[str, ...] = ()
    """--slurm: other #SBATCH parameters as KEY=VALUE (e.g. constraint=h100 exclude=node07)"""
    slurm_job_prefix: str = "msfa-"
    """--slurm: the jobs' names are this, the env and the run (e.g. msfa-babyai-usfa)"""

    def __post_init__(self):
        if isinstance(self.env, str):  # (a caller's Args(env="babyai"))
            self.env = (self.env,)


SAVED = ("env", "methods", "seeds", "method_seeds", "env_workers", "scale", "extra", "seeds_apart")
"""the settings protocol.json keeps for --resume"""


def method_seeds(args: Args) -> dict[str, int]:
    """--method-seeds as {method: seeds}; one line where an entry is not METHOD=N with N positive."""
    out = {}
    for entry in args.method_seeds:
        name, _, count = entry.partition("=")
        require(count.isdigit() and int(count) > 0, f"--method-seeds takes METHOD=N with N a positive number (e.g. "
                                                    f"msfa_blind=10), got {entry!r}")
        out[name] = int(count)
    return out


def seeds_of(args: Args, name: str) -> int:
    """The number of seeds (1..N) a method trains."""
    return method_seeds(args).get(name, args.seeds)


def jobs(args: Args, name: str) -> list[tuple[str, int, int]]:
    """A method's runs: (job name, first seed, seeds): one with every seed vmapped, or with seeds_apart one per
    seed, in OUT_DIR/<method>/seed<k>/ (merged into OUT_DIR/<method>/ when all are complete)."""
    seeds = seeds_of(args, name)
    if not args.seeds_apart:
        return [(name, 1, seeds)]
    return [(f"{name}/seed{k}", k, 1) for k in range(1, seeds + 1)]


def run_flags(args: Args, name: str, seed: int = 1, seeds: int | None = None) -> list[str]:
    """The method's script and flags (its defaults are the paper's settings), plus the protocol's."""
    script, *flags = shlex.split(METHODS[env_name(args)][name])
    if env_name(args) in HOST_ENVS:
        flags += ["--env-workers", str(ENV_WORKERS if args.env_workers is None else args.env_workers)]
    scale = SCALES[args.scale].get(env_name(args), {})
    flags += shlex.split(scale.get("all", "")) + shlex.split(scale.get(name.removesuffix(BLIND), ""))
    return [str(ROOT / script), *flags, "--seed", str(seed), "--num-seeds", str(seeds or seeds_of(args, name)),
            *shlex.split(args.extra)]


def progress(run_dir: Path) -> tuple[int, int | None]:
    """(env steps per seed reached: the last metrics row, the protocol's total: config.json)."""
    steps = 0
    metrics = run_dir / "metrics.csv"
    if table_path(metrics).exists():
        lines = read_table(metrics).splitlines()
        steps = int(lines[-1].split(",")[0]) if len(lines) > 1 else 0
    config = run_dir / "config.json"
    total = json.loads(config.read_text()).get("args", {}).get("total_timesteps") if config.exists() else None
    return steps, total


def complete(run_dir: Path) -> bool:
    """The run evaluated at (or past: whole iterations) its protocol's last step."""
    _, total = progress(run_dir)
    evaluated = run_dir / "eval.csv"
    steps = ([int(line.split(",")[0]) for line in read_table(evaluated).splitlines()[1:]]
             if table_path(evaluated).exists() else [])
    return bool(total and steps and max(steps) >= total)


def env_name(args: Args) -> str:
    """The env of one env's protocol (its Args hold that env alone)."""
    return args.env[0]


def training_runs(args: Args, names: list[str]) -> list[Run]:
    """The runs (tools.protocol.runners.Run) of these methods that are not complete, in order."""
    out = Path(args.out_dir)
    runs = []
    for name in names:
        for job, seed, seeds in jobs(args, name):
            if not complete(out / job):
                runs.append(Run(job, [sys.executable, *run_flags(args, name, seed, seeds)], out / job,
                                out / f"{job.replace('/', '.')}.log"))
    return runs


def merge_seeds(args: Args, name: str) -> bool:
    """With seeds_apart: once every seed's run of a method is complete, OUT_DIR/<method>/ gets them as one run of
    all its seeds (the first seed's config.json with num_seeds set; every seed's metrics.csv and eval.csv rows; their
    parameter files, hard-linked, .eqx or the compact .eqz of tools.export), so that the tools read it as
    they read a run of vmapped seeds. Returns whether the method is complete."""
    out = Path(args.out_dir) / name
    seed_dirs = [Path(args.out_dir) / job for job, _, _ in jobs(args, name)]
    if complete(out) or not all(complete(d) for d in seed_dirs):
        return complete(out)
    for table in ("metrics.csv", "eval.csv"):  # rows by (step, seed), as a vmapped run writes them
        parts = [read_table(d / table).splitlines() for d in seed_dirs]
        rows = sorted((r for p in parts for r in p[1:]), key=lambda r: tuple(int(x) for x in r.split(",")[:2]))
        (out / table).write_text("\n".join([parts[0][0], *rows]) + "\n")
    for d in seed_dirs:
        for params in saved_agents(d):
            (out / params.name).unlink(missing_ok=True)
            os.link(params, out / params.name)
    config = json.loads((seed_dirs[0] / "config.json").read_text())
    config["args"] |= {"seed": 1, "num_seeds": seeds_of(args, name)}
    config["seeds_trained_apart"] = [str(d.relative_to(out)) for d in seed_dirs]
    config = portable_config(config, run_dir_as=str(seed_dirs[0].relative_to(out)))  # (the command is its seed's)
    (out / "config.json").write_text(json.dumps(config, indent=2))  # last: complete() reads it
    return True


def method_progress(args: Args, name: str) -> tuple[int, int | None]:
    """(env steps per seed every seed reached, the protocol's total) of a method."""
    if not args.seeds_apart or complete(Path(args.out_dir) / name):
        return progress(Path(args.out_dir) / name)
    reached = [progress(Path(args.out_dir) / job) for job, _, _ in jobs(args, name)]
    return min(r[0] for r in reached), next((r[1] for r in reached if r[1]), None)


def saved_agents(run_dir: Path) -> list[Path]:
    """A run's parameter files: params_seed<N>.eqx as written, or their compact .eqz (tools.compact_agents)."""
    return sorted([*run_dir.glob("params_seed*.eqx"), *run_dir.glob("params_seed*.eqz")])


def analyzed(run_dir: Path) -> bool:
    """tools.analyze finished on this run (it writes records.json last but for the figures)."""
    return (run_dir / "analysis" / "records.json").exists()


def run_analysis(args: Args, name: str, run_dir: Path, flags: list[str]) -> bool:
    """One tools.analyze into run_dir/analysis/, its output in OUT_DIR/<name>.analysis.log; whether it worked."""
    from tools import analyze as analysis  # (its module path, not written out: a moved tool moves here too)

    command = [sys.executable, "-m", analysis.__spec__.name, *flags, "--out", str(run_dir / "analysis"), "--episodes",
               str(args.analysis_episodes)]
    log = Path(args.out_dir) / f"{name.replace('/', '.')}.analysis.log"
    print(f"[protocol] {time.strftime('%H:%M:%S')} analyse {name}: {shlex.join(command)}", flush=True)
    env = runners.run_environment(Run(f"{name}.analysis", command, run_dir, log))  # the runs' compile cache
    with log.open("w") as f:
        return subprocess.run(command, cwd=ROOT, stdout=f, stderr=subprocess.STDOUT, env=env).returncode == 0


def analyze(args: Args, names: list[str]) -> dict[str, str]:
    """tools.analyze of each method's saved agents into OUT_DIR/<method>/analysis/ (where the env has one), once.
    Trained seed by seed, each complete seed is played as soon as it is (OUT_DIR/<method>/seed<k>/analysis/, its
    records), and the method, once complete, is reported from its seeds' records (--records): so a seed's agent is
    needed only until it is played, and tools.export carries the records instead."""
    outcome = {}
    for name in names:
        run_dir = Path(args.out_dir) / name
        if env_name(args) not in ANALYSES:
            outcome[name] = f"none for {env_name(args)}"
            continue
        if analyzed(run_dir):
            outcome[name] = "ok"
            continue
        if not args.seeds_apart:
            if not saved_agents(run_dir):
                outcome[name] = "no saved agents"
            elif not run_analysis(args, name, run_dir, [str(run_dir)]):
                outcome[name] = f"failed ({name}.analysis.log)"
            else:
                outcome[name] = "ok"
            continue
        seed_jobs = [job for job, _, _ in jobs(args, name)]
        seed_dirs = [Path(args.out_dir) / job for job in seed_jobs]
        failed = []
        for job, seed_dir in zip(seed_jobs, seed_dirs):
            if complete(seed_dir) and not analyzed(seed_dir):
                if not saved_agents(seed_dir) or not run_analysis(args, job, seed_dir, [str(seed_dir)]):
                    failed.append(job)
        played = [d for d in seed_dirs if analyzed(d)]
        if failed:
            outcome[name] = f"failed: {', '.join(failed)} (their .analysis.log)"
        elif not complete(run_dir):
            outcome[name] = f"{len(played)} of {len(seed_dirs)} seeds played"
        elif len(played) < len(seed_dirs):
            outcome[name] = f"seeds without records: {[d.name for d in seed_dirs if d not in played]}"
        elif run_analysis(args, name, run_dir, ["--records", *(str(d / "analysis") for d in played)]):
            outcome[name] = "ok"
        else:
            outcome[name] = f"failed ({name}.analysis.log)"
    return outcome


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
        script, *flags = shlex.split(METHODS[env_name(args)][name])
        module = importlib.import_module(Path(script).stem)
        sizes.append(module.replay_bytes(tyro.cli(module.Args, args=run_flags(args, name, seeds=1)[1:])))
    return max(sizes)


# ------------------------------------------------------------------------------------------------------- settings
def protocol_dirs(args: Args) -> list[tuple[str | None, Path]]:
    """(env, folder) of each env's protocol: OUT_DIR itself for one env, OUT_DIR/<env>/ for several; with --resume
    or --status the folders that hold a protocol.json (env None: read from it)."""
    out = Path(args.out_dir)
    if args.resume or args.status:
        if (out / "protocol.json").exists():
            return [(None, out)]
        found = sorted(p.parent for p in out.glob("*/protocol.json"))
        require(bool(found), f"{out / 'protocol.json'} does not exist; start the protocol there first "
                             "(without --resume, with --env)")
        return [(None, p) for p in found]
    require(bool(args.env), "--env is required: babyai, fruitbot and/or minihack (or --resume OUT_DIR)")
    unknown = [e for e in args.env if e not in METHODS]
    require(not unknown, f"--env must be one of {', '.join(METHODS)}, got {' '.join(unknown)}")
    require(len(set(args.env)) == len(args.env), f"--env repeats an env: {' '.join(args.env)}")
    return [(args.env[0], out)] if len(args.env) == 1 else [(e, out / e) for e in args.env]


def resolve(args: Args, env: str | None = None) -> Args:
    """One env's settings: the saved ones with --resume, else the command line's with the env's defaults; checked."""
    out = Path(args.out_dir)
    saved_file = out / "protocol.json"
    if args.resume:
        require(saved_file.exists(), f"--resume: {saved_file} does not exist; start the protocol there first "
                                     "(without --resume, with --env)")
        saved = ({"seeds_apart": False, "scale": "paper", "method_seeds": ()}  # (older protocol.json lack these)
                 | json.loads(saved_file.read_text()))
        saved["env"] = (saved["env"],)
        given = {k: getattr(args, k) for k in SAVED if getattr(args, k) not in (None, (), "")}
        if "env" in given and len(given["env"]) > 1:
            given["env"] = tuple(e for e in given["env"] if e in saved["env"]) or given["env"]
        differs = {k: v for k, v in given.items() if (tuple(v) if isinstance(v, list) else v) !=
                   (tuple(saved[k]) if isinstance(saved[k], list) else saved[k])}
        require(not differs, f"--resume keeps the protocol's settings ({saved_file}); these differ: "
                             f"{', '.join(f'--{k.replace(chr(95), chr(45))}' for k in differs)}")
        return dataclasses.replace(args, **{k: tuple(v) if isinstance(v, list) else v for k, v in saved.items()})
    if env is None:
        require(len(args.env) == 1 and args.env[0] in METHODS,
                f"--env must be one of {', '.join(METHODS)}, got {' '.join(args.env) or 'none'}")
        env = args.env[0]
    args = dataclasses.replace(args, env=(env,), scale=args.scale or "paper",
                               env_workers=ENV_WORKERS if args.env_workers is None else args.env_workers)
    require(args.scale in SCALES, f"--scale must be one of {', '.join(SCALES)}, got {args.scale!r}")
    require(args.scale == "paper" or env in SCALES[args.scale],
            f"--scale {args.scale} exists for {', '.join(SCALES[args.scale])} only, not --env {env}")
    require(not (saved_file.exists() or (out.exists() and any(out.iterdir()))),
            f"{out} already holds a protocol or other files; continue it with --resume, or pass a new OUT_DIR")
    known = METHODS[env]
    unknown = [m for m in args.methods if m not in known]
    require(not unknown, f"unknown methods {unknown} for --env {env}; choose from {', '.join(known)}")
    require(args.seeds is None or args.seeds > 0, f"--seeds must be positive, got {args.seeds}")
    stray = sorted(set(method_seeds(args)) - set(args.methods or paper_methods(env)))  # (each entry checked)
    require(not stray, f"--method-seeds names methods this protocol does not run: {stray}")
    require(args.env_workers > 0 and args.analysis_episodes > 0,
            "--env-workers and --analysis-episodes must be positive")
    require(len(set(args.devices)) == len(args.devices), f"--devices repeats a device: {' '.join(args.devices)}")
    args = dataclasses.replace(args, methods=args.methods or paper_methods(env))
    if args.seeds_apart is None:
        import jax

        args = dataclasses.replace(args, seeds_apart=not args.slurm and jax.default_backend() == "cpu")
    limit = device_memory_limit() if env in FIT_SEEDS and not args.slurm else None
    per_seed = replay_bytes_per_seed(args) if limit is not None else None
    return dataclasses.replace(args, seeds=choose_seeds(args.seeds, per_seed, limit))


def slurm_options(args: Args) -> SlurmOptions | None:
    """--slurm's options, checked (None without --slurm; a --slurm-* flag without it is refused)."""
    defaults = Args("")
    given = [f.name for f in dataclasses.fields(Args) if f.name.startswith("slurm_") and
             getattr(args, f.name) != getattr(defaults, f.name)]
    require(args.slurm or not given, f"{', '.join('--' + g.replace('_', '-') for g in given)} without --slurm: add "
                                     "--slurm to submit the runs as SLURM jobs")
    if not args.slurm:
        return None
    require(shutil.which("sbatch") is not None, "--slurm: sbatch is not on PATH; run the protocol where SLURM's "
                                                "commands are (a login node), or without --slurm")
    require(not (args.devices or args.max_minutes), "--devices and --max-minutes are for one machine; on SLURM each "
                                                    "job gets --slurm-gpus and --slurm-time (it is requeued as needed)")
    require(args.slurm_time > 0 and args.slurm_cpus > 0 and args.slurm_gpus >= 0,
            "--slurm-time and --slurm-cpus must be positive, --slurm-gpus >= 0")
    bad = [p for p in args.slurm_sbatch if "=" not in p or not p.split("=", 1)[0]]
    require(not bad, f"--slurm-sbatch takes KEY=VALUE (sbatch's long option without its dashes), got {' '.join(bad)}")
    return SlurmOptions(args.slurm_partition, args.slurm_account, args.slurm_qos, args.slurm_time, args.slurm_gpus,
                        args.slurm_cpus, args.slurm_mem, dict(p.split("=", 1) for p in args.slurm_sbatch),
                        args.slurm_job_prefix)


def device_name() -> str:
    import jax

    devices = jax.devices()
    return f"{len(devices)} x {devices[0].device_kind} ({jax.default_backend()}), jax {jax.__version__}"


# -------------------------------------------------------------------------------------------------- the protocol
def read_jobs(out: Path) -> dict:
    """OUT_DIR/jobs.json: how the runs were started (executor "slurm" or "local") and each run's job or process."""
    path = out / "jobs.json"
    return json.loads(path.read_text()) if path.exists() else {"executor": None, "jobs": {}}


def write_json(path: Path, data: dict) -> None:
    """path written whole or not at all (a reader, or a protocol cut off mid-write, never sees half a file)"""
    path.with_name(path.name + ".tmp").write_text(json.dumps(data, indent=1))
    path.with_name(path.name + ".tmp").replace(path)


def write_jobs(out: Path, record: dict) -> None:
    write_json(out / "jobs.json", record)


RUN_RECORD = ("exit_status", "wall_seconds", "ended", "error", "result", "job_id", "earlier")
"""what summary.json records of a run's job (tools.protocol.runners), and of its jobs before this one ("earlier")"""


def run_record(before: dict | None, now: dict | None) -> dict:
    """summary.json's record of a run: its job in this protocol's invocation, the earlier invocations' jobs of it
    listed under "earlier" (a run stopped and resumed, or started over); the earlier record alone where this
    invocation did not run it (it came complete), so that a resumed protocol keeps every run's times.

    A job is known by its SLURM job id: the same id recorded again (another invocation's finishing job, or a job
    first seen running and now ended) updates its record. A local job is always this invocation's own, however alike
    its record is to an earlier one (two short runs can end in the same second after the same wall time)."""
    if not now:
        return dict(before or {})
    if not before:
        return dict(now)
    before = dict(before)
    earlier = before.pop("earlier", [])
    if now.get("job_id") is not None and before.get("job_id") == now["job_id"]:
        return {**now, "earlier": earlier} if earlier else dict(now)
    return {**now, "earlier": [*earlier, before]}


def finish(args: Args, outcome: dict[str, dict] | None = None, not_started: tuple[str, ...] = (),
           stopped: bool = False, wall_seconds: float | None = None, before: dict | None = None,
           analysis: dict[str, str] | None = None) -> dict:
    """The end of a protocol: merge seeds' runs, tools.analyze of every method's saved agents (unless stopped),
    OUT_DIR/summary.json. On SLURM the last job calls it, after every run's job has ended. analysis: what this
    invocation's analyses already said (as its runs ended), which a stopped protocol reports as they were."""
    out = Path(args.out_dir)
    for name in args.methods:
        if args.seeds_apart:
            merge_seeds(args, name)
    analysis = dict(analysis or {})
    if not stopped:
        analysis |= analyze(args, [m for m in args.methods if (out / m).exists()])
    return write_summary(args, outcome, before, analysis, not_started, wall_seconds, in_progress=False)


def summary_before(out: Path) -> dict:
    """summary.json's records of the methods as an invocation of the protocol found them (an earlier invocation's)."""
    return json.loads((out / "summary.json").read_text())["methods"] if (out / "summary.json").exists() else {}


def write_summary(args: Args, outcome: dict[str, dict] | None, before: dict | None, analysis: dict[str, str],
                  not_started: tuple[str, ...] = (), wall_seconds: float | None = None,
                  in_progress: bool = True) -> dict:
    """OUT_DIR/summary.json: the device and, per method, its progress and its runs' records, this invocation's
    (outcome) after the earlier invocations' (before: summary_before at this invocation's start). Written as each
    run ends (in_progress) as well as at the end, so that a protocol that never reaches its end (the machine
    restarted under it) keeps the records of the runs it finished."""
    out = Path(args.out_dir)
    record = read_jobs(out)
    summary = {"device": device_name(), "env": env_name(args), "scale": args.scale, "seeds": args.seeds,
               "method_seeds": method_seeds(args),
               "seeds_apart": args.seeds_apart, "extra": args.extra, "devices": list(args.devices),
               "executor": record["executor"], "wall_seconds": wall_seconds, "in_progress": in_progress,
               "methods": {}}
    outcome = dict(outcome or {})
    if record["executor"] == "slurm":
        for job, job_id in record["jobs"].items():
            outcome.setdefault(job, {"job_id": job_id} | (runners.job_outcome(out / "slurm", job_id) or {}))
    before = summary_before(out) if before is None else before
    for name in args.methods:
        steps, total = method_progress(args, name)
        script, *flags = run_flags(args, name)
        entry = {"command": shlex.join([str(Path(script).relative_to(ROOT)), *flags]), "env_steps_per_seed": steps,
                 "total_timesteps": total, "share_of_protocol": round(steps / total, 4) if total else 0.0,
                 "complete": complete(out / name)}
        earlier = before.get(name, {})
        if args.seeds_apart:
            entry["seed_runs"] = {job: run_record(earlier.get("seed_runs", {}).get(job), outcome.get(job))
                                  for job, _, _ in jobs(args, name)
                                  if job in outcome or job in earlier.get("seed_runs", {})}
        else:
            entry |= run_record({k: earlier[k] for k in RUN_RECORD if k in earlier} or None, outcome.get(name))
        if name in analysis or "analysis" in earlier:  # the latest said, this invocation's or an earlier one's
            entry["analysis"] = analysis.get(name, earlier.get("analysis"))
        runs = [job for job, _, _ in jobs(args, name)]
        if any(job in not_started for job in runs):  # its turn had not come when this invocation ended
            begun = any((out / job).exists() for job in runs)
            left = [job.split("/")[-1] for job in runs if not complete(out / job)]
            entry["status"] = ("not started" if not begun else
                               f"seeds to run: {', '.join(left)}" if args.seeds_apart else "to continue")
        summary["methods"][name] = entry
    write_json(out / "summary.json", summary)
    return summary


def run_here(args: Args) -> None:
    """One env's protocol on this machine: its runs in order, one per device (or pinned core) at a time, then the
    analysis and summary.json."""
    out = Path(args.out_dir)
    start = time.time()
    deadline = None if args.max_minutes is None else start + 60 * args.max_minutes
    done = [m for m in args.methods if complete(out / m) or (args.seeds_apart and merge_seeds(args, m))]
    queue = training_runs(args, [m for m in args.methods if m not in done])
    slots = list(args.devices) or ([str(c) for c in sorted(os.sched_getaffinity(0))] if args.seeds_apart else [None])
    how = f"each seed apart, {len(slots)} at a time (one per core)" if args.seeds_apart else f"{len(slots)} at a time"
    counts = f"{args.seeds} seeds per method" + (f" ({', '.join(args.method_seeds)})" if args.method_seeds else "")
    print(f"[protocol] {device_name()}; {env_name(args)}; {counts}, {how}; "
          f"complete: {', '.join(done) or 'none'}"
          f"; to run: {', '.join(dict.fromkeys(r.name.split('/')[0] for r in queue)) or 'none'}", flush=True)
    record = {"executor": "local", "protocol_pid": os.getpid(), "jobs": {}}
    write_jobs(out, record)
    before, analysis = summary_before(out), {}

    def started(name: str, pid: int) -> None:
        record["jobs"][name] = pid
        write_jobs(out, record)

    def finished(name: str) -> None:
        method = name.split("/")[0]
        if args.seeds_apart:
            merge_seeds(args, method)
        if not runner.stopped and complete(out / name):
            # now, while its agents are here: tools.export need not carry them after
            analysis.update(analyze(args, [method]))
        write_summary(args, runner.outcome, before, analysis)

    runner = LocalRunner(slots, bool(args.seeds_apart), deadline, started, finished)
    left = runner.run(queue, args.max_minutes)
    summary = finish(args, runner.outcome, tuple(r.name for r in left), bool(runner.stopped),
                     round(time.time() - start, 1), before, analysis)
    for name, entry in summary["methods"].items():
        print(f"[protocol] {name}: {entry['env_steps_per_seed']:,} env steps per seed ({entry['share_of_protocol']:.0%}"
              f" of the protocol){', exit ' + str(entry['exit_status']) if 'exit_status' in entry else ''}",
              flush=True)
    unfinished = [m for m, e in summary["methods"].items() if not e["complete"]]
    if unfinished:
        print(f"[protocol] not complete: {', '.join(unfinished)}; continue with: python -m {__spec__.name} "
              f"{shlex.quote(str(out))} --resume", flush=True)
    if runner.stopped:
        raise SystemExit(128 + runner.stopped[0])
    if any(e.get("exit_status") not in (None, 0) for e in summary["methods"].values()):
        raise SystemExit(1)


def submit(args: Args, options: SlurmOptions) -> None:
    """One env's protocol on SLURM: a job for each run that is not complete and has no live job, and the finishing
    job after them; returns once submitted (`--status` follows them)."""
    out = Path(args.out_dir)
    record = read_jobs(out)
    states = runners.slurm_states([*record["jobs"].values(), record.get("finish", "")]) \
        if record["executor"] == "slurm" else {}
    live = {job_id for job_id, (state, _) in states.items() if state in LIVE_STATES}
    unfinished = training_runs(args, list(args.methods))
    runs = [r for r in unfinished if record["jobs"].get(r.name) not in live]
    running = tuple(record["jobs"][r.name] for r in unfinished if record["jobs"].get(r.name) in live)
    prefix = f"{options.job_prefix}{env_name(args)}-"
    first = not (out / "slurm").exists()
    try:
        ids = runners.submit_to_slurm(dataclasses.replace(options, job_prefix=prefix), out / "slurm", runs,
                                        runners.FinishJob(finish, args), running)
    except ConfigError:  # refused: OUT_DIR is left as it was (a new one is not created)
        if first:
            shutil.rmtree(out / "slurm", ignore_errors=True)
        if not any(out.iterdir()):
            out.rmdir()
        raise
    if record.get("finish") in live:  # the earlier finishing job: this one, after every run, replaces it
        subprocess.run(["scancel", record["finish"]], capture_output=True)
    record = {"executor": "slurm", "jobs": {**(record["jobs"] if record["executor"] == "slurm" else {}),
                                            **{k: v for k, v in ids.items() if k != "finish"}},
              "finish": ids["finish"]}
    write_jobs(out, record)
    print(f"[protocol] {env_name(args)}: submitted {len(runs)} run(s) as SLURM jobs "
          f"{' '.join(ids[r.name] for r in runs) or '(none left to run)'}, then the analysis as job {ids['finish']}; "
          f"follow them with: python -m {__spec__.name} {shlex.quote(str(out))} --status", flush=True)


# -------------------------------------------------------------------------------------------------------- status
def last_evaluation(run_dir: Path) -> str:
    """The last evaluation's mean test return (with GPI where the method has it), over tasks and seeds."""
    path = run_dir / "eval.csv"
    if not table_path(path).exists():
        return "-"
    with open_table(path) as f:
        rows = [r for r in csv.DictReader(f) if r["split"] == "test"]
    if not rows:
        return "-"
    last = max(int(r["step"]) for r in rows)
    rows = [r for r in rows if int(r["step"]) == last]
    gpi = [r for r in rows if r["gpi"] == "1"] or rows
    return f"{sum(float(r['return_mean']) for r in gpi) / len(gpi):.2f} at {last:,}"


def status_lines(args: Args) -> list[str]:
    """One line per run of one env's protocol (per seed's run with seeds apart): job, state, progress, evaluation,
    log; a failed one with its error's last line."""
    out = Path(args.out_dir)
    record = read_jobs(out)
    states = runners.slurm_states(list(record["jobs"].values())) if record["executor"] == "slurm" else {}
    protocol_alive = record["executor"] == "local" and pid_alive(record.get("protocol_pid"))
    lines = []
    for name in args.methods:
        if args.seeds_apart and complete(out / name):
            names = [name]
        else:
            names = [job for job, _, _ in jobs(args, name)]
        for job in names:
            run_dir, job_id = out / job, record["jobs"].get(job)
            steps, total = progress(run_dir)
            error = ""
            if complete(run_dir):
                state = "done"
            elif record["executor"] == "slurm" and job_id is not None:
                state, restarts = states.get(str(job_id), ("", 0))
                outcome = runners.job_outcome(out / "slurm", str(job_id))
                if state in LIVE_STATES:
                    state = ("requeued" if state == "PENDING" and restarts else state.lower()) + (
                        f" (restarts {restarts})" if restarts else "")
                elif outcome is not None and "error" in outcome:
                    state, error = "failed", outcome["error"]
                else:
                    state = f"{state.lower() or 'ended'} before the end"
            elif record["executor"] == "local" and job_id is not None:
                state = "running" if pid_alive(job_id) else ("stopped" if not protocol_alive else "ended")
            else:
                state = "pending" if protocol_alive or record["executor"] == "slurm" else "not started"
            log = out / f"{job.replace('/', '.')}.log"
            if state == "failed" and not error:
                error = runners.last_line(log)
            lines.append(f"{env_name(args):9s} {job:24s} {str(job_id or '-'):>8s} {state:22s} "
                         f"{steps:>11,} / {total or 0:<11,} {last_evaluation(run_dir):>18s}  {log}"
                         + (f"\n{'':9s} error: {error}" if error else ""))
    return lines


def pid_alive(pid: int | None) -> bool:
    if not pid:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


@exit_on_config_error
def main(args: Args) -> None:
    require(args.max_minutes is None or args.max_minutes > 0, f"--max-minutes must be positive, got {args.max_minutes}")
    os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")  # this process only reads the devices
    if args.status:
        print(f"{'env':9s} {'run':24s} {'job':>8s} {'state':22s} {'env steps':>11s} / {'of':<11s} "
              f"{'last test return':>18s}  log")
        for _, folder in protocol_dirs(args):
            print("\n".join(status_lines(resolve(dataclasses.replace(args, out_dir=str(folder), resume=True,
                                                                     status=False)))))
        return
    options = slurm_options(args)
    protocols = [resolve(dataclasses.replace(args, out_dir=str(folder)), env) for env, folder in protocol_dirs(args)]
    for one in protocols:
        out = Path(one.out_dir)
        record = read_jobs(out)
        if options is None and record["executor"] == "slurm" and shutil.which("scontrol"):
            states = runners.slurm_states(list(record["jobs"].values()))
            live = [j for j, (state, _) in states.items() if state in LIVE_STATES]
            require(not live, f"{out}: SLURM jobs {' '.join(live)} still run this protocol; wait for them (--status) "
                              "or scancel them before resuming it here")
    for one in protocols:
        out = Path(one.out_dir)
        out.mkdir(parents=True, exist_ok=True)
        if options is not None:
            submit(one, options)  # (protocol.json after: a submission SLURM refuses leaves OUT_DIR as it was)
        save_settings(one)
        if options is None:
            run_here(one)


def save_settings(args: Args) -> None:
    (Path(args.out_dir) / "protocol.json").write_text(json.dumps(
        {k: getattr(args, k) if k != "env" else env_name(args) for k in SAVED}, indent=1))

