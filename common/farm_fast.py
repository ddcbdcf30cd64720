"""FARM's recurrence arranged for speed: the `fused` backend of common/farm.py (`--core-backend fused`).

The function is common/farm.py's FARM.step, unrolled along a sequence with resets at episode starts; the tests hold
the two equal (tests/test_farm_fast.py: states and every gradient). What differs is the arrangement:

- `inputs`: what does not read the module states is computed for every step of a sequence at once, before the loop:
  Project(X_t), and the share of v_t = [onehot(a_{t-1}); tanh(r_{t-1})] in the attention's queries and in every
  module's gate (Q(q_k) = Q_h h^k + Q_v v_t + b, and likewise Gate_k).
- `weights`: every linear map of h (the queries', keys' and values' h parts, every module's gate) packed into one
  matrix, so that the loop makes one matmul of h; W_g and W_o into one.
- `attend`: the rest of parts 1-3 on those products, giving the LSTMs' input x = [u; z; h]; then the n LSTMs as one
  batched matmul.
- The backward pass (`unroll_sequence`'s custom_vjp) is written by hand: the loop runs in reverse with per-step
  cotangents only, and every weight's gradient is one contraction over all steps and sequences after it
  (dW_lstm = sum_t dg_t^T x_t, dW_state = sum_t h_t^T dy_t, W_g, W_o and Mix likewise) instead of a sum of outer
  products inside it; only three bias vectors are summed in the loop. Under the learner's vmap over sequences the
  backward runs for the whole batch at once (a custom_vmap), so each weight's gradient is summed over the
  sequences inside that contraction rather than formed once per sequence.

On a CPU the loop's matmuls have 8 rows (the batch's sequences) and read the LSTMs' 6.8 MB weight at every step: they
run at the cache's bandwidth, not the cores' arithmetic (docs/learner_speed.md).

Parameters are FARM's own; this module only reads them.
"""

from __future__ import annotations

import math
from functools import partial
from typing import NamedTuple

import jax
import jax.numpy as jnp
from jax.custom_batching import custom_vmap


class Inputs(NamedTuple):
    """The part of a step that does not depend on the module states (each field may carry leading axes, e.g. the
    steps of a sequence)."""
    pixels: jax.Array  # [HW, P]: Project(X_t)
    query: jax.Array  # [H d]: the queries' bias and share of v_t
    gate: jax.Array  # [n, P]: each module's gate bias and share of v_t
    vector: jax.Array  # [V]: v_t, the tail of every query q_k


class Weights(NamedTuple):
    """FARM's parameters as the loop reads them, built once per unroll by differentiable ops (so that gradients
    reach FARM's own parameters by autodiff)."""
    state: jax.Array  # [d, 3 H d + n P]: h -> (queries, keys, values, every module's gate), one matmul
    read: jax.Array  # [H d, 2 Q]: the read m -> (W_g m, W_o m), one matmul
    key_bias: jax.Array  # [H d]
    value_bias: jax.Array  # [H d]
    b_gate: jax.Array  # [Q]
    mix: jax.Array  # [P, P] (Mix's weight, transposed: z = gated @ mix + mix_bias)
    mix_bias: jax.Array  # [P]
    lstm: jax.Array  # [n, 4 d, Q + HW P + d]: each module's LSTM gates from [u; z; h]
    lstm_bias: jax.Array  # [n, 4 d]


def inputs(farm, image_map, vector) -> Inputs:
    """The state-independent part of the steps: image_map [..., H, W, C] and vector [..., V], any leading axes."""
    d = farm.module_size
    pixels = image_map.reshape(image_map.shape[:-3] + (-1, image_map.shape[-1])) @ farm.project.weight.T
    query = vector @ farm.query.weight[:, d:].T + farm.query.bias
    gate = jnp.einsum("...v,npv->...np", vector, farm.gate.weight[:, :, d:]) + farm.gate.bias
    return Inputs(pixels + farm.project.bias, query, gate, vector)


