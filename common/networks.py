"""Building blocks shared by the learners: haiku-style initialisers, an LSTM cell, the DQN torso, MLPs.

The original code is haiku: Linear and Conv weights ~ truncated normal with stddev 1/sqrt(fan_in), zero biases,
LSTM gates (i, g, f, o) from one Linear on [x; h] with the forget gate biased by +1. Equinox's defaults differ
(uniform init, no forget bias), so these helpers set them explicitly.
"""

from __future__ import annotations

import math
import re

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
    space_to_depth = True  # class-wide switch: benchmarks/learner.py times the plain patch path against it
    native = False  # class-wide switch: XLA's own convolution instead (benchmarks/sgd_variants.py times it on a GPU)

    def __init__(self, in_ch: int, out_ch: int, kernel: int, stride: int, key):
        fan_in = in_ch * kernel * kernel
        self.weight = _truncated_normal(key, (fan_in, out_ch), 1.0 / math.sqrt(fan_in))
        self.bias = jnp.zeros(out_ch)
        self.kernel, self.stride = kernel, stride

    def __call__(self, x):
        k, s = self.kernel, self.stride
        h, w, channels = x.shape
        if self.native:  # the same SAME-padded convolution, as one XLA op (its padding splits as below)
            kernel = self.weight.reshape(k, k, channels, -1)
            return jax.lax.conv_general_dilated(x[None], kernel, (s, s), "SAME",
                                                dimension_numbers=("NHWC", "HWIO", "NHWC"))[0] + self.bias
        out_h, out_w = -(-h // s), -(-w // s)
        pad_h, pad_w = max((out_h - 1) * s + k - h, 0), max((out_w - 1) * s + k - w, 0)
        x = jnp.pad(x, ((pad_h // 2, pad_h - pad_h // 2), (pad_w // 2, pad_w - pad_w // 2), (0, 0)))
        weight = self.weight
        if self.space_to_depth and s > 1 and k % s == 0:  # space-to-depth: a stride-1 convolution with an (k/s) x (k/s) kernel
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


class DQNTorso(eqx.Module):
    """The original's "atari" torso: conv 32x8x8/4, 64x4x4/2, 64x3x3/1 (ReLU), 16x1x1; on 40x40 RGB it keeps one
    5x5 cell per grid tile. Input uint8 [H, W, 3]; output float [H/8, W/8, 16]."""

    convs: tuple[Conv2d, ...]

    def __init__(self, key):
        k = jax.random.split(key, 4)
        self.convs = (
            Conv2d(3, 32, 8, 4, k[0]), Conv2d(32, 64, 4, 2, k[1]), Conv2d(64, 64, 3, 1, k[2]), Conv2d(64, 16, 1, 1, k[3])
        )

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


def oar_vector(prev_action, prev_reward, num_actions: int):
    """[onehot(a_{t-1}); tanh(r_{t-1})]: what every recurrent core sees besides the image."""
    return jnp.concatenate([jax.nn.one_hot(prev_action, num_actions), jnp.tanh(prev_reward)[None]])


class LSTMCore(eqx.Module):
    """The UVFA/USFA state: the torso's map, flattened, then an LSTM on [onehot(a_prev); tanh(r_prev); torso].

    With the Impala torso the flattened map first goes through Linear(256) and ReLU, as in the original.

    Like FarmCore, a step is split for a learner's unroll: `inputs` (the LSTM's gates from [a_prev; r_prev; torso],
    which do not depend on the state) for a whole sequence outside the loop, and `step`, which adds W_h h inside it.
    """

    torso: DQNTorso | ImpalaTorso
    lstm: LSTMCell
    num_actions: int = eqx.field(static=True)  # the size of the one-hot previous action it reads
    flat: eqx.nn.Linear | None = None

    RECURRENT_PRODUCT = "oi,i->o"
    """how `step` applies the recurrent weight W_h [4H, H] to h (for scan_with_weight_grad_after)"""

    def __init__(self, num_actions: int, hidden_size: int, key, torso: str = "dqn", flat_size: int = 256):
        k_torso, k_lstm, k_flat = jax.random.split(key, 3)
        self.num_actions = num_actions
        torso_class, map_shape = TORSOS[torso]
        self.torso = torso_class(k_torso)
        features = math.prod(map_shape)
        if torso == "impala":
            self.flat, features = linear(features, flat_size, k_flat), flat_size
        self.lstm = LSTMCell(num_actions + 1 + features, hidden_size, k_lstm)

    def initial_state(self):
        zeros = jnp.zeros(self.lstm.hidden_size)
        return zeros, zeros

    def inputs(self, image_map, vector):
        """The gates' state-independent part W_x [vector; features] + b [..., 4H], for any leading axes."""
        features = image_map.reshape(image_map.shape[:-3] + (-1,))
        if self.flat is not None:
            features = jax.nn.relu(features @ self.flat.weight.T + self.flat.bias)
        x = jnp.concatenate([vector, features], axis=-1)
        return x @ self.lstm.linear.weight[:, :x.shape[-1]].T + self.lstm.linear.bias

    def recurrent_weight(self):
        """W_h [4H, H], the one weight the recurrence reads."""
        return self.lstm.linear.weight[:, -self.lstm.hidden_size:]

    def fused_weights(self):
        return ()

    def step(self, fused, inputs, state, recurrent_weight, offset=0.0):
        """One step from one step's inputs [4H] and the state (h, c); returns the new state and h, what the
        recurrent weight multiplied. fused: unused (FarmCore's interface)."""
        h, c = state
        i, g, f, o = jnp.split(inputs + jnp.einsum(self.RECURRENT_PRODUCT, recurrent_weight, h) + offset, 4, axis=-1)
        c = jax.nn.sigmoid(f + 1.0) * c + jax.nn.sigmoid(i) * jnp.tanh(g)
        return (jax.nn.sigmoid(o) * jnp.tanh(c), c), h

    def recur(self, image_map, vector, state):
        """One step: (h, c) each [hidden_size]."""
        return self.step((), self.inputs(image_map, vector), state, self.recurrent_weight())[0]


def scan_with_weight_grad_after(step, weight, params, carry, xs, static_xs, product: str, unroll: int = 1,
                                grad_after_loop: bool = True):
    """lax.scan over a recurrent cell whose gradient for its recurrent `weight` is formed after the loop.

    step(weight, params, carry, x, static_x, offset) -> (carry, y, v) must apply `weight` only as
    einsum(product, weight, v) + offset (e.g. the LSTM gates W [x; h] with product "oi,i->o"); it returns the ys
    stacked [T, ...]. The result and its gradient are those of the plain scan (offset = 0), up to float rounding.

    Why: a plain scan's backward adds each step's weight gradient dgates_t v_t^T into a running sum, one matmul and
    one read-modify-write of the whole weight gradient per step, inside the latency-bound loop (and, for 10 vmapped
    seeds on a GPU, the biggest memory traffic of the SGD step). Here the loop only returns dgates_t (the gradient of
    the zero `offset`), and dW = sum_t dgates_t v_t^T is one matmul over all steps (and, under vmap over a batch,
    over all sequences) after it. params and xs are differentiated; carry and static_xs (e.g. episode-start flags)
    are not. grad_after_loop=False runs the plain scan (for comparison).
    """
    if not grad_after_loop:
        def plain(c, x):
            c, y, _ = step(weight, params, c, *x, 0.0)
            return c, y
        return jax.lax.scan(plain, carry, (xs, static_xs), unroll=unroll)[1]
    return _scan_deferred((weight, params, xs), step, carry, static_xs, product, unroll)


def _run_with_offsets(step, weight, carry, static_xs, unroll):
    def run(params, xs, offsets):
        def body(c, x):
            x, static_x, offset = x
            c, y, v = step(weight, params, c, x, static_x, offset)
            return c, (y, v)
        return jax.lax.scan(body, carry, (xs, static_xs, offsets), unroll=unroll)[1]
    return run


def _zero_offsets(step, weight, params, carry, xs, static_xs, product):
    """Zeros [T, ...] shaped like the per-step product einsum(product, weight, v)."""
    first = jax.tree.map(lambda x: x[0], (xs, static_xs))
    v = jax.eval_shape(lambda: step(weight, params, carry, *first, 0.0)[2])
    out = jax.eval_shape(lambda: jnp.einsum(product, weight, jnp.zeros(v.shape, v.dtype)))
    length = jax.tree.leaves(static_xs)[0].shape[0]
    return jnp.zeros((length,) + out.shape, out.dtype)


@eqx.filter_custom_vjp
def _scan_deferred(diff, step, carry, static_xs, product, unroll):
    weight, params, xs = diff
    offsets = _zero_offsets(step, weight, params, carry, xs, static_xs, product)
    return _run_with_offsets(step, weight, carry, static_xs, unroll)(params, xs, offsets)[0]


@_scan_deferred.def_fwd
def _scan_deferred_fwd(perturbed, diff, step, carry, static_xs, product, unroll):
    weight, params, xs = diff
    offsets = _zero_offsets(step, weight, params, carry, xs, static_xs, product)
    (ys, vs), vjp = jax.vjp(_run_with_offsets(step, weight, carry, static_xs, unroll), params, xs, offsets)
    return ys, (vjp, ys, vs)


@_scan_deferred.def_bwd
def _scan_deferred_bwd(residuals, d_ys, perturbed, diff, step, carry, static_xs, product, unroll):
    vjp, ys, vs = residuals
    d_ys = jax.tree.map(lambda d, y: jnp.zeros_like(y) if d is None else d, d_ys, ys,
                        is_leaf=lambda x: x is None)
    d_params, d_xs, d_offsets = vjp((d_ys, jnp.zeros_like(vs)))
    w_in, v_in, out = re.match(r"(\w+),(\w+)->(\w+)", product).groups()
    d_weight = jnp.einsum(f"t{out},t{v_in}->{w_in}", d_offsets, vs)  # one matmul over every step
    return d_weight, d_params, d_xs


def count_params(model) -> int:
    return sum(x.size for x in jax.tree.leaves(eqx.filter(model, eqx.is_inexact_array)))
