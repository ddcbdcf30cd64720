"""GotoAvoid's own rules (the twin comparison is in test_babyai_equivalence.py), the oracle, and bad input."""

import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from common.envs.babyai import (
    DIR_TO_VEC,
    FORWARD,
    MAX_STEPS,
    NUM_OBJECTS,
    PICKUP,
    TEST_TASKS,
    TRAIN_TASKS,
    EnvState,
    GotoAvoid,
    bfs_oracle_action,
    bfs_oracle_returns,
    format_task,
    layout_is_valid,
    make_params,
    random_policy_returns,
)
from common.envs.minigrid_twin import GotoAvoidMiniGrid
from common.run import ConfigError


def test_tasks_are_the_papers():
    assert TRAIN_TASKS.shape == (4, 4) and (TRAIN_TASKS == np.eye(4)).all()
    assert TEST_TASKS.shape == (8, 4)
    assert [format_task(w) for w in TEST_TASKS] == [
        "1,1,0,0", "1,1,0.5,0.5", "1,1,1,1", "-1,1,0,1", "-1,1,-1,0.5", "-1,1,-1,1", "-1,1,-1,-1", "-0.5,1,-0.5,-0.5",
    ]


def test_reset_layouts_are_valid_and_distinct():
    env = GotoAvoid(obs_mode="symbolic")
    _, states = jax.vmap(env.reset, (0, None))(jax.random.split(jax.random.PRNGKey(0), 500), env.default_params)
    cells = np.concatenate([np.asarray(states.obj_pos), np.asarray(states.agent_pos)[:, None]], 1)
    assert ((cells >= 1) & (cells <= 8)).all()
    assert all(len({tuple(c) for c in layout}) == NUM_OBJECTS + 1 for layout in cells)
    assert np.asarray(jax.vmap(layout_is_valid)(states.agent_pos, states.agent_dir, states.obj_pos)).all()
    assert (np.asarray(states.time) == 0).all()
    # tasks are drawn from params.tasks: all four train tasks appear
    assert {tuple(w) for w in np.asarray(states.w)} == {tuple(w) for w in TRAIN_TASKS}


def test_an_enclosed_object_makes_a_layout_invalid():
    agent, direction = jnp.array([5, 5]), jnp.array(3)
    free = [(1, 1), (3, 1), (1, 3), (7, 7), (4, 4), (5, 8), (8, 8), (6, 6), (3, 7), (2, 6), (7, 2), (6, 3)]
    assert bool(layout_is_valid(agent, direction, jnp.array(free)))
    boxed = [(1, 1), (2, 1), (1, 2), (2, 2), (3, 1), (1, 3), (3, 2), (2, 3), (4, 4), (6, 6), (7, 7), (8, 8)]
    assert not bool(layout_is_valid(agent, direction, jnp.array(boxed)))  # (1, 1) has no free neighbour
    facing = [(5, 4)] + free[1:]
    assert not bool(layout_is_valid(agent, direction, jnp.array(facing)))  # the agent faces an object


def test_time_limit_is_a_truncation_with_auto_reset():
    env = GotoAvoid(obs_mode="symbolic")
    params = env.default_params
    obs, state = env.reset(jax.random.PRNGKey(1), params)

    def step(state, key):
        _, new, reward, terminated, truncated, info = env.step(key, state, FORWARD, params)
        return new, (terminated, truncated, new.time, new.agent_pos)

    _, (terminated, truncated, time, pos) = jax.lax.scan(step, state, jax.random.split(jax.random.PRNGKey(2), 450))
    assert not np.asarray(terminated).any()
    assert np.flatnonzero(np.asarray(truncated)).tolist() == [MAX_STEPS - 1, 2 * MAX_STEPS - 1]
    assert np.asarray(time)[MAX_STEPS - 1] == 0 and np.asarray(time)[MAX_STEPS - 2] == MAX_STEPS - 1


def random_states(n, seed, tasks=TEST_TASKS):
    env = GotoAvoid(obs_mode="symbolic")
    _, states = jax.vmap(env.reset, (0, None))(jax.random.split(jax.random.PRNGKey(seed), n), make_params(tasks))
    return env, states