def weights(farm) -> Weights:
    d = farm.module_size
    state = jnp.concatenate([farm.query.weight[:, :d], farm.key.weight, farm.value.weight,
                             farm.gate.weight[:, :, :d].reshape(-1, d)]).T
    return Weights(state=state, read=jnp.concatenate([farm.w_gate.weight, farm.w_out.weight]).T,
                   key_bias=farm.key.bias, value_bias=farm.value.bias, b_gate=farm.b_gate, mix=farm.mix.weight.T,
                   mix_bias=farm.mix.bias, lstm=farm.lstm.linear.weight, lstm_bias=farm.lstm.linear.bias)


class Parts(NamedTuple):
    """What a step's attention computed on the way, kept for its backward pass (each [..., n, ...])."""
    gate: jax.Array  # [n, P]: sigmoid of each module's feature gate
    probabilities: jax.Array  # [n, n + 1, heads]: each module's attention over the memory rows
    read: jax.Array  # [n, H d]: m_k
    open: jax.Array  # [n, Q]: sigmoid(W_g m_k - b_g)
    through: jax.Array  # [n, Q]: tanh(W_o m_k)


def _heads(heads: int, w: Weights, x: Inputs, y):
    """The attention's queries [..., n, H, d], and the keys and values of the memory [h; 0] [..., n + 1, H, d]."""
    *lead, n, _ = y.shape
    a = w.key_bias.shape[-1]
    d = a // heads
    zero_row = lambda bias: jnp.broadcast_to(bias, (*lead, 1, a))  # noqa: E731  (the memory's zero row)
    queries = (y[..., :a] + x.query[..., None, :]).reshape(*lead, n, heads, d)
    keys = jnp.concatenate([y[..., a:2 * a] + w.key_bias, zero_row(w.key_bias)], -2).reshape(*lead, n + 1, heads, d)
    values = jnp.concatenate([y[..., 2 * a:3 * a] + w.value_bias, zero_row(w.value_bias)], -2).reshape(
        *lead, n + 1, heads, d)
    return queries, keys, values


def attend(heads: int, w: Weights, x: Inputs, y, h):
    """Parts 1-3 of a step from the packed products y = h @ w.state [..., n, 3 H d + n P] and h [..., n, d]: the
    LSTMs' input [u; z; h] [..., n, Q + HW P + d], and the Parts its backward pass reads."""
    *lead, n, d = h.shape
    a, projection = heads * d, x.pixels.shape[-1]
    own_gate = jnp.diagonal(y[..., 3 * a:].reshape(*lead, n, n, projection), axis1=-3, axis2=-2)  # [..., P, n]
    gate = jax.nn.sigmoid(jnp.swapaxes(own_gate, -1, -2) + x.gate)  # module k's gate of h^k, and of v_t

    # 2. feature attention: each module gates the projected pixels with its own gate, then Mix
    attended = x.pixels[..., None, :, :] * gate[..., :, None, :]  # [..., n, HW, P]
    z = (attended @ w.mix + w.mix_bias).reshape(*lead, n, -1)

    # 3. inter-module attention over [h; 0]: logits [..., n, n + 1, heads], softmax over the memory rows
    queries, keys, values = _heads(heads, w, x, y)
    logits = jnp.sum(queries[..., :, None, :, :] * keys[..., None, :, :, :], axis=-1) / math.sqrt(d)
    probabilities = jax.nn.softmax(logits, axis=-2)
    read = jnp.sum(probabilities[..., None] * values[..., None, :, :, :], axis=-3).reshape(*lead, n, a)
    gate_out = read @ w.read
    q = jnp.concatenate([h, jnp.broadcast_to(x.vector[..., None, :], (*lead, n, x.vector.shape[-1]))], -1)  # 1.
    query_size = q.shape[-1]
    opening, through = jax.nn.sigmoid(gate_out[..., :query_size] - w.b_gate), jnp.tanh(gate_out[..., query_size:])
    lstm_input = jnp.concatenate([q + opening * through, z, h], axis=-1)
    return lstm_input, Parts(gate, probabilities, read, opening, through)


