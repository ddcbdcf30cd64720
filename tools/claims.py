"""The paper's BabyAI claims on one protocol's runs: a table per method and the paper's comparisons, each with a 95%
interval over seeds.

    python -m tools.claims OUT_DIR [--out OUT_DIR/claims.md] [--beside OTHER_DIR ...] [--crosstalk-beside DIR ...]

OUT_DIR is a BabyAI protocol's folder (tools.protocol): one folder per method, named as the protocol names them
(msfa, usfa_learned, usfa, uvfa_farm, msfa_entangled_psi, ..., uvfa, mvfa), each a run of every seed with its
eval.csv and, for the methods with learned cumulants, analysis/per_seed.csv (tools.analyze writes it; the protocol
runs the analysis at its end). Methods that are missing are left out of the table, and so are the comparisons that
need them. A method that the protocol trains seed by seed (OUT_DIR/<method>/seed<k>/) and has not merged yet counts
its complete seeds (each with its eval.csv and, once played, analysis/records.json), as an export carries them: the
tables of a protocol in progress, with the method marked so.

Per seed, at each run's last evaluation: the greedy return on the train tasks without GPI, on the test tasks with GPI
(the SF methods) and without, each the mean over the split's tasks of eval.csv's return_mean; and Table A's
reward-prediction error |phi . w - r| of the learned cumulants, the mean over the split's tasks of per_seed.csv's
per-task means (the episodes of the agent's own evaluation policy; RunReader.analysis_rows: from a seed's
records.json where it has no per_seed.csv). A cell is the mean over seeds and its 95% percentile-bootstrap interval
(scipy.stats.bootstrap, 10,000 resamples of the seeds, a fixed PRNG seed).

A comparison is the difference of two such means, A - B, with its interval: seeds resampled within each method apart
(different methods' seeds are independent runs), or together where both sides are the same seeds (GPI against no GPI
of one method). It "holds" where the interval lies wholly on the paper's side of 0, is "reversed" where it lies
wholly on the other, and is "not resolved" where it holds 0. USFA with the env's cumulants has no side: it is the
reference an SF method can reach. The comparisons are the paper's BabyAI results (section 5.1: R1-R3 and Table A) and
what its baselines are there to show (section 5: UVFA, SF&GPI's transfer; UVFA-FARM and MVFA, the benefit of modules
that learn SFs rather than values).

For the methods with learned cumulants, their response at the end (tools.analyze's records: docs/cumulants.md), with
whether they are separated (category detectors: the crosstalk c's 95% interval wholly below SEPARATED_BELOW), and
GPI's cost on the train tasks; for those whose eval.csv records the response, c over training: at up to 10
evaluations, mean over seeds and its 95% bootstrap interval.

--beside puts another protocol of the same room beside this one (e.g. the paper form's 10 seeds beside a protocol
of reward-blind forms): its methods join every table and comparison. A protocol of another room is refused there
(its returns are on another scale, and the per-task tables' references are this room's); --crosstalk-beside adds
its methods to the c-over-training table alone, at the env steps every method there evaluated: the paper's room
beside the miniature at the same env steps, c being a room-free measure (1 for a reward detector, 0 for a category
detector).

Then per test task, each method's return with GPI (the SF methods) and without (every method), mean over seeds and its
95% bootstrap interval, beside the BFS oracle's and random play's stored returns (the paper's Figure 3 as a table).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import tyro
from scipy import stats

from common.envs.babyai import TEST_TASKS, TRAIN_TASKS
from common.run import RESPONSE, exit_on_config_error, format_task, require
from tools import reference_returns
from tools.protocol import BLIND
from tools.run_reader import Evaluation, RunReader, method_reader, record_response

MEASURES = {  # name: column title
    "train": "train, no GPI",
    "test_gpi": "test, GPI",
    "test": "test, no GPI",
    "error_train": "Table A error, train",
    "error_test": "Table A error, test",
}
CUMULANT_MEASURES = {  # name: column title (the learned cumulants' response: docs/cumulants.md)
    "own_rewarded": "phi, own rewarded",
    "own_unrewarded": "phi, own unrewarded",
    "crosstalk": "crosstalk c",
    "cross_unrewarded": "phi, cross unrewarded",
    "crosstalk_counterfactual": "c, previous reward 0",
    "gpi_cost_train": "GPI's cost, train",
}
SEPARATED_BELOW = 0.1
"""the cumulants of a method are called separated (category detectors, not reward detectors) where the crosstalk c's
95% interval over its seeds lies wholly below this"""
DIGITS = {"error_train": 3, "error_test": 3} | {name: 3 for name in CUMULANT_MEASURES} | {"gpi_cost_train": 2}
COMPARISONS = (  # (claim, A, its measure, B, its measure, the paper's side of A - B: +1, -1, or 0 for a reference)
    ("MSFA beats USFA with learned cumulants on the test tasks (GPI)", "msfa", "test_gpi", "usfa_learned",
     "test_gpi", +1),
    ("MSFA beats its entangled-psi ablation (test, GPI)", "msfa", "test_gpi", "msfa_entangled_psi", "test_gpi", +1),
    ("MSFA beats its entangled-phi ablation (test, GPI)", "msfa", "test_gpi", "msfa_entangled_phi", "test_gpi", +1),
    ("MSFA beats its entangled-psi-and-phi ablation (test, GPI)", "msfa", "test_gpi", "msfa_entangled_both",
     "test_gpi", +1),
    ("GPI helps MSFA on the test tasks", "msfa", "test_gpi", "msfa", "test", +1),
    ("GPI helps USFA with learned cumulants on the test tasks", "usfa_learned", "test_gpi", "usfa_learned", "test",
     +1),
    ("GPI helps USFA with the env's cumulants on the test tasks", "usfa", "test_gpi", "usfa", "test", +1),
    ("Without GPI, MSFA beats USFA with learned cumulants on the test tasks (modularity alone)", "msfa", "test",
     "usfa_learned", "test", +1),
    ("MSFA (GPI) beats UVFA-FARM on the test tasks", "msfa", "test_gpi", "uvfa_farm", "test", +1),
    ("MSFA (GPI) beats MVFA on the test tasks", "msfa", "test_gpi", "mvfa", "test", +1),
    ("MSFA (GPI) beats UVFA on the test tasks", "msfa", "test_gpi", "uvfa", "test", +1),
    ("USFA with the env's cumulants (GPI) beats UVFA on the test tasks (SF&GPI's transfer)", "usfa", "test_gpi",
     "uvfa", "test", +1),
    ("MSFA's cumulants predict the test reward better than USFA-learned's (Table A)", "msfa", "error_test",
     "usfa_learned", "error_test", -1),
    ("MSFA against USFA with the env's cumulants, the reference (test, GPI)", "msfa", "test_gpi", "usfa",
     "test_gpi", 0),
)
RESAMPLES = 10_000


@dataclass
class Args:
    out_dir: tyro.conf.Positional[str]
    """a BabyAI protocol's folder: one run folder per method (msfa, usfa_learned, ...)"""
    out: str | None = None
    """where to write the markdown (default OUT_DIR/claims.md)"""
    beside: tuple[str, ...] = ()
    """other protocols' folders in the same room whose methods join the tables, each named '<label> [<folder
    name>]' (e.g. the paper form's 10 seeds beside a protocol of reward-blind forms); each form comparison is made
    against them too"""
    crosstalk_beside: tuple[str, ...] = ()
    """other protocols' folders, of any room, whose methods' crosstalk c joins the c-over-training table alone
    (named '<label> [<folder name>]'), at the env steps every method there evaluated"""


