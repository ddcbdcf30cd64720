"""FARM's recurrence as fused Pallas kernels: the `pallas` backend of common/farm.py (`--core-backend pallas`).

The method is common/farm.py's FARM; this module computes the same function, arranged for a GPU. A learner
unrolls FARM over the 41 steps of each replayed sequence three times per SGD step (online forward, target forward,
backward). In XLA each step is a chain of ~50 small dependent kernels, and their launch latency, not arithmetic or
memory, sets the time. Here each step is three kernels forward and three backward:

    forward, step t                               backward, step t (reverse order)
    1. attend_inputs: y = h_{t-1} @ W_state       4. lstm_bwd: dgates, dx = dgates @ W_lstm (x = [u; z; h])
       (every linear map of h: queries, keys,     5. attend_bwd: the attention and feature gating backward,
       values, the module gates), resets inside      per module; key/value cotangents for every module
    2. attend: inter-module attention, u, the     6. attend_inputs_bwd: dh_{t-1} = dy @ W_state^T, summed over
       feature gating z -> x = [u; z; h]             the modules' contributions, plus the direct terms and the
    3. lstm: the n module LSTMs (gates, cell)        loss's cotangent, resets inside

Parameter gradients are not summed inside the loop: the backward kernels write per-step cotangents and the weight
gradients are one contraction over every step and sequence after it (the LSTMs' dW = sum_t dgates_t x_t^T, ...).

Layout. Triton (Pallas' GPU lowering) needs every array inside a kernel to have power-of-two dimensions and every
matmul dimension >= 16, so the wrapper pads once per unroll, outside the loop, never changing the model: batch rows to
R >= 16 (extra rows are reset at every step and never read back), hidden units to whole blocks of C (150 -> 160;
padded units stay exactly 0), each attention head to DP columns, the LSTMs' input x = [u; z; h] to whole column
blocks, the LSTMs' weight to [n, 4, DP, LP]. Padded weights and inputs are built by differentiable JAX ops, so their
gradients map back to FARM's own parameters by autodiff.

Loop state lives in stacked buffers that the kernels update in place (input_output_aliases) at the step index they
read from a scalar: no per-step copies or slices around the kernels.

Batching. The learner's losses are per sequence and vmapped over the batch; a plain vmap of a kernel would give each
sequence its own program and read the weights once per sequence. `unroll` is a `jax.custom_batching.custom_vmap`
(`unroll_sequence`) whose rule runs the batch-explicit kernels (`unroll_batch`), with the batch as rows. Vmapping
over seeds (weights batched too) adds a grid axis. One limit follows: reverse-mode differentiation must see the batch vmap inside it (jax.grad of a
vmapped loss, as every script's batch_loss does); differentiating a single unbatched sequence raises JAX's
"Linearization failed" error (vmap it over a batch of one).

On a CPU the kernels run in Pallas' interpret mode (slow: for tests); precision follows
jax.default_matmul_precision ("highest" gives float32 dots on a GPU; the default there is TF32, as for XLA's dots).
"""

from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass, replace
from functools import partial
from typing import NamedTuple

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jax.custom_batching import custom_vmap
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plt

# -------------------------------------------------------------------------------------- Pallas across jax versions
if hasattr(plt, "load"):  # jax >= 0.9: Triton-specific loads and stores with masks, on refs indexed by .at
    def _load(ref, idx, mask=None):
        return plt.load(ref.at[idx], mask=mask, other=None if mask is None else 0.0)

    def _store(ref, idx, value, mask=None):
        plt.store(ref.at[idx], value, mask=mask)
else:  # jax 0.6-0.8
    def _load(ref, idx, mask=None):
        return pl.load(ref, idx, mask=mask, other=None if mask is None else 0.0)

    def _store(ref, idx, value, mask=None):
        pl.store(ref, idx, value, mask=mask)


def _pow2(x: int, least: int = 16) -> int:
    return max(least, 1 << (int(x) - 1).bit_length())


