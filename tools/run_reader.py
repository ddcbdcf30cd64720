"""One reader of a run directory, for every tool: its settings (config.json), its tables (eval.csv and metrics.csv,
as written or as tools.export packs them) and its saved agents, each parsed once, the same way everywhere.

A run directory is what a training script writes (docs/contract.md): config.json, metrics.csv, eval.csv, the
parameter files params_seed<N>.eqx (or their compact .eqz), and, where tools.analyze played its agents,
analysis/records.json and analysis/per_seed.csv. A protocol's merged run of seeds trained apart reads the same, and so
does a method of such a protocol that is not complete yet (method_reader): its complete seeds' runs (<method>/seed<k>/)
read as one run of those seeds. What the protocol asks of a run while it trains (progress, complete) is read afresh at
each call; the rest is parsed once. A reader stands for its run in the tools' dicts (one reader per run: it is hashed
by identity).

What reads several runs or a record rather than one run is a module function: recorded_env (a config.json or a
parameter file's header), env_tasks (runs that must share an env), tasks_of_env, pooled_return (metrics.csv rows)."""

from __future__ import annotations

import csv
import json
from collections import defaultdict
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, NamedTuple

import numpy as np

from common.run import (RESPONSE, format_task, open_table, pooled_response, read_table, require, response_means,
                        response_sums, table_path)
from tools.script_contract import run_label

if TYPE_CHECKING:
    from common.envs.babyai import GotoAvoid


class Evaluation(NamedTuple):
    """A run's last evaluation (RunReader.last_evaluation): its step and eval.csv's rows at it."""

    step: int
    rows: list[dict]

    @property
    def returns(self) -> defaultdict[tuple[str, int], list[float]]:
        """(task, gpi) -> each seed's mean greedy return, in the rows' seed order ([] for a cell the run lacks: a
        method without GPI has no gpi 1)."""
        return seed_returns(self.rows, lambda r: (r["task"], int(r["gpi"])))


