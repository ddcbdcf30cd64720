"""The stored reference returns (results/references.json): the numbers the env modules' functions compute and the
docs quote, what tools.summarize reads instead of playing the references, and how an entry is stored."""

import itertools
import json
import time
from pathlib import Path

import pytest

from common.envs import babyai
from common.run import exit_on_config_error, format_task
from tools import summarize
from tools import reference_returns
from test_results import fake_run

PAPER_ROOM = {"grid_size": 10, "objects_per_category": 3, "episode_steps": 200}
MINIATURE = {"grid_size": 6, "objects_per_category": 1, "episode_steps": 50}
PROCGEN_HARD = {"backend": "procgen", "distribution_mode": "hard", "max_levels": 4, "num_levels": 0}
ROOT = Path(__file__).parents[1]


def babyai_run(tmp_path, name, room):
    """A fake BabyAI run (tests/test_results.py's) whose config.json records the room it trained in."""
    run = Path(fake_run(tmp_path, name, "MSFA", (10,), (0, 1), 1.0))
    (run / "config.json").write_text(json.dumps({"method": "MSFA", "env": "babyai", "args": room}))
    return run


def table_after(page: str, marker: str) -> list[list[str]]:
    """The cells of each row of the first markdown table after `marker` in a page of the repository (header and
    rule left out)."""
    text = (ROOT / page).read_text()
    lines = text[text.index(marker):].splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("|"))
    rows = list(itertools.takewhile(lambda line: line.startswith("|"), lines[start:]))[2:]
    return [[cell.strip() for cell in row.strip("|").split("|")] for row in rows]


def cell(reference: dict, digits: int = 2) -> str:
    return f"{reference['mean']:.{digits}f} ± {reference['se']:.{digits}f}"


@pytest.mark.parametrize("room, marker", [(PAPER_ROOM, "`python -m common.envs.babyai --episodes 100`"),
                                          (MINIATURE, "--episode-steps 50 --episodes 100`")])
def test_the_stored_babyai_references_reproduce_the_tables_of_docs_babyai_md(room, marker):
    """docs/babyai.md quotes `python -m common.envs.babyai`'s tables over 100 episodes of the paper's room and of
    the miniature's: the stored entries give the same cells."""
    entry = reference_returns.stored("babyai", room)
    rows = table_after("docs/babyai.md", marker)
    assert (entry["episodes"], entry["seed"]) == (100, 0) and len(rows) == 12
    for _, task, oracle, rand in rows:
        assert (cell(entry["returns"]["BFS oracle"][task]), cell(entry["returns"]["random"][task])) == (oracle, rand)


def test_the_stored_fruitbot_references_reproduce_the_table_of_its_results_page():
    """results/fruitbot/README.md quotes `python -m common.envs.fruitbot --episodes 20` (stock procgen, hard mode,
    unrestricted levels): the stored entry gives the same cells."""
    entry = reference_returns.stored("fruitbot", PROCGEN_HARD)
    rows = table_after("results/fruitbot/README.md", "`python -m common.envs.fruitbot --episodes 20`")
    assert (entry["episodes"], entry["seed"]) == (20, 0) and len(rows) == 10
    for _, task, rand, scripted in rows:
        assert (cell(entry["returns"]["random"][task]), cell(entry["returns"]["scripted gap-seeker"][task])) \
               == (rand, scripted)


def test_the_stored_miniature_train_task_references_are_what_the_functions_compute_now():
    """The miniature room's train tasks played again (one batch, as the entry was): the stored floats exactly."""
    entry = reference_returns.stored("babyai", MINIATURE)
    room = babyai.GotoAvoid(obs_mode="symbolic", **MINIATURE)
    train = babyai.TRAIN_TASKS
    for policy, play in (("BFS oracle", babyai.bfs_oracle_returns), ("random", babyai.random_policy_returns)):
        stored = {format_task(w): entry["returns"][policy][format_task(w)] for w in train}
        assert reference_returns.per_task(train, *play(train, entry["episodes"], entry["seed"], room)) == stored, policy


def test_summarize_reads_the_stored_references_without_playing_them(tmp_path, monkeypatch, capsys):
    """The paper's room and the miniature each get their own room's stored entry, in well under the minute that
    playing them takes."""
    def no_playing(*args, **kwargs):
        raise AssertionError("summarize played the references")

    monkeypatch.setattr(babyai, "policy_returns", no_playing)  # what the BFS oracle and random play both call
    started = time.perf_counter()
    summarize.main(summarize.Args(run_dir=str(babyai_run(tmp_path, "paper", PAPER_ROOM))))
    summarize.main(summarize.Args(run_dir=str(babyai_run(tmp_path, "mini", MINIATURE))))
    seconds = time.perf_counter() - started
    out = capsys.readouterr().out
    assert seconds < 10, seconds
    assert "| train | 1,0,0,0 | 3.50 ± 0.50 | 2.50 ± 0.50 | 35.75 ± 0.29 | 1.26 ± 0.10 |" in out  # the paper's room
    assert "| train | 1,0,0,0 | 3.50 ± 0.50 | 2.50 ± 0.50 | 9.45 ± 0.21 | 0.40 ± 0.07 |" in out  # the miniature
    assert out.count("references over 100 episodes, stored ") == 2


