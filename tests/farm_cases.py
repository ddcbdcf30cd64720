"""FARM at every script's sizes, random cases, and the comparison of a fast backend with the plain FARM (the
definition, common/farm.py): shared by tests/test_farm_fast.py (`fused`) and tests/test_farm_kernels.py (`pallas`).
Needs only common/ (the newer-jax check of the kernels runs these files alone: docs/learner_speed.md).

Bounds: per gradient leaf, |fast - plain| <= RELATIVE |plain| + ABSOLUTE max_leaf |plain| (the absolute part for
leaves whose exact gradient is 0: FARM's key bias, by the softmax's shift invariance); states within
STATE_TOLERANCE. A planted bug moves the states by 1e-2 or more, or a gradient leaf by more than its bound.
"""

from __future__ import annotations

import functools
import sys
import types
from pathlib import Path

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

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
MODULE_OF_BACKEND = {"fused": "farm_fast", "pallas": "farm_pallas", "pallas-bf16": "farm_pallas"}


def random_case(name: str, batch: int = 3, steps: int = 6, seed: int = 0, backend: str = "plain"):
    """A FARM core (computing with `backend`; random parameters, biases included) and a batch of random sequences:
    the torso's maps, the vectors, episode starts (the first step of sequence 0, others at random), stored states,
    and random cotangents for h and c."""
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
    """The plain FARM's states and gradients of a case."""
    core, data, cotangents = random_case(name)
    with jax.default_matmul_precision("highest"):
        return states_and_gradients(core, data, cotangents)


def compare(name: str, backend: str, module=None, gradients: bool = True):
    """(worst state error, [(leaf, |fast - plain|, |plain|)], largest leaf) of a backend against the plain FARM
    (without gradients: the rows are empty). module: a mutated copy of the backend's module (a planted bug)."""
    core, data, cotangents = random_case(name, backend=backend)
    ref_states, ref_grads = reference(name)
    farm_module, attribute = sys.modules["common.farm"], MODULE_OF_BACKEND[backend]
    saved = getattr(farm_module, attribute)
    if module is not None:
        setattr(farm_module, attribute, module)
    try:
        with jax.default_matmul_precision("highest"):
            states, grads = states_and_gradients(core, data, cotangents, gradients)
    finally:
        setattr(farm_module, attribute, saved)
    state_error = max(float(jnp.max(jnp.abs(a - b))) for a, b in zip(states, ref_states))
    if grads is None:
        return state_error, [], 0.0
    return (state_error,) + gradient_rows(grads, ref_grads)


def gradient_rows(grads, ref_grads):
    """([(leaf, |grads - ref|, |ref|)], the largest leaf's |ref|) of two gradient trees of the same structure."""
    def paths(tree):
        return [jax.tree_util.keystr(p) for p, _ in jax.tree_util.tree_flatten_with_path(tree)[0]]

    assert paths(grads) == paths(ref_grads)  # the same parameters (the backend, a static field, may differ)
    leaves = [(jax.tree_util.keystr(path), np.asarray(a, np.float64), np.asarray(b, np.float64)) for (path, b), a
              in zip(jax.tree_util.tree_flatten_with_path(ref_grads)[0], jax.tree.leaves(grads))]
    rows = [(leaf, float(np.linalg.norm(a - b)), float(np.linalg.norm(b))) for leaf, a, b in leaves]
    return rows, max(r[2] for r in rows)


def within(rows, scale) -> bool:
    return all(diff <= RELATIVE * norm + ABSOLUTE * scale for _, diff, norm in rows)


def worst(rows, scale):
    """The leaf farthest from its bound, as a printable line."""
    name, diff, norm = max(rows, key=lambda r: r[1] / (RELATIVE * r[2] + ABSOLUTE * scale))
    return f"{name}: {diff:.1e} of {norm:.1e}"


def mutated(module_name: str, old: str, new: str):
    """A copy of common/<module_name>.py with the text `old` replaced by `new` (a planted bug)."""
    source = (ROOT / "common" / f"{module_name}.py").read_text()
    assert source.count(old) == 1, f"the planted bug's text is not in common/{module_name}.py once: {old!r}"
    module = types.ModuleType(f"{module_name}_mutated")
    sys.modules[module.__name__] = module  # dataclasses look their module up
    exec(compile(source.replace(old, new), module.__name__, "exec"), module.__dict__)
    return module
