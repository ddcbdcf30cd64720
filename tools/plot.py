"""Figures of runs' evaluations (PNG, matplotlib): learning curves, and per-test-task returns next to references.

    python -m tools.plot results/babyai/comparison/* --out results/babyai/figures [--reference-episodes N]

- learning_curves.png: mean greedy return over the train tasks (without GPI), over the test tasks with GPI where the
  method has it, and (when a run has GPI) over the test tasks without GPI for every method, against env steps: the
  mean over seeds of each seed's task-mean, shaded by --interval over seeds.
- test_tasks.png (the paper's Figure 3 layout): per test task, every method's return at the latest step all runs
  evaluated (mean and --interval over seeds; GPI where the method has it), with the BFS oracle's and random play's
  returns as reference lines (BabyAI: the references stored for the run's room in results/references.json, as
  tools.summarize reads them, else played now; for MiniHack random play's success rate, on the learning curves too;
  --reference-episodes N plays them now over N episodes per task, 0 leaves them out).
- modularity.png (the paper's Figure 4a), when two or more MSFA variants are given: the same layout for MSFA and its
  entangled-phi/psi ablations alone.
- gpi_ablation.png (Figure 4b): per SF method, the mean test-task return with GPI over the train tasks and acting
  on w_test directly (no GPI), mean and --interval over seeds.
- actors.png: per train task, the training actors' return (epsilon-greedy on the training levels: what the original
  logs for the train tasks) from metrics.csv, pooled over windows of --actor-window rows (weighted by the rows'
  episode counts where metrics.csv has them), mean and --interval over seeds; for MiniHack with random play's success on
  the training levels as the reference.
- cumulant_response.png (methods that learn phi): the learned cumulants' response at every evaluation, from
  eval.csv (phi^i at own-category and other categories' pickups, rewarded and not: docs/cumulants.md), mean and
  --interval over seeds.
- aggregate.png (beyond the paper, since seeds are few): the interquartile mean over seeds x test tasks of the
  oracle-normalised return, (R - random) / (oracle - random), with 95% stratified-bootstrap confidence intervals
  (rliable; each method's draws seeded, so the figure is reproducible); raw returns when --reference-episodes is 0.
The runs are read from their eval.csv and config.json (the method's name); a protocol's method trained seed by seed and
not merged yet (OUT_DIR/<method>/ with seed<k>/ runs) is read as one run of its complete seeds (method_reader), so the
figures of a protocol in progress are drawn as they will be at its end; runs of one method from different folders are
named with their folder's name ("MSFA [mini_cpu]"); each figure says how many seeds it shows,
and each method keeps its colour in every figure. --interval is the spread drawn over seeds: one standard error (se),
or the 95% interval of the mean (ci95: Student's t with seeds - 1 degrees of freedom); a run with one seed has none.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import numpy as np
import tyro
from scipy import stats

from common.envs.babyai import bfs_oracle_returns, random_policy_returns
from common.run import RESPONSE, exit_on_config_error, format_task, require
from tools import reference_returns
from tools.figures import save_figure
from tools.run_reader import RunReader, env_tasks, method_reader, pooled_return, response_curve


@dataclass
class Args:
    run_dirs: tyro.conf.Positional[tuple[str, ...]]
    """run directories (each with eval.csv and config.json)"""
    out: str = "figures"
    """folder the PNG files go to"""
    reference_episodes: int | None = None
    """episodes per task for the references played now (0: none): BabyAI's BFS oracle and random play, MiniHack's and
    Fruitbot's random play; default: BabyAI's stored ones for the run's room (results/references.json), where
    stored, else played now over 100"""
    actor_window: int = 5
    """metrics.csv rows pooled into one point of actors.png"""
    interval: Literal["se", "ci95"] = "se"
    """the spread over seeds drawn as bands and error bars: one standard error, or the 95% Student's t interval"""


PLAYED_EPISODES = 100
"""episodes per task of references played now where --reference-episodes is not given and none are stored"""
INTERVAL_TEXT = {"se": "mean ± s.e. over seeds", "ci95": "mean and 95% t-interval over seeds"}


def half_width(std, n: int, interval: str):
    """The half-width of `interval` around a mean over n >= 2 seeds whose sample standard deviation is std."""
    return std / np.sqrt(n) * (stats.t.ppf(0.975, n - 1) if interval == "ci95" else 1.0)


