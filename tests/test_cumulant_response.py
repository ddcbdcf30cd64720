"""The cumulant response (common/run/cumulants.py, tools.analyze): hand-worked sums, and two hand-built agents
played on the same fixed episodes: one whose phi is a pure reward detector (c = 1), one whose phi is a category
detector (c = 0), which the previous-reward counterfactual tells apart."""

from types import SimpleNamespace

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from common.envs.babyai import FORWARD, LEFT, PICKUP, RIGHT, TRAIN_TASKS, GotoAvoid
from common.run import RESPONSE, cumulant_response, pooled_response, response_columns, response_means, response_sums
from tools import analyze
from tools.run_reader import record_response


def test_the_response_matrix_sums_phi_at_each_categorys_pickups():
    phi = jnp.array([[0.5, 0.1], [0.9, 0.2], [0.3, 0.8], [7.0, 7.0]])
    phi_env = jnp.array([[1.0, 0.0], [1.0, 0.0], [0.0, 1.0], [1.0, 0.0]])
    valid = jnp.array([True, True, True, False])  # the last transition is masked
    sums, counts = cumulant_response(phi, phi_env, valid)
    np.testing.assert_allclose(sums, [[1.4, 0.3], [0.3, 0.8]], atol=1e-6)
    np.testing.assert_allclose(counts, [2, 1])


def test_the_four_summaries_by_hand():
    """Three categories, tasks e_1 and e_2. Task e_1 (k=0): 2 pickups of 0 (rewarded), 1 of 1, 1 of 2; task e_2
    (k=1): 1 pickup of 1 (rewarded), 2 of 0."""
    sums = np.zeros((2, 3, 3))
    counts = np.array([[2, 1, 1], [2, 1, 0]], float)
    sums[0, 0] = [1.8, 1.0, 0.4]  # e_1, picked 0: own rewarded 0.9; crosstalk (1.0 + 0.4) / (2 * 2)
    sums[0, 1] = [0.1, 0.5, 0.3]  # e_1, picked 1: own unrewarded 0.5; cross unrewarded phi^2 = 0.3
    sums[0, 2] = [0.2, 0.6, 0.7]  # e_1, picked 2: own unrewarded 0.7; cross unrewarded phi^1 = 0.6
    sums[1, 1] = [0.2, 1.1, 0.0]  # e_2, picked 1: own rewarded 1.1; crosstalk (0.2 + 0.0) / 2
    sums[1, 0] = [0.4, 3.0, 0.2]  # e_2, picked 0 twice: own unrewarded 0.4 / 2; cross unrewarded phi^2 0.2 / 2
    tasks = np.array([[1, 0, 0], [0, 1, 0]], float)
    summary = response_sums(sums, counts, tasks)
    assert summary["own_rewarded"] == pytest.approx((1.8 + 1.1, 3, 3))
    assert summary["crosstalk"] == pytest.approx((1.4 + 0.2, 6, 3))
    assert summary["own_unrewarded"] == pytest.approx((0.5 + 0.7 + 0.4, 4, 4))
    assert summary["cross_unrewarded"] == pytest.approx((0.3 + 0.6 + 0.2, 4, 4))
    means = response_means(summary)
    assert means["crosstalk"] == pytest.approx(1.6 / 6)
    # eval.csv's per-task columns pool back to the same means, weighted by their pickups
    rows = [response_columns(sums[t], counts[t], tasks[t]) for t in range(2)]
    assert rows[0]["pickups_rewarded"] == 2 and rows[0]["pickups_unrewarded"] == 2
    pooled = pooled_response(rows)
    for name in RESPONSE:
        assert pooled[name] == pytest.approx(means[name], abs=1e-5)


def test_the_response_is_defined_on_one_hot_tasks_only():
    from common.run import ConfigError

    with pytest.raises(ConfigError, match="one-hot"):
        response_sums(np.zeros((1, 4, 4)), np.zeros((1, 4)), np.array([[1, 1, 0, 0]], float))


# --------------------------------------------------------------------------------- two hand-built agents
ROOM = dict(grid_size=6, objects_per_category=1, episode_steps=50)
BALL, KEY, BOX = 6, 5, 7  # minigrid's object indices; colours red 0, green 1, blue 2, yellow 4
CATEGORY_CODES = jnp.array([[BALL, 0], [BALL, 2], [KEY, 1], [BOX, 4]])


