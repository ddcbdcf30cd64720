"""UVFA baselines on BabyAI GotoAvoid: universal value functions Q(s, a, w) learned with n-step double Q-learning.

- Default, UVFA (Schaul et al., 2015): one LSTM state h; Q = duelling MLP([h; w]).
- `--farm`, UVFA-FARM: FARM module states h^1..h^n (as in MSFA); Q = duelling MLP([h^1; ...; h^n; w]).
- `--modular`, MVFA (the paper's baseline 3, after Haarnoja et al., 2018): FARM module states, and module k learns
  its own value Q^k(s^k, w^k) from its state and its slice of w with its own duelling MLP; Q = sum_k Q^k, trained
  end to end on the reward. The original code never wired MVFA; this is our reading of the paper's one sentence
  ("modules learn individual Q-values Q^(i)(s^(i), w^(i))"). Module-specific heads (not one shared head) keep its
  size within 1% of UVFA-FARM's.
No method here has GPI: evaluation acts greedily on Q(s, a, w_test) (eval.csv rows with gpi = 0 only).

The replay and training machinery is common/r2d2.py, shared by every learner here.

    python uvfa.py --seed 3                 # UVFA
    python uvfa.py --farm --seed 3          # UVFA-FARM
    python uvfa.py --modular --seed 3       # MVFA
"""

from __future__ import annotations

from dataclasses import dataclass

import equinox as eqx
import jax
import jax.numpy as jnp
import tyro

from common.babyai import NUM_ACTIONS, TRAIN_TASKS
from common.errors import exit_on_config_error, require
from common.farm import FarmCore, apply_per_module
from common.networks import MLP, LSTMCore
from common.r2d2 import (Method, R2D2Args, Sequence, check_env, check_r2d2_args, double_q_bootstrap,
                         importance_weights, masked_mean, n_step_targets, sequence_priority, train, unroll)


# =====================================================================================================================
# Arguments: defaults are the paper's BabyAI settings (protocol.md section 4); run and replay settings in R2D2Args.
# =====================================================================================================================
@dataclass
class Args(R2D2Args):
    exp_name: str = "uvfa"
    """name of the experiment (prefix of the default run directory)"""
    env: str = "babyai"
    """environment (only babyai so far)"""
    farm: bool = False
    """UVFA-FARM: FARM module states instead of one LSTM"""
    modular: bool = False
    """MVFA: FARM module states, Q = sum_k Q^k(s^k, w^k) (implies FARM states)"""

    # network
    lstm_size: int = 512
    """LSTM state size (UVFA)"""
    num_modules: int = 4
    """FARM modules (--farm, --modular)"""
    module_size: int = 150
    attention_heads: int = 2
    projection_dim: int = 16
    q_hidden: tuple[int, ...] = (128,)
    """hidden sizes of the value and advantage MLPs of the duelling head"""


def check_args(args: Args) -> None:
    check_r2d2_args(args)
    check_env(args.env)
    for name in ("lstm_size", "num_modules", "module_size", "attention_heads", "projection_dim"):
        value = getattr(args, name)
        require(value > 0, f"--{name.replace('_', '-')} must be positive, got {value}")
    require(not args.modular or len(TRAIN_TASKS[0]) % args.num_modules == 0,
            f"--modular: --num-modules must divide the task dimension {len(TRAIN_TASKS[0])}, got {args.num_modules}")


def method_name(args: Args) -> str:
    return "MVFA" if args.modular else "UVFA-FARM" if args.farm else "UVFA"


# =====================================================================================================================
# Network: DQN torso -> LSTM or FARM -> duelling Q head(s)
# =====================================================================================================================
class DuellingMLP(eqx.Module):
    """Q(x, .) = V(x) + A(x, .) - mean_a A(x, a), with separate value and advantage MLPs (ACME's DuellingMLP)."""

    value: MLP
    advantage: MLP

    def __init__(self, in_size: int, hidden: tuple[int, ...], num_actions: int, key):
        k_value, k_advantage = jax.random.split(key)
        self.value = MLP((in_size, *hidden, 1), k_value)
        self.advantage = MLP((in_size, *hidden, num_actions), k_advantage)

    def __call__(self, x):
        advantage = self.advantage(x)
        return self.value(x) + advantage - jnp.mean(advantage)