def last_evaluation(run: RunReader) -> Evaluation:
    """A run's last evaluated step and eval.csv's rows at it (RunReader.last_evaluation), each task one of the paper's
    tasks of its split and each seed's (task, gpi) once: tools.claims reads the paper's BabyAI protocol, each run's
    own eval.csv."""
    table = run.path / "eval.csv"
    step, rows = evaluation = run.last_evaluation()
    tasks = {"train": {format_task(w) for w in TRAIN_TASKS}, "test": {format_task(w) for w in TEST_TASKS}}
    seen = set()
    for r in rows:
        require(r["task"] in tasks[r["split"]], f"{table}: task {r['task']} is not one of the "
                                                f"paper's {r['split']} tasks; tools.claims reads the paper's BabyAI "
                                                "protocol")
        key = (r["seed"], r["split"], r["task"], r["gpi"])
        require(key not in seen, f"{table} has two rows for seed {key[0]}, task {key[2]}, gpi "
                                 f"{key[3]} at step {step:,}; pass a run's own eval.csv, not joined ones")
        seen.add(key)
    return evaluation


def per_task_returns(rows: list[dict]) -> dict[tuple[str, int], dict[int, float]]:
    """{(test task, gpi): {seed: greedy return}} of a run's last evaluation (last_evaluation's rows)."""
    out: dict[tuple[str, int], dict[int, float]] = {}
    for r in rows:
        if r["split"] == "test":
            out.setdefault((r["task"], int(r["gpi"])), {})[int(r["seed"])] = float(r["return_mean"])
    return {key: dict(sorted(by_seed.items())) for key, by_seed in out.items()}


