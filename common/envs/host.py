"""Host envs (procgen, NLE) at evaluation: the network acts for all envs at once (jitted), the envs step on the host.
(In training they step from inside the jitted chunk through io_callback: each script's env_step.)"""

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
