"""A run's settings: parsing the script's Args, config.json, and which settings a resumed run may change."""

from __future__ import annotations

import dataclasses
import json
import os
from dataclasses import dataclass
from pathlib import Path

import tyro

from common.run.errors import exit_on_config_error, require, require_fraction, require_positive


SAFE_TO_CHANGE = ("total_timesteps", "eval_every", "log_every", "track", "checkpoint_minutes", "checkpoint",
                  "max_minutes", "wandb_project_name", "wandb_entity", "core_backend")
"""settings a resumed run may change: they decide how long it runs, what it records or how FARM's recurrence is
computed (the same function; pallas-bf16 close to it), not what it learns"""


def safe_to_change(args) -> tuple[str, ...]:
    """SAFE_TO_CHANGE and the script's own such settings: its Args' class attribute ALSO_SAFE_TO_CHANGE (e.g. how
    many processes step a host env: the same episodes either way)."""
    return SAFE_TO_CHANGE + tuple(getattr(type(args), "ALSO_SAFE_TO_CHANGE", ()))


NOT_SETTINGS = ("run_dir", "resume", "overwrite")
"""arguments that say where and how to start, not what the run is"""


def default_run_dir(args) -> Path:
    return Path(args.run_dir or f"runs/{args.exp_name}__{args.seed}")


RETIRED_SETTINGS = ("learner_unroll", "joint_target_unroll", "lstm_grad_after_loop")
"""speed-only settings that scripts no longer have (superseded by --core-backend): a saved run's values for them
changed how fast it ran, not what it computed, so loading its config.json drops them"""


RENAMED_VALUES = {"core_backend": {"xla": "fused"}}
"""values that earlier versions wrote under other names: FARM's fused recurrence was the `xla` backend"""


def _as_args(cls, saved: dict):
    """The dataclass `cls` from a config.json "args" dict (JSON lists back to tuples; RETIRED_SETTINGS dropped,
    RENAMED_VALUES renamed)."""
    saved = {k: RENAMED_VALUES.get(k, {}).get(v, v) if isinstance(v, str) else v for k, v in saved.items()
             if k not in RETIRED_SETTINGS}
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


@dataclass
class RunArgs:
    """The run controls every training script shares (where a run goes, logging services, resuming, checkpoints,
    a time budget). A script's Args inherits them, so they come first in its --help and in config.json; each script
    keeps its own seeds, budget, evaluation and logging intervals, whose defaults differ."""

    run_dir: str | None = None
    """where config.json, metrics.csv, eval.csv, checkpoint.eqx and TensorBoard files go (default runs/<name>)"""
    track: bool = False
    """log to Weights & Biases"""
    wandb_project_name: str = "msfa-jax"
    """Weights & Biases project (with --track)"""
    wandb_entity: str | None = None
    """Weights & Biases entity (with --track)"""
    resume: bool = False
    """continue the run in --run-dir from its checkpoint, with its saved settings"""
    overwrite: bool = False
    """start anew in a --run-dir that holds a run, moving the old one aside to <run-dir>.replaced-<time>"""
    checkpoint_minutes: float = 10.0
    """minutes of wall time between checkpoints (also written at every evaluation and on Ctrl-C)"""
    checkpoint: bool = True
    """write checkpoint.eqx (replay included: the size the run prints at start) so that the run can be resumed;
    --no-checkpoint writes only the small per-seed parameter files"""
    max_minutes: float | None = None
    """stop after this many minutes of wall time (compilation included), evaluating and saving first"""


def check_run_args(args: RunArgs) -> None:
    """Refuse run controls that cannot work, with one line saying what to change."""
    require_positive(args, "checkpoint_minutes")
    require(args.max_minutes is None or args.max_minutes > 0, f"--max-minutes must be positive, got {args.max_minutes}")


def check_replay_args(args) -> None:
    """Refuse sequence and replay settings that cannot work (every script replays sequences of sequence_period + 1
    steps from num_envs envs with an n-step discount), with one line saying what to change."""
    per_iteration = args.num_envs * args.sequence_period
    require(args.sequence_length == args.sequence_period + 1,
            f"--sequence-length must be --sequence-period + 1 (sequences share one step), got "
            f"{args.sequence_length} and {args.sequence_period}")
    require(0 < args.gamma <= 1, f"--gamma must be in (0, 1], got {args.gamma}")
    require_fraction(args, "priority_exponent", "max_priority_weight")
    require(args.min_replay_size >= args.batch_size,
            f"--min-replay-size must be at least --batch-size ({args.batch_size}), got {args.min_replay_size}")
    require(args.replay_size >= args.min_replay_size,
            f"--replay-size must be at least --min-replay-size, got {args.replay_size} < {args.min_replay_size}")
    require(args.replay_size >= args.num_envs, f"--replay-size must hold one insert of --num-envs ({args.num_envs}) "
                                               f"sequences, got {args.replay_size}")
    require(args.total_timesteps >= per_iteration,
            f"--total-timesteps must cover at least one iteration ({per_iteration} env steps = "
            f"--num-envs x --sequence-period), got {args.total_timesteps}")


def check_replay_memory(args, replay_bytes: int) -> None:
    """On a CPU, refuse a replay (replay_bytes per seed) that cannot fit this machine's memory, before allocating it.
    (A GPU's memory is XLA's to report.)"""
    import jax

    if jax.default_backend() != "cpu":
        return
    need = replay_bytes * args.num_seeds
    have = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    require(need < 0.8 * have, f"replay of {args.replay_size:,} sequences x {args.num_seeds} seed(s) needs "
                               f"{need / 2**30:.1f} GiB, more than this machine's {have / 2**30:.1f} GiB allow: lower "
                               f"--replay-size (and --min-replay-size)")