@dataclass(eq=False)
class RunReader:
    """A run directory read for the tools (module doc): construct one per run and ask it; each file is parsed at the
    first question that needs it."""

    path: Path
    seed_runs: tuple[Path, ...] = ()
    """for a method trained seed by seed and not merged yet: its complete seeds' runs, read as one run of those seeds
    (their tables' rows, records and agents together; config.json the first seed's): method_reader"""
    label_as: str | None = None
    """the run's name in tables and figures, where a tool sets one (two runs of one method from different folders)"""
    _cache: dict = field(default_factory=dict, repr=False)

    def __post_init__(self):
        self.path = Path(self.path)
        self.seed_runs = tuple(Path(p) for p in self.seed_runs)

    # ---- config.json
    @cached_property
    def config(self) -> dict:
        """config.json ({} where there is none)."""
        return self._read_config()

    def _read_config(self) -> dict:
        """config.json as it is now ({} where there is none)."""
        file = (self.seed_runs[0] if self.seed_runs else self.path) / "config.json"
        return json.loads(file.read_text()) if file.exists() else {}

    @property
    def args(self) -> dict:
        """The settings config.json records ({} for a copy of a run's eval.csv alone)."""
        return self.config.get("args", {})

    @property
    def env(self) -> str:
        """The environment the run trained on, as its config.json records it (recorded_env)."""
        return recorded_env(self.config)

    @property
    def label(self) -> str:
        """The run's name in tables and figures (tools.script_contract.run_label: the method's name for the
        repository's scripts, the exp_name for a copy; older runs without a config.json: the directory's name), or
        label_as where a tool set it."""
        return self.label_as or run_label(self.config, self.path.name)

    def babyai_room(self) -> GotoAvoid:
        """The GotoAvoid room a BabyAI run trained in (its grid size, objects and episode length from config.json;
        the paper's room for runs saved before they were settings): the room its references are played in."""
        from common.envs import babyai  # (imported only where asked, as tasks_of_env's envs)

        saved = self.args
        return babyai.GotoAvoid(obs_mode="symbolic", grid_size=saved.get("grid_size", babyai.ROOM_SIZE),
                                objects_per_category=saved.get("objects_per_category", babyai.OBJECTS_PER_CATEGORY),
                                episode_steps=saved.get("episode_steps", babyai.MAX_STEPS))

    # ---- eval.csv
    def has_eval(self) -> bool:
        """Whether the run has an eval.csv (as written or packed)."""
        return all(table_path(d / "eval.csv").exists() for d in self.seed_runs or (self.path,))

    @cached_property
    def eval_rows(self) -> list[dict]:
        """eval.csv's rows as dicts of strings (docs/contract.md); one line where the run has none."""
        return self._table_rows("eval.csv")

    @cached_property
    def returns(self) -> defaultdict[tuple[int, str, int], list[float]]:
        """(step, task, gpi) -> each seed's mean greedy return, in the rows' seed order ([] for a cell the run
        lacks)."""
        return seed_returns(self.eval_rows, lambda r: (int(r["step"]), r["task"], int(r["gpi"])))

    def last_evaluation(self) -> Evaluation:
        """The run's last evaluated step and eval.csv's rows at it (what the tables report as its final returns);
        one line where eval.csv has no rows yet."""
        rows = self.eval_rows
        require(bool(rows), f"{self.path / 'eval.csv'} has no evaluation rows yet")
        step = max(int(r["step"]) for r in rows)
        return Evaluation(step, [r for r in rows if int(r["step"]) == step])

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

    # ---- metrics.csv
    def has_metrics(self) -> bool:
        """Whether the run has a metrics.csv (as written or packed)."""
        return all(table_path(d / "metrics.csv").exists() for d in self.seed_runs or (self.path,))

    @cached_property
    def metrics_rows(self) -> list[dict]:
        """metrics.csv's rows as dicts of strings (docs/contract.md); one line where the run has none."""
        return self._table_rows("metrics.csv")

    def metrics_of_seeds(self) -> dict[int, list[dict]]:
        """seed -> its metrics.csv rows in the order logged, seeds in order: the training actors' windows of each
        seed."""
        seeds: dict[int, list[dict]] = {}
        for r in self.metrics_rows:
            seeds.setdefault(int(r["seed"]), []).append(r)
        return dict(sorted(seeds.items()))

    def actor_returns(self, from_step: int, train_tasks) -> dict[tuple[int, str], tuple[float, float, float]]:
        """(seed, task) -> (mean return, its s.e., episodes) of the training actors' episodes that ended in the
        metrics.csv rows after from_step (pooled_return); metrics.csv must count the episodes of each row."""
        metrics_csv = self.path / "metrics.csv"
        rows = self.metrics_rows
        names = [format_task(w) for w in train_tasks]
        require(rows and f"episodes_train_{names[0]}" in rows[0],
                f"{metrics_csv} has no episodes_train_* columns (written since 2026-11-28): its runs' returns cannot "
                "be pooled over episodes; leave out --actors-from")
        out = {}
        for seed, mine in self.metrics_of_seeds().items():
            later = [r for r in mine if int(r["step"]) > from_step]
            require(later, f"{metrics_csv} has no rows of seed {seed} after step {from_step:,}; pass an earlier step")
            for t in names:
                out[(seed, t)] = pooled_return(later, t)
        return out

    def _table_rows(self, name: str) -> list[dict]:
        """A table's rows (eval.csv, metrics.csv, as written or packed) as dicts of strings; one line where the run
        has none."""
        rows = []
        for d in self.seed_runs or (self.path,):  # (seeds' rows by step, then seed: as the protocol merges them)
            require(table_path(d / name).exists(), f"no {name} in {d}; pass run directories")
            with open_table(d / name) as f:
                rows.extend(csv.DictReader(f))
        return sorted(rows, key=lambda r: (int(r["step"]), int(r["seed"]))) if self.seed_runs else rows

    # ---- progress: read afresh at each call (the protocol asks while the run trains, and merges into it); of the
    # folder itself, also for a reader of seed runs (a method not merged yet is not complete)
    def progress(self) -> tuple[int, int | None]:
        """(env steps per seed reached: the last metrics row, the protocol's total: config.json)."""
        steps = 0
        metrics = self.path / "metrics.csv"
        if table_path(metrics).exists():
            lines = read_table(metrics).splitlines()
            steps = int(lines[-1].split(",")[0]) if len(lines) > 1 else 0
        return steps, self._read_config().get("args", {}).get("total_timesteps")

    def complete(self, total: int | None = None) -> bool:
        """The run evaluated at (or past: whole iterations) its last step: total, or else its own (config.json's
        --total-timesteps; a protocol's --method-steps may extend a run past it)."""
        total = total or self.progress()[1]
        evaluated = self.path / "eval.csv"
        steps = ([int(line.split(",")[0]) for line in read_table(evaluated).splitlines()[1:]]
                 if table_path(evaluated).exists() else [])
        return bool(total and steps and max(steps) >= total)

    # ---- saved agents and analysis/ (tools.analyze)
    def saved_agents(self) -> list[Path]:
        """The run's parameter files: params_seed<N>.eqx as written, or their compact .eqz (tools.compact_agents)."""
        return sorted(p for d in self.seed_runs or (self.path,)
                      for p in [*d.glob("params_seed*.eqx"), *d.glob("params_seed*.eqz")])

    def analyzed(self) -> bool:
        """tools.analyze finished on this run (it writes records.json last but for the figures)."""
        return all((d / "analysis" / "records.json").exists() for d in self.seed_runs or (self.path,))

    @cached_property
    def records(self) -> list[dict]:
        """tools.analyze's seed records of this run (analysis/records.json; [] where it was not analysed)."""
        files = [d / "analysis" / "records.json" for d in self.seed_runs or (self.path,)]
        return [record for file in files if file.exists() for record in json.loads(file.read_text())]

    @cached_property
    def analysis_rows(self) -> list[dict]:
        """tools.analyze's per-seed, per-task rows of this run (analysis/per_seed.csv, Table A's errors among them;
        made from analysis/records.json where a seed has its records alone, as tools.export carries a protocol's
        seeds; [] where it was not analysed)."""
        rows = []
        for d in self.seed_runs or (self.path,):
            if (d / "analysis" / "per_seed.csv").exists():
                with (d / "analysis" / "per_seed.csv").open() as f:
                    rows.extend(csv.DictReader(f))
            elif (d / "analysis" / "records.json").exists():  # (the same rows, from the seeds' records)
                rows.extend(row for r in json.loads((d / "analysis" / "records.json").read_text())
                            for row in record_rows(r.get("name", r.get("method", "")), r))
        return rows


