"""Host envs (procgen, NLE) and the jitted learner: in training they step from inside the jitted chunk through
io_callback (step_in_jit); at evaluation the network acts for all envs at once (jitted) and the envs step on the
host (play_first_episodes)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np


def play_first_episodes(env, act, obs_key: str, initial_state) -> np.ndarray:
    """Returns [n] of a host env's n envs, each played until its first episode ends (what comes after is not
    counted), then closes the env. act(obs, w, prev_action, prev_reward, first, state) -> (action, state) is the
    script's jitted greedy policy on all n envs; initial_state the recurrent core's initial state of one env."""
    obs = env.reset()
    n = len(obs["w"])
    state = jax.tree.map(lambda x: jnp.broadcast_to(x, (n,) + x.shape), initial_state)
    prev_action, prev_reward, first = np.zeros(n, np.int32), np.zeros(n, np.float32), np.ones(n, bool)
    returns, running = np.zeros(n, np.float32), np.ones(n, bool)
    while running.any():
        action, state = act(obs[obs_key], obs["w"], prev_action, prev_reward, first, state)
        obs, reward, terminated, truncated, _ = env.step(np.asarray(action))
        returns += np.where(running, reward, 0.0)
        done = terminated | truncated
        running &= ~done
        prev_action, prev_reward, first = np.where(done, 0, action), np.where(done, 0.0, reward), done
    env.close()
    return returns


def step_in_jit(envs: list, seed_index, action, view: tuple[str, tuple, type], last: tuple[str, tuple, type],
                task_dim: int):
    """Step one seed's host envs, envs[seed_index], from inside a jitted program (jax.experimental.io_callback):
    (obs[view key] [E, ...], w [E, C], reward [E], terminated [E], truncated [E], info[last key] [E, ...]); view and
    last give (key, shape per env, dtype). Under a vmap over seeds JAX runs the callback once per seed, in turn; the
    actions of step t+1 depend on step t's observations, so the calls of one seed stay in order."""
    from jax.experimental import io_callback

    def host(seed_index, action):
        obs, reward, terminated, truncated, info = envs[int(seed_index)].step(np.asarray(action))
        return obs[view[0]], obs["w"], reward, terminated, truncated, info[last[0]]

    e = action.shape[-1]
    shapes = (((e, *view[1]), view[2]), ((e, task_dim), np.float32), ((e,), np.float32), ((e,), np.bool_),
              ((e,), np.bool_), ((e, *last[1]), last[2]))
    return io_callback(host, tuple(jax.ShapeDtypeStruct(s, d) for s, d in shapes), seed_index, action)
