"""The shared building blocks against plain references."""

from functools import partial

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from common.networks import Conv2d, LSTMCell


@pytest.mark.parametrize("kernel, stride, size", [(8, 4, 40), (4, 2, 10), (3, 1, 5), (1, 1, 5), (3, 2, 7), (8, 4, 37),
                                                  (4, 2, 9), (6, 2, 11)])
def test_patch_convolution_equals_a_same_padded_convolution(kernel, stride, size):
    """Both of Conv2d's paths (space-to-depth where the kernel is a multiple of the stride, plain patches
    elsewhere) against XLA's own SAME-padded convolution."""
    conv = Conv2d(3, 5, kernel, stride, jax.random.PRNGKey(kernel))
    conv = eqx.tree_at(lambda c: c.bias, conv, jax.random.normal(jax.random.PRNGKey(1), (5,)))
    x = jax.random.normal(jax.random.PRNGKey(2), (size, size, 3))
    reference = jax.lax.conv_general_dilated(
        x[None], conv.weight.reshape(kernel, kernel, 3, 5), (stride, stride), "SAME",
        dimension_numbers=("NHWC", "HWIO", "NHWC"))[0] + conv.bias
    np.testing.assert_allclose(conv(x), reference, rtol=1e-5, atol=1e-5)


def test_lstm_is_haikus():
    cell = LSTMCell(3, 2, jax.random.PRNGKey(0))
    x, h, c = jnp.array([1.0, -1, 0.5]), jnp.array([0.2, -0.3]), jnp.array([0.5, 1.0])
    i, g, f, o = np.split(np.asarray(cell.linear(jnp.concatenate([x, h]))), 4)
    sig = lambda v: 1 / (1 + np.exp(-v))  # noqa: E731
    c_new = sig(f + 1) * np.asarray(c) + sig(i) * np.tanh(g)
    h_new, c_out = cell(x, (h, c))
    np.testing.assert_allclose(c_out, c_new, rtol=1e-6)
    np.testing.assert_allclose(h_new, sig(o) * np.tanh(c_new), rtol=1e-6)


def test_farm_modules_have_their_own_parameters():
    """One step: perturbing module 0's LSTM or gate changes only module 0's new state (the modules read each
    other's previous states, not their new ones); the attention memory has the extra zero slot."""
    from common.farm import FARM

    farm = FARM(3, 8, 2, channels=4, num_pixels=9, vector_size=5, projection=4, key=jax.random.PRNGKey(0))
    image_map = jax.random.normal(jax.random.PRNGKey(1), (3, 3, 4))
    vector = jax.random.normal(jax.random.PRNGKey(2), (5,))
    state = (jax.random.normal(jax.random.PRNGKey(3), (3, 8)), jax.random.normal(jax.random.PRNGKey(4), (3, 8)))
    h, _ = farm(image_map, vector, state)
    for where in (lambda f: f.lstm.linear.weight, lambda f: f.gate.weight):
        bumped = eqx.tree_at(where, farm, where(farm).at[0].add(0.5))
        h2, _ = bumped(image_map, vector, state)
        assert jnp.abs(h2[0] - h[0]).max() > 1e-4
        np.testing.assert_array_equal(h2[1:], h[1:])
    assert farm.lstm.linear.weight.shape[0] == 3 and farm.gate.weight.shape[0] == 3  # stacked per module


@pytest.mark.parametrize("torso", ["dqn", "impala"])
def test_the_lstm_cores_hoisted_inputs_are_its_cell_stepped(torso):
    """LSTMCore.unroll and .recur (the gates' input part computed for a whole sequence before the loop) against
    LSTMCell stepped on [v; features] with resets: the states and every gradient."""
    from common.networks import LSTMCore

    k = jax.random.split(jax.random.PRNGKey(0), 6)
    core = LSTMCore(5, 12, k[0], torso=torso)
    leaves, tree = jax.tree.flatten(core)
    core = jax.tree.unflatten(tree, [x + 0.1 * jax.random.normal(k[1], x.shape) for x in leaves])
    shape = {"dqn": (5, 5, 16), "impala": (8, 8, 32)}[torso]
    maps, vectors = jax.random.normal(k[2], (7,) + shape), jax.random.normal(k[3], (7, 6))
    first = jnp.array([True, False, False, True, False, False, False])
    state = (jax.random.normal(k[4], (12,)), jax.random.normal(k[5], (12,)))

    def stepped(core, maps, vectors, state, first=first):
        def step(state, x):
            image_map, vector, first = x
            state = jax.tree.map(lambda s: jnp.where(first, 0.0, s), state)
            features = image_map.reshape(-1)
            if core.flat is not None:
                features = jax.nn.relu(core.flat(features))
            state = core.lstm(jnp.concatenate([vector, features]), state)
            return state, state
        return jax.lax.scan(step, state, (maps, vectors, first))[1]

    def loss(unroll, core, maps, vectors, state):
        h, c = unroll(core, maps, vectors, state)
        return jnp.sum(h * jnp.cos(jnp.arange(h.size).reshape(h.shape))) + jnp.sum(c ** 2), (h, c)

    hoisted = lambda core, maps, vectors, state: core.unroll(maps, vectors, first, state)  # noqa: E731
    (_, ours), grads = jax.value_and_grad(partial(loss, hoisted), (0, 1, 2, 3), has_aux=True)(core, maps, vectors,
                                                                                            state)
    (_, ref), ref_grads = jax.value_and_grad(partial(loss, stepped), (0, 1, 2, 3), has_aux=True)(core, maps, vectors,
                                                                                               state)
    for a, b in zip(ours, ref):  # the same sums in another order (the Impala map's 2048 inputs): float32 rounding
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=2e-5)
    from farm_cases import gradient_rows, within

    rows, scale = gradient_rows(grads, ref_grads)  # per leaf, in norm: within 1e-5 relative
    assert within(rows, scale), [r for r in rows if not within([r], scale)]
    one = core.recur(maps[1], vectors[1], state)
    for a, b in zip(one, stepped(core, maps[1:2], vectors[1:2], state, jnp.zeros(1, bool))):
        np.testing.assert_allclose(a, b[0], rtol=1e-4, atol=2e-5)
