"""FARM, Feature-Attending Recurrent Modules (Carvalho et al., 2021), as the MSFA paper uses it: n state modules that
each attend to the image feature map with their own gate, share information through gated attention over each
other's states, and are each updated by their own LSTM.

This file is the definition: `FARM` holds the four parts of one step as four methods, in the paper's order, and
`FARM.step` composes them. To try another part (say, another inter-module attention), copy this file next to your
script, edit that one method and import your copy's `FarmCore`: the copy trains with the `plain` backend below.

Per step t, module k with previous state (h^k, c^k) of size d, the torso's map X_t and v_t = [onehot(a_{t-1});
tanh(r_{t-1})]:
  1. query                    q_k = [h^k; v_t]
  2. feature attention        z_k = flatten(Mix(Project(X_t) * sigmoid(Gate_k(q_k))))
  3. inter-module attention   m_k = the heads' attention of q_k over [h^1; ...; h^n; 0]
                              u_k = q_k + sigmoid(W_g m_k - b_g) * tanh(W_o m_k)
  4. module LSTMs             (h^k, c^k) = LSTM_k([u_k; z_k], (h^k, c^k))
Gate_k and LSTM_k belong to module k (stacked along a leading module axis); Project, Mix and the attention's maps are
shared by the modules (the original: modules/farm.py, modules/relational.py; docs/msfa.md).

How the recurrence is computed (`FarmCore`'s backend; the same function every way, tests/test_farm_fast.py):
- `plain`: `FARM.step` in a lax.scan, this file as it reads;
- `fused`: common/farm_fast.py, the same step arranged for speed: what does not read the states is computed for
  a whole sequence before the loop, the linear maps of h are packed into one matmul, and the backward pass emits the
  per-step cotangents and forms the big weights' gradients as one contraction after the loop;
- `pallas`, `pallas-bf16`: common/farm_pallas.py, that arrangement as fused GPU kernels (bf16: the LSTMs' weight in
  bfloat16, not exact).
The default is the fastest measured on the device kind (`FASTEST_MEASURED`), for this file's FARM; a FARM whose
source differs from this file's (an edited copy) runs `plain`, since the fast forms compute this file's function.
"""

from __future__ import annotations

import inspect
import math

import equinox as eqx
import jax
import jax.numpy as jnp

from common import farm_fast, farm_pallas
from common.networks import TORSOS, DQNTorso, ImpalaTorso, LSTMCell, linear, prev_action_reward
from common.run.errors import ConfigError


def apply_per_module(stacked, xs):
    """Apply a layer whose parameters are stacked on axis 0 to the matching rows of xs."""
    return eqx.filter_vmap(lambda layer, x: layer(x))(stacked, xs)


