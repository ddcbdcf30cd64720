"""Baselines and ablations: USFA (hand-designed and learned cumulants), UVFA, UVFA-FARM, MVFA, MSFA with entangled
psi/phi. Heads against hand-worked examples, the oracle cumulant's timing, MVFA's sum, which module states each head
reads, and parameter counts against the paper. (What every script shares, and a tiny run of every variant, is
tested in test_learners.py.)"""

from functools import partial

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import msfa_babyai as msfa
import usfa
import uvfa
from common.envs.babyai import GotoAvoid
from common.networks import count_params
from helpers import TINY_MSFA, TINY_USFA, TINY_UVFA, random_sequence

RENDER = GotoAvoid().rgb_from_symbolic


# ------------------------------------------------------------------------------------------------- duelling head
def test_duelling_head_is_value_plus_centred_advantage():
    head = uvfa.DuellingMLP(3, (), 4, jax.random.PRNGKey(0))  # no hidden layer: value and advantage are linear
    set_layer = lambda mlp, w, b: eqx.tree_at(lambda m: (m.layers[0].weight, m.layers[0].bias), mlp, (w, b))  # noqa
    head = eqx.tree_at(lambda h: h.value, head, set_layer(head.value, jnp.array([[1.0, 0, 0]]), jnp.array([2.0])))
    head = eqx.tree_at(lambda h: h.advantage, head,
                       set_layer(head.advantage, jnp.zeros((4, 3)).at[3, 1].set(1.0), jnp.array([1.0, 2, 3, 6])))
    x = jnp.array([0.5, 4.0, -1.0])
    # V = 2 + 0.5 = 2.5; A = [1, 2, 3, 6 + 4] has mean 4: Q = 2.5 + [-3, -2, -1, 6]
    np.testing.assert_allclose(head(x), [-0.5, 0.5, 1.5, 8.5])
    random_head = uvfa.DuellingMLP(3, (8,), 4, jax.random.PRNGKey(1))
    np.testing.assert_allclose(jnp.mean(random_head(x)), random_head.value(x)[0], rtol=1e-5)


# ------------------------------------------------------------------------------- oracle cumulants (USFA) timing
def test_env_cumulant_is_stored_with_the_reward_of_the_same_transition():
    """In what the actors insert into replay, reward_t = phi_t . w_t at every step: phi_t belongs to t -> t+1."""
    args = usfa.Args(**(TINY_USFA | dict(num_envs=16, epsilon_exponents=(0.0, 0.0))))  # epsilon = 1: random play
    setup = usfa.make_setup(args)
    state = usfa.init_train_state(setup, args, jax.random.PRNGKey(0))
    _, (steps, _) = jax.jit(lambda actors, keys: jax.lax.scan(partial(usfa.act_step, setup, args, state.params),
                                                              actors, keys))(
        state.actors, jax.random.split(jax.random.PRNGKey(1), 400))
    assert float(jnp.sum(steps.phi)) >= 20  # enough pickups to mean something
    np.testing.assert_allclose(steps.reward, jnp.sum(steps.phi * steps.w, -1), atol=1e-6)
    # the pickup is seen in the next observation's prev_reward, never in its own step's
    assert jnp.all((steps.reward[:-1] != 0) <= (steps.prev_reward[1:] != 0) | steps.first[1:])


def zero_psi(net):
    last = net.psi_mlp.layers[-1]
    return eqx.tree_at(lambda n: (n.psi_mlp.layers[-1].weight, n.psi_mlp.layers[-1].bias), net,
                       (jnp.zeros_like(last.weight), jnp.zeros_like(last.bias)))


def test_oracle_sf_loss_uses_the_cumulant_of_each_transition_hand_worked():
    args = usfa.Args(**(TINY_USFA | dict(gamma=0.5, n_step=5)))
    net = zero_psi(usfa.USFANetwork(args, 4, jax.random.PRNGKey(0)))
    target = zero_psi(usfa.USFANetwork(args, 4, jax.random.PRNGKey(1)))
    seq = random_sequence(usfa, jax.random.PRNGKey(2), 9, net.core.initial_state())
    seq = seq._replace(steps=seq.steps._replace(phi=seq.steps.phi.at[2, 0].set(1.0)))  # pickup on transition 2 -> 3
    out = usfa.oracle_sequence_loss(net, target, RENDER, seq, args)
    # psi = 0, so delta_t = G_t = gamma^(2 - t) e_0 for t <= 2 and 0 after; loss = mean over 8 transitions of
    # mean over the 4 cumulants of 0.5 delta^2
    expected = (0.5 * (0.25**2 + 0.5**2 + 1.0) / 4) / 8
    np.testing.assert_allclose(out["loss_psi"], expected, rtol=1e-4)
    # rewards do not enter: another reward sequence gives the same loss
    other = seq._replace(steps=seq.steps._replace(reward=jnp.zeros(9)))
    np.testing.assert_allclose(usfa.oracle_sequence_loss(net, target, RENDER, other, args)["loss_psi"], expected,
                               rtol=1e-4)


# --------------------------------------------------------------------------------------------------------- MVFA
@pytest.fixture(scope="module")
def mvfa_net():
    return uvfa.UVFANetwork(uvfa.Args(modular=True), 4, jax.random.PRNGKey(0))


