"""The fused learner (FARM's step split into a hoisted and a recurrent part, the online and target networks in one
loop, the recurrent weight's gradient formed after the loop) against the learner before it, kept in
tests/reference_learner.py: the gradients of every parameter and the sequences' priorities, on random batches with
random episode starts, tasks, rewards and stored states, agree to float32 rounding for every script and variant."""

import functools
import inspect
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
from benchmarks.sgd_variants import random_batch
from common.babyai import GotoAvoid
from common.farm import FarmCore
from common.minihack import render as render_minihack, tile_set
from common.networks import LSTMCore
from helpers import TINY_MSFA, TINY_USFA, VARIANTS

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
RENDER = {"babyai": GotoAvoid().rgb_from_symbolic, "fruitbot": lambda x: x,
          "minihack": partial(render_minihack, tile_images=jnp.asarray(tile_set()[0]))}
"""the render of the scripts that take one (usfa.py, uvfa.py, msfa_babyai.py)"""


def gradients_and_priorities(script, args, env: str, seed: int = 0):
    """One SGD step's gradient (every parameter) and priorities, as the script's sgd_step computes them."""
    k = jax.random.split(jax.random.PRNGKey(seed), 4)
    net, target = script.make_network(args, k[0]), script.make_network(args, k[1])
    params, static = eqx.partition(net, eqx.is_inexact_array)
    target_params = eqx.filter(target, eqx.is_inexact_array)
    batch = random_batch(script, args, env, k[2], batch=3)
    probabilities = jax.random.uniform(k[3], (batch.steps.first.shape[0],), minval=0.01, maxval=0.1)
    takes_render = "render" in inspect.signature(script.batch_loss).parameters
    render = (RENDER[env],) if takes_render else ()

    def grad(params, target_params, batch, probabilities):  # data as arguments: nothing for XLA to constant-fold
        def loss(params):
            return script.batch_loss(eqx.combine(params, static), eqx.combine(target_params, static), *render, batch,
                                     probabilities, args)
        grads, (priorities, _) = jax.grad(loss, has_aux=True)(params)
        return grads, priorities

    return jax.jit(grad)(params, target_params, batch, probabilities)


@functools.cache
def reference_step(case: str):
    """The old step's gradient and priorities for a case (the script's losses, the old unroll, two loops)."""
    script, settings, env = CASES[case]
    with reference_learner.patched(script):
        return gradients_and_priorities(script, script.Args(**settings, joint_target_unroll=False), env)


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


@pytest.mark.parametrize("joint, after, unroll", [(False, False, 3), (True, False, 1), (False, True, 1),
                                                  (True, True, 2)])  # the defaults are the test above
@pytest.mark.parametrize("case", ["msfa", "usfa-learned"])
def test_every_speed_setting_gives_the_same_step(case, joint, after, unroll):
    assert_same_step(case, joint_target_unroll=joint, lstm_grad_after_loop=after, learner_unroll=unroll)


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
        inputs = jax.tree.map(lambda x: x[1], core.inputs(maps, vectors))  # hoisted for the sequence, step 1 taken
        stepped, _ = core.step(core.fused_weights(), inputs, state, core.recurrent_weight())
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
