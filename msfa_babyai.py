"""MSFA on BabyAI GotoAvoid: Modular Successor Feature Approximators (Carvalho et al., ICLR 2023).

The agent keeps n state modules (FARM). Module k learns its own cumulant phi^k from its state at t and t+1, and its
own successor features psi^k from its state and its slice of the task w. Q = psi . w. Three losses train it:
n-step Q-learning on psi . w, n-step successor-feature learning with phi as pseudo-reward, and regression of
phi . w on the reward. At test time GPI composes the train-task policies: argmax_a max_z psi(s, a, z) . w_test.

Because the environment is JAX-native, acting, replay insertion, sampling and SGD run as one jitted program per
chunk of training (`lax.scan` over iterations, `vmap` over envs and over seeds); the host loop between chunks only
logs, evaluates and saves. Replay holds R2D2-style sequences (41 steps, period 40) with the recurrent state at
their start, prioritised by 0.9 max|delta| + 0.1 mean|delta|, and stores the compact symbolic view: the learner
renders the 40x40 RGB image the network sees.

    python msfa_babyai.py --seed 3                  # the paper's BabyAI settings
    python msfa_babyai.py --help                    # every option
"""

from __future__ import annotations

import csv
import dataclasses
import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import NamedTuple

import equinox as eqx
import flashbax as fbx
import jax
import jax.numpy as jnp
import numpy as np
import optax
import tyro

from common.babyai import NUM_ACTIONS, TEST_TASKS, TRAIN_TASKS, EnvParams, GotoAvoid, format_task, make_params
from common.errors import exit_on_config_error, require
from common.farm import FARM
from common.gpi import gpi_values
from common.networks import MLP, DQNTorso, count_params


# =====================================================================================================================
# Arguments: defaults are the paper's BabyAI settings (../shared/reference/protocol.md).
# =====================================================================================================================
@dataclass
class Args:
    exp_name: str = "msfa_babyai"
    """name of the experiment (prefix of the default run directory)"""
    seed: int = 1
    """seed of the first run; vmapped runs use seed, seed + 1, ..."""
    num_seeds: int = 1
    """independent runs trained side by side in one program (vmapped)"""
    total_timesteps: int = 5_000_000
    """env steps per seed (rounded up to whole iterations of num_envs x sequence_period)"""
    num_envs: int = 32
    """parallel envs per seed (the original used 3 actor processes)"""
    run_dir: str | None = None
    """where config.json, metrics.csv, eval.csv, checkpoint.eqx and TensorBoard files go (default runs/<name>)"""
    eval_episodes: int = 20
    """greedy episodes per task and per GPI setting at each evaluation"""
    eval_every: int = 250_000
    """env steps (per seed) between evaluations; one more runs at the end"""
    log_every: int = 2_560
    """env steps (per seed) between progress lines and metrics rows"""
    track: bool = False
    """log to Weights & Biases"""
    wandb_project_name: str = "msfa-jax"
    wandb_entity: str | None = None
    resume: bool = False
    """continue the run in --run-dir from its checkpoint"""

    # environment
    truncate_task_input: bool = False
    """feed int32(w) to the agent as the original code did ([1,1,.5,.5] became [1,1,0,0]); rewards use float w"""

    # network
    num_modules: int = 4
    module_size: int = 150
    attention_heads: int = 2
    projection_dim: int = 16
    psi_hidden: tuple[int, ...] = (128,)
    """hidden sizes of the psi MLP shared by the modules"""
    phi_hidden: tuple[int, ...] = (256, 256)
    """hidden sizes of the phi MLP shared by the modules"""

    # learning
    sequence_length: int = 41
    sequence_period: int = 40
    """env steps between the starts of consecutive sequences (consecutive sequences share one step)"""
    n_step: int = 5
    gamma: float = 0.99
    replay_size: int = 100_000
    """replay capacity in sequences"""
    min_replay_size: int = 100
    """sequences in replay before learning starts"""
    samples_per_insert: float = 6.0
    """sampled sequences per inserted sequence (the replay ratio)"""
    batch_size: int = 8
    """sequences per SGD step"""
    priority_exponent: float = 0.9
    importance_exponent: float = 0.0
    max_priority_weight: float = 0.9
    """priority = w max|delta| + (1 - w) mean|delta| over the sequence"""
    learning_rate: float = 1e-3
    adam_eps: float = 1e-3
    max_grad_norm: float = 80.0
    target_update_period: int = 2500
    """SGD steps between copies of the online network into the target network"""
    q_coeff: float = 0.5
    sf_coeff: float = 1.0
    phi_coeff: float = 1.0
    epsilon_exponents: tuple[float, float] = (1.0, 8.0)
    """each env draws epsilon per episode from logspace(a, b, num_epsilons, base=epsilon_base)"""
    num_epsilons: int = 256
    epsilon_base: float = 0.4


