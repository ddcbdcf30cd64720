"""The tools on fake runs: the comparison table at the runs' shared step, and the figures."""

import csv
import json
from pathlib import Path

import numpy as np
import pytest

from common.run import format_task


def fake_run(tmp_path, name, method, steps, gpi_settings, value, env="babyai"):
    """A run directory with config.json and an eval.csv whose return is value + seed + gpi on every task of env."""
    if env == "fruitbot":
        from common.envs.fruitbot import TEST_TASKS, TRAIN_TASKS
    elif env == "minihack":
        from common.envs.minihack import TEST_TASKS, TRAIN_TASKS
    else:
        from common.envs.babyai import TEST_TASKS, TRAIN_TASKS
    d = tmp_path / name
    d.mkdir()
    # how msfa_fruitbot.py's and msfa_minihack.py's runs are told apart
    saved = {"fruitbot": {"distribution_mode": "hard"}, "minihack": {"room_size": "5x5"}}.get(env, {})
    (d / "config.json").write_text(json.dumps({"method": method, "args": saved}))
    with (d / "eval.csv").open("w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["step", "seed", "split", "task", "gpi", "episodes", "return_mean", "return_std"])
        for step in steps:
            for seed in (1, 2):
                for g in gpi_settings:
                    for split, tasks in (("train", TRAIN_TASKS), ("test", TEST_TASKS)):
                        for w in tasks:
                            writer.writerow([step, seed, split, format_task(w), g, 2, value + seed + g, 0])
    return str(d)


def test_plot_writes_learning_curves_and_test_task_figures(tmp_path, capsys):
    from tools import plot

    runs = (fake_run(tmp_path, "sf", "MSFA", (10, 20), (0, 1), 1.0),
            fake_run(tmp_path, "sf2", "MSFA (entangled psi)", (10, 20), (0, 1), 3.0),
            fake_run(tmp_path, "q", "Q method", (10, 20), (0,), 5.0))
    plot.main(plot.Args(run_dirs=runs, out=str(tmp_path / "figures"), reference_episodes=0))
    for name in ("learning_curves.png", "test_tasks.png", "modularity.png", "gpi_ablation.png", "aggregate.png"):
        data = (tmp_path / "figures" / name).read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 10_000
    out = capsys.readouterr().out
    assert "(step 20)" in out
    # seeds 1 and 2 score value + seed + gpi on all 8 tasks: the IQM of those 16 scores is value + 1.5 + gpi
    assert "IQM MSFA: 3.500 " in out and "IQM MSFA (entangled psi): 5.500 " in out
    assert "IQM Q method (no GPI): 6.500 " in out


def test_plot_names_one_method_from_two_folders_by_their_folders(tmp_path, capsys):
    """The paper form's 10 seeds of one protocol beside 3 more of another: both MSFA, told apart by their folders."""
    from tools import plot

    (tmp_path / "mini_cpu").mkdir()
    (tmp_path / "mini_cumulants").mkdir()
    runs = (fake_run(tmp_path / "mini_cpu", "msfa", "MSFA", (10, 20), (0, 1), 1.0),
            fake_run(tmp_path / "mini_cumulants", "msfa", "MSFA", (10, 20), (0, 1), 2.0),
            fake_run(tmp_path, "usfa", "USFA", (10, 20), (0, 1), 3.0))
    plot.main(plot.Args(run_dirs=runs, out=str(tmp_path / "figures"), reference_episodes=0))
    out = capsys.readouterr().out
    assert "IQM MSFA [mini_cpu]: 3.500 " in out and "IQM MSFA [mini_cumulants]: 4.500 " in out
    assert "IQM USFA: 5.500 " in out  # (a method given once keeps its name)


def test_the_aggregate_intervals_are_reproducible_and_each_methods_own(tmp_path, capsys):
    """aggregate.png's bootstrap: the same figure twice gives the same IQM intervals, and a method's interval does not
    move when another method joins the figure (each method's draws are seeded on their own)."""
    from common.envs.babyai import TEST_TASKS, TRAIN_TASKS
    from tools import plot

    runs = [fake_run(tmp_path, name, method, (10,), (0, 1), 0.0)
            for name, method in (("a", "MSFA"), ("b", "USFA (learned cumulants)"))]
    rng = np.random.default_rng(7)
    for d in runs:  # five seeds with returns spread by task and seed, so that the draws matter
        with (Path(d) / "eval.csv").open("w", newline="") as f:
            writer = csv.writer(f)
            writer.writerow(["step", "seed", "split", "task", "gpi", "episodes", "return_mean", "return_std"])
            for seed in range(1, 6):
                for g in (0, 1):
                    for split, tasks in (("train", TRAIN_TASKS), ("test", TEST_TASKS)):
                        for w in tasks:
                            writer.writerow([10, seed, split, format_task(w), g, 2, rng.normal(5, 3), 0])

    def msfa_line(run_dirs):
        plot.main(plot.Args(run_dirs=run_dirs, out=str(tmp_path / "figures"), reference_episodes=0))
        return [line for line in capsys.readouterr().out.splitlines() if line.startswith("IQM MSFA:")]

    both = msfa_line(tuple(runs))
    assert len(both) == 1 and both == msfa_line(tuple(runs)) == msfa_line((runs[0],))


def test_plot_spread_over_seeds_hand_worked(tmp_path):
    """The bands and error bars: one standard error, or the 95% Student's t interval of the mean over seeds."""
    from tools import plot
    from tools.run_reader import RunReader

    # seeds 1, 2, 3: mean 2, sample std 1, s.e. 1/sqrt(3) = 0.57735; t(0.975, 2 d.o.f.) = 4.30265
    assert plot.mean_spread(np.array([1.0, 2.0, 3.0]), "se") == pytest.approx((2.0, 0.57735), abs=1e-5)
    assert plot.mean_spread(np.array([1.0, 2.0, 3.0]), "ci95") == pytest.approx((2.0, 2.48414), abs=1e-5)
    assert plot.mean_spread(np.array([4.0]), "ci95") == (4.0, 0.0)  # one seed has no spread
    # the fake run's seeds 1 and 2 score value + seed + gpi on every task: mean value + 1.5 + gpi, s.e. 0.5,
    # t(0.975, 1 d.o.f.) = 12.7062, so the 95% half-width is 6.3531
    table = RunReader(fake_run(tmp_path, "sf", "MSFA", (10, 20), (0, 1), 1.0)).returns
    from common.envs.babyai import TEST_TASKS
    steps, mean, half = plot.learning_curve(table, TEST_TASKS, 1, "ci95")
    assert list(steps) == [10, 20] and mean == pytest.approx([3.5, 3.5]) and half == pytest.approx([6.3531] * 2, 1e-4)
    steps, mean, half = plot.learning_curve(table, TEST_TASKS, 0, "se")
    assert mean == pytest.approx([2.5, 2.5]) and half == pytest.approx([0.5, 0.5])


def test_plot_draws_95_percent_intervals_with_a_no_gpi_panel(tmp_path, monkeypatch):
    from tools import plot

    runs = (fake_run(tmp_path, "sf", "MSFA", (10, 20), (0, 1), 1.0),
            fake_run(tmp_path, "q", "Q method", (10, 20), (0,), 5.0))
    asked = []
    half_width = plot.half_width  # every band and error bar is drawn through it
    monkeypatch.setattr(plot, "half_width", lambda std, n, interval: asked.append(interval) or half_width(std, n,
                                                                                                           interval))
    plot.main(plot.Args(run_dirs=runs, out=str(tmp_path / "figures"), reference_episodes=0, interval="ci95"))
    # per run the learning curves' 3 panels x 2 steps and test_tasks' 8 tasks, and MSFA's 2 bars in gpi_ablation
    # (no metrics.csv here, so no actors.png): all of them asked for the 95% interval
    assert len(asked) == 2 * (3 * 2 + 8) + 2 and set(asked) == {"ci95"}
    for name in ("learning_curves.png", "test_tasks.png", "gpi_ablation.png", "aggregate.png"):
        assert (tmp_path / "figures" / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # three panels of 7.5 inches at 120 dpi (train, test with GPI, test without); two when no run has GPI
    width = int.from_bytes((tmp_path / "figures" / "learning_curves.png").read_bytes()[16:20], "big")
    assert width == 2700
    plot.main(plot.Args(run_dirs=runs[1:], out=str(tmp_path / "q_only"), reference_episodes=0))
    assert int.from_bytes((tmp_path / "q_only" / "learning_curves.png").read_bytes()[16:20], "big") == 1800


def test_plot_leaves_out_the_modularity_figure_without_msfa_variants(tmp_path):
    from tools import plot

    runs = (fake_run(tmp_path, "sf", "MSFA", (10,), (0, 1), 1.0), fake_run(tmp_path, "q", "Q method", (10,), (0,), 5.0))
    plot.main(plot.Args(run_dirs=runs, out=str(tmp_path / "figures"), reference_episodes=0))
    assert not (tmp_path / "figures" / "modularity.png").exists()
    assert (tmp_path / "figures" / "gpi_ablation.png").exists()


def test_plot_gives_every_method_its_own_colour_past_the_ten_colour_cycle():
    """Twelve methods in one figure (the miniature's two protocols side by side) once drew two pairs in one colour:
    matplotlib's cycle starts again after ten."""
    from matplotlib.colors import to_hex

    from tools import plot

    for n in (3, 10, 12, 20, 25):
        colours = plot.method_colours(f"method {i}" for i in range(n))
        assert len({to_hex(c) for c in colours.values()}) == n
    assert list(plot.method_colours("abc").values()) == ["C0", "C1", "C2"]


def test_plot_refuses_a_directory_without_evaluations(tmp_path, capsys):
    from tools import plot

    with pytest.raises(SystemExit) as exit_info:
        plot.main(plot.Args(run_dirs=(str(tmp_path),), out=str(tmp_path / "figures"), reference_episodes=0))
    err = capsys.readouterr().err.strip().splitlines()
    assert exit_info.value.code == 2 and len(err) == 1 and "no eval.csv" in err[0]


def test_plot_reads_babyais_stored_references_and_plays_only_when_asked_or_unstored(tmp_path, monkeypatch):
    from types import SimpleNamespace

    from common.envs.babyai import TEST_TASKS, TRAIN_TASKS
    from tools import plot, reference_returns
    from tools.run_reader import RunReader

    played = []

    def fake_play(tasks, num_episodes, env=None):
        played.append(num_episodes)
        return np.full(len(tasks), 5.0), None

    monkeypatch.setattr(plot, "bfs_oracle_returns", fake_play)
    monkeypatch.setattr(plot, "random_policy_returns", fake_play)
    run = fake_run(tmp_path, "b", "MSFA", (10, 20), (0, 1), 1.0)
    room = RunReader(run).babyai_room()
    entry = reference_returns.stored("babyai", reference_returns.room_setting(room))
    assert entry is not None  # the default room's references are committed
    (oracle, rand), random_lines, episodes = plot.babyai_references(room, TRAIN_TASKS, TEST_TASKS, None)
    assert played == [] and episodes == entry["episodes"]
    assert oracle.tolist() == [entry["returns"]["BFS oracle"][format_task(w)]["mean"] for w in TEST_TASKS]
    assert rand.tolist() == random_lines[1].tolist()
    assert random_lines[0].tolist() == [entry["returns"]["random"][format_task(w)]["mean"] for w in TRAIN_TASKS]
    assert plot.babyai_references(room, TRAIN_TASKS, TEST_TASKS, 7)[2] == 7 and played == [7, 7, 7]
    unstored = SimpleNamespace(grid_size=7, objects_per_category=2, episode_steps=33)
    assert plot.babyai_references(unstored, TRAIN_TASKS, TEST_TASKS, None)[2] == plot.PLAYED_EPISODES
    assert played[3:] == [plot.PLAYED_EPISODES] * 3
    played.clear()
    plot.main(plot.Args(run_dirs=(run,), out=str(tmp_path / "figures")))  # the default: the stored ones, none played
    assert played == [] and (tmp_path / "figures" / "test_tasks.png").exists()


def test_comparison_table_reads_runs_at_their_shared_step(tmp_path, capsys):
    from tools import compare_runs

    sf = fake_run(tmp_path, "sf", "SF method", (10, 20), (0, 1), 1.0)
    q = fake_run(tmp_path, "q", "Q method", (10,), (0,), 5.0)
    compare_runs.main(compare_runs.Args(run_dirs=(sf, q), split="test"))
    out = capsys.readouterr().out
    assert "step 10 " in out  # the latest step both runs have
    gpi_table, plain_table = out.split("**without GPI")
    assert "| SF method | 3.50 ± 0.50 |" in gpi_table and "Q method" not in gpi_table  # seeds 1, 2: 1 + s + 1
    assert "| Q method | 6.50 ± 0.50 |" in plain_table and "| SF method | 2.50 ± 0.50 |" in plain_table
    with pytest.raises(SystemExit):
        compare_runs.main(compare_runs.Args(run_dirs=(sf, q), step=20))
    assert "not evaluated in every run" in capsys.readouterr().err


def test_the_tools_read_a_fruitbot_runs_tasks_and_refuse_mixed_environments(tmp_path, capsys):
    from tools import compare_runs, plot, summarize

    fruitbot = fake_run(tmp_path, "fb", "MSFA", (10,), (0, 1), 1.0, env="fruitbot")
    summarize.main(summarize.Args(run_dir=fruitbot))
    out = capsys.readouterr().out
    # stock procgen's hard mode (its runs' config.json has no --env-backend): the scripted and random play stored
    assert "| split | task | GPI | no GPI | scripted gap-seeker | random |" in out
    assert "| test | 1,-1,-1,-1 | 3.50 ± 0.50 | 2.50 ± 0.50 | -9.30 ± 0.90 | -0.55 ± 0.14 |" in out
    assert "references over 20 episodes, stored" in out
    summarize.main(summarize.Args(run_dir=fake_run(tmp_path, "mh", "MSFA", (10,), (0, 1), 1.0, env="minihack")))
    out = capsys.readouterr().out
    assert "| test | 1,1,1 | 3.50 ± 0.50 | 2.50 ± 0.50 | - | - |" in out and "| train | 0,0,1 |" in out
    plot.main(plot.Args(run_dirs=(fruitbot,), out=str(tmp_path / "figures"), reference_episodes=0))
    assert "IQM MSFA: 3.500 " in capsys.readouterr().out  # 6 Fruitbot test tasks, no BabyAI references
    babyai = fake_run(tmp_path, "ba", "MSFA", (10,), (0, 1), 1.0)
    with pytest.raises(SystemExit):
        compare_runs.main(compare_runs.Args(run_dirs=(fruitbot, babyai)))
    assert "different environments" in capsys.readouterr().err


def test_plot_draws_random_play_for_a_minihack_run_at_its_room_size(tmp_path, monkeypatch, capsys):
    """MiniHack has no oracle: the figures get random play's success rate, measured in the run's room size."""
    import numpy as np

    import common.envs.minihack
    from tools import plot

    calls = []

    def fake_random_returns(tasks, num_episodes, size, num_levels=0):
        calls.append((np.asarray(tasks).tolist(), num_episodes, size, num_levels))
        return np.array([0.7, 0.8, 0.9, 0.6]), None, None

    monkeypatch.setattr(common.envs.minihack, "random_returns", fake_random_returns)
    run = fake_run(tmp_path, "mh", "MSFA", (10, 20), (0, 1), 1.0, env="minihack")
    plot.main(plot.Args(run_dirs=(run,), out=str(tmp_path / "figures"), reference_episodes=7))
    assert calls == [([[1, 0, 0], [0, 1, 0], [0, 0, 1], [1, 1, 1]], 7, "5x5", 0)]  # fresh levels, as evaluation
    assert "IQM MSFA: 3.500 " in capsys.readouterr().out  # raw returns: no oracle to normalise by
    for name in ("learning_curves.png", "test_tasks.png", "gpi_ablation.png", "aggregate.png"):
        assert (tmp_path / "figures" / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def write_metrics(run, rows, counts=True):
    """A MiniHack metrics.csv of (step, seed, return of task 1,0,0, its episodes); the other tasks return 1."""
    tasks = ["1,0,0", "0,1,0", "0,0,1"]
    header = ["step", "seed"] + [f"return_train_{t}" for t in tasks]
    header += [f"episodes_train_{t}" for t in tasks] if counts else []
    with (run / "metrics.csv").open("w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(header)
        for step, seed, m, n in rows:
            writer.writerow([step, seed, m, 1.0, 1.0] + ([n, 1, 1] if counts else []))


def test_summarize_pools_the_training_actors_returns_over_episodes_hand_worked(tmp_path, capsys):
    """MiniHack run, seed 1, rows after step 100: (2 episodes of task 1,0,0, mean 0.5), (3, 1.0), (0, none).
    Pooled: (2 * 0.5 + 3 * 1.0) / 5 = 0.8; s.e. with rows as clusters: sqrt((4 * 0.3^2 + 9 * 0.2^2) * 2 / 1) / 5
    = 0.24. The row at step 100 is left out; a metrics.csv without episode counts is refused with one line."""
    from tools import summarize

    run = tmp_path / "mh"
    fake_run(tmp_path, "mh", "MSFA", (10,), (0, 1), 1.0, env="minihack")
    write_metrics(run, [(100, 1, 0.0, 9), (200, 1, 0.5, 2), (300, 1, 1.0, 3), (400, 1, "", 0)])
    summarize.main(summarize.Args(run_dir=str(run), actors_from=100))
    out = capsys.readouterr().out
    assert "| 1 | 0.800 ± 0.240 (5) | 1.000 ± 0.000 (3) | 1.000 ± 0.000 (3) |" in out
    write_metrics(run, [(200, 1, 0.5, 2)], counts=False)
    with pytest.raises(SystemExit):
        summarize.main(summarize.Args(run_dir=str(run), actors_from=100))
    assert "has no episodes_train_* columns" in capsys.readouterr().err


def test_plot_pools_the_actors_returns_per_window_hand_worked_and_draws_them_against_training_levels(
        tmp_path, monkeypatch):
    """Window 2 over rows (return, episodes) (0.5, 2), (1.0, 3) | (none, 0), (0.0, 1): (1 + 3) / 5 = 0.8, then 0.0;
    without episode counts the rows weigh equally: 0.75, then 0.0. A MiniHack run's actors.png takes random play
    on the run's training levels as its reference."""
    import numpy as np

    import common.envs.minihack
    from tools import plot
    from tools.run_reader import RunReader

    run = tmp_path / "mh"
    fake_run(tmp_path, "mh", "MSFA", (10,), (0, 1), 1.0, env="minihack")
    rows = [(10, 1, 0.5, 2), (20, 1, 1.0, 3), (30, 1, "", 0), (40, 1, 0.0, 1)]
    write_metrics(run, rows)
    steps, values = plot.actor_returns_per_window(RunReader(run), common.envs.minihack.TRAIN_TASKS, 2)[1]
    assert steps.tolist() == [20, 40] and values[:, 0] == pytest.approx([0.8, 0.0]) and np.all(values[:, 1:] == 1)
    write_metrics(run, rows, counts=False)
    _, values = plot.actor_returns_per_window(RunReader(run), common.envs.minihack.TRAIN_TASKS, 2)[1]
    assert values[:, 0] == pytest.approx([0.75, 0.0])
    calls = []

    def fake_random_returns(tasks, num_episodes, size, num_levels=0):
        calls.append(num_levels)
        return np.array([0.7, 0.8, 0.9, 0.6]), None, None

    monkeypatch.setattr(common.envs.minihack, "random_returns", fake_random_returns)
    plot.main(plot.Args(run_dirs=(str(run),), out=str(tmp_path / "figures"), reference_episodes=7, actor_window=2))
    assert calls == [0, 200]  # fresh levels for the evaluation figures, the 200 training levels for actors.png
    assert (tmp_path / "figures" / "actors.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_fruitbot_references_are_random_play_in_the_runs_own_game(tmp_path):
    """tools.plot's Fruitbot reference: random play in the game the run trained on (here the paper's), per train
    and test task, on the run's training levels for its actors."""
    import json

    from tools import plot

    run = Path(fake_run(tmp_path, "fb", "MSFA", (10,), (0, 1), 1.0, env="fruitbot"))
    config = json.loads((run / "config.json").read_text())
    config["args"] |= {"distribution_mode": "paper", "train_levels": 4}
    (run / "config.json").write_text(json.dumps(config))
    from common.envs.fruitbot import TEST_TASKS, TRAIN_TASKS

    train, test = plot.fruitbot_random_returns(run, TRAIN_TASKS, TEST_TASKS, 2, training_levels=True)
    assert train.shape == (4,) and test.shape == (6,) and np.isfinite(np.concatenate([train, test])).all()


def test_selection_judges_the_train_tasks_at_each_budget(tmp_path, monkeypatch, capsys):
    """tools.select_settings's criterion by hand: the oracle scores 10; both methods' train returns climb to 9 by step
    400 and stay; at budget 400 the share is 90% and the change since step 320 (the evaluation nearest 80% of 400)
    is (9 - 8.6) / 9 = +4.4% (met); at budget 200 the share is 60% (not met). Test-task rows are never read."""
    from tools import select_settings

    out = tmp_path / "candidate"
    out.mkdir()
    (out / "protocol.json").write_text(json.dumps({"methods": ["msfa", "usfa"], "scale": "mini", "extra": "--x 1"}))
    curve = {80: 1.0, 160: 4.0, 200: 6.0, 240: 7.0, 320: 8.6, 400: 9.0, 480: 9.0}
    for method in ("msfa", "usfa"):
        run = Path(fake_run(out, method, method.upper(), (), (0,), 0.0))
        (run / "config.json").write_text(json.dumps({"method": method, "args": {"total_timesteps": 480,
                                                                                "replay_size": 30}}))
        with (run / "eval.csv").open("a", newline="") as f:
            writer = csv.writer(f)
            for step, value in curve.items():
                for seed, offset in ((1, -0.5), (2, 0.5)):
                    for split in ("train", "test"):
                        for w in np.eye(4):
                            # test tasks score 100: were they read, every share would be far above 1
                            writer.writerow([step, seed, split, format_task(w), 0, 2,
                                             value + offset if split == "train" else 100.0, 0])
    monkeypatch.setattr(select_settings, "bfs_oracle_returns", lambda tasks, episodes, env: (np.full(len(tasks), 10.0),))
    assert {r["method"] for r in select_settings.judge(out, 1)} == {"msfa", "usfa"}  # at their own budget
    rows = {r["method"]: r for r in select_settings.judge(out, 1, budget=400)}
    assert rows["msfa"]["share"] == pytest.approx(0.9) and rows["msfa"]["at_80"] == 320
    assert rows["usfa"]["change"] == pytest.approx(0.4 / 9) and rows["usfa"]["spread"] == pytest.approx(2 ** 0.5 / 2)
    select_settings.main(select_settings.Args(out_dirs=(str(out),), oracle_episodes=1, budgets=(200, 400)))
    lines = [line for line in capsys.readouterr().out.splitlines() if "| msfa |" in line]
    assert lines[0].startswith("| replay 30 | msfa |") and "| 200 |" in lines[0] and "60%" in lines[0]
    assert lines[0].endswith("not met |")
    assert "| 400 |" in lines[1] and "90%" in lines[1] and lines[1].endswith("| met |")
    with pytest.raises(SystemExit):
        select_settings.main(select_settings.Args(out_dirs=(str(out),), oracle_episodes=1, budgets=(1000,)))
    assert "--budgets 1,000 is beyond" in capsys.readouterr().err


def test_an_export_of_a_run_resumed_from_an_export_does_not_pool_its_metrics_twice(tmp_path, capsys):
    """tools.export's metrics_every counts the run's logging windows: rows an earlier export pooled (a protocol's
    folder restored from its export) are recognised (common.run.pooled_windows) and not pooled again."""
    import lzma
    import shutil

    from common.run import ConfigError, pooled_windows
    from tools.export import copy_run

    # a run logging every 20 env steps: 2 iterations of 10 env steps, 3 SGD steps each
    rows = [{"step": str(20 * i), "seed": "1", "sgd_steps": str(6 * i), "return_train_1,0": str(i),
             "episodes_train_1,0": "1"} for i in range(1, 17)]
    run = Path(fake_run(tmp_path, "run", "MSFA", (320,), (0,), 1.0))
    (run / "config.json").write_text(json.dumps({"method": "MSFA", "args": {"log_every": 20},
                                                 "sgd_steps_per_iteration": 3}))
    with (run / "metrics.csv").open("w", newline="") as f:
        writer = csv.DictWriter(f, list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    assert pooled_windows(rows, 20, 3) == 1 and pooled_windows(rows[::4], 20, 3) == 4
    assert pooled_windows(rows, 40, 3) == 1 and pooled_windows(rows, 10, 3) == 2  # log_every 10: 1 iteration a row

    def exported(source, name, every):
        copy_run(source, tmp_path / name, with_agents=False, metrics_every=every)
        return lzma.open(tmp_path / name / "metrics.csv.xz", "rt").read().splitlines()

    once = exported(run, "once", 4)
    assert [line.split(",")[0] for line in once[1:]] == ["80", "160", "240", "320"]
    resumed = tmp_path / "resumed"  # the export copied back as a protocol's run, as a new machine's resume does
    shutil.copytree(tmp_path / "once", resumed)
    capsys.readouterr()
    assert exported(resumed, "twice", 4) == once
    assert "pools 4 logging windows a row already" in capsys.readouterr().out
    assert [line.split(",")[0] for line in exported(resumed, "coarser", 8)[1:]] == ["160", "320"]
    with pytest.raises(ConfigError, match="a multiple of 4"):
        exported(resumed, "odd", 6)
    # a protocol's merge of seed 1 restored from that export (pooled) and seed 2 trained here (not): each seed pooled
    # by its own windows, both every 4 windows in the export
    merged = tmp_path / "merged"
    shutil.copytree(resumed, merged)
    restored = list(csv.DictReader(once))
    with (merged / "metrics.csv").open("w", newline="") as f:
        writer = csv.DictWriter(f, list(rows[0]))
        writer.writeheader()
        writer.writerows(sorted([*restored, *({**r, "seed": "2"} for r in rows)],
                                key=lambda r: (int(r["step"]), int(r["seed"]))))
    (merged / "metrics.csv.xz").unlink()
    lines = exported(merged, "merged_export", 4)
    assert [tuple(line.split(",")[:2]) for line in lines[1:]] == [(str(80 * i), seed) for seed in "12"
                                                                  for i in range(1, 5)]
    assert "pools 4 logging windows a row already (an earlier export's) for seed(s) 1: as they are" in (
        capsys.readouterr().out)


def test_the_cumulant_response_over_training_pools_each_evaluations_rows_and_is_drawn(tmp_path):
    """eval.csv's response columns (common.run.RESPONSE_FIELDS) pooled per evaluation and seed, weighted by their
    pickups (the run reader), and drawn by tools.plot; a run without them (an older one) draws none."""
    from common.envs.babyai import TEST_TASKS, TRAIN_TASKS
    from common.run import EVAL_FIELDS
    from tools import plot
    from tools.run_reader import RunReader, response_curve

    run = tmp_path / "msfa"
    run.mkdir()
    (run / "config.json").write_text(json.dumps({"method": "MSFA", "args": {}}))
    with (run / "eval.csv").open("w", newline="") as f:
        writer = csv.DictWriter(f, EVAL_FIELDS)
        writer.writeheader()
        for step in (10, 20):
            for seed in (1, 2):
                for split, tasks in (("train", TRAIN_TASKS), ("test", TEST_TASKS)):
                    for t, w in enumerate(tasks):
                        for g in (0, 1):
                            row = {"step": step, "seed": seed, "split": split, "task": format_task(w), "gpi": g,
                                   "episodes": 2, "return_mean": 1.0, "return_std": 0}
                            if split == "train" and g == 0:  # task t: crosstalk t / 10 over t + 1 rewarded pickups
                                row |= {"phi_own_rewarded": 1.0, "phi_own_unrewarded": 0.5, "phi_crosstalk": t / 10,
                                        "phi_cross_unrewarded": 0.0, "pickups_rewarded": t + 1,
                                        "pickups_unrewarded": 0 if t == 3 else 2}
                            writer.writerow(row)
    steps, crosstalk = response_curve(RunReader(run), "crosstalk")
    assert steps.tolist() == [10, 20] and crosstalk.shape == (2, 2)
    assert crosstalk[0, 0] == pytest.approx((0 * 1 + 0.1 * 2 + 0.2 * 3 + 0.3 * 4) / 10)  # weighted by the pickups
    _, unrewarded = response_curve(RunReader(run), "own_unrewarded")
    assert unrewarded[1, 1] == pytest.approx(0.5)  # (the task with no unrewarded pickups does not count)
    older = fake_run(tmp_path, "older", "MSFA", (10, 20), (0, 1), 1.0)
    plot.main(plot.Args(run_dirs=(str(run), older), out=str(tmp_path / "figures"), reference_episodes=0))
    assert (tmp_path / "figures" / "cumulant_response.png").exists()
    plot.main(plot.Args(run_dirs=(older,), out=str(tmp_path / "older_figures"), reference_episodes=0))
    assert not (tmp_path / "older_figures" / "cumulant_response.png").exists()


def test_packed_tables_keep_six_digits_and_compacted_metrics_pool_returns_exactly(tmp_path):
    """tools.export's packing (common.run.pack_table): decimal numbers to 6 significant digits, integers and text as
    they are; with metrics_every 4, four rows of a seed made one, by hand."""
    import lzma

    from common.run import compact_metrics, compact_number, pack_table

    assert [compact_number(x) for x in ("0.123456789", "1234", "-1,1,0,1", "", "3.0", "1e-07", "nan")] == \
        ["0.123457", "1234", "-1,1,0,1", "", "3", "1e-07", "nan"]
    rows = [{"step": str(10 * i), "seed": "1", "sps": str(100 + i), "sgd_steps": str(3 * i), "loss": "" if i == 1 else
             str(0.5 * i), "rss_gb": str(1 + i / 10), "episode_length": "" if i == 2 else "50",
             "return_train_1,0": "" if i == 2 else str(i), "episodes_train_1,0": "0" if i == 2 else str(i)}
            for i in range(1, 6)]
    merged = compact_metrics(rows, 4)
    assert [r["step"] for r in merged] == ["40", "50"] and merged[0]["sgd_steps"] == "12"
    first = {k: float(v) for k, v in merged[0].items() if k not in ("step", "seed", "sgd_steps")}
    assert first["return_train_1,0"] == pytest.approx((1 * 1 + 3 * 3 + 4 * 4) / 8)  # weighted by its episodes
    assert first["episodes_train_1,0"] == 8 and first["rss_gb"] == pytest.approx(1.4)
    assert first["loss"] == pytest.approx((1.0 + 1.5 + 2.0) / 3) and first["sps"] == pytest.approx(102.5)
    assert merged[1]["return_train_1,0"] == "5.0" and merged[1]["episodes_train_1,0"] == 5
    with (tmp_path / "metrics.csv").open("w", newline="") as f:
        writer = csv.DictWriter(f, list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    (tmp_path / "out").mkdir()
    packed = pack_table(tmp_path / "metrics.csv", tmp_path / "out" / "metrics.csv", metrics_every=4)
    text = lzma.open(packed, "rt").read().splitlines()
    assert len(text) == 3 and text[1].startswith("40,1,102.5,12,1.5,1.4,50,3.25,8")


def test_an_export_keeps_the_agent_of_the_seed_it_is_told_for_a_method_in_progress(tmp_path, capsys):
    """--agents METHOD=K: a method trained seed by seed keeps seed K's agent from the export where K is complete (its
    seeds 1 and 2 restored from an export have none); a seed without one, an incomplete seed or a bare METHOD that
    is not complete is refused with one line naming what to do."""
    from common.run import ConfigError
    from tools.compact_agents import decompress
    from tools.evaluate import params_files
    from tools.export import export, main as export_main, Args as ExportArgs

    out, dest = tmp_path / "protocol", tmp_path / "exported"
    out.mkdir()
    (out / "protocol.json").write_text(json.dumps({"env": "fruitbot", "methods": ["m"], "seeds": 4,
                                                   "seeds_apart": True}))
    (out / "m").mkdir()
    for seed in (1, 2, 3, 4):
        run = Path(fake_run(out / "m", f"seed{seed}", "MSFA", (100,), (0,), 1.0, env="fruitbot"))
        (run / "metrics.csv").write_text("step,seed\n100,1\n")
        config = json.loads((run / "config.json").read_text())
        config["args"]["total_timesteps"] = 100 if seed < 4 else 200  # seed 4 is still training
        (run / "config.json").write_text(json.dumps(config))
        if seed >= 3:  # seeds 1 and 2 as an export restored them: no parameter file; 3 and 4 trained here
            (run / f"params_seed{seed}.eqx").write_bytes(b'{"args": {}}\n' + bytes(range(seed, seed + 64)))
    for entry, said in (("m=1", "holds no parameter file of seed 1; name a seed that has one (--agents m=K)"),
                        ("m=4", "seed4 is not complete; name a complete seed"),
                        ("m", "m is not complete; its seeds go with their records"), ("m=x", "is a seed number")):
        with pytest.raises(SystemExit):
            export_main(ExportArgs(str(out), str(dest), agents=(entry,)))
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and said in err[0], (entry, err)
    assert not dest.exists()  # nothing written before the refusal
    export(out, dest, agents=("m=3",))
    assert sorted(p.name for p in dest.rglob("params_seed*")) == ["params_seed3.eqz"]
    assert decompress((dest / "m" / "seed3" / "params_seed3.eqz").read_bytes())[-64:] == bytes(range(3, 67))
    assert params_files(dest / "m") == [dest / "m" / "seed3" / "params_seed3.eqz"]  # tools.evaluate/video find it
    export(out, dest)  # exported again without it: the agent goes
    assert not list(dest.rglob("params_seed*"))
    with pytest.raises(ConfigError, match="names m twice"):
        export(out, dest, agents=("m=3", "m"))
