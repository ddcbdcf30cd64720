"""What a run records as it goes: metrics.csv and eval.csv (with TensorBoard and wandb) and the progress lines on the
terminal (the learned cumulants' measurements they carry: common/run/cumulants.py)."""

from __future__ import annotations

import csv
import dataclasses
import lzma
import math
from pathlib import Path
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from common.run.cumulants import (CUMULANT_SUMS, RESPONSE_FIELDS, cumulant_columns, cumulant_quality, pooled_response,
                                  response_columns)
from common.run.errors import SaveFailed, StopRun, require


EVAL_FIELDS = ["step", "seed", "split", "task", "gpi", "episodes", "return_mean", "return_std", *RESPONSE_FIELDS]
"""the columns of eval.csv (a contract: results/ and other tools read them; the cumulant response's are filled on
the train tasks' rows acting on w of methods that learn phi, common/run/cumulants.py)"""


def format_task(w) -> str:
    """A task vector as written in eval.csv's task column and the tables: comma-separated, shortest exact form
    (e.g. -1,1,-1,0.5). One definition for every env, so results/ matches rows across envs and runs."""
    return ",".join(f"{float(x):g}" for x in np.asarray(w))


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


PACKED = ".xz"
"""tools.export writes a run's tables as metrics.csv.xz and eval.csv.xz (lzma: a third of the size of gzip's
metrics.csv; Python's lzma and pandas.read_csv read them as they are, `xzcat` prints them)"""


def table_path(path: Path) -> Path:
    """A run's table (metrics.csv, eval.csv) as the run wrote it or, where only that exists, as tools.export packs
    it (the same name + .xz). The tools read either through open_table."""
    packed = path.with_name(path.name + PACKED)
    return packed if not path.exists() and packed.exists() else path


def open_table(path: Path):
    """The table at `path` (or its packed form: table_path) open for reading as text."""
    path = table_path(path)
    return lzma.open(path, "rt", newline="") if path.name.endswith(PACKED) else path.open(newline="")


def read_table(path: Path) -> str:
    """The text of the table at `path` (or of its packed form: table_path)."""
    with open_table(path) as f:
        return f.read()


SIGNIFICANT_DIGITS = 6
"""digits a packed table keeps of each decimal number: a float32's precision, about a third of the bytes of the
shortest repr of a float64 after lzma"""


def compact_number(field: str) -> str:
    """A CSV field as packed: a decimal number to SIGNIFICANT_DIGITS significant digits; integers, text and empty
    fields as they are."""
    if not field or not any(c in field for c in ".eE") or field[0].isalpha():
        return field
    try:
        return f"{float(field):.{SIGNIFICANT_DIGITS}g}"
    except ValueError:
        return field


def compact_metrics(rows: list[dict], every: int) -> list[dict]:
    """metrics.csv's rows with every `every` consecutive rows of a seed made one, as if the run had logged that much
    less often: step and sgd_steps of the last row, rss_gb the largest, each training return the mean over the rows'
    episodes (weighted by episodes_train_<task>, which add up), episode_length weighted by the rows' episodes, every
    other number (sps, epsilon, the losses, the cumulants' quality) the mean of the rows that have it. Pooled
    returns over any window of whole blocks stay exactly as they were. Rows without episode counts (metrics.csv of
    runs before 2026-11-28) are returned as they are."""
    if every <= 1 or not rows or not any(k.startswith("episodes_train_") for k in rows[0]):
        return rows
    tasks = [k.removeprefix("episodes_train_") for k in rows[0] if k.startswith("episodes_train_")]
    out = []
    for seed in dict.fromkeys(r["seed"] for r in rows):
        mine = [r for r in rows if r["seed"] == seed]
        for start in range(0, len(mine), every):
            block = mine[start:start + every]
            row = {}
            for key in block[0]:
                values = [float(r[key]) for r in block if r[key] not in ("", None)]
                if key in ("step", "seed", "sgd_steps"):
                    row[key] = block[-1][key]
                elif key == "rss_gb":
                    row[key] = max(values) if values else ""
                elif key.startswith("episodes_train_"):
                    row[key] = int(sum(values))
                elif key.startswith("return_train_"):
                    task = key.removeprefix("return_train_")
                    pairs = [(float(r[key]), float(r[f"episodes_train_{task}"])) for r in block if r[key] != ""]
                    total = sum(n for _, n in pairs)
                    row[key] = sum(m * n for m, n in pairs) / total if total else ""
                elif key == "episode_length":
                    pairs = [(float(r[key]), sum(float(r[f"episodes_train_{t}"]) for t in tasks)) for r in block
                             if r[key] != ""]
                    total = sum(n for _, n in pairs)
                    row[key] = sum(m * n for m, n in pairs) / total if total else ""
                else:
                    row[key] = sum(values) / len(values) if values else ""
            out.append({k: (repr(v) if isinstance(v, float) else v) for k, v in row.items()})
    return sorted(out, key=lambda r: (int(r["step"]), int(r["seed"])))  # (the order a run of several seeds logs)


