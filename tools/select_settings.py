"""How a candidate setting of the miniature BabyAI did on the train tasks: the criterion its settings were chosen by.

    python -m tools.select_settings OUT_DIR [OUT_DIR ...]      # protocols run with --scale mini --methods msfa usfa
    python -m tools.select_settings OUT_DIR --budgets 200000 300000 400000   # as if each run had stopped there

For each protocol folder (one candidate: its --scale and --extra) and each of its methods: the greedy train-task
return without GPI (the mean over the 4 train tasks, then over seeds, with the seeds' spread) at the last evaluation
and at the one nearest 80% of the budget, as a share of the BFS oracle's train-task return in the same room, and the
change over the last 20% of the budget. The criterion (docs/babyai.md): MSFA and USFA with the env's cumulants both
reach 80% of the oracle by the end, and neither changes by 5% or more over the last 20%. Only train tasks are read:
the test tasks never choose settings.

--budgets judges each run as if it had stopped at each of these budgets: nothing in a run depends on its
--total-timesteps but where it stops (replay capacity, target period and the epsilon schedule are fixed flags, and a
run can be extended with --resume), so a run's first B env steps are a run with budget B, and one long run answers
for every shorter budget at the same settings.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import tyro

from common.envs.babyai import TRAIN_TASKS, bfs_oracle_returns
from common.run import exit_on_config_error, format_task, require
from tools.run_reader import RunReader

TRAIN = {format_task(w) for w in TRAIN_TASKS}
CRITERION_METHODS = ("msfa", "usfa")
REACH, SETTLED = 0.8, 0.05
ORACLE: dict = {}
"""the BFS oracle's mean train-task return per (room, episodes), played once per process"""
SETTING = (("grid", "grid_size"), ("replay", "replay_size"), ("target period", "target_update_period"))
"""the settings a candidate's row names (from its runs' config.json; the networks' are --scale's)"""


@dataclass
class Args:
    out_dirs: tyro.conf.Positional[tuple[str, ...]]
    """protocol folders, one per candidate setting"""
    oracle_episodes: int = 100
    """episodes per train task of the BFS oracle"""
    budgets: tuple[int, ...] = ()
    """judge each run as if it had stopped at these env steps per seed (default: its own --total-timesteps)"""


def train_returns(run: RunReader) -> dict[int, np.ndarray]:
    """step -> each seed's mean greedy train-task return without GPI at that evaluation."""
    per = {}
    for row in run.eval_rows:
        if row["split"] == "train" and row["gpi"] == "0" and row["task"] in TRAIN:
            per.setdefault(int(row["step"]), {}).setdefault(int(row["seed"]), []).append(float(row["return_mean"]))
    return {step: np.array([np.mean(v) for _, v in sorted(seeds.items())]) for step, seeds in sorted(per.items())}


def judge(out: Path, oracle_episodes: int, budget: int | None = None) -> list[dict]:
    """Each method's row of the criterion, its runs read up to `budget` env steps (default: their own budget)."""
    protocol = json.loads((out / "protocol.json").read_text())
    rows = []
    for method in protocol["methods"]:
        run = RunReader(out / method)
        require(run.has_eval(), f"{run.path} has no eval.csv: its runs are not complete (merged) yet")
        saved = run.args
        total = saved["total_timesteps"]
        if budget is not None:  # (the message formats the budget)
            require(budget <= total,
                    f"--budgets {budget:,} is beyond {run.path}'s {total:,} env steps: pass budgets up to its own")
        total = budget or total
        returns = {step: r for step, r in train_returns(run).items() if step <= total}
        steps = sorted(returns)
        require(len(steps) >= 2, f"{run.path} has fewer than 2 evaluations up to {total:,} env steps")
        last = steps[-1]
        earlier = min(steps, key=lambda s: abs(s - 0.8 * last))
        room = tuple(saved.get(k) for k in ("grid_size", "objects_per_category", "episode_steps"))
        if (room, oracle_episodes) not in ORACLE:  # the same room for every method and budget: played once
            ORACLE[room, oracle_episodes] = float(np.mean(
                bfs_oracle_returns(TRAIN_TASKS, oracle_episodes, env=run.babyai_room())[0]))
        oracle = ORACLE[room, oracle_episodes]
        end, before = returns[last], returns[earlier]
        setting = ", ".join(f"{name} {saved[key]}" for name, key in SETTING if key in saved)
        rows.append({"folder": str(out), "method": method, "scale": protocol.get("scale", "paper"),
                     "setting": setting, "seeds": len(end), "step": last, "oracle": oracle,
                     "return": float(end.mean()), "spread": float(end.std(ddof=1)) if len(end) > 1 else 0.0,
                     "share": float(end.mean() / oracle), "at_80": earlier,
                     "change": float((end.mean() - before.mean()) / max(abs(end.mean()), 1e-9))})
    return rows


@exit_on_config_error
def main(args: Args) -> None:
    require(args.out_dirs, "pass one or more protocol folders")
    print("| candidate | method | seeds | env steps | train return (no GPI) | of the "
          "oracle | change over the last 20% | criterion |")
    print("|---|---|---:|---:|---:|---:|---:|---|")
    for out, budget in [(Path(o), b) for o in args.out_dirs for b in (args.budgets or (None,))]:
        rows = judge(out, args.oracle_episodes, budget)
        met = all(r["share"] >= REACH and abs(r["change"]) < SETTLED for r in rows if r["method"] in CRITERION_METHODS)
        for r in rows:
            print(f"| {r['setting']} | {r['method']} | {r['seeds']} | {r['step']:,} | {r['return']:.2f} ± "
                  f"{r['spread']:.2f} (oracle {r['oracle']:.2f}) | {r['share']:.0%} | {r['change']:+.1%} (from step "
                  f"{r['at_80']:,}) | {'met' if met else 'not met'} |")


if __name__ == "__main__":
    main(tyro.cli(Args))