def attend_backward(heads: int, w: Weights, x: Inputs, y, h, parts: Parts, d_input):
    """attend's backward pass, by hand, from the cotangent of its output [..., n, Q + HW P + d]: the cotangents of
    x (Inputs), y and h, of the biases it reads, and of W_g m and W_o m [..., n, 2Q] and of z [..., n, HW, P], from
    which the weights W_g, W_o and Mix get their gradient after the loop."""
    *lead, n, d = h.shape
    query_size, projection = d + x.vector.shape[-1], x.pixels.shape[-1]
    d_u, d_z, d_h = (d_input[..., :query_size], d_input[..., query_size:-d], d_input[..., -d:])
    d_z = d_z.reshape(*lead, n, -1, projection)
    # 3. u = q + sigmoid(W_g m - b_g) tanh(W_o m), m = the attention's read of the memory
    d_gate_out = jnp.concatenate([d_u * parts.through * parts.open * (1.0 - parts.open),
                                  d_u * parts.open * (1.0 - parts.through * parts.through)], axis=-1)
    d_read = (d_gate_out @ w.read.T).reshape(*lead, n, heads, d)
    queries, keys, values = _heads(heads, w, x, y)
    p = parts.probabilities
    d_p = jnp.sum(d_read[..., :, None, :, :] * values[..., None, :, :, :], axis=-1)  # [..., n, n + 1, heads]
    d_values = jnp.sum(p[..., None] * d_read[..., :, None, :, :], axis=-4)  # [..., n + 1, heads, d]
    d_logits = p * (d_p - jnp.sum(p * d_p, axis=-2, keepdims=True)) / math.sqrt(d)
    d_queries = jnp.sum(d_logits[..., None] * keys[..., None, :, :, :], axis=-3)  # [..., n, heads, d]
    d_keys = jnp.sum(d_logits[..., None] * queries[..., :, None, :, :], axis=-4)  # [..., n + 1, heads, d]
    # 2. z = (pixels * gate) @ Mix + b
    d_attended = d_z @ w.mix.T  # [..., n, HW, P]
    d_gate = jnp.sum(d_attended * x.pixels[..., None, :, :], axis=-2) * parts.gate * (1.0 - parts.gate)
    d_pixels = jnp.sum(d_attended * parts.gate[..., :, None, :], axis=-3)
    # y = h @ W_state: the queries', the modules' keys and values, and module k's own gate (block k of row k)
    rows = lambda t: t.reshape(*lead, t.shape[-3], -1)  # noqa: E731
    own = (d_gate[..., :, None, :] * jnp.eye(n, dtype=d_gate.dtype)[:, :, None]).reshape(*lead, n, n * projection)
    d_y = jnp.concatenate([rows(d_queries), rows(d_keys)[..., :n, :], rows(d_values)[..., :n, :], own], axis=-1)
    d_x = Inputs(pixels=d_pixels, query=jnp.sum(rows(d_queries), axis=-2), gate=d_gate,
                 vector=jnp.sum(d_u[..., d:], axis=-2))
    d_biases = (rows(d_keys).sum(-2), rows(d_values).sum(-2), -d_gate_out[..., :query_size].sum(-2))
    return d_x, d_y, d_h + d_u[..., :d], d_biases, d_gate_out, d_z


def lstm_cell(gates, c):
    """4. haiku's LSTM from its gates' pre-activations (i, g, f, o; forget bias +1): the new (h, c)."""
    i, g, f, o = jnp.split(gates, 4, axis=-1)
    c = jax.nn.sigmoid(f + 1.0) * c + jax.nn.sigmoid(i) * jnp.tanh(g)
    return jax.nn.sigmoid(o) * jnp.tanh(c), c


