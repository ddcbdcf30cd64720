"""Run plumbing shared by the training scripts: one-line errors, the run directory and its files (config.json,
metrics.csv, eval.csv, checkpoint.eqx, TensorBoard, wandb), resuming, and stopping cleanly. Nothing here is part of
an RL algorithm: the scripts hold their whole method; this module writes down what they measure and keeps what they
need to resume.

A run never loses more than a few minutes of work and never mixes with another run:
- checkpoints are written at every evaluation, every --checkpoint-minutes of wall time and on Ctrl-C / SIGTERM,
  always at a chunk boundary and atomically (a crash mid-write leaves the previous checkpoint whole);
- a run directory that holds any run file is refused unless --resume (continue it) or --overwrite (move the old
  directory aside; nothing is ever deleted);
- --resume takes every setting from the saved config.json; only SAFE_TO_CHANGE may be given anew, and each resume is
  recorded there. The directory's location is not a setting, so a moved or copied run resumes.
"""

from __future__ import annotations

import csv
import dataclasses
import functools
import json
import math
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import equinox as eqx
import jax
import numpy as np
import tyro

EVAL_FIELDS = ["step", "seed", "split", "task", "gpi", "episodes", "return_mean", "return_std"]
"""the columns of eval.csv (a contract: results/ and other tools read them)"""

RUN_FILES = ("config.json", "metrics.csv", "eval.csv", "checkpoint.eqx")
SAFE_TO_CHANGE = ("total_timesteps", "eval_every", "log_every", "track", "checkpoint_minutes", "checkpoint",
                  "max_minutes", "wandb_project_name", "wandb_entity", "env_workers", "core_backend")
"""settings a resumed run may change: they decide how long it runs, what it records, how many processes step the
host envs (the same episodes either way) or how FARM's recurrence is computed (the same function; pallas-bf16
close to it), not what it learns"""
NOT_SETTINGS = ("run_dir", "resume", "overwrite")
"""arguments that say where and how to start, not what the run is"""


def format_task(w) -> str:
    """A task vector as written in eval.csv's task column and the tables: comma-separated, shortest exact form
    (e.g. -1,1,-1,0.5). One definition for every env, so results/ matches rows across envs and runs."""
    return ",".join(f"{float(x):g}" for x in np.asarray(w))


# =====================================================================================================================
# One clear line instead of a traceback
# =====================================================================================================================
class StopRun(Exception):
    """Stop the program with one line on stderr and an exit status."""

    code = 1
    prefix = "error: "


class ConfigError(StopRun, ValueError):
    """A user-supplied setting is invalid; the message says what is wrong and what to do."""

    code = 2


class NothingToDo(StopRun):
    """Not an error: say why there is nothing to do and exit with status 0."""

    code = 0
    prefix = ""


class Interrupted(StopRun):
    prefix = ""

    def __init__(self, message: str, signum: int):
        super().__init__(message)
        self.code = 128 + signum


class SaveFailed(StopRun):
    """A checkpoint or parameter file could not be written (no space, no permission, an I/O error)."""


def require(condition: bool, message: str) -> None:
    """Raise ConfigError(message) unless condition holds."""
    if not condition:
        raise ConfigError(message)


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def require_positive(args, *names: str) -> None:
    for name in names:
        require(getattr(args, name) > 0, f"{_flag(name)} must be positive, got {getattr(args, name)}")


def require_non_negative(args, *names: str) -> None:
    for name in names:
        require(getattr(args, name) >= 0, f"{_flag(name)} must not be negative, got {getattr(args, name)}")


def require_fraction(args, *names: str) -> None:
    for name in names:
        require(0 <= getattr(args, name) <= 1, f"{_flag(name)} must be in [0, 1], got {getattr(args, name)}")


def exit_on_config_error(main):
    """Wrap a CLI entry point so a StopRun prints one line (`error: ...`) and exits with its status."""

    @functools.wraps(main)
    def wrapped(*args, **kwargs):
        try:
            return main(*args, **kwargs)
        except StopRun as e:
            print(f"{e.prefix}{e}", file=sys.stderr, flush=True)
            raise SystemExit(e.code) from None

    return wrapped


