"""Markdown table of a run's final evaluation next to the BFS oracle and random play.

    python -m results.summarize results/babyai/msfa_1M [--episodes 100] [--actors-from STEP]

For each task: the mean over seeds of each seed's greedy return at the last evaluation step, ± the standard error
over seeds, with GPI and without; then the BFS oracle's and random play's returns (--episodes 0 leaves them out).
With --actors-from, a second table: the training actors' return per train task (epsilon-greedy on the training
levels: what the original logs for the train tasks), pooled over the episodes that ended after that step.
"""

from __future__ import annotations

import csv
import json
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import tyro

from common.envs import babyai
from common.envs.babyai import bfs_oracle_returns, random_policy_returns
from common.run import exit_on_config_error, format_task, require
from results.contract import run_label


@dataclass
class Args:
    run_dir: tyro.conf.Positional[str]
    """a run directory (or a copy of its eval.csv's folder)"""
    episodes: int = 100
    """episodes per task for the oracle and random references (0: leave them out)"""
    actors_from: int | None = None
    """also pool the training actors' returns (metrics.csv) over the episodes that ended after this env step"""


def run_env(run_dir: Path) -> str:
    """The environment a run trained on, as its config.json records it."""
    config = run_dir / "config.json"
    return recorded_env(json.loads(config.read_text()) if config.exists() else {"args": {}})


def recorded_env(record: dict) -> str:
    """The env of a run's config.json or a parameter file's header: their "env". Files written before they
    recorded it are read by their arguments: --env where the script has one, msfa_minihack.py's and
    msfa_fruitbot.py's by their env settings, else BabyAI."""
    if record.get("env"):
        return record["env"]
    saved = record.get("args", {})
    if saved.get("env"):
        return saved["env"]
    return "minihack" if "room_size" in saved else "fruitbot" if "distribution_mode" in saved else "babyai"


def babyai_room(run_dir: Path) -> babyai.GotoAvoid:
    """The GotoAvoid room a BabyAI run trained in (its grid size, objects and episode length from config.json; the
    paper's room for runs saved before they were settings): the room its references are played in."""
    config = Path(run_dir) / "config.json"
    saved = json.loads(config.read_text()).get("args", {}) if config.exists() else {}
    return babyai.GotoAvoid(obs_mode="symbolic", grid_size=saved.get("grid_size", babyai.ROOM_SIZE),
                            objects_per_category=saved.get("objects_per_category", babyai.OBJECTS_PER_CATEGORY),
                            episode_steps=saved.get("episode_steps", babyai.MAX_STEPS))


def env_tasks(run_dirs) -> tuple[np.ndarray, np.ndarray]:
    """(train tasks, test tasks) of the runs' environment; runs of different environments are refused."""
    envs = {run_env(Path(d)) for d in run_dirs}
    require(len(envs) == 1, f"the runs trained on different environments ({', '.join(sorted(envs))}); pass runs of one")
    return tasks_of_env(envs.pop())


def tasks_of_env(env: str) -> tuple[np.ndarray, np.ndarray]:
    """(train tasks, test tasks) of an environment (imported only where asked: each needs its own packages)."""
    if env == "fruitbot":
        from common.envs import fruitbot

        return fruitbot.TRAIN_TASKS, fruitbot.TEST_TASKS
    if env == "minihack":
        from common.envs import minihack

        return minihack.TRAIN_TASKS, minihack.TEST_TASKS
    return babyai.TRAIN_TASKS, babyai.TEST_TASKS


def final_returns(eval_csv: Path):
    rows = list(csv.DictReader(eval_csv.open()))
    require(rows, f"{eval_csv} has no evaluation rows yet")
    last = max(int(r["step"]) for r in rows)
    table = defaultdict(list)  # (task, gpi) -> per-seed means
    for r in rows:
        if int(r["step"]) == last:
            table[(r["task"], int(r["gpi"]))].append(float(r["return_mean"]))
    return last, table


def pooled_return(rows: list[dict], task: str) -> tuple[float, float, float]:
    """(mean, s.e., episodes) of the training actors' return on `task` over metrics.csv rows: each row's mean
    weighted by its episode count (episodes_train_<task>; where metrics.csv predates the counts, 1 for every row
    that ended an episode of the task); the s.e. treats rows as clusters (the episodes of one row share a policy;
    valid for any return distribution)."""
    returns = [r[f"return_train_{task}"] for r in rows]
    m = np.asarray([float(x) if x else 0.0 for x in returns])
    if rows and f"episodes_train_{task}" in rows[0]:
        n = np.asarray([float(r[f"episodes_train_{task}"]) for r in rows])
    else:
        n = np.asarray([1.0 if x else 0.0 for x in returns])
    total, k = n.sum(), int((n > 0).sum())
    mean = (n * m).sum() / total if total else float("nan")
    se = np.sqrt((n**2 * (m - mean) ** 2).sum() * k / (k - 1)) / total if k > 1 else float("nan")
    return float(mean), float(se), float(total)


