"""The `fused` FARM backend (common/farm_fast.py) computes common/farm.py's FARM: the states and every parameter's,
input's and stored state's gradient at every script's sizes, with episode starts inside the sequences and stored
states (tests/farm_cases.py), also with seeds vmapped outside; one step for acting; planted bugs in the forward
and in the hand-written backward fail; an edited FARM is never run by a fast backend.

Measured (float32, CPU, jax 0.11.2): states within 1.1e-6, every gradient leaf within 1.1e-6 relative."""

from __future__ import annotations

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from common import farm as farm_module
from common.farm import FARM, FarmCore, is_this_farm
from common.run.errors import ConfigError
from farm_cases import CORES, STATE_TOLERANCE, compare, gradient_rows, mutated, random_case, within, worst


@pytest.mark.parametrize("name", list(CORES))
def test_the_fused_backend_computes_farm(name):
    state_error, rows, scale = compare(name, "fused")
    print(f"{name}: states max |fused - plain| {state_error:.1e}; {len(rows)} gradient leaves, worst against its "
          f"bound {worst(rows, scale)}")
    assert state_error <= STATE_TOLERANCE
    assert within(rows, scale), [r for r in rows if not within([r], scale)]


def test_seeds_vmapped_outside_each_get_their_own_gradient():
    """Two seeds' networks and batches vmapped (as the scripts' --num-seeds does) around the batch vmap."""
    stack = lambda *trees: jax.tree.map(lambda *x: jnp.stack(x), *trees)  # noqa: E731
    results = {}
    for backend in ("plain", "fused"):
        cases = [random_case("tiny_odd_projection", seed=s, backend=backend) for s in (0, 1)]
        static = eqx.filter(cases[0][0], eqx.is_array, inverse=True)
        arrays = stack(*[eqx.filter(c, eqx.is_array) for c, _, _ in cases])

        def one_seed(arrays, data, cotangents):
            return _states_and_gradients(eqx.combine(arrays, static), data, cotangents)

        results[backend] = jax.jit(jax.vmap(one_seed))(arrays, stack(*[d for _, d, _ in cases]),
                                                       stack(*[ct for _, _, ct in cases]))
    (states, grads), (ref_states, ref_grads) = results["fused"], results["plain"]
    assert max(float(jnp.max(jnp.abs(a - b))) for a, b in zip(states, ref_states)) <= STATE_TOLERANCE
    for seed in (0, 1):
        rows, scale = gradient_rows(jax.tree.map(lambda x: x[seed], grads), jax.tree.map(lambda x: x[seed], ref_grads))
        assert within(rows, scale), (seed, [r for r in rows if not within([r], scale)])
    assert not np.allclose(ref_grads[0].lstm.linear.weight[0], ref_grads[0].lstm.linear.weight[1])  # two seeds


def _states_and_gradients(core, data, cotangents):
    """states_and_gradients without its jit, to run under the seeds' vmap."""
    maps, vectors, first, state = data

    def loss(farm, maps, vectors, state):
        c = eqx.tree_at(lambda c: c.farm, core, farm)
        states = jax.vmap(c.unroll)(maps, vectors, first, state)
        return sum(jnp.sum(s * ct) for s, ct in zip(states, cotangents)), states

    (_, states), grads = jax.value_and_grad(loss, (0, 1, 2, 3), has_aux=True)(core.farm, maps, vectors, state)
    return states, grads


@pytest.mark.parametrize("name", ["msfa_babyai", "msfa_minihack"])
def test_one_fused_step_is_farms_step(name):
    """FarmCore.recur (acting, evaluation, final views): one step from a random state, for 5 envs."""
    core, (maps, vectors, _, state), _ = random_case(name, batch=5, steps=1, backend="fused")
    fused = jax.vmap(core.recur)(maps[:, 0], vectors[:, 0], state)
    plain = jax.vmap(core.farm.step)(maps[:, 0], vectors[:, 0], state)
    for a, b in zip(fused, plain):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


