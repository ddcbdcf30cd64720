"""Every FARM script's SGD step is the same with the fused backend (the default) as with the plain FARM (common/farm.py
as it reads): the gradients of every parameter and the sequences' priorities, on random batches with random episode
starts, tasks, rewards and stored states, for every script and variant (FARM itself at the paper's sizes:
tests/test_farm_fast.py). The LSTM core's hoisted inputs against its cell stepped: tests/test_networks.py."""

import equinox as eqx
import jax
import numpy as np
import pytest

import msfa_fruitbot
import msfa_minihack
from farm_cases import gradient_rows, within, worst
from helpers import TINY_MSFA, VARIANTS, gradients_and_priorities

CASES = {name: (script, settings, "babyai") for name, (script, settings, _) in VARIANTS.items()
         if name.startswith(("msfa", "uvfa-farm", "mvfa"))} | {
    "msfa-time-limit-is-termination": (VARIANTS["msfa"][0], TINY_MSFA | dict(time_limit_is_termination=True),
                                       "babyai"),  # single fused steps (the final views) inside the loss
    "msfa_fruitbot": (msfa_fruitbot, TINY_MSFA, "fruitbot"),
    "msfa_minihack": (msfa_minihack, TINY_MSFA | dict(num_modules=3, attention_heads=1), "minihack"),
}


@pytest.mark.parametrize("case", list(CASES))
def test_the_sgd_step_is_the_same_with_the_fused_farm(case):
    script, settings, env = CASES[case]
    grads, priorities = gradients_and_priorities(script, script.Args(**settings, core_backend="fused"), env)
    plain_grads, plain_priorities = gradients_and_priorities(script, script.Args(**settings, core_backend="plain"),
                                                             env)
    rows, scale = gradient_rows(grads, plain_grads)
    print(f"{case}: {len(rows)} leaves; worst against its bound {worst(rows, scale)}; priorities max relative "
          f"{float(np.max(np.abs(priorities - plain_priorities) / np.abs(plain_priorities))):.1e}")
    assert within(rows, scale), [r for r in rows if not within([r], scale)]
    np.testing.assert_allclose(priorities, plain_priorities, rtol=2e-5)


def test_the_parameters_keep_their_tree_so_old_checkpoints_and_parameter_files_load():
    """Checkpoints and parameter files hold the networks' parameter trees (and Adam's, of the same tree): every
    script's networks, at the tests' tiny settings and at the paper's, have the paths and shapes recorded by the code
    before the fused step (tests/fixtures/parameter_trees_c004d88.json, written at commit c004d88): FARM's four parts
    kept its parameters as they were."""
    import json
    from pathlib import Path

    import msfa_babyai
    import usfa
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
