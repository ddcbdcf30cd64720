"""Every script that uses FARM takes the same SGD step with --core-backend pallas (Pallas' interpreter here) as with
the plain FARM: every parameter's gradient and the sequences' priorities, on random batches with random episode
starts, tasks, rewards and stored states (tiny networks; the paper's sizes of FARM itself:
tests/test_farm_kernels.py)."""

import jax
import numpy as np
import pytest

import msfa_babyai
import msfa_fruitbot
import uvfa
from helpers import TINY_MSFA, TINY_UVFA, gradients_and_priorities

RELATIVE = 1e-5
"""per parameter leaf, |pallas - plain| <= RELATIVE |plain| + 1e-6 max_leaf |plain|; the priorities within RELATIVE"""

CASES = {
    "msfa_babyai": (msfa_babyai, TINY_MSFA, "babyai"),
    # (the ablations, MVFA, --time-limit-is-termination and msfa_minihack.py use FARM in the same ways: measured once,
    # 1.1e-6 at most; MiniHack's 3 modules of 1 head: tests/test_farm_kernels.py)
    "msfa_fruitbot": (msfa_fruitbot, TINY_MSFA, "fruitbot"),  # + single FARM steps vmapped over a sequence
    "uvfa-farm": (uvfa, TINY_UVFA | dict(farm=True), "babyai"),
}


@pytest.mark.parametrize("case", list(CASES))
def test_the_sgd_step_is_the_same_with_the_kernels(case):
    script, settings, env = CASES[case]
    with jax.default_matmul_precision("highest"):
        grads, priorities = gradients_and_priorities(script, script.Args(**settings, core_backend="plain"), env)
        kernel_grads, kernel_priorities = gradients_and_priorities(script, script.Args(**settings,
                                                                                       core_backend="pallas"), env)
    leaves = [(jax.tree_util.keystr(p), np.asarray(a, np.float64), np.asarray(b, np.float64))
              for (p, a), b in zip(jax.tree_util.tree_flatten_with_path(grads)[0], jax.tree.leaves(kernel_grads))]
    scale = max(np.linalg.norm(a) for _, a, _ in leaves)
    bad = [(name, np.linalg.norm(b - a), np.linalg.norm(a)) for name, a, b in leaves
           if np.linalg.norm(b - a) > RELATIVE * np.linalg.norm(a) + 1e-6 * scale]
    worst = max(np.linalg.norm(b - a) / (np.linalg.norm(a) + 1e-3 * scale) for _, a, b in leaves)
    print(f"{case}: {len(leaves)} leaves, worst relative {worst:.1e}; priorities max relative "
          f"{float(np.max(np.abs(kernel_priorities - priorities) / np.abs(priorities))):.1e}")
    assert not bad, bad
    np.testing.assert_allclose(kernel_priorities, priorities, rtol=RELATIVE)