def test_pickup_pays_w_and_respawns_at_distance_two_or_more():
    env, states = random_states(2000, 3)
    # put an object in front of every agent: move object 0 to the front cell (it was free: layouts are valid)
    front = states.agent_pos + jnp.asarray(DIR_TO_VEC)[states.agent_dir]
    front_is_wall = ((front < 1) | (front > 8)).any(-1)
    occupied = (states.obj_pos == front[:, None]).all(-1).any(-1)
    obj_pos = states.obj_pos.at[:, 0].set(front)
    states = states.replace(obj_pos=obj_pos)
    keys = jax.random.split(jax.random.PRNGKey(4), 2000)
    new, reward, info = jax.vmap(env.transition, (0, 0, None, None))(keys, states, PICKUP, make_params(TEST_TASKS))
    ok = np.asarray(~front_is_wall & ~occupied)
    phi = np.asarray(info["phi"])[ok]
    assert (phi == np.eye(4)[0]).all()  # object 0 is of category 0
    np.testing.assert_array_equal(np.asarray(reward)[ok], np.asarray(states.w)[ok, 0])
    moved = np.asarray(new.obj_pos[:, 0])[ok]
    agent = np.asarray(new.agent_pos)[ok]
    assert (np.abs(moved - agent).sum(-1) >= 2).all()
    others = np.asarray(new.obj_pos[:, 1:])[ok]
    assert not (others == moved[:, None]).all(-1).any()
    assert ((moved >= 1) & (moved <= 8)).all()
    assert ok.sum() > 1000


def test_respawn_is_spread_over_the_candidate_cells():
    env, states = random_states(1, 5)
    state = jax.tree.map(lambda x: x[0], states)
    front = state.agent_pos + jnp.asarray(DIR_TO_VEC)[state.agent_dir]
    state = state.replace(obj_pos=state.obj_pos.at[0].set(front))
    keys = jax.random.split(jax.random.PRNGKey(6), 4000)
    new, _, _ = jax.vmap(env.transition, (0, None, None, None))(keys, state, PICKUP, make_params(TEST_TASKS))
    cells, counts = np.unique(np.asarray(new.obj_pos[:, 0]), axis=0, return_counts=True)
    ax, ay = np.asarray(state.agent_pos)
    n_free = sum(
        1
        for x in range(1, 9)
        for y in range(1, 9)
        if abs(x - ax) + abs(y - ay) >= 2 and not (np.asarray(state.obj_pos[1:]) == (x, y)).all(-1).any()
    )
    assert len(cells) == n_free  # every candidate is reachable by the draw
    assert counts.min() > 0.5 * 4000 / n_free and counts.max() < 1.5 * 4000 / n_free


def test_observation_carries_the_task_and_optionally_truncates_it():
    state = jax.tree.map(lambda x: x[0], random_states(1, 7, tasks=[[-0.5, 1, 0.5, 1]])[1])
    assert np.asarray(GotoAvoid().observe(state).w).tolist() == [-0.5, 1, 0.5, 1]
    assert np.asarray(GotoAvoid(truncate_task_input=True).observe(state).w).tolist() == [0, 1, 0, 1]
    obs = GotoAvoid().observe(state)
    assert obs.image.shape == (40, 40, 3) and obs.image.dtype == jnp.uint8
    assert GotoAvoid(obs_mode="symbolic").observe(state).image.shape == (5, 5, 3)


def test_oracle_picks_up_what_is_in_front_and_turns_to_it():
    w = jnp.array([1.0, 0, 0, 0])
    objs = jnp.array([[5, 4]] + [[x, 8] for x in range(1, 9)] + [[1, 7], [2, 7], [3, 7]])
    facing = EnvState(time=0, agent_pos=jnp.array([5, 5]), agent_dir=jnp.array(3), obj_pos=objs, w=w)
    assert int(bfs_oracle_action(facing)) == PICKUP
    assert int(bfs_oracle_action(facing.replace(agent_dir=jnp.array(0)))) == 0  # wanted object on the left: turn left
    assert int(bfs_oracle_action(facing.replace(agent_dir=jnp.array(2)))) == 1  # on the right: turn right
    # the category-0 object is not wanted under w = e_1: the oracle walks to a category-1 object instead
    assert int(bfs_oracle_action(facing.replace(w=jnp.array([0.0, 1, 0, 0])))) != PICKUP