# =====================================================================================================================
# Arguments: --resume takes the saved run's settings
# =====================================================================================================================
def default_run_dir(args) -> Path:
    return Path(args.run_dir or f"runs/{args.exp_name}__{args.seed}")


RETIRED_SETTINGS = ("learner_unroll", "joint_target_unroll", "lstm_grad_after_loop")
"""speed-only settings that scripts no longer have (superseded by --core-backend): a saved run's values for them
changed how fast it ran, not what it computed, so loading its config.json drops them"""


def _as_args(cls, saved: dict):
    """The dataclass `cls` from a config.json "args" dict (JSON lists back to tuples; RETIRED_SETTINGS dropped)."""
    saved = {k: v for k, v in saved.items() if k not in RETIRED_SETTINGS}
    fields = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(saved) - fields)
    require(not unknown, f"config.json has settings this script does not know: {unknown}; it belongs to another "
                         "script or version")
    return cls(**{k: tuple(v) if isinstance(v, list) else v for k, v in saved.items()})


def _read_config(path: Path) -> dict:
    try:
        config = json.loads(path.read_text())
        return config if isinstance(config, dict) and isinstance(config.get("args"), dict) else None
    except (OSError, ValueError):
        return None


@exit_on_config_error
def parse_args(cls, argv: list[str] | None = None):
    """The command line as `cls` (tyro). With --resume, every setting not on the command line comes from the run's
    saved config.json, so `python script.py --resume --run-dir D` is enough."""
    args = tyro.cli(cls, args=argv)
    if not args.resume:
        return args
    run_dir = default_run_dir(args)
    config = _read_config(run_dir / "config.json")
    if config is None:  # RunDir explains what is missing
        return args
    saved = dataclasses.replace(_as_args(cls, config["args"]), run_dir=str(run_dir), resume=True)
    return tyro.cli(cls, args=argv, default=saved)


# =====================================================================================================================
# Files of a run
# =====================================================================================================================
VERSIONED = ("jax", "jaxlib", "equinox", "optax", "flashbax", "gymnax", "minigrid", "procgen-mirror", "nle", "minihack",
             "numpy")
"""packages whose versions config.json records"""


def versions(names: tuple[str, ...] = VERSIONED) -> dict:
    """Package versions (None for one not installed: a run of one env needs none of the other envs' packages, e.g.
    a MiniHack-only install has no minigrid) and the git commit, recorded in config.json."""
    from importlib.metadata import PackageNotFoundError, version

    out = {}
    for name in names:
        try:
            out[name] = version(name)
        except PackageNotFoundError:
            out[name] = None
    try:
        out["git_commit"] = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True,
                                           cwd=Path(__file__).parent, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        out["git_commit"] = None
    return out


def peak_rss_gb() -> float:
    """Peak resident memory of this process (replay included), in GB."""
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e6  # Linux reports KiB


class CsvLog:
    """Append rows to a CSV file, writing the header once. A file that exists keeps its header: a run resumed by a
    newer version of its script goes on without the columns that version added."""

    def __init__(self, path: Path, fields: list[str]):
        self.path, self.fields = path, fields
        if path.exists() and path.stat().st_size:
            with path.open(newline="") as f:
                self.fields = next(csv.reader(f))
            require(self.fields[:1] == fields[:1],
                    f"{path} does not start with a header line ({','.join(fields[:3])},...): another process wrote "
                    "to it; move the run directory away or start a new one")
        else:
            with path.open("w", newline="") as f:
                csv.writer(f).writerow(fields)

    def write(self, rows: list[dict]):
        try:
            with self.path.open("a", newline="") as f:
                csv.DictWriter(f, self.fields, extrasaction="ignore").writerows(rows)
        except OSError as error:
            raise SaveFailed(f"could not append to {self.path}: {error.strerror or error}; the rows up to the last "
                             "checkpoint are kept (a resume logs the rest again)") from None