class UVFANetwork(eqx.Module):
    core: LSTMCore | FarmCore
    head: DuellingMLP  # [h (flattened); w] -> A; MVFA: one head per module (stacked), [h^k; w^k] -> A
    modular: bool = eqx.field(static=True)

    def __init__(self, args: Args, task_dim: int, key):
        k_core, k_head = jax.random.split(key)
        self.modular = args.modular
        if args.farm or args.modular:
            n, d = args.num_modules, args.module_size
            self.core = FarmCore(NUM_ACTIONS, n, d, args.attention_heads, args.projection_dim, k_core)
            state_size = n * d
        else:
            self.core = LSTMCore(NUM_ACTIONS, args.lstm_size, k_core)
            state_size = args.lstm_size
        if args.modular:
            per_module = task_dim // args.num_modules
            self.head = eqx.filter_vmap(lambda k: DuellingMLP(args.module_size + per_module, args.q_hidden,
                                                              NUM_ACTIONS, k))(
                jax.random.split(k_head, args.num_modules))
        else:
            self.head = DuellingMLP(state_size + task_dim, args.q_hidden, NUM_ACTIONS, k_head)

    def module_q(self, h, w):
        """MVFA: Q^k(s^k, a, w^k) [n, A], module k reading its state and its slice of w."""
        return apply_per_module(self.head, jnp.concatenate([h, w.reshape(h.shape[0], -1)], axis=-1))

    def q(self, h, w):
        """Q(s, a, w) [A]."""
        if self.modular:
            return jnp.sum(self.module_q(h, w), axis=0)
        return self.head(jnp.concatenate([h.reshape(-1), w]))


# =====================================================================================================================
# Loss: n-step double Q-learning
# =====================================================================================================================
def sequence_loss(net: UVFANetwork, target_net: UVFANetwork, render, seq: Sequence, args: Args, step_mask=None):
    """0.5 delta^2 of n-step double Q-learning, masked-averaged over the sequence; and the priority."""
    s = seq.steps
    h = unroll(net.core, render, seq)
    h_target = jax.lax.stop_gradient(unroll(target_net.core, render, seq))
    q = jax.vmap(net.q)(h, s.w)  # [T, A]
    q_target = jax.vmap(target_net.q)(h_target, s.w)
    steps, taken = jnp.arange(q.shape[0] - 1), s.action[:-1]
    targets, valid = n_step_targets(s.reward[:-1], double_q_bootstrap(q, q_target), ~s.first[1:], args.n_step,
                                    args.gamma)
    if step_mask is not None:
        valid = valid & step_mask
    delta = jax.lax.stop_gradient(targets) - q[steps, taken]
    return {"loss": masked_mean(0.5 * delta**2, valid), "q_mean": masked_mean(q[steps, taken], valid),
            "priority": sequence_priority(delta, valid, args.max_priority_weight)}


def batch_loss(net: UVFANetwork, target_net: UVFANetwork, render, batch: Sequence, probabilities, args: Args):
    """mean_b(IS_b L_b)."""
    out = jax.vmap(lambda seq: sequence_loss(net, target_net, render, seq, args))(batch)
    loss = jnp.mean(importance_weights(probabilities, args.importance_exponent) * out["loss"])
    return loss, (out["priority"], {"loss": loss, "q_mean": jnp.mean(out["q_mean"])})


# =====================================================================================================================
# Main
# =====================================================================================================================
PAPER_PARAMS = {"UVFA": "2.09M", "UVFA-FARM": "2.17M", "MVFA": "not reported; UVFA-FARM: 2.17M"}


def make_method(args: Args) -> Method:
    name = method_name(args)
    return Method(name=name, make_network=lambda a, key: UVFANetwork(a, TRAIN_TASKS.shape[1], key),
                  q_values=UVFANetwork.q, gpi_q_values=None, batch_loss=batch_loss, loss_names=(),
                  paper_params=PAPER_PARAMS[name])


@exit_on_config_error
def main(args: Args) -> None:
    check_args(args)
    train(make_method(args), args)


if __name__ == "__main__":
    main(tyro.cli(Args))
