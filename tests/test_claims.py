"""results.claims on a hand-made protocol folder: the per-seed measures, the intervals and the verdicts."""

import csv
import json

import numpy as np
import pytest

from common.envs.babyai import TEST_TASKS, TRAIN_TASKS
from common.run import format_task, pack_table
from results import analyze, claims

EVAL_FIELDS = ["step", "seed", "split", "task", "gpi", "episodes", "return_mean", "return_std"]


def write_method(root, name, method, returns, errors=None, last=1000):
    """A method's run folder: seed s returns returns[split, gpi][s] on every task of the split at step `last` (and
    something else at an earlier step, which must not count); errors[split][s] in analysis/per_seed.csv."""
    run = root / name
    run.mkdir()
    (run / "config.json").write_text(json.dumps({"method": method, "script": "msfa_babyai.py", "args": {}}))
    with (run / "eval.csv").open("w", newline="") as f:
        writer = csv.DictWriter(f, EVAL_FIELDS)
        writer.writeheader()
        for (split, gpi), by_seed in returns.items():
            for seed, value in enumerate(by_seed, 1):
                for t, w in enumerate(TRAIN_TASKS if split == "train" else TEST_TASKS):
                    for step, v in ((last // 2, -50.0), (last, value + (t - 1.5) * 0.1 * (split == "train"))):
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
    assert values["test_gpi"] == {1: 9, 2: 10, 3: 11} and values["test"] == {1: 5, 2: 6, 3: 7}
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


def test_the_claims_table(protocol, capsys):
    claims.main(claims.Args(out_dir=str(protocol)))
    text = (protocol / "claims.md").read_text()
    rows = {line.split("|")[1].strip(): [c.strip() for c in line.split("|")[2:-1]]
            for line in text.splitlines() if line.startswith("| ") and not line.startswith("| method")}
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


def test_the_claims_of_an_exported_protocol_are_those_of_the_protocol(protocol):
    """results.export packs each run's eval.csv (eval.csv.xz, common.run.pack_table): results.claims, like every
    results tool, reads the packed table as it is and says the same."""
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
    # every test task scores the seed's value: MSFA's seeds 9, 10, 11 with GPI and 5, 6, 7 without
    assert {row[1] for row in with_gpi[1:]} == {"10.00 [9.00, 11.00]"}
    assert {row[1] for row in without[1:]} == {"6.00 [5.00, 7.00]"} and {row[3] for row in without[1:]} == {
        "13.00 [12.00, 14.00]"}
    # the paper's room's stored references on 1,1,0,0 (docs/babyai.md: 47.86 and 2.44 over 100 episodes)
    assert with_gpi[1][3:] == ["47.86", "2.44"] and without[1][4:] == ["47.86", "2.44"]
