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

from dataclasses import dataclass

import tyro

from common.run import exit_on_config_error, format_task, require
from tools import reference_returns
from tools.run_reader import RunReader, tasks_of_env
from tools.tables import mean_se


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


def reference_setting(run: RunReader, env: str) -> dict:
    """The setting of the references a BabyAI or Fruitbot run is held against: where its evaluation plays (BabyAI:
    its room; Fruitbot: its game and evaluation levels; runs saved before --env-backend existed played stock procgen,
    on unrestricted levels)."""
    if env == "babyai":
        return reference_returns.room_setting(run.babyai_room())
    saved = run.args
    game = {"distribution_mode": saved.get("distribution_mode", "hard"), "max_levels": saved.get("max_levels", 4)}
    if saved.get("env_backend", "procgen") == "procgen":
        return {"backend": "procgen", **game, "num_levels": 0}
    return {"backend": "jax", **game, "num_levels": saved.get("eval_levels", 1000), "level_key": 1}


def run_references(run: RunReader, env: str, episodes: int | None) -> tuple[dict, str, str]:
    """({policy: {task: {"mean", "se"}}} of the run's references, what the table's caption says of them, and what a
    missing cell says): the stored ones by default, played now with --episodes N, none with --episodes 0. MiniHack
    has none stored (tools/reference_returns.py says why)."""
    require(episodes in (None, 0) or episodes >= 2,
            f"--episodes must be 0 (leave the references out) or at least 2 (for a standard error), got {episodes}")
    if env not in reference_returns.PLAY:
        return {}, f"{env} has no oracle here: its random references are `python -m common.envs.{env}`", "-"
    setting = reference_setting(run, env)
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


def reference_cell(reference: dict | None, missing: str) -> str:
    """A reference's table cell: its mean ± s.e., or what stands for a missing one."""
    return f"{reference['mean']:.2f} ± {reference['se']:.2f}" if reference else missing


@exit_on_config_error
def main(args: Args) -> None:
    run = RunReader(args.run_dir)
    require(run.has_eval(), f"no eval.csv in {args.run_dir}; pass a run directory")
    evaluation = run.last_evaluation()
    step, table = evaluation.step, evaluation.returns
    seeds = len(next(iter(table.values())))
    env = run.env
    train_tasks, test_tasks = tasks_of_env(env)
    returns, about, missing = run_references(run, env, args.episodes)
    print(f"{run.label}: greedy return at step {step:,}, mean ± s.e. over {seeds} seed(s) of each seed's mean; "
          f"{about}.\n")
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
        pooled = run.actor_returns(args.actors_from, train_tasks)
        print(f"\nTraining actors (epsilon-greedy, training levels): return per train task over the episodes that "
              f"ended after step {args.actors_from:,}, mean ± s.e. (rows as clusters), episodes in brackets.\n")
        print("| seed | " + " | ".join(format_task(w) for w in train_tasks) + " |")
        print("|---|" + "---:|" * len(train_tasks))
        for seed in sorted({s for s, _ in pooled}):
            cells = [pooled[(seed, format_task(w))] for w in train_tasks]
            print(f"| {seed} | " + " | ".join(f"{m:.3f} ± {e:.3f} ({n:,.0f})" for m, e, n in cells) + " |")


if __name__ == "__main__":
    main(tyro.cli(Args))
