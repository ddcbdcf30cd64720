"""Building blocks shared by the learners: haiku-style initialisers, an LSTM cell, the DQN torso, MLPs.

The original code is haiku: Linear and Conv weights ~ truncated normal with stddev 1/sqrt(fan_in), zero biases,
LSTM gates (i, g, f, o) from one Linear on [x; h] with the forget gate biased by +1. Equinox's defaults differ
(uniform init, no forget bias), so these helpers set them explicitly.
"""

from __future__ import annotations

import math

import equinox as eqx
import jax
import jax.numpy as jnp


def _truncated_normal(key, shape, stddev):
    return stddev * jax.random.truncated_normal(key, -2.0, 2.0, shape)


def linear(in_size: int, out_size: int, key, use_bias: bool = True, scale: float | None = None) -> eqx.nn.Linear:
    """haiku Linear: weight ~ TruncatedNormal(1/sqrt(fan_in)), or VarianceScaling(scale) if given; bias 0."""
    layer = eqx.nn.Linear(in_size, out_size, use_bias=use_bias, key=key)
    if scale is None:
        stddev = 1.0 / math.sqrt(in_size)
    else:  # haiku VarianceScaling(scale, "fan_in", "truncated_normal")
        stddev = math.sqrt(scale / in_size) / 0.87962566103423978
    layer = eqx.tree_at(lambda l: l.weight, layer, _truncated_normal(key, (out_size, in_size), stddev))
    if use_bias:
        layer = eqx.tree_at(lambda l: l.bias, layer, jnp.zeros(out_size))
    return layer