@pytest.mark.parametrize("room", [dict(grid_size=6, objects_per_category=1, episode_steps=50),
                                  dict(grid_size=5, objects_per_category=1, episode_steps=30)], ids=["6-1-50", "5-1-30"])
def test_a_smaller_room_has_valid_layouts_and_its_oracle_beats_random_play(room):
    env = GotoAvoid(obs_mode="symbolic", **room)
    keys = jax.random.split(jax.random.PRNGKey(0), 64)
    _, states = jax.vmap(env.reset, (0, None))(keys, env.make_params(TRAIN_TASKS))
    cells = np.concatenate([np.asarray(states.obj_pos), np.asarray(states.agent_pos)[:, None]], axis=1)
    assert all(len({tuple(c) for c in layout}) == env.num_objects + 1 for layout in cells)
    assert (cells >= 1).all() and (cells <= room["grid_size"] - 2).all()  # inside the walls
    oracle, _ = bfs_oracle_returns(TRAIN_TASKS, num_episodes=8, env=env)
    rand, _ = random_policy_returns(TRAIN_TASKS, num_episodes=8, env=env)
    assert (oracle > rand + 2).all(), (oracle, rand)
    assert int(env.default_params.max_steps_in_episode) == room["episode_steps"]


def test_oracle_beats_random_play():
    oracle, oracle_se = bfs_oracle_returns(TRAIN_TASKS[:2], num_episodes=8)
    rand, _ = random_policy_returns(TRAIN_TASKS[:2], num_episodes=8)
    assert (oracle > 10).all() and (oracle > rand + 5).all()
    assert (oracle_se >= 0).all()


@pytest.mark.parametrize(
    "make, message",
    [
        (lambda: make_params([1, 0, 0]), "task vector must have 4 weights"),
        (lambda: make_params(np.ones((2, 5))), "task vector must have 4 weights"),
        (lambda: GotoAvoid(obs_mode="pixels"), "unknown observation mode"),
        (lambda: GotoAvoid(view_size=0), "view size must be an odd integer"),
        (lambda: GotoAvoid(view_size=-3), "view size must be an odd integer"),
        (lambda: GotoAvoid(view_size=4), "view size must be an odd integer"),
        (lambda: GotoAvoidMiniGrid(tasks=[[1, 2]]), "task vector must have 4 weights"),
        (lambda: GotoAvoidMiniGrid(obs_mode="pixels"), "unknown observation mode"),
        (lambda: bfs_oracle_returns(num_episodes=1), "num_episodes must be at least 2"),
        (lambda: GotoAvoid(grid_size=4, objects_per_category=1), "a grid of size 4 .4 walkable cells. cannot hold 4"),
        (lambda: GotoAvoid(grid_size=6, objects_per_category=3), "cannot hold 12 objects .*: at most 2 per category fit"),
        (lambda: GotoAvoid(grid_size=2), "must be an integer >= 3, got 2"),
        (lambda: GotoAvoid(episode_steps=0), "the episode length must be a positive integer"),
    ],
)
def test_bad_input_is_refused_with_a_clear_message(make, message):
    with pytest.raises(ConfigError, match=message):
        make()


@pytest.mark.parametrize(
    "argv, message",
    [
        (["-m", "benchmarks.env_throughput", "--batch-sizes", "0"], "batch sizes must be positive"),
        (["-m", "common.envs.babyai", "--episodes", "1"], "num_episodes must be at least 2"),
    ],
)
def test_command_lines_stop_with_one_line(argv, message):
    out = subprocess.run([sys.executable, *argv], capture_output=True, text=True, timeout=300)
    assert out.returncode == 2
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and message in lines[0], out.stderr


def test_rgb_can_be_rendered_from_the_symbolic_view():
    env, states = random_states(300, 11)
    rgb = GotoAvoid(obs_mode="rgb")
    symbolic = jax.vmap(env.observe)(states).image
    np.testing.assert_array_equal(jax.vmap(rgb.rgb_from_symbolic)(symbolic), jax.vmap(rgb.observe)(states).image)