def record_rows(name: str, record: dict) -> list[dict]:
    """per_seed.csv's rows of one seed's analysis record (tools.analyze): per task its split, the greedy episodes'
    mean return and, for learned cumulants, the mean |phi . w - r| and (phi . w - r)^2 over its transitions (Table A's
    errors per seed), numbers to 6 significant digits as per_seed.csv writes them ("" where there are none)."""
    from common.envs.babyai import TEST_TASKS

    test = {format_task(w) for w in TEST_TASKS}
    errors = record.get("errors")
    return [{"method": name, "seed": record["seed"], "step": record["step"], "gpi": int(record["gpi"]),
             "split": "test" if task in test else "train", "task": task, "episodes": record["episodes"],
             "return": f"{record['returns'][t]:.6g}",
             "abs_error": "" if errors is None else f"{errors['abs'][t] / errors['transitions']:.6g}",
             "sq_error": "" if errors is None else f"{errors['sq'][t] / errors['transitions']:.6g}"}
            for t, task in enumerate(record["tasks"])]


def method_reader(path: Path | str) -> RunReader:
    """The reader of a run folder, or of a protocol's method trained seed by seed that is not merged yet (no eval.csv
    of its own; tools.protocol, tools.export): its complete seed<k>/ runs read as one run of those seeds."""
    path = Path(path)
    if not table_path(path / "eval.csv").exists():
        seeds = sorted((d for d in path.glob("seed*/") if d.name[4:].isdigit() and complete(d)),
                       key=lambda d: int(d.name[4:]))
        if seeds:
            return RunReader(path, seed_runs=tuple(seeds))
    return RunReader(path)


def complete(run_dir: Path, total: int | None = None) -> bool:
    """RunReader(run_dir).complete(total): for a caller that asks of one run once (the protocol, tools.export)."""
    return RunReader(run_dir).complete(total)


def saved_agents(run_dir: Path) -> list[Path]:
    """RunReader(run_dir).saved_agents(), for a caller that asks of one run once."""
    return RunReader(run_dir).saved_agents()


def analyzed(run_dir: Path) -> bool:
    """RunReader(run_dir).analyzed(), for a caller that asks of one run once."""
    return RunReader(run_dir).analyzed()


def seed_returns(rows: Iterable[dict], key: Callable[[dict], tuple]) -> defaultdict[tuple, list[float]]:
    """key(row) -> each seed's mean greedy return (eval.csv's return_mean), in the rows' order: the one way the
    tables and figures gather eval.csv's returns."""
    table = defaultdict(list)
    for r in rows:
        table[key(r)].append(float(r["return_mean"]))
    return table


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


def env_tasks(runs: Iterable[RunReader | Path | str]) -> tuple[np.ndarray, np.ndarray]:
    """(train tasks, test tasks) of the runs' environment (run directories, or their readers where a tool has them);
    runs of different environments are refused."""
    envs = {(run if isinstance(run, RunReader) else RunReader(run)).env for run in runs}
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
    from common.envs import babyai

    return babyai.TRAIN_TASKS, babyai.TEST_TASKS


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


def parse_task(task: str) -> np.ndarray:
    """A task as eval.csv and the records write it ("1,0,-1,0") back to its vector."""
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
