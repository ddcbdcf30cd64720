"""The run directory (config.json, checkpoints, resume and overwrite rules), the devices its seeds train on, and
stopping cleanly on Ctrl-C / SIGTERM."""

from __future__ import annotations

import dataclasses
import json
import os
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import jax
import numpy as np

from common.run.checkpoint import load_checkpoint, read_checkpoint_header, save_checkpoint
from common.run.errors import ConfigError, Interrupted, NothingToDo, require
from common.run.logs import RunLogs, drop_rows_after
from common.run.scripts import REPOSITORY_SCRIPTS, is_copy, script_of
from common.run.settings import NOT_SETTINGS, _read_config, default_run_dir, safe_to_change


LOGGED = ("metrics.csv", "eval.csv", "metrics.csv.xz", "eval.csv.xz")
"""a run's tables, as it writes them or as tools.export packs them (common.run.logs.table_path)"""
RUN_FILES = ("config.json", *LOGGED, "checkpoint.eqx")
"""what marks a directory as a run's (an exported copy of a complete run included)"""


def _listed(found: list[str]) -> str:
    return ", ".join(found[:5]) + (", ..." if len(found) > 5 else "")


def _run_files(path: Path) -> list[str]:
    if not path.is_dir():
        return []
    return [n for n in RUN_FILES if (path / n).exists()] + sorted(
        p.name for p in path.iterdir() if p.name.startswith("events.out.tfevents"))


class RunDir:
    """A run directory: where a run writes config.json, metrics.csv, eval.csv, checkpoint.eqx and TensorBoard files.

    Opening it checks everything about the directory before anything is written or compiled: a new run may not land
    on an old one (unless --overwrite moves the old one aside), and --resume needs a readable config.json and
    checkpoint of the same method whose settings match, apart from those safe to change (settings.safe_to_change)."""

    def __init__(self, args, env: str, method: str, total_steps: int):
        """env: babyai, fruitbot or minihack, the env the run trains on (recorded in config.json and in the parameter
        files, where the tools read it)."""
        self.env = env
        self.path = default_run_dir(args)
        self.checkpoint = self.path / "checkpoint.eqx"
        self.method, self.start_step, self.resumed_from, self.saved_step = method, 0, None, None
        self.started_over = False  # --resume of a run stopped before its first checkpoint: it starts again at 0
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
            elif found and _read_config(self.path / "config.json") is not None:
                raise ConfigError(f"{self.path} already holds a run ({_listed(found)}): continue it with --resume "
                                  f"--run-dir {self.path} (or --overwrite moves it aside, or choose another --run-dir)")
            else:
                require(not found, f"{self.path} holds run files without their settings ({_listed(found)}): "
                                   "--overwrite moves them aside, or choose another --run-dir")
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
        found = _run_files(self.path)
        require(found, f"--resume: there is no run in {self.path}; start one there without --resume")
        config = _read_config(self.path / "config.json")
        require(config is not None, f"--resume: {self.path} has no readable config.json ({_listed(found)}), so the "
                                    "run's settings are unknown: --overwrite (without --resume) moves these files "
                                    "aside and starts anew")
        # a setting the run's script did not have yet was its default then: the behaviour before it existed
        saved = {f.name: json.loads(json.dumps(f.default)) for f in dataclasses.fields(args)
                 if f.default is not dataclasses.MISSING} | config["args"]
        given = {k: json.loads(json.dumps(v)) for k, v in dataclasses.asdict(args).items()}
        safe = safe_to_change(args)
        changed = sorted(k for k in given if k not in NOT_SETTINGS + safe and given[k] != saved.get(k))
        require(not changed, f"--resume: {', '.join(changed)} cannot change in a resumed run (saved: "
                             f"{', '.join(f'{k}={saved.get(k)!r}' for k in changed)}); only "
                             f"{', '.join('--' + k.replace('_', '-') for k in safe)} may; start a new --run-dir to "
                             "change the rest")
        if not self.checkpoint.exists():
            self._start_over(args)
            return
        meta = read_checkpoint_header(self.checkpoint)
        require(meta is not None, f"{self.checkpoint} is empty or not a checkpoint; metrics.csv and eval.csv are "
                                  "untouched")
        require(meta.get("method", self.method) == self.method,
                f"{self.checkpoint} holds a {meta.get('method')} run, not {self.method}; pass its own script")
        self.config, self.start_step = config, meta["step"]
        self.saved_step = self.start_step
        self.resumed_from = {k: saved.get(k) for k in safe + ("run_dir",) if given.get(k) != saved.get(k)}
        if self.start_step >= total_steps:
            raise NothingToDo(f"{self.path} finished at step {self.start_step:,}, which covers --total-timesteps "
                              f"{args.total_timesteps:,}: nothing to do (pass a larger --total-timesteps to extend it)")

    def _start_over(self, args) -> None:
        """--resume of a run stopped before its first checkpoint (killed while compiling or filling replay, or
        preempted early): nothing was saved, so it starts again at step 0 with its saved settings; what the killed
        start logged (metrics.csv and eval.csv rows, TensorBoard files) goes to <run-dir>/started-over-<time>/."""
        saved_agents = sorted(p.name for p in self.path.glob("params_seed*.eqx"))
        require(not saved_agents, f"--resume: {self.path} has no checkpoint but holds saved agents "
                                  f"({', '.join(saved_agents[:3])}: it ran with --no-checkpoint), so it cannot "
                                  "continue; --overwrite (without --resume) moves it aside and starts anew")
        aside = self.path / f"started-over-{time.strftime('%Y%m%d-%H%M%S')}"
        logged = [p for p in self.path.iterdir() if p.name in LOGGED or p.name.startswith("events.out.tfevents")]
        if logged:
            aside.mkdir()
            for p in logged:
                p.rename(aside / p.name)
        print(f"no checkpoint yet: starting {self.path} over from step 0 with its saved settings"
              f"{f' (what the stopped start logged: {aside})' if logged else ''}", flush=True)
        self.started_over = True

    def write_config(self, config: dict) -> None:
        """config.json: every resolved argument, package versions and the git commit, plus what the script adds
        (its method, and for a copy of a script its own name: exp_name). On resume: the saved config with the new
        values of what changed, and one more entry in "resumes". No folder of the machine is written: the run
        directory is "." (the folder config.json is in) and the command names the script as the repository does
        (portable_command), so a copied or committed run names nothing its reader does not have."""
        args = self.recorded_args()
        command = portable_command(sys.argv, self.script, self.path)
        if is_copy(self.script):  # a copy is not the method it was copied from: named by its exp_name
            config = config | {"method": self.args.exp_name, "copy_of": config.get("method", self.method)}
        if self.resumed_from is None:
            config = {"args": args, "script": self.script, "env": self.env, **config, "versions": versions(),
                      "command": command}
            if self.started_over:  # a --resume that found no checkpoint: this is the run's first saved start
                config["started_over"] = time.strftime("%Y-%m-%d %H:%M:%S")
        else:
            config = self.config
            config.setdefault("env", self.env)  # (runs saved before config.json recorded it)
            config["args"] = {**config["args"], **{k: args[k] for k in self.resumed_from}, "run_dir": "."}
            config.setdefault("resumes", []).append({
                "step": self.start_step, "time": time.strftime("%Y-%m-%d %H:%M:%S"), "command": command,
                "changed": {k: [old, args.get(k)] for k, old in self.resumed_from.items()}, "versions": versions()})
        tmp = self.path / "config.json.tmp"
        tmp.write_text(json.dumps(portable_config(config), indent=2))
        os.replace(tmp, self.path / "config.json")

    def restore(self, skeleton):
        """The checkpoint's state and step; rows logged after the checkpoint are dropped (they will be logged again).
        A run started over (no checkpoint yet) continues from the fresh state it was given, at step 0."""
        if self.started_over:
            return skeleton, 0
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
        header = {"step": step, "method": self.method, "script": self.script, "env": self.env,
                  "args": self.recorded_args()}
        for i, seed in enumerate(seeds):
            save_checkpoint(self.path / f"params_seed{seed}.eqx", jax.tree.map(lambda x: x[i], params),
                            header | {"seed": seed}, f"free space, then resume with: {self.resume_command()}")

    def out_of_time(self) -> bool:
        """Whether --max-minutes of wall time have passed since the run started (compilation included)."""
        return self.args.max_minutes is not None and time.monotonic() - self.opened >= 60 * self.args.max_minutes

    def checkpoint_due(self) -> bool:
        """Whether --checkpoint-minutes of wall time have passed since the last checkpoint."""
        return time.monotonic() - self.last_save >= 60 * self.args.checkpoint_minutes

    def recorded_args(self) -> dict:
        """The arguments as config.json and the parameter files keep them: the run directory as "." (theirs)."""
        return dataclasses.asdict(self.args) | {"run_dir": "."}

    def resume_command(self) -> str:
        return f"python {Path(sys.argv[0]).name} --resume --run-dir {self.path}"

    def open_logs(self, metric_fields: list[str]) -> "RunLogs":
        return RunLogs(self.path, self.args, metric_fields)