def check_args(args: Args) -> None:
    """Refuse settings that cannot work, with one line saying what to change."""
    for name in ("num_seeds", "total_timesteps", "num_envs", "eval_episodes", "eval_every", "log_every",
                 "num_modules", "module_size", "attention_heads", "projection_dim", "n_step", "replay_size",
                 "batch_size", "target_update_period", "sequence_period", "num_epsilons"):
        value = getattr(args, name)
        require(value > 0, f"--{name.replace('_', '-')} must be positive, got {value}")
    require(len(TRAIN_TASKS[0]) % args.num_modules == 0,
            f"--num-modules must divide the task dimension {len(TRAIN_TASKS[0])}, got {args.num_modules}")
    require(args.sequence_length == args.sequence_period + 1,
            f"--sequence-length must be --sequence-period + 1 (sequences share one step), got "
            f"{args.sequence_length} and {args.sequence_period}")
    require(args.samples_per_insert > 0, f"--samples-per-insert must be positive, got {args.samples_per_insert}")
    require(0 < args.gamma <= 1, f"--gamma must be in (0, 1], got {args.gamma}")
    require(0 <= args.priority_exponent <= 1, f"--priority-exponent must be in [0, 1], got {args.priority_exponent}")
    require(args.min_replay_size >= args.batch_size,
            f"--min-replay-size must be at least --batch-size ({args.batch_size}), got {args.min_replay_size}")
    require(args.replay_size >= args.min_replay_size,
            f"--replay-size must be at least --min-replay-size, got {args.replay_size} < {args.min_replay_size}")
    require(args.total_timesteps >= steps_per_iteration(args),
            f"--total-timesteps must cover at least one iteration ({steps_per_iteration(args)} env steps = "
            f"--num-envs x --sequence-period), got {args.total_timesteps}")


def steps_per_iteration(args: Args) -> int:
    """Env steps per seed per iteration: every env adds one sequence period."""
    return args.num_envs * args.sequence_period


def sgd_steps_per_iteration(args: Args) -> int:
    """SGD steps after each iteration, so that sampled/inserted sequences ~ samples_per_insert."""
    return max(1, round(args.samples_per_insert * args.num_envs / args.batch_size))


