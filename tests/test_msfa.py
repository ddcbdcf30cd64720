"""MSFA on BabyAI: GPI, the network's size and modularity, and MSFA-only settings. The targets, masking,
priorities and runs that every script shares are tested against each script in test_learners.py."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import msfa_babyai as msfa
from common.gpi import gpi_action, gpi_values
from common.networks import count_params
from helpers import TINY_MSFA


def test_gpi_is_argmax_over_actions_of_max_over_policies():
    psi = jax.random.normal(jax.random.PRNGKey(0), (3, 4, 2))  # [policies, actions, cumulants]
    w = jnp.array([1.0, -0.5])
    brute = max(range(4), key=lambda a: max(float(psi[z, a] @ w) for z in range(3)))
    assert int(gpi_action(psi, w)) == brute
    np.testing.assert_allclose(gpi_values(psi, w), np.max(np.einsum("zac,c->za", psi, w), 0))
    hand = jnp.array([[[1.0, 0], [0, 0]], [[0, 0], [0, 2]]])  # policy 0 is good at action 0, policy 1 at action 1
    assert int(gpi_action(hand, jnp.array([1.0, 1]))) == 1 and int(gpi_action(hand, jnp.array([1.0, 0]))) == 0


@pytest.fixture(scope="module")
def paper_net():
    return msfa.MSFANetwork(msfa.Args(), 4, jax.random.PRNGKey(0))


def test_parameter_count_matches_the_paper(paper_net):
    n = count_params(paper_net)
    assert abs(n - 2.176e6) / 2.176e6 < 0.01, n  # protocol: 2.176M from the code (paper table: "2.1M")


def test_modules_own_their_psi_and_phi(paper_net):
    """d psi^k / d h^j = 0 and d phi^k / d h^j = 0 for j != k, and nonzero for j = k."""
    h = jax.random.normal(jax.random.PRNGKey(1), (4, 150))
    h_next = jax.random.normal(jax.random.PRNGKey(2), (4, 150))
    w = jnp.array([1.0, -1, 0.5, 1])
    d_psi = jax.jacobian(lambda h: paper_net.psi(h, w))(h)  # [A, C, n, d]
    d_phi = jax.jacobian(lambda hn, h: paper_net.phi(hn, h), argnums=(0, 1))(h_next, h)  # 2 x [C, n, d]
    for k in range(4):
        for j in range(4):
            blocks = [d_psi[:, k, j], d_phi[0][k, j], d_phi[1][k, j]]
            if j == k:
                assert all(jnp.abs(b).max() > 0 for b in blocks)
            else:
                assert all(jnp.abs(b).max() == 0 for b in blocks), (k, j)


def test_psi_of_module_k_reads_only_its_slice_of_z(paper_net):
    h = jax.random.normal(jax.random.PRNGKey(3), (4, 150))
    d_z = jax.jacobian(paper_net.psi, argnums=1)(h, jnp.array([1.0, -1, 0.5, 1]))  # [A, C, C]
    for k in range(4):
        for j in range(4):
            assert (float(jnp.abs(d_z[:, k, j]).max()) > 0) == (j == k), (k, j)


def test_shapes(paper_net):
    state = paper_net.core.initial_state()
    image = jnp.zeros((40, 40, 3), jnp.uint8)
    h, c = msfa.core_step(paper_net.core, image, jnp.array(2), jnp.array(0.5), state)
    assert h.shape == c.shape == (4, 150)
    assert paper_net.psi(h, jnp.ones(4)).shape == (4, 4)
    assert paper_net.phi(h, h).shape == (4,)


def test_losses_of_a_sequence_hand_worked_with_zero_network_outputs():
    """With psi = 0 and phi = 0: L_Q = mean 0.5 G^2 of the reward's n-step returns, L_psi = 0, L_phi = mean 0.5 r^2."""
    import equinox as eqx

    from helpers import random_sequence

    args = msfa.Args(**(TINY_MSFA | dict(gamma=0.5, n_step=2)))
    net = msfa.MSFANetwork(args, 4, jax.random.PRNGKey(0))
    zero_last = lambda mlp: eqx.tree_at(lambda m: (m.layers[-1].weight, m.layers[-1].bias), mlp,  # noqa: E731
                                        (jnp.zeros_like(mlp.layers[-1].weight), jnp.zeros_like(mlp.layers[-1].bias)))
    net = eqx.tree_at(lambda n: (n.psi_mlp, n.phi_mlp), net, (zero_last(net.psi_mlp), zero_last(net.phi_mlp)))
    seq = random_sequence(msfa, jax.random.PRNGKey(1), 9, net.core.initial_state())
    r = seq.steps.reward.at[:].set(0.0).at[3].set(2.0)  # one reward, on transition 3
    seq = seq._replace(steps=seq.steps._replace(reward=r))
    out = msfa.sequence_loss(net, net, msfa.GotoAvoid().rgb_from_symbolic, seq, args)
    # 2-step returns with gamma 0.5 over 8 transitions: G_2 = 0.5 * 2, G_3 = 2, others 0 (bootstrap values are 0)
    np.testing.assert_allclose(out["loss_q"], (0.5 * 1.0**2 + 0.5 * 2.0**2) / 8, rtol=1e-4)
    np.testing.assert_allclose(out["loss_psi"], 0.0, atol=1e-8)
    np.testing.assert_allclose(out["phi_error_sum"] / out["phi_count"], 0.5 * 2.0**2 / 8, rtol=1e-4)


def test_num_modules_must_divide_the_task(capsys):
    with pytest.raises(SystemExit) as exit_info:
        msfa.main(msfa.Args(**(TINY_MSFA | dict(num_modules=3))))
    err = capsys.readouterr().err.strip().splitlines()
    assert exit_info.value.code == 2 and len(err) == 1 and "--num-modules must divide the task dimension" in err[0]