class Core(eqx.Module):
    """h_t = [tanh(r_{t-1}); onehot(a_{t-1}); onehot(category of the object in front); 4 numbers from the view;
    whether the cell in front is empty]."""
    mix: jax.Array  # [5 * 5 * 3, 4]: a fixed random map of the view (it moves the policy about)
    reward_input: bool = eqx.field(static=True, default=True)

    def initial_state(self):
        return jnp.zeros(14), jnp.zeros(14)


class Net(eqx.Module):
    core: Core
    reward_detector: bool = eqx.field(static=True)

    def phi(self, h_next, h):
        """A reward detector: every phi^i = tanh(r_t) / tanh(1), 1 at a reward of 1. A category detector: phi^i = 1
        where the object in front at t was of category i and a_t picked it up."""
        if self.reward_detector:
            return jnp.full(4, h_next[0] / jnp.tanh(1.0))
        return h[5:9] * h_next[1 + PICKUP]

    def psi(self, h, z):
        return jnp.zeros((4, 4))


def core_step(core, image, prev_action, prev_reward, state):
    """The view's front cell (the agent sits at (2, 4) of minigrid's egocentric 5 x 5 view, facing (2, 3))."""
    front = image[2, 3, :2].astype(jnp.int32)
    category = jnp.all(front[None] == CATEGORY_CODES, axis=-1).astype(jnp.float32)
    noise = jnp.sin(image.reshape(-1).astype(jnp.float32) @ core.mix)
    reward = jnp.tanh(prev_reward) if core.reward_input else 0.0 * prev_reward
    empty = (front[0] == 1).astype(jnp.float32)[None]  # minigrid's "empty"
    h = jnp.concatenate([reward[None], jax.nn.one_hot(prev_action, 4), category, noise, empty])
    return h, h


def q_values(net, h, w):
    """Pick up whatever is in front; else mostly forward where the way is free, turning by the view's numbers (never
    straight back the way it last turned)."""
    thing, free = jnp.sum(h[5:9]), h[13]
    turned_back = 3.0 * (h[1 + RIGHT] * jax.nn.one_hot(LEFT, 4) + h[1 + LEFT] * jax.nn.one_hot(RIGHT, 4))
    return (h[9:13] + (10.0 * thing - 5.0 * (1 - thing)) * jax.nn.one_hot(PICKUP, 4)
            + (1.5 * free - 5.0 * (1 - free)) * jax.nn.one_hot(FORWARD, 4) - turned_back)


def hand_built_agent(reward_detector: bool) -> analyze.Agent:
    env = GotoAvoid(obs_mode="symbolic", **ROOM)
    env.rgb_from_symbolic = lambda image: image  # the core reads the symbolic view itself
    net = Net(Core(jax.random.normal(jax.random.PRNGKey(7), (75, 4))), reward_detector)
    params, static = eqx.partition(net, eqx.is_inexact_array)
    script = SimpleNamespace(make_setup=lambda args: SimpleNamespace(env=env, static=static), core_step=core_step,
                             q_values=q_values, gpi_q_values=lambda net, h, w, policies: q_values(net, h, w),
                             GPI_SETTINGS=(0, 1))
    return analyze.Agent("hand-built", "hand-built", 1, 0, script, SimpleNamespace(learned_cumulants=True), params)


@pytest.mark.parametrize("reward_detector", [True, False])
def test_a_reward_detector_and_a_category_detector_on_the_same_episodes(reward_detector):
    agent = hand_built_agent(reward_detector)
    trace = analyze.rollout(agent, TRAIN_TASKS, 16, False, jax.random.PRNGKey(3), response=True)
    record = {"response": analyze.response_record(trace, TRAIN_TASKS)}
    played, counterfactual = record_response(record), record_response(record, counterfactual=True)
    _, pickups = analyze.pooled_seed_response([record])
    assert pickups["own_rewarded"] >= 20 and pickups["own_unrewarded"] >= 20, pickups  # both kinds were seen
    # the agent's own check of its view: the category detector fires at every pickup of its category, exactly
    if reward_detector:  # phi reads the reward: c = 1, and without the reward input it is blind
        expected, expected_counterfactual = [1, 0, 1, 0], [0, 0, 0, 0]
    else:  # phi reads the category: c = 0, and the previous reward changes nothing
        expected, expected_counterfactual = [1, 1, 0, 0], [1, 1, 0, 0]
    np.testing.assert_allclose([played[n] for n in RESPONSE], expected, atol=1e-5)
    np.testing.assert_allclose([counterfactual[n] for n in RESPONSE], expected_counterfactual, atol=1e-5)