# =====================================================================================================================
# Network: DQN torso -> FARM modules -> per-module psi^k(s^k, a, w * e_k) and phi^k(s^k_t, s^k_{t+1}).
# =====================================================================================================================
class MSFANetwork(eqx.Module):
    torso: DQNTorso
    farm: FARM
    psi_mlp: MLP  # shared by modules: [h^k; z * e_k] -> A x C_k
    phi_mlp: MLP  # shared by modules: [h^k_{t+1}; h^k_t] -> C_k
    task_dim: int = eqx.field(static=True)

    def __init__(self, args: Args, task_dim: int, key):
        k_torso, k_farm, k_psi, k_phi = jax.random.split(key, 4)
        n, d = args.num_modules, args.module_size
        per_module = task_dim // n
        self.torso = DQNTorso(k_torso)
        self.farm = FARM(n, d, args.attention_heads, channels=16, num_pixels=25, vector_size=NUM_ACTIONS + 1,
                         projection=args.projection_dim, key=k_farm)
        self.psi_mlp = MLP((d + task_dim, *args.psi_hidden, NUM_ACTIONS * per_module), k_psi)
        self.phi_mlp = MLP((2 * d, *args.phi_hidden, per_module), k_phi)
        self.task_dim = task_dim

    def initial_state(self):
        return self.farm.initial_state()

    def core(self, rgb, prev_action, prev_reward, state):
        """One step of the recurrent state: (h, c) each [n, d]."""
        vector = jnp.concatenate([jax.nn.one_hot(prev_action, NUM_ACTIONS), jnp.tanh(prev_reward)[None]])
        return self.farm(self.torso(rgb), vector, state)

    def module_masks(self):
        """e_k: the 0/1 mask [n, C] of module k's slice of the task vector."""
        n = self.farm.num_modules
        return jnp.repeat(jnp.eye(n), self.task_dim // n, axis=1)

    def psi(self, h, z):
        """Successor features [A, C] of policy z: module k gives the columns of its slice, from [h^k; z * e_k]."""
        inputs = jnp.concatenate([h, z[None] * self.module_masks()], axis=-1)
        out = jax.vmap(self.psi_mlp)(inputs).reshape(h.shape[0], NUM_ACTIONS, -1)  # [n, A, C_k]
        return jnp.transpose(out, (1, 0, 2)).reshape(NUM_ACTIONS, self.task_dim)

    def phi(self, h_next, h):
        """Cumulants [C] of the transition between states h and h_next, module k giving its slice."""
        return jax.vmap(self.phi_mlp)(jnp.concatenate([h_next, h], axis=-1)).reshape(self.task_dim)


def reset_where(first, state, initial):
    """The recurrent state, replaced by the initial one where a new episode starts."""
    return jax.tree.map(lambda s, i: jnp.where(first, i, s), state, initial)


# =====================================================================================================================
# Replay items: sequences of steps with the recurrent state before their first step.
# =====================================================================================================================
class Step(NamedTuple):
    obs: jax.Array  # uint8 [5, 5, 3], the symbolic view (rendered to RGB by the network's caller)
    w: jax.Array  # float32 [C], the task as the agent sees it
    prev_action: jax.Array  # int32
    prev_reward: jax.Array  # float32
    first: jax.Array  # bool: obs starts an episode (the recurrent state is reset before it)
    action: jax.Array  # int32, taken at obs
    reward: jax.Array  # float32, received for action


class Sequence(NamedTuple):
    steps: Step  # each field [T, ...]
    state: tuple  # (h, c) each [n, d]: the recurrent state before steps[0] (reset there if steps.first[0])


# =====================================================================================================================
# Losses
# =====================================================================================================================
def n_step_targets(rewards, values, continues, n: int, gamma: float):
    """Truncated n-step targets for the T-1 transitions of a sequence of T steps.

    rewards [T-1, ...]: reward (or cumulant) of transition t (step t -> t+1).
    values [T, ...]: bootstrap value of each step.
    continues [T-1]: step t+1 is in the same episode as step t.
    G_t = sum_{i<m} gamma^i rewards[t+i] + gamma^m values[t+m], with m = min(n, the steps left in t's episode
    within the sequence). Transition t is valid if m >= 1; the last transition of an episode (its next observation
    was never seen: the time limit is a truncation) has m = 0 and is masked. Returns (targets, valid).
    """
    num = rewards.shape[0]
    extra = (None,) * (rewards.ndim - 1)
    pad = lambda x: jnp.concatenate([x, jnp.zeros((n,) + x.shape[1:], x.dtype)])  # noqa: E731
    rewards_p, continues_p = pad(rewards), pad(continues.astype(bool))
    t = jnp.arange(num)
    total = jnp.zeros_like(rewards)
    discount = jnp.ones(num, rewards.dtype)
    boot = t
    alive = jnp.ones(num, bool)
    for i in range(n):
        alive = alive & continues_p[t + i]
        total = total + jnp.where(alive, discount, 0.0)[(...,) + extra] * rewards_p[t + i]
        discount = jnp.where(alive, discount * gamma, discount)
        boot = jnp.where(alive, t + i + 1, boot)
    return total + discount[(...,) + extra] * values[boot], boot > t


def double_q_bootstrap(q_online, values_target):
    """values_target[t, a*_t] with a*_t = argmax_a q_online[t, a]: the online net picks, the target net values.

    q_online [T, A]; values_target [T, A] (Q) or [T, A, C] (successor features)."""
    best = jnp.argmax(jax.lax.stop_gradient(q_online), axis=-1)
    return values_target[jnp.arange(q_online.shape[0]), best]


def sequence_priority(delta, valid, max_weight: float):
    """R2D2's priority of a sequence: max_weight max_t|delta_t| + (1 - max_weight) mean_t|delta_t| over valid t."""
    abs_delta = jnp.abs(delta)
    return max_weight * jnp.max(jnp.where(valid, abs_delta, 0.0)) + (1 - max_weight) * masked_mean(abs_delta, valid)


def masked_mean(x, mask):
    """Mean of x over the entries where mask holds (the original's episode_mean)."""
    return jnp.sum(x * mask) / (jnp.sum(mask) + 1e-5)


def unroll(net: MSFANetwork, render, seq: Sequence):
    """Module states h [T, n, d] along a sequence, resetting at episode starts."""
    maps = jax.vmap(lambda o: net.torso(render(o)))(seq.steps.obs)
    vectors = jax.vmap(lambda a, r: jnp.concatenate([jax.nn.one_hot(a, NUM_ACTIONS), jnp.tanh(r)[None]]))(
        seq.steps.prev_action, seq.steps.prev_reward)

    def step(state, x):
        image_map, vector, first = x
        state = net.farm(image_map, vector, reset_where(first, state, net.initial_state()))
        return state, state[0]

    _, h = jax.lax.scan(step, seq.state, (maps, vectors, seq.steps.first))
    return h


def sequence_loss(net: MSFANetwork, target_net: MSFANetwork, render, seq: Sequence, args: Args, step_mask=None):
    """The three MSFA losses of one sequence, and the TD errors that set its priority.

    step_mask [T-1] (optional) keeps only some transitions: the masking test uses it to look at one episode."""
    s = seq.steps
    h = unroll(net, render, seq)
    h_target = jax.lax.stop_gradient(unroll(target_net, render, seq))
    psi = jax.vmap(net.psi)(h, s.w)  # [T, A, C]
    psi_target = jax.vmap(target_net.psi)(h_target, s.w)
    q = jnp.einsum("tac,tc->ta", psi, s.w)
    q_target = jnp.einsum("tac,tc->ta", psi_target, s.w)
    phi = jax.vmap(net.phi)(h[1:], h[:-1])  # [T-1, C]: cumulant of transition t
    continues = ~s.first[1:]  # transition t stays in one episode
    steps, taken = jnp.arange(q.shape[0] - 1), s.action[:-1]

    # n-step double Q-learning on Q = psi . w
    q_targets, valid = n_step_targets(s.reward[:-1], double_q_bootstrap(q, q_target), continues, args.n_step,
                                      args.gamma)
    if step_mask is not None:
        valid = valid & step_mask
    delta_q = jax.lax.stop_gradient(q_targets) - q[steps, taken]
    loss_q = masked_mean(0.5 * delta_q**2, valid)

    # n-step SF learning with the (stop-gradient) learned cumulants as pseudo-rewards, one TD problem per dimension
    psi_targets, _ = n_step_targets(jax.lax.stop_gradient(phi), double_q_bootstrap(q, psi_target), continues,
                                    args.n_step, args.gamma)
    delta_psi = jax.lax.stop_gradient(psi_targets) - psi[steps, taken]  # [T-1, C]
    loss_psi = masked_mean(jnp.mean(0.5 * delta_psi**2, axis=-1), valid)

    # cumulants regressed so that phi . w predicts the reward
    phi_error = 0.5 * (jnp.sum(phi * s.w[:-1], -1) - s.reward[:-1]) ** 2

    return {"loss_q": loss_q, "loss_psi": loss_psi, "phi_error_sum": jnp.sum(phi_error * valid),
            "phi_count": jnp.sum(valid), "q_mean": masked_mean(q[steps, taken], valid),
            "priority": sequence_priority(jnp.mean(delta_psi, -1), valid, args.max_priority_weight)}


def batch_loss(params, target_params, static, render, batch: Sequence, probabilities, args: Args):
    """alpha_psi mean_b(IS_b L_psi,b) + alpha_Q mean_b L_Q,b + alpha_phi (masked mean of the phi error)."""
    net, target_net = eqx.combine(params, static), eqx.combine(target_params, static)
    out = jax.vmap(lambda seq: sequence_loss(net, target_net, render, seq, args))(batch)
    weights = (1.0 / (probabilities + 1e-6)) ** args.importance_exponent
    weights = weights / jnp.max(weights)
    loss_phi = jnp.sum(out["phi_error_sum"]) / (jnp.sum(out["phi_count"]) + 1e-5)
    loss = (args.sf_coeff * jnp.mean(weights * out["loss_psi"]) + args.q_coeff * jnp.mean(out["loss_q"])
            + args.phi_coeff * loss_phi)
    metrics = {"loss": loss, "loss_q": jnp.mean(out["loss_q"]), "loss_psi": jnp.mean(out["loss_psi"]),
               "loss_phi": loss_phi, "q_mean": jnp.mean(out["q_mean"])}
    return loss, (out["priority"], metrics)


# =====================================================================================================================
# Training state and one jitted chunk of training
# =====================================================================================================================
class Actor(NamedTuple):
    """Per-env acting state."""
    env_state: object
    obs: object
    prev_action: jax.Array
    prev_reward: jax.Array
    first: jax.Array
    rnn: tuple
    epsilon: jax.Array
    episode_return: jax.Array


class TrainState(NamedTuple):
    params: object
    target_params: object
    opt_state: object
    buffer: object
    actors: Actor
    key: jax.Array
    env_steps: jax.Array
    sgd_steps: jax.Array


class Setup(NamedTuple):
    """Everything static a run needs: built once from Args."""
    env: GotoAvoid
    env_params: object
    static: object
    optimizer: optax.GradientTransformation
    buffer: object
    epsilons: jax.Array


def make_setup(args: Args) -> Setup:
    env = GotoAvoid(obs_mode="symbolic", truncate_task_input=args.truncate_task_input)
    net = MSFANetwork(args, TRAIN_TASKS.shape[1], jax.random.PRNGKey(0))
    _, static = eqx.partition(net, eqx.is_inexact_array)
    optimizer = optax.chain(optax.clip_by_global_norm(args.max_grad_norm),
                            optax.adam(args.learning_rate, eps=args.adam_eps))
    buffer = fbx.make_prioritised_item_buffer(
        max_length=args.replay_size, min_length=args.min_replay_size, sample_batch_size=args.batch_size,
        add_batches=True, priority_exponent=args.priority_exponent,
        device="cpu" if jax.default_backend() == "cpu" else "gpu")
    lo, hi = args.epsilon_exponents
    epsilons = jnp.logspace(lo, hi, args.num_epsilons, base=args.epsilon_base)
    return Setup(env, make_params(TRAIN_TASKS), static, optimizer, buffer, epsilons)


def init_train_state(setup: Setup, args: Args, key) -> TrainState:
    k_net, k_target, k_env, k_eps, k_run = jax.random.split(key, 5)
    params, _ = eqx.partition(MSFANetwork(args, TRAIN_TASKS.shape[1], k_net), eqx.is_inexact_array)
    # as in the original, the target network starts from its own random init until the first copy
    target_params, _ = eqx.partition(MSFANetwork(args, TRAIN_TASKS.shape[1], k_target), eqx.is_inexact_array)
    obs, env_state = jax.vmap(setup.env.reset, (0, None))(jax.random.split(k_env, args.num_envs), setup.env_params)
    net = eqx.combine(params, setup.static)
    e = args.num_envs
    actors = Actor(
        env_state=env_state, obs=obs, prev_action=jnp.zeros(e, jnp.int32), prev_reward=jnp.zeros(e),
        first=jnp.ones(e, bool), rnn=jax.tree.map(lambda x: jnp.broadcast_to(x, (e,) + x.shape), net.initial_state()),
        epsilon=jax.random.choice(k_eps, setup.epsilons, (e,)), episode_return=jnp.zeros(e))
    example = jax.tree.map(lambda x: x[0], make_sequences(
        jax.tree.map(lambda x: jnp.zeros((args.sequence_period,) + x.shape, x.dtype), example_step(actors)),
        actors, actors.rnn))
    state = TrainState(params=params, target_params=target_params, opt_state=setup.optimizer.init(params),
                       buffer=setup.buffer.init(example), actors=actors, key=k_run,
                       env_steps=jnp.zeros((), jnp.int32), sgd_steps=jnp.zeros((), jnp.int32))
    # flashbax leaves a weakly typed scalar; strong types everywhere keep the chunk from compiling twice
    return jax.tree.map(lambda x: jnp.asarray(x, x.dtype), state)


def example_step(actors: Actor) -> Step:
    return Step(obs=actors.obs.image, w=actors.obs.w, prev_action=actors.prev_action, prev_reward=actors.prev_reward,
                first=actors.first, action=actors.prev_action, reward=actors.prev_reward)


def make_sequences(steps: Step, actors: Actor, start_rnn) -> Sequence:
    """One sequence per env: the period's steps [P, E] plus the step the envs are at now (action/reward 0)."""
    last = example_step(actors)._replace(action=jnp.zeros_like(actors.prev_action),
                                         reward=jnp.zeros_like(actors.prev_reward))
    steps = jax.tree.map(lambda xs, x: jnp.concatenate([xs, x[None]]), steps, last)
    return Sequence(steps=jax.tree.map(lambda x: jnp.swapaxes(x, 0, 1), steps), state=start_rnn)


def act_step(setup: Setup, args: Args, params, actors: Actor, key):
    """One env step in every env: epsilon-greedy on Q = psi(s, a, w) . w (no GPI while training)."""
    net = eqx.combine(params, setup.static)
    env = setup.env
    k_explore, k_action, k_env, k_eps = jax.random.split(key, 4)
    e = args.num_envs
    rnn = reset_where(actors.first[:, None, None], actors.rnn, net.initial_state())
    rnn = jax.vmap(net.core)(jax.vmap(env.rgb_from_symbolic)(actors.obs.image), actors.prev_action,
                             actors.prev_reward, rnn)
    q = jnp.einsum("eac,ec->ea", jax.vmap(net.psi)(rnn[0], actors.obs.w), actors.obs.w)
    explore = jax.random.uniform(k_explore, (e,)) < actors.epsilon
    action = jnp.where(explore, jax.random.randint(k_action, (e,), 0, NUM_ACTIONS), jnp.argmax(q, -1))
    obs, env_state, reward, _, truncated, info = jax.vmap(env.step, (0, 0, 0, None))(
        jax.random.split(k_env, e), actors.env_state, action, setup.env_params)
    step = example_step(actors)._replace(action=action, reward=reward)
    episode_return = actors.episode_return + reward
    finished = {"done": truncated, "return": episode_return, "task": jnp.argmax(actors.obs.w, -1)}
    actors = Actor(
        env_state=env_state, obs=obs, prev_action=jnp.where(truncated, 0, action),
        prev_reward=jnp.where(truncated, 0.0, reward), first=truncated, rnn=rnn,
        epsilon=jnp.where(truncated, jax.random.choice(k_eps, setup.epsilons, (e,)), actors.epsilon),
        episode_return=jnp.where(truncated, 0.0, episode_return))
    return actors, (step, finished)


def sgd_step(setup: Setup, args: Args, state: TrainState, key):
    """Sample a batch of sequences, take one Adam step, refresh their priorities, maybe copy the target."""
    sample = setup.buffer.sample(state.buffer, key)
    grads, (priorities, metrics) = jax.grad(batch_loss, has_aux=True)(
        state.params, state.target_params, setup.static, setup.env.rgb_from_symbolic, sample.experience,
        sample.probabilities, args)
    updates, opt_state = setup.optimizer.update(grads, state.opt_state, state.params)
    params = eqx.apply_updates(state.params, updates)
    buffer = setup.buffer.set_priorities(state.buffer, sample.indices, priorities)
    sgd_steps = state.sgd_steps + 1
    copy = sgd_steps % args.target_update_period == 0
    target_params = jax.tree.map(lambda p, t: jnp.where(copy, p, t), params, state.target_params)
    metrics["grad_norm"] = optax.tree.norm(grads)
    return state._replace(params=params, target_params=target_params, opt_state=opt_state, buffer=buffer,
                          sgd_steps=sgd_steps), metrics


def train_iteration(setup: Setup, args: Args, state: TrainState, _):
    """Act one sequence period in every env, insert the sequences, then train on replay."""
    key, k_act, k_learn = jax.random.split(state.key, 3)
    start_rnn = state.actors.rnn
    actors, (steps, finished) = jax.lax.scan(
        partial(act_step, setup, args, state.params), state.actors, jax.random.split(k_act, args.sequence_period))
    buffer = setup.buffer.add(state.buffer, make_sequences(steps, actors, start_rnn))
    state = state._replace(buffer=buffer, actors=actors, key=key,
                           env_steps=state.env_steps + steps_per_iteration(args))

    def learn(state):
        state, metrics = jax.lax.scan(partial(sgd_step, setup, args), state,
                                      jax.random.split(k_learn, sgd_steps_per_iteration(args)))
        return state, jax.tree.map(jnp.mean, metrics) | {"learning": jnp.ones(())}

    def wait(state):
        zeros = {k: jnp.zeros(()) for k in ("loss", "loss_q", "loss_psi", "loss_phi", "q_mean", "grad_norm")}
        return state, zeros | {"learning": jnp.zeros(())}

    state, metrics = jax.lax.cond(setup.buffer.can_sample(state.buffer), learn, wait, state)
    num_tasks = TRAIN_TASKS.shape[0]
    done = finished["done"]
    one_hot = jax.nn.one_hot(finished["task"], num_tasks) * done[..., None]
    metrics["return_sum"] = jnp.sum(one_hot * finished["return"][..., None], axis=(0, 1))
    metrics["return_count"] = jnp.sum(one_hot, axis=(0, 1))
    metrics["epsilon"] = jnp.mean(actors.epsilon)
    return state, metrics


def make_train_chunk(setup: Setup, args: Args, iterations: int):
    """A jitted function running `iterations` training iterations for every (vmapped) seed."""
    def chunk(state):
        return jax.lax.scan(partial(train_iteration, setup, args), state, None, length=iterations)
    return jax.jit(jax.vmap(chunk), donate_argnums=0)


# =====================================================================================================================
# Evaluation: greedy, on train and test tasks, with and without GPI over the train tasks
# =====================================================================================================================
def make_evaluate(setup: Setup, args: Args):
    env = setup.env
    policies = jnp.asarray(TRAIN_TASKS)

    def episode_return(params, key, w, use_gpi):
        net = eqx.combine(params, setup.static)
        env_params = EnvParams(tasks=w[None])
        key_reset, key_run = jax.random.split(key)
        obs, env_state = env.reset(key_reset, env_params)
        carry0 = (env_state, obs, jnp.zeros((), jnp.int32), jnp.zeros(()), net.initial_state())

        def step(carry, key):
            env_state, obs, prev_action, prev_reward, rnn = carry
            rnn = net.core(env.rgb_from_symbolic(obs.image), prev_action, prev_reward, rnn)
            psi = jax.vmap(net.psi, (None, 0))(rnn[0], jnp.where(use_gpi, policies, obs.w[None]))
            action = jnp.argmax(gpi_values(psi, obs.w))
            obs, env_state, reward, _, _, _ = env.step(key, env_state, action, env_params)
            return (env_state, obs, action, reward, rnn), reward

        _, rewards = jax.lax.scan(step, carry0, jax.random.split(key_run, env_params.max_steps_in_episode))
        return rewards.sum()

    tasks = jnp.asarray(np.concatenate([TRAIN_TASKS, TEST_TASKS]))

    @jax.jit
    def evaluate(params, key):
        """Returns [2 (gpi 0/1), tasks, episodes] for one seed's params."""
        keys = jax.random.split(key, (2, len(tasks), args.eval_episodes))
        per_episode = jax.vmap(episode_return, (None, 0, None, None))
        per_task = jax.vmap(per_episode, (None, 0, 0, None))
        return jnp.stack([per_task(params, keys[g], tasks, jnp.asarray(g == 1)) for g in (0, 1)])

    return evaluate, np.asarray(tasks)


# =====================================================================================================================
# Run directory: config.json, metrics.csv, eval.csv, checkpoint.eqx, TensorBoard
# =====================================================================================================================
def versions() -> dict:
    from importlib.metadata import version
    names = ("jax", "jaxlib", "equinox", "optax", "flashbax", "gymnax", "minigrid", "numpy")
    out = {n: version(n) for n in names}
    try:
        out["git_commit"] = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True,
                                           cwd=Path(__file__).parent, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        out["git_commit"] = None
    return out


class CsvLog:
    """Append rows to a CSV file, writing the header once."""

    def __init__(self, path: Path, fields: list[str]):
        self.path, self.fields = path, fields
        if not path.exists():
            with path.open("w", newline="") as f:
                csv.writer(f).writerow(fields)

    def write(self, rows: list[dict]):
        with self.path.open("a", newline="") as f:
            writer = csv.DictWriter(f, self.fields)
            writer.writerows(rows)


def save_checkpoint(path: Path, state: TrainState, meta: dict) -> None:
    """One JSON header line, then every leaf of the train state (replay included), written atomically."""
    tmp = path.with_suffix(".tmp")
    with tmp.open("wb") as f:
        f.write((json.dumps(meta) + "\n").encode())
        eqx.tree_serialise_leaves(f, state)
    os.replace(tmp, path)


def load_checkpoint(path: Path, skeleton: TrainState) -> tuple[TrainState, dict]:
    with path.open("rb") as f:
        meta = json.loads(f.readline().decode())
        return eqx.tree_deserialise_leaves(f, skeleton), meta


METRIC_FIELDS = ["step", "seed", "sps", "sgd_steps", "epsilon", "loss", "loss_q", "loss_psi", "loss_phi", "q_mean",
                 "grad_norm", "rss_gb"] + [f"return_train_{format_task(w)}" for w in TRAIN_TASKS]


def peak_rss_gb() -> float:
    """Peak resident memory of this process (replay included), in GB."""
    import resource
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e6  # Linux reports KiB
EVAL_FIELDS = ["step", "seed", "split", "task", "gpi", "episodes", "return_mean", "return_std"]


# =====================================================================================================================
# Main: build, (resume,) then alternate jitted training chunks with logging, evaluation and checkpoints
# =====================================================================================================================
@exit_on_config_error
def main(args: Args) -> None:
    check_args(args)
    run_dir = Path(args.run_dir or f"runs/{args.exp_name}__{args.seed}")
    checkpoint_path = run_dir / "checkpoint.eqx"
    if args.resume:
        require(checkpoint_path.exists(), f"--resume: no checkpoint at {checkpoint_path}; start a run there first")
        saved = json.loads((run_dir / "config.json").read_text())["args"]
        changed = {k: v for k, v in dataclasses.asdict(args).items()
                   if k not in ("resume", "total_timesteps", "track") and json.loads(json.dumps(v)) != saved.get(k)}
        require(not changed, f"--resume: these settings differ from the saved run: {sorted(changed)}; "
                             "pass the original values (see config.json)")
    else:
        require(not checkpoint_path.exists(),
                f"{run_dir} already holds a run; pass --resume to continue it or choose another --run-dir")
    run_dir.mkdir(parents=True, exist_ok=True)

    setup = make_setup(args)
    seeds = [args.seed + i for i in range(args.num_seeds)]
    keys = jnp.stack([jax.random.PRNGKey(s) for s in seeds])
    state = jax.vmap(lambda k: init_train_state(setup, args, k))(keys)
    num_params = count_params(eqx.combine(jax.tree.map(lambda x: x[0], state.params), setup.static))
    print(f"MSFA network: {num_params:,} parameters (paper: 2.1M)", flush=True)
    start_step = 0
    if args.resume:
        state, meta = load_checkpoint(checkpoint_path, state)
        start_step = meta["step"]
        print(f"resumed {run_dir} at step {start_step:,}", flush=True)
    else:
        config = {"args": dataclasses.asdict(args), "versions": versions(), "num_params": num_params,
                  "sgd_steps_per_iteration": sgd_steps_per_iteration(args), "command": " ".join(sys.argv)}
        (run_dir / "config.json").write_text(json.dumps(config, indent=2))

    per_iteration = steps_per_iteration(args)
    total_iterations = -(-args.total_timesteps // per_iteration)  # at least --total-timesteps
    chunk_iterations = max(1, args.log_every // per_iteration)
    eval_every_iterations = max(1, args.eval_every // per_iteration)
    train_chunk = make_train_chunk(setup, args, chunk_iterations)
    evaluate, eval_tasks = make_evaluate(setup, args)
    metrics_log, eval_log = CsvLog(run_dir / "metrics.csv", METRIC_FIELDS), CsvLog(run_dir / "eval.csv", EVAL_FIELDS)
    from tensorboardX import SummaryWriter
    writer = SummaryWriter(str(run_dir))
    if args.track:
        import wandb
        wandb.init(project=args.wandb_project_name, entity=args.wandb_entity, config=dataclasses.asdict(args),
                   name=run_dir.name, dir=str(run_dir), sync_tensorboard=True, resume="allow")
    print(f"{args.num_seeds} seed(s) x {args.num_envs} envs, {sgd_steps_per_iteration(args)} SGD steps per "
          f"{per_iteration} env steps; logging every {chunk_iterations * per_iteration:,} steps; run dir {run_dir}")

    def run_eval(state, step):
        eval_key = jax.random.PRNGKey(10_000 + step)
        rows = []
        for i, seed in enumerate(seeds):
            params = jax.tree.map(lambda x: x[i], state.params)
            returns = np.asarray(evaluate(params, jax.random.fold_in(eval_key, seed)))
            for g in (0, 1):
                for t, w in enumerate(eval_tasks):
                    split = "train" if t < len(TRAIN_TASKS) else "test"
                    r = returns[g, t]
                    rows.append({"step": step, "seed": seed, "split": split, "task": format_task(w), "gpi": g,
                                 "episodes": len(r), "return_mean": float(r.mean()), "return_std": float(r.std())})
                    writer.add_scalar(f"seed{seed}/eval_{split}_gpi{g}/{format_task(w)}", float(r.mean()), step)
        eval_log.write(rows)
        test = [r["return_mean"] for r in rows if r["split"] == "test" and r["gpi"] == 1]
        train = [r["return_mean"] for r in rows if r["split"] == "train" and r["gpi"] == 0]
        print(f"eval @ {step:,}: train return {np.mean(train):.2f}, test return (GPI) {np.mean(test):.2f}")

    iteration = start_step // per_iteration
    next_eval = (iteration // eval_every_iterations + 1) * eval_every_iterations
    start_time, start_iteration = time.time(), iteration
    while iteration < total_iterations:
        chunk_start = time.time()
        state, metrics = train_chunk(state)
        metrics = jax.tree.map(np.asarray, metrics)  # [seeds, iterations]: the one host sync per chunk
        iteration += chunk_iterations
        step = iteration * per_iteration
        sps = chunk_iterations * per_iteration / (time.time() - chunk_start)
        rows = []
        for i, seed in enumerate(seeds):
            m = {k: v[i] for k, v in metrics.items()}
            learning = m["learning"] > 0
            row = {"step": step, "seed": seed, "sps": round(sps, 1), "sgd_steps": int(state.sgd_steps[i]),
                   "epsilon": float(m["epsilon"].mean()), "rss_gb": round(peak_rss_gb(), 2)}
            for k in ("loss", "loss_q", "loss_psi", "loss_phi", "q_mean", "grad_norm"):
                row[k] = float(m[k][learning].mean()) if learning.any() else ""
            counts, sums = m["return_count"].sum(0), m["return_sum"].sum(0)
            for t, w in enumerate(TRAIN_TASKS):
                row[f"return_train_{format_task(w)}"] = float(sums[t] / counts[t]) if counts[t] else ""
            rows.append(row)
            for k, v in row.items():
                if k not in ("step", "seed") and v != "":
                    writer.add_scalar(f"seed{seed}/{k}", v, step)
        metrics_log.write(rows)
        elapsed = time.time() - start_time
        eta = elapsed / (iteration - start_iteration) * (total_iterations - iteration)
        returns = [r[f"return_train_{format_task(w)}"] for r in rows for w in TRAIN_TASKS]
        returns = [x for x in returns if x != ""]
        loss = [r["loss"] for r in rows if r["loss"] != ""]
        print(f"step {step:,}/{total_iterations * per_iteration:,} | {sps:,.0f} SPS | ETA {eta / 60:.1f} min | "
              f"train return {f'{np.mean(returns):.2f}' if returns else '-'} | "
              f"loss {f'{np.mean(loss):.4f}' if loss else '-'} | sgd steps {int(state.sgd_steps[0]):,} | "
              f"RSS {peak_rss_gb():.1f} GB", flush=True)
        if iteration >= next_eval or iteration >= total_iterations:
            run_eval(state, step)
            next_eval += eval_every_iterations
            save_checkpoint(checkpoint_path, state, {"step": step, "seeds": seeds})
    writer.close()


if __name__ == "__main__":
    main(tyro.cli(Args))
