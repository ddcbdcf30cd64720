"""FARM (Carvalho et al., 2021) as the MSFA paper uses it: n state modules that each attend to the image feature map
and share information with each other through gated attention, each updated by its own LSTM.

Per step, module k with previous state (h^k, c^k) of size d:
1. query q_k = [h^k; onehot(a_prev); tanh(r_prev)];
2. feature attention: z_k = flatten(Mix(Project(X) * sigmoid(Gate_k(q_k)))), with Project and Mix 1x1 convolutions
   shared by the modules and Gate_k specific to module k;
3. inter-module attention: q_k attends over the keys/values of [h^1; ...; h^n; 0] (the zero row lets a module take
   "no information"), heads of size d, logits / sqrt(d); the read m_k enters through a sigmoid-tanh gate:
   u_k = q_k + sigmoid(W_g m_k - b_g) * tanh(W_o m_k);
4. (h^k, c^k) = LSTM_k([u_k; z_k], (h^k, c^k)), module-specific parameters.
Module-specific layers are stored stacked along a leading module axis and applied with `eqx.filter_vmap`.
"""

from __future__ import annotations

import math

import equinox as eqx
import jax
import jax.numpy as jnp

from common.networks import TORSOS, DQNTorso, ImpalaTorso, LSTMCell, linear


def apply_per_module(stacked, xs):
    """Apply a layer whose parameters are stacked on axis 0 to the matching rows of xs."""
    return eqx.filter_vmap(lambda layer, x: layer(x))(stacked, xs)


class FARM(eqx.Module):
    gate: eqx.nn.Linear  # per module: query -> feature gate (stacked)
    project: eqx.nn.Linear  # shared 1x1 conv: channels -> projection
    mix: eqx.nn.Linear  # shared 1x1 conv: projection -> projection
    query: eqx.nn.Linear
    key: eqx.nn.Linear
    value: eqx.nn.Linear
    w_gate: eqx.nn.Linear
    w_out: eqx.nn.Linear
    b_gate: jax.Array
    lstm: LSTMCell  # per module (stacked)
    num_modules: int = eqx.field(static=True)
    module_size: int = eqx.field(static=True)
    num_heads: int = eqx.field(static=True)

    def __init__(
        self,
        num_modules: int,
        module_size: int,
        num_heads: int,
        channels: int,
        num_pixels: int,
        vector_size: int,
        projection: int,
        key,
    ):
        """vector_size: the non-image input shared by all modules (here onehot(a_prev) and tanh(r_prev))."""
        k = jax.random.split(key, 9)
        query_size = module_size + vector_size
        attn_size = module_size * num_heads
        module_keys = lambda kk: jax.random.split(kk, num_modules)  # noqa: E731
        self.gate = eqx.filter_vmap(lambda kk: linear(query_size, projection, kk))(module_keys(k[0]))
        self.project = linear(channels, projection, k[1])
        self.mix = linear(projection, projection, k[2])
        self.query = linear(query_size, attn_size, k[3], scale=2.0)
        self.key = linear(module_size, attn_size, k[4], scale=2.0)
        self.value = linear(module_size, attn_size, k[5], scale=2.0)
        self.w_gate = linear(attn_size, query_size, k[6], use_bias=False, scale=0.2)
        self.w_out = linear(attn_size, query_size, k[7], use_bias=False, scale=0.2)
        self.b_gate = jnp.ones(query_size)
        lstm_in = query_size + num_pixels * projection
        self.lstm = eqx.filter_vmap(lambda kk: LSTMCell(lstm_in, module_size, kk))(module_keys(k[8]))
        self.num_modules, self.module_size, self.num_heads = num_modules, module_size, num_heads

    def initial_state(self):
        zeros = jnp.zeros((self.num_modules, self.module_size))
        return zeros, zeros

    def __call__(self, image_map, vector, state):
        """image_map [H, W, C], vector [V], state (h, c) each [n, d] -> new state; h^k_t is new_state[0][k]."""
        h, c = state
        n, d = self.num_modules, self.module_size
        q = jnp.concatenate([h, jnp.broadcast_to(vector, (n, vector.shape[-1]))], axis=-1)  # [n, d + V]

        # 2. feature attention
        pixels = jax.vmap(self.project)(image_map.reshape(-1, image_map.shape[-1]))  # [HW, P]
        gated = pixels[None] * jax.nn.sigmoid(apply_per_module(self.gate, q))[:, None, :]  # [n, HW, P]
        z = jax.vmap(jax.vmap(self.mix))(gated).reshape(n, -1)

        # 3. inter-module attention over [h; 0]
        memory = jnp.concatenate([h, jnp.zeros((1, d))])  # [n + 1, d]
        heads = lambda x: x.reshape(x.shape[0], self.num_heads, d)  # noqa: E731
        queries, keys, values = heads(jax.vmap(self.query)(q)), heads(jax.vmap(self.key)(memory)), heads(jax.vmap(self.value)(memory))
        weights = jax.nn.softmax(jnp.einsum("nhd,mhd->hnm", queries, keys) / math.sqrt(d), axis=-1)
        read = jnp.einsum("hnm,mhd->nhd", weights, values).reshape(n, -1)
        u = q + jax.nn.sigmoid(jax.vmap(self.w_gate)(read) - self.b_gate) * jnp.tanh(jax.vmap(self.w_out)(read))

        # 4. per-module LSTMs
        return eqx.filter_vmap(lambda cell, x, hk, ck: cell(x, (hk, ck)))(self.lstm, jnp.concatenate([u, z], -1), h, c)


class FarmCore(eqx.Module):
    """The MSFA/UVFA-FARM state: the torso's map (DQN 5x5x16 or Impala 8x8x32, not flattened) read by FARM
    modules."""

    torso: DQNTorso | ImpalaTorso
    farm: FARM
    num_actions: int = eqx.field(static=True)  # the size of the one-hot previous action it reads

    def __init__(self, num_actions: int, num_modules: int, module_size: int, num_heads: int, projection: int, key,
                 torso: str = "dqn"):
        k_torso, k_farm = jax.random.split(key)
        self.num_actions = num_actions
        torso_class, (height, width, channels) = TORSOS[torso]
        self.torso = torso_class(k_torso)
        self.farm = FARM(num_modules, module_size, num_heads, channels=channels, num_pixels=height * width,
                         vector_size=num_actions + 1, projection=projection, key=k_farm)

    def initial_state(self):
        return self.farm.initial_state()

    def recur(self, image_map, vector, state):
        """One step: (h, c) each [num_modules, module_size]."""
        return self.farm(image_map, vector, state)