def drop_rows_after(path: Path, step: int) -> None:
    """Keep the CSV rows with step <= `step` (a run stopped after its last checkpoint logged rows that resuming
    redoes)."""
    if not path.exists():
        return
    with path.open(newline="") as f:
        rows = list(csv.reader(f))
    kept = [rows[0]] + [r for r in rows[1:] if int(r[0]) <= step]
    if len(kept) < len(rows):
        with path.open("w", newline="") as f:
            csv.writer(f).writerows(kept)


def _os_error(error: BaseException) -> OSError | None:
    """The OSError behind an exception (equinox wraps the file's errors in its own), or None."""
    while error is not None:
        if isinstance(error, OSError):
            return error
        error = error.__cause__ or error.__context__
    return None


def _size(num_bytes: float) -> str:
    return f"{num_bytes / 2**30:.2f} GiB" if num_bytes >= 2**30 else f"{num_bytes / 2**20:.1f} MiB"


def save_checkpoint(path: Path, state, meta: dict, resume_hint: str = "") -> None:
    """One JSON header line, then every leaf of the train state (replay included), written atomically: into
    <path>.tmp, renamed over <path> once complete. A write that fails (a full disk, no permission, an I/O error)
    removes the partial file, leaves the previous <path> as it was, and stops with one line (SaveFailed) naming
    the file, the reason, the space needed against the space free, and what to do."""
    tmp = path.with_suffix(".tmp")
    try:
        with tmp.open("wb") as f:
            f.write((json.dumps(meta) + "\n").encode())
            eqx.tree_serialise_leaves(f, state)
        os.replace(tmp, path)
    except Exception as error:
        cause = _os_error(error)
        if cause is None:
            raise
        tmp.unlink(missing_ok=True)
        need = _size(sum(getattr(x, "nbytes", 0) for x in jax.tree.leaves(state)))
        try:
            free = f"{_size(shutil.disk_usage(path.parent).free)} free"
        except OSError:
            free = "free space unknown"
        kept = read_checkpoint_header(path) if path.exists() else None
        last = (f"the last good {path.name} (step {kept['step']:,}) is kept" if kept else f"no earlier {path.name} "
                "exists")
        raise SaveFailed(f"could not write {path}: {cause.strerror or cause} (it needs {need}, {free}); {last}; "
                         f"{resume_hint or 'free space and run again'}") from None


def read_checkpoint_header(path: Path) -> dict | None:
    """The checkpoint's JSON header ({"step", "seeds", "method"}), or None if the file is empty or not one."""
    try:
        with path.open("rb") as f:
            meta = json.loads(f.readline().decode())
        return meta if isinstance(meta, dict) and isinstance(meta.get("step"), int) else None
    except (OSError, ValueError):
        return None


def load_checkpoint(path: Path, skeleton):
    """(state, meta) from a checkpoint written by save_checkpoint; skeleton gives the structure and shapes.
    Raises ConfigError (one line) if the file is truncated or holds another run's state."""
    with path.open("rb") as f:
        meta = json.loads(f.readline().decode())
        try:
            state = eqx.tree_deserialise_leaves(f, skeleton)
            trailing = f.read(1)
        except Exception as e:  # equinox raises several types for short or mismatched files
            raise ConfigError(f"{path} is truncated, holds another run's state, or was written by a version of "
                              f"the script with another replay layout ({type(e).__name__}); metrics.csv and eval.csv "
                              "are untouched") from None
    require(not trailing, f"{path} is longer than this run's state: it belongs to another run or settings; "
                          "metrics.csv and eval.csv are untouched")
    return state, meta


# =====================================================================================================================
# The script that trained a run: config.json and every parameter file name it, so that the results tools rebuild
# the agent with that script (a copy with another network or loss included)
# =====================================================================================================================
ROOT = Path(__file__).resolve().parent.parent


