"""Run plumbing shared by the training scripts: one-line errors, the run directory and its files (config.json,
metrics.csv, eval.csv, checkpoint.eqx, TensorBoard, wandb). Nothing here is part of an RL algorithm: the scripts
hold their whole method, this module only writes down what they measure and saves what they need to resume.
"""

from __future__ import annotations

import csv
import dataclasses
import functools
import json
import os
import subprocess
import sys
from pathlib import Path

import equinox as eqx

EVAL_FIELDS = ["step", "seed", "split", "task", "gpi", "episodes", "return_mean", "return_std"]
"""the columns of eval.csv (a contract: results/ and other tools read them)"""


# =====================================================================================================================
# One clear line for bad input, instead of a traceback
# =====================================================================================================================
class ConfigError(ValueError):
    """A user-supplied setting is invalid; the message says what is wrong and what to do."""


def require(condition: bool, message: str) -> None:
    """Raise ConfigError(message) unless condition holds."""
    if not condition:
        raise ConfigError(message)


def exit_on_config_error(main):
    """Wrap a CLI entry point so a ConfigError prints `error: ...` and exits with status 2."""

    @functools.wraps(main)
    def wrapped(*args, **kwargs):
        try:
            return main(*args, **kwargs)
        except ConfigError as e:
            print(f"error: {e}", file=sys.stderr)
            raise SystemExit(2) from None

    return wrapped


# =====================================================================================================================
# Files of a run
# =====================================================================================================================
def versions() -> dict:
    """Package versions and the git commit, recorded in config.json."""
    from importlib.metadata import version

    names = ("jax", "jaxlib", "equinox", "optax", "flashbax", "gymnax", "minigrid", "numpy")
    out = {n: version(n) for n in names}
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
    """Append rows to a CSV file, writing the header once."""

    def __init__(self, path: Path, fields: list[str]):
        self.path, self.fields = path, fields
        if not path.exists():
            with path.open("w", newline="") as f:
                csv.writer(f).writerow(fields)

    def write(self, rows: list[dict]):
        with self.path.open("a", newline="") as f:
            csv.DictWriter(f, self.fields).writerows(rows)


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


def save_checkpoint(path: Path, state, meta: dict) -> None:
    """One JSON header line, then every leaf of the train state (replay included), written atomically."""
    tmp = path.with_suffix(".tmp")
    with tmp.open("wb") as f:
        f.write((json.dumps(meta) + "\n").encode())
        eqx.tree_serialise_leaves(f, state)
    os.replace(tmp, path)


def load_checkpoint(path: Path, skeleton):
    """(state, meta) from a checkpoint written by save_checkpoint; skeleton gives the structure and shapes."""
    with path.open("rb") as f:
        meta = json.loads(f.readline().decode())
        return eqx.tree_deserialise_leaves(f, skeleton), meta


class RunDir:
    """A run directory: where a run writes config.json, metrics.csv, eval.csv, checkpoint.eqx and TensorBoard files.

    Opening it checks that a new run does not land on an old one and that --resume finds a checkpoint of a run with
    the same settings (only --total-timesteps and --track may change)."""

    def __init__(self, args):
        self.path = Path(args.run_dir or f"runs/{args.exp_name}__{args.seed}")
        self.checkpoint = self.path / "checkpoint.eqx"
        if args.resume:
            require(self.checkpoint.exists(), f"--resume: no checkpoint at {self.checkpoint}; start a run there first")
            saved = json.loads((self.path / "config.json").read_text())["args"]
            changed = {k: v for k, v in dataclasses.asdict(args).items()
                       if k not in ("resume", "total_timesteps", "track") and json.loads(json.dumps(v)) != saved.get(k)}
            require(not changed, f"--resume: these settings differ from the saved run: {sorted(changed)}; "
                                 "pass the original values (see config.json)")
        else:
            require(not self.checkpoint.exists(),
                    f"{self.path} already holds a run; pass --resume to continue it or choose another --run-dir")
        self.path.mkdir(parents=True, exist_ok=True)
        self.args = args

    def write_config(self, config: dict) -> None:
        """config.json: every resolved argument, package versions and the git commit, plus what the script adds."""
        config = {"args": dataclasses.asdict(self.args), **config, "versions": versions(), "command": " ".join(sys.argv)}
        (self.path / "config.json").write_text(json.dumps(config, indent=2))

    def restore(self, skeleton):
        """The checkpoint's state and step; rows logged after the checkpoint are dropped (they will be logged again)."""
        state, meta = load_checkpoint(self.checkpoint, skeleton)
        for name in ("metrics.csv", "eval.csv"):
            drop_rows_after(self.path / name, meta["step"])
        print(f"resumed {self.path} at step {meta['step']:,}", flush=True)
        return state, meta["step"]

    def save(self, state, step: int, seeds: list[int]) -> None:
        save_checkpoint(self.checkpoint, state, {"step": step, "seeds": seeds})

    def open_logs(self, metric_fields: list[str]) -> "RunLogs":
        return RunLogs(self, metric_fields)


class RunLogs:
    """metrics.csv, eval.csv and TensorBoard (and wandb with --track), per seed."""

    def __init__(self, run: RunDir, metric_fields: list[str]):
        from tensorboardX import SummaryWriter

        self.metrics = CsvLog(run.path / "metrics.csv", metric_fields)
        self.evals = CsvLog(run.path / "eval.csv", EVAL_FIELDS)
        self.writer = SummaryWriter(str(run.path))
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
        self.writer.close()