def test_mvfa_q_is_the_sum_of_module_q_values(mvfa_net):
    h = jax.random.normal(jax.random.PRNGKey(1), (4, 150))
    w = jnp.array([1.0, -1, 0.5, 0.25])
    by_hand = 0.0
    for k in range(4):
        head_k = jax.tree.map(lambda x: x[k] if eqx.is_array(x) else x, mvfa_net.head)
        by_hand = by_hand + head_k(jnp.concatenate([h[k], w[k:k + 1]]))
    np.testing.assert_allclose(mvfa_net.q(h, w), by_hand, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(mvfa_net.q(h, w), mvfa_net.module_q(h, w).sum(0), rtol=1e-6)


def test_mvfa_module_q_reads_only_its_state_and_its_slice_of_w(mvfa_net):
    h = jax.random.normal(jax.random.PRNGKey(2), (4, 150))
    w = jnp.array([1.0, -1, 0.5, 0.25])
    d_h, d_w = jax.jacobian(mvfa_net.module_q, argnums=(0, 1))(h, w)  # [n, A, n, d], [n, A, C]
    for k in range(4):
        for j in range(4):
            assert (jnp.abs(d_h[k, :, j]).max() > 0) == (j == k), (k, j)
            assert (jnp.abs(d_w[k, :, j]).max() > 0) == (j == k), (k, j)


# ------------------------------------------------------------------------------------- entangled / modular heads
def reads_other_modules(fn, h, num_modules: int) -> bool:
    """Whether output slice k of fn(h) [..., n * C_k] depends on some h^j with j != k."""
    jac = jax.jacobian(fn)(h)  # [..., C, n, d]
    c = jac.shape[-3] // num_modules
    return any(float(jnp.abs(jac[..., k * c:(k + 1) * c, j, :]).max()) > 0
               for k in range(num_modules) for j in range(num_modules) if j != k)


@pytest.mark.parametrize("entangled_psi, entangled_phi", [(False, False), (True, False), (False, True), (True, True)])
def test_entangled_heads_read_other_modules_and_modular_ones_do_not(entangled_psi, entangled_phi):
    args = msfa.Args(**(TINY_MSFA | dict(entangled_psi=entangled_psi, entangled_phi=entangled_phi)))
    net = msfa.MSFANetwork(args, 4, jax.random.PRNGKey(0))
    h = jax.random.normal(jax.random.PRNGKey(1), (2, 16))
    h_next = jax.random.normal(jax.random.PRNGKey(2), (2, 16))
    w = jnp.array([1.0, -1, 0.5, 1])
    assert reads_other_modules(lambda h: net.psi(h, w), h, 2) == entangled_psi
    assert reads_other_modules(lambda h: net.phi(h_next, h), h, 2) == entangled_phi
    assert reads_other_modules(lambda hn: net.phi(hn, h), h_next, 2) == entangled_phi


def test_uvfa_farm_q_reads_every_module():
    net = uvfa.UVFANetwork(uvfa.Args(**(TINY_UVFA | dict(farm=True))), 4, jax.random.PRNGKey(0))
    d_h = jax.jacobian(net.q)(jax.random.normal(jax.random.PRNGKey(1), (2, 16)), jnp.ones(4))  # [A, n, d]
    assert all(float(jnp.abs(d_h[:, j]).max()) > 0 for j in range(2))


# ------------------------------------------------------------------------------------------- parameter counts
@pytest.mark.parametrize(
    "make, paper",
    [
        (lambda k: usfa.USFANetwork(usfa.Args(learned_cumulants=True), 4, k), 2.35e6),
        (lambda k: uvfa.UVFANetwork(uvfa.Args(), 4, k), 2.09e6),
        (lambda k: uvfa.UVFANetwork(uvfa.Args(farm=True), 4, k), 2.17e6),
        (lambda k: uvfa.UVFANetwork(uvfa.Args(modular=True), 4, k), 2.17e6),  # not in the paper: UVFA-FARM's size
        (lambda k: msfa.MSFANetwork(msfa.Args(), 4, k), 2.1e6),
    ],
    ids=["usfa-learned", "uvfa", "uvfa-farm", "mvfa", "msfa"],
)
def test_parameter_counts_are_within_5_percent_of_the_paper(make, paper):
    n = count_params(make(jax.random.PRNGKey(0)))
    assert abs(n - paper) / paper < 0.05, n


def test_ablation_module_sizes_are_the_papers():
    assert msfa.module_size(msfa.Args()) == 150
    assert msfa.module_size(msfa.Args(entangled_psi=True)) == 150
    assert msfa.module_size(msfa.Args(entangled_phi=True)) == 140
    assert msfa.module_size(msfa.Args(entangled_psi=True, entangled_phi=True)) == 140


# ------------------------------------------------------------------------------------------------------ bad input
@pytest.mark.parametrize("script", [usfa, uvfa])
def test_unknown_env_stops_with_one_line(script, capsys):
    with pytest.raises(SystemExit) as exit_info:
        script.main(script.Args(env="atari"))
    err = capsys.readouterr().err.strip().splitlines()
    assert exit_info.value.code == 2 and len(err) == 1 and "--env must be one of babyai, fruitbot, minihack" in err[0]