def script_of(args) -> str:
    """The file of the script whose Args `args` is: relative to the repository root when inside it."""
    path = Path(sys.modules[type(args).__module__].__file__).resolve()
    try:
        return str(path.relative_to(ROOT))
    except ValueError:
        return str(path)


def load_script(script: str, origin: str = ""):
    """The module of a training script named by a run (a path relative to the repository root, or absolute).
    A missing file stops with one line saying which run needs it."""
    path = Path(script) if Path(script).is_absolute() else ROOT / script
    require(path.is_file(), f"{origin or 'the run'} was trained by {script}, which is not there (moved or deleted): "
                            "put the script back at that path to rebuild its agent")
    return _import_script(path.resolve())


@functools.lru_cache(maxsize=None)
def _import_script(path: Path):
    import importlib.util

    if path.parent == ROOT:  # a script of the repository, or a copy next to them: the importable module
        import importlib

        return importlib.import_module(path.stem)
    name = f"_script_{path.stem}_{abs(hash(str(path))) % 10**8}"
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # its dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


# =====================================================================================================================
# The run directory
# =====================================================================================================================
def _run_files(path: Path) -> list[str]:
    if not path.is_dir():
        return []
    return [n for n in RUN_FILES if (path / n).exists()] + sorted(
        p.name for p in path.iterdir() if p.name.startswith("events.out.tfevents"))


