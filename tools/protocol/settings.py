"""The protocol's settings: the command line (Args: several --env at once, --resume, --status, SLURM's options) and
one env's resolved protocol (Protocol: its folder, env, methods and seeds, and how its runs run), which protocol.json
keeps for --resume; what they imply for each run (its seeds, its jobs, its command line) and for the device's
memory."""

from __future__ import annotations

import dataclasses
import importlib
import json
import shlex
import shutil
from dataclasses import dataclass
from pathlib import Path

import tyro

from common.run import ROOT, require
from tools.protocol.methods import (BLIND, ENV_WORKERS, FIT_SEEDS, HOST_ENVS, METHODS, PAPER_SEEDS, SCALES,
                                    paper_methods)
from tools.protocol.runners import SlurmOptions
from tools.run_reader import RunReader, complete

ANALYSIS_EPISODES = 40
"""--analysis-episodes' default: the paper's Table A"""
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
    method_steps: tuple[str, ...] = ()
    """env steps per seed for some methods, as METHOD=STEPS (e.g. msfa=5000000): their runs get --total-timesteps
    STEPS after --extra's; with --resume it extends them (more than they had; kept in protocol.json): each run goes on
    from its final checkpoint, a method trained seed by seed is merged again at the new end, and each analysis made
    at the earlier end is kept as analysis_at_<steps>/ (tools/protocol/seeds.py, extend)"""
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
    """flags added to every run's command line, after --scale's, given with "=" (they begin with dashes): e.g.
    --extra="--core-backend pallas" or --extra="--total-timesteps 2560000 --eval-every 256000" """
    max_minutes: float | None = None
    """stop every run cleanly after this many minutes (each evaluates and checkpoints first); --resume continues"""
    resume: bool = False
    """continue the protocol in OUT_DIR with its saved settings (protocol.json)"""
    analysis_episodes: int = ANALYSIS_EPISODES
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
        """--env holds envs (a caller may name one as a string)."""
        if isinstance(self.env, str):  # (a caller's Args(env="babyai"))
            self.env = (self.env,)


SAVED = ("env", "methods", "seeds", "method_seeds", "env_workers", "scale", "extra", "seeds_apart",
         "method_steps")
"""the settings protocol.json keeps for --resume (the fields of Protocol it holds, in its order)"""


@dataclass(frozen=True)
class Protocol:
    """One env's protocol, resolved (resolve): what protocol.json keeps (SAVED) and how this invocation runs it
    (devices, max_minutes, analysis_episodes: the command line's, never saved)."""

    out_dir: Path
    """its folder: a run directory per method, their logs, protocol.json, jobs.json and summary.json"""
    env: str
    methods: tuple[str, ...] = ()
    """in the order they run"""
    seeds: int = PAPER_SEEDS
    """seeds 1..seeds per method, but those of method_seeds"""
    method_seeds: tuple[str, ...] = ()
    """--method-seeds as given (METHOD=N entries; method_seeds() reads them)"""
    env_workers: int = ENV_WORKERS
    scale: str = "paper"
    extra: str = ""
    seeds_apart: bool = False
    """each seed trained in its own process (OUT_DIR/<method>/seed<k>/), merged when all are complete"""
    method_steps: tuple[str, ...] = ()
    """--method-steps, as extended by every --resume that gave it (METHOD=STEPS entries; steps_of() reads them)"""
    devices: tuple[str, ...] = ()
    max_minutes: float | None = None
    analysis_episodes: int = ANALYSIS_EPISODES


def per_method(entries: tuple[str, ...], flag: str, example: str) -> dict[str, int]:
    """METHOD=N entries of a flag as {method: N}; one line where an entry is not METHOD=N with N positive."""
    out = {}
    for entry in entries:
        name, _, count = entry.partition("=")
        require(count.isdigit() and int(count) > 0, f"{flag} takes METHOD=N with N a positive number (e.g. "
                                                    f"{example}), got {entry!r}")
        out[name] = int(count)
    return out


def method_seeds(entries: tuple[str, ...]) -> dict[str, int]:
    """--method-seeds as {method: seeds}."""
    return per_method(entries, "--method-seeds", "msfa_blind=10")