def actor_returns(metrics_csv: Path, from_step: int, train_tasks) -> dict:
    """(seed, task) -> (mean return, its s.e., episodes) of the training actors' episodes that ended in the
    metrics.csv rows after from_step (pooled_return); metrics.csv must count the episodes of each row."""
    rows = list(csv.DictReader(metrics_csv.open()))
    names = [format_task(w) for w in train_tasks]
    require(rows and f"episodes_train_{names[0]}" in rows[0],
            f"{metrics_csv} has no episodes_train_* columns (written since 2026-11-28): its runs' returns cannot be "
            "pooled over episodes; leave out --actors-from")
    out = {}
    for seed in sorted({int(r["seed"]) for r in rows}):
        later = [r for r in rows if int(r["seed"]) == seed and int(r["step"]) > from_step]
        require(later, f"{metrics_csv} has no rows of seed {seed} after step {from_step:,}; pass an earlier step")
        for t in names:
            out[(seed, t)] = pooled_return(later, t)
    return out


def mean_se(values):
    """mean ± standard error over seeds ("-" if there is nothing, the bare mean for one seed)."""
    values = np.asarray(values)
    if len(values) == 0:
        return "-"
    if len(values) == 1:
        return f"{values[0]:.2f}"
    return f"{values.mean():.2f} ± {values.std(ddof=1) / np.sqrt(len(values)):.2f}"


@exit_on_config_error
def main(args: Args) -> None:
    eval_csv = Path(args.run_dir) / "eval.csv"
    require(eval_csv.exists(), f"no eval.csv in {args.run_dir}; pass a run directory")
    step, table = final_returns(eval_csv)
    seeds = len(next(iter(table.values())))
    train_tasks, test_tasks = env_tasks([args.run_dir])
    babyai_run = run_env(Path(args.run_dir)) == "babyai"
    oracle = defaultdict(lambda: "(not run)" if babyai_run else "-")
    rand = defaultdict(lambda: "(not run)" if babyai_run else "-")
    for tasks in (train_tasks, test_tasks) if args.episodes and babyai_run else ():
        o, ose = bfs_oracle_returns(tasks, args.episodes, env=babyai_room(Path(args.run_dir)))
        r, rse = random_policy_returns(tasks, args.episodes, env=babyai_room(Path(args.run_dir)))
        for w, a, b, c, d in zip(tasks, o, ose, r, rse):
            oracle[format_task(w)], rand[format_task(w)] = f"{a:.2f} ± {b:.2f}", f"{c:.2f} ± {d:.2f}"
    env = run_env(Path(args.run_dir))
    references = (f"references over {args.episodes} episodes" if babyai_run else
                  f"{env} has no oracle here: its random references are `python -m common.envs."
                  f"{'fruitbot_jax' if env == 'fruitbot' else env}`")
    config = Path(args.run_dir) / "config.json"
    name = run_label(json.loads(config.read_text()) if config.exists() else {}, Path(args.run_dir).name)
    print(f"{name}: greedy return at step {step:,}, mean ± s.e. over {seeds} seed(s) of each seed's mean; "
          f"{references}.\n")
    print("| split | task | GPI | no GPI | BFS oracle | random |")
    print("|---|---|---:|---:|---:|---:|")
    for split, tasks in (("train", train_tasks), ("test", test_tasks)):
        for w in tasks:
            t = format_task(w)
            print(f"| {split} | {t} | {mean_se(table[(t, 1)])} | {mean_se(table[(t, 0)])} | {oracle[t]} | {rand[t]} |")
    if args.actors_from is not None:
        pooled = actor_returns(Path(args.run_dir) / "metrics.csv", args.actors_from, train_tasks)
        print(f"\nTraining actors (epsilon-greedy, training levels): return per train task over the episodes that "
              f"ended after step {args.actors_from:,}, mean ± s.e. (rows as clusters), episodes in brackets.\n")
        print("| seed | " + " | ".join(format_task(w) for w in train_tasks) + " |")
        print("|---|" + "---:|" * len(train_tasks))
        for seed in sorted({s for s, _ in pooled}):
            cells = [pooled[(seed, format_task(w))] for w in train_tasks]
            print(f"| {seed} | " + " | ".join(f"{m:.3f} ± {e:.3f} ({n:,.0f})" for m, e, n in cells) + " |")


if __name__ == "__main__":
    main(tyro.cli(Args))
