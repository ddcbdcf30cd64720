"""Run plumbing shared by the training scripts, nothing of an RL algorithm: the scripts hold their whole method; this
package writes down what they measure and keeps what they need to resume. One module per concern:

- errors.py: one-line errors (ConfigError and the other stops), `require`, and the scripts' main wrapper;
- settings.py: the script's Args from the command line or config.json, what a resumed run may change;
- checkpoint.py: atomic checkpoints (a failed write keeps the previous file) and reading them back;
- scripts.py: the script that trained a run, so that the tools rebuild its agents with it;
- cumulants.py: what a run measures of its learned cumulants (their quality; the cumulant response);
- logs.py: metrics.csv, eval.csv (and reading them back, plain or as tools.export packs them), TensorBoard and
  wandb, the progress lines;
- run_dir.py: the run directory (new, --resume, --overwrite), seeds over devices, Ctrl-C / SIGTERM;
- loop.py: a script's main loop: its jitted training chunks between logging, evaluation and checkpoints.

A run never loses more than a few minutes of work and never mixes with another run:
- checkpoints are written at every evaluation, every --checkpoint-minutes of wall time and on Ctrl-C / SIGTERM,
  always at a chunk boundary and atomically (a crash mid-write leaves the previous checkpoint whole);
- a run directory that holds any run file is refused unless --resume (continue it) or --overwrite (move the old
  directory aside; nothing is ever deleted);
- --resume takes every setting from the saved config.json; only those safe to change (settings.safe_to_change) may be
  given anew, and each resume is recorded there. The directory's location is not a setting, so a moved or copied run
  resumes.

The names the scripts use are imported here, so that a script reads `from common.run import RunDir, require`.
"""

from common.run.errors import (
    StopRun, ConfigError, NothingToDo, Interrupted, SaveFailed, require, require_positive, require_non_negative,
    require_fraction, exit_on_config_error
)  # noqa: F401
from common.run.settings import (
    SAFE_TO_CHANGE, safe_to_change, NOT_SETTINGS, default_run_dir, RETIRED_SETTINGS, parse_args, RunArgs,
    check_run_args, check_replay_args, check_replay_memory
)  # noqa: F401
from common.run.checkpoint import save_checkpoint, read_checkpoint_header, load_checkpoint  # noqa: F401
from common.run.scripts import ROOT, REPOSITORY_SCRIPTS, script_of, is_copy, load_script  # noqa: F401
from common.run.cumulants import (
    CUMULANT_SUMS, cumulant_stats, cumulant_quality, cumulant_columns, RESPONSE, RESPONSE_FIELDS, cumulant_response,
    response_sums, response_means, response_columns, pooled_response
)  # noqa: F401
from common.run.logs import (
    EVAL_FIELDS, format_task, peak_rss_gb, CsvLog, drop_rows_after, RunLogs, SGDMetrics, IterationMetrics,
    finished_episodes, metric_fields, metric_rows, progress_line, eval_line, require_finite, Evaluation,
    evaluation_parts, evaluation_rows, eval_rows, PACKED, table_path, open_table, read_table, SIGNIFICANT_DIGITS,
    compact_number, compact_metrics, pack_table, pooled_windows
)  # noqa: F401
from common.run.run_dir import (RUN_FILES, RunDir, VERSIONED, portable_command, portable_config, versions,
                                shard_seeds, StopSignals)  # noqa: F401
from common.run.loop import whole_iterations, Training, train_in_chunks  # noqa: F401