class Conv2d(eqx.Module):
    """haiku's Conv2D with SAME padding on an [H, W, C] image, computed as patches @ weight.

    XLA:CPU runs native convolutions inside loops (a `lax.scan` of SGD steps) an order of magnitude slower than
    outside them; slices and one matmul run at full speed everywhere (benchmarks/learner.py measures it). When the
    kernel is a multiple of the stride (the DQN torso's 8x8/4 and 4x4/2), the padded image is first folded
    space-to-depth into stride x stride blocks, which turns the strided k x k convolution into a stride-1
    (k/stride) x (k/stride) one: 4 patches instead of 64 for the first layer, about 7x faster here, the same
    weights (their rows reordered on the fly) and the same result up to float rounding.
    """

    weight: jax.Array  # [kernel * kernel * in_ch, out_ch], rows ordered (dy, dx, in_ch)
    bias: jax.Array
    kernel: int = eqx.field(static=True)
    stride: int = eqx.field(static=True)

    def __init__(self, in_ch: int, out_ch: int, kernel: int, stride: int, key):
        fan_in = in_ch * kernel * kernel
        self.weight = _truncated_normal(key, (fan_in, out_ch), 1.0 / math.sqrt(fan_in))
        self.bias = jnp.zeros(out_ch)
        self.kernel, self.stride = kernel, stride

    def __call__(self, x):
        k, s = self.kernel, self.stride
        h, w, channels = x.shape
        out_h, out_w = -(-h // s), -(-w // s)
        pad_h, pad_w = max((out_h - 1) * s + k - h, 0), max((out_w - 1) * s + k - w, 0)
        x = jnp.pad(x, ((pad_h // 2, pad_h - pad_h // 2), (pad_w // 2, pad_w - pad_w // 2), (0, 0)))
        weight = self.weight
        if s > 1 and k % s == 0:  # space-to-depth: a stride-1 convolution with an (k/s) x (k/s) kernel
            m, hp, wp = k // s, x.shape[0] // s, x.shape[1] // s
            x = x.reshape(hp, s, wp, s, channels).transpose(0, 2, 1, 3, 4).reshape(hp, wp, s * s * channels)
            # rows (dy, dx, c) with dy = by * s + iy, dx = bx * s + ix, reordered to (by, bx, iy, ix, c)
            weight = weight.reshape(m, s, m, s, channels, -1).transpose(0, 2, 1, 3, 4, 5).reshape(weight.shape)
            k, s = m, 1
        patches = jnp.stack(
            [x[dy : dy + s * (out_h - 1) + 1 : s, dx : dx + s * (out_w - 1) + 1 : s] for dy in range(k) for dx in range(k)],
            axis=2,
        )  # [out_h, out_w, k * k, C]
        return patches.reshape(out_h, out_w, -1) @ weight + self.bias


class MLP(eqx.Module):
    """Linear layers with ReLU between them (none after the last)."""

    layers: tuple[eqx.nn.Linear, ...]

    def __init__(self, sizes: tuple[int, ...], key):
        keys = jax.random.split(key, len(sizes) - 1)
        self.layers = tuple(linear(a, b, k) for a, b, k in zip(sizes[:-1], sizes[1:], keys))

    def __call__(self, x):
        for layer in self.layers[:-1]:
            x = jax.nn.relu(layer(x))
        return self.layers[-1](x)


class LSTMCell(eqx.Module):
    """haiku's LSTM: gates (i, g, f, o) = Linear([x; h]); c' = sigmoid(f + 1) c + sigmoid(i) tanh(g)."""

    linear: eqx.nn.Linear
    hidden_size: int = eqx.field(static=True)

    def __init__(self, input_size: int, hidden_size: int, key):
        self.linear = linear(input_size + hidden_size, 4 * hidden_size, key)
        self.hidden_size = hidden_size

    def __call__(self, x, state):
        h, c = state
        i, g, f, o = jnp.split(self.linear(jnp.concatenate([x, h])), 4)
        c = jax.nn.sigmoid(f + 1.0) * c + jax.nn.sigmoid(i) * jnp.tanh(g)
        h = jax.nn.sigmoid(o) * jnp.tanh(c)
        return h, c


TORSO_MAP_SHAPE = (5, 5, 16)
"""the DQN torso's output on the 40x40 RGB view: one 16-channel cell per visible grid tile"""


DQN_CHANNELS = (32, 64, 64)
"""the DQN torso's channels before its last 1x1 convolution (the original's)"""


class DQNTorso(eqx.Module):
    """The original's "atari" torso: conv 32x8x8/4, 64x4x4/2, 64x3x3/1 (ReLU), 16x1x1; on 40x40 RGB it keeps one
    5x5 cell per grid tile. Input uint8 [H, W, 3]; output float [H/8, W/8, 16]. `channels` sets the first three
    convolutions' widths (a smaller torso; the map it gives is the same shape)."""

    convs: tuple[Conv2d, ...]

    def __init__(self, key, channels: tuple[int, int, int] = DQN_CHANNELS):
        k = jax.random.split(key, 4)
        a, b, c = channels
        self.convs = (Conv2d(3, a, 8, 4, k[0]), Conv2d(a, b, 4, 2, k[1]), Conv2d(b, c, 3, 1, k[2]),
                      Conv2d(c, TORSO_MAP_SHAPE[-1], 1, 1, k[3]))

    def __call__(self, image):
        x = image.astype(jnp.float32) / 255.0
        for layer in self.convs[:-1]:
            x = jax.nn.relu(layer(x))
        return self.convs[-1](x)


IMPALA_MAP_SHAPE = (8, 8, 32)
"""the Impala torso's output on a 64x64 RGB frame (Fruitbot, MiniHack)"""


def max_pool(x, window: int = 3, stride: int = 2):
    """haiku max_pool with SAME padding on [H, W, C]."""
    return jax.lax.reduce_window(x, -jnp.inf, jax.lax.max, (window, window, 1), (stride, stride, 1), "SAME")


class ResidualBlock(eqx.Module):
    """x + conv(relu(conv(relu(x)))), 3x3 convolutions keeping the channels."""

    convs: tuple[Conv2d, Conv2d]

    def __init__(self, channels: int, key):
        k = jax.random.split(key)
        self.convs = (Conv2d(channels, channels, 3, 1, k[0]), Conv2d(channels, channels, 3, 1, k[1]))

    def __call__(self, x):
        return x + self.convs[1](jax.nn.relu(self.convs[0](jax.nn.relu(x))))


class ImpalaTorso(eqx.Module):
    """The original's Impala torso (Fruitbot, MiniHack): 3 stages of (conv 3x3, max-pool 3x3/2, 2 residual blocks)
    with 16, 32, 32 channels, then ReLU. Input uint8 [64, 64, 3]; output float [8, 8, 32]."""

    stages: tuple[tuple[Conv2d, ResidualBlock, ResidualBlock], ...]

    def __init__(self, key, channels: tuple[int, ...] = (16, 32, 32)):
        keys = jax.random.split(key, 3 * len(channels))
        stages, in_ch = [], 3
        for i, out_ch in enumerate(channels):
            stages.append((Conv2d(in_ch, out_ch, 3, 1, keys[3 * i]), ResidualBlock(out_ch, keys[3 * i + 1]),
                           ResidualBlock(out_ch, keys[3 * i + 2])))
            in_ch = out_ch
        self.stages = tuple(stages)

    def __call__(self, image):
        x = image.astype(jnp.float32) / 255.0
        for conv, *blocks in self.stages:
            x = max_pool(conv(x))
            for block in blocks:
                x = block(x)
        return jax.nn.relu(x)


TORSOS = {"dqn": (DQNTorso, TORSO_MAP_SHAPE), "impala": (ImpalaTorso, IMPALA_MAP_SHAPE)}
"""torso name -> (class, output map shape)"""


def prev_action_reward(prev_action, prev_reward, num_actions: int, reward_input: bool = True):
    """[onehot(a_{t-1}); tanh(r_{t-1})]: what every recurrent core sees besides the image (the paper's and the
    authors' agents). With reward_input False (--reward-input off) the reward's entry is 0: the core, and the
    learned cumulants phi(h_{t+1}, h_t) read from it, cannot see the reward (docs/cumulants.md). The entry stays,
    so the networks' shapes are the same either way; its weights then get no gradient and never change."""
    reward = jnp.tanh(prev_reward) if reward_input else jnp.zeros_like(prev_reward, jnp.float32)
    return jnp.concatenate([jax.nn.one_hot(prev_action, num_actions), reward[None]])


class LSTMCore(eqx.Module):
    """The UVFA/USFA state: the torso's map, flattened, then an LSTM on [onehot(a_prev); tanh(r_prev); torso].

    With the Impala torso the flattened map first goes through Linear(256) and ReLU, as in the original.

    For a learner's unroll the gates' state-independent part W_x [vector; features] + b runs for all steps at once,
    outside the loop, which adds W_h h.
    """

    torso: DQNTorso | ImpalaTorso
    lstm: LSTMCell
    num_actions: int = eqx.field(static=True)  # the size of the one-hot previous action it reads
    reward_input: bool = eqx.field(static=True, default=True)  # whether it reads the previous reward
    flat: eqx.nn.Linear | None = None

    def __init__(self, num_actions: int, hidden_size: int, key, torso: str = "dqn", flat_size: int = 256,
                 torso_channels: tuple[int, ...] | None = None, reward_input: bool = True):
        """reward_input: the previous reward is part of its input (prev_action_reward); False: --reward-input off."""
        k_torso, k_lstm, k_flat = jax.random.split(key, 3)
        self.num_actions, self.reward_input = num_actions, reward_input
        torso_class, map_shape = TORSOS[torso]
        self.torso = torso_class(k_torso) if torso_channels is None else torso_class(k_torso, channels=torso_channels)
        features = math.prod(map_shape)
        if torso == "impala":
            self.flat, features = linear(features, flat_size, k_flat), flat_size
        self.lstm = LSTMCell(num_actions + 1 + features, hidden_size, k_lstm)

    def initial_state(self):
        zeros = jnp.zeros(self.lstm.hidden_size)
        return zeros, zeros

    def input_vector(self, prev_action, prev_reward):
        """[onehot(a_{t-1}); tanh(r_{t-1})], what the LSTM reads besides the torso (the reward's entry 0 without
        reward_input)."""
        return prev_action_reward(prev_action, prev_reward, self.num_actions, self.reward_input)

    def inputs(self, image_map, vector):
        """The gates' state-independent part W_x [vector; features] + b [..., 4H], for any leading axes."""
        features = image_map.reshape(image_map.shape[:-3] + (-1,))
        if self.flat is not None:
            features = jax.nn.relu(features @ self.flat.weight.T + self.flat.bias)
        x = jnp.concatenate([vector, features], axis=-1)
        return x @ self.lstm.linear.weight[:, :x.shape[-1]].T + self.lstm.linear.bias

    def step(self, inputs, state):
        """One step from one step's inputs [4H] and the state (h, c)."""
        h, c = state
        w_h = self.lstm.linear.weight[:, -self.lstm.hidden_size:]
        i, g, f, o = jnp.split(inputs + w_h @ h, 4, axis=-1)
        c = jax.nn.sigmoid(f + 1.0) * c + jax.nn.sigmoid(i) * jnp.tanh(g)
        return jax.nn.sigmoid(o) * jnp.tanh(c), c

    def unroll(self, maps, vectors, first, state):
        """The states (h, c) [T, H] along a sequence: maps [T, H, W, C], vectors [T, V], first [T] (reset to the
        initial state before these steps) and the state before the first."""
        initial = self.initial_state()

        def step(state, x):
            inputs, first = x
            state = jax.tree.map(lambda s, i: jnp.where(first, i, s), state, initial)
            state = self.step(inputs, state)
            return state, state

        return jax.lax.scan(step, state, (self.inputs(maps, vectors), first))[1]

    def recur(self, image_map, vector, state):
        """One step: (h, c) each [hidden_size]."""
        return self.step(self.inputs(image_map, vector), state)


def count_params(model) -> int:
    return sum(x.size for x in jax.tree.leaves(eqx.filter(model, eqx.is_inexact_array)))
