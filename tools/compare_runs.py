"""Markdown tables comparing runs: method x task, greedy return with GPI and without, at one evaluation step.

    python -m tools.compare_runs results/babyai/comparison/* [--step 701440] [--split test]

Each cell is the mean over seeds of each seed's mean return at that step, ± the standard error over seeds. The step
defaults to the latest one that every run has evaluated. Methods without GPI (the UVFA family) are left out of the
GPI table.
"""

from __future__ import annotations

import csv
import json
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import tyro

from common.run import exit_on_config_error, format_task, open_table, require, table_path
from tools.script_contract import run_label
from tools.summarize import env_tasks, mean_se


@dataclass
class Args:
    run_dirs: tyro.conf.Positional[tuple[str, ...]]
    """run directories (each with eval.csv and config.json)"""
    step: int | None = None
    """evaluation step to compare at (default: the latest step every run has)"""
    split: str = "test"
    """tasks to show: test, train or all"""


def label(run_dir: Path) -> str:
    """The run's name in tables and figures (tools.script_contract.run_label: the method's name for the repository's
    scripts, the exp_name for a copy; older runs without a config.json: the directory's name)."""
    config = run_dir / "config.json"
    return run_label(json.loads(config.read_text()) if config.exists() else {}, run_dir.name)


def read_eval(run_dir: Path) -> dict:
    """(step, task, gpi) -> list of per-seed mean returns."""
    table = defaultdict(list)
    with open_table(run_dir / "eval.csv") as f:
        for r in csv.DictReader(f):
            table[(int(r["step"]), r["task"], int(r["gpi"]))].append(float(r["return_mean"]))
    return table


@exit_on_config_error
def main(args: Args) -> None:
    require(args.split in ("test", "train", "all"), f"--split must be test, train or all, got {args.split!r}")
    runs = [Path(d) for d in args.run_dirs]
    for d in runs:
        require(table_path(d / "eval.csv").exists(), f"no eval.csv in {d}; pass run directories")
    tables = {d: read_eval(d) for d in runs}
    steps = set.intersection(*({s for s, _, _ in t} for t in tables.values()))
    require(steps, "the runs share no evaluation step; pass --step with one of each run's steps")
    step = args.step if args.step is not None else max(steps)
    require(step in steps, f"--step {step} is not evaluated in every run; shared steps: {sorted(steps)}")
    train_tasks, test_tasks = env_tasks(runs)
    tasks = {"test": test_tasks, "train": train_tasks, "all": np.concatenate([train_tasks, test_tasks])}[args.split]
    names = [format_task(w) for w in tasks]
    seeds = sorted({len(t[(step, n, 0)]) for t in tables.values() for n in names})
    print(f"Greedy return at step {step:,} ({args.split} tasks), mean ± s.e. over {'/'.join(map(str, seeds))} "
          f"seed(s); 'mean' averages the task columns.\n")
    for gpi, title in ((1, "with GPI over the train tasks"), (0, "without GPI (acting on w directly)")):
        shown = [d for d in runs if (step, names[0], gpi) in tables[d]]
        if not shown:
            continue
        print(f"**{title}**\n")
        print("| method | " + " | ".join(names) + " | mean |")
        print("|---|" + "---:|" * (len(names) + 1))
        for d in shown:
            per_task = [tables[d][(step, n, gpi)] for n in names]
            means = np.mean([np.asarray(v) for v in per_task], axis=0)  # per seed, averaged over tasks
            print(f"| {label(d)} | " + " | ".join(mean_se(v) for v in per_task) + f" | {mean_se(means)} |")
        print()


if __name__ == "__main__":
    main(tyro.cli(Args))