def method_steps(entries: tuple[str, ...]) -> dict[str, int]:
    """--method-steps as {method: env steps per seed}."""
    return per_method(entries, "--method-steps", "msfa=5000000")


def seeds_of(protocol: Protocol, name: str) -> int:
    """The number of seeds (1..N) a method trains."""
    return method_seeds(protocol.method_seeds).get(name, protocol.seeds)


def steps_of(protocol: Protocol, name: str) -> int | None:
    """The env steps per seed --method-steps gives a method (or one of its runs, METHOD/seed<k>); None: its runs'
    own --total-timesteps."""
    return method_steps(protocol.method_steps).get(name.split("/")[0])


def reached(protocol: Protocol, name: str, run_dir: Path) -> bool:
    """Whether a method's run (OUT_DIR/<method>, or a seed's OUT_DIR/<method>/seed<k>) is complete for this
    protocol: evaluated at its --method-steps, or else at its own last step (tools.run_reader.complete)."""
    return complete(run_dir, steps_of(protocol, name))


def jobs(protocol: Protocol, name: str) -> list[tuple[str, int, int]]:
    """A method's runs: (job name, first seed, seeds): one with every seed vmapped, or with seeds_apart one per
    seed, in OUT_DIR/<method>/seed<k>/ (merged into OUT_DIR/<method>/ when all are complete)."""
    seeds = seeds_of(protocol, name)
    if not protocol.seeds_apart:
        return [(name, 1, seeds)]
    return [(f"{name}/seed{k}", k, 1) for k in range(1, seeds + 1)]


def run_flags(protocol: Protocol, name: str, seed: int = 1, seeds: int | None = None) -> list[str]:
    """The method's script and flags (its defaults are the paper's settings), plus the protocol's."""
    script, *flags = shlex.split(METHODS[protocol.env][name])
    if protocol.env in HOST_ENVS:
        flags += ["--env-workers", str(protocol.env_workers)]
    scale = SCALES[protocol.scale].get(protocol.env, {})
    flags += shlex.split(scale.get("all", "")) + shlex.split(scale.get(name.removesuffix(BLIND), ""))
    steps = steps_of(protocol, name)
    return [str(ROOT / script), *flags, "--seed", str(seed), "--num-seeds", str(seeds or seeds_of(protocol, name)),
            *shlex.split(protocol.extra), *(["--total-timesteps", str(steps)] if steps else [])]


# ---------------------------------------------------------------------------------------------- the device's memory
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


def replay_bytes_per_seed(protocol: Protocol) -> int:
    """The largest replay per seed among the methods, from each script's own replay_bytes at its flags + --extra."""
    sizes = []
    for name in protocol.methods:
        script = shlex.split(METHODS[protocol.env][name])[0]
        module = importlib.import_module(Path(script).stem)
        sizes.append(module.replay_bytes(tyro.cli(module.Args, args=run_flags(protocol, name, seeds=1)[1:])))
    return max(sizes)


# ----------------------------------------------------------------------------------------- from the command line
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