class RunDir:
    """A run directory: where a run writes config.json, metrics.csv, eval.csv, checkpoint.eqx and TensorBoard files.

    Opening it checks everything about the directory before anything is written or compiled: a new run may not land
    on an old one (unless --overwrite moves the old one aside), and --resume needs a readable config.json and
    checkpoint of the same method whose settings match, apart from SAFE_TO_CHANGE."""

    def __init__(self, args, method: str, total_steps: int):
        self.path = default_run_dir(args)
        self.checkpoint = self.path / "checkpoint.eqx"
        self.method, self.start_step, self.resumed_from, self.saved_step = method, 0, None, None
        require(not self.path.exists() or self.path.is_dir(), f"--run-dir {self.path} is a file; pass a directory")
        require(not (args.resume and args.overwrite), "--resume and --overwrite exclude each other: pick one")
        if args.resume:
            self._check_resume(args, total_steps)
        else:
            found = _run_files(self.path)
            if found and args.overwrite:
                aside = self.path.with_name(f"{self.path.name}.replaced-{time.strftime('%Y%m%d-%H%M%S')}")
                require(not aside.exists(), f"--overwrite: {aside} exists already; try again in a second")
                self.path.rename(aside)
                print(f"moved the old run in {self.path} aside to {aside}", flush=True)
            else:
                require(not found, f"{self.path} already holds a run ({', '.join(found[:5])}"
                                   f"{', ...' if len(found) > 5 else ''}): pass --resume to continue it, or choose "
                                   "another --run-dir (--overwrite moves the old run aside)")
        try:
            self.path.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise ConfigError(f"--run-dir {self.path} cannot be created ({e.strerror}); pass a writable directory") \
                from None
        require(os.access(self.path, os.W_OK | os.X_OK), f"--run-dir {self.path} is not writable; pass a writable "
                                                          "directory")
        self.args = args
        self.script = script_of(args)
        self.opened = self.last_save = time.monotonic()

    def _check_resume(self, args, total_steps: int) -> None:
        require(self.checkpoint.exists(), f"--resume: no checkpoint at {self.checkpoint} (run files there: "
                                          f"{', '.join(_run_files(self.path)) or 'none'}); start a run there first")
        config = _read_config(self.path / "config.json")
        require(config is not None, f"--resume: {self.path / 'config.json'} is missing or unreadable; the run's "
                                    "settings are unknown, so it cannot be resumed")
        # a setting the run's script did not have yet was its default then: the behaviour before it existed
        saved = {f.name: json.loads(json.dumps(f.default)) for f in dataclasses.fields(args)
                 if f.default is not dataclasses.MISSING} | config["args"]
        given = {k: json.loads(json.dumps(v)) for k, v in dataclasses.asdict(args).items()}
        changed = sorted(k for k in given if k not in NOT_SETTINGS + SAFE_TO_CHANGE and given[k] != saved.get(k))
        require(not changed, f"--resume: {', '.join(changed)} cannot change in a resumed run (saved: "
                             f"{', '.join(f'{k}={saved.get(k)!r}' for k in changed)}); only "
                             f"{', '.join('--' + k.replace('_', '-') for k in SAFE_TO_CHANGE)} may; start a new "
                             "--run-dir to change the rest")
        meta = read_checkpoint_header(self.checkpoint)
        require(meta is not None, f"{self.checkpoint} is empty or not a checkpoint; metrics.csv and eval.csv are "
                                  "untouched")
        require(meta.get("method", self.method) == self.method,
                f"{self.checkpoint} holds a {meta.get('method')} run, not {self.method}; pass its own script")
        self.config, self.start_step = config, meta["step"]
        self.saved_step = self.start_step
        self.resumed_from = {k: saved.get(k) for k in SAFE_TO_CHANGE + ("run_dir",) if given.get(k) != saved.get(k)}
        if self.start_step >= total_steps:
            raise NothingToDo(f"{self.path} finished at step {self.start_step:,}, which covers --total-timesteps "
                              f"{args.total_timesteps:,}: nothing to do (pass a larger --total-timesteps to extend it)")

    def write_config(self, config: dict) -> None:
        """config.json: every resolved argument, package versions and the git commit, plus what the script adds.
        On resume: the saved config with the new values of what changed, and one more entry in "resumes"."""
        args = dataclasses.asdict(self.args)
        command = " ".join(sys.argv)
        if self.resumed_from is None:
            config = {"args": args, "script": self.script, **config, "versions": versions(), "command": command}
        else:
            config = self.config
            config["args"] = {**config["args"], **{k: args[k] for k in self.resumed_from}}  # run_dir: where it is now
            config.setdefault("resumes", []).append({
                "step": self.start_step, "time": time.strftime("%Y-%m-%d %H:%M:%S"), "command": command,
                "changed": {k: [old, args.get(k)] for k, old in self.resumed_from.items()}, "versions": versions()})
        tmp = self.path / "config.json.tmp"
        tmp.write_text(json.dumps(config, indent=2))
        os.replace(tmp, self.path / "config.json")

    def restore(self, skeleton):
        """The checkpoint's state and step; rows logged after the checkpoint are dropped (they will be logged again)."""
        state, meta = load_checkpoint(self.checkpoint, skeleton)
        for name in ("metrics.csv", "eval.csv"):
            drop_rows_after(self.path / name, meta["step"])
        print(f"resumed {self.path} at step {meta['step']:,}", flush=True)
        return state, meta["step"]

    def save(self, state, step: int, seeds: list[int]) -> None:
        """Write the checkpoint (once per step: a stop right after an evaluation does not write it twice; never with
        --no-checkpoint)."""
        if self.args.checkpoint and step != self.saved_step:
            save_checkpoint(self.checkpoint, state, {"step": step, "seeds": seeds, "method": self.method},
                            f"free space, then resume with: {self.resume_command()}")
            self.saved_step, self.last_save = step, time.monotonic()

    def save_params(self, params, step: int, seeds: list[int]) -> None:
        """params_seed<N>.eqx for every seed: the online parameters alone (a few MB; what analysis reads and what a
        GPU machine can bring back), with a JSON header holding the step, the seed, the method and the run's
        arguments, from which a script rebuilds the network to load them into. Only the latest are kept."""
        header = {"step": step, "method": self.method, "script": self.script, "args": dataclasses.asdict(self.args)}
        for i, seed in enumerate(seeds):
            save_checkpoint(self.path / f"params_seed{seed}.eqx", jax.tree.map(lambda x: x[i], params),
                            header | {"seed": seed}, f"free space, then resume with: {self.resume_command()}")

    def out_of_time(self) -> bool:
        """Whether --max-minutes of wall time have passed since the run started (compilation included)."""
        return self.args.max_minutes is not None and time.monotonic() - self.opened >= 60 * self.args.max_minutes

    def checkpoint_due(self) -> bool:
        """Whether --checkpoint-minutes of wall time have passed since the last checkpoint."""
        return time.monotonic() - self.last_save >= 60 * self.args.checkpoint_minutes

    def resume_command(self) -> str:
        return f"python {Path(sys.argv[0]).name} --resume --run-dir {self.path}"

    def open_logs(self, metric_fields: list[str]) -> "RunLogs":
        return RunLogs(self, metric_fields)