def test_summarize_names_the_command_for_a_room_with_no_stored_references(tmp_path, capsys):
    """Not blank, not a crash: the cells say so and the caption names the one command that stores the room's."""
    summarize.main(summarize.Args(run_dir=str(babyai_run(tmp_path, "room8", {"grid_size": 8, "objects_per_category": 2,
                                                                              "episode_steps": 60}))))
    out = capsys.readouterr().out
    assert ("`python -m tools.reference_returns babyai --grid-size 8 --objects-per-category 2 --episode-steps 60 "
            "--episodes 100 --seed 0` plays and stores them") in out
    assert "| test | -1,1,-1,0.5 | 3.50 ± 0.50 | 2.50 ± 0.50 | (not stored) | (not stored) |" in out


def test_summarize_points_a_jax_fruitbot_run_to_its_games_references_and_cannot_play_them(tmp_path, capsys):
    """The JAX game's references are not stored (tools.reference_returns plays stock procgen's): the caption names the
    command that prints them, and --episodes stops with one line."""
    run = Path(fake_run(tmp_path, "fb", "MSFA", (10,), (0, 1), 1.0, env="fruitbot"))
    saved = {"distribution_mode": "paper", "env_backend": "jax", "max_levels": 4, "eval_levels": 1000}
    (run / "config.json").write_text(json.dumps({"method": "MSFA", "env": "fruitbot", "args": saved}))
    summarize.main(summarize.Args(run_dir=str(run)))
    out = capsys.readouterr().out
    assert "`python -m common.envs.fruitbot_jax --config paper --num-levels 1000 --level-key 1` prints" in out
    assert "| test | 1,-1,-1,-1 | 3.50 ± 0.50 | 2.50 ± 0.50 | - | - |" in out
    with pytest.raises(SystemExit) as stop:
        summarize.main(summarize.Args(run_dir=str(run), episodes=5))
    err = capsys.readouterr().err.strip().splitlines()
    assert stop.value.code == 2 and len(err) == 1 and "cannot be played" in err[0]


def test_summarize_plays_the_references_anew_with_episodes(tmp_path, monkeypatch, capsys):
    """--episodes N keeps its old meaning: the references of the run's room played now over N episodes."""
    played = []

    def fake_play(setting, episodes, seed):
        played.append((setting, episodes, seed))
        return {"BFS oracle": {"1,0,0,0": {"mean": 7.0, "se": 0.5}}, "random": {}}

    monkeypatch.setitem(reference_returns.PLAY, "babyai", fake_play)
    summarize.main(summarize.Args(run_dir=str(babyai_run(tmp_path, "mini", MINIATURE)), episodes=3))
    out = capsys.readouterr().out
    assert played == [(MINIATURE, 3, 0)] and "references played now over 3 episodes" in out
    assert "| train | 1,0,0,0 | 3.50 ± 0.50 | 2.50 ± 0.50 | 7.00 ± 0.50 | - |" in out


def test_storing_adds_a_room_and_refuses_to_replace_changed_numbers_without_overwrite(tmp_path, monkeypatch, capsys):
    """Another room's entry is added beside the first, the same numbers refresh an entry, and numbers that changed
    (the docs quote the old ones) stop with one line unless --overwrite."""
    file = tmp_path / "references.json"
    oracle = {"1,0,0,0": {"mean": 9.0, "se": 0.25}}
    monkeypatch.setitem(reference_returns.PLAY, "babyai", lambda setting, episodes, seed: {"BFS oracle": dict(oracle)})
    reference_returns.store_babyai(episodes=4, file=str(file))
    reference_returns.store_babyai(**MINIATURE, episodes=4, file=str(file))
    reference_returns.store_babyai(**MINIATURE, episodes=4, file=str(file))  # the same numbers: refreshed
    assert [e["setting"] for e in json.loads(file.read_text())["babyai"]] == [PAPER_ROOM, MINIATURE]
    entry = reference_returns.stored("babyai", MINIATURE, file)
    assert entry["command"] == ("python -m tools.reference_returns babyai --grid-size 6 --objects-per-category 1 "
                                "--episode-steps 50 --episodes 4 --seed 0")
    assert entry["returns"] == {"BFS oracle": oracle} and entry["episodes"] == 4
    oracle["1,0,0,0"] = {"mean": 8.0, "se": 0.25}
    with pytest.raises(SystemExit) as stop:
        exit_on_config_error(reference_returns.store_babyai)(**MINIATURE, episodes=4, file=str(file))
    assert stop.value.code == 2 and "differ from the ones played now" in capsys.readouterr().err
    assert reference_returns.stored("babyai", MINIATURE, file)["returns"]["BFS oracle"]["1,0,0,0"]["mean"] == 9.0
    reference_returns.store_babyai(**MINIATURE, episodes=4, overwrite=True, file=str(file))
    assert reference_returns.stored("babyai", MINIATURE, file)["returns"]["BFS oracle"]["1,0,0,0"]["mean"] == 8.0