def resolve(args: Args, env: str | None = None) -> Protocol:
    """One env's protocol (args.out_dir's): the saved settings with --resume, else the command line's with the env's
    defaults; checked."""
    out = Path(args.out_dir)
    saved_file = out / "protocol.json"
    invocation = dict(out_dir=out, devices=tuple(args.devices), max_minutes=args.max_minutes,
                      analysis_episodes=args.analysis_episodes)
    if args.resume:
        require(saved_file.exists(), f"--resume: {saved_file} does not exist; start the protocol there first "
                                     "(without --resume, with --env)")
        saved = ({"seeds_apart": False, "scale": "paper", "method_seeds": ()}  # (older protocol.json lack these)
                 | json.loads(saved_file.read_text()))
        saved = {k: tuple(v) if isinstance(v, list) else v for k, v in saved.items() if k in SAVED}
        as_given = saved | {"env": (saved["env"],)}  # (the command line's --env takes several)
        given = {k: getattr(args, k) for k in SAVED if getattr(args, k) not in (None, (), "")}
        saved["method_steps"] = extended(out, saved, given.pop("method_steps", ()))
        if "env" in given and len(given["env"]) > 1:
            given["env"] = tuple(e for e in given["env"] if e in as_given["env"]) or given["env"]
        differs = {k: v for k, v in given.items() if (tuple(v) if isinstance(v, list) else v) != as_given[k]}
        require(not differs, f"--resume keeps the protocol's settings ({saved_file}); these differ: "
                             f"{', '.join(f'--{k.replace(chr(95), chr(45))}' for k in differs)}")
        return Protocol(**invocation, **({k: getattr(args, k) for k in SAVED if k != "env"} | saved))
    if env is None:
        require(len(args.env) == 1 and args.env[0] in METHODS,
                f"--env must be one of {', '.join(METHODS)}, got {' '.join(args.env) or 'none'}")
        env = args.env[0]
    scale = args.scale or "paper"
    env_workers = ENV_WORKERS if args.env_workers is None else args.env_workers
    require(scale in SCALES, f"--scale must be one of {', '.join(SCALES)}, got {scale!r}")
    require(scale == "paper" or env in SCALES[scale],
            f"--scale {scale} exists for {', '.join(SCALES[scale])} only, not --env {env}")
    require(not (saved_file.exists() or (out.exists() and any(out.iterdir()))),
            f"{out} already holds a protocol or other files; continue it with --resume, or pass a new OUT_DIR")
    known = METHODS[env]
    unknown = [m for m in args.methods if m not in known]
    require(not unknown, f"unknown methods {unknown} for --env {env}; choose from {', '.join(known)}")
    require(args.seeds is None or args.seeds > 0, f"--seeds must be positive, got {args.seeds}")
    for flag, named in (("--method-seeds", method_seeds(args.method_seeds)),  # (each entry checked)
                        ("--method-steps", method_steps(args.method_steps))):
        stray = sorted(set(named) - set(args.methods or paper_methods(env)))
        require(not stray, f"{flag} names methods this protocol does not run: {stray}")
    require(env_workers > 0 and args.analysis_episodes > 0, "--env-workers and --analysis-episodes must be positive")
    require(len(set(args.devices)) == len(args.devices), f"--devices repeats a device: {' '.join(args.devices)}")
    seeds_apart = args.seeds_apart
    if seeds_apart is None:
        import jax

        seeds_apart = not args.slurm and jax.default_backend() == "cpu"
    protocol = Protocol(**invocation, env=env, methods=args.methods or paper_methods(env),  # seeds: below
                        method_seeds=args.method_seeds, env_workers=env_workers, scale=scale, extra=args.extra,
                        seeds_apart=seeds_apart, method_steps=args.method_steps)
    limit = device_memory_limit() if env in FIT_SEEDS and not args.slurm else None
    per_seed = replay_bytes_per_seed(protocol) if limit is not None else None
    return dataclasses.replace(protocol, seeds=choose_seeds(args.seeds, per_seed, limit))


def extended(out: Path, saved: dict, given: tuple[str, ...]) -> tuple[str, ...]:
    """--resume's --method-steps: the saved entries, with those given added or raised; one line where a given one
    names a method the protocol does not run or is fewer env steps than the method's runs already go to."""
    before, asked = method_steps(saved.get("method_steps", ())), method_steps(given)
    stray = sorted(set(asked) - set(saved["methods"]))
    require(not stray, f"--method-steps names methods this protocol does not run: {stray}")
    for name, wanted in asked.items():
        totals = [RunReader(d).progress()[1] or 0 for d in [out / name, *sorted((out / name).glob("seed*/"))]]
        have = max([*totals, before.get(name, 0)])
        require(wanted >= have, f"--method-steps {name}={wanted} is fewer env steps than its runs already go to "
                                f"({have:,}); a protocol extends a method, it never shortens one")
    return tuple(f"{name}={n}" for name, n in (before | asked).items())


def save_settings(protocol: Protocol) -> None:
    """OUT_DIR/protocol.json: the settings --resume continues the protocol with (SAVED)."""
    (protocol.out_dir / "protocol.json").write_text(json.dumps({k: getattr(protocol, k) for k in SAVED}, indent=1))


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