def _quiet_writer_threads() -> None:
    """TensorBoard writes its event file from a thread; on a full disk that thread would print a traceback of its
    own beside the run's one line. Its OSErrors are dropped (the next checkpoint or CSV write reports the disk);
    every other thread error is shown as before."""
    import threading

    if getattr(threading.excepthook, "quiet_os_errors", False):
        return
    previous = threading.excepthook

    def hook(args):
        if not issubclass(args.exc_type, OSError):
            previous(args)

    hook.quiet_os_errors = True
    threading.excepthook = hook


class RunLogs:
    """metrics.csv, eval.csv and TensorBoard (and wandb with --track), per seed."""

    def __init__(self, run: RunDir, metric_fields: list[str]):
        from tensorboardX import SummaryWriter

        self.metrics = CsvLog(run.path / "metrics.csv", metric_fields)
        self.evals = CsvLog(run.path / "eval.csv", EVAL_FIELDS)
        self.writer = SummaryWriter(str(run.path))
        _quiet_writer_threads()
        args = run.args
        if args.track:
            import wandb

            wandb.init(project=args.wandb_project_name, entity=args.wandb_entity, config=dataclasses.asdict(args),
                       name=run.path.name, dir=str(run.path), sync_tensorboard=True, resume="allow")

    def write_metrics(self, rows: list[dict]) -> None:
        """One row per seed: to metrics.csv, and every filled-in number to TensorBoard as seed<N>/<name>."""
        self.metrics.write(rows)
        for row in rows:
            for k, v in row.items():
                if k not in ("step", "seed") and v != "":
                    self.writer.add_scalar(f"seed{row['seed']}/{k}", v, row["step"])

    def write_eval(self, rows: list[dict]) -> None:
        """eval.csv rows, and their mean returns to TensorBoard as seed<N>/eval_<split>_gpi<g>/<task>."""
        for r in rows:
            self.writer.add_scalar(f"seed{r['seed']}/eval_{r['split']}_gpi{r['gpi']}/{r['task']}", r["return_mean"],
                                   r["step"])
        self.evals.write(rows)

    def close(self) -> None:
        try:
            self.writer.close()
        except OSError:  # a full disk: the one line comes from the write that failed first
            pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False


def shard_seeds(state, num_seeds: int):
    """Spread the leading (seed) axis of every leaf of `state` over the local devices (several GPUs, or CPU cores
    with XLA_FLAGS=--xla_force_host_platform_device_count=N), so that seeds train in parallel; within a device they
    stay vmapped. Uses the most devices that divide num_seeds; one device: unchanged."""
    devices = jax.local_devices()
    count = max(d for d in range(1, len(devices) + 1) if num_seeds % d == 0)
    if count == 1:
        return state
    mesh = jax.sharding.Mesh(np.asarray(devices[:count]), ("seed",))
    print(f"{num_seeds} seeds over {count} devices", flush=True)
    return jax.device_put(state, jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec("seed")))


