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


def conv(in_ch: int, out_ch: int, kernel: int, stride: int, key) -> eqx.nn.Conv2d:
    """haiku Conv2D with SAME padding and haiku's initialiser (channels-first, as Equinox)."""
    layer = eqx.nn.Conv2d(in_ch, out_ch, kernel, stride=stride, padding="SAME", key=key)
    fan_in = in_ch * kernel * kernel
    weight = _truncated_normal(key, layer.weight.shape, 1.0 / math.sqrt(fan_in))
    return eqx.tree_at(lambda l: (l.weight, l.bias), layer, (weight, jnp.zeros_like(layer.bias)))


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


class DQNTorso(eqx.Module):
    """The original's "atari" torso: conv 32x8x8/4, 64x4x4/2, 64x3x3/1 (ReLU), 16x1x1; on 40x40 RGB it keeps one
    5x5 cell per grid tile. Input uint8 [H, W, 3]; output float [H/8, W/8, 16]."""

    convs: tuple[eqx.nn.Conv2d, ...]

    def __init__(self, key):
        k = jax.random.split(key, 4)
        self.convs = (conv(3, 32, 8, 4, k[0]), conv(32, 64, 4, 2, k[1]), conv(64, 64, 3, 1, k[2]), conv(64, 16, 1, 1, k[3]))

    def __call__(self, image):
        x = jnp.transpose(image.astype(jnp.float32) / 255.0, (2, 0, 1))
        for layer in self.convs[:-1]:
            x = jax.nn.relu(layer(x))
        return jnp.transpose(self.convs[-1](x), (1, 2, 0))


def count_params(model) -> int:
    return sum(x.size for x in jax.tree.leaves(eqx.filter(model, eqx.is_inexact_array)))