def portable_config(config: dict, run_dir_as: str | None = None) -> dict:
    """A config.json as it is written and exported: args.run_dir "." (the folder of config.json), every command's
    script named as config["script"] names it, and its --run-dir relative to that folder: `run_dir_as` if given
    ("seed1": the first seed's command in a merged run), else "." where it was an absolute path. So a committed or
    copied run names no folder of the machine it ran on. Configs written before runs recorded them this way become
    so (tools.export); applying it twice changes nothing."""
    def relative(run_dir: str) -> str:
        return run_dir_as if run_dir_as is not None else "." if Path(run_dir).is_absolute() else run_dir

    def command(text: str) -> str:
        try:
            words = shlex.split(text)
        except ValueError:
            return text
        if not words:
            return text
        script = str(config.get("script", ""))
        if script and not Path(script).is_absolute() and Path(words[0]).name == Path(script).name:
            words[0] = script  # as the repository names it
        elif Path(words[0]).stem in REPOSITORY_SCRIPTS:  # (older runs recorded no script, or where it lay)
            words[0] = Path(words[0]).name
        for i, word in enumerate(words):
            if word == "--run-dir" and i + 1 < len(words):
                words[i + 1] = relative(words[i + 1])
            elif word.startswith("--run-dir="):
                words[i] = f"--run-dir={relative(word.split('=', 1)[1])}"
        return shlex.join(words)

    out = json.loads(json.dumps(config))
    out.setdefault("args", {})["run_dir"] = "."
    if "command" in out:
        out["command"] = command(out["command"])
    for resume in out.get("resumes", []):
        resume["command"] = command(resume.get("command", ""))
        resume.get("changed", {}).pop("run_dir", None)  # where a run lies is not a setting
    return out


def portable_command(argv: list[str], script: str, run_path: Path) -> str:
    """A run's command line as config.json records it: the script as script_of names it (its path in the
    repository, or a copy's own path outside it) and the run directory as "." (the folder of config.json)."""
    def same(word: str) -> bool:
        try:
            return Path(word).resolve() == run_path.resolve()
        except (OSError, ValueError):
            return False

    words = [script]
    for word in argv[1:]:
        if word.startswith("--run-dir=") and same(word.split("=", 1)[1]):
            word = "--run-dir=."
        words.append("." if same(word) else word)
    return shlex.join(words)


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
