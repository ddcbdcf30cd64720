"""The shared building blocks against plain references."""

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from common.networks import Conv2d, LSTMCell


@pytest.mark.parametrize("kernel, stride, size", [(8, 4, 40), (4, 2, 10), (3, 1, 5), (1, 1, 5), (3, 2, 7)])
def test_patch_convolution_equals_a_same_padded_convolution(kernel, stride, size):
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
