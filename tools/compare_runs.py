"""Markdown tables comparing runs: method x task, greedy return with GPI and without, at one evaluation step.

    python -m tools.compare_runs results/babyai/comparison/* [--step 701440] [--split test]

Each cell is the mean over seeds of each seed's mean return at that step, ± the standard error over seeds. The step
defaults to the latest one that every run has evaluated. Methods without GPI (the UVFA family) are left out of the
GPI table.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import tyro

from common.run import exit_on_config_error, format_task, require
from tools.run_reader import env_tasks, method_reader
from tools.tables import mean_se


@dataclass
class Args:
    run_dirs: tyro.conf.Positional[tuple[str, ...]]
    """run directories (each with eval.csv and config.json)"""
    step: int | None = None
    """evaluation step to compare at (default: the latest step every run has)"""
    split: str = "test"
    """tasks to show: test, train or all"""


@exit_on_config_error
def main(args: Args) -> None:
    require(args.split in ("test", "train", "all"), f"--split must be test, train or all, got {args.split!r}")
    runs = [method_reader(d) for d in args.run_dirs]
    # a run without an eval.csv stops here with one line (RunReader.eval_rows)
    steps = set.intersection(*({s for s, _, _ in run.returns} for run in runs))
    require(steps, "the runs share no evaluation step; pass --step with one of each run's steps")
    step = args.step if args.step is not None else max(steps)
    require(step in steps, f"--step {step} is not evaluated in every run; shared steps: {sorted(steps)}")
    train_tasks, test_tasks = env_tasks(runs)
    tasks = {"test": test_tasks, "train": train_tasks, "all": np.concatenate([train_tasks, test_tasks])}[args.split]
    names = [format_task(w) for w in tasks]
    seeds = sorted({len(run.returns[(step, n, 0)]) for run in runs for n in names})
    print(f"Greedy return at step {step:,} ({args.split} tasks), mean ± s.e. over {'/'.join(map(str, seeds))} "
          f"seed(s); 'mean' averages the task columns.\n")
    for gpi, title in ((1, "with GPI over the train tasks"), (0, "without GPI (acting on w directly)")):
        shown = [run for run in runs if (step, names[0], gpi) in run.returns]
        if not shown:
            continue
        print(f"**{title}**\n")
        print("| method | " + " | ".join(names) + " | mean |")
        print("|---|" + "---:|" * (len(names) + 1))
        for run in shown:
            per_task = [run.returns[(step, n, gpi)] for n in names]
            means = np.mean([np.asarray(v) for v in per_task], axis=0)  # per seed, averaged over tasks
            print(f"| {run.label} | " + " | ".join(mean_se(v) for v in per_task) + f" | {mean_se(means)} |")
        print()


if __name__ == "__main__":
    main(tyro.cli(Args))
