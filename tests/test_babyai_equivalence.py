"""The JAX GotoAvoid and its minigrid twin agree: observations (both modes), rewards, cumulants and poses.

The comparison is written as `first_mismatch` so that the last tests can show it catches a one-cell change of the
respawn rule and of the occlusion rule.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import common.envs.babyai as babyai
from common.envs.babyai import (
    TEST_TASKS,
    TRAIN_TASKS,
    EnvState,
    GotoAvoid,
    make_params,
)
from common.envs.minigrid_twin import GotoAvoidMiniGrid

MODES = ("rgb", "symbolic")


def jax_rollout(num_envs: int, num_steps: int, seed: int, view_size: int = 5, **room):
    """Random-action rollouts of the JAX env in both observation modes from the same keys (room: GotoAvoid's
    grid_size, objects_per_category, episode_steps; default the paper's)."""
    envs = {mode: GotoAvoid(obs_mode=mode, view_size=view_size, **room) for mode in MODES}
    params = envs["rgb"].make_params(np.concatenate([TRAIN_TASKS, TEST_TASKS]))
    key_reset, key_run = jax.random.split(jax.random.PRNGKey(seed))
    reset_keys = jax.random.split(key_reset, num_envs)

    @jax.jit
    def run(reset_keys, key_run):
        obs0 = {}
        for mode, env in envs.items():
            obs0[mode], state0 = jax.vmap(env.reset, (0, None))(reset_keys, params)

        def step(state, key):
            key_act, key_env = jax.random.split(key)
            # Pickup and forward more often than turns, so that pickups (and respawns) are frequent.
            action = jax.random.choice(key_act, 4, (num_envs,), p=jnp.array([0.2, 0.2, 0.3, 0.3]))
            env_keys = jax.random.split(key_env, num_envs)
            out = {}
            for mode, env in envs.items():
                obs, new_state, reward, _, truncated, info = jax.vmap(env.step, (0, 0, 0, None))(
                    env_keys, state, action, params
                )
                out[mode] = obs
            record = dict(obs=out, state=new_state, action=action, reward=reward, truncated=truncated, info=info)
            return new_state, record

        _, records = jax.lax.scan(step, state0, jax.random.split(key_run, num_steps))
        return obs0, state0, records

    obs0, state0, records = run(reset_keys, key_run)
    return jax.tree.map(np.asarray, (obs0, state0, records))


def layout_of(state, e, t=None):
    pick = (lambda x: x[e]) if t is None else (lambda x: x[t, e])
    return {"layout": (pick(state.agent_pos), pick(state.agent_dir), pick(state.obj_pos)), "w": pick(state.w)}


def first_mismatch(obs0, state0, records, twin_cls=GotoAvoidMiniGrid, view_size: int = 5, grid_size: int = 10,
                   objects_per_category: int = 3, episode_steps: int = 200):
    """Replay every JAX rollout in the twin; return a description of the first disagreement, or None."""
    num_steps, num_envs = records["action"].shape
    pickups = 0
    room = dict(grid_size=grid_size, objects_per_category=objects_per_category, max_steps=episode_steps)
    for e in range(num_envs):
        twins = {mode: twin_cls(obs_mode=mode, view_size=view_size, **room) for mode in MODES}
        for mode, twin in twins.items():
            obs, _ = twin.reset(options=layout_of(state0, e))
            if not np.array_equal(obs["image"], obs0[mode].image[e]) or not np.array_equal(obs["w"], obs0[mode].w[e]):
                return f"env {e}: reset observation differs ({mode})"
        for t in range(num_steps):
            u = float(records["info"]["respawn_u"][t, e])
            for mode, twin in twins.items():
                twin.respawn_uniform = lambda: u  # noqa: B023
                obs, reward, terminated, truncated, info = twin.step(int(records["action"][t, e]))
                where = f"env {e} step {t} ({mode})"
                if np.float32(reward) != records["reward"][t, e]:
                    return f"{where}: reward {reward} vs {records['reward'][t, e]}"
                if not np.array_equal(info["phi"], records["info"]["phi"][t, e]):
                    return f"{where}: phi {info['phi']} vs {records['info']['phi'][t, e]}"
                if terminated or truncated != records["truncated"][t, e]:
                    return f"{where}: episode end differs"
                if truncated:  # the JAX env reset itself; reset the twin to the same new layout
                    obs, _ = twin.reset(options=layout_of(records["state"], e, t))
                else:
                    state = records["state"]
                    if tuple(twin.agent_pos) != tuple(state.agent_pos[t, e]) or twin.agent_dir != state.agent_dir[t, e]:
                        return f"{where}: agent pose {twin.agent_pos, twin.agent_dir} vs {state.agent_pos[t, e], state.agent_dir[t, e]}"
                if not np.array_equal(obs["image"], records["obs"][mode].image[t, e]):
                    return f"{where}: observation differs"
                if not np.array_equal(obs["w"], records["obs"][mode].w[t, e]):
                    return f"{where}: task input differs"
            pickups += int(records["info"]["phi"][t, e].sum())
    return None if pickups > 0 else "no pickups happened: the rollout does not test respawns"


@pytest.fixture(scope="module")
def rollout():
    # 20 envs x 500 steps = 10,000 steps; with the resets at steps 200 and 400 that is 60 layouts.
    return jax_rollout(num_envs=20, num_steps=500, seed=0)


def test_random_rollouts_match_minigrid_twin(rollout):
    obs0, state0, records = rollout
    num_steps, num_envs = records["action"].shape
    assert num_steps * num_envs >= 10_000
    layouts = num_envs * (1 + records["truncated"].sum(0).min())
    assert layouts >= 20
    pickups = records["info"]["phi"].sum()
    assert pickups >= 200, pickups
    assert (records["reward"] < 0).any() and (records["reward"] > 0).any()
    assert first_mismatch(obs0, state0, records) is None


@pytest.mark.parametrize("room", [dict(grid_size=6, objects_per_category=1, episode_steps=50),
                                  dict(grid_size=5, objects_per_category=1, episode_steps=30),
                                  dict(grid_size=8, objects_per_category=2, episode_steps=60)],
                         ids=["6-1-50", "5-1-30", "8-2-60"])
def test_a_smaller_room_matches_its_twin_too(room):
    """The same agreement in rooms of other sizes (the miniature BabyAI's among them): 12 envs x 150 steps, with
    resets at every episode end, pickups and respawns in rooms where few cells are free."""
    obs0, state0, records = jax_rollout(num_envs=12, num_steps=150, seed=1, **room)
    assert records["truncated"].sum() >= 12 and records["info"]["phi"].sum() >= 30
    assert state0.obj_pos.shape[1] == 4 * room["objects_per_category"]
    assert first_mismatch(obs0, state0, records, **room) is None


def poses_of(layout_obj_pos):
    """Every free cell x every direction, as a batch of states on one layout."""
    occupied = {tuple(p) for p in layout_obj_pos}
    poses = [
        (x, y, d) for y in range(1, 9) for x in range(1, 9) if (x, y) not in occupied for d in range(4)
    ]
    p = np.array(poses, np.int32)
    n = len(p)
    return EnvState(
        time=jnp.zeros(n, jnp.int32),
        agent_pos=jnp.asarray(p[:, :2]),
        agent_dir=jnp.asarray(p[:, 2]),
        obj_pos=jnp.broadcast_to(jnp.asarray(layout_obj_pos, jnp.int32), (n, 12, 2)),
        w=jnp.broadcast_to(jnp.asarray(TEST_TASKS[4]), (n, 4)),
    )


EDGE_LAYOUTS = [
    # objects in all four corners, along every wall, and two in the middle
    [(1, 1), (8, 1), (1, 8), (8, 8), (4, 1), (1, 5), (8, 4), (5, 8), (2, 2), (7, 7), (4, 4), (5, 5)],
    # a cluster in one corner (objects enclosing empty cells) and a row across the room
    [(1, 1), (2, 1), (1, 2), (3, 1), (1, 3), (2, 3), (3, 6), (4, 6), (5, 6), (6, 6), (7, 6), (8, 6)],
]


@pytest.mark.parametrize("view_size", [5, 7])
@pytest.mark.parametrize("layout", EDGE_LAYOUTS)
def test_walls_corners_and_view_edges(layout, view_size):
    """Every pose on hand-made layouts: walls and corners in view, objects at the view's edges, and a pickup."""
    states = poses_of(layout)
    n = states.agent_pos.shape[0]
    for mode in MODES:
        env = GotoAvoid(obs_mode=mode, view_size=view_size)
        params = make_params(TEST_TASKS[4])
        images = np.asarray(jax.vmap(env.observe)(states).image)
        stepped = jax.vmap(env.transition, (None, 0, None, None))(jax.random.PRNGKey(3), states, 3, params)
        after, rewards, info = jax.tree.map(np.asarray, stepped)
        twin = GotoAvoidMiniGrid(obs_mode=mode, view_size=view_size)
        twin.respawn_uniform = lambda: float(info["respawn_u"][0])
        for b in range(n):
            twin.reset(options={"layout": (states.agent_pos[b], states.agent_dir[b], np.array(layout)), "w": TEST_TASKS[4]})
            assert np.array_equal(twin.gen_obs()["image"], images[b]), (mode, b)
            _, reward, _, _, twin_info = twin.step(3)  # pickup, from every pose
            assert np.float32(reward) == rewards[b] and np.array_equal(twin_info["phi"], info["phi"][b])
            assert sorted(map(tuple, after.obj_pos[b])) == sorted(
                (int(o.cur_pos[0]), int(o.cur_pos[1])) for o in twin.grid.grid if o is not None and o.type != "wall"
            )
        assert (rewards != 0).sum() > 10  # pickups from many poses


class _TwinRespawnNextToAgent(GotoAvoidMiniGrid):
    min_respawn_distance = 1  # one ring of cells more than the rule allows


def test_comparison_catches_a_respawn_rule_change():
    obs0, state0, records = jax_rollout(num_envs=4, num_steps=300, seed=1)
    assert first_mismatch(obs0, state0, records) is None
    assert "differs" in str(first_mismatch(obs0, state0, records, twin_cls=_TwinRespawnNextToAgent))


def test_comparison_catches_an_occlusion_rule_change(monkeypatch):
    """Let the cell diagonally behind an opaque cell show (one cell of minigrid's rule) and the check fails."""
    original = babyai.visibility

    def peeking(transparent):
        mask = original(transparent)
        # also reveal the cell up-left of every visible opaque cell, which minigrid hides
        opaque_seen = mask & ~transparent
        reveal = jnp.zeros_like(mask).at[:-1, :-1].set(opaque_seen[1:, 1:])
        return mask | reveal

    monkeypatch.setattr(babyai, "visibility", peeking)
    obs0, state0, records = jax_rollout(num_envs=4, num_steps=300, seed=2)
    assert "differs" in str(first_mismatch(obs0, state0, records))
