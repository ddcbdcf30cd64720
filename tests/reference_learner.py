"""The learner as it was before FARM's step was fused (commit c004d88), kept as the reference that the fused step is
checked against (tests/test_fused_learner.py) and timed against (benchmarks/sgd_variants.py).

It is the paper's FARM step written layer by layer (every linear map applied on its own, the pixel projection and
the action/reward terms inside the step), the LSTM core's step as one Linear on [x; h], and an unroll that runs the
whole step inside one plain `lax.scan` (the weight gradients summed step by step in its backward loop). `patched`
swaps these into the cores: the old SGD step, with the script's own losses, targets and priorities.
"""

from __future__ import annotations

import contextlib
import math

import equinox as eqx
import jax
import jax.numpy as jnp

from common.farm import FARM, FarmCore, apply_per_module
from common.networks import LSTMCore


def farm_step(farm: FARM, image_map, vector, state):
    """FARM.__call__ as it was: image_map [H, W, C], vector [V], state (h, c) each [n, d] -> new state."""
    h, c = state
    n, d = farm.num_modules, farm.module_size
    q = jnp.concatenate([h, jnp.broadcast_to(vector, (n, vector.shape[-1]))], axis=-1)
    pixels = jax.vmap(farm.project)(image_map.reshape(-1, image_map.shape[-1]))
    gated = pixels[None] * jax.nn.sigmoid(apply_per_module(farm.gate, q))[:, None, :]
    z = jax.vmap(jax.vmap(farm.mix))(gated).reshape(n, -1)
    memory = jnp.concatenate([h, jnp.zeros((1, d))])
    heads = lambda x: x.reshape(x.shape[0], farm.num_heads, d)  # noqa: E731
    queries = heads(jax.vmap(farm.query)(q))
    keys, values = heads(jax.vmap(farm.key)(memory)), heads(jax.vmap(farm.value)(memory))
    weights = jax.nn.softmax(jnp.einsum("nhd,mhd->hnm", queries, keys) / math.sqrt(d), axis=-1)
    read = jnp.einsum("hnm,mhd->nhd", weights, values).reshape(n, -1)
    u = q + jax.nn.sigmoid(jax.vmap(farm.w_gate)(read) - farm.b_gate) * jnp.tanh(jax.vmap(farm.w_out)(read))
    return eqx.filter_vmap(lambda cell, x, hk, ck: cell(x, (hk, ck)))(farm.lstm, jnp.concatenate([u, z], -1), h, c)


def core_recur(core, image_map, vector, state):
    """FarmCore.recur / LSTMCore.recur as they were."""
    if isinstance(core, FarmCore):
        return farm_step(core.farm, image_map, vector, state)
    features = image_map.reshape(-1)
    if core.flat is not None:
        features = jax.nn.relu(core.flat(features))
    return core.lstm(jnp.concatenate([vector, features]), state)


def reset_where(first, state, initial):
    return jax.tree.map(lambda s, i: jnp.where(first, i, s), state, initial)


def core_unroll(core, maps, vectors, first, state):
    """The old unroll's loop: the whole step in one plain lax.scan."""
    def step(state, x):
        image_map, vector, first = x
        state = core_recur(core, image_map, vector, reset_where(first, state, core.initial_state()))
        return state, state

    return jax.lax.scan(step, state, (maps, vectors, first))[1]


@contextlib.contextmanager
def patched(script):
    """The script with its cores' unrolls and single steps (acting, final views) as they were."""
    saved = FarmCore.unroll, LSTMCore.unroll, FarmCore.recur, LSTMCore.recur
    FarmCore.unroll, LSTMCore.unroll, FarmCore.recur, LSTMCore.recur = core_unroll, core_unroll, core_recur, core_recur
    try:
        yield script
    finally:
        FarmCore.unroll, LSTMCore.unroll, FarmCore.recur, LSTMCore.recur = saved