def pooled_windows(rows: list[dict], log_every: int, sgd_steps_per_iteration: int) -> int:
    """How many of the run's logging windows each metrics.csv row already pools: 1 for a run's own table, k for one
    an export compacted with metrics_every k (a protocol's folder resumed from its export holds those). A run logs
    every whole number of iterations in --log-every (common.run.loop); an iteration's env steps are read from the
    rows themselves (their steps over their SGD steps, times SGD steps per iteration), so the median row's env steps
    over that window is the answer. 1 where the rows cannot tell (fewer than 3 of a seed, or no SGD steps yet)."""
    if not rows or sgd_steps_per_iteration < 1:
        return 1
    mine = [r for r in rows if r["seed"] == rows[0]["seed"]]
    gaps = [(int(float(b["step"])) - int(float(a["step"])), int(float(b["sgd_steps"])) - int(float(a["sgd_steps"])))
            for a, b in zip(mine, mine[1:])]
    gaps = [(steps, sgd) for steps, sgd in gaps if steps > 0 and sgd > 0]
    if len(gaps) < 2:
        return 1
    per_iteration = float(np.median([steps * sgd_steps_per_iteration / sgd for steps, sgd in gaps]))
    window = max(1, int(log_every // per_iteration)) * per_iteration
    return max(1, round(float(np.median([steps for steps, _ in gaps])) / window))


def pack_table(source: Path, dest: Path, metrics_every: int = 1, pooled: dict[str, int] | None = None) -> Path:
    """The table at `source` (either form) written to dest + .xz: its decimal numbers to SIGNIFICANT_DIGITS
    significant digits (compact_number) and, for a metrics.csv with metrics_every > 1, every metrics_every rows of a
    seed made one (compact_metrics), counted in the run's logging windows: where a seed's source rows already pool
    pooled[seed] of them (pooled_windows: a run resumed from an earlier export, or a protocol's merge of seeds some of
    which were), every metrics_every / pooled[seed] of its rows are made one, and a seed pooled as much or more is kept
    as it is (it cannot be split again); a table no seed of which is compacted is written in its order. Deterministic:
    the same rows give the same bytes. A plain table at dest is removed, as table_path would read it first. Returns
    the file written."""
    import io

    rows = list(csv.reader(io.StringIO(read_table(source))))
    if source.name.startswith("metrics.csv") and metrics_every > 1:
        header = rows[0]
        seeds: dict[str, list[dict]] = {}
        for r in rows[1:]:
            seeds.setdefault(r[header.index("seed")], []).append(dict(zip(header, r)))
        windows = {seed: (pooled or {}).get(seed, 1) for seed in seeds}
        for seed, k in windows.items():
            require(metrics_every <= k or metrics_every % k == 0,
                    f"{source} pools {k} logging windows a row already for seed {seed} (an earlier export's); pass a "
                    f"--metrics-every that is a multiple of {k}")
        if any(metrics_every > k for k in windows.values()):
            merged = [r for seed, mine in sorted(seeds.items(), key=lambda item: int(float(item[0])))
                      for r in compact_metrics(mine, max(1, metrics_every // windows[seed]))]  # seed by seed
            rows = [header, *([str(r[k]) for k in header] for r in merged)]
    text = io.StringIO()
    writer = csv.writer(text, lineterminator="\n")
    writer.writerow(rows[0])
    writer.writerows([compact_number(field) for field in row] for row in rows[1:])
    target = dest.with_name(dest.name + PACKED)
    target.write_bytes(lzma.compress(text.getvalue().encode(), preset=9))
    dest.unlink(missing_ok=True)
    return target


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

    def __init__(self, path: Path, args, metric_fields: list[str]):
        """path: the run directory; args: the run's Args (--track and the wandb settings)."""
        from tensorboardX import SummaryWriter

        self.metrics = CsvLog(path / "metrics.csv", metric_fields)
        self.evals = CsvLog(path / "eval.csv", EVAL_FIELDS)
        self.writer = SummaryWriter(str(path))
        _quiet_writer_threads()
        if args.track:
            import wandb

            wandb.init(project=args.wandb_project_name, entity=args.wandb_entity, config=dataclasses.asdict(args),
                       name=path.name, dir=str(path), sync_tensorboard=True, resume="allow")

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


class SGDMetrics(NamedTuple):
    """What an SGD step reports: its losses by name (the script's LOSS_NAMES, metrics.csv's loss columns, each a
    scalar) and, for a method that learns cumulants, the sums [len(CUMULANT_SUMS), C] of `cumulant_stats` over its
    batch (None otherwise)."""
    losses: dict
    cumulant_stats: jax.Array | None = None

    @classmethod
    def none_taken(cls, loss_names: tuple[str, ...], num_cumulants: int = 0) -> "SGDMetrics":
        """What an iteration that took no SGD step reports (replay cannot be sampled yet): zeros of the SGD step's
        structure, built from the names alone, so that the wait branch does not trace the SGD step a second time."""
        stats = jnp.zeros((len(CUMULANT_SUMS), num_cumulants)) if num_cumulants else None
        return cls({name: jnp.zeros(()) for name in loss_names}, stats)


class IterationMetrics(NamedTuple):
    """What one training iteration reports: the one definition of what a script's jitted chunk returns (stacked
    [seeds, iterations, ...]) and `metric_rows` reads on the host."""
    sgd: SGDMetrics  # the mean over the iteration's SGD steps; zeros where it took none (replay not ready)
    learning: jax.Array  # 1.0 where the iteration took SGD steps, 0.0 where it waited for replay
    return_sum: jax.Array  # [train tasks] the summed returns of the training episodes that ended in the iteration
    return_count: jax.Array  # [train tasks] how many ended
    length_sum: jax.Array  # their summed lengths in env steps
    epsilon: jax.Array  # the actors' mean epsilon at the iteration's end


def finished_episodes(finished: dict, num_tasks: int) -> dict:
    """IterationMetrics' episode sums from the actors' per-step records [steps, envs]: "done" (an episode ended
    there), its "return", its train "task" index and its "length"."""
    done = finished["done"]
    one_hot = jax.nn.one_hot(finished["task"], num_tasks) * done[..., None]
    return {"return_sum": jnp.sum(one_hot * finished["return"][..., None], axis=(0, 1)),
            "return_count": jnp.sum(one_hot, axis=(0, 1)), "length_sum": jnp.sum(done * finished["length"])}


def metric_fields(loss_names: tuple[str, ...], train_tasks: list[str], num_cumulants: int = 0) -> list[str]:
    """The columns of metrics.csv: step, seed, sps, ..., the losses, the quality of learned cumulants (methods that
    learn them: num_cumulants > 0), the mean length of the training episodes, the training return per train task,
    and how many training episodes of each task ended in the row's stretch (so that a window's mean return can be
    pooled over episodes and given a standard error)."""
    return (["step", "seed", "sps", "sgd_steps", "epsilon", *loss_names, "rss_gb", *cumulant_columns(num_cumulants),
             "episode_length"] + [f"return_train_{w}" for w in train_tasks]
            + [f"episodes_train_{w}" for w in train_tasks])


def metric_rows(metrics: IterationMetrics, sgd_steps, seeds: list[int], step: int, sps: float,
                loss_names: tuple[str, ...], train_tasks: list[str]) -> list[dict]:
    """metrics.csv rows of every seed from a chunk's metrics [seeds, iterations, ...]: losses average the
    iterations that learned, training returns the episodes that ended in the chunk, and episode_length their mean
    length in env steps (in Fruitbot a lifetime's, so it shows survival before returns move); "" where there were
    none."""
    require(set(metrics.sgd.losses) == set(loss_names),
            f"the SGD step reports {sorted(metrics.sgd.losses)} but LOSS_NAMES (metrics.csv's columns) lists "
            f"{sorted(loss_names)}: make them the same")
    rows = []
    for i, seed in enumerate(seeds):
        m = jax.tree.map(lambda x: x[i], metrics)
        learning = m.learning > 0
        row = {"step": step, "seed": seed, "sps": round(sps, 1), "sgd_steps": int(sgd_steps[i]),
               "epsilon": float(m.epsilon.mean()), "rss_gb": round(peak_rss_gb(), 2)}
        for k in loss_names:
            row[k] = float(m.sgd.losses[k][learning].mean()) if learning.any() else ""
        if m.sgd.cumulant_stats is not None:  # pooled over the chunk's SGD steps (their replayed transitions)
            quality = cumulant_quality(np.asarray(m.sgd.cumulant_stats)[learning].sum(0))
            for name, values in quality.items():
                for k, v in enumerate(values):
                    row[f"phi_{name}_{k + 1}"] = "" if np.isnan(v) else round(float(v), 5)
        counts, sums = m.return_count.sum(0), m.return_sum.sum(0)
        row["episode_length"] = float(m.length_sum.sum() / counts.sum()) if counts.sum() else ""
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
    """One line for an evaluation's eval.csv rows: mean train return (no GPI), mean test return (GPI if there), and
    for learned cumulants their response (common/run/cumulants.py)."""
    gpi = max(r["gpi"] for r in rows)
    train = [r["return_mean"] for r in rows if r["split"] == "train" and r["gpi"] == 0]
    test = [r["return_mean"] for r in rows if r["split"] == "test" and r["gpi"] == gpi]
    line = (f"eval @ {rows[0]['step']:,}: train return {np.mean(train):.2f}, test return "
            f"({'GPI' if gpi else 'no GPI'}) {np.mean(test):.2f}")
    response = pooled_response(rows)
    if not np.isnan(response["crosstalk"]):  # a method that learns phi, and rewarded pickups to read it at
        line += (f"; phi at rewarded pickups: own {response['own_rewarded']:.2f}, crosstalk c "
                 f"{response['crosstalk']:.2f}; at unrewarded: own {response['own_unrewarded']:.2f}")
    return line


def require_finite(rows: list[dict], names: tuple[str, ...], checkpoint: Path) -> None:
    """Stop (keeping the last good checkpoint) if a loss of a metrics row is NaN or infinite."""
    for row in rows:
        for k in names:
            if row[k] != "" and not math.isfinite(row[k]):
                raise StopRun(f"step {row['step']:,}: {k} became {row[k]} (seed {row['seed']}); stopped without "
                              f"saving; {checkpoint} keeps the last good state")


class Evaluation(NamedTuple):
    """What a script's evaluate(params, key) returns where it measures more than the returns: the greedy returns
    [gpi settings, tasks, episodes] and, for a method that learns phi, the cumulant response of its episodes acting
    on w (gpi 0): sums [tasks, C, C] and counts [tasks, C], cumulant_response of each task's transitions (read on
    the one-hot train tasks). A plain array is the returns alone (a script, or a copy, that measures nothing more)."""
    returns: jax.Array
    response_sums: jax.Array | None = None
    response_counts: jax.Array | None = None


def evaluation_parts(out) -> Evaluation:
    """An evaluate(params, key)'s output as an Evaluation, whichever of the two forms it returned."""
    return out if isinstance(out, Evaluation) else Evaluation(out)


def evaluation_rows(out, seed: int, step: int, tasks, is_train, gpi_settings) -> list[dict]:
    """eval.csv rows of one seed's evaluation (an evaluate's output: returns, or an Evaluation): mean and std of the
    greedy return per task and GPI setting, and where measured the cumulant response on the train tasks' rows
    acting on w. is_train [tasks]: which of `tasks` are train tasks."""
    out = evaluation_parts(out)
    returns = np.asarray(out.returns)
    rows = []
    for g_index, g in enumerate(gpi_settings):
        for t, w in enumerate(tasks):
            r = returns[g_index, t]
            row = {"step": step, "seed": seed, "split": "train" if is_train[t] else "test", "task": format_task(w),
                   "gpi": g, "episodes": len(r), "return_mean": float(r.mean()), "return_std": float(r.std())}
            if out.response_sums is not None and g == 0 and is_train[t]:
                row |= response_columns(out.response_sums[t], out.response_counts[t], w)
            rows.append(row)
    return rows


def eval_rows(evaluate, params, seeds: list[int], step: int, tasks, num_train: int, gpi_settings) -> list[dict]:
    """eval.csv rows of every seed (evaluation_rows). evaluate(params of one seed, key) -> returns [gpi settings,
    tasks, episodes] (or an Evaluation); seed s at step S plays with key fold_in(PRNGKey(10000 + S), s), which
    `tools.evaluate --seed 10000+S` replays."""
    eval_key = jax.random.PRNGKey(10_000 + step)
    is_train = [t < num_train for t in range(len(tasks))]
    rows = []
    for i, seed in enumerate(seeds):
        out = evaluate(jax.tree.map(lambda x: x[i], params), jax.random.fold_in(eval_key, seed))
        rows += evaluation_rows(out, seed, step, tasks, is_train, gpi_settings)
    return rows