# =====================================================================================================================
# Stopping: Ctrl-C / SIGTERM, and losses that are no longer numbers
# =====================================================================================================================
class StopSignals:
    """While active, the first Ctrl-C or SIGTERM only asks the training loop to stop at the next chunk boundary
    (it saves a checkpoint and raises Interrupted); a second one kills the process at once (the default action)."""

    SIGNALS = (signal.SIGINT, signal.SIGTERM)

    def __enter__(self):
        self.received = None
        self.previous = {s: signal.signal(s, self._handle) for s in self.SIGNALS}
        return self

    def _handle(self, signum, frame):
        self.received = signum
        for s in self.SIGNALS:
            signal.signal(s, signal.SIG_DFL)

    def __exit__(self, *exc):
        for s, handler in self.previous.items():
            signal.signal(s, handler)
        return False

    def stop_if_asked(self, run: RunDir, state, step: int, seeds: list[int]) -> None:
        """At a chunk boundary: if a signal came, save a checkpoint and stop with the command that resumes."""
        if self.received is not None:
            name = signal.Signals(self.received).name
            if not run.args.checkpoint:
                raise Interrupted(f"stopped at step {step:,} ({name}); --no-checkpoint: nothing to resume from",
                                  self.received)
            run.save(state, step, seeds)
            raise Interrupted(f"stopped at step {step:,} ({name}); checkpoint saved; resume with: "
                              f"{run.resume_command()}", self.received)


CUMULANT_SUMS = ("count", "phi", "phi_sq", "env", "env_sq", "phi_env", "pickups", "error_pickup", "error_other")
"""The sums over transitions [9, C] (this order) that a script with learned cumulants reports per SGD step as
"cumulant_stats" (its function `cumulant_stats`, which results/analyze.py also calls on greedy episodes): per
category k, the count of transitions, sum phi^k, sum (phi^k)^2, sum phi_env^k, sum (phi_env^k)^2,
sum phi^k phi_env^k, the number of pickups of category k (phi_env^k != 0), and sum |phi^k - phi_env^k| over the
pickup and the other transitions. Sums, not means, so that SGD steps and chunks pool exactly."""


