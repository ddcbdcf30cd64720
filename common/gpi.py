"""Generalised policy improvement (Barreto et al., 2017) over successor features.

Given the successor features psi(s, a, z) of a set of policies z and a task w, GPI acts with
    pi(s; w) = argmax_a max_z psi(s, a, z) . w,
which is at least as good on w as every policy in the set. Without GPI the agent evaluates only z = w.
"""

import jax.numpy as jnp


def gpi_values(psi, w):
    """Q^GPI(s, a) = max_z psi[z, a] . w for psi of shape [Z, A, C] and w of shape [C]; returns [A]."""
    return jnp.max(jnp.einsum("zac,c->za", psi, w), axis=0)


def gpi_action(psi, w):
    """The GPI action argmax_a max_z psi[z, a] . w."""
    return jnp.argmax(gpi_values(psi, w), axis=-1)