class FARM(eqx.Module):
    gate: eqx.nn.Linear  # 2. Gate_k: q_k -> P, module k's own (stacked over modules)
    project: eqx.nn.Linear  # 2. Project: a 1x1 convolution of the map, channels -> P (shared)
    mix: eqx.nn.Linear  # 2. Mix: a 1x1 convolution P -> P (shared)
    query: eqx.nn.Linear  # 3. q_k -> the heads' queries (shared)
    key: eqx.nn.Linear  # 3. a memory row -> the heads' keys (shared)
    value: eqx.nn.Linear  # 3. a memory row -> the heads' values (shared)
    w_gate: eqx.nn.Linear  # 3. W_g: the read -> the gate (no bias)
    w_out: eqx.nn.Linear  # 3. W_o: the read -> what the gate lets through (no bias)
    b_gate: jax.Array  # 3. b_g, the gate's bias (starts at 1: the gate starts mostly closed)
    lstm: LSTMCell  # 4. LSTM_k, module k's own (stacked over modules)
    num_modules: int = eqx.field(static=True)
    module_size: int = eqx.field(static=True)
    num_heads: int = eqx.field(static=True)

    def __init__(self, num_modules: int, module_size: int, num_heads: int, channels: int, num_pixels: int,
                 vector_size: int, projection: int, key):
        """channels, num_pixels: the torso map's; vector_size: the size of v_t (here onehot(a_prev) and
        tanh(r_prev)); projection: P. Initialisers as the original's (haiku; the attention's VarianceScaling)."""
        k = jax.random.split(key, 9)
        query_size = module_size + vector_size
        attention_size = module_size * num_heads  # each head's keys, values and queries have d entries
        per_module = lambda make, kk: eqx.filter_vmap(make)(jax.random.split(kk, num_modules))  # noqa: E731
        self.gate = per_module(lambda kk: linear(query_size, projection, kk), k[0])
        self.project = linear(channels, projection, k[1])
        self.mix = linear(projection, projection, k[2])
        self.query = linear(query_size, attention_size, k[3], scale=2.0)
        self.key = linear(module_size, attention_size, k[4], scale=2.0)
        self.value = linear(module_size, attention_size, k[5], scale=2.0)
        self.w_gate = linear(attention_size, query_size, k[6], use_bias=False, scale=0.2)
        self.w_out = linear(attention_size, query_size, k[7], use_bias=False, scale=0.2)
        self.b_gate = jnp.ones(query_size)
        self.lstm = per_module(lambda kk: LSTMCell(query_size + num_pixels * projection, module_size, kk), k[8])
        self.num_modules, self.module_size, self.num_heads = num_modules, module_size, num_heads

    def initial_state(self):
        """(h, c), each [n, d]: zeros at every episode start."""
        zeros = jnp.zeros((self.num_modules, self.module_size))
        return zeros, zeros

    def module_query(self, h_k, vector):
        """1. Module k's query q_k = [h^k_{t-1}; onehot(a_{t-1}); tanh(r_{t-1})]: what it looks for in the image and
        in the other modules."""
        return jnp.concatenate([h_k, vector])

    def feature_attention(self, gate_k: eqx.nn.Linear, q_k, image_map):
        """2. Module k reads the image map through its own gate over the projected channels:
            z_k = flatten(Mix(Project(X_t) * sigmoid(Gate_k(q_k))))
        gate_k: module k's Gate_k; q_k [d + V]; image_map X_t [H, W, C] -> z_k [H W P]."""
        projected = jax.vmap(self.project)(image_map.reshape(-1, image_map.shape[-1]))  # [H W, P]
        attended = projected * jax.nn.sigmoid(gate_k(q_k))  # the same gate on every pixel
        return jax.vmap(self.mix)(attended).reshape(-1)

    def inter_module_attention(self, q, h):
        """3. Each module's query attends over the memory M = [h^1; ...; h^n; 0] (the zero row lets a module take
        "no information"), heads of size d, and what it reads enters through a sigmoid-tanh gate:
            m_k = concat over heads i of sum_j softmax_j(Q_i(q_k) . K_i(M_j) / sqrt(d)) V_i(M_j)
            u_k = q_k + sigmoid(W_g m_k - b_g) * tanh(W_o m_k)
        q [n, d + V] (every module's query), h [n, d] -> u [n, d + V]."""
        n, d, heads = self.num_modules, self.module_size, self.num_heads
        memory = jnp.concatenate([h, jnp.zeros((1, d))])  # [n + 1, d]
        by_head = lambda x: x.reshape(x.shape[0], heads, d)  # noqa: E731
        queries = by_head(jax.vmap(self.query)(q))  # [n, heads, d]
        keys, values = by_head(jax.vmap(self.key)(memory)), by_head(jax.vmap(self.value)(memory))  # [n + 1, ...]
        attention = jax.nn.softmax(jnp.einsum("kid,jid->kij", queries, keys) / math.sqrt(d), axis=-1)
        m = jnp.einsum("kij,jid->kid", attention, values).reshape(n, heads * d)
        return q + jax.nn.sigmoid(jax.vmap(self.w_gate)(m) - self.b_gate) * jnp.tanh(jax.vmap(self.w_out)(m))

    @staticmethod
    def module_lstm(lstm_k: LSTMCell, u_k, z_k, state_k):
        """4. Module k's own LSTM on what it read: (h^k_t, c^k_t) = LSTM_k([u_k; z_k], (h^k_{t-1}, c^k_{t-1}))."""
        return lstm_k(jnp.concatenate([u_k, z_k]), state_k)

    def step(self, image_map, vector, state):
        """One step of every module: image_map X_t [H, W, C], vector v_t [V], state (h, c) each [n, d] -> the new
        (h, c); module k's state h^k_t is new_state[0][k]."""
        h, c = state
        q = jax.vmap(self.module_query, (0, None))(h, vector)  # 1.
        z = eqx.filter_vmap(self.feature_attention, in_axes=(0, 0, None))(self.gate, q, image_map)  # 2.
        u = self.inter_module_attention(q, h)  # 3.
        return eqx.filter_vmap(self.module_lstm)(self.lstm, u, z, (h, c))  # 4.

    def __call__(self, image_map, vector, state):
        return self.step(image_map, vector, state)


FARM_SOURCE = inspect.getsource(FARM)
"""the definition's source, read at import: what `is_this_farm` compares a FARM class with"""


# ---------------------------------------------------------------------------------------------------------------------
# The recurrent core the scripts use: torso -> FARM, with the recurrence computed by one of the backends
# ---------------------------------------------------------------------------------------------------------------------
BACKENDS = ("plain", "fused", "pallas", "pallas-bf16")
"""How FarmCore computes FARM's recurrence (the module's docstring): `plain`, FARM.step in a lax.scan; `fused`,
common/farm_fast.py; `pallas`, its arrangement as GPU kernels (Pallas' interpreter on a CPU: slow, for tests);
`pallas-bf16`, those with the LSTMs' weight in bfloat16 (not exact, ~1e-3)."""

FASTEST_MEASURED = {"cpu": "fused"}
"""--core-backend's default per device kind (jax.devices()[0].device_kind, or the platform): the fastest measured
there by benchmarks/sgd_variants.py, which prints the line to add; devices not listed get `fused` (measured on
NVIDIA H100 and H200 against the layer-by-layer step, docs/learner_speed.md; the kernels are not measured on a GPU)."""


