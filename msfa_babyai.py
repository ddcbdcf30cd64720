"""MSFA on BabyAI GotoAvoid: Modular Successor Feature Approximators (Carvalho et al., ICLR 2023).

The agent keeps n state modules (FARM). Module k learns its own cumulant phi^k from its state at t and t+1, and its
own successor features psi^k from its state and its slice of the task w. Q = psi . w. Three losses train it:
n-step Q-learning on psi . w, n-step successor-feature learning with phi as pseudo-reward, and regression of
phi . w on the reward. At test time GPI composes the train-task policies: argmax_a max_z psi(s, a, z) . w_test.

This file is the method: its settings, network, losses and GPI head. The recurrent replay machinery it shares with
the baselines (sequence replay, actors, n-step targets, the jitted training program, evaluation, the run directory)
is in common/r2d2.py, so that MSFA and the baselines differ only where the methods do.

    python msfa_babyai.py --seed 3                  # the paper's BabyAI settings
    python msfa_babyai.py --entangled-psi           # ablations: --entangled-psi, --entangled-phi, or both
    python msfa_babyai.py --help                    # every option
"""

from __future__ import annotations

from dataclasses import dataclass

import equinox as eqx
import jax
import jax.numpy as jnp
import tyro

from common.babyai import NUM_ACTIONS, TRAIN_TASKS
from common.errors import exit_on_config_error, require
from common.farm import FarmCore
from common.gpi import gpi_values
from common.networks import MLP
from common.r2d2 import (Method, R2D2Args, Sequence, check_r2d2_args, double_q_bootstrap, importance_weights,
                         masked_mean, n_step_targets, sequence_priority, train, unroll)


# =====================================================================================================================
# Arguments: defaults are the paper's BabyAI settings (../shared/reference/protocol.md); run and replay settings, shared
# with the baselines, are in R2D2Args.
# =====================================================================================================================
@dataclass
class Args(R2D2Args):
    exp_name: str = "msfa_babyai"
    """name of the experiment (prefix of the default run directory)"""

    # network
    num_modules: int = 4
    module_size: int | None = None
    """size of each module's state (default: 150; 140 with --entangled-phi, the paper's ablation sizes)"""
    attention_heads: int = 2
    projection_dim: int = 16
    psi_hidden: tuple[int, ...] = (128,)
    """hidden sizes of the psi MLP (shared by the modules)"""
    phi_hidden: tuple[int, ...] = (256, 256)
    """hidden sizes of the phi MLP (shared by the modules)"""
    entangled_psi: bool = False
    """ablation: one psi MLP on [h^1; ...; h^n; z] gives all of psi (USFA's head on the concatenated modules)"""
    entangled_phi: bool = False
    """ablation: one phi MLP on [h^1_{t+1}; h^1_t; ...; h^n_{t+1}; h^n_t] gives all of phi"""

    # losses
    q_coeff: float = 0.5
    sf_coeff: float = 1.0
    phi_coeff: float = 1.0


def check_args(args: Args) -> None:
    """Refuse settings that cannot work, with one line saying what to change."""
    check_r2d2_args(args)
    for name in ("num_modules", "attention_heads", "projection_dim"):
        value = getattr(args, name)
        require(value > 0, f"--{name.replace('_', '-')} must be positive, got {value}")
    require(args.module_size is None or args.module_size > 0, f"--module-size must be positive, got {args.module_size}")
    require(len(TRAIN_TASKS[0]) % args.num_modules == 0,
            f"--num-modules must divide the task dimension {len(TRAIN_TASKS[0])}, got {args.num_modules}")


def module_size(args: Args) -> int:
    if args.module_size is not None:
        return args.module_size
    return 140 if args.entangled_phi else 150


def method_name(args: Args) -> str:
    parts = [name for name, on in (("entangled psi", args.entangled_psi), ("entangled phi", args.entangled_phi)) if on]
    return f"MSFA ({', '.join(parts)})" if parts else "MSFA"