def lstm_gates(w: Weights, lstm_input):
    """The n LSTMs' gate pre-activations [..., n, 4 d] from their inputs [..., n, L]: one batched matmul."""
    return jnp.einsum("ngl,...nl->...ng", w.lstm, lstm_input) + w.lstm_bias


def step(heads: int, w: Weights, x: Inputs, state):
    """One step from the state (h, c) [n, d] (already reset where an episode starts) and one step's inputs."""
    h, c = state
    lstm_input, _ = attend(heads, w, x, h @ w.state, h)
    return lstm_cell(lstm_gates(w, lstm_input), c)


def recur(farm, image_map, vector, state):
    """One step (acting): FARM.step(image_map, vector, state)."""
    return step(farm.num_heads, weights(farm), inputs(farm, image_map, vector), state)


def unroll_sequence(farm, maps, vectors, first, state):
    """The states (h, c) [T, n, d] along one sequence: FARM.step in a loop, resetting to zeros before the steps
    where first [T] holds."""
    keep = 1.0 - first.astype(jnp.float32)
    return _unroll(farm.num_heads, weights(farm), inputs(farm, maps, vectors), keep, state[0], state[1])


def _forward(heads, w, x, keep, h0, c0):
    """The loop along one sequence, keeping what the backward pass reads: the states each step read (after the
    reset), its packed products y, the LSTMs' inputs and gate pre-activations, the attention's Parts ([T, ...])."""
    def body(state, xs):
        x_t, keep_t = xs
        h, c = state[0] * keep_t, state[1] * keep_t
        y = h @ w.state
        lstm_input, parts = attend(heads, w, x_t, y, h)
        gates = lstm_gates(w, lstm_input)
        new = lstm_cell(gates, c)
        return new, (new, (h, c, y, lstm_input, gates, parts))

    _, (states, residuals) = jax.lax.scan(body, (h0, c0), (x, keep))
    return states, residuals


def _backward(heads, w, x, keep, residuals, d_hs, d_cs):
    """The backward loop over R sequences at once (every array [T, R, ...]): the gradient of every weight (summed
    over the rows and steps), of the inputs [T, R, ...] and of the states before the first step [R, ...]."""
    hs, cs, ys, lstm_inputs, gates, parts = residuals

    def body(carry, xs):
        dh, dc, d_biases = carry
        x_t, keep_t, h, c, y, gates_t, parts_t, dh_out, dc_out = xs
        dh, dc = dh + dh_out, dc + dc_out  # the new state's cotangent: from the next step and from the loss
        # 4. the LSTM cell backward, by hand (elementwise)
        i, g, f, o = jnp.split(gates_t, 4, axis=-1)
        si, tg, sf, so = jax.nn.sigmoid(i), jnp.tanh(g), jax.nn.sigmoid(f + 1.0), jax.nn.sigmoid(o)
        tc = jnp.tanh(sf * c + si * tg)
        dc = dc + dh * so * (1.0 - tc * tc)
        d_gates = jnp.concatenate([dc * tg * si * (1.0 - si), dc * si * (1.0 - tg * tg), dc * c * sf * (1.0 - sf),
                                   dh * tc * so * (1.0 - so)], axis=-1)
        d_input = jnp.einsum("ngl,rng->rnl", w.lstm, d_gates)
        # 1-3. attend backward: dy, W_g m's and W_o m's and z's cotangents leave the loop for the weights' gradients
        d_x, d_y, d_h, d_biases_t, d_gate_out, d_z = attend_backward(heads, w, x_t, y, h, parts_t, d_input)
        d_h = d_h + d_y @ w.state.T
        keep_t = keep_t[:, None, None]
        d_biases = jax.tree.map(lambda a, b: a + b.sum(0), d_biases, d_biases_t)
        return (d_h * keep_t, dc * sf * keep_t, d_biases), (d_x, d_y, d_gates, d_gate_out, d_z)

    zero_biases = (jnp.zeros_like(w.key_bias), jnp.zeros_like(w.value_bias), jnp.zeros_like(w.b_gate))
    (dh0, dc0, (d_key_bias, d_value_bias, d_b_gate)), (d_x, d_ys, d_gates, d_gate_outs, d_zs) = jax.lax.scan(
        body, (jnp.zeros_like(hs[0]), jnp.zeros_like(cs[0]), zero_biases),
        (x, keep, hs, cs, ys, gates, parts, d_hs, d_cs), reverse=True)
    # the weights' gradients: one contraction each over every step and sequence
    d_w = Weights(state=jnp.einsum("trnd,trny->dy", hs, d_ys),
                  read=jnp.einsum("trna,trnq->aq", parts.read, d_gate_outs),
                  key_bias=d_key_bias, value_bias=d_value_bias, b_gate=d_b_gate,
                  mix=jnp.einsum("trqp,trnp,trnqo->po", x.pixels, parts.gate, d_zs), mix_bias=d_zs.sum((0, 1, 2, 3)),
                  lstm=jnp.einsum("trng,trnl->ngl", d_gates, lstm_inputs), lstm_bias=d_gates.sum((0, 1)))
    return d_w, d_x, dh0, dc0