def method_runs(out_dir: Path) -> dict[str, RunReader]:
    """Each method folder's run (run_reader.method_reader): its own, or, for a method trained seed by seed and not
    complete yet, its complete seeds' runs read as one."""
    runs = {d.name: method_reader(d) for d in sorted(p for p in out_dir.iterdir() if p.is_dir())}
    return {name: run for name, run in runs.items() if run.has_eval()}


def per_seed_measures(run: RunReader | Path, evaluation: Evaluation | None = None
                      ) -> tuple[int, dict[str, dict[int, float]]]:
    """A method's last evaluated step and {measure: {seed: value}} (module doc); `evaluation` is the run's
    last_evaluation where it was read already."""
    run = run if isinstance(run, RunReader) else method_reader(run)
    step, rows = evaluation or last_evaluation(run)
    values: dict[str, dict[int, list]] = {}
    for r in rows:
        name = {("train", "0"): "train", ("test", "1"): "test_gpi", ("test", "0"): "test"}.get((r["split"], r["gpi"]))
        if name:
            values.setdefault(name, {}).setdefault(int(r["seed"]), []).append(float(r["return_mean"]))
    by_seed: dict[int, dict[tuple[str, str], float]] = {}
    for r in rows:  # GPI's cost on the train tasks: acting on w minus GPI (SF methods)
        if r["split"] == "train":
            by_seed.setdefault(int(r["seed"]), {}).setdefault(r["gpi"], []).append(float(r["return_mean"]))
    for seed, settings in by_seed.items():
        if "0" in settings and "1" in settings:
            values.setdefault("gpi_cost_train", {})[seed] = [np.mean(settings["0"]) - np.mean(settings["1"])]
    for record in run.records:  # the cumulant response of the analysis' episodes (acting on w)
        if "response" in record:
            played, blind = record_response(record), record_response(record, counterfactual=True)
            for name in RESPONSE:
                values.setdefault(name, {})[int(record["seed"])] = [played[name]]
            values.setdefault("crosstalk_counterfactual", {})[int(record["seed"])] = [blind["crosstalk"]]
    for r in run.analysis_rows:
        if r["abs_error"]:
            values.setdefault(f"error_{r['split']}", {}).setdefault(int(r["seed"]), []).append(float(r["abs_error"]))
    return step, {name: {seed: float(np.mean(v)) for seed, v in sorted(per_seed.items()) if not np.isnan(np.mean(v))}
                  for name, per_seed in values.items()}


def interval(*samples: np.ndarray, paired: bool = False) -> tuple[float, float, float]:
    """The mean of one sample (or the difference of two samples' means) and its 95% percentile-bootstrap interval;
    (mean, nan, nan) where a sample has a single seed."""
    def statistic(*x, axis=-1):
        return np.mean(x[0], axis) - (np.mean(x[1], axis) if len(x) > 1 else 0.0)

    point = float(statistic(*samples))
    if min(len(s) for s in samples) < 2:
        return point, float("nan"), float("nan")
    ci = stats.bootstrap(samples, statistic, paired=paired, vectorized=True, n_resamples=RESAMPLES,
                         confidence_level=0.95, method="percentile", rng=np.random.default_rng(0)).confidence_interval
    return point, float(ci.low), float(ci.high)


def number(x: float, digits: int = 2) -> str:
    """x to `digits` decimals, with no sign on a value that rounds to zero (-0.001 is "0.00", not "-0.00")."""
    return f"{x:.{digits}f}" if round(x, digits) != 0 else f"{0.0:.{digits}f}"


def cell(mean: float, low: float, high: float, digits: int = 2) -> str:
    if np.isnan(low):
        return number(mean, digits)
    return f"{number(mean, digits)} [{number(low, digits)}, {number(high, digits)}]"


def verdict(low: float, high: float, side: int) -> str:
    if side == 0:
        return "reference"
    if np.isnan(low):
        return "not resolved (one seed)"
    if (low > 0 if side > 0 else high < 0):
        return "holds"
    if (high < 0 if side > 0 else low > 0):
        return "reversed"
    return "not resolved"