# =====================================================================================================================
# Network: DQN torso -> FARM modules -> per-module psi^k(s^k, a, w * e_k) and phi^k(s^k_t, s^k_{t+1}).
# =====================================================================================================================
class MSFANetwork(eqx.Module):
    core: FarmCore  # the module states s^k = h^k
    psi_mlp: MLP  # modular: shared by modules, [h^k; z * e_k] -> A x C_k; entangled: [h^1..h^n; z] -> A x C
    phi_mlp: MLP  # modular: shared by modules, [h^k_{t+1}; h^k_t] -> C_k; entangled: all modules' pairs -> C
    task_dim: int = eqx.field(static=True)
    entangled_psi: bool = eqx.field(static=True)
    entangled_phi: bool = eqx.field(static=True)

    def __init__(self, args: Args, task_dim: int, key):
        k_core, k_psi, k_phi = jax.random.split(key, 3)
        n, d = args.num_modules, module_size(args)
        per_module = task_dim // n
        self.core = FarmCore(NUM_ACTIONS, n, d, args.attention_heads, args.projection_dim, k_core)
        if args.entangled_psi:
            self.psi_mlp = MLP((n * d + task_dim, *args.psi_hidden, NUM_ACTIONS * task_dim), k_psi)
        else:
            self.psi_mlp = MLP((d + task_dim, *args.psi_hidden, NUM_ACTIONS * per_module), k_psi)
        self.phi_mlp = MLP((2 * d * (n if args.entangled_phi else 1), *args.phi_hidden,
                            task_dim if args.entangled_phi else per_module), k_phi)
        self.task_dim, self.entangled_psi, self.entangled_phi = task_dim, args.entangled_psi, args.entangled_phi

    def module_masks(self):
        """e_k: the 0/1 mask [n, C] of module k's slice of the task vector."""
        n = self.core.farm.num_modules
        return jnp.repeat(jnp.eye(n), self.task_dim // n, axis=1)

    def psi(self, h, z):
        """Successor features [A, C] of policy z: module k gives the columns of its slice, from [h^k; z * e_k]."""
        if self.entangled_psi:
            return self.psi_mlp(jnp.concatenate([h.reshape(-1), z])).reshape(NUM_ACTIONS, self.task_dim)
        inputs = jnp.concatenate([h, z[None] * self.module_masks()], axis=-1)
        out = jax.vmap(self.psi_mlp)(inputs).reshape(h.shape[0], NUM_ACTIONS, -1)  # [n, A, C_k]
        return jnp.transpose(out, (1, 0, 2)).reshape(NUM_ACTIONS, self.task_dim)

    def phi(self, h_next, h):
        """Cumulants [C] of the transition between states h and h_next, module k giving its slice."""
        pairs = jnp.concatenate([h_next, h], axis=-1)  # [n, 2d]
        if self.entangled_phi:
            return self.phi_mlp(pairs.reshape(-1))
        return jax.vmap(self.phi_mlp)(pairs).reshape(self.task_dim)


def q_values(net, h, w):
    """Q(s, a; w) = psi(s, a, w) . w: acting on the training task."""
    return net.psi(h, w) @ w


def gpi_q_values(net, h, w, policies):
    """GPI: max_z psi(s, a, z) . w over the policies z (the train tasks)."""
    return gpi_values(jax.vmap(net.psi, (None, 0))(h, policies), w)


# =====================================================================================================================
# Losses
# =====================================================================================================================
def successor_features(net, target_net, render, seq: Sequence):
    """States h [T, ...] along a sequence, and the online and (stop-gradient) target psi [T, A, C] of z = w."""
    h = unroll(net.core, render, seq)
    h_target = jax.lax.stop_gradient(unroll(target_net.core, render, seq))
    return h, jax.vmap(net.psi)(h, seq.steps.w), jax.vmap(target_net.psi)(h_target, seq.steps.w)


def sf_td_error(psi, psi_target, cumulants, seq: Sequence, args):
    """n-step double-Q SF TD errors [T-1, C], one TD problem per cumulant dimension with cumulants[t] the
    pseudo-reward of transition t; the online psi . w picks the bootstrap action. Returns (errors, valid)."""
    s = seq.steps
    q = jnp.einsum("tac,tc->ta", psi, s.w)
    targets, valid = n_step_targets(cumulants, double_q_bootstrap(q, psi_target), ~s.first[1:], args.n_step,
                                    args.gamma)
    return jax.lax.stop_gradient(targets) - psi[jnp.arange(q.shape[0] - 1), s.action[:-1]], valid


def sequence_loss(net: MSFANetwork, target_net: MSFANetwork, render, seq: Sequence, args: Args, step_mask=None):
    """The three MSFA losses of one sequence, and the TD errors that set its priority.

    step_mask [T-1] (optional) keeps only some transitions: the masking test uses it to look at one episode."""
    s = seq.steps
    h, psi, psi_target = successor_features(net, target_net, render, seq)  # psi [T, A, C]
    q = jnp.einsum("tac,tc->ta", psi, s.w)
    q_target = jnp.einsum("tac,tc->ta", psi_target, s.w)
    phi = jax.vmap(net.phi)(h[1:], h[:-1])  # [T-1, C]: cumulant of transition t
    steps, taken = jnp.arange(q.shape[0] - 1), s.action[:-1]

    # n-step double Q-learning on Q = psi . w
    q_targets, valid = n_step_targets(s.reward[:-1], double_q_bootstrap(q, q_target), ~s.first[1:], args.n_step,
                                      args.gamma)
    if step_mask is not None:
        valid = valid & step_mask
    delta_q = jax.lax.stop_gradient(q_targets) - q[steps, taken]
    loss_q = masked_mean(0.5 * delta_q**2, valid)

    # n-step SF learning with the (stop-gradient) learned cumulants as pseudo-rewards
    delta_psi, _ = sf_td_error(psi, psi_target, jax.lax.stop_gradient(phi), seq, args)  # [T-1, C]
    loss_psi = masked_mean(jnp.mean(0.5 * delta_psi**2, axis=-1), valid)

    # cumulants regressed so that phi . w predicts the reward
    phi_error = 0.5 * (jnp.sum(phi * s.w[:-1], -1) - s.reward[:-1]) ** 2

    return {"loss_q": loss_q, "loss_psi": loss_psi, "phi_error_sum": jnp.sum(phi_error * valid),
            "phi_count": jnp.sum(valid), "q_mean": masked_mean(q[steps, taken], valid),
            "priority": sequence_priority(jnp.mean(delta_psi, -1), valid, args.max_priority_weight)}


def batch_loss(net: MSFANetwork, target_net: MSFANetwork, render, batch: Sequence, probabilities, args: Args):
    """alpha_psi mean_b(IS_b L_psi,b) + alpha_Q mean_b L_Q,b + alpha_phi (masked mean of the phi error)."""
    out = jax.vmap(lambda seq: sequence_loss(net, target_net, render, seq, args))(batch)
    weights = importance_weights(probabilities, args.importance_exponent)
    loss_phi = jnp.sum(out["phi_error_sum"]) / (jnp.sum(out["phi_count"]) + 1e-5)
    loss = (args.sf_coeff * jnp.mean(weights * out["loss_psi"]) + args.q_coeff * jnp.mean(out["loss_q"])
            + args.phi_coeff * loss_phi)
    metrics = {"loss": loss, "loss_q": jnp.mean(out["loss_q"]), "loss_psi": jnp.mean(out["loss_psi"]),
               "loss_phi": loss_phi, "q_mean": jnp.mean(out["q_mean"])}
    return loss, (out["priority"], metrics)


# =====================================================================================================================
# Main
# =====================================================================================================================
def make_method(args: Args) -> Method:
    return Method(name=method_name(args), make_network=lambda a, key: MSFANetwork(a, TRAIN_TASKS.shape[1], key),
                  q_values=q_values, gpi_q_values=gpi_q_values, batch_loss=batch_loss,
                  loss_names=("loss_q", "loss_psi", "loss_phi"),
                  paper_params="2.1M" if not (args.entangled_psi or args.entangled_phi) else "not reported")


@exit_on_config_error
def main(args: Args) -> None:
    check_args(args)
    train(make_method(args), args)


if __name__ == "__main__":
    main(tyro.cli(Args))
