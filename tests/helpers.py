"""Test data shared by the learner tests."""

import jax
import jax.numpy as jnp

from common import r2d2


def random_sequence(key, length: int, state, episode_end=None) -> r2d2.Sequence:
    """A random replay sequence of `length` steps from recurrent `state`, task w = [1, -1, 0.5, 0] and no env
    cumulants; if episode_end = e, step e + 1 starts a new episode."""
    k = jax.random.split(key, 5)
    first = jnp.zeros(length, bool)
    if episode_end is not None:
        first = first.at[episode_end + 1].set(True)
    steps = r2d2.Step(
        obs=jax.random.randint(k[0], (length, 5, 5, 3), 0, 7).astype(jnp.uint8),
        w=jnp.broadcast_to(jnp.array([1.0, -1, 0.5, 0]), (length, 4)),
        prev_action=jax.random.randint(k[1], (length,), 0, 4),
        prev_reward=jax.random.normal(k[2], (length,)),
        first=first,
        action=jax.random.randint(k[3], (length,), 0, 4),
        reward=jax.random.normal(k[4], (length,)),
        phi=jnp.zeros((length, 4)),
    )
    return r2d2.Sequence(steps=steps, state=state)
