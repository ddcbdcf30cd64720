"""The recurrent replay machinery every BabyAI learner shares (MSFA, USFA, UVFA and their variants).

The methods differ in their network, their losses and their evaluation head; everything else (R2D2-style sequence
replay, epsilon-greedy actors, n-step targets, the jitted training program, evaluation, the run directory) is here,
once, so that the paper's comparisons differ only where the methods do. A learner script supplies a `Method`.

Because GotoAvoid is JAX-native, acting, replay insertion, sampling and SGD run as one jitted program per chunk of
training (`lax.scan` over iterations, `vmap` over envs and over seeds); the host loop between chunks only logs,
evaluates and saves. Replay holds sequences of 41 steps (period 40: consecutive sequences share one step) with the
recurrent state before their first step, prioritised by 0.9 max|delta| + 0.1 mean|delta|, and stores the compact
symbolic view: the learner renders the 40x40 RGB image the network sees.
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
from typing import Callable, NamedTuple

import equinox as eqx
import flashbax as fbx
import jax
import jax.numpy as jnp
import numpy as np
import optax

from common.babyai import NUM_ACTIONS, TEST_TASKS, TRAIN_TASKS, EnvParams, GotoAvoid, format_task, make_params
from common.errors import require
from common.networks import count_params, oar_vector

ENVS = ("babyai",)
"""environments the BabyAI-style learners run on (Fruitbot and MiniHack are not implemented yet)"""


# =====================================================================================================================
# Arguments shared by every learner: the run, and the paper's R2D1 settings for BabyAI (protocol.md section 5)
# =====================================================================================================================
@dataclass
class R2D2Args:
    exp_name: str = "r2d2"
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
    epsilon_exponents: tuple[float, float] = (1.0, 8.0)
    """each env draws epsilon per episode from logspace(a, b, num_epsilons, base=epsilon_base)"""
    num_epsilons: int = 256
    epsilon_base: float = 0.4


def check_r2d2_args(args: R2D2Args) -> None:
    """Refuse run and learning settings that cannot work, with one line saying what to change."""
    for name in ("num_seeds", "total_timesteps", "num_envs", "eval_episodes", "eval_every", "log_every", "n_step",
                 "replay_size", "batch_size", "target_update_period", "sequence_period", "num_epsilons"):
        value = getattr(args, name)
        require(value > 0, f"--{name.replace('_', '-')} must be positive, got {value}")
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


def check_env(env: str) -> None:
    require(env in ENVS, f"--env must be one of {', '.join(ENVS)} (Fruitbot and MiniHack are not implemented yet), "
                         f"got {env!r}")


def steps_per_iteration(args: R2D2Args) -> int:
    """Env steps per seed per iteration: every env adds one sequence period."""
    return args.num_envs * args.sequence_period


def sgd_steps_per_iteration(args: R2D2Args) -> int:
    """SGD steps after each iteration, so that sampled/inserted sequences ~ samples_per_insert."""
    return max(1, round(args.samples_per_insert * args.num_envs / args.batch_size))


class Method(NamedTuple):
    """What a learner script supplies. Its network holds a recurrent `core` (initial_state(), torso(rgb),
    recur(image_map, vector, state) -> (h, c)); heads read h = state[0]."""
    name: str
    make_network: Callable  # (args, key) -> network
    q_values: Callable  # (net, h, w) -> [A]: acting while training, and evaluation without GPI
    gpi_q_values: Callable | None  # (net, h, w, policies [Z, C]) -> [A] with GPI over the policies; None: no GPI
    batch_loss: Callable  # (net, target_net, render, batch, probabilities, args) -> (loss, (priorities, metrics))
    loss_names: tuple[str, ...]  # the loss terms batch_loss reports besides "loss" and "q_mean"
    paper_params: str  # the paper's parameter count (its hyperparameter table) for the printed comparison


# =====================================================================================================================
# Replay items, recurrent unroll, n-step targets and priorities
# =====================================================================================================================
class Step(NamedTuple):
    obs: jax.Array  # uint8 [5, 5, 3], the symbolic view (rendered to RGB by the network's caller)
    w: jax.Array  # float32 [C], the task as the agent sees it
    prev_action: jax.Array  # int32
    prev_reward: jax.Array  # float32
    first: jax.Array  # bool: obs starts an episode (the recurrent state is reset before it)
    action: jax.Array  # int32, taken at obs
    reward: jax.Array  # float32, received for action
    phi: jax.Array  # float32 [C], the env's cumulant of the same transition: reward = phi . w


class Sequence(NamedTuple):
    steps: Step  # each field [T, ...]
    state: tuple  # (h, c): the recurrent state before steps[0] (reset there if steps.first[0])


def reset_where(first, state, initial):
    """The recurrent state, replaced by the initial one where a new episode starts (first: [] or [E])."""
    def pick(s, i):
        return jnp.where(first.reshape(first.shape + (1,) * (s.ndim - first.ndim)), i, s)
    return jax.tree.map(pick, state, initial)


def core_step(core, rgb, prev_action, prev_reward, state):
    """One step of a recurrent core on one observation."""
    return core.recur(core.torso(rgb), oar_vector(prev_action, prev_reward, NUM_ACTIONS), state)


def unroll(core, render, seq: Sequence):
    """The states h [T, ...] along a sequence, resetting at episode starts (the torso runs outside the scan)."""
    maps = jax.vmap(lambda o: core.torso(render(o)))(seq.steps.obs)
    vectors = jax.vmap(partial(oar_vector, num_actions=NUM_ACTIONS))(seq.steps.prev_action, seq.steps.prev_reward)

    def step(state, x):
        image_map, vector, first = x
        state = core.recur(image_map, vector, reset_where(first, state, core.initial_state()))
        return state, state[0]

    _, h = jax.lax.scan(step, seq.state, (maps, vectors, seq.steps.first))
    return h


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


def masked_mean(x, mask):
    """Mean of x over the entries where mask holds (the original's episode_mean)."""
    return jnp.sum(x * mask) / (jnp.sum(mask) + 1e-5)


def sequence_priority(delta, valid, max_weight: float):
    """R2D2's priority of a sequence: max_weight max_t|delta_t| + (1 - max_weight) mean_t|delta_t| over valid t."""
    abs_delta = jnp.abs(delta)
    return max_weight * jnp.max(jnp.where(valid, abs_delta, 0.0)) + (1 - max_weight) * masked_mean(abs_delta, valid)


def importance_weights(probabilities, exponent: float):
    """(1 / P_b)^beta normalised by its batch maximum (beta = 0 in BabyAI: no correction)."""
    weights = (1.0 / (probabilities + 1e-6)) ** exponent
    return weights / jnp.max(weights)


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
    method: Method
    env: GotoAvoid
    env_params: object
    static: object
    optimizer: optax.GradientTransformation
    buffer: object
    epsilons: jax.Array


def make_setup(method: Method, args: R2D2Args) -> Setup:
    env = GotoAvoid(obs_mode="symbolic", truncate_task_input=args.truncate_task_input)
    _, static = eqx.partition(method.make_network(args, jax.random.PRNGKey(0)), eqx.is_inexact_array)
    optimizer = optax.chain(optax.clip_by_global_norm(args.max_grad_norm),
                            optax.adam(args.learning_rate, eps=args.adam_eps))
    buffer = fbx.make_prioritised_item_buffer(
        max_length=args.replay_size, min_length=args.min_replay_size, sample_batch_size=args.batch_size,
        add_batches=True, priority_exponent=args.priority_exponent,
        device="cpu" if jax.default_backend() == "cpu" else "gpu")
    lo, hi = args.epsilon_exponents
    epsilons = jnp.logspace(lo, hi, args.num_epsilons, base=args.epsilon_base)
    return Setup(method, env, make_params(TRAIN_TASKS), static, optimizer, buffer, epsilons)


def init_train_state(setup: Setup, args: R2D2Args, key) -> TrainState:
    k_net, k_target, k_env, k_eps, k_run = jax.random.split(key, 5)
    params, _ = eqx.partition(setup.method.make_network(args, k_net), eqx.is_inexact_array)
    # as in the original, the target network starts from its own random init until the first copy
    target_params, _ = eqx.partition(setup.method.make_network(args, k_target), eqx.is_inexact_array)
    obs, env_state = jax.vmap(setup.env.reset, (0, None))(jax.random.split(k_env, args.num_envs), setup.env_params)
    net = eqx.combine(params, setup.static)
    e = args.num_envs
    actors = Actor(
        env_state=env_state, obs=obs, prev_action=jnp.zeros(e, jnp.int32), prev_reward=jnp.zeros(e),
        first=jnp.ones(e, bool),
        rnn=jax.tree.map(lambda x: jnp.broadcast_to(x, (e,) + x.shape), net.core.initial_state()),
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
                first=actors.first, action=actors.prev_action, reward=actors.prev_reward,
                phi=jnp.zeros_like(actors.obs.w))


def make_sequences(steps: Step, actors: Actor, start_rnn) -> Sequence:
    """One sequence per env: the period's steps [P, E] plus the step the envs are at now (action/reward 0)."""
    last = example_step(actors)._replace(action=jnp.zeros_like(actors.prev_action),
                                         reward=jnp.zeros_like(actors.prev_reward))
    steps = jax.tree.map(lambda xs, x: jnp.concatenate([xs, x[None]]), steps, last)
    return Sequence(steps=jax.tree.map(lambda x: jnp.swapaxes(x, 0, 1), steps), state=start_rnn)


def act_step(setup: Setup, args: R2D2Args, params, actors: Actor, key):
    """One env step in every env: epsilon-greedy on the method's Q for the training task w (no GPI)."""
    net = eqx.combine(params, setup.static)
    env = setup.env
    k_explore, k_action, k_env, k_eps = jax.random.split(key, 4)
    e = args.num_envs
    rnn = reset_where(actors.first, actors.rnn, net.core.initial_state())
    rnn = jax.vmap(partial(core_step, net.core))(jax.vmap(env.rgb_from_symbolic)(actors.obs.image),
                                                 actors.prev_action, actors.prev_reward, rnn)
    q = jax.vmap(partial(setup.method.q_values, net))(rnn[0], actors.obs.w)
    explore = jax.random.uniform(k_explore, (e,)) < actors.epsilon
    action = jnp.where(explore, jax.random.randint(k_action, (e,), 0, NUM_ACTIONS), jnp.argmax(q, -1))
    obs, env_state, reward, _, truncated, info = jax.vmap(env.step, (0, 0, 0, None))(
        jax.random.split(k_env, e), actors.env_state, action, setup.env_params)
    step = example_step(actors)._replace(action=action, reward=reward, phi=info["phi"])
    episode_return = actors.episode_return + reward
    finished = {"done": truncated, "return": episode_return, "task": jnp.argmax(actors.obs.w, -1)}
    actors = Actor(
        env_state=env_state, obs=obs, prev_action=jnp.where(truncated, 0, action),
        prev_reward=jnp.where(truncated, 0.0, reward), first=truncated, rnn=rnn,
        epsilon=jnp.where(truncated, jax.random.choice(k_eps, setup.epsilons, (e,)), actors.epsilon),
        episode_return=jnp.where(truncated, 0.0, episode_return))
    return actors, (step, finished)


def sgd_step(setup: Setup, args: R2D2Args, state: TrainState, key):
    """Sample a batch of sequences, take one Adam step, refresh their priorities, maybe copy the target."""
    sample = setup.buffer.sample(state.buffer, key)
    target_net = eqx.combine(state.target_params, setup.static)

    def loss_fn(params):
        return setup.method.batch_loss(eqx.combine(params, setup.static), target_net, setup.env.rgb_from_symbolic,
                                       sample.experience, sample.probabilities, args)

    grads, (priorities, metrics) = jax.grad(loss_fn, has_aux=True)(state.params)
    updates, opt_state = setup.optimizer.update(grads, state.opt_state, state.params)
    params = eqx.apply_updates(state.params, updates)
    buffer = setup.buffer.set_priorities(state.buffer, sample.indices, priorities)
    sgd_steps = state.sgd_steps + 1
    copy = sgd_steps % args.target_update_period == 0
    target_params = jax.tree.map(lambda p, t: jnp.where(copy, p, t), params, state.target_params)
    metrics["grad_norm"] = optax.tree.norm(grads)
    return state._replace(params=params, target_params=target_params, opt_state=opt_state, buffer=buffer,
                          sgd_steps=sgd_steps), metrics


def loss_metric_names(method: Method) -> tuple[str, ...]:
    return ("loss", *method.loss_names, "q_mean", "grad_norm")


def train_iteration(setup: Setup, args: R2D2Args, state: TrainState, _):
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
        return state, {k: jnp.zeros(()) for k in loss_metric_names(setup.method)} | {"learning": jnp.zeros(())}

    state, metrics = jax.lax.cond(setup.buffer.can_sample(state.buffer), learn, wait, state)
    num_tasks = TRAIN_TASKS.shape[0]
    done = finished["done"]
    one_hot = jax.nn.one_hot(finished["task"], num_tasks) * done[..., None]
    metrics["return_sum"] = jnp.sum(one_hot * finished["return"][..., None], axis=(0, 1))
    metrics["return_count"] = jnp.sum(one_hot, axis=(0, 1))
    metrics["epsilon"] = jnp.mean(actors.epsilon)
    return state, metrics


def make_train_chunk(setup: Setup, args: R2D2Args, iterations: int):
    """A jitted function running `iterations` training iterations for every (vmapped) seed."""
    def chunk(state):
        return jax.lax.scan(partial(train_iteration, setup, args), state, None, length=iterations)
    return jax.jit(jax.vmap(chunk), donate_argnums=0)


# =====================================================================================================================
# Evaluation: greedy, on train and test tasks, with GPI over the train tasks (if the method has it) and without
# =====================================================================================================================
def gpi_settings(method: Method) -> tuple[int, ...]:
    return (0, 1) if method.gpi_q_values is not None else (0,)


def make_evaluate(setup: Setup, args: R2D2Args):
    env, method = setup.env, setup.method
    policies = jnp.asarray(TRAIN_TASKS)

    def episode_return(params, key, w, use_gpi: bool):
        net = eqx.combine(params, setup.static)
        env_params = EnvParams(tasks=w[None])
        key_reset, key_run = jax.random.split(key)
        obs, env_state = env.reset(key_reset, env_params)
        carry0 = (env_state, obs, jnp.zeros((), jnp.int32), jnp.zeros(()), net.core.initial_state())

        def step(carry, key):
            env_state, obs, prev_action, prev_reward, rnn = carry
            rnn = core_step(net.core, env.rgb_from_symbolic(obs.image), prev_action, prev_reward, rnn)
            if use_gpi:
                q = method.gpi_q_values(net, rnn[0], obs.w, policies)
            else:
                q = method.q_values(net, rnn[0], obs.w)
            action = jnp.argmax(q)
            obs, env_state, reward, _, _, _ = env.step(key, env_state, action, env_params)
            return (env_state, obs, action, reward, rnn), reward

        _, rewards = jax.lax.scan(step, carry0, jax.random.split(key_run, env_params.max_steps_in_episode))
        return rewards.sum()

    tasks = jnp.asarray(np.concatenate([TRAIN_TASKS, TEST_TASKS]))

    @jax.jit
    def evaluate(params, key):
        """Returns [GPI settings (0, then 1 if the method has GPI), tasks, episodes] for one seed's params."""
        keys = jax.random.split(key, (2, len(tasks), args.eval_episodes))
        out = []
        for g in gpi_settings(method):
            per_episode = jax.vmap(partial(episode_return, use_gpi=g == 1), (None, 0, None))
            out.append(jax.vmap(per_episode, (None, 0, 0))(params, keys[g], tasks))
        return jnp.stack(out)

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


def drop_rows_after(path: Path, step: int) -> None:
    """Keep the CSV rows with step <= `step` (a run stopped after its last checkpoint logged rows that resuming
    redoes)."""
    if not path.exists():
        return
    with path.open(newline="") as f:
        rows = list(csv.reader(f))
    kept = [rows[0]] + [r for r in rows[1:] if int(r[0]) <= step]
    if len(kept) < len(rows):
        with path.open("w", newline="") as f:
            csv.writer(f).writerows(kept)


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


def peak_rss_gb() -> float:
    """Peak resident memory of this process (replay included), in GB."""
    import resource
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e6  # Linux reports KiB


EVAL_FIELDS = ["step", "seed", "split", "task", "gpi", "episodes", "return_mean", "return_std"]


def metric_fields(method: Method) -> list[str]:
    return (["step", "seed", "sps", "sgd_steps", "epsilon", *loss_metric_names(method), "rss_gb"]
            + [f"return_train_{format_task(w)}" for w in TRAIN_TASKS])


# =====================================================================================================================
# Training: build, (resume,) then alternate jitted training chunks with logging, evaluation and checkpoints
# =====================================================================================================================
def train(method: Method, args: R2D2Args) -> None:
    """Run (or resume) a training run of `method` into its run directory. Call check_r2d2_args first."""
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

    setup = make_setup(method, args)
    seeds = [args.seed + i for i in range(args.num_seeds)]
    keys = jnp.stack([jax.random.PRNGKey(s) for s in seeds])
    state = jax.vmap(lambda k: init_train_state(setup, args, k))(keys)
    num_params = count_params(eqx.combine(jax.tree.map(lambda x: x[0], state.params), setup.static))
    print(f"{method.name} network: {num_params:,} parameters (paper: {method.paper_params})", flush=True)
    start_step = 0
    if args.resume:
        state, meta = load_checkpoint(checkpoint_path, state)
        start_step = meta["step"]
        for name in ("metrics.csv", "eval.csv"):  # rows logged after the checkpoint will be logged again
            drop_rows_after(run_dir / name, start_step)
        print(f"resumed {run_dir} at step {start_step:,}", flush=True)
    else:
        config = {"args": dataclasses.asdict(args), "method": method.name, "versions": versions(),
                  "num_params": num_params, "sgd_steps_per_iteration": sgd_steps_per_iteration(args),
                  "command": " ".join(sys.argv)}
        (run_dir / "config.json").write_text(json.dumps(config, indent=2))

    per_iteration = steps_per_iteration(args)
    total_iterations = -(-args.total_timesteps // per_iteration)  # at least --total-timesteps
    chunk_iterations = max(1, args.log_every // per_iteration)
    eval_every_iterations = max(1, args.eval_every // per_iteration)
    train_chunk = make_train_chunk(setup, args, chunk_iterations)
    evaluate, eval_tasks = make_evaluate(setup, args)
    loss_names = loss_metric_names(method)
    metrics_log = CsvLog(run_dir / "metrics.csv", metric_fields(method))
    eval_log = CsvLog(run_dir / "eval.csv", EVAL_FIELDS)
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
            for g_index, g in enumerate(gpi_settings(method)):
                for t, w in enumerate(eval_tasks):
                    split = "train" if t < len(TRAIN_TASKS) else "test"
                    r = returns[g_index, t]
                    rows.append({"step": step, "seed": seed, "split": split, "task": format_task(w), "gpi": g,
                                 "episodes": len(r), "return_mean": float(r.mean()), "return_std": float(r.std())})
                    writer.add_scalar(f"seed{seed}/eval_{split}_gpi{g}/{format_task(w)}", float(r.mean()), step)
        eval_log.write(rows)
        g = max(gpi_settings(method))
        test = [r["return_mean"] for r in rows if r["split"] == "test" and r["gpi"] == g]
        train = [r["return_mean"] for r in rows if r["split"] == "train" and r["gpi"] == 0]
        print(f"eval @ {step:,}: train return {np.mean(train):.2f}, test return ({'GPI' if g else 'no GPI'}) "
              f"{np.mean(test):.2f}", flush=True)

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
            for k in loss_names:
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