def _roundup(x: int, multiple: int) -> int:
    return -(-x // multiple) * multiple


# ----------------------------------------------------------------------------------------------------- settings
@dataclass(frozen=True)
class Config:
    """How the kernels run (static). Block sizes are speed settings; the function is the same."""
    interpret: bool = False  # Pallas' interpreter (CPUs) instead of Triton kernels (GPUs)
    lstm_bf16: bool = False  # the LSTMs' weight and input in bfloat16 for their matmuls (float32 accumulation and
    #                          state): half the bytes of the largest weight; NOT exact (~1e-3 relative)
    block: int = 32  # C: hidden units per LSTM program, columns per attention chunk
    lstm_columns: int = 128  # BK: columns of x per step of the LSTMs' matmul loop
    y_columns: int = 128  # columns of y = h @ W_state per attend_inputs program
    num_warps: int = 4
    num_stages: int = 1


_OVERRIDES: dict = {}


@contextlib.contextmanager
def overrides(**changes):
    """Within it, FarmCore's kernels use these Config settings: block sizes for benchmarks/sgd_variants.py's rows;
    interpret=False to trace the GPU kernels on a CPU, so that a program can be lowered for CUDA without a GPU
    (jax.jit(f).trace(...).lower(lowering_platforms=("cuda",)): tests/test_farm_kernels.py)."""
    saved = dict(_OVERRIDES)
    _OVERRIDES.update(changes)
    try:
        yield
    finally:
        _OVERRIDES.clear()
        _OVERRIDES.update(saved)


def config_for(backend: str) -> Config:
    """The kernels' settings for a --core-backend value: interpret mode where JAX's default device is a CPU."""
    cfg = Config(interpret=jax.default_backend() == "cpu", lstm_bf16=backend == "pallas-bf16")
    return replace(cfg, **_OVERRIDES)


class Dims(NamedTuple):
    """FARM's sizes and their padded forms (static)."""
    R: int  # batch rows (>= 16, a power of two)
    N: int  # modules
    D: int  # module size d
    H: int  # heads
    P: int  # projection channels
    HW: int  # pixels of the torso's map
    V: int  # the [a_prev; r_prev] vector
    C: int  # block
    BK: int  # LSTM column block
    BN: int  # y column block

    @property
    def Q(self): return self.D + self.V  # the query [h; vector]
    @property
    def DP(self): return _roundup(self.D, self.C)  # padded module size (whole blocks)
    @property
    def NJ(self): return self.DP // self.C
    @property
    def HD(self): return self.H * self.DP  # padded attention size (each head DP wide)
    @property
    def PV(self): return _pow2(self.P)
    @property
    def HWP(self): return _pow2(self.HW, 1)
    @property
    def QV(self): return _pow2(self.Q)
    @property
    def HV(self): return _pow2(self.D)
    @property
    def Y(self): return _roundup(3 * self.HD + self.N * self.PV, self.BN)  # y = h @ W_state columns
    @property
    def LX(self): return self.Q + self.HW * self.PV + self.D  # the LSTMs' input [u; z; h], z with PV channels
    @property
    def LP(self): return _roundup(self.LX, self.BK)
    @property
    def NK(self): return self.LP // self.BK
    @property
    def LPX(self):  # the x buffer: wide enough for every window the kernels read or write
        return _roundup(max(self.LP, self.QV, self.Q + self.HWP * self.PV,
                            self.Q + self.HW * self.PV + max(self.HV, self.DP)), self.C)


def dims_of(farm, batch: int, cfg: Config) -> Dims:
    n, d, P = farm.num_modules, farm.module_size, farm.mix.weight.shape[0]
    V = farm.query.weight.shape[1] - d
    HW = (farm.lstm.linear.weight.shape[-1] - d - (d + V)) // P  # the LSTMs' input is [u (d + V); z (HW P); h (d)]
    return Dims(R=_pow2(batch), N=n, D=d, H=farm.num_heads, P=P, HW=HW, V=V, C=cfg.block, BK=cfg.lstm_columns,
                BN=cfg.y_columns)


# ------------------------------------------------------------------------------------- padded weights and inputs
class Weights(NamedTuple):
    """FARM's parameters in the kernels' padded layout (built by `pad_weights`, differentiable)."""
    state: jax.Array  # [DP, Y]: h -> (query, key, value: each head DP columns; module k's gate at 3HD + k PV)
    key_bias: jax.Array  # [HD]
    value_bias: jax.Array  # [HD]
    read: jax.Array  # [HD, 2 QV]: the attention read -> (W_g m, W_o m)
    b_gate: jax.Array  # [QV]
    mix: jax.Array  # [PV, PV] (out, in)
    mix_bias: jax.Array  # [PV]
    lstm: jax.Array  # [n, 4, DP, LP]: gates (i, g, f, o) x hidden units x [u; z; h] (z with PV channels)
    lstm_bias: jax.Array  # [n, 4, DP]


class Inputs(NamedTuple):
    """The state-independent part of every step (common.farm_fast.Inputs, padded), each [T, R, ...]."""
    query: jax.Array  # [T, R, HD]
    gate: jax.Array  # [T, R, n, PV]
    pixels: jax.Array  # [T, R, HWP, PV]
    vector: jax.Array  # [T, R, QV]: the vector at columns d .. d + V (the query's tail)
    keep: jax.Array  # [T, R]: 0 where the step starts an episode (the state is reset before it), else 1


def _heads(x, z: Dims, axis: int = -1):
    """[..., H d, ...] -> [..., H DP, ...]: each head's d entries padded to DP, along `axis`."""
    axis = axis % x.ndim
    shape = x.shape[:axis] + (z.H, z.D) + x.shape[axis + 1:]
    pad = [(0, 0)] * (axis + 1) + [(0, z.DP - z.D)] + [(0, 0)] * (x.ndim - axis - 1)
    return jnp.pad(x.reshape(shape), pad).reshape(x.shape[:axis] + (z.HD,) + x.shape[axis + 1:])


def _lstm_columns(z: Dims) -> np.ndarray:
    """Where each of the LSTMs' L real input columns [u; z; h] sits in the padded layout (z with PV channels)."""
    u = np.arange(z.Q)
    zz = z.Q + (np.arange(z.HW)[:, None] * z.PV + np.arange(z.P)[None, :]).reshape(-1)
    h = z.Q + z.HW * z.PV + np.arange(z.D)
    return np.concatenate([u, zz, h])


def pad_weights(farm, z: Dims, cfg: Config) -> Weights:
    d, n, P, PV, QV = z.D, z.N, z.P, z.PV, z.QV
    q_w, k_w, v_w = (_heads(layer.weight[:, :d].T, z) for layer in (farm.query, farm.key, farm.value))  # [d, HD]
    gates = jnp.pad(jnp.transpose(farm.gate.weight[:, :, :d], (2, 0, 1)), ((0, 0), (0, 0), (0, PV - P)))  # [d,n,PV]
    state = jnp.concatenate([q_w, k_w, v_w, gates.reshape(d, n * PV)], axis=1)
    state = jnp.pad(state, ((0, z.DP - d), (0, z.Y - state.shape[1])))
    read = jnp.concatenate([jnp.pad(_heads(layer.weight.T, z, axis=0), ((0, 0), (0, QV - z.Q)))
                            for layer in (farm.w_gate, farm.w_out)], axis=1)  # [HD, 2 QV]
    lstm = farm.lstm.linear.weight.reshape(n, 4, d, -1)
    lstm = jnp.zeros((n, 4, z.DP, z.LP), lstm.dtype).at[:, :, :d, _lstm_columns(z)].set(lstm)
    if cfg.lstm_bf16:
        lstm = lstm.astype(jnp.bfloat16)
    return Weights(
        state=state, key_bias=_heads(farm.key.bias, z), value_bias=_heads(farm.value.bias, z), read=read,
        b_gate=jnp.pad(farm.b_gate, (0, QV - z.Q)), mix=jnp.pad(farm.mix.weight, ((0, PV - P), (0, PV - P))),
        mix_bias=jnp.pad(farm.mix.bias, (0, PV - P)), lstm=lstm,
        lstm_bias=jnp.pad(farm.lstm.linear.bias.reshape(n, 4, d), ((0, 0), (0, 0), (0, z.DP - d))))


def pad_inputs(inputs, first, z: Dims) -> Inputs:
    """farm_fast.Inputs [B, T, ...] and first [B, T] -> Inputs [T, R, ...] (padded rows start an episode at every step)."""
    b = first.shape[0]
    rows = lambda x: jnp.pad(jnp.swapaxes(x, 0, 1), [(0, 0), (0, z.R - b)] + [(0, 0)] * (x.ndim - 2))  # noqa: E731
    pv = z.PV - z.P
    return Inputs(
        query=rows(_heads(inputs.query, z)),
        gate=rows(jnp.pad(inputs.gate, [(0, 0)] * 3 + [(0, pv)])),
        pixels=rows(jnp.pad(inputs.pixels, [(0, 0)] * 2 + [(0, z.HWP - z.HW), (0, pv)])),
        vector=rows(jnp.pad(inputs.vector, [(0, 0), (0, 0), (z.D, z.QV - z.Q)])),
        keep=jnp.pad(jnp.swapaxes(1.0 - first.astype(jnp.float32), 0, 1), ((0, 0), (0, z.R - b))))


# --------------------------------------------------------------------------------------------------- the kernels
def _i(x):
    """An index as a traced int32 (Pallas' interpreter rejects Python ints; a traced start also lets a masked
    window pass an array's end there)."""
    return jnp.asarray(x, jnp.int32)


def _dot(a, b, precision, trans_a=False, trans_b=False):
    """a @ b (a^T, b^T where asked) with float32 accumulation."""
    return jax.lax.dot_general(a, b, (((0 if trans_a else 1,), (1 if trans_b else 0,)), ((), ())),
                               precision=precision, preferred_element_type=jnp.float32)


def _sigmoid(x):
    return 1.0 / (1.0 + jnp.exp(-x))


def _rows(z: Dims):
    return pl.ds(0, z.R)


def _attend_inputs_kernel(t_ref, keep_ref, hs_ref, ws_ref, y_in, y_out, *, z: Dims, precision):
    """1. y[t, :, j, block] = (h_{t-1}^j reset) @ W_state[:, block]: program (module j, column block)."""
    del y_in
    t, j, nb = t_ref[...], pl.program_id(0), pl.program_id(1)
    keep = _load(keep_ref, (t, _rows(z)))[:, None]

    def chunk(c, acc):
        h = _load(hs_ref, (t, _rows(z), j, pl.ds(c * z.C, z.C))) * keep
        return acc + _dot(h, _load(ws_ref, (pl.ds(c * z.C, z.C), pl.ds(nb * z.BN, z.BN))), precision)

    acc = jax.lax.fori_loop(0, z.NJ, chunk, jnp.zeros((z.R, z.BN), jnp.float32))
    _store(y_out, (t, _rows(z), j, pl.ds(nb * z.BN, z.BN)), acc)


def _attention(t, k, y_ref, q_ref, kb_ref, vb_ref, wr_ref, z: Dims, precision):
    """Module k's inter-module attention over [h^1 .. h^n; 0] from y: per head the softmax weights p_j [R] (j = n
    is the zero row), and the read's two linear maps (W_g m, W_o m) [R, QV]."""
    rows, inv = _rows(z), 1.0 / math.sqrt(z.D)
    probs, g_out, o_out = [], jnp.zeros((z.R, z.QV), jnp.float32), jnp.zeros((z.R, z.QV), jnp.float32)
    for head in range(z.H):
        def logit_chunk(c, logits):
            col = head * z.DP + c * z.C
            query = _load(y_ref, (t, rows, k, pl.ds(col, z.C))) + _load(q_ref, (t, rows, pl.ds(col, z.C)))
            key_bias = _load(kb_ref, (pl.ds(col, z.C),))[None]
            keys = [_load(y_ref, (t, rows, _i(j), pl.ds(z.HD + col, z.C))) + key_bias for j in range(z.N)]
            return tuple(lg + jnp.sum(query * key, axis=1) for lg, key in zip(logits, keys + [key_bias]))

        logits = jax.lax.fori_loop(0, z.NJ, logit_chunk, (jnp.zeros((z.R,), jnp.float32),) * (z.N + 1))
        logits = [lg * inv for lg in logits]
        top = logits[0]
        for lg in logits[1:]:
            top = jnp.maximum(top, lg)
        weights = [jnp.exp(lg - top) for lg in logits]
        total = sum(weights[1:], weights[0])
        p = [w / total for w in weights]
        probs.append(p)

        def read_chunk(c, acc):
            col = head * z.DP + c * z.C
            value_bias = _load(vb_ref, (pl.ds(col, z.C),))[None]
            read = p[z.N][:, None] * value_bias
            for j in range(z.N):
                read = read + p[j][:, None] * (_load(y_ref, (t, rows, _i(j), pl.ds(2 * z.HD + col, z.C))) + value_bias)
            w_g = _load(wr_ref, (pl.ds(col, z.C), pl.ds(0, z.QV)))
            w_o = _load(wr_ref, (pl.ds(col, z.C), pl.ds(z.QV, z.QV)))
            return acc[0] + _dot(read, w_g, precision), acc[1] + _dot(read, w_o, precision)

        g_out, o_out = jax.lax.fori_loop(0, z.NJ, read_chunk, (g_out, o_out))
    return probs, g_out, o_out


def _own_gate(t, k, y_ref, gin_ref, z: Dims):
    """Module k's feature-attention gate before the sigmoid [R, PV]."""
    rows = _rows(z)
    return (_load(y_ref, (t, rows, k, pl.ds(3 * z.HD + k * z.PV, z.PV)))
            + _load(gin_ref, (t, rows, k, pl.ds(0, z.PV))))


def _attend_kernel(t_ref, keep_ref, hs_ref, y_ref, q_ref, gin_ref, pix_ref, vec_ref, kb_ref, vb_ref, wr_ref, bg_ref,
                   mix_ref, mixb_ref, x_in, x_out, *, z: Dims, precision):
    """2. Module k's LSTM input x = [u; z; h] (program k): attention (3 in common/farm.py), feature gating (2)."""
    del x_in
    t, k = t_ref[...], pl.program_id(0)
    rows, zero = _rows(z), k * 0
    keep = _load(keep_ref, (t, rows))[:, None]
    _, g_out, o_out = _attention(t, k, y_ref, q_ref, kb_ref, vb_ref, wr_ref, z, precision)
    qcols = jnp.arange(z.QV)[None, :]
    h_q = _load(hs_ref, (t, rows, k, pl.ds(zero, z.QV)), mask=qcols < z.D) * keep  # h^k in the query's columns
    b_gate = _load(bg_ref, (pl.ds(0, z.QV),))[None]
    u = h_q + _load(vec_ref, (t, rows, pl.ds(0, z.QV))) + _sigmoid(g_out - b_gate) * jnp.tanh(o_out)
    _store(x_out, (t, rows, k, pl.ds(zero, z.QV)), u, mask=qcols < z.Q)

    gate = _sigmoid(_own_gate(t, k, y_ref, gin_ref, z))  # [R, PV]
    pixels = _load(pix_ref, (t, rows, pl.ds(0, z.HWP), pl.ds(0, z.PV)))  # [R, HWP, PV]
    gated = (pixels * gate[:, None, :]).reshape(z.R * z.HWP, z.PV)
    mix = _load(mix_ref, (pl.ds(0, z.PV), pl.ds(0, z.PV)))
    feat = _dot(gated, mix, precision, trans_b=True) + _load(mixb_ref, (pl.ds(0, z.PV),))[None]
    zcols = jnp.arange(z.HWP * z.PV)[None, :]
    _store(x_out, (t, rows, k, pl.ds(zero + z.Q, z.HWP * z.PV)), feat.reshape(z.R, z.HWP * z.PV),
           mask=zcols < z.HW * z.PV)
    hcols = jnp.arange(z.HV)[None, :]
    h = _load(hs_ref, (t, rows, k, pl.ds(zero, z.HV)), mask=hcols < z.D) * keep
    _store(x_out, (t, rows, k, pl.ds(zero + z.Q + z.HW * z.PV, z.HV)), h, mask=hcols < z.D)


def _lstm_kernel(t_ref, keep_ref, x_ref, wl_ref, bl_ref, hs_in, cs_in, pre_in, hs_out, cs_out, pre_out, *,
                 z: Dims, precision, bf16: bool):
    """3. Module k's LSTM, hidden units of block jb (program (k, jb)): gates (i, g, f, o) = W x + b, then the cell."""
    del hs_in, pre_in
    t, k, jb = t_ref[...], pl.program_id(0), pl.program_id(1)
    rows, block = _rows(z), pl.ds(jb * z.C, z.C)
    cols = jnp.arange(z.BK)[None, :]

    def chunk(kb, acc):
        x = _load(x_ref, (t, rows, k, pl.ds(kb * z.BK, z.BK)), mask=kb * z.BK + cols < z.LX)
        if bf16:
            x = x.astype(jnp.bfloat16)
        return tuple(a + _dot(x, _load(wl_ref, (k, _i(g), block, pl.ds(kb * z.BK, z.BK))), precision, trans_b=True)
                     for g, a in enumerate(acc))

    acc = jax.lax.fori_loop(0, z.NK, chunk, (jnp.zeros((z.R, z.C), jnp.float32),) * 4)
    pre = [a + _load(bl_ref, (k, _i(g), block))[None] for g, a in enumerate(acc)]
    keep = _load(keep_ref, (t, rows))[:, None]
    c_prev = _load(cs_in, (t, rows, k, block)) * keep
    c = _sigmoid(pre[2] + 1.0) * c_prev + _sigmoid(pre[0]) * jnp.tanh(pre[1])
    _store(cs_out, (t + 1, rows, k, block), c)
    _store(hs_out, (t + 1, rows, k, block), _sigmoid(pre[3]) * jnp.tanh(c))
    for g in range(4):
        _store(pre_out, (t, rows, k, _i(g), block), pre[g])


def _lstm_bwd_kernel(t_ref, keep_ref, pre_ref, cs_ref, dh_ref, dcl_ref, wl_ref, dx_in, dg_in, dc_in, dx_out, dg_out,
                     dc_out, *, z: Dims, precision, bf16: bool):
    """4. Program (module k, column block kb): dgates of step t from the cotangents of its outputs, and
    dx[:, k, block] = sum_g dgates_g @ W_g[:, block]; the kb == 0 programs also write dgates and the cotangent of
    c_{t-1} (reset where the step starts an episode, plus the loss's own cotangent of c_{t-1})."""
    del dx_in, dg_in
    t, k, kb = t_ref[...], pl.program_id(0), pl.program_id(1)
    rows = _rows(z)
    keep = _load(keep_ref, (t, rows))[:, None]

    def dgates(jb):
        block = pl.ds(jb * z.C, z.C)
        pi, pg, pf, po = (_load(pre_ref, (t, rows, k, _i(g), block)) for g in range(4))
        c_prev = _load(cs_ref, (t, rows, k, block)) * keep
        dh, dc = _load(dh_ref, (t + 1, rows, k, block)), _load(dc_in, (t + 1, rows, k, block))
        si, tg, sf, so = _sigmoid(pi), jnp.tanh(pg), _sigmoid(pf + 1.0), _sigmoid(po)
        tc = jnp.tanh(sf * c_prev + si * tg)
        dct = dc + dh * so * (1.0 - tc * tc)
        grads = (dct * tg * si * (1.0 - si), dct * si * (1.0 - tg * tg), dct * c_prev * sf * (1.0 - sf),
                 dh * tc * so * (1.0 - so))
        return grads, dct * sf

    def chunk(jb, acc):
        grads, _ = dgates(jb)
        for g in range(4):
            w = _load(wl_ref, (k, _i(g), pl.ds(jb * z.C, z.C), pl.ds(kb * z.BK, z.BK)))
            dg = grads[g].astype(jnp.bfloat16) if bf16 else grads[g]
            acc = acc + _dot(dg, w, precision)
        return acc

    dx = jax.lax.fori_loop(0, z.NJ, chunk, jnp.zeros((z.R, z.BK), jnp.float32))
    _store(dx_out, (t, rows, k, pl.ds(kb * z.BK, z.BK)), dx)

    @pl.when(kb == 0)
    def _():
        first_step = t == 0
        previous = jnp.maximum(t - 1, 0)

        def write(jb, carry):
            grads, dc_prev = dgates(jb)
            block = pl.ds(jb * z.C, z.C)
            for g in range(4):
                _store(dg_out, (t, rows, k, _i(g), block), grads[g])
            loss = jnp.where(first_step, 0.0, _load(dcl_ref, (previous, rows, k, block)))
            _store(dc_out, (t, rows, k, block), dc_prev * keep + loss)
            return carry

        jax.lax.fori_loop(0, z.NJ, write, 0)


def _attend_bwd_kernel(t_ref, y_ref, dx_ref, q_ref, gin_ref, pix_ref, kb_ref, vb_ref, wr_ref, bg_ref, mix_ref,
                       kvp_in, dq_in, dgate_in, dgo_in, read_in, zrow_in, dpix_in, dmix_in,
                       kvp_out, dq_out, dgate_out, dgo_out, read_out, zrow_out, dpix_out, dmix_out, *, z: Dims,
                       precision):
    """5. Module k's attention and feature gating backward (program k), from du and dz (x's cotangent). Writes the
    cotangents of its query and gate (dq, dgate), of every module's key and value as module k read them (kvp[k]:
    summed over k by attend_inputs_bwd), of the zero row (summed over rows: the biases), and for the weight
    gradients after the loop: the read m and d(W_g m, W_o m), the pixels' cotangent and mix's gradient."""
    del kvp_in, dq_in, dgate_in, dgo_in, read_in, zrow_in, dpix_in, dmix_in
    t, k = t_ref[...], pl.program_id(0)
    rows, zero, inv = _rows(z), k * 0, 1.0 / math.sqrt(z.D)
    probs, g_out, o_out = _attention(t, k, y_ref, q_ref, kb_ref, vb_ref, wr_ref, z, precision)
    qcols = jnp.arange(z.QV)[None, :]
    du = _load(dx_ref, (t, rows, k, pl.ds(zero, z.QV)), mask=qcols < z.Q)
    s_g = _sigmoid(g_out - _load(bg_ref, (pl.ds(0, z.QV),))[None])
    t_o = jnp.tanh(o_out)
    d_g = du * t_o * s_g * (1.0 - s_g)
    d_o = du * s_g * (1.0 - t_o * t_o)
    _store(dgo_out, (t, rows, k, pl.ds(0, z.QV)), d_g)
    _store(dgo_out, (t, rows, k, pl.ds(z.QV, z.QV)), d_o)

    for head in range(z.H):
        p = probs[head]

        def read_chunk(c, dp):
            """d(read) of this chunk; the read itself; the values' cotangents; dp_j += d(read) . value_j"""
            col = head * z.DP + c * z.C
            w_g = _load(wr_ref, (pl.ds(col, z.C), pl.ds(0, z.QV)))
            w_o = _load(wr_ref, (pl.ds(col, z.C), pl.ds(z.QV, z.QV)))
            d_read = _dot(d_g, w_g, precision, trans_b=True) + _dot(d_o, w_o, precision, trans_b=True)  # [R, C]
            value_bias = _load(vb_ref, (pl.ds(col, z.C),))[None]
            values = [_load(y_ref, (t, rows, _i(j), pl.ds(2 * z.HD + col, z.C))) + value_bias for j in range(z.N)]
            values.append(jnp.broadcast_to(value_bias, (z.R, z.C)))
            read = p[0][:, None] * values[0]
            for j in range(1, z.N + 1):
                read = read + p[j][:, None] * values[j]
            _store(read_out, (t, rows, k, pl.ds(col, z.C)), read)
            for j in range(z.N):
                _store(kvp_out, (k, rows, _i(j), pl.ds(z.HD + col, z.C)), p[j][:, None] * d_read)
            _store(zrow_out, (t, k, pl.ds(z.HD + col, z.C)), jnp.sum(p[z.N][:, None] * d_read, axis=0))
            return tuple(a + jnp.sum(d_read * v, axis=1) for a, v in zip(dp, values))

        dp = jax.lax.fori_loop(0, z.NJ, read_chunk, (jnp.zeros((z.R,), jnp.float32),) * (z.N + 1))
        mean = p[0] * dp[0]
        for j in range(1, z.N + 1):
            mean = mean + p[j] * dp[j]
        d_logits = [p[j] * (dp[j] - mean) * inv for j in range(z.N + 1)]

        def key_chunk(c, carry):
            """the query's and the keys' cotangents: logit_j = q . key_j / sqrt(d)"""
            col = head * z.DP + c * z.C
            query = _load(y_ref, (t, rows, k, pl.ds(col, z.C))) + _load(q_ref, (t, rows, pl.ds(col, z.C)))
            key_bias = _load(kb_ref, (pl.ds(col, z.C),))[None]
            dq = d_logits[z.N][:, None] * key_bias
            for j in range(z.N):
                key = _load(y_ref, (t, rows, _i(j), pl.ds(z.HD + col, z.C))) + key_bias
                dq = dq + d_logits[j][:, None] * key
                _store(kvp_out, (k, rows, _i(j), pl.ds(col, z.C)), d_logits[j][:, None] * query)
            _store(dq_out, (t, rows, k, pl.ds(col, z.C)), dq)
            _store(zrow_out, (t, k, pl.ds(col, z.C)), jnp.sum(d_logits[z.N][:, None] * query, axis=0))
            return carry

        jax.lax.fori_loop(0, z.NJ, key_chunk, 0)

    # 2. feature gating: z = (pixels * sigmoid(gate)) mix^T + b
    gate = _sigmoid(_own_gate(t, k, y_ref, gin_ref, z))
    pixels = _load(pix_ref, (t, rows, pl.ds(0, z.HWP), pl.ds(0, z.PV)))
    gated = (pixels * gate[:, None, :]).reshape(z.R * z.HWP, z.PV)
    zcols = jnp.arange(z.HWP * z.PV)[None, :]
    dz = _load(dx_ref, (t, rows, k, pl.ds(zero + z.Q, z.HWP * z.PV)), mask=zcols < z.HW * z.PV)
    dz = dz.reshape(z.R * z.HWP, z.PV)
    mix = _load(mix_ref, (pl.ds(0, z.PV), pl.ds(0, z.PV)))
    d_gated = _dot(dz, mix, precision).reshape(z.R, z.HWP, z.PV)
    d_gate = jnp.sum(d_gated * pixels, axis=1)
    _store(dgate_out, (t, rows, k, pl.ds(0, z.PV)), d_gate * gate * (1.0 - gate))
    _store(dpix_out, (t, rows, k, pl.ds(0, z.HWP), pl.ds(0, z.PV)), d_gated * gate[:, None, :])
    _store(dmix_out, (t, k, pl.ds(0, z.PV), pl.ds(0, z.PV)), _dot(dz, gated, precision, trans_a=True))


def _attend_inputs_bwd_kernel(t_ref, keep_ref, kvp_ref, dq_ref, dgate_ref, dx_ref, dhl_ref, ws_ref, dh_in, dkv_in,
                              dh_out, dkv_out, *, z: Dims, precision):
    """6. Program (module j, block jb of hidden units): the cotangent of h_{t-1}^j = (dy_j @ W_state^T + du_j's h part
    + dx_j's h part) reset where the step starts an episode, plus the loss's own cotangent of h_{t-1}^j. dy_j sums
    the keys' and values' cotangents over the modules that read them; the jb == 0 programs keep that sum (dkv)."""
    del dh_in, dkv_in
    t, j, jb = t_ref[...], pl.program_id(0), pl.program_id(1)
    rows, block = _rows(z), pl.ds(jb * z.C, z.C)
    acc = jnp.zeros((z.R, z.C), jnp.float32)

    def q_chunk(c, acc):
        dq = _load(dq_ref, (t, rows, j, pl.ds(c * z.C, z.C)))
        return acc + _dot(dq, _load(ws_ref, (block, pl.ds(c * z.C, z.C))), precision, trans_b=True)

    acc = jax.lax.fori_loop(0, z.HD // z.C, q_chunk, acc)
    first_block = jnp.full((z.R, z.C), jb == 0)

    def kv_chunk(c, acc):
        dkv = _load(kvp_ref, (_i(0), rows, j, pl.ds(c * z.C, z.C)))
        for k in range(1, z.N):
            dkv = dkv + _load(kvp_ref, (_i(k), rows, j, pl.ds(c * z.C, z.C)))
        _store(dkv_out, (t, rows, j, pl.ds(c * z.C, z.C)), dkv, mask=first_block)
        return acc + _dot(dkv, _load(ws_ref, (block, pl.ds(z.HD + c * z.C, z.C))), precision, trans_b=True)

    acc = jax.lax.fori_loop(0, 2 * z.HD // z.C, kv_chunk, acc)
    d_gate = _load(dgate_ref, (t, rows, j, pl.ds(0, z.PV)))
    acc = acc + _dot(d_gate, _load(ws_ref, (block, pl.ds(3 * z.HD + j * z.PV, z.PV))), precision, trans_b=True)
    cols = jb * z.C + jnp.arange(z.C)[None, :]
    direct = (_load(dx_ref, (t, rows, j, pl.ds(jb * z.C, z.C)), mask=cols < z.D)
              + _load(dx_ref, (t, rows, j, pl.ds(z.Q + z.HW * z.PV + jb * z.C, z.C)), mask=cols < z.D))
    keep = _load(keep_ref, (t, rows))[:, None]
    loss = jnp.where(t == 0, 0.0, _load(dhl_ref, (jnp.maximum(t - 1, 0), rows, j, block)))
    _store(dh_out, (t, rows, j, block), (acc + direct) * keep + loss)


# ------------------------------------------------------------------------------------------------- the loops
def _call(kernel, grid, inputs, outputs, aliased_from: int, cfg: Config, name: str):
    """pallas_call whose outputs update, in place, the buffers passed as its last len(outputs) inputs."""
    return pl.pallas_call(
        kernel, out_shape=[jax.ShapeDtypeStruct(o.shape, o.dtype) for o in outputs], grid=grid,
        input_output_aliases={aliased_from + i: i for i in range(len(outputs))}, interpret=cfg.interpret, name=name,
        compiler_params=None if cfg.interpret else plt.CompilerParams(num_warps=cfg.num_warps,
                                                                      num_stages=cfg.num_stages),
    )(*inputs, *outputs)


def _precision():
    """Dots follow jax.default_matmul_precision, like XLA's: "highest" (or float32) asks for float32 dots."""
    setting = str(jax.config.jax_default_matmul_precision or "").lower()
    return jax.lax.Precision.HIGHEST if setting in ("highest", "float32", "f32_f32_f32") else None


def _forward(cfg: Config, z: Dims, w: Weights, x: Inputs, h0, c0):
    """The forward loop: states hs, cs [T + 1, R, n, DP] (slot 0: the initial state) and the residuals y [T, R, n, Y],
    x [T, R, n, LPX], the gates' pre-activations [T, R, n, 4, DP]."""
    steps = x.keep.shape[0]
    precision = _precision()
    kw = dict(z=z, precision=precision)
    state = lambda s0: jnp.zeros((steps + 1,) + s0.shape, jnp.float32).at[0].set(s0)  # noqa: E731
    buffers = (state(h0), state(c0), jnp.zeros((steps, z.R, z.N, z.Y), jnp.float32),
               jnp.zeros((steps, z.R, z.N, z.LPX), jnp.float32), jnp.zeros((steps, z.R, z.N, 4, z.DP), jnp.float32))

    def step(t, buffers):
        hs, cs, y, xs, pre = buffers
        t = jnp.asarray(t, jnp.int32)
        (y,) = _call(partial(_attend_inputs_kernel, **kw), (z.N, z.Y // z.BN), (t, x.keep, hs, w.state), (y,), 4,
                     cfg, "farm_attend_inputs")
        (xs,) = _call(partial(_attend_kernel, **kw), (z.N,),
                      (t, x.keep, hs, y, x.query, x.gate, x.pixels, x.vector, w.key_bias, w.value_bias, w.read,
                       w.b_gate, w.mix, w.mix_bias), (xs,), 14, cfg, "farm_attend")
        hs, cs, pre = _call(partial(_lstm_kernel, bf16=cfg.lstm_bf16, **kw), (z.N, z.NJ),
                            (t, x.keep, xs, w.lstm, w.lstm_bias), (hs, cs, pre), 5, cfg, "farm_lstm")
        return hs, cs, y, xs, pre

    return jax.lax.fori_loop(0, steps, step, buffers)


def _backward(cfg: Config, z: Dims, w: Weights, x: Inputs, residuals, d_hs, d_cs):
    """The backward loop over the steps in reverse, then every parameter's and input's gradient as one contraction
    over all steps and rows."""
    hs, cs, y, xs, pre = residuals
    steps = x.keep.shape[0]
    kw = dict(z=z, precision=_precision())
    f32 = jnp.float32
    zeros = lambda *shape: jnp.zeros(shape, f32)  # noqa: E731
    state = zeros(steps + 1, z.R, z.N, z.DP)
    buffers = dict(
        dh=state.at[steps].set(d_hs[-1]), dc=state.at[steps].set(d_cs[-1]),
        dx=zeros(steps, z.R, z.N, z.LPX), dg=zeros(steps, z.R, z.N, 4, z.DP),
        kvp=zeros(z.N, z.R, z.N, 2 * z.HD), dq=zeros(steps, z.R, z.N, z.HD), dgate=zeros(steps, z.R, z.N, z.PV),
        dgo=zeros(steps, z.R, z.N, 2 * z.QV), read=zeros(steps, z.R, z.N, z.HD), zrow=zeros(steps, z.N, 2 * z.HD),
        dpix=zeros(steps, z.R, z.N, z.HWP, z.PV), dmix=zeros(steps, z.N, z.PV, z.PV),
        dkv=zeros(steps, z.R, z.N, 2 * z.HD))

    def step(i, b):
        t = jnp.asarray(steps - 1 - i, jnp.int32)
        dx, dg, dc = _call(partial(_lstm_bwd_kernel, bf16=cfg.lstm_bf16, **kw), (z.N, z.NK),
                           (t, x.keep, pre, cs, b["dh"], d_cs, w.lstm), (b["dx"], b["dg"], b["dc"]), 7, cfg,
                           "farm_lstm_bwd")
        names = ("kvp", "dq", "dgate", "dgo", "read", "zrow", "dpix", "dmix")
        out = _call(partial(_attend_bwd_kernel, **kw), (z.N,),
                    (t, y, dx, x.query, x.gate, x.pixels, w.key_bias, w.value_bias, w.read, w.b_gate, w.mix),
                    tuple(b[n] for n in names), 11, cfg, "farm_attend_bwd")
        b = b | dict(zip(names, out)) | dict(dx=dx, dg=dg, dc=dc)
        dh, dkv = _call(partial(_attend_inputs_bwd_kernel, **kw), (z.N, z.NJ),
                        (t, x.keep, b["kvp"], b["dq"], b["dgate"], dx, d_hs, w.state), (b["dh"], b["dkv"]), 8, cfg,
                        "farm_attend_inputs_bwd")
        return b | dict(dh=dh, dkv=dkv)

    b = jax.lax.fori_loop(0, steps, step, buffers)

    # weight gradients: one contraction each over every step and row (padded rows have zero cotangents)
    h_prev = hs[:-1] * x.keep[:, :, None, None]  # the states each step read, reset
    dy_gates = jnp.einsum("trnd,trnp->ndp", h_prev, b["dgate"])  # module k's gate reads h^k only
    d_state = jnp.concatenate([jnp.einsum("trnd,trnq->dq", h_prev, b["dq"]),
                               jnp.einsum("trnd,trnq->dq", h_prev, b["dkv"]),
                               jnp.transpose(dy_gates, (1, 0, 2)).reshape(z.DP, z.N * z.PV)], axis=1)
    d_state = jnp.pad(d_state, ((0, 0), (0, z.Y - d_state.shape[1])))
    d_bias = b["dkv"].sum((0, 1, 2)) + b["zrow"].sum((0, 1))
    lx = (jnp.arange(z.LP) < z.LX).astype(f32)
    d_lstm = jnp.einsum("trngj,trni->ngji", b["dg"], xs[..., :z.LP] * lx)
    dz = b["dx"][..., z.Q:z.Q + z.HW * z.PV].reshape(steps, z.R, z.N, z.HW, z.PV)
    d_weights = Weights(
        state=d_state, key_bias=d_bias[:z.HD], value_bias=d_bias[z.HD:],
        read=jnp.einsum("trnh,trnq->hq", b["read"], b["dgo"]), b_gate=-b["dgo"][..., :z.QV].sum((0, 1, 2)),
        mix=b["dmix"].sum((0, 1)), mix_bias=dz.sum((0, 1, 2, 3)), lstm=d_lstm.astype(w.lstm.dtype),
        lstm_bias=b["dg"].sum((0, 1)))
    ucols = (jnp.arange(z.QV) < z.Q).astype(f32)
    d_inputs = Inputs(query=b["dq"].sum(2), gate=b["dgate"], pixels=b["dpix"].sum(2),
                      vector=b["dx"][..., :z.QV].sum(2) * ucols, keep=jnp.zeros_like(x.keep))
    return d_weights, d_inputs, b["dh"][0], b["dc"][0]


@partial(jax.custom_vjp, nondiff_argnums=(0, 1))
def _unroll(cfg: Config, z: Dims, w: Weights, x: Inputs, h0, c0):
    hs, cs, *_ = _forward(cfg, z, w, x, h0, c0)
    return hs[1:], cs[1:]


def _unroll_fwd(cfg, z, w, x, h0, c0):
    residuals = _forward(cfg, z, w, x, h0, c0)
    return (residuals[0][1:], residuals[1][1:]), (w, x, residuals)


def _unroll_bwd(cfg, z, saved, cotangents):
    w, x, residuals = saved
    return _backward(cfg, z, w, x, residuals, *cotangents)


_unroll.defvjp(_unroll_fwd, _unroll_bwd)


# --------------------------------------------------------------------------------------------- the entry points
def unroll_batch(farm, inputs, first, state, cfg: Config):
    """FARM over a batch of sequences: inputs farm_fast.Inputs [B, T, ...], first [B, T], state (h, c) [B, n, d] ->
    (h, c) [B, T, n, d], resetting to zeros before steps where first holds. The same function as common/farm.py's
    FARM.step in a loop (up to float rounding)."""
    batch = first.shape[0]
    z = dims_of(farm, batch, cfg)
    pad = lambda s: jnp.pad(s, ((0, z.R - batch), (0, 0), (0, z.DP - z.D)))  # noqa: E731
    hs, cs = _unroll(cfg, z, pad_weights(farm, z, cfg), pad_inputs(inputs, first, z), pad(state[0]), pad(state[1]))
    unpad = lambda s: jnp.swapaxes(s[:, :batch, :, :z.D], 0, 1)  # noqa: E731
    return unpad(hs), unpad(cs)


def unroll_sequence(farm, inputs, first, state, cfg: Config):
    """FARM along one sequence: inputs farm_fast.Inputs [T, ...], first [T], state (h, c) [n, d] -> (h, c) [T, n, d].
    Under a vmap over sequences (the learner's batch, the actors' envs) the sequences become the kernels' rows;
    see the module's docstring for the one limit this implies."""
    arrays, static = eqx.partition(farm, eqx.is_array)

    @custom_vmap
    def one(arrays, inputs, first, state):
        batched = jax.tree.map(lambda a: a[None], (inputs, first, state))
        out = unroll_batch(eqx.combine(arrays, static), *batched, cfg)
        return jax.tree.map(lambda a: a[0], out)

    @one.def_vmap
    def _rule(axis_size, in_batched, arrays, inputs, first, state):
        weights_batched, *rest = in_batched
        spread = lambda x, b: x if b else jnp.broadcast_to(x, (axis_size,) + x.shape)  # noqa: E731
        data = tuple(jax.tree.map(spread, x, b) for x, b in zip((inputs, first, state), rest))
        if not any(jax.tree.leaves(weights_batched)):  # the usual case: one network, many sequences
            out = unroll_batch(eqx.combine(arrays, static), *data, cfg)
        else:  # a network per sequence (e.g. vmapped over seeds at this level): each its own batch of one
            arrays = jax.tree.map(spread, arrays, weights_batched)
            batch_of_one = lambda a, *d: jax.tree.map(  # noqa: E731
                lambda o: o[0], unroll_batch(eqx.combine(a, static), *jax.tree.map(lambda x: x[None], d), cfg))
            out = jax.vmap(batch_of_one)(arrays, *data)
        return out, jax.tree.map(lambda _: True, out)

    return one(arrays, inputs, first, state)
