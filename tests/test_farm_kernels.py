"""The `pallas` FARM backend (common/farm_pallas.py) against the plain FARM (common/farm.py's FARM.step in a
lax.scan), in Pallas' interpreter: the states, and every parameter's, input's and stored state's gradient, on random
inputs with episode starts at random steps (the first included) and random stored states, at the sizes of every
script (tests/farm_cases.py); planted bugs in each kernel make it fail; every kernel lowers for CUDA (Triton) at
every script's shapes, forward and backward, under a vmap over seeds, without a GPU.

This file needs only common/ and msfa_babyai.py, so that it also runs where procgen and NLE are not installed. The
other scripts' SGD steps: tests/test_farm_kernels_scripts.py.

Measured in interpret mode (float32 on the CPU): states <= 3e-7 under jax 0.6.2, <= 3e-6 under jax 0.10.2 (the Impala
sizes); gradients <= 1e-6 relative.
"""

from __future__ import annotations

import contextlib
import re

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from common import farm_pallas
from farm_cases import CORES, MAP_SHAPES, STATE_TOLERANCE, compare, mutated, random_case, within, worst

@pytest.mark.parametrize("name", list(CORES))
def test_the_kernels_compute_farm(name):
    state_error, rows, scale = compare(name, "pallas")
    print(f"{name}: states max |pallas - plain| {state_error:.1e}; {len(rows)} gradient leaves, worst against its "
          f"bound {worst(rows, scale)}")
    assert state_error <= STATE_TOLERANCE
    assert within(rows, scale), [r for r in rows if not within([r], scale)]


def test_bfloat16_weights_are_close_but_not_exact():
    """pallas-bf16: the LSTMs' weight in bfloat16 is a different function (~1e-3 relative), never the default."""
    state_error, _, _ = compare("msfa_babyai", "pallas-bf16", gradients=False)
    print(f"pallas-bf16: states max |bf16 - plain| {state_error:.1e}")
    assert 1e-5 < state_error < 5e-2


# --------------------------------------------------------------------------------------------------- planted bugs
PLANTED = {  # kernel: (the source text, its replacement): each must break the comparison (the forward kernels'
    #          bugs show in the states, the backward kernels' in the gradients)
    "attend_inputs (missing reset)": ("h = _load(hs_ref, (t, _rows(z), j, pl.ds(c * z.C, z.C))) * keep",
                                      "h = _load(hs_ref, (t, _rows(z), j, pl.ds(c * z.C, z.C)))"),
    "attend (W_g and W_o swapped)": ("w_g = _load(wr_ref, (pl.ds(col, z.C), pl.ds(0, z.QV)))\n            w_o = "
                                     "_load(wr_ref, (pl.ds(col, z.C), pl.ds(z.QV, z.QV)))\n            return",
                                     "w_o = _load(wr_ref, (pl.ds(col, z.C), pl.ds(0, z.QV)))\n            w_g = "
                                     "_load(wr_ref, (pl.ds(col, z.C), pl.ds(z.QV, z.QV)))\n            return"),
    "lstm (transposed gate block)": ("c = _sigmoid(pre[2] + 1.0) * c_prev + _sigmoid(pre[0]) * jnp.tanh(pre[1])",
                                     "c = _sigmoid(pre[1] + 1.0) * c_prev + _sigmoid(pre[0]) * jnp.tanh(pre[2])"),
    "lstm (missing reset)": ("c_prev = _load(cs_in, (t, rows, k, block)) * keep",
                             "c_prev = _load(cs_in, (t, rows, k, block))"),
    "lstm_bwd (transposed gate block)": ("grads = (dct * tg * si * (1.0 - si), dct * si * (1.0 - tg * tg), dct",
                                         "grads = (dct * si * (1.0 - tg * tg), dct * tg * si * (1.0 - si), dct"),
    "attend_bwd (softmax backward without its mean)": ("d_logits = [p[j] * (dp[j] - mean) * inv",
                                                        "d_logits = [p[j] * dp[j] * inv"),
    "attend_inputs_bwd (missing reset)": ("_store(dh_out, (t, rows, j, block), (acc + direct) * keep + loss)",
                                          "_store(dh_out, (t, rows, j, block), (acc + direct) + loss)"),
}


@pytest.mark.parametrize("bug", list(PLANTED))
def test_a_planted_bug_in_each_kernel_fails(bug):
    backward = "_bwd" in bug
    state_error, rows, scale = compare("tiny_odd_projection", "pallas", module=mutated("farm_pallas", *PLANTED[bug]),
                                       gradients=backward)
    if backward:
        assert state_error <= STATE_TOLERANCE and not within(rows, scale)
    else:
        assert state_error > STATE_TOLERANCE


