"""Markdown table of a run's final evaluation next to its env's reference returns (BFS oracle, scripted, random play).

    python -m tools.summarize results/babyai/msfa_1M [--episodes N] [--actors-from STEP]

For each task: the mean over seeds of each seed's greedy return at the last evaluation step, ± the standard error
over seeds, with GPI and without; then the references of the run's env setting (BabyAI: the BFS oracle and random
play in the run's room; Fruitbot's stock procgen: the scripted gap-seeker and random play), mean ± s.e. over their
episodes, read from results/references.json (`python -m tools.reference_returns` stores them: playing them takes
minutes, reading them nothing). A room with no stored entry gets "(not stored)" cells, and the caption names the one
command that stores it. MiniHack and the JAX Fruitbot game have none stored: the caption says which command prints
theirs.

--episodes N plays the references now over N episodes per task (seed 0) instead of reading them; --episodes 0 leaves
them out.
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
from common.run import exit_on_config_error, format_task, open_table, require, table_path
from tools import reference_returns
from tools.script_contract import run_label


COLUMNS = ("BFS oracle", "random")
"""the reference columns of an env with no references stored (MiniHack), left empty"""


@dataclass
class Args:
    run_dir: tyro.conf.Positional[str]
    """a run directory (or a copy of its eval.csv's folder)"""
    episodes: int | None = None
    """play the references now over this many episodes per task (0: leave them out); default: read the stored ones"""
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


def saved_args(run_dir: Path) -> dict:
    """The settings a run's config.json records ({} for a copy of its eval.csv alone)."""
    config = Path(run_dir) / "config.json"
    return json.loads(config.read_text()).get("args", {}) if config.exists() else {}


def babyai_room(run_dir: Path) -> babyai.GotoAvoid:
    """The GotoAvoid room a BabyAI run trained in (its grid size, objects and episode length from config.json; the
    paper's room for runs saved before they were settings): the room its references are played in."""
    saved = saved_args(run_dir)
    return babyai.GotoAvoid(obs_mode="symbolic", grid_size=saved.get("grid_size", babyai.ROOM_SIZE),
                            objects_per_category=saved.get("objects_per_category", babyai.OBJECTS_PER_CATEGORY),
                            episode_steps=saved.get("episode_steps", babyai.MAX_STEPS))


def reference_setting(run_dir: Path, env: str) -> dict:
    """The setting of the references a BabyAI or Fruitbot run is held against: where its evaluation plays (BabyAI:
    its room; Fruitbot: its game and evaluation levels; runs saved before --env-backend existed played stock procgen,
    on unrestricted levels)."""
    if env == "babyai":
        return reference_returns.room_setting(babyai_room(run_dir))
    saved = saved_args(run_dir)
    game = {"distribution_mode": saved.get("distribution_mode", "hard"), "max_levels": saved.get("max_levels", 4)}
    if saved.get("env_backend", "procgen") == "procgen":
        return {"backend": "procgen", **game, "num_levels": 0}
    return {"backend": "jax", **game, "num_levels": saved.get("eval_levels", 1000), "level_key": 1}


def run_references(run_dir: Path, env: str, episodes: int | None) -> tuple[dict, str, str]:
    """({policy: {task: {"mean", "se"}}} of the run's references, what the table's caption says of them, and what a
    missing cell says): the stored ones by default, played now with --episodes N, none with --episodes 0. MiniHack
    has none stored (tools/reference_returns.py says why)."""
    require(episodes in (None, 0) or episodes >= 2,
            f"--episodes must be 0 (leave the references out) or at least 2 (for a standard error), got {episodes}")
    if env not in reference_returns.PLAY:
        return {}, f"{env} has no oracle here: its random references are `python -m common.envs.{env}`", "-"
    setting = reference_setting(run_dir, env)
    if episodes == 0:
        return {}, "references left out (--episodes 0)", "(not run)"
    if episodes is not None:
        return reference_returns.play(env, setting, episodes), f"references played now over {episodes} episodes", "-"
    entry = reference_returns.stored(env, setting)
    if entry:
        return (entry["returns"], f"references over {entry['episodes']} episodes, stored {entry['date']} by "
                                  f"`{entry['command']}`", "-")
    if reference_returns.computable(env, setting):
        return {}, (f"no references stored for {setting}: `{reference_returns.default_command(env, setting)}` plays and "
                    "stores them"), "(not stored)"
    about = f"no references stored for {setting}, and tools.reference_returns cannot play them"
    if setting.get("backend") == "jax":
        from common.envs.fruitbot import JAX_GAMES

        about += (f" (`python -m common.envs.fruitbot_jax --config {JAX_GAMES[setting['distribution_mode']]} "
                  f"--num-levels {setting['num_levels']} --level-key 1` prints the JAX game's)")
    return {}, about, "-"


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
    with open_table(eval_csv) as f:
        rows = list(csv.DictReader(f))
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
    with open_table(metrics_csv) as f:
        rows = list(csv.DictReader(f))
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


def reference_cell(reference: dict | None, missing: str) -> str:
    """A reference's table cell: its mean ± s.e., or what stands for a missing one."""
    return f"{reference['mean']:.2f} ± {reference['se']:.2f}" if reference else missing


@exit_on_config_error
def main(args: Args) -> None:
    eval_csv = Path(args.run_dir) / "eval.csv"
    require(table_path(eval_csv).exists(), f"no eval.csv in {args.run_dir}; pass a run directory")
    step, table = final_returns(eval_csv)
    seeds = len(next(iter(table.values())))
    train_tasks, test_tasks = env_tasks([args.run_dir])
    env = run_env(Path(args.run_dir))
    returns, about, missing = run_references(Path(args.run_dir), env, args.episodes)
    config = Path(args.run_dir) / "config.json"
    name = run_label(json.loads(config.read_text()) if config.exists() else {}, Path(args.run_dir).name)
    print(f"{name}: greedy return at step {step:,}, mean ± s.e. over {seeds} seed(s) of each seed's mean; {about}.\n")
    policies = reference_returns.POLICIES.get(env, COLUMNS)
    print("| split | task | GPI | no GPI | " + " | ".join(policies) + " |")
    print("|---|---|---:|---:|" + "---:|" * len(policies))
    for split, tasks in (("train", train_tasks), ("test", test_tasks)):
        for w in tasks:
            t = format_task(w)
            cells = [mean_se(table[(t, 1)]), mean_se(table[(t, 0)])]
            cells += [reference_cell(returns.get(p, {}).get(t), missing) for p in policies]
            print(f"| {split} | {t} | " + " | ".join(cells) + " |")
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
