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
Module-specific layers are stored stacked along a leading module axis.

How a step is computed (the same function, arranged for speed). A learner unrolls FARM over 41 steps of a sequence,
and on a GPU each step is a chain of small dependent kernels whose launch latency, not arithmetic, sets the time.
So the step is split in two:
- `inputs`: everything that does not read the module states (Project(X); the previous action and reward's share of
  the queries and of the module gates), computed for a whole sequence at once, outside the recurrence;
- `step`: what does read them, with every linear map of h (queries, keys, values, the n module gates) in one matmul,
  W_g and W_o in one matmul, the attention over n + 1 rows as element-wise products and sums, and the n LSTMs as one
  batched matmul.
The parameters are the layers above, unchanged (checkpoints written before this arrangement load as they are);
`weights` gathers their fused views once per unroll. `FARM.__call__` (one step, for acting) runs the same two parts.

`FarmCore.unroll` runs `step` in a lax.scan (the `xla` backend, the definition) or, with `backend="pallas"`, the same
function as fused GPU kernels, three per step each way (common/farm_pallas.py); tests hold the two equal.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import equinox as eqx
import jax
import jax.numpy as jnp

from common import farm_pallas
from common.networks import TORSOS, DQNTorso, ImpalaTorso, LSTMCell, linear


def apply_per_module(stacked, xs):
    """Apply a layer whose parameters are stacked on axis 0 to the matching rows of xs."""
    return eqx.filter_vmap(lambda layer, x: layer(x))(stacked, xs)


class FarmInputs(NamedTuple):
    """The part of a FARM step that does not depend on the module states (each field may carry leading axes, e.g.
    the steps of a sequence)."""
    pixels: jax.Array  # [HW, P]: Project(X), the image map's pixels projected
    query: jax.Array  # [H d]: the query's bias and the share of [onehot(a_prev); tanh(r_prev)]
    gate: jax.Array  # [n, P]: each module's gate bias and share of the same vector
    vector: jax.Array  # [V]: [onehot(a_prev); tanh(r_prev)], the query's tail


class FarmWeights(NamedTuple):
    """Fused views of the parameters that the recurrence reads, built once per unroll."""
    state: jax.Array  # [d, 3 H d + n P]: h -> (query, key, value, every module's gate), one matmul
    read: jax.Array  # [H d, 2 Q]: the attention read -> (W_g m, W_o m), one matmul


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

    def inputs(self, image_map, vector) -> FarmInputs:
        """The state-independent part of a step: image_map [..., H, W, C] and vector [..., V], with any leading
        axes (a whole sequence at once)."""
        d = self.module_size
        pixels = image_map.reshape(image_map.shape[:-3] + (-1, image_map.shape[-1])) @ self.project.weight.T
        query = vector @ self.query.weight[:, d:].T + self.query.bias
        gate = jnp.einsum("...v,npv->...np", vector, self.gate.weight[:, :, d:]) + self.gate.bias
        return FarmInputs(pixels + self.project.bias, query, gate, vector)

    def weights(self) -> FarmWeights:
        d = self.module_size
        state = jnp.concatenate([self.query.weight[:, :d], self.key.weight, self.value.weight,
                                 self.gate.weight[:, :, :d].reshape(-1, d)]).T
        return FarmWeights(state, jnp.concatenate([self.w_gate.weight, self.w_out.weight]).T)

    def step(self, weights: FarmWeights, inputs: FarmInputs, state):
        """One step from the module states (h, c) [n, d] and one step's inputs (2-4 above); returns the new state."""
        h, c = state
        n, d, heads = self.num_modules, self.module_size, self.num_heads
        a = heads * d
        y = h @ weights.state  # [n, 3a + nP]: every linear map of h
        projection = inputs.pixels.shape[-1]
        own_gate = jnp.diagonal(y[:, 3 * a:].reshape(n, n, projection), axis1=0, axis2=1).T  # module k's gate of h^k

        # 2. feature attention: each module gates the projected pixels with its own gate, then Mix
        gated = inputs.pixels[None] * jax.nn.sigmoid(own_gate + inputs.gate)[:, None, :]  # [n, HW, P]
        z = (gated @ self.mix.weight.T + self.mix.bias).reshape(n, -1)

        # 3. inter-module attention over [h; 0]: logits [n, n + 1, heads], softmax over the memory rows
        queries = (y[:, :a] + inputs.query).reshape(n, heads, d)
        keys = jnp.concatenate([y[:, a:2 * a] + self.key.bias, self.key.bias[None]]).reshape(n + 1, heads, d)
        values = jnp.concatenate([y[:, 2 * a:3 * a] + self.value.bias, self.value.bias[None]]).reshape(n + 1, heads, d)
        logits = jnp.sum(queries[:, None] * keys[None], axis=-1) / math.sqrt(d)
        read = jnp.sum(jax.nn.softmax(logits, axis=1)[..., None] * values[None], axis=1).reshape(n, a)
        gate_out = read @ weights.read
        q = jnp.concatenate([h, jnp.broadcast_to(inputs.vector, (n, inputs.vector.shape[-1]))], axis=-1)
        u = q + jax.nn.sigmoid(gate_out[:, :q.shape[1]] - self.b_gate) * jnp.tanh(gate_out[:, q.shape[1]:])

        # 4. per-module LSTMs (haiku's: gates i, g, f, o; forget bias +1)
        lstm_input = jnp.concatenate([u, z, h], axis=-1)
        gates = jnp.einsum("noi,ni->no", self.lstm.linear.weight, lstm_input) + self.lstm.linear.bias
        i, g, f, o = jnp.split(gates, 4, axis=-1)
        c = jax.nn.sigmoid(f + 1.0) * c + jax.nn.sigmoid(i) * jnp.tanh(g)
        return jax.nn.sigmoid(o) * jnp.tanh(c), c

    def __call__(self, image_map, vector, state):
        """image_map [H, W, C], vector [V], state (h, c) each [n, d] -> new state; h^k_t is new_state[0][k]."""
        return self.step(self.weights(), self.inputs(image_map, vector), state)


