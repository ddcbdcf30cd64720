"""The `pallas` FARM backend (common/farm_pallas.py) against the plain FARM (`xla`, common/farm.py's step in a
lax.scan), in Pallas' interpreter: the states, and every parameter's, input's and stored state's gradient, on random
inputs with episode starts at random steps (the first included) and random stored states, at the sizes of every
script (MSFA's 4 modules on BabyAI, Fruitbot and MiniHack's 3, a single module, a projection that is not a power of
two); planted bugs in each kernel make it fail; every kernel lowers for CUDA (Triton) at every script's shapes,
forward and backward, under a vmap over seeds, without a GPU.

This file needs only common/ and msfa_babyai.py, so that it also runs where procgen and NLE are not installed (the
check under a newer jax: docs/learner_speed.md). The other scripts' SGD steps: tests/test_farm_kernels_scripts.py.

Bounds: per gradient leaf, |pallas - xla| <= RELATIVE |xla| + ABSOLUTE max_leaf |xla| (the absolute part for leaves
whose exact gradient is 0: FARM's key bias, by the softmax's shift invariance); states within STATE_TOLERANCE.
Measured in interpret mode (float32 on the CPU): states <= 3e-7 under jax 0.6.2, <= 3e-6 under jax 0.10.2 (the Impala
sizes); gradients <= 1e-6 relative. A planted bug moves the states by 1e-2 or more.
"""

from __future__ import annotations

import functools
import re
import sys
import types
from pathlib import Path

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from common import farm_pallas
from common.farm import FarmCore

ROOT = Path(__file__).resolve().parent.parent
RELATIVE = 1e-5
ABSOLUTE = 1e-6
STATE_TOLERANCE = 1e-5

# name: (num_actions, modules, module size, heads, projection, torso): each script's FARM at its defaults
CORES = {
    "msfa_babyai": (4, 4, 150, 2, 16, "dqn"),
    "msfa_fruitbot": (15, 4, 60, 2, 16, "impala"),
    "msfa_minihack": (8, 3, 80, 1, 16, "impala"),
    "single_module": (4, 1, 150, 2, 16, "dqn"),
    "tiny_odd_projection": (4, 2, 16, 1, 5, "dqn"),
}
MAP_SHAPES = {"dqn": (5, 5, 16), "impala": (8, 8, 32)}


def random_case(name: str, batch: int = 3, steps: int = 6, seed: int = 0, backend: str = "xla"):
    """A FARM core (computing with `backend`; random parameters, biases included) and a batch of random sequences: the torso's maps, the vectors, episode starts (the first step of
    sequence 0, others at random), stored states, and random cotangents for h and c."""
    num_actions, n, d, heads, projection, torso = CORES[name]
    k = jax.random.split(jax.random.PRNGKey(seed), 8)
    core = FarmCore(num_actions, n, d, heads, projection, k[0], torso=torso, backend=backend)
    leaves, tree = jax.tree.flatten(core)  # every parameter perturbed: biases start at 0, which would hide their paths
    noise = jax.random.split(jax.random.PRNGKey(seed + 1), len(leaves))
    core = jax.tree.unflatten(tree, [x + 0.1 * jax.random.normal(kk, x.shape) if eqx.is_inexact_array(x) else x
                                     for x, kk in zip(leaves, noise)])
    maps = jax.random.normal(k[1], (batch, steps) + MAP_SHAPES[torso])
    vectors = jax.random.normal(k[2], (batch, steps, num_actions + 1))
    first = (jax.random.uniform(k[3], (batch, steps)) < 0.25).at[0, 0].set(True)
    state = (0.5 * jax.random.normal(k[4], (batch, n, d)), 0.5 * jax.random.normal(k[5], (batch, n, d)))
    cotangents = (jax.random.normal(k[6], (batch, steps, n, d)), jax.random.normal(k[7], (batch, steps, n, d)))
    return core, (maps, vectors, first, state), cotangents


def states_and_gradients(core: FarmCore, data, cotangents, gradients: bool = True):
    """The states of the batch (vmapped over sequences, as the learner does) and the gradient of <states,
    cotangents> with respect to the FARM parameters, the maps and vectors, and the stored states (or None)."""
    maps, vectors, first, state = data
    if not gradients:
        return jax.jit(jax.vmap(core.unroll))(maps, vectors, first, state), None

    def loss(farm, maps, vectors, state):
        c = eqx.tree_at(lambda c: c.farm, core, farm)
        states = jax.vmap(c.unroll)(maps, vectors, first, state)
        return sum(jnp.sum(s * ct) for s, ct in zip(states, cotangents)), states

    (_, states), grads = jax.jit(jax.value_and_grad(loss, (0, 1, 2, 3), has_aux=True))(core.farm, maps, vectors,
                                                                                     state)
    return states, grads