# -------------------------------------------------------------------------------------- lowering for a GPU (Triton)
def lowered_kernels(function, *args) -> list[str]:
    """The Triton kernels of function(*args) lowered for CUDA on this CPU (the names of the custom calls), for an
    H200: Pallas' Triton lowering asks the device's compute capability (jax >= 0.11), here an abstract GPU's."""
    with farm_pallas.overrides(interpret=False), abstract_gpu():
        text = jax.jit(function).trace(*args).lower(lowering_platforms=("cuda",)).as_text()
    return re.findall(r'name = "(farm_[a-z_]+)"', text)


def abstract_gpu():
    """An abstract NVIDIA H200 as the device to lower for (no GPU here); jax before 0.11 needed none."""
    if not hasattr(jax.sharding, "AbstractDevice"):
        return contextlib.nullcontext()
    device = jax.sharding.AbstractDevice(device_kind="NVIDIA H200", num_cores=None, platform="gpu")
    return jax.sharding.use_abstract_mesh(jax.sharding.AbstractMesh((1,), ("gpu",), abstract_device=device))


KERNELS = ["farm_attend", "farm_attend_bwd", "farm_attend_inputs", "farm_attend_inputs_bwd", "farm_lstm",
           "farm_lstm_bwd"]


def seeds(tree, k: int = 2):
    return jax.tree.map(lambda x: jax.ShapeDtypeStruct((k,) + x.shape, x.dtype), tree)


@pytest.mark.parametrize("name", list(CORES))
@pytest.mark.parametrize("backend", ["pallas", "pallas-bf16"])
def test_every_kernel_lowers_for_cuda_forward_and_backward(name, backend):
    """The gradient of a learner-shaped unroll (8 sequences of 41 steps, vmapped; 2 seeds vmapped outside) and an
    acting step (32 envs)."""
    num_actions, n, d, *_ = CORES[name]
    core = random_case(name, batch=1, steps=1, backend=backend)[0]
    arrays, static = eqx.partition(core, eqx.is_array)
    shape = lambda *s: jax.ShapeDtypeStruct(s, jnp.float32)  # noqa: E731
    map_shape = MAP_SHAPES[CORES[name][-1]]
    batch = (shape(8, 41, *map_shape), shape(8, 41, num_actions + 1), jax.ShapeDtypeStruct((8, 41), bool),
             (shape(8, n, d), shape(8, n, d)))

    def learner_gradient(arrays, maps, vectors, first, state):
        def loss(arrays):
            c = eqx.combine(arrays, static)
            h, cell = jax.vmap(c.unroll)(maps, vectors, first, state)
            return jnp.sum(h ** 2) + jnp.sum(cell)
        return jax.grad(loss)(arrays)

    names = lowered_kernels(jax.vmap(learner_gradient), seeds(arrays), *seeds(batch))
    assert sorted(set(names)) == KERNELS and len(names) == 6

    def act(arrays, maps, vectors, state):
        return jax.vmap(eqx.combine(arrays, static).recur)(maps, vectors, state)

    acting = (shape(32, *map_shape), shape(32, num_actions + 1), (shape(32, n, d), shape(32, n, d)))
    assert sorted(lowered_kernels(jax.vmap(act), seeds(arrays), *seeds(acting))) == [
        "farm_attend", "farm_attend_inputs", "farm_lstm"]


def test_the_sgd_step_of_msfa_babyai_lowers_for_cuda_at_the_papers_settings():
    """The whole SGD step (gradient of batch_loss, 10 seeds) as msfa_babyai.py runs it with --core-backend pallas."""
    import msfa_babyai as script
    from benchmarks.sgd_variants import random_batch

    args = script.Args(core_backend="pallas")
    nets = jax.eval_shape(lambda: jax.vmap(lambda k: eqx.filter(script.make_network(args, k), eqx.is_inexact_array))(
        jax.random.split(jax.random.PRNGKey(0), 10)))
    _, static = eqx.partition(script.make_network(args, jax.random.PRNGKey(0)), eqx.is_inexact_array)
    batch = jax.eval_shape(lambda: jax.vmap(lambda k: random_batch(script, args, "babyai", k))(
        jax.random.split(jax.random.PRNGKey(1), 10)))
    probabilities = jax.ShapeDtypeStruct((10, args.batch_size), jnp.float32)
    render = script.make_setup(args).env.rgb_from_symbolic

    def gradient(params, target, batch, probabilities):
        def loss(params):
            return script.batch_loss(eqx.combine(params, static), eqx.combine(target, static), render, batch,
                                     probabilities, args)
        return jax.grad(loss, has_aux=True)(params)

    names = lowered_kernels(jax.vmap(gradient), nets, nets, batch, probabilities)
    assert sorted(names) == sorted(KERNELS + ["farm_attend", "farm_attend_inputs", "farm_lstm"])  # online + target