BACKENDS = ("xla", "pallas", "pallas-bf16")
"""How FarmCore computes FARM's recurrence: `xla`, the step above in a lax.scan; `pallas`, the same function as
fused GPU kernels (common/farm_pallas.py; Pallas' interpreter on a CPU: slow, for tests); `pallas-bf16`, the kernels
with the LSTMs' weight in bfloat16 (float32 state and accumulation; not exact, ~1e-3)."""

FASTEST_MEASURED = {"cpu": "xla"}
"""--core-backend's default per device kind (jax.devices()[0].device_kind, or the platform): the fastest measured
there by benchmarks/sgd_variants.py, which prints the line to add. The kernels have not been measured on a GPU yet,
so every other device gets xla until they are."""


def default_backend() -> str:
    device = jax.devices()[0]
    return FASTEST_MEASURED.get(device.device_kind, FASTEST_MEASURED.get(device.platform, "xla"))


class FarmCore(eqx.Module):
    """The MSFA/UVFA-FARM state: the torso's map (DQN 5x5x16 or Impala 8x8x32, not flattened) read by FARM
    modules. `backend` (static: not a parameter, so checkpoints are the same for every backend) says how the
    recurrence is computed (BACKENDS)."""

    torso: DQNTorso | ImpalaTorso
    farm: FARM
    num_actions: int = eqx.field(static=True)  # the size of the one-hot previous action it reads
    backend: str = eqx.field(static=True, default="xla")

    def __init__(self, num_actions: int, num_modules: int, module_size: int, num_heads: int, projection: int, key,
                 torso: str = "dqn", backend: str = "xla"):
        if backend not in BACKENDS:
            raise ValueError(f"unknown FARM backend {backend!r}; choose from {', '.join(BACKENDS)}")
        k_torso, k_farm = jax.random.split(key)
        self.num_actions, self.backend = num_actions, backend
        torso_class, (height, width, channels) = TORSOS[torso]
        self.torso = torso_class(k_torso)
        self.farm = FARM(num_modules, module_size, num_heads, channels=channels, num_pixels=height * width,
                         vector_size=num_actions + 1, projection=projection, key=k_farm)

    def initial_state(self):
        return self.farm.initial_state()

    def unroll(self, maps, vectors, first, state):
        """The states (h, c) [T, n, d] along a sequence: the torso's maps [T, H, W, C], the [a_prev; r_prev]
        vectors [T, V], first [T] (reset to the initial state before these steps) and the state before the first.
        FARM's state-independent part runs for all steps at once, outside the loop."""
        inputs = self.farm.inputs(maps, vectors)
        if self.backend != "xla":  # the same function as fused kernels (a vmap over sequences becomes their rows)
            return farm_pallas.unroll_sequence(self.farm, inputs, first, state, farm_pallas.config_for(self.backend))
        weights, initial = self.farm.weights(), self.initial_state()

        def step(state, x):
            inputs, first = x
            state = jax.tree.map(lambda s, i: jnp.where(first, i, s), state, initial)
            state = self.farm.step(weights, inputs, state)
            return state, state

        return jax.lax.scan(step, state, (inputs, first))[1]

    def recur(self, image_map, vector, state):
        """One step (acting, evaluation): (h, c) each [num_modules, module_size]."""
        if self.backend != "xla":
            out = self.unroll(image_map[None], vector[None], jnp.zeros((1,), bool), state)
            return jax.tree.map(lambda x: x[0], out)
        return self.farm(image_map, vector, state)
