"""USFA baselines on BabyAI GotoAvoid: Universal Successor Feature Approximators (Borsa et al., 2019).

One LSTM state h (no modules). psi(s, a, z) = MLP([h; z]) -> [A, C], Q = psi . w, GPI at test time over the train
tasks: argmax_a max_z psi(s, a, z) . w_test.

- Default, hand-designed cumulants: phi is the env's pickup indicator of each object category, and the only loss is
  n-step successor-feature learning with it as pseudo-reward (as in the original). The cumulant of transition
  t -> t+1 is the phi the env returned with r_t (r_t = phi_t . w); the original used the phi of the transition
  *into* o_t, one step early (protocol.md section 7, pitfall 7): see the README.
- `--learned-cumulants` (USFA with learned phi): phi_t = MLP([h_{t+1}; h_t]) and exactly MSFA's three losses
  (Q-learning on psi . w, SF learning on the stop-gradient phi, phi . w regressed on r), imported from
  msfa_babyai.py so that the comparison with MSFA differs only in the state and heads.
Both variants use MSFA's Q and GPI heads (Q = psi . w) and its successor-feature TD error, imported from
msfa_babyai.py.

The replay and training machinery is common/r2d2.py, shared by every learner here.

    python usfa.py --seed 3                         # USFA, hand-designed cumulants
    python usfa.py --learned-cumulants --seed 3     # USFA with learned cumulants
"""

from __future__ import annotations

from dataclasses import dataclass

import equinox as eqx
import jax
import jax.numpy as jnp
import tyro

import msfa_babyai
from common.babyai import NUM_ACTIONS, TRAIN_TASKS
from common.errors import exit_on_config_error, require
from common.networks import MLP, LSTMCore
from common.r2d2 import (Method, R2D2Args, Sequence, check_env, check_r2d2_args, importance_weights, masked_mean,
                         sequence_priority, train)


# =====================================================================================================================
# Arguments: defaults are the paper's BabyAI settings (protocol.md section 4); run and replay settings in R2D2Args.
# =====================================================================================================================
@dataclass
class Args(R2D2Args):
    exp_name: str = "usfa"
    """name of the experiment (prefix of the default run directory)"""
    env: str = "babyai"
    """environment (only babyai so far)"""
    learned_cumulants: bool = False
    """learn phi = MLP([h_{t+1}; h_t]) with MSFA's three losses instead of using the env's cumulants"""

    # network
    lstm_size: int = 512
    psi_hidden: tuple[int, ...] = (128,)
    """hidden sizes of the psi MLP on [h; z]"""
    phi_hidden: tuple[int, ...] = (256, 256)
    """hidden sizes of the phi MLP (--learned-cumulants only)"""

    # losses (q_coeff and phi_coeff only with --learned-cumulants)
    q_coeff: float = 0.5
    sf_coeff: float = 1.0
    phi_coeff: float = 1.0


def check_args(args: Args) -> None:
    check_r2d2_args(args)
    check_env(args.env)
    require(args.lstm_size > 0, f"--lstm-size must be positive, got {args.lstm_size}")


# =====================================================================================================================
# Network: DQN torso -> LSTM -> psi(s, a, z) = MLP([h; z]) and, with learned cumulants, phi = MLP([h_{t+1}; h_t]).
# =====================================================================================================================
class USFANetwork(eqx.Module):
    core: LSTMCore
    psi_mlp: MLP  # [h; z] -> A x C
    phi_mlp: MLP | None  # [h_{t+1}; h_t] -> C (learned cumulants only)
    task_dim: int = eqx.field(static=True)

    def __init__(self, args: Args, task_dim: int, key):
        k_core, k_psi, k_phi = jax.random.split(key, 3)
        self.core = LSTMCore(NUM_ACTIONS, args.lstm_size, k_core)
        self.psi_mlp = MLP((args.lstm_size + task_dim, *args.psi_hidden, NUM_ACTIONS * task_dim), k_psi)
        self.phi_mlp = (MLP((2 * args.lstm_size, *args.phi_hidden, task_dim), k_phi)
                        if args.learned_cumulants else None)
        self.task_dim = task_dim

    def psi(self, h, z):
        """Successor features [A, C] of policy z."""
        return self.psi_mlp(jnp.concatenate([h, z])).reshape(NUM_ACTIONS, self.task_dim)

    def phi(self, h_next, h):
        """Learned cumulants [C] of the transition between states h and h_next."""
        return self.phi_mlp(jnp.concatenate([h_next, h]))


# =====================================================================================================================
# Loss with hand-designed cumulants: n-step SF learning only
# =====================================================================================================================
def oracle_sequence_loss(net: USFANetwork, target_net: USFANetwork, render, seq: Sequence, args: Args,
                         step_mask=None):
    """n-step double-Q SF learning with the env's cumulants, one TD problem per dimension; and the priority.

    The pseudo-reward of transition t is steps.phi[t], the cumulant of the same transition as steps.reward[t]."""
    _, psi, psi_target = msfa_babyai.successor_features(net, target_net, render, seq)
    delta_psi, valid = msfa_babyai.sf_td_error(psi, psi_target, seq.steps.phi[:-1], seq, args)  # [T-1, C]
    if step_mask is not None:
        valid = valid & step_mask
    steps, taken = jnp.arange(delta_psi.shape[0]), seq.steps.action[:-1]
    q = jnp.einsum("tac,tc->ta", psi, seq.steps.w)
    return {"loss_psi": masked_mean(jnp.mean(0.5 * delta_psi**2, axis=-1), valid),
            "q_mean": masked_mean(q[steps, taken], valid),
            "priority": sequence_priority(jnp.mean(delta_psi, -1), valid, args.max_priority_weight)}


def oracle_batch_loss(net: USFANetwork, target_net: USFANetwork, render, batch: Sequence, probabilities, args: Args):
    """alpha_psi mean_b(IS_b L_psi,b)."""
    out = jax.vmap(lambda seq: oracle_sequence_loss(net, target_net, render, seq, args))(batch)
    loss = args.sf_coeff * jnp.mean(importance_weights(probabilities, args.importance_exponent) * out["loss_psi"])
    metrics = {"loss": loss, "loss_psi": jnp.mean(out["loss_psi"]), "q_mean": jnp.mean(out["q_mean"])}
    return loss, (out["priority"], metrics)


# =====================================================================================================================
# Main
# =====================================================================================================================
def make_method(args: Args) -> Method:
    make_network = lambda a, key: USFANetwork(a, TRAIN_TASKS.shape[1], key)  # noqa: E731
    heads = dict(make_network=make_network, q_values=msfa_babyai.q_values, gpi_q_values=msfa_babyai.gpi_q_values)
    if args.learned_cumulants:
        return Method(name="USFA (learned cumulants)", batch_loss=msfa_babyai.batch_loss,
                      loss_names=("loss_q", "loss_psi", "loss_phi"), paper_params="2.35M", **heads)
    return Method(name="USFA", batch_loss=oracle_batch_loss, loss_names=("loss_psi",),
                  paper_params="not reported; its table's 2.35M is USFA with learned cumulants", **heads)


@exit_on_config_error
def main(args: Args) -> None:
    check_args(args)
    train(make_method(args), args)


if __name__ == "__main__":
    main(tyro.cli(Args))