def cumulant_quality(sums) -> dict[str, np.ndarray]:
    """How well learned cumulants track the env's pickups, per category k, from CUMULANT_SUMS [9, C]: "corr" (the
    Pearson correlation of phi^k with phi_env^k), "error_pickup" and "error_other" (mean |phi^k - phi_env^k| on
    the transitions that picked up category k and on the rest). NaN where undefined (no pickups, or no variance).
    Not yet learned: corr near 0; learned the wrong thing: corr high but errors large (an offset or a scale)."""
    n, sx, sxx, sy, syy, sxy, picks, err_pick, err_other = np.asarray(sums, np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        cov = n * sxy - sx * sy
        var = (n * sxx - sx**2) * (n * syy - sy**2)
        corr = np.where(var > 0, cov / np.sqrt(np.maximum(var, 1e-300)), np.nan)
        return {"corr": corr, "error_pickup": np.where(picks > 0, err_pick / picks, np.nan),
                "error_other": np.where(n - picks > 0, err_other / (n - picks), np.nan)}


def cumulant_columns(num_categories: int) -> list[str]:
    """metrics.csv's cumulant-quality columns (category k = 1..C)."""
    return [f"phi_{name}_{k + 1}" for name in ("corr", "error_pickup", "error_other") for k in range(num_categories)]


def metric_fields(loss_names: tuple[str, ...], train_tasks: list[str], num_cumulants: int = 0) -> list[str]:
    """The columns of metrics.csv: step, seed, sps, ..., the losses, the quality of learned cumulants (methods that
    learn them: num_cumulants > 0), the mean length of the training episodes, the training return per train task,
    and how many training episodes of each task ended in the row's stretch (so that a window's mean return can be
    pooled over episodes and given a standard error)."""
    return (["step", "seed", "sps", "sgd_steps", "epsilon", *loss_names, "rss_gb", *cumulant_columns(num_cumulants),
             "episode_length"] + [f"return_train_{w}" for w in train_tasks]
            + [f"episodes_train_{w}" for w in train_tasks])


def metric_rows(metrics: dict, sgd_steps, seeds: list[int], step: int, sps: float, loss_names: tuple[str, ...],
                train_tasks: list[str]) -> list[dict]:
    """metrics.csv rows of every seed from a chunk's metrics [seeds, iterations, ...]: losses average the
    iterations that learned ("learning" > 0), training returns the episodes that ended in the chunk ("return_sum",
    "return_count" per train task), and episode_length their mean length in env steps ("length_sum": in Fruitbot a
    lifetime's, so it shows survival before returns move); "" where there were none."""
    rows = []
    for i, seed in enumerate(seeds):
        m = {k: v[i] for k, v in metrics.items()}
        learning = m["learning"] > 0
        row = {"step": step, "seed": seed, "sps": round(sps, 1), "sgd_steps": int(sgd_steps[i]),
               "epsilon": float(m["epsilon"].mean()), "rss_gb": round(peak_rss_gb(), 2)}
        for k in loss_names:
            row[k] = float(m[k][learning].mean()) if learning.any() else ""
        if "cumulant_stats" in m:  # pooled over the chunk's SGD steps (learned cumulants' replayed transitions)
            quality = cumulant_quality(np.asarray(m["cumulant_stats"])[learning].sum(0))
            for name, values in quality.items():
                for k, v in enumerate(values):
                    row[f"phi_{name}_{k + 1}"] = "" if np.isnan(v) else round(float(v), 5)
        counts, sums = m["return_count"].sum(0), m["return_sum"].sum(0)
        row["episode_length"] = float(m["length_sum"].sum() / counts.sum()) if counts.sum() else ""
        for t, w in enumerate(train_tasks):
            row[f"return_train_{w}"] = float(sums[t] / counts[t]) if counts[t] else ""
            row[f"episodes_train_{w}"] = int(counts[t])
        rows.append(row)
    return rows


def progress_line(rows: list[dict], total_steps: int, eta_seconds: float) -> str:
    """The progress line of a chunk's metrics rows (one per seed): steps, SPS, ETA, mean train return, mean episode
    length and loss."""
    returns = [v for r in rows for k, v in r.items() if k.startswith("return_train") and v != ""]
    lengths = [r["episode_length"] for r in rows if r["episode_length"] != ""]
    loss = [r["loss"] for r in rows if r["loss"] != ""]
    return (f"step {rows[0]['step']:,}/{total_steps:,} | {rows[0]['sps']:,.0f} SPS | ETA {eta_seconds / 60:.1f} min | "
            f"train return {f'{np.mean(returns):.2f}' if returns else '-'} | "
            f"episode length {f'{np.mean(lengths):.0f}' if lengths else '-'} | "
            f"loss {f'{np.mean(loss):.4f}' if loss else '-'} | sgd steps {rows[0]['sgd_steps']:,} | "
            f"RSS {peak_rss_gb():.1f} GB")


def eval_line(rows: list[dict]) -> str:
    """One line for an evaluation's eval.csv rows: mean train return (no GPI), mean test return (GPI if there)."""
    gpi = max(r["gpi"] for r in rows)
    train = [r["return_mean"] for r in rows if r["split"] == "train" and r["gpi"] == 0]
    test = [r["return_mean"] for r in rows if r["split"] == "test" and r["gpi"] == gpi]
    return (f"eval @ {rows[0]['step']:,}: train return {np.mean(train):.2f}, test return "
            f"({'GPI' if gpi else 'no GPI'}) {np.mean(test):.2f}")


def require_finite(rows: list[dict], names: tuple[str, ...], run: RunDir) -> None:
    """Stop (keeping the last good checkpoint) if a loss of a metrics row is NaN or infinite."""
    for row in rows:
        for k in names:
            if row[k] != "" and not math.isfinite(row[k]):
                raise StopRun(f"step {row['step']:,}: {k} became {row[k]} (seed {row['seed']}); stopped without "
                              f"saving; {run.checkpoint} keeps the last good state")
