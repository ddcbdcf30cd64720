"""Fruitbot (common/envs/fruitbot.py): exact per-category cumulants, the 4-level lifetime, termination vs truncation."""

import struct

import numpy as np
import pytest

from common.envs import fruitbot
from common.envs.fruitbot import (CUR_TIME_FIELD, TEST_TASKS, TIMEOUT_FIELD, TRAIN_TASKS, Fruitbot, StateLayout,
                             scripted_actions, type_counts)
from common.run import ConfigError

STOCK = np.array([1.0, 1.0, -4.0, -4.0])  # the stock game's reward per object of each category: fruit +1, food -4


def set_level_timeout(env: Fruitbot, i: int, steps: int) -> None:
    """Shorten env i's current level to time out `steps` steps from now (a timeout never happens naturally: the
    agent always moves up and reaches the end of a level in about 430 steps)."""
    state = bytearray(env.get_state(env.game, i))
    layout = StateLayout(bytes(state))
    now = layout.step_field(bytes(state), CUR_TIME_FIELD)
    struct.pack_into("<i", state, layout.step_fields + 4 * TIMEOUT_FIELD, now + steps)
    env.game.set_state(i, bytes(state))
    env._cache(i)


def play(env: Fruitbot, steps: int, policy: str, seed: int = 0, timeouts_every: int = 0):
    """Step env with random or scripted (gap-seeking, epsilon 0.03) actions; return every step's outputs."""
    rng = np.random.default_rng(seed)
    env.reset()
    out = []
    for t in range(steps):
        if timeouts_every and t % timeouts_every == 0:
            set_level_timeout(env, t // timeouts_every % env.num_envs, 25)
        if policy == "random":
            actions = rng.integers(0, fruitbot.NUM_ACTIONS, env.num_envs)
        else:
            actions = scripted_actions(env, rng, epsilon=0.03)
        w = env.w.copy()
        obs, reward, terminated, truncated, info = env.step(actions)
        out.append(dict(info, w=w, reward=reward, terminated=terminated, truncated=truncated, obs=obs))
    return out


@pytest.fixture(scope="module")
def rollouts():
    """20,000 env steps: 8 random envs (frequent deaths; some levels' timeout shortened so that timeouts happen too)
    and 8 scripted envs (level completions, full lifetimes)."""
    random = play(Fruitbot(8, seed=1), 500, "random", timeouts_every=100)  # replays only where needed (training)
    scripted = play(Fruitbot(8, seed=2, final_view=True), 2000, "scripted", seed=1)  # a replay at every level end
    return random + scripted


def test_cumulants_explain_the_stock_reward_at_every_step(rollouts):
    """stock reward = 1 fruit - 4 food (+ 10 or 20 on completing a level), from our 4 category counts alone."""
    steps = sum(r["phi"].shape[0] for r in rollouts)
    assert steps >= 20_000
    mismatches, collected, completions, deaths, timeouts = 0, 0, 0, 0, 0
    for r in rollouts:
        bonus = r["stock_reward"] - r["phi"] @ STOCK
        ok = np.where(r["level_complete"], np.isin(bonus, (10.0, 20.0)), bonus == 0)
        mismatches += int((~ok).sum())
        collected += int(r["phi"].sum())
        completions += int(r["level_complete"].sum())
        deaths += int(r["died"].sum())
        timeouts += int(r["timed_out"].sum())
    assert mismatches == 0
    assert collected > 200 and completions >= 20 and deaths >= 50 and timeouts >= 5, \
        (collected, completions, deaths, timeouts)


def test_a_wrong_category_mapping_is_caught(monkeypatch):
    """The same check fails when food themes are counted as fruit (the mapping is what the check tests)."""
    monkeypatch.setattr(fruitbot, "TYPE_CATEGORY", np.array([0, 0, 0, 1, 1, 2, 2, 2, 2, 3, 3, 3]))
    rollout = play(Fruitbot(8, seed=1), 300, "random")
    mismatches = sum(int((r["stock_reward"] - r["phi"] @ STOCK != 0)[~r["level_complete"]].sum()) for r in rollout)
    assert mismatches > 0


def test_a_broken_state_layout_stops_with_a_clear_error(monkeypatch):
    """If the state parser read the wrong field, the env's own check refuses to go on."""
    monkeypatch.setattr(fruitbot, "ENTITY_THEME", 7)  # image_type instead of image_theme: every object is theme 4 or 7
    with pytest.raises((fruitbot.CumulantError, IndexError, ValueError)):
        play(Fruitbot(8, seed=1), 300, "random")


def test_reward_is_w_dot_phi_with_no_bonus_and_no_food_penalty(rollouts):
    for r in rollouts:
        np.testing.assert_allclose(r["reward"], np.einsum("nc,nc->n", r["phi"], r["w"]))


def test_four_levels_make_a_lifetime(rollouts):
    """Completing a level continues the episode; the fourth completion ends it as a termination; a death ends it as
    a termination; a timeout as a truncation. The level counter restarts with every episode."""
    scripted = rollouts[500:]
    num_envs = scripted[0]["phi"].shape[0]
    levels = np.zeros(num_envs, int)
    lifetimes = 0
    for r in scripted:
        done = r["terminated"] | r["truncated"]
        levels = levels + r["level_complete"]
        np.testing.assert_array_equal(r["levels"], levels)
        np.testing.assert_array_equal(r["terminated"], r["died"] | (r["level_complete"] & (levels == 4)))
        np.testing.assert_array_equal(r["truncated"], r["timed_out"])
        assert not (r["level_complete"] & done & (levels < 4)).any()  # a completed level below 4 continues
        assert not (r["terminated"] & r["truncated"]).any()
        lifetimes += int((r["level_complete"] & (levels == 4)).sum())
        levels = np.where(done, 0, levels)
    assert lifetimes >= 1


def test_nothing_of_a_finished_episode_leaks_into_the_next(rollouts):
    """After an episode ends the next step starts from a fresh level: its cumulants count only that level's
    objects (checked by the reward identity above), the level counter is back at zero, the task is redrawn from the
    train tasks, and the frame returned is the new level's, not the final view."""
    previous_done, final_views = None, 0
    for r in rollouts:
        if previous_done is not None:
            assert (r["levels"][previous_done] <= 1).all()
        done = r["terminated"] | r["truncated"]
        for i in np.flatnonzero(done & r["final_image"].any(axis=(1, 2, 3))):  # final views: the scripted envs'
            assert not np.array_equal(r["final_image"][i], r["obs"]["image"][i])
            final_views += 1
        assert all(w.tolist() in TRAIN_TASKS.tolist() for w in r["obs"]["w"][done])
        previous_done = done
    assert final_views > 5


def test_a_fresh_episode_starts_with_full_counts():
    env = Fruitbot(2, seed=5)
    env.reset()
    counts = type_counts(env.get_state(env.game, 0))
    assert 20 <= counts.sum() <= 38  # 10-19 fruit and 10-19 food per level
    assert (counts[:6] > 0).sum() >= 3 and (counts[6:] > 0).sum() >= 3  # hard mode: many of the 12 types


def test_evaluation_envs_keep_their_task():
    env = Fruitbot(6, TEST_TASKS, seed=0, num_levels=0, task_of_env=np.arange(6))
    obs = env.reset()
    rng = np.random.default_rng(0)
    for _ in range(100):
        obs, *_ = env.step(rng.integers(0, 15, 6))
        np.testing.assert_array_equal(obs["w"], TEST_TASKS)


@pytest.mark.parametrize("kwargs, message", [
    (dict(tasks=np.ones((2, 3))), "tasks must be an [n, 4] array"),
    (dict(num_envs=0), "num_envs must be positive"),
    (dict(distribution_mode="medium"), "distribution_mode must be one of"),
    (dict(max_levels=0), "max_levels must be positive"),
])
def test_bad_input_gets_one_clear_line(kwargs, message):
    with pytest.raises(ConfigError, match=message.replace("[", r"\[").replace("]", r"\]")):
        Fruitbot(**({"num_envs": 2} | kwargs))


def test_wrong_number_of_actions_is_refused():
    env = Fruitbot(2, seed=0)
    env.reset()
    with pytest.raises(ConfigError, match="actions must have shape"):
        env.step(np.zeros(3, np.int32))


def test_the_reference_table_prints_each_task_and_the_mean_and_refuses_one_episode(capsys):
    fruitbot._print_reference_table(episodes=8, seed=3, policies=("random",), splits=("train",))
    lines = capsys.readouterr().out.splitlines()
    rows = [line for line in lines if line.startswith("| train |")]
    assert [r.split(" | ")[1] for r in rows] == ["1,0,0,0", "0,1,0,0", "0,0,1,0", "0,0,0,1", "mean"]
    means, ses = np.array([[float(x) for x in r.split(" | ")[2].rstrip(" |").split(" ± ")] for r in rows]).T
    assert len(set(means[:-1])) > 1 and means[-1] == pytest.approx(np.mean(means[:-1]), abs=1e-3)
    assert ses[-1] == pytest.approx(np.sqrt((ses[:-1] ** 2).sum()) / 4, abs=2e-3)  # independent tasks' s.e.
    with pytest.raises(ConfigError, match="num_episodes must be at least 2"):
        fruitbot._print_reference_table(episodes=1, policies=("random",), splits=("train",))
    assert capsys.readouterr().out == ""  # nothing printed before the refusal