def _backward_one(heads, w, saved, cotangents):
    """The backward pass of one sequence; under a vmap over sequences (the learner's batch) all of them at once,
    with each weight's gradient summed over the sequences in the contraction after the loop (not one per sequence)."""
    arrays = (w, saved, cotangents)

    @custom_vmap
    def one(w, saved, cotangents):
        rows = jax.tree.map(lambda a: a[:, None], (saved, cotangents))  # one row: [T, 1, ...]
        d_w, d_x, dh0, dc0 = _backward(heads, w, *rows[0], *rows[1])
        return d_w, jax.tree.map(lambda a: a[:, 0], d_x), dh0[0], dc0[0]

    @one.def_vmap
    def rule(axis_size, in_batched, w, saved, cotangents):
        w_batched, *rest = in_batched
        spread = lambda a, b: a if b else jnp.broadcast_to(a, (axis_size,) + a.shape)  # noqa: E731
        saved, cotangents = (jax.tree.map(spread, a, b) for a, b in zip((saved, cotangents), rest))
        if any(jax.tree.leaves(w_batched)):  # a network per sequence (not the learner's case): one by one
            w = jax.tree.map(spread, w, w_batched)
            out = jax.vmap(lambda *a: one.fun(*a))(w, saved, cotangents)
            return out, jax.tree.map(lambda _: True, out)
        rows = jax.tree.map(lambda a: jnp.swapaxes(a, 0, 1), (saved, cotangents))  # [T, B, ...]
        d_w, d_x, dh0, dc0 = _backward(heads, w, *rows[0], *rows[1])
        out = (d_w, jax.tree.map(lambda a: jnp.swapaxes(a, 0, 1), d_x), dh0, dc0)
        # the weights' gradient is the sum over the sequences: unbatched, as the weights are
        return out, (jax.tree.map(lambda _: False, d_w), jax.tree.map(lambda _: True, d_x), True, True)

    return one(*arrays)


@partial(jax.custom_vjp, nondiff_argnums=(0,))
def _unroll(heads, w, x, keep, h0, c0):
    return _forward(heads, w, x, keep, h0, c0)[0]


def _unroll_fwd(heads, w, x, keep, h0, c0):
    states, residuals = _forward(heads, w, x, keep, h0, c0)
    return states, (w, (x, keep, residuals))


def _unroll_bwd(heads, saved, cotangents):
    w, saved = saved
    d_w, d_x, dh0, dc0 = _backward_one(heads, w, saved, cotangents)
    return d_w, d_x, None, dh0, dc0


_unroll.defvjp(_unroll_fwd, _unroll_bwd)