def mean_spread(per_seed: np.ndarray, interval: str = "se") -> tuple[float, float]:
    """The mean over seeds and the half-width of `interval` around it (0 for one seed)."""
    n = len(per_seed)
    spread = half_width(per_seed.std(ddof=1), n, interval) if n > 1 else 0.0
    return float(per_seed.mean()), float(spread)


def learning_curve(table: dict, tasks, gpi: int, interval: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Steps, mean over seeds of each seed's mean over `tasks`, and the half-width of `interval`, at every evaluated
    step where the run has all of `tasks` at this gpi."""
    points = [(s, task_mean_per_seed(table, s, tasks, gpi)) for s in sorted({s for s, _, _ in table})]
    points = [(s, mean_spread(v, interval)) for s, v in points if v is not None]
    return (np.array([s for s, _ in points]), np.array([m for _, (m, _) in points]),
            np.array([h for _, (_, h) in points]))


def task_mean_per_seed(table: dict, step: int, tasks, gpi: int) -> np.ndarray | None:
    """Each seed's mean return over `tasks` at `step` (None if the run lacks them)."""
    cells = [table.get((step, format_task(w), gpi)) for w in tasks]
    if any(c is None for c in cells) or len({len(c) for c in cells}) != 1:
        return None
    return np.mean(np.asarray(cells), axis=0)


def best_gpi(table: dict) -> int:
    return max(g for _, _, g in table)


@exit_on_config_error
def main(args: Args) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    runs = [method_reader(d) for d in args.run_dirs]
    require(runs, "pass at least one run directory")
    labels = [d.label for d in runs]
    for d in runs:  # one method from two protocols (a paper form's 10 seeds beside 3 more): named by their folders
        if labels.count(d.label) > 1:
            d.label_as = f"{d.label} [{d.path.parent.name}]"
    require(args.reference_episodes is None or args.reference_episodes >= 0,
            f"--reference-episodes must not be negative, got {args.reference_episodes}")
    episodes = PLAYED_EPISODES if args.reference_episodes is None else args.reference_episodes
    require(args.actor_window >= 1, f"--actor-window must be at least 1, got {args.actor_window}")
    tables = {d: d.returns for d in runs}  # (one line where a run has no eval.csv: RunReader.eval_rows)
    train_tasks, test_tasks = env_tasks(runs)
    env = runs[0].env
    # references: (BFS oracle or None, random play) per test task; random_lines: random play per train/test task
    references, random_lines = None, None
    if episodes and env == "babyai":  # the BFS oracle exists for BabyAI only
        rooms = {d: d.babyai_room() for d in runs}
        sizes = {(r.grid_size, r.objects_per_category, r.episode_steps) for r in rooms.values()}
        require(len(sizes) == 1, f"the runs trained in different rooms (grid size, objects per category, episode "
                                 f"length: {sorted(sizes)}); plot each room's runs apart")
        references, random_lines, episodes = babyai_references(rooms[runs[0]], train_tasks, test_tasks,
                                                               args.reference_episodes)
    if episodes and env == "minihack":
        random_lines = minihack_random_success(runs[0].path, train_tasks, test_tasks, episodes)
        references = (None, random_lines[1])
    if episodes and env == "fruitbot":
        random_lines = fruitbot_random_returns(runs[0].path, train_tasks, test_tasks, episodes)
        references = (None, random_lines[1])
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    seeds = sorted({len(v) for t in tables.values() for v in t.values()})
    seed_text = f"{'/'.join(map(str, seeds))} seed(s), {INTERVAL_TEXT[args.interval]}"
    colours = method_colours(tables)  # a method keeps its colour in every figure

    # learning curves: train tasks, test tasks with GPI where the method has it, and (if any run has GPI) test tasks
    # without GPI for every method, so that each method's policy for w_test alone can be read against the others'
    any_gpi = any(best_gpi(t) == 1 for t in tables.values())
    panels = [("train tasks (no GPI)", train_tasks, False, 0),  # (title, tasks, GPI where the method has it, split)
              ("test tasks (GPI where the method has it)", test_tasks, True, 1)]
    if any_gpi:
        panels.append(("test tasks (no GPI: acting on w_test)", test_tasks, False, 1))
    fig, axes = plt.subplots(1, len(panels), figsize=(7.5 * len(panels), 4.2), sharex=True, sharey=True)
    for d, table in tables.items():
        g = best_gpi(table)
        for ax, (_, tasks, with_gpi, _) in zip(axes, panels):
            steps, mean, half = learning_curve(table, tasks, g if with_gpi else 0, args.interval)
            if len(steps):
                ax.plot(steps, mean, color=colours[d], label=d.label + ("" if g else " (no GPI)"))
                ax.fill_between(steps, mean - half, mean + half, color=colours[d], alpha=0.2)
    if random_lines is not None:
        for ax, (_, _, _, split) in zip(axes, panels):
            ax.axhline(np.mean(random_lines[split]), color="grey", linestyle=":",
                       label=f"random play ({episodes} episodes per task)")
    for ax, (title, _, _, _) in zip(axes, panels):
        ax.set_title(title)
    for ax in axes:
        ax.set_xlabel("env steps per seed")
        ax.set_ylabel("greedy return, mean over tasks")
        ax.grid(alpha=0.3)
    axes[-1].legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    fig.suptitle(f"Learning curves ({seed_text})")
    fig.tight_layout()
    save_figure(fig, out / "learning_curves.png", dpi=120)
    plt.close(fig)

    # returns per test task at the latest shared step
    steps = set.intersection(*({s for s, _, _ in t} for t in tables.values()))
    require(steps, "the runs share no evaluation step")
    step = max(steps)
    written = ["learning_curves.png", "test_tasks.png"]
    task_bars(plt, tables, step, test_tasks, references, f"Test tasks at step {step:,} ({seed_text})",
              out / "test_tasks.png", colours, args.interval)
    msfa = {d: t for d, t in tables.items() if d.label.startswith("MSFA")}
    if len(msfa) > 1:
        task_bars(plt, msfa, step, test_tasks, references,
                  f"Modularity ablations: test tasks at step {step:,} ({seed_text})", out / "modularity.png",
                  colours, args.interval)
        written.append("modularity.png")
    with_gpi = {d: t for d, t in tables.items() if best_gpi(t) == 1}
    if with_gpi:
        gpi_bars(plt, with_gpi, step, test_tasks,
                 f"GPI ablation: mean over the test tasks at step {step:,}\n({seed_text})", out / "gpi_ablation.png",
                 colours, args.interval)
        written.append("gpi_ablation.png")
    aggregate(plt, tables, step, test_tasks, references, out / "aggregate.png")
    written.append("aggregate.png")
    if response_curves(plt, runs, out / "cumulant_response.png", colours, args.interval):
        written.append("cumulant_response.png")
    with_metrics = [d for d in runs if d.has_metrics()]
    if with_metrics:
        actor_references = None
        if episodes and env == "minihack":
            actor_references = minihack_random_success(runs[0].path, train_tasks, test_tasks, episodes,
                                                       training_levels=True)[0]
        if episodes and env == "fruitbot":
            actor_references = fruitbot_random_returns(runs[0].path, train_tasks, test_tasks, episodes,
                                                       training_levels=True)[0]
        actor_curves(plt, with_metrics, train_tasks, args.actor_window, actor_references, episodes,
                     out / "actors.png", colours, args.interval)
        written.append("actors.png")
    print(f"wrote {', '.join(str(out / f) for f in written)} (step {step:,})")


def method_colours(methods) -> dict:
    """A colour per method, none repeated: matplotlib's ten-colour cycle (C0-C9) while it suffices, and for more
    methods tab20's ten strong hues followed by its ten light ones (the cycle itself would start again at C0, and two
    methods of a figure would look the same). Beyond twenty, evenly spaced colours of a continuous map."""
    import matplotlib

    methods = list(methods)
    if len(methods) <= 10:
        return {m: f"C{i}" for i, m in enumerate(methods)}
    if len(methods) <= 20:
        tab20 = matplotlib.colormaps["tab20"]
        return {m: tab20(2 * i if i < 10 else 2 * (i - 10) + 1) for i, m in enumerate(methods)}
    spread = matplotlib.colormaps["turbo"]
    return {m: spread(i / (len(methods) - 1)) for i, m in enumerate(methods)}


def response_curves(plt, runs: list[RunReader], path: Path, colours: dict, interval: str) -> bool:
    """cumulant_response.png: the learned cumulants' response at every evaluation (eval.csv; common.run.RESPONSE),
    one panel per summary, mean and `interval` over seeds (each seed's value pooled over the train tasks' pickups).
    Whether any run had one to draw (methods that learn phi, runs that recorded it)."""
    shown = [d for d in runs if d.response()]
    if not shown:
        return False
    titles = {"own_rewarded": "own category, rewarded pickups", "own_unrewarded": "own category, unrewarded pickups",
              "crosstalk": "crosstalk c: other categories' rewarded pickups",
              "cross_unrewarded": "other categories, unrewarded pickups"}
    fig, axes = plt.subplots(1, len(RESPONSE), figsize=(5.2 * len(RESPONSE), 3.9), sharex=True, sharey=True)
    for ax, name in zip(axes, RESPONSE):
        for d in shown:
            steps, values = response_curve(d, name)
            mean, half = [], []
            for row in values:
                kept = row[~np.isnan(row)]
                m, h = mean_spread(kept, interval) if len(kept) else (np.nan, 0.0)
                mean.append(m)
                half.append(h)
            mean, half = np.array(mean), np.array(half)
            ax.plot(steps, mean, color=colours[d], label=f"{d.label} ({values.shape[1]} seed(s))")
            ax.fill_between(steps, mean - half, mean + half, color=colours[d], alpha=0.2)
        ax.axhline(0, color="grey", lw=0.8)
        ax.axhline(1, color="grey", lw=0.8, ls=":")
        ax.set_title(f"phi^i at {titles[name]}", fontsize=9)
        ax.set_xlabel("env steps per seed")
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("mean phi^i (train tasks, acting on w)")
    axes[-1].legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    fig.suptitle("The learned cumulants' response over training (category detector: 1, 1, 0, 0; reward detector: "
                 f"1, 0, 1, 0; {INTERVAL_TEXT[interval]})", fontsize=10)
    fig.tight_layout()
    save_figure(fig, path, dpi=110)
    plt.close(fig)
    return True


def babyai_references(room, train_tasks, test_tasks, episodes: int | None):
    """((BFS oracle, random play) per test task, (random play per train task, per test task), episodes per task):
    mean returns in the run's room; with episodes None the ones stored for the room (results/references.json, as
    tools.summarize reads them) where stored, else played now over that many episodes per task (PLAYED_EPISODES
    where None)."""
    entry = reference_returns.stored("babyai", reference_returns.room_setting(room)) if episodes is None else None
    if entry is None:
        played = PLAYED_EPISODES if episodes is None else episodes
        oracle = bfs_oracle_returns(test_tasks, played, env=room)[0]
        rand = [random_policy_returns(tasks, played, env=room)[0] for tasks in (train_tasks, test_tasks)]
    else:
        returns = entry["returns"]
        oracle = np.array([returns["BFS oracle"][format_task(w)]["mean"] for w in test_tasks])
        rand = [np.array([returns["random"][format_task(w)]["mean"] for w in tasks])
                for tasks in (train_tasks, test_tasks)]
    return (oracle, rand[1]), tuple(rand), entry["episodes"] if entry else played


def fruitbot_random_returns(run_dir: Path, train_tasks, test_tasks, episodes: int, training_levels: bool = False):
    """Random play's lifetime return per train task and per test task in the run's game (the JAX game of its
    --distribution-mode: a procgen-backend run's stock mode is the same game): on fresh levels (as evaluation), or
    with training_levels on the run's training levels (as its actors play)."""
    from common.envs.fruitbot_jax import policy_returns

    saved = RunReader(run_dir).args
    game = {"paper": "paper", "hard": "stock-hard", "easy": "stock-easy"}[saved.get("distribution_mode", "hard")]
    require(episodes >= 2, f"--reference-episodes must be 0 or at least 2 for Fruitbot, got {episodes}")
    num_levels = saved.get("train_levels", 200) if training_levels else 0
    return tuple(policy_returns("random", game, tasks, episodes, num_levels=num_levels)[0]
                 for tasks in (train_tasks, test_tasks))


def minihack_random_success(run_dir: Path, train_tasks, test_tasks, episodes: int, training_levels: bool = False):
    """Random play's success rate per train room and per test room in the run's room size: on fresh levels (as
    evaluation), or with training_levels on the run's training levels (as its actors play)."""
    from common.envs.minihack import TRAIN_LEVELS, random_returns

    saved = RunReader(run_dir).args
    size = saved["room_size"]
    require(episodes >= 2, f"--reference-episodes must be 0 or at least 2 for MiniHack, got {episodes}")
    num_levels = saved.get("train_levels", TRAIN_LEVELS[size]) if training_levels else 0
    success = random_returns(np.concatenate([train_tasks, test_tasks]), episodes, size, num_levels=num_levels)[0]
    return success[:len(train_tasks)], success[len(train_tasks):]


def actor_returns_per_window(run: RunReader, train_tasks, window: int) -> dict:
    """seed -> (window end steps [W], returns [W, tasks]): the training actors' return per train task, pooled over
    each `window` consecutive metrics.csv rows (tools.run_reader.pooled_return: weighted by the rows' episodes)."""
    names = [format_task(w) for w in train_tasks]
    out = {}
    for seed, mine in run.metrics_of_seeds().items():
        ends, values = [], []
        for start in range(0, len(mine) - window + 1, window):
            chunk = mine[start:start + window]
            ends.append(int(chunk[-1]["step"]))
            values.append([pooled_return(chunk, t)[0] for t in names])
        out[seed] = (np.asarray(ends), np.asarray(values).reshape(-1, len(names)))
    return out


def actor_curves(plt, runs, train_tasks, window: int, random_success, reference_episodes: int, path: Path,
                 colours: dict, interval: str = "se") -> None:
    """One panel per train task: each run's actor return per window, mean and `interval` over its seeds."""
    fig, axes = plt.subplots(1, len(train_tasks), figsize=(5 * len(train_tasks), 3.8), sharey=True)
    for d in runs:
        per_seed = actor_returns_per_window(d, train_tasks, window)
        length = min(len(steps) for steps, _ in per_seed.values())
        if length == 0:
            continue
        steps = next(iter(per_seed.values()))[0][:length]
        values = np.stack([v[:length] for _, v in per_seed.values()])  # [seeds, W, tasks]
        for t, ax in enumerate(axes):
            mean = np.nanmean(values[:, :, t], 0)
            ax.plot(steps, mean, color=colours[d], label=f"{d.label} ({len(per_seed)} seed(s))")
            if len(per_seed) > 1:
                half = half_width(np.nanstd(values[:, :, t], 0, ddof=1), len(per_seed), interval)
                ax.fill_between(steps, mean - half, mean + half, color=colours[d], alpha=0.2)
    for t, ax in enumerate(axes):
        if random_success is not None:
            ax.axhline(random_success[t], color="grey", linestyle=":",
                       label=f"random play, training levels ({reference_episodes} episodes)")
        ax.set_title(f"train task {format_task(train_tasks[t])}")
        ax.set_xlabel("env steps per seed")
        ax.grid(alpha=0.3)
    axes[0].set_ylabel(f"actors' return (epsilon-greedy), {window} log rows pooled")
    fig.suptitle(f"Training actors' return ({INTERVAL_TEXT[interval]})")
    if axes[-1].get_legend_handles_labels()[0]:
        axes[-1].legend(fontsize=8, loc="lower right")
    else:  # no run has a whole window of log rows yet, and no random-play reference was asked for
        axes[0].text(0.5, 0.5, f"no run has {window} log rows yet", transform=axes[0].transAxes, ha="center")
    fig.tight_layout()
    save_figure(fig, path, dpi=120)
    plt.close(fig)


def task_bars(plt, tables: dict, step: int, test_tasks, references, title: str, path: Path, colours: dict,
              interval: str = "se") -> None:
    """Per test task, each run's return at `step` (GPI where it has it), mean and `interval` over seeds, with the BFS
    oracle (dashed) and random play (dotted) where references are given."""
    names = [format_task(w) for w in test_tasks]
    fig, ax = plt.subplots(figsize=(13, 4.8))
    width = 0.8 / len(tables)
    for i, (d, table) in enumerate(tables.items()):
        g = best_gpi(table)
        cells = [mean_spread(np.asarray(table[(step, n, g)]), interval) for n in names]
        ax.bar(np.arange(len(names)) + (i - (len(tables) - 1) / 2) * width, [m for m, _ in cells], width,
               yerr=[e for _, e in cells], capsize=2, color=colours[d], label=d.label + ("" if g else " (no GPI)"))
    if references is not None:
        oracle, rand = references
        for j in range(len(names)):
            if oracle is not None:
                ax.hlines(oracle[j], j - 0.45, j + 0.45, colors="black", linestyles="--",
                          label="BFS oracle" if j == 0 else None)
            ax.hlines(rand[j], j - 0.45, j + 0.45, colors="grey", linestyles=":", label="random" if j == 0 else None)
    ax.set_xticks(np.arange(len(names)), names, rotation=20)
    ax.set_ylabel("greedy return")
    ax.axhline(0, color="black", linewidth=0.5)
    ax.legend(fontsize=7, ncol=3)
    ax.set_title(title)
    fig.tight_layout()
    save_figure(fig, path, dpi=120)
    plt.close(fig)


def gpi_bars(plt, tables: dict, step: int, test_tasks, title: str, path: Path, colours: dict,
             interval: str = "se") -> None:
    """Per SF method: each seed's mean over the test tasks with and without GPI, mean and `interval` over seeds."""
    fig, ax = plt.subplots(figsize=(1.6 * len(tables) + 3, 4.2))
    for i, (d, table) in enumerate(tables.items()):
        for g, offset, hatch in ((1, -0.2, None), (0, 0.2, "//")):
            m, e = mean_spread(task_mean_per_seed(table, step, test_tasks, g), interval)
            ax.bar(i + offset, m, 0.4, yerr=e, capsize=3, color=colours[d], hatch=hatch, edgecolor="black",
                   label=("GPI over the train tasks" if g else "no GPI (act on w_test)") if i == 0 else None)
    ax.set_xticks(range(len(tables)), [d.label for d in tables], rotation=15, fontsize=8)
    ax.set_ylabel("greedy return, mean over the test tasks")
    ax.legend(fontsize=8)
    ax.set_title(title, fontsize=10)
    fig.tight_layout()
    save_figure(fig, path, dpi=120)
    plt.close(fig)


def aggregate(plt, tables: dict, step: int, test_tasks, references, path: Path) -> None:
    """Interquartile mean over seeds x test tasks with 95% stratified-bootstrap CIs (rliable), per method. Each
    method's bootstrap draws are seeded on their own, so a figure redone is the same and a method's interval does not
    move when another method is added to it."""
    from rliable import library as rly
    from rliable import metrics

    names = [format_task(w) for w in test_tasks]
    normalised = references is not None and references[0] is not None  # needs the oracle
    scores = {}
    for d, table in tables.items():
        g = best_gpi(table)
        returns = np.asarray([table[(step, n, g)] for n in names]).T  # [seeds, tasks]
        if normalised:
            oracle, rand = (np.asarray(r) for r in references)
            returns = (returns - rand) / (oracle - rand)
        scores[d.label + ("" if g else " (no GPI)")] = returns
    iqm = lambda x: np.array([metrics.aggregate_iqm(x)])  # noqa: E731
    points, intervals = {}, {}
    state = np.random.get_state()
    try:
        for name, method_scores in scores.items():  # each method its own fixed draws: the same in every figure
            # rliable's StratifiedBootstrap draws from NumPy's global generator (its random_state does not reach them)
            np.random.seed(0)
            p, i = rly.get_interval_estimates({name: method_scores}, iqm, reps=2000)
            points |= p
            intervals |= i
    finally:
        np.random.set_state(state)
    for name in scores:
        print(f"IQM {name}: {points[name][0]:.3f} [{intervals[name][0, 0]:.3f}, {intervals[name][1, 0]:.3f}]")
    fig, ax = plt.subplots(figsize=(7, 0.45 * len(scores) + 1.6))
    colours = method_colours(scores)  # its own colour per row: more than ten rows would repeat C0-C9
    for i, name in enumerate(scores):
        low, high = intervals[name][:, 0]
        ax.barh(i, high - low, left=low, height=0.6, color=colours[name], alpha=0.6)
        ax.plot([points[name][0]] * 2, [i - 0.3, i + 0.3], color="black")
    ax.set_yticks(range(len(scores)), list(scores), fontsize=8)
    ax.set_xlabel("IQM of the oracle-normalised return (0: random, 1: BFS oracle)" if normalised
                  else "IQM of the greedy return")
    ax.invert_yaxis()
    seeds = "/".join(str(n) for n in sorted({len(v) for v in scores.values()}))
    ax.set_title(f"Test tasks at step {step:,}: IQM over {seeds} seed(s) x {len(names)} tasks,\n"
                 "95% stratified-bootstrap confidence intervals (rliable)", fontsize=9)
    ax.grid(alpha=0.3, axis="x")
    fig.tight_layout()
    save_figure(fig, path, dpi=120)
    plt.close(fig)


if __name__ == "__main__":
    main(tyro.cli(Args))
