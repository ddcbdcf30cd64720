"""The fused learner (FARM's step split into a hoisted and a recurrent part, every linear map of h in one matmul)
against the learner before it, kept in tests/reference_learner.py: the gradients of every parameter and the
sequences' priorities, on random batches with random episode starts, tasks, rewards and stored states, agree to
float32 rounding for every script and variant."""

import functools
from functools import partial

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import msfa_fruitbot
import msfa_minihack
import reference_learner
import usfa
from common.farm import FarmCore
from common.networks import LSTMCore
from helpers import TINY_MSFA, TINY_USFA, VARIANTS, gradients_and_priorities

RELATIVE = 2e-5
"""per parameter leaf, |new - old| <= RELATIVE |old| + ABSOLUTE max_leaf|old|: float32 rounding over a 9-step
unroll measures ~1e-6 relative here"""
ABSOLUTE = 1e-6
"""for leaves whose exact gradient is 0 (FARM's key bias: softmax is shift-invariant), compared on the scale of the
largest leaf"""

CASES = {name: (script, settings, "babyai") for name, (script, settings, _) in VARIANTS.items()} | {
    "msfa_fruitbot": (msfa_fruitbot, TINY_MSFA, "fruitbot"),
    "msfa_minihack": (msfa_minihack, TINY_MSFA | dict(num_modules=3, attention_heads=1), "minihack"),
    "usfa-learned_fruitbot": (usfa, TINY_USFA | dict(env="fruitbot", learned_cumulants=True), "fruitbot"),
}
@functools.cache
def reference_step(case: str):
    """The old step's gradient and priorities for a case (the script's losses, the old unroll, two loops)."""
    script, settings, env = CASES[case]
    with reference_learner.patched(script):
        return gradients_and_priorities(script, script.Args(**settings), env)


def differences(new, old):
    """[(leaf, |new - old|, |old|)], the largest leaf's |old|, and whether every leaf is within its bound."""
    assert jax.tree.structure(new) == jax.tree.structure(old)
    leaves = [(jax.tree_util.keystr(path), np.asarray(a, np.float64), np.asarray(b, np.float64))
              for (path, b), a in zip(jax.tree_util.tree_flatten_with_path(old)[0], jax.tree.leaves(new))]
    scale = max(np.linalg.norm(b) for _, _, b in leaves)
    rows = [(name, np.linalg.norm(a - b), np.linalg.norm(b)) for name, a, b in leaves]
    within = all(d <= RELATIVE * n + ABSOLUTE * scale for _, d, n in rows)
    return rows, scale, within


def assert_same_step(case: str, **speed_settings):
    script, settings, env = CASES[case]
    grads, priorities = gradients_and_priorities(script, script.Args(**settings | speed_settings), env)
    old_grads, old_priorities = reference_step(case)
    rows, scale, within = differences(grads, old_grads)
    worst = max(rows, key=lambda r: r[1] / (RELATIVE * r[2] + ABSOLUTE * scale))
    print(f"{case} {speed_settings}: {len(rows)} leaves; worst against its bound: {worst[0]} |new - old| "
          f"{worst[1]:.2e}, |old| {worst[2]:.2e} (largest leaf {scale:.2e}); priorities max relative error "
          f"{float(jnp.max(jnp.abs(priorities - old_priorities) / old_priorities)):.2e}")
    assert within, [r for r in rows if r[1] > RELATIVE * r[2] + ABSOLUTE * scale]
    np.testing.assert_allclose(priorities, old_priorities, rtol=RELATIVE)


@pytest.mark.parametrize("case", list(CASES))
def test_the_fused_sgd_step_equals_the_one_before_it(case):
    assert_same_step(case)


@pytest.mark.parametrize("torso", ["dqn", "impala"])
def test_one_fused_step_is_the_papers_farm_step_and_the_lstm_core_step(torso):
    """FarmCore.recur / LSTMCore.recur (acting, final views) against the layer-by-layer steps they replace, from a
    random state and inputs; and a step of the hoisted inputs of a whole sequence equals the single step."""
    k = jax.random.split(jax.random.PRNGKey(0), 6)
    shape = {"dqn": (5, 5, 16), "impala": (8, 8, 32)}[torso]
    maps, vectors = jax.random.normal(k[0], (3,) + shape), jax.random.normal(k[1], (3, 6))
    for core in (FarmCore(5, 3, 8, 2, 4, k[2], torso=torso), LSTMCore(5, 12, k[3], torso=torso)):
        state = jax.tree.map(lambda x: jax.random.normal(k[4], x.shape), core.initial_state())
        new = core.recur(maps[1], vectors[1], state)
        old = reference_learner.core_recur(core, maps[1], vectors[1], state)
        for a, b in zip(new, old):
            np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
        if isinstance(core, FarmCore):  # hoisted for the sequence, step 1 taken
            inputs = jax.tree.map(lambda x: x[1], core.farm.inputs(maps, vectors))
            stepped = core.farm.step(core.farm.weights(), inputs, state)
        else:
            stepped = core.step(core.inputs(maps, vectors)[1], state)
        for a, b in zip(stepped, old):
            np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


def test_the_parameters_keep_their_tree_so_old_checkpoints_and_parameter_files_load():
    """Checkpoints and parameter files hold the networks' parameter trees (and Adam's, of the same tree): every
    script's networks, at the tests' tiny settings and at the paper's, have the paths and shapes recorded by the code
    before the fused step (tests/fixtures/parameter_trees_c004d88.json, written at commit c004d88)."""
    import json
    from pathlib import Path

    import msfa_babyai
    import uvfa

    def tree(net):
        leaves = jax.tree_util.tree_flatten_with_path(eqx.filter(net, eqx.is_inexact_array))[0]
        return [[jax.tree_util.keystr(p), list(x.shape)] for p, x in leaves]

    before = json.loads((Path(__file__).parent / "fixtures" / "parameter_trees_c004d88.json").read_text())
    now = {f"{name} tiny": tree(script.make_network(script.Args(**settings), jax.random.PRNGKey(0)))
           for name, (script, settings, _) in VARIANTS.items()}
    paper = {"msfa_babyai": (msfa_babyai, {}), "msfa_fruitbot": (msfa_fruitbot, {}),
             "msfa_minihack": (msfa_minihack, {}), "usfa-learned_fruitbot": (usfa, dict(env="fruitbot",
                                                                                         learned_cumulants=True)),
             "uvfa-farm_minihack": (uvfa, dict(env="minihack", farm=True))}
    now |= {f"{name} paper": tree(jax.eval_shape(lambda: script.make_network(script.Args(**settings),
                                                                             jax.random.PRNGKey(0))))
            for name, (script, settings) in paper.items()}
    assert now == before
