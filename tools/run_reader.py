"""One reader of a run directory, for every tool: its settings (config.json), its tables (eval.csv and metrics.csv,
as written or as tools.export packs them) and its saved agents, each parsed once, the same way everywhere.

A run directory is what a training script writes (docs/contract.md): config.json, metrics.csv, eval.csv, the
parameter files params_seed<N>.eqx (or their compact .eqz), and, where tools.analyze played its agents,
analysis/records.json. A protocol's merged run of seeds trained apart reads the same. What the protocol asks of a run
while it trains (progress, complete) is read afresh at each call; the rest is parsed once."""

from __future__ import annotations

import csv
import json
from collections import defaultdict
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path

import numpy as np

from common.run import (RESPONSE, open_table, pooled_response, read_table, require, response_means, response_sums,
                        table_path)


@dataclass
class RunReader:
    path: Path
    _cache: dict = field(default_factory=dict, repr=False)

    def __post_init__(self):
        self.path = Path(self.path)

    # ---- config.json
    @cached_property
    def config(self) -> dict:
        """config.json ({} where there is none)."""
        return self._read_config()

    def _read_config(self) -> dict:
        """config.json as it is now ({} where there is none)."""
        file = self.path / "config.json"
        return json.loads(file.read_text()) if file.exists() else {}

    @property
    def args(self) -> dict:
        return self.config.get("args", {})

    # ---- eval.csv
    def has_eval(self) -> bool:
        return table_path(self.path / "eval.csv").exists()

    @cached_property
    def eval_rows(self) -> list[dict]:
        """eval.csv's rows as dicts of strings (docs/contract.md); one line where the run has none."""
        require(self.has_eval(), f"no eval.csv in {self.path}; pass run directories")
        with open_table(self.path / "eval.csv") as f:
            return list(csv.DictReader(f))

    @cached_property
    def returns(self) -> dict[tuple[int, str, int], list[float]]:
        """(step, task, gpi) -> each seed's mean greedy return, in the rows' seed order."""
        table = defaultdict(list)
        for r in self.eval_rows:
            table[(int(r["step"]), r["task"], int(r["gpi"]))].append(float(r["return_mean"]))
        return dict(table)

    def response(self) -> dict[int, dict[int, dict[str, float]]]:
        """The cumulant response over training: step -> seed -> {RESPONSE name: mean over that evaluation's
        train-task rows acting on w, weighted by their pickups} (common.run.pooled_response); {} for a run without
        learned cumulants or written before eval.csv had the columns."""
        rows = defaultdict(list)
        for r in self.eval_rows:
            if r.get("pickups_rewarded") not in (None, ""):
                rows[(int(r["step"]), int(r["seed"]))].append(r)
        out: dict[int, dict[int, dict[str, float]]] = defaultdict(dict)
        for (step, seed), group in sorted(rows.items()):
            out[step][seed] = pooled_response(group)
        return dict(out)

    # ---- progress: read afresh at each call (the protocol asks while the run trains, and merges into it)
    def progress(self) -> tuple[int, int | None]:
        """(env steps per seed reached: the last metrics row, the protocol's total: config.json)."""
        steps = 0
        metrics = self.path / "metrics.csv"
        if table_path(metrics).exists():
            lines = read_table(metrics).splitlines()
            steps = int(lines[-1].split(",")[0]) if len(lines) > 1 else 0
        return steps, self._read_config().get("args", {}).get("total_timesteps")

    def complete(self) -> bool:
        """The run evaluated at (or past: whole iterations) its protocol's last step."""
        _, total = self.progress()
        evaluated = self.path / "eval.csv"
        steps = ([int(line.split(",")[0]) for line in read_table(evaluated).splitlines()[1:]]
                 if table_path(evaluated).exists() else [])
        return bool(total and steps and max(steps) >= total)

    # ---- saved agents and analysis/records.json
    def saved_agents(self) -> list[Path]:
        """The run's parameter files: params_seed<N>.eqx as written, or their compact .eqz (tools.compact_agents)."""
        return sorted([*self.path.glob("params_seed*.eqx"), *self.path.glob("params_seed*.eqz")])

    def analyzed(self) -> bool:
        """tools.analyze finished on this run (it writes records.json last but for the figures)."""
        return (self.path / "analysis" / "records.json").exists()

    @cached_property
    def records(self) -> list[dict]:
        """tools.analyze's seed records of this run (analysis/records.json; [] where it was not analysed)."""
        file = self.path / "analysis" / "records.json"
        return json.loads(file.read_text()) if file.exists() else []


def complete(run_dir: Path) -> bool:
    """RunReader(run_dir).complete(): for a caller that asks of one run once (the protocol, tools.export)."""
    return RunReader(run_dir).complete()


def saved_agents(run_dir: Path) -> list[Path]:
    """RunReader(run_dir).saved_agents(), for a caller that asks of one run once."""
    return RunReader(run_dir).saved_agents()


def analyzed(run_dir: Path) -> bool:
    """RunReader(run_dir).analyzed(), for a caller that asks of one run once."""
    return RunReader(run_dir).analyzed()


def parse_task(task: str) -> np.ndarray:
    return np.array([float(x) for x in task.split(",")], np.float32)


def record_response(record: dict, counterfactual: bool = False) -> dict[str, float]:
    """RESPONSE's means of one seed's analysis record (its "response": tools.analyze), as played or with the
    previous-reward counterfactual."""
    r = record["response"]
    sums = r["sums_counterfactual" if counterfactual else "sums"]
    return response_means(response_sums(sums, r["counts"], np.array([parse_task(t) for t in r["tasks"]])))


def response_curve(reader: RunReader, name: str) -> tuple[np.ndarray, np.ndarray]:
    """(steps, values [steps, seeds]) of one RESPONSE summary over training (NaN where a seed had no pickups)."""
    require(name in RESPONSE, f"unknown response summary {name!r}; one of {', '.join(RESPONSE)}")
    by_step = reader.response()
    steps = sorted(by_step)
    seeds = sorted({seed for per_seed in by_step.values() for seed in per_seed})
    values = np.array([[by_step[s].get(seed, {}).get(name, np.nan) for seed in seeds] for s in steps], float)
    return np.array(steps), values.reshape(len(steps), len(seeds))