def stored_references(run: RunReader) -> dict | None:
    """The BFS oracle's and random play's stored returns in the run's room (tools.reference_returns), or None."""
    return reference_returns.stored("babyai", reference_returns.room_setting(run.babyai_room()))


def reference_rows(entry: dict | None) -> list[str]:
    """The BFS oracle's and random play's rows of the per-method table, where they are stored."""
    if entry is None:
        return []
    rows = []
    for policy in reference_returns.POLICIES["babyai"]:
        returns = entry["returns"][policy]
        train = np.mean([returns[format_task(w)]["mean"] for w in TRAIN_TASKS])
        test = np.mean([returns[format_task(w)]["mean"] for w in TEST_TASKS])
        rows.append(f"| {policy} ({entry['episodes']} episodes per task) | - | - | {train:.2f} | {test:.2f} | "
                    f"{test:.2f} | - | - |")
    return rows


def claims(out_dir: Path, beside: tuple[Path, ...] = (), crosstalk_beside: tuple[Path, ...] = ()) -> list[str]:
    runs = method_runs(out_dir)
    require(bool(runs), f"{out_dir} holds no run folder with an eval.csv (nor a complete seed<k>/ run); pass a "
                        "protocol's folder")
    labels = {name: run.label for name, run in runs.items()}
    room = room_of(next(iter(runs.values())))
    for other in beside:  # (their methods named <method>@<folder>)
        theirs = others_runs(other, "--beside")
        for run in theirs.values():
            require(room_of(run) == room,
                    f"--beside {other}: {run.path} was trained in another room ({room_of(run)}) than {out_dir} "
                    f"({room}); its returns do not compare: pass it as --crosstalk-beside for c over training alone")
        runs |= {f"{name}@{other.name}": method for name, method in theirs.items()}
        labels |= {f"{name}@{other.name}": f"{run.label} [{other.name}]" for name, run in theirs.items()}
    curve_runs, curve_labels = dict(runs), dict(labels)
    for other in crosstalk_beside:
        theirs = others_runs(other, "--crosstalk-beside")
        curve_runs |= {f"{name}@{other.name}": method for name, method in theirs.items()}
        curve_labels |= {f"{name}@{other.name}": f"{run.label} [{other.name}]" for name, run in theirs.items()}
    evaluations = {name: last_evaluation(run) for name, run in runs.items()}
    measured = {name: per_seed_measures(run, evaluations[name]) for name, run in runs.items()}
    partial = [f"{labels[name]} (seeds {', '.join(d.name[4:] for d in run.seed_runs)})"
               for name, run in runs.items() if run.seed_runs]
    lines = ["## Per method", "",
             "At each run's last evaluation; per seed the mean over the split's tasks, then the mean over seeds "
             "[95% bootstrap interval over seeds]. Returns are greedy episodes' (eval.csv); Table A's error is "
             "the reward-prediction error mean abs(phi . w - r) of the learned cumulants (analysis/per_seed.csv).", "",
             *([f"In progress (trained seed by seed; the complete seeds so far): {'; '.join(partial)}.", ""]
               if partial else []),
             "| method | seeds | step | " + " | ".join(MEASURES.values()) + " |",
             "|---|---:|---:|" + "---:|" * len(MEASURES)]
    for name, (step, values) in measured.items():
        seeds = len(values.get("train", {}))
        cells = [cell(*interval(np.array(list(values[m].values()))), digits=DIGITS.get(m, 2))
                 if values.get(m) else "-" for m in MEASURES]
        lines.append(f"| {labels[name]} | {seeds} | {step:,} | " + " | ".join(cells) + " |")
    stored = stored_references(next(iter(runs.values())))
    lines += reference_rows(stored)
    lines += cumulant_table(measured, labels)
    lines += crosstalk_over_training(curve_runs, curve_labels)
    lines += ["", "## The paper's comparisons", "",
              "A - B: the difference of the means over seeds [95% bootstrap interval]; holds where the interval lies "
              "on the paper's side of 0.", "",
              "| claim | A | B | A - B | outcome |", "|---|---|---|---:|---|"]
    for claim, a, measure_a, b, measure_b, side in both_forms(COMPARISONS, tuple(d.name for d in beside)):
        if not (measured.get(a, (0, {}))[1].get(measure_a) and measured.get(b, (0, {}))[1].get(measure_b)):
            continue
        x, y = measured[a][1][measure_a], measured[b][1][measure_b]
        paired = a == b
        if paired:
            require(x.keys() == y.keys(), f"{runs[a].path}: the seeds of {measure_a} and {measure_b} differ")
        digits = DIGITS.get(measure_a, 2)
        mean, low, high = interval(np.array(list(x.values())), np.array(list(y.values())), paired=paired)
        lines.append(f"| {claim} | {labels[a]}: {MEASURES[measure_a]} | {labels[b]}: {MEASURES[measure_b]} | "
                     f"{cell(mean, low, high, digits)} | {verdict(low, high, side)} |")
    lines += per_task_tables({name: per_task_returns(rows) for name, (_, rows) in evaluations.items()}, labels,
                             stored)
    return lines