def default_backend() -> str:
    device = jax.devices()[0]
    return FASTEST_MEASURED.get(device.device_kind, FASTEST_MEASURED.get(device.platform, "fused"))


def is_this_farm(farm_class) -> bool:
    """Whether farm_class is common/farm.py's FARM, read from its source: the fast backends compute that FARM only,
    so a class edited in a copy of this file (or a subclass) differs, while an unedited copy is the same."""
    from common import farm as definition  # the repository's file, also when this runs in a copy of it

    try:
        return inspect.getsource(farm_class) == definition.FARM_SOURCE
    except (OSError, TypeError):  # no source to read (a class made at run time): not known to be that FARM
        return False


class FarmCore(eqx.Module):
    """The MSFA/UVFA-FARM state: the torso's map (DQN 5x5x16 or Impala 8x8x32, not flattened) read by FARM
    modules. `backend` (static: not a parameter, so checkpoints are the same for every backend) says how the
    recurrence is computed (BACKENDS); None picks the default for this device and this FARM."""

    torso: DQNTorso | ImpalaTorso
    farm: FARM
    num_actions: int = eqx.field(static=True)  # the size of the one-hot previous action it reads
    backend: str = eqx.field(static=True, default="fused")
    reward_input: bool = eqx.field(static=True, default=True)  # whether it reads the previous reward

    def __init__(self, num_actions: int, num_modules: int, module_size: int, num_heads: int, projection: int, key,
                 torso: str = "dqn", backend: str | None = None, torso_channels: tuple[int, ...] | None = None,
                 reward_input: bool = True):
        """torso_channels: the torso's widths (None: its default, the original's). reward_input: the previous
        reward is part of the input vector (common.networks.prev_action_reward) that FARM's queries and LSTMs read;
        False: --reward-input off."""
        k_torso, k_farm = jax.random.split(key)
        torso_class, (height, width, channels) = TORSOS[torso]
        self.torso = torso_class(k_torso) if torso_channels is None else torso_class(k_torso, channels=torso_channels)
        self.farm = FARM(num_modules, module_size, num_heads, channels=channels, num_pixels=height * width,
                         vector_size=num_actions + 1, projection=projection, key=k_farm)
        self.num_actions, self.backend = num_actions, FarmCore.backend_to_run(backend)
        self.reward_input = reward_input

    @staticmethod
    def backend_to_run(backend: str | None) -> str:
        """The backend a FarmCore built with `backend` runs: that one (checked), or with None the default for this
        device kind and this file's FARM (the scripts' check_args calls it, so a bad choice stops before a run)."""
        if backend is not None and backend not in BACKENDS:
            raise ConfigError(f"--core-backend must be one of {', '.join(BACKENDS)}, got {backend!r}")
        this_farm = is_this_farm(FARM)
        if backend is None:
            return default_backend() if this_farm else "plain"
        if backend != "plain" and not this_farm:
            raise ConfigError(f"--core-backend {backend} computes common/farm.py's FARM, and this FARM "
                              f"({FARM.__module__}) differs from it: use --core-backend plain")
        return backend

    def initial_state(self):
        return self.farm.initial_state()

    def input_vector(self, prev_action, prev_reward):
        """[onehot(a_{t-1}); tanh(r_{t-1})], what FARM's queries and LSTMs read besides the map (the reward's entry
        0 without reward_input)."""
        return prev_action_reward(prev_action, prev_reward, self.num_actions, self.reward_input)

    def unroll(self, maps, vectors, first, state):
        """The states (h, c) [T, n, d] along a sequence: the torso's maps [T, H, W, C], the [a_prev; r_prev]
        vectors [T, V], first [T] (reset to the initial state before these steps) and the state before the first."""
        if self.backend == "fused":
            return farm_fast.unroll_sequence(self.farm, maps, vectors, first, state)
        if self.backend != "plain":
            inputs = farm_fast.inputs(self.farm, maps, vectors)
            return farm_pallas.unroll_sequence(self.farm, inputs, first, state, farm_pallas.config_for(self.backend))
        initial = self.initial_state()

        def step(state, x):
            image_map, vector, first = x
            state = jax.tree.map(lambda s, i: jnp.where(first, i, s), state, initial)
            state = self.farm.step(image_map, vector, state)
            return state, state

        return jax.lax.scan(step, state, (maps, vectors, first))[1]

    def recur(self, image_map, vector, state):
        """One step (acting, evaluation): (h, c) each [num_modules, module_size]."""
        if self.backend == "plain":
            return self.farm.step(image_map, vector, state)
        if self.backend == "fused":
            return farm_fast.recur(self.farm, image_map, vector, state)
        out = self.unroll(image_map[None], vector[None], jnp.zeros((1,), bool), state)
        return jax.tree.map(lambda x: x[0], out)