PLANTED = {  # (the text in common/farm_fast.py, its replacement): each must break the comparison
    "forward without the reset": ("h, c = state[0] * keep_t, state[1] * keep_t", "h, c = state[0], state[1]"),
    "backward: the state's cotangent crosses episode starts": ("return (d_h * keep_t, dc * sf * keep_t, d_biases)",
                                                               "return (d_h, dc * sf * keep_t, d_biases)"),
    "backward: two gates' cotangents swapped": ("[dc * tg * si * (1.0 - si), dc * si * (1.0 - tg * tg),",
                                                "[dc * si * (1.0 - tg * tg), dc * tg * si * (1.0 - si),"),
    "backward: the packed products' share of dh left out": ("d_h = d_h + d_y @ w.state.T", "d_h = d_h"),
    "backward: the softmax's backward without its mean": (
        "d_logits = p * (d_p - jnp.sum(p * d_p, axis=-2, keepdims=True)) / math.sqrt(d)",
        "d_logits = p * d_p / math.sqrt(d)"),
    "backward: the module gates' cotangent off the diagonal": ("jnp.eye(n, dtype=d_gate.dtype)",
                                                              "jnp.ones((n, n), d_gate.dtype)"),
}


@pytest.mark.parametrize("bug", list(PLANTED))
def test_a_planted_bug_fails(bug):
    state_error, rows, scale = compare("tiny_odd_projection", "fused", module=mutated("farm_fast", *PLANTED[bug]))
    if bug.startswith("backward"):
        assert state_error <= STATE_TOLERANCE and not within(rows, scale)
    else:
        assert state_error > STATE_TOLERANCE


def edited_farm_class():
    """FARM with its inter-module attention replaced (every module reads the memory's mean), as a copy of
    common/farm.py edited in one method would have it."""
    class EditedFARM(FARM):
        def inter_module_attention(self, q, h):
            m = jnp.broadcast_to(jnp.mean(jax.vmap(self.value)(h), axis=0), (h.shape[0], self.value.out_features))
            return q + jax.nn.sigmoid(jax.vmap(self.w_gate)(m) - self.b_gate) * jnp.tanh(jax.vmap(self.w_out)(m))
    return EditedFARM


def test_an_edited_farm_runs_plain_and_a_fast_backend_refuses_it(monkeypatch):
    assert is_this_farm(FARM) and not is_this_farm(edited_farm_class())
    monkeypatch.setattr(farm_module, "FARM", edited_farm_class())  # what FarmCore builds: the edited class
    core = FarmCore(4, 2, 16, 1, 5, jax.random.PRNGKey(0))
    assert core.backend == "plain" and type(core.farm).__name__ == "EditedFARM"
    with pytest.raises(ConfigError, match="--core-backend fused computes common/farm.py's FARM, and this FARM"):
        FarmCore(4, 2, 16, 1, 5, jax.random.PRNGKey(0), backend="fused")
    monkeypatch.undo()
    assert FarmCore(4, 2, 16, 1, 5, jax.random.PRNGKey(0)).backend == farm_module.default_backend()


def test_replacing_one_part_changes_the_step():
    """FARM.step composes the four parts: a FARM with another inter-module attention steps differently from the same
    parameters; each part can be called on its own (feature attention for every module: [n, H W P])."""
    farm = FARM(3, 8, 2, channels=4, num_pixels=9, vector_size=5, projection=4, key=jax.random.PRNGKey(0))
    edited = edited_farm_class()(3, 8, 2, channels=4, num_pixels=9, vector_size=5, projection=4,
                                 key=jax.random.PRNGKey(0))
    state = (jax.random.normal(jax.random.PRNGKey(1), (3, 8)), jnp.zeros((3, 8)))
    image_map, vector = jax.random.normal(jax.random.PRNGKey(2), (3, 3, 4)), jnp.ones(5)
    assert not np.allclose(farm.step(image_map, vector, state)[0], edited.step(image_map, vector, state)[0])
    z = eqx.filter_vmap(farm.feature_attention, in_axes=(0, 0, None))(
        farm.gate, jax.vmap(farm.module_query, (0, None))(state[0], vector), image_map)
    assert z.shape == (3, 9 * 4)