def others_runs(other: Path, option: str) -> dict[str, RunReader]:
    """Another protocol's method runs (method_runs), refused with one line where it has none."""
    theirs = method_runs(other)
    require(bool(theirs), f"{option} {other} holds no run folder with an eval.csv; pass a protocol's folder")
    return theirs


def room_of(run: RunReader) -> str:
    """A BabyAI run's room, as words: what must agree for two runs' returns to compare."""
    return ", ".join(f"{key} {value}" for key, value in reference_returns.room_setting(run.babyai_room()).items())


def cumulant_table(measured: dict, labels: dict[str, str]) -> list[str]:
    """Per method with learned cumulants (or GPI), their response and GPI's cost on the train tasks."""
    rows = [(name, values) for name, (_, values) in measured.items()
            if any(values.get(m) for m in CUMULANT_MEASURES)]
    if not rows:
        return []
    lines = ["", "## The learned cumulants' response and GPI's cost on the train tasks", "",
             "phi^i at pickups on the train tasks acting on w (tools.analyze's episodes; docs/cumulants.md): own "
             "category rewarded (task e_i) and unrewarded (tasks e_k, k != i); crosstalk c, at other categories' "
             "rewarded pickups; other categories' unrewarded pickups; c again with the previous-reward input 0 "
             "(the counterfactual). A category detector gives 1, 1, 0, 0, (0); a reward detector 1, 0, 1, 0, (0). "
             "GPI's cost: the greedy train-task return acting on w minus with GPI (eval.csv's last evaluation; 0 "
             "with exact cumulants). Mean over seeds [95% bootstrap interval]. Separated: c's interval lies wholly "
             f"below {SEPARATED_BELOW} (category detectors).", "",
             "| method | seeds | " + " | ".join(CUMULANT_MEASURES.values()) + " | separated |",
             "|---|---:|" + "---:|" * len(CUMULANT_MEASURES) + "---|"]
    for name, values in rows:
        intervals = {m: interval(np.array(list(values[m].values()))) for m in CUMULANT_MEASURES if values.get(m)}
        cells = [cell(*intervals[m], digits=DIGITS[m]) if m in intervals else "-" for m in CUMULANT_MEASURES]
        separated = "-" if "crosstalk" not in intervals else (
            "yes" if intervals["crosstalk"][2] < SEPARATED_BELOW else "no")
        seeds = max(len(values[m]) for m in CUMULANT_MEASURES if values.get(m))
        lines.append(f"| {labels[name]} | {seeds} | " + " | ".join([*cells, separated]) + " |")
    return lines


