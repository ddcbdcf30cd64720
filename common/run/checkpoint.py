"""Checkpoints: written atomically (a failed write keeps the previous file whole and stops with one line), read
back with their header."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import equinox as eqx
import jax

from common.run.errors import ConfigError, SaveFailed, require


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