@functools.cache
def reference(name: str):
    core, data, cotangents = random_case(name)
    with jax.default_matmul_precision("highest"):
        return states_and_gradients(core, data, cotangents)


def compare(name: str, module=None, backend: str = "pallas", gradients: bool = True):
    """(worst state error, [(leaf, |pallas - xla|, |xla|)], largest leaf) of the kernels against the plain FARM
    (without gradients: the rows are empty)."""
    core, data, cotangents = random_case(name, backend=backend)
    ref_states, ref_grads = reference(name)
    if module is not None:  # a planted bug: the kernels of another (mutated) copy of common/farm_pallas.py
        saved = sys.modules["common.farm"].farm_pallas
        sys.modules["common.farm"].farm_pallas = module
    try:
        with jax.default_matmul_precision("highest"):
            states, grads = states_and_gradients(core, data, cotangents, gradients)
    finally:
        if module is not None:
            sys.modules["common.farm"].farm_pallas = saved
    state_error = max(float(jnp.max(jnp.abs(a - b))) for a, b in zip(states, ref_states))
    if grads is None:
        return state_error, [], 0.0
    leaves = [(jax.tree_util.keystr(path), np.asarray(a, np.float64), np.asarray(b, np.float64)) for (path, b), a
              in zip(jax.tree_util.tree_flatten_with_path(ref_grads)[0], jax.tree.leaves(grads))]
    rows = [(leaf, float(np.linalg.norm(a - b)), float(np.linalg.norm(b))) for leaf, a, b in leaves]
    return state_error, rows, max(r[2] for r in rows)


def within(rows, scale):
    return all(diff <= RELATIVE * norm + ABSOLUTE * scale for _, diff, norm in rows)


@pytest.mark.parametrize("name", list(CORES))
def test_the_kernels_compute_farm(name):
    state_error, rows, scale = compare(name)
    worst = max(rows, key=lambda r: r[1] / (RELATIVE * r[2] + ABSOLUTE * scale))
    print(f"{name}: states max |pallas - xla| {state_error:.1e}; {len(rows)} gradient leaves, worst against its "
          f"bound {worst[0]}: {worst[1]:.1e} of {worst[2]:.1e}")
    assert state_error <= STATE_TOLERANCE
    assert within(rows, scale), [r for r in rows if r[1] > RELATIVE * r[2] + ABSOLUTE * scale]


def test_bfloat16_weights_are_close_but_not_exact():
    """pallas-bf16: the LSTMs' weight in bfloat16 is a different function (~1e-3 relative), never the default."""
    state_error, _, _ = compare("msfa_babyai", backend="pallas-bf16", gradients=False)
    print(f"pallas-bf16: states max |bf16 - xla| {state_error:.1e}")
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


def mutated_kernels(old: str, new: str):
    source = (ROOT / "common" / "farm_pallas.py").read_text()
    assert source.count(old) == 1, f"the planted bug's text is not in common/farm_pallas.py once: {old!r}"
    module = types.ModuleType("farm_pallas_mutated")
    sys.modules[module.__name__] = module  # dataclasses look their module up
    exec(compile(source.replace(old, new), "farm_pallas_mutated", "exec"), module.__dict__)
    return module


@pytest.mark.parametrize("bug", list(PLANTED))
def test_a_planted_bug_in_each_kernel_fails(bug):
    backward = "_bwd" in bug
    state_error, rows, scale = compare("tiny_odd_projection", module=mutated_kernels(*PLANTED[bug]),
                                       gradients=backward)
    if backward:
        assert state_error <= STATE_TOLERANCE and not within(rows, scale)
    else:
        assert state_error > STATE_TOLERANCE


# -------------------------------------------------------------------------------------- lowering for a GPU (Triton)
def lowered_kernels(function, *args) -> list[str]:
    """The Triton kernels of function(*args) lowered for CUDA on this CPU (the names of the custom calls)."""
    with farm_pallas.overrides(interpret=False):
        text = jax.jit(function).trace(*args).lower(lowering_platforms=("cuda",)).as_text()
    return re.findall(r'name = "(farm_[a-z_]+)"', text)


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
