"""tools.claims on a hand-made protocol folder: the per-seed measures, the intervals and the verdicts."""

import csv
import json

import numpy as np
import pytest

from common.envs.babyai import TEST_TASKS, TRAIN_TASKS
from common.run import format_task, pack_table
from tools import analyze, claims, compare_runs, run_reader

EVAL_FIELDS = ["step", "seed", "split", "task", "gpi", "episodes", "return_mean", "return_std"]


def write_method(root, name, method, returns, errors=None, last=1000, first_seed=1, total=None):
    """A method's run folder: seed s returns returns[split, gpi][s] + (t - mean t) / 10 on task t of the split at step
    `last` (the mean over the split's tasks is returns[split, gpi][s]; something else at an earlier step, which must
    not count); errors[split][s] in analysis/per_seed.csv. Seeds are numbered from first_seed; `total` is the
    protocol's env steps (config.json's total_timesteps: the run is complete where last reaches it)."""
    run = root / name
    run.mkdir(parents=True)
    (run / "config.json").write_text(json.dumps({"method": method, "script": "msfa_babyai.py",
                                                 "args": {"total_timesteps": total} if total else {}}))
    with (run / "eval.csv").open("w", newline="") as f:
        writer = csv.DictWriter(f, EVAL_FIELDS)
        writer.writeheader()
        for (split, gpi), by_seed in returns.items():
            for seed, value in enumerate(by_seed, first_seed):
                tasks = TRAIN_TASKS if split == "train" else TEST_TASKS
                for t, w in enumerate(tasks):
                    for step, v in ((last // 2, -50.0), (last, value + (t - (len(tasks) - 1) / 2) * 0.1)):
                        writer.writerow({"step": step, "seed": seed, "split": split, "task": format_task(w),
                                         "gpi": gpi, "episodes": 20, "return_mean": v, "return_std": 0})
    if errors:
        (run / "analysis").mkdir()
        with (run / "analysis" / "per_seed.csv").open("w", newline="") as f:
            writer = csv.DictWriter(f, analyze.PER_SEED_FIELDS)
            writer.writeheader()
            for split, by_seed in errors.items():
                for seed, value in enumerate(by_seed, 1):
                    for w in TRAIN_TASKS if split == "train" else TEST_TASKS:
                        writer.writerow({"method": method, "seed": seed, "step": last, "gpi": 1, "split": split,
                                         "task": format_task(w), "episodes": 40, "return": 0, "abs_error": value,
                                         "sq_error": value**2})


def table_rows(text):
    """claims.md's table rows by their first cell (the header rows left out): {method or claim: the other cells}."""
    return {line.split("|")[1].strip(): [c.strip() for c in line.split("|")[2:-1]]
            for line in text.splitlines() if line.startswith("| ") and not line.startswith(("| method", "| claim",
                                                                                             "| task"))}


@pytest.fixture
def protocol(tmp_path):
    write_method(tmp_path, "msfa", "MSFA",
                 {("train", 0): [10, 12, 14], ("test", 1): [9, 10, 11], ("test", 0): [5, 6, 7]},
                 errors={"train": [0.01, 0.02, 0.03], "test": [0.1, 0.1, 0.1]})
    write_method(tmp_path, "usfa_learned", "USFA (learned cumulants)",
                 {("train", 0): [10, 10, 10], ("test", 1): [9.5, 10.5, 10], ("test", 0): [1, 2, 3]},
                 errors={"train": [0.05, 0.05, 0.05], "test": [0.3, 0.4, 0.5]})
    write_method(tmp_path, "uvfa_farm", "UVFA-FARM", {("train", 0): [20, 21, 22], ("test", 0): [12, 13, 14]})
    return tmp_path


def test_the_measures_are_per_seed_means_over_the_splits_tasks_at_the_last_step(protocol):
    step, values = claims.per_seed_measures(protocol / "msfa")
    assert step == 1000
    assert values["train"] == {1: pytest.approx(10), 2: pytest.approx(12), 3: pytest.approx(14)}  # (t - 1.5) .1: 0
    assert values["test_gpi"] == pytest.approx({1: 9, 2: 10, 3: 11}) and values["test"] == pytest.approx({1: 5, 2: 6,
                                                                                                        3: 7})
    assert values["error_test"] == {1: pytest.approx(0.1), 2: pytest.approx(0.1), 3: pytest.approx(0.1)}
    _, values = claims.per_seed_measures(protocol / "uvfa_farm")
    assert "test_gpi" not in values and "error_test" not in values


def test_intervals_and_verdicts(protocol):
    mean, low, high = claims.interval(np.array([9.0, 10, 11]))
    assert mean == 10 and 9 <= low < 10 < high <= 11
    # GPI against no GPI of the same seeds: every seed gains exactly 4, so the paired interval is the point
    assert claims.interval(np.array([9.0, 10, 11]), np.array([5.0, 6, 7]), paired=True) == pytest.approx((4, 4, 4))
    # apart, the seeds' spread widens it
    mean, low, high = claims.interval(np.array([9.0, 10, 11]), np.array([5.0, 6, 7]))
    assert mean == 4 and low < 4 < high and low > 0
    assert claims.verdict(0.5, 2, +1) == "holds" and claims.verdict(-2, -0.5, +1) == "reversed"
    assert claims.verdict(-0.5, 2, +1) == "not resolved" and claims.verdict(-2, -0.5, -1) == "holds"
    assert claims.verdict(-2, -0.5, 0) == "reference"
    assert claims.cell(-0.001, -0.004, 0.002) == "0.00 [0.00, 0.00]"  # no "-0.00"
    assert claims.cell(-0.006, -0.02, 0.01) == "-0.01 [-0.02, 0.01]" and claims.cell(1.5, float("nan"), 0) == "1.50"


def test_the_claims_table(protocol, capsys):
    claims.main(claims.Args(out_dir=str(protocol)))
    rows = table_rows((protocol / "claims.md").read_text())
    # seeds 10, 12, 14: the percentile interval of 3 seeds' mean reaches the extremes (all three resampled the same
    # seed has chance 1/27 > 2.5%)
    assert rows["MSFA"][:5] == ["3", "1,000", "12.00 [10.00, 14.00]", "10.00 [9.00, 11.00]", "6.00 [5.00, 7.00]"]
    assert rows["MSFA"][6] == "0.100 [0.100, 0.100]" and rows["random (100 episodes per task)"][2] == "1.18"
    assert rows["UVFA-FARM"][3] == "-" and rows["UVFA-FARM"][5] == "-"  # no GPI, no learned cumulants
    gpi = rows["GPI helps MSFA on the test tasks"]
    assert gpi[2] == "4.00 [4.00, 4.00]" and gpi[3] == "holds"
    versus = rows["MSFA beats USFA with learned cumulants on the test tasks (GPI)"]
    assert versus[2].startswith("0.00 [") and versus[3] == "not resolved"
    assert rows["MSFA (GPI) beats UVFA-FARM on the test tasks"][3] == "reversed"
    table_a = rows["MSFA's cumulants predict the test reward better than USFA-learned's (Table A)"]
    assert table_a[2].startswith("-0.300 [") and table_a[3] == "holds"
    assert not any("entangled" in claim for claim in rows)  # their runs are missing: left out


def test_the_value_baselines_comparisons(protocol):
    """UVFA and MVFA have no GPI: MSFA (GPI) and USFA (GPI) are compared with their greedy return on w_test; USFA's
    own GPI gain is paired over its seeds."""
    write_method(protocol, "usfa", "USFA", {("train", 0): [10, 10, 10], ("test", 1): [11, 12, 13],
                                             ("test", 0): [2, 3, 4]})
    write_method(protocol, "uvfa", "UVFA", {("train", 0): [10, 10, 10], ("test", 0): [1, 2, 3]})
    write_method(protocol, "mvfa", "MVFA", {("train", 0): [10, 10, 10], ("test", 0): [10, 11, 12]})
    rows = table_rows("\n".join(claims.claims(protocol)))
    assert rows["GPI helps USFA with the env's cumulants on the test tasks"][2:] == ["9.00 [9.00, 9.00]", "holds"]
    assert rows["MSFA (GPI) beats UVFA on the test tasks"][1] == "UVFA: test, no GPI"
    assert rows["MSFA (GPI) beats UVFA on the test tasks"][2].startswith("8.00 [")  # 10 - 2
    assert rows["MSFA (GPI) beats UVFA on the test tasks"][3] == "holds"
    assert rows["MSFA (GPI) beats MVFA on the test tasks"][2].startswith("-1.00 [")  # 10 - 11
    assert rows["MSFA (GPI) beats MVFA on the test tasks"][3] == "not resolved"  # 9, 10, 11 against 10, 11, 12
    transfer = rows["USFA with the env's cumulants (GPI) beats UVFA on the test tasks (SF&GPI's transfer)"]
    assert transfer[2].startswith("10.00 [") and transfer[3] == "holds"
    modular = rows["Without GPI, MSFA beats USFA with learned cumulants on the test tasks (modularity alone)"]
    assert modular[2].startswith("4.00 [") and modular[3] == "holds"  # 6 - 2, seeds apart: 5, 6, 7 against 1, 2, 3


def test_the_claims_of_an_exported_protocol_are_those_of_the_protocol(protocol):
    """tools.export packs each run's eval.csv (eval.csv.xz, common.run.pack_table): tools.claims, like every
    tool, reads the packed table as it is and says the same."""
    claims.main(claims.Args(out_dir=str(protocol)))
    plain = (protocol / "claims.md").read_text()
    for run in protocol.iterdir():
        if (run / "eval.csv").exists():
            pack_table(run / "eval.csv", run / "eval.csv")
    assert not list(protocol.glob("*/eval.csv")) and len(list(protocol.glob("*/eval.csv.xz"))) == 3
    claims.main(claims.Args(out_dir=str(protocol)))
    assert (protocol / "claims.md").read_text() == plain


def test_the_per_test_task_tables(protocol):
    """Per test task, with GPI (the SF methods only) and without (every method), beside the stored references."""
    claims.main(claims.Args(out_dir=str(protocol)))
    text = (protocol / "claims.md").read_text()
    sections = {}
    for part in text.split("\n## ")[1:]:
        title, *body = part.splitlines()
        sections[title] = [[c.strip() for c in line.split("|")[1:-1]] for line in body if line.startswith("| ")]
    with_gpi = sections["Per test task, with GPI over the train tasks"]
    without = sections["Per test task, without GPI (acting on w_test)"]
    assert with_gpi[0] == ["task", "MSFA", "USFA (learned cumulants)", "BFS oracle", "random"]  # no GPI, no column
    assert without[0] == ["task", "MSFA", "USFA (learned cumulants)", "UVFA-FARM", "BFS oracle", "random"]
    assert [row[0] for row in with_gpi[1:]] == [format_task(w) for w in TEST_TASKS]
    # test task t scores the seed's value + (t - 3.5) / 10: MSFA's seeds 9, 10, 11 with GPI, 5, 6, 7 without
    for t, (gpi_row, row) in enumerate(zip(with_gpi[1:], without[1:])):
        off = (t - 3.5) / 10
        assert gpi_row[1] == f"{10 + off:.2f} [{9 + off:.2f}, {11 + off:.2f}]"
        assert row[1] == f"{6 + off:.2f} [{5 + off:.2f}, {7 + off:.2f}]"
        assert row[3] == f"{13 + off:.2f} [{12 + off:.2f}, {14 + off:.2f}]"  # UVFA-FARM
    # the paper's room's stored references (docs/babyai.md, 100 episodes per task): the BFS oracle, random play
    assert [row[3:] for row in with_gpi[1:]] == [row[4:] for row in without[1:]]
    assert with_gpi[1][3:] == ["47.86", "2.44"] and with_gpi[7][3:] == ["35.93", "-2.62"]  # 1,1,0,0 and -1,1,-1,-1


def test_a_run_with_two_rows_for_one_evaluation_is_refused_with_one_line(protocol, capsys):
    """Two eval.csv files joined into one would count a seed twice in every mean: refused, not averaged."""
    eval_csv = protocol / "msfa" / "eval.csv"
    lines = eval_csv.read_text().splitlines()
    eval_csv.write_text("\n".join(lines + lines[-1:]) + "\n")
    with pytest.raises(SystemExit) as exit_info:
        claims.main(claims.Args(out_dir=str(protocol)))
    err = capsys.readouterr().err.strip().splitlines()
    assert exit_info.value.code == 2 and len(err) == 1 and "has two rows for seed 3" in err[0]


def write_records(run, response_by_seed):
    """analysis/records.json with each seed's cumulant response: response_by_seed[s] = (c, own_unrewarded), built as
    response matrices of the train tasks (each task: 10 rewarded pickups of its category, 5 of every other)."""
    records = []
    for seed, (c, own_unrewarded) in enumerate(response_by_seed, 1):
        sums, counts = np.zeros((4, 4, 4)), np.zeros((4, 4))
        for k in range(4):
            for j in range(4):
                counts[k, j] = 10 if j == k else 5
                phi = np.zeros(4)
                phi[j] = counts[k, j] * (1.0 if j == k else own_unrewarded)  # phi^j at its own category's pickups
                if j == k:
                    phi[[i for i in range(4) if i != k]] = counts[k, j] * c  # the rewarded pickup's crosstalk
                sums[k, j] = phi
        tasks = [format_task(w) for w in (*TRAIN_TASKS, *TEST_TASKS)]  # (a record as tools.analyze writes it)
        records.append({"seed": seed, "step": 1000, "gpi": True, "episodes": 40, "tasks": tasks,
                        "returns": [0.0] * len(tasks), "errors": None,
                        "response": {"tasks": [format_task(w) for w in TRAIN_TASKS],
                                                   "sums": sums.tolist(), "counts": counts.tolist(),
                                                   "sums_counterfactual": np.zeros_like(sums).tolist()}})
    (run / "analysis").mkdir(exist_ok=True)
    (run / "analysis" / "records.json").write_text(json.dumps(records))


def test_the_cumulants_table_gpis_cost_and_both_forms(protocol):
    """The response per seed from the analysis' records, GPI's cost on the train tasks from eval.csv (acting on w
    minus GPI), and every comparison again between the reward-blind forms and each form against the other."""
    write_records(protocol / "msfa", [(0.9, 0.1), (0.8, 0.0), (1.0, 0.2)])
    write_method(protocol, "msfa_blind", "MSFA (reward-blind)",
                 {("train", 0): [11, 12, 13], ("train", 1): [11, 12, 12], ("test", 1): [12, 13, 14],
                  ("test", 0): [5, 6, 7]})
    write_records(protocol / "msfa_blind", [(0.0, 1.0), (0.02, 0.98), (0.01, 1.0)])
    write_method(protocol, "usfa_learned_blind", "USFA (learned cumulants, reward-blind)",
                 {("train", 0): [10, 10, 10], ("test", 1): [11, 11, 11], ("test", 0): [1, 2, 3]})
    write_records(protocol / "usfa_learned_blind", [(0.0, 1.0), (0.05, 1.0), (0.2, 1.0)])  # c: mean 0.083, not separated
    _, values = claims.per_seed_measures(protocol / "msfa_blind")
    assert values["crosstalk"] == pytest.approx({1: 0.0, 2: 0.02, 3: 0.01})
    assert values["own_unrewarded"] == pytest.approx({1: 1.0, 2: 0.98, 3: 1.0})
    assert values["crosstalk_counterfactual"] == pytest.approx({1: 0, 2: 0, 3: 0})
    assert values["gpi_cost_train"] == pytest.approx({1: 0, 2: 0, 3: 1})  # (each task's +-0.1 spread cancels)
    text = "\n".join(claims.claims(protocol))
    rows = table_rows(text.split("## The learned cumulants' response")[1].split("\n## ")[0])
    # seeds, own rewarded, own unrewarded, crosstalk c, cross unrewarded, c with the reward 0, GPI's cost, separated
    assert rows["MSFA"][0] == "3" and rows["MSFA"][2].startswith("0.100") and rows["MSFA"][3].startswith("0.900")
    assert rows["MSFA (reward-blind)"][3].startswith("0.010") and rows["MSFA (reward-blind)"][6].startswith("0.33")
    assert rows["MSFA"][7] == "no" and rows["MSFA (reward-blind)"][7] == "yes"  # c's interval under 0.1 or not
    usfa = rows["USFA (learned cumulants, reward-blind)"]
    assert usfa[3].startswith("0.083") and usfa[7] == "no"  # its mean under 0.1, but not its interval's top
    comparisons = table_rows(text.split("## The paper's comparisons")[1].split("\n## ")[0])
    both = "MSFA beats USFA with learned cumulants on the test tasks (GPI) [both reward-blind]"
    assert comparisons[both][2].startswith("2.00") and comparisons[both][3] == "holds"
    assert comparisons["msfa: the reward-blind form beats the paper's (test, GPI)"][2].startswith("3.00")


def test_a_method_in_progress_counts_its_complete_seeds_and_other_protocols_stand_beside(protocol, tmp_path_factory,
                                                                                          capsys):
    """A method trained seed by seed and not merged yet (msfa_blind/seed<k>/, as tools.export carries it): its complete
    seeds count, Table A from their records.json (an export carries no per_seed.csv), the incomplete one not at all;
    the table says it is in progress. --beside adds another protocol's methods, named by its folder, and the form
    comparisons against them."""
    seeds = {1: (11, 13, 0.004), 2: (12, 14, 0.006), 3: (50, 50, 0.5)}  # train, test with GPI, Table A test error
    for seed, (train, test_gpi, error) in seeds.items():
        run = protocol / "msfa_blind" / f"seed{seed}"
        write_method(protocol / "msfa_blind", f"seed{seed}", "MSFA (reward-blind)",
                     {("train", 0): [train], ("test", 1): [test_gpi], ("test", 0): [test_gpi - 5]},
                     first_seed=seed, total=1000 if seed < 3 else 2000)  # seed 3 is still training
        tasks = [format_task(w) for w in (*TRAIN_TASKS, *TEST_TASKS)]
        abs_sums = [0.0 if t < len(TRAIN_TASKS) else error * 200 for t in range(len(tasks))]
        (run / "analysis").mkdir()
        (run / "analysis" / "records.json").write_text(json.dumps([
            {"seed": seed, "step": 1000, "gpi": True, "episodes": 40, "tasks": tasks, "returns": [0.0] * len(tasks),
             "errors": {"transitions": 200, "abs": abs_sums, "sq": abs_sums}}]))
    reader = run_reader.method_reader(protocol / "msfa_blind")  # as tools.plot and tools.compare_runs read it too
    assert [d.name for d in reader.seed_runs] == ["seed1", "seed2"] and reader.label == "MSFA (reward-blind)"
    assert [(r["step"], r["seed"]) for r in reader.eval_rows][::len(TRAIN_TASKS) + 2 * len(TEST_TASKS)] == [
        ("500", "1"), ("500", "2"), ("1000", "1"), ("1000", "2")]  # by step, then seed, as the protocol merges them
    compare_runs.main(compare_runs.Args(run_dirs=(str(protocol / "msfa_blind"),)))
    shown = capsys.readouterr().out
    assert "over 2 seed(s)" in shown and "| MSFA (reward-blind) | 13.15 ± 0.50 |" in shown  # (13, 14 - 0.35)
    step, values = claims.per_seed_measures(claims.method_runs(protocol)["msfa_blind"])
    assert step == 1000 and values["train"] == pytest.approx({1: 11, 2: 12})
    assert values["error_test"] == pytest.approx({1: 0.004, 2: 0.006}) and values["error_train"] == {1: 0, 2: 0}
    text = "\n".join(claims.claims(protocol))
    rows = table_rows(text)
    assert rows["MSFA (reward-blind)"][:4] == ["2", "1,000", "11.50 [11.00, 12.00]", "13.50 [13.00, 14.00]"]
    assert "In progress (trained seed by seed; the complete seeds so far): MSFA (reward-blind) (seeds 1, 2)." in text
    other = tmp_path_factory.mktemp("paper_form")
    write_method(other, "msfa", "MSFA", {("train", 0): [9, 9], ("test", 1): [4, 5], ("test", 0): [3, 3]})
    rows = table_rows("\n".join(claims.claims(protocol, beside=(other,))))
    assert rows[f"MSFA [{other.name}]"][:4] == ["2", "1,000", "9.00 [9.00, 9.00]", "4.50 [4.00, 5.00]"]
    assert rows["MSFA"][0] == "3"  # this protocol's own paper form stays as it is
    beside = rows[f"msfa: the reward-blind form beats the paper's (test, GPI) [paper form: {other.name}]"]
    assert beside[2].startswith("9.00 [") and beside[3] == "holds"  # 13.5 - 4.5
    assert rows[f"GPI helps MSFA on the test tasks [{other.name}]"][2] == "1.50 [1.00, 2.00]"


def test_the_crosstalk_over_training_is_pooled_per_seed_at_evenly_spaced_evaluations(tmp_path):
    """c at evaluations over training, from eval.csv's response columns: each seed's train-task rows pooled by their
    rewarded pickups (common.run.pooled_response), then the mean over seeds; at most 10 rows, ending at the last."""
    fields = [*EVAL_FIELDS, "phi_crosstalk", "pickups_rewarded"]
    run = tmp_path / "msfa"
    run.mkdir()
    (run / "config.json").write_text(json.dumps({"method": "MSFA", "script": "msfa_babyai.py", "args": {}}))
    with (run / "eval.csv").open("w", newline="") as f:
        writer = csv.DictWriter(f, fields)
        writer.writeheader()
        for step in range(100, 2100, 100):  # 20 evaluations: every second one shown, from 200
            for seed in (1, 2):
                for t, w in enumerate(TRAIN_TASKS):  # task 0: c = 1 on 3 pickups, the others c = 0 on 1 each
                    writer.writerow({"step": step, "seed": seed, "split": "train", "task": format_task(w), "gpi": 0,
                                     "episodes": 20, "return_mean": 1, "return_std": 0,
                                     "phi_crosstalk": (1.0 if t == 0 else 0.0) * step / 2000 * seed,
                                     "pickups_rewarded": 3 if t == 0 else 1})
    lines = claims.crosstalk_over_training({"msfa": run_reader.RunReader(run)}, {"msfa": "MSFA"})
    rows = [line for line in lines if line.startswith("| ") and not line.startswith("| env steps")]
    assert [r.split("|")[1].strip() for r in rows] == [f"{s:,}" for s in range(200, 2100, 200)]
    # at 2,000: seed 1's c = 3/6 * 1, seed 2's 3/6 * 2: mean 0.75, the two seeds the interval's ends
    assert rows[-1].split("|")[2].strip() == "0.750 [0.500, 1.000]"


def write_response_run(root, name, steps, crosstalk, room=None):
    """A method's run with the cumulant response in eval.csv: at each step, every seed's train-task rows acting on
    w with c = crosstalk(step, seed) on one rewarded pickup each, and its test-task rows (a return of 1); `room` the
    BabyAI room's settings in config.json (the paper's room where None)."""
    run = root / name
    run.mkdir(parents=True)
    (run / "config.json").write_text(json.dumps({"method": name, "script": "msfa_babyai.py", "args": room or {}}))
    with (run / "eval.csv").open("w", newline="") as f:
        writer = csv.DictWriter(f, [*EVAL_FIELDS, "phi_crosstalk", "pickups_rewarded"])
        writer.writeheader()
        for step in steps:
            for seed in (1, 2):
                row = {"step": step, "seed": seed, "episodes": 20, "return_mean": 1, "return_std": 0}
                for w in TRAIN_TASKS:
                    writer.writerow({**row, "split": "train", "task": format_task(w), "gpi": 0,
                                     "phi_crosstalk": crosstalk(step, seed), "pickups_rewarded": 1})
                for w in TEST_TASKS:
                    for gpi in (0, 1):
                        writer.writerow({**row, "split": "test", "task": format_task(w), "gpi": gpi})


def test_another_rooms_protocol_stands_beside_in_c_over_training_alone(tmp_path_factory, capsys):
    """The paper's room beside the miniature: its returns are on another scale, so --beside refuses it with one line;
    --crosstalk-beside adds its methods to the c-over-training table alone, at the env steps both evaluated (the
    miniature evaluates more often), and to no other table."""
    paper, mini = tmp_path_factory.mktemp("paper_cpu"), tmp_path_factory.mktemp("mini")
    write_response_run(paper, "msfa", range(256, 2561, 256), lambda step, seed: 0.9)
    write_response_run(mini, "msfa", range(128, 2561, 128), lambda step, seed: step / 2560 * seed / 2,
                       room={"grid_size": 6, "objects_per_category": 1, "episode_steps": 50})
    with pytest.raises(SystemExit) as exit_info:
        claims.main(claims.Args(out_dir=str(paper), beside=(str(mini),)))
    err = capsys.readouterr().err.strip().splitlines()
    assert exit_info.value.code == 2 and len(err) == 1 and "another room (grid_size 6, objects_per_category 1" in err[0]
    assert "--crosstalk-beside" in err[0]
    text = "\n".join(claims.claims(paper, crosstalk_beside=(mini,)))
    rows = table_rows(text[text.index("## The crosstalk c over training"):].split("\n## ")[0])
    assert rows.pop("env steps") == ["msfa", f"msfa [{mini.name}]"]
    assert list(rows) == [f"{s:,}" for s in range(256, 2561, 256)]  # the paper's steps, not the miniature's 128s
    assert rows["1,280"] == ["0.900 [0.900, 0.900]", "0.375 [0.250, 0.500]"]  # seeds 1, 2: 1280/2560 * seed/2
    per_method = table_rows(text.split("## The crosstalk")[0])
    assert f"msfa [{mini.name}]" not in per_method and "msfa" in per_method
    assert mini.name not in text.split("## The crosstalk c over training")[1].split("\n## ", 1)[1]
    # a protocol with no evaluated step in common with this one: said, not a crash
    other = tmp_path_factory.mktemp("other")
    write_response_run(other, "msfa", (100, 300), lambda step, seed: 0.5)
    assert "No env step was evaluated by every one of" in "\n".join(claims.claims(paper, crosstalk_beside=(other,)))