def crosstalk_over_training(runs: dict[str, RunReader], labels: dict[str, str], rows: int = 10) -> list[str]:
    """The crosstalk c at evaluations over training (eval.csv's response columns: each seed's value pooled over the
    train tasks' pickups, RunReader.response), per method that recorded it: mean over seeds [95% bootstrap]; at most
    `rows` evaluations, evenly spaced and ending at the last, of the steps every such method evaluated."""
    curves = {name: run.response() for name, run in runs.items()}
    curves = {name: by_step for name, by_step in curves.items() if by_step}
    if not curves:
        return []
    steps = sorted(set.intersection(*(set(by_step) for by_step in curves.values())))
    lines = ["", "## The crosstalk c over training", "",
             "c (phi^i at other categories' rewarded pickups: 1 for a reward detector, 0 for a category detector) at "
             "the evaluations' own train-task episodes acting on w (eval.csv), each seed's pooled over its pickups; "
             "mean over seeds [95% bootstrap interval]; at the env steps every method here evaluated.", ""]
    if not steps:
        return [*lines, "No env step was evaluated by every one of " + ", ".join(labels[n] for n in curves) + "."]
    stride = -(-len(steps) // rows)
    shown = steps[::-1][::stride][::-1]
    lines += ["| env steps | " + " | ".join(labels[name] for name in curves) + " |", "|---:|" + "---:|" * len(curves)]
    for step in shown:
        cells = []
        for by_step in curves.values():
            values = np.array([v["crosstalk"] for v in by_step[step].values() if not np.isnan(v["crosstalk"])])
            cells.append(cell(*interval(values), digits=3) if len(values) else "-")
        lines.append(f"| {step:,} | " + " | ".join(cells) + " |")
    return lines


def both_forms(comparisons, beside: tuple[str, ...] = ()) -> list[tuple]:
    """The comparisons as the paper makes them, then each again between the reward-blind forms of its methods
    (tools.protocol's <method>_blind), then as the protocols beside it made them (<method>@<folder>), then each
    method's reward-blind form against its paper form: the one of the same protocol, and those beside it."""
    blind = [(f"{claim} [both reward-blind]", a + BLIND, ma, b + BLIND, mb, side)
             for claim, a, ma, b, mb, side in comparisons]
    blind += [(f"{claim} [{where}]", f"{a}@{where}", ma, f"{b}@{where}", mb, side)
              for where in beside for claim, a, ma, b, mb, side in comparisons]
    forms = [(f"{method}: the reward-blind form beats the paper's ({what})" + (f" [paper form: {where}]" if where
                                                                              else ""),
              method + BLIND, measure, f"{method}@{where}" if where else method, measure, +1)
             for where in ("", *beside)
             for method in ("msfa", "usfa_learned", "msfa_entangled_psi", "msfa_entangled_phi", "msfa_entangled_both",
                            "usfa", "mvfa")
             for measure, what in (("test_gpi", "test, GPI"), ("test", "test, no GPI"), ("train", "train"))]
    return [*comparisons, *blind, *forms]


def per_task_tables(returns: dict[str, dict], labels: dict[str, str], stored: dict | None) -> list[str]:
    """Per test task, each method's return with GPI (the methods that have it), then without (every method), each
    the mean over seeds [95% bootstrap interval], beside the stored reference_returns."""
    policies = list(reference_returns.POLICIES["babyai"]) if stored else []
    lines = []
    for gpi, title in ((1, "with GPI over the train tasks"), (0, "without GPI (acting on w_test)")):
        names = [n for n in returns if any(g == gpi for _, g in returns[n])]
        if not names:
            continue
        lines += ["", f"## Per test task, {title}", "",
                  "Each test task's greedy return at the run's last evaluation: the mean over seeds [95% bootstrap "
                  "interval over seeds]" + (f"; the references over {stored['episodes']} episodes per task." if stored
                                            else "."), "",
                  "| task | " + " | ".join([labels[n] for n in names] + policies) + " |",
                  "|---|" + "---:|" * (len(names) + len(policies))]
        for w in TEST_TASKS:
            task = format_task(w)
            cells = [cell(*interval(np.array(list(returns[n][(task, gpi)].values())))) if (task, gpi) in returns[n]
                     else "-" for n in names]
            cells += [f"{stored['returns'][p][task]['mean']:.2f}" for p in policies]
            lines.append(f"| {task} | " + " | ".join(cells) + " |")
    return lines


@exit_on_config_error
def main(args: Args) -> None:
    out_dir = Path(args.out_dir)
    require(out_dir.is_dir(), f"{out_dir} is not a folder; pass a BabyAI protocol's folder")
    beside, crosstalk_beside = (tuple(Path(d) for d in dirs) for dirs in (args.beside, args.crosstalk_beside))
    for option, others in (("--beside", beside), ("--crosstalk-beside", crosstalk_beside)):
        for other in others:
            require(other.is_dir() and other.resolve() != out_dir.resolve(),
                    f"{option} {other} is not a folder other than OUT_DIR; pass another protocol's folder")
    title = f"{out_dir}" + "".join(f", beside {d}" for d in beside) + "".join(
        f", c over training beside {d}" for d in crosstalk_beside)
    lines = [f"# The paper's claims on {title}", "", *claims(out_dir, beside, crosstalk_beside), ""]
    out = Path(args.out) if args.out else out_dir / "claims.md"
    out.write_text("\n".join(lines))
    print("\n".join(lines))
    print(f"wrote {out}")


if __name__ == "__main__":
    main(tyro.cli(Args))
