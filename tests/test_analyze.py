"""tools/analyze.py on tiny trained runs: its episodes are the scripts' own evaluation episodes (GPI and not), its
records are consistent with the env, Table A is computed as stated, and bad input stops with one line."""

import csv
import dataclasses
from pathlib import Path

import numpy as np
import pytest

from common.envs.babyai import TEST_TASKS, TRAIN_TASKS
from common.run import evaluation_parts
from helpers import VARIANTS

ROOT = Path(__file__).resolve().parent.parent

TASKS = np.concatenate([TRAIN_TASKS, TEST_TASKS])


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Tiny finished runs (with params_seed1.eqx and params_seed2.eqx) of MSFA, USFA (hand-designed phi) and UVFA."""
    out = {}
    for variant in ("msfa", "usfa", "uvfa"):
        script, settings, _ = VARIANTS[variant]
        run_dir = tmp_path_factory.mktemp("analyze") / variant
        script.main(script.Args(**(settings | dict(run_dir=str(run_dir), total_timesteps=64, log_every=64,
                                                   eval_every=64, num_seeds=2))))
        out[variant] = run_dir
    return out


SOME_TASKS = np.array([[0, 1, 0, 0], [1, 1, 1, 1], [-1, 1, 0, 1]], np.float32)


def check_records(agent, trace, tasks):
    """reward = phi_env . w on every step, one pickup at most per step, learned cumulants for every transition but
    the last, and (SF methods) the chosen policy's psi_c w_c summing to the value of the chosen action."""
    np.testing.assert_allclose(trace["reward"], np.einsum("netc,nc->net", trace["phi_env"], tasks), atol=1e-6)
    assert trace["phi_env"].sum(-1).max() <= 1
    learned = agent.method.startswith("MSFA") or agent.method == "USFA (learned cumulants)"
    assert ("phi" in trace) == learned
    if learned:
        assert trace["phi"].shape == trace["phi_env"][:, :, :-1].shape
    if agent.method.startswith("UVFA"):
        assert not trace["contribution"].any()
    else:
        np.testing.assert_allclose(trace["contribution"].sum(-1), trace["q"], rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("run, use_gpi", [("msfa", True), ("msfa", False)])
def test_episodes_are_the_scripts_own_evaluation_episodes(run, use_gpi):
    """The committed H200 MSFA agent (trained: it picks things up, so equal returns mean something): the returns
    equal the script's make_evaluate with the same key, for the GPI and the no-GPI policy, so the analysis looks at
    the very episodes the evaluation scores. It is stored compact (.eqz), so this also checks that form loads."""
    import jax

    from tools.analyze import load_agents, rollout

    agent = load_agents(ROOT / "results/babyai/paper_protocol_h200" / run)[0]
    key = jax.random.PRNGKey(3)
    trace = rollout(agent, SOME_TASKS, 1, use_gpi, key)
    args = dataclasses.replace(agent.args, eval_episodes=1)
    evaluate = agent.script.make_evaluate(agent.script.make_setup(args), args, SOME_TASKS)
    expected = np.asarray(evaluation_parts(evaluate(agent.params, key)).returns)[
        agent.script.GPI_SETTINGS.index(int(use_gpi))]
    assert np.abs(expected).sum() > 5  # the check below can tell episodes apart
    np.testing.assert_allclose(trace["reward"].sum(-1), expected, rtol=1e-6)
    check_records(agent, trace, SOME_TASKS)


@pytest.mark.parametrize("variant", ["usfa", "uvfa"])
def test_records_of_methods_without_learned_cumulants(runs, variant):
    """USFA with the env's cumulants has no learned phi (but psi contributions); the UVFA family has neither."""
    import jax

    from tools.analyze import load_agents, rollout

    agent = load_agents(runs[variant])[1]
    check_records(agent, rollout(agent, TASKS, 2, variant == "usfa", jax.random.PRNGKey(3)), TASKS)


def test_table_a_errors_by_hand():
    """Two transitions of one episode, task [1, 1]: phi . w = 0.9 and 0.2 against rewards 1 and 0 (the third step's
    reward has no learned cumulant): abs. errors .1, .2, squared .01, .04."""
    from tools.analyze import prediction_errors

    trace = {"phi": np.array([[[[0.5, 0.4], [0.1, 0.1]]]]), "reward": np.array([[[1.0, 0.0, 7.0]]])}
    absolute, squared = prediction_errors(trace, np.array([[1.0, 1.0]]))
    np.testing.assert_allclose(absolute, [[0.1, 0.2]], rtol=1e-6)
    np.testing.assert_allclose(squared, [[0.01, 0.04]], rtol=1e-6)


def test_tables_of_runs_without_learned_cumulants_say_why_they_are_empty():
    """UVFA-FARM alone (as the protocol analyses it): Table A and cumulant quality are one line each saying why,
    not a header over no rows."""
    from tools.analyze import quality_table, table_a

    runs = {"UVFA-FARM": [{"seed": 1, "pickups": np.zeros((len(TASKS), 4))}]}
    for lines in (table_a(runs, ["1,1,1,1"]), quality_table(runs)):
        assert len(lines) == 1 and lines[0].startswith("(no run with learned cumulants")


def test_analysis_writes_table_a_heatmaps_and_module_activity(runs, tmp_path, capsys):
    from tools import analyze

    out = tmp_path / "analysis"
    analyze.main(analyze.Args(run_dirs=(str(runs["msfa"]), str(runs["usfa"]), str(runs["uvfa"])), out=str(out),
                              episodes=2))
    text = (out / "analysis.md").read_text()
    table_a = text.split("## Table A")[1].split("## Cumulant quality")[0]
    rows = [line for line in table_a.splitlines() if line.startswith("| ") and not line.startswith("| task")]
    assert len(rows) == len(TEST_TASKS) and "MSFA: abs. error" in table_a and "USFA:" not in table_a
    assert "| 1,1,1,1 |" in table_a and "0.0118 ± 0.0856 | 2.5530 ± 4.0324 |" in table_a  # the paper's numbers
    quality = text.split("## Cumulant quality")[1].split("## The cumulant response")[0]
    assert quality.count("| MSFA |") == 4 and "| USFA |" not in quality
    response = text.split("## The cumulant response")[1].split("## Pickups")[0]
    assert "| MSFA |" in response and "| USFA |" not in response and "| UVFA |" not in response
    pickups = text.split("## Pickups per episode")[1]
    assert sum(line.startswith("| UVFA |") for line in pickups.splitlines()) == len(TASKS)
    for name in ("pickup_heatmaps.png", "module_activity.png"):
        assert (out / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "seeds [1, 2]" in capsys.readouterr().out
    # per_seed.csv: Table A per seed on every task; every seed has as many transitions, so the mean of the seeds'
    # means is the table's mean over all of them
    per_seed = list(csv.DictReader((out / "per_seed.csv").open()))
    assert len(per_seed) == 3 * 2 * len(TASKS) and {r["split"] for r in per_seed} == {"train", "test"}
    assert all(r["abs_error"] == "" for r in per_seed if r["method"] != "MSFA")
    cell = next(line for line in rows if line.startswith("| 1,1,1,1 |")).split("|")[2].split("±")[0]
    msfa = [float(r["abs_error"]) for r in per_seed if r["method"] == "MSFA" and r["task"] == "1,1,1,1"]
    assert len(msfa) == 2 and abs(np.mean(msfa) - float(cell)) < 1e-4


def test_seeds_played_apart_and_reported_from_their_records_give_the_analysis_of_playing_them_together(runs,
                                                                                                        tmp_path):
    """tools.protocol plays each seed as it completes and reports the method from the seeds' records.json: the
    same analysis.md and per_seed.csv as one call on the run of both seeds; a seed given twice stops with one line."""
    import shutil

    from common.run import ConfigError
    from tools import analyze

    together = tmp_path / "together"
    analyze.main(analyze.Args(run_dirs=(str(runs["msfa"]),), out=str(together), episodes=2))
    apart = []
    for seed in (2, 1):
        seed_run = tmp_path / f"seed{seed}"
        seed_run.mkdir()
        shutil.copyfile(runs["msfa"] / "config.json", seed_run / "config.json")
        shutil.copyfile(runs["msfa"] / f"params_seed{seed}.eqx", seed_run / f"params_seed{seed}.eqx")
        analyze.main(analyze.Args(run_dirs=(str(seed_run),), out=str(seed_run / "analysis"), episodes=2))
        apart.append(str(seed_run / "analysis"))
    reported = tmp_path / "reported"
    analyze.main(analyze.Args(records=tuple(apart), out=str(reported)))
    for name in ("analysis.md", "per_seed.csv"):
        assert (reported / name).read_text() == (together / name).read_text(), name
    with pytest.raises(ConfigError, match="seed 1 comes twice"):
        analyze.report(analyze.group_records([*analyze.read_records(Path(apart[1])),
                                              *analyze.read_records(together)]), tmp_path / "twice")


@pytest.mark.parametrize("overrides, message", [
    (dict(run_dirs=("/nonexistent",)), "is not a directory"),
    (dict(activity_task="1,1"), "has 2 weights"),
    (dict(gpi="maybe"), "--gpi must be on or off"),
    (dict(episodes=0), "--episodes must be positive"),
], ids=["missing run", "short task", "gpi", "episodes"])
def test_bad_input_stops_with_one_line(runs, overrides, message, capsys):
    from tools import analyze

    args = dict(run_dirs=(str(runs["msfa"]),), episodes=1) | overrides
    with pytest.raises(SystemExit) as exit_info:
        analyze.main(analyze.Args(**args))
    err = capsys.readouterr().err.strip().splitlines()
    assert exit_info.value.code == 2 and len(err) == 1 and message in err[0], err
