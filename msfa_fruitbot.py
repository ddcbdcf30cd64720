"""MSFA on Procgen Fruitbot: Modular Successor Feature Approximators (Carvalho et al., ICLR 2023), in one file.

The agent keeps n state modules (FARM). Module k learns its own cumulant phi^k from its state at t and t+1, and its
own successor features psi^k from its state and its slice of the task w. Q = psi . w. Three losses train it:
n-step Q-learning on psi . w, n-step successor-feature learning with phi as pseudo-reward, and regression of
phi . w on the reward. At test time GPI composes the train-task policies: argmax_a max_z psi(s, a, z) . w_test.

The file reads top to bottom as the whole algorithm: arguments (the paper's Fruitbot settings as defaults), the
network and its Q/GPI heads, replay items, the recurrent unroll, n-step targets and the losses, acting, the jitted
training program, evaluation, and main. The game is JAX (common/envs/fruitbot_jax.py: procgen's rules, proven
against procgen; the original's per-task games by default), so acting, replay and SGD run as one jitted program per
chunk; --env-backend procgen steps stock procgen (hard or easy) on the host through io_callback instead. Beyond
BabyAI: an episode is a lifetime of up to 4 levels (a barrier ends it as a termination, the per-level timeout is a
masked truncation); the Impala torso; importance weights (exponent 0.6); GPI support from a flag.

    python msfa_fruitbot.py --seed 3                 # the paper's Fruitbot settings (replay of game states: 0.36 GiB)
    python msfa_fruitbot.py --distribution-mode hard --env-backend procgen --replay-size 10000   # frames: 4.7 GiB
    python msfa_fruitbot.py --help                   # every option
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from functools import partial
from typing import Literal, NamedTuple

import equinox as eqx
import flashbax as fbx
import jax
import jax.numpy as jnp
import numpy as np
import optax

from common.farm import FarmCore
from common.envs import fruitbot, fruitbot_jax
from common.envs.fruitbot import IMAGE_SHAPE, MAX_LEVELS, NUM_ACTIONS, TEST_TASKS, TRAIN_LEVELS, TRAIN_TASKS, Fruitbot
from common.envs.host import play_first_episodes
from common.gpi import gpi_values
from common.networks import MLP, count_params
from common.run import (IterationMetrics, RunArgs, RunDir, SGDMetrics, Training, check_replay_args, check_replay_memory,
                        check_run_args, cumulant_stats, exit_on_config_error, finished_episodes, parse_args, require,
                        require_non_negative, require_positive, train_in_chunks, whole_iterations)


# =====================================================================================================================
# Arguments: defaults are the paper's Fruitbot settings (docs/protocol.md)
# =====================================================================================================================
@dataclass
class Args(RunArgs):
    # --- The algorithm: network, losses, sequences and targets, replay, optimiser, acting (defaults: the paper's) ---
    num_modules: int = 4
    """FARM modules; each owns an equal slice of the task vector"""
    module_size: int = 60
    """size of each module's state"""
    attention_heads: int = 2
    """heads of FARM's inter-module attention"""
    projection_dim: int = 16
    """channels of FARM's feature attention"""
    psi_hidden: tuple[int, ...] = (512, 512)
    """hidden sizes of the psi MLP (shared by the modules)"""
    phi_hidden: tuple[int, ...] = (256, 256)
    """hidden sizes of the phi MLP (shared by the modules)"""
    entangled_psi: bool = False
    """ablation: one psi MLP on [h^1; ...; h^n; z] gives all of psi (USFA's head on the concatenated modules)"""
    entangled_phi: bool = False
    """ablation: one phi MLP on [h^1_{t+1}; h^1_t; ...; h^n_{t+1}; h^n_t] gives all of phi"""
    reward_input: Literal["on", "off"] = "on"
    """on: the recurrent core reads the previous reward tanh(r_{t-1}) beside the previous action (the paper's agent);
    off: its entry is 0, so the module states, and the cumulants phi read from them, cannot see the reward (the
    cumulants' confound: docs/cumulants.md)"""
    q_coeff: float = 0.5
    """weight alpha_Q of the Q-learning loss on psi . w"""
    sf_coeff: float = 1.0
    """weight alpha_psi of the successor-feature loss"""
    phi_coeff: float = 1.0
    """weight alpha_phi of the reward regression phi . w ~ r"""
    sequence_length: int = 41
    """steps per replayed sequence (sequence period + 1)"""
    sequence_period: int = 40
    """env steps between the starts of consecutive sequences (consecutive sequences share one step)"""
    n_step: int = 5
    """steps of the n-step targets"""
    gamma: float = 0.99
    """discount"""
    replay_size: int = 70_000
    """replay capacity in sequences (~6 KB each with the JAX game's states, ~0.5 MB with 64x64x3 frames)"""
    replay_frames: bool = False
    """keep each step's 64x64x3 frame in replay (12,288 bytes) instead of the JAX game's state it is drawn from
    (38 bytes: GameView; the learner draws the frames of each sampled batch, the same pixels the actors saw); the
    procgen backend and fresh training levels (--train-levels 0) have no such state and always keep frames"""
    min_replay_size: int = 10_000
    """sequences in replay before learning starts"""
    samples_per_insert: float = 6.0
    """sampled sequences per inserted sequence (the replay ratio)"""
    batch_size: int = 8
    """sequences per SGD step"""
    priority_exponent: float = 0.9
    """replay samples sequences with probability ~ priority^exponent"""
    importance_exponent: float = 0.6
    """exponent of the importance weights that correct prioritised sampling (0: no correction)"""
    max_priority_weight: float = 0.9
    """priority = w max|delta| + (1 - w) mean|delta| over the sequence"""
    priority_from_q: bool = False
    """also prioritise by the Q TD error: priority = that of the psi TD errors (mean over cumulants) + that of the Q
    TD error (default: psi only, as the original)"""
    learning_rate: float = 1e-3
    """Adam step size"""
    adam_eps: float = 1e-3
    """Adam epsilon"""
    max_grad_norm: float = 80.0
    """gradients are clipped to this global norm"""
    target_update_period: int = 2500
    """SGD steps between copies of the online network into the target network"""
    num_envs: int = 32
    """parallel envs per seed (the original used 3 actor processes)"""
    epsilon_exponents: tuple[float, float] = (1.0, 8.0)
    """each env draws epsilon per episode from logspace(a, b, num_epsilons, base=epsilon_base)"""
    num_epsilons: int = 256
    """number of epsilons in the actors' set"""
    epsilon_base: float = 0.4
    """base of the actors' epsilon logspace"""

    # --- The environment and its levels ---
    distribution_mode: str = "paper"
    """the game: "paper" (the original's per-task games: easy mode, levels 90 tall, each task its own object lists,
    no completion bonus; JAX only), or stock procgen's "hard" (all 12 object types, doors) or "easy" (4 types)"""
    env_backend: str = "jax"
    """"jax": the game in JAX inside the jitted program (common/envs/fruitbot_jax.py); "procgen": stock procgen on the
    host through io_callback (hard or easy only)"""
    train_levels: int = TRAIN_LEVELS
    """training levels: procgen's level seeds 0..train_levels-1, or with JAX a pool of that many levels per task
    drawn once from key 0 (the same for every seed, as procgen's); 0: a fresh level every time"""
    eval_levels: int = 1_000
    """JAX: evaluation levels per task, a pool drawn from another key than the training levels (0: a fresh level
    every time, slower); procgen evaluates on unrestricted levels"""
    max_levels: int = MAX_LEVELS
    """levels per episode (lifetime): completing the last one ends the episode"""

    # --- The original code's quirks (off: the method as the paper describes it; on: as the authors' code ran it) ---
    time_limit_is_termination: bool = False
    """the original's "every done is a termination": the per-level timeout (1000 steps) also ends the episode as a
    terminal transition instead of a masked truncation"""
    gpi_support: str = "train"
    """the policies z that GPI maximises over at evaluation: "train" (the 4 train tasks, the paper's method) or
    "test" (the 6 test tasks: what the original code's Fruitbot evaluator did)"""

    # --- Run controls: seeds, budget, evaluation, logging, speed-only options (the rest: common.run.RunArgs) ---
    exp_name: str = os.path.splitext(os.path.basename(__file__))[0]
    """name of the experiment (prefix of the default run directory): the script's file name, so a copy names its own"""
    seed: int = 1
    """seed of the first run; vmapped runs use seed, seed + 1, ..."""
    num_seeds: int = 1
    """independent runs trained side by side in one program (vmapped; with --env-backend procgen each steps its own
    envs on the host)"""
    total_timesteps: int = 10_000_000
    """env steps per seed (rounded up to whole iterations of num_envs x sequence_period)"""
    eval_episodes: int = 10
    """greedy episodes (lifetimes: on --eval-levels levels with JAX, unrestricted levels with procgen) per task and
    per GPI setting at each evaluation"""
    eval_every: int = 500_000
    """env steps (per seed) between evaluations; one more runs at the end"""
    log_every: int = 2_560
    """env steps (per seed) between progress lines and metrics rows"""
    core_backend: str | None = None
    """speed only: how FARM's recurrence is computed (common/farm.py): plain (FARM.step in a lax.scan: the
    definition), fused (the same function arranged for speed, common/farm_fast.py), pallas (that as GPU kernels,
    common/farm_pallas.py), pallas-bf16 (those with the LSTMs' weight in bfloat16: not exact); default: the fastest
    measured on this device kind, plain for an edited FARM (docs/learner_speed.md)"""


def check_args(args: Args) -> None:
    """Refuse settings that cannot work, with one line saying what to change."""
    check_run_args(args)
    require_positive(args, "num_seeds", "total_timesteps", "num_envs", "eval_episodes", "eval_every", "log_every",
                     "n_step", "replay_size", "batch_size", "target_update_period", "sequence_period", "num_epsilons",
                     "num_modules", "attention_heads", "projection_dim", "learning_rate", "adam_eps", "max_grad_norm",
                     "epsilon_base", "samples_per_insert")
    FarmCore.backend_to_run(args.core_backend)  # one of BACKENDS, and a fast one only for common/farm.py's FARM
    require_non_negative(args, "q_coeff", "sf_coeff", "phi_coeff", "seed", "importance_exponent")
    require(all(x > 0 for x in args.psi_hidden + args.phi_hidden), "--psi-hidden and --phi-hidden sizes must be "
                                                                   "positive")
    require_positive(args, "module_size", "max_levels")
    require_non_negative(args, "train_levels")
    fruitbot.check_game(args.distribution_mode, args.env_backend)
    require_non_negative(args, "eval_levels")
    require(args.gpi_support in GPI_SUPPORTS,
            f"--gpi-support must be one of {', '.join(GPI_SUPPORTS)}, got {args.gpi_support!r}")
    require(TRAIN_TASKS.shape[1] % args.num_modules == 0,
            f"--num-modules must divide the task dimension {TRAIN_TASKS.shape[1]}, got {args.num_modules}")
    check_replay_args(args)


def keeps_game_views(args: Args) -> bool:
    """Whether replay keeps the JAX game's GameViews (drawn into frames by the learner) rather than the frames."""
    return args.env_backend == "jax" and args.train_levels > 0 and not args.replay_frames


def replay_bytes(args: Args, frames: bool | None = None) -> int:
    """Memory replay takes per seed: every step's observation (a GameView, or a 64x64x3 uint8 frame with frames or
    where replay keeps them) and its other fields, and each sequence's recurrent state (h, c)."""
    frames = not keeps_game_views(args) if frames is None else frames
    obs = (int(np.prod(IMAGE_SHAPE)) if frames
           else fruitbot_jax.view_bytes(fruitbot.JAX_GAMES[args.distribution_mode]))
    per_step = obs + 4 * (2 * TRAIN_TASKS.shape[1] + 4) + 2
    return args.replay_size * (args.sequence_length * per_step + 2 * 4 * args.num_modules * args.module_size)


GPI_SUPPORTS = ("train", "test")


def method_name(args: Args) -> str:
    parts = [name for name, on in (("entangled psi", args.entangled_psi), ("entangled phi", args.entangled_phi),
                                   ("reward-blind", args.reward_input == "off")) if on]
    return f"MSFA ({', '.join(parts)})" if parts else "MSFA"


def steps_per_iteration(args: Args) -> int:
    """Env steps per seed per iteration: every env adds one sequence period."""
    return args.num_envs * args.sequence_period


def sgd_steps_per_iteration(args: Args) -> int:
    """SGD steps after each iteration, so that sampled/inserted sequences ~ samples_per_insert."""
    return max(1, round(args.samples_per_insert * args.num_envs / args.batch_size))


# =====================================================================================================================
# Network: Impala torso -> FARM modules -> per-module psi^k(s^k, a, w * e_k) and phi^k(s^k_t, s^k_{t+1}); Q = psi . w
# =====================================================================================================================
class MSFANetwork(eqx.Module):
    core: FarmCore  # the module states s^k = h^k
    psi_mlp: MLP  # modular: shared by modules, [h^k; z * e_k] -> A x C_k; entangled: [h^1..h^n; z] -> A x C
    phi_mlp: MLP  # modular: shared by modules, [h^k_{t+1}; h^k_t] -> C_k; entangled: all modules' pairs -> C
    num_modules: int = eqx.field(static=True)
    task_dim: int = eqx.field(static=True)
    entangled_psi: bool = eqx.field(static=True)
    entangled_phi: bool = eqx.field(static=True)

    def __init__(self, args: Args, task_dim: int, key):
        k_core, k_psi, k_phi = jax.random.split(key, 3)
        n, d = args.num_modules, args.module_size
        per_module = task_dim // n
        self.core = FarmCore(NUM_ACTIONS, n, d, args.attention_heads, args.projection_dim, k_core, torso="impala",
                             backend=args.core_backend, reward_input=args.reward_input == "on")
        if args.entangled_psi:
            self.psi_mlp = MLP((n * d + task_dim, *args.psi_hidden, NUM_ACTIONS * task_dim), k_psi)
        else:
            self.psi_mlp = MLP((d + task_dim, *args.psi_hidden, NUM_ACTIONS * per_module), k_psi)
        self.phi_mlp = MLP((2 * d * (n if args.entangled_phi else 1), *args.phi_hidden,
                            task_dim if args.entangled_phi else per_module), k_phi)
        self.task_dim, self.entangled_psi, self.entangled_phi = task_dim, args.entangled_psi, args.entangled_phi
        self.num_modules = n

    def module_masks(self):
        """e_k: the 0/1 mask [n, C] of module k's slice of the task vector."""
        return jnp.repeat(jnp.eye(self.num_modules), self.task_dim // self.num_modules, axis=1)

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
    """Q(s, a; w) = psi(s, a, w) . w: acting on the training task, and evaluation without GPI."""
    return net.psi(h, w) @ w


def gpi_q_values(net, h, w, policies):
    """GPI: max_z psi(s, a, z) . w over the policies z (the train tasks)."""
    return gpi_values(jax.vmap(net.psi, (None, 0))(h, policies), w)


# =====================================================================================================================
# Replay items and the recurrent unroll
# =====================================================================================================================
class Step(NamedTuple):
    obs: jax.Array  # the frame, uint8 [64, 64, 3]; in replay, the JAX game's GameView it is drawn from (replay_frames)
    w: jax.Array  # float32 [C], the task
    prev_action: jax.Array  # int32
    prev_reward: jax.Array  # float32
    first: jax.Array  # bool: obs starts an episode (the recurrent state is reset before it)
    action: jax.Array  # int32, taken at obs
    reward: jax.Array  # float32, received for action: w . phi
    phi: jax.Array  # float32 [C], the env's cumulant of the same transition (objects of each category collected)
    terminal: jax.Array  # bool: action ended the episode by termination (a barrier, or the last level completed)


class Sequence(NamedTuple):
    """A replay item: sequence_length steps and the recurrent state before the first (R2D2's stored state)."""
    steps: Step  # each field [T, ...]
    state: tuple  # (h, c): the recurrent state before steps[0] (reset there if steps.first[0])


def kept_in_replay(setup, args: Args, env_state):
    """What replay keeps instead of the envs' current frames: the JAX game's GameViews (keeps_game_views), or None
    (replay keeps the frames)."""
    return jax.vmap(setup.env.view, (0, None))(env_state, setup.env_params) if keeps_game_views(args) else None


def replay_frames(setup, steps: Step) -> Step:
    """A sampled batch's steps with their frames: drawn from the GameViews replay keeps, in one batched render of
    every step of every sequence (the online and the target unroll then read the same frames)."""
    if not isinstance(steps.obs, fruitbot_jax.GameView):
        return steps
    return steps._replace(obs=setup.env.draw(steps.obs, setup.env_params))


def reset_where(first, state, initial):
    """The recurrent state, replaced by the initial one where a new episode starts (first: [] or [E])."""
    def pick(s, i):
        return jnp.where(first.reshape(first.shape + (1,) * (s.ndim - first.ndim)), i, s)
    return jax.tree.map(pick, state, initial)


def core_step(core, image, prev_action, prev_reward, state):
    """One step of the recurrent core on one frame."""
    return core.recur(core.torso(image), core.input_vector(prev_action, prev_reward), state)


def unroll(core, seq: Sequence):
    """The torso's maps [T, 8, 8, 32] of a sequence's frames (the torso runs outside the loop) and the recurrent
    states (h, c) [T, ...] along it."""
    maps = jax.vmap(core.torso)(seq.steps.obs)
    vectors = jax.vmap(core.input_vector)(seq.steps.prev_action, seq.steps.prev_reward)
    return maps, core.unroll(maps, vectors, seq.steps.first, seq.state)


def next_states(core, maps, seq: Sequence, states):
    """h_{t+1} [T-1, ...] of each transition t, for its learned cumulant phi(h_{t+1}, h_t): the next step's state.
    Where the episode ended at t, procgen has already shown the next level's first frame (it resets before it
    renders); as in the original, that frame, read without resetting the state, stands for the final view. Only
    terminal transitions use it: truncated ones are masked."""
    h_next = states[0][1:]
    s = seq.steps
    vectors = jax.vmap(core.input_vector)(s.action[:-1], s.reward[:-1])
    carried, _ = jax.vmap(core.recur)(maps[1:], vectors, jax.tree.map(lambda x: x[:-1], states))
    return jnp.where(s.first[1:].reshape((-1,) + (1,) * (h_next.ndim - 1)), carried, h_next)


# =====================================================================================================================
# n-step targets, priorities and the MSFA losses
# =====================================================================================================================
def n_step_targets(rewards, values, continues, n: int, gamma: float, terminal_at_end=False):
    """Truncated n-step targets for the T-1 transitions of a sequence of T steps.

    rewards [T-1, ...]: reward (or cumulant) of transition t (step t -> t+1).
    values [T, ...]: bootstrap value of each step.
    continues [T-1]: step t+1 is in the same episode as step t.
    terminal_at_end: bool, or bool [T-1]: where transition t ends its episode, whether by termination.
    G_t = sum_{i<m} gamma^i rewards[t+i] + gamma^m values[t+m], with m = min(n, the steps left in t's episode
    within the sequence). An episode that ends by truncation (a time limit) never saw its next observation: its last
    transition has m = 0 and is masked. One that ends by termination (the env's terminal events; every end with
    --time-limit-is-termination, the original's) learns its last transition too: a return reaching that end sums the
    rewards up to and including it and bootstraps nothing. Returns (targets, valid).
    """
    num = rewards.shape[0]
    extra = (None,) * (rewards.ndim - 1)
    pad = lambda x: jnp.concatenate([x, jnp.zeros((n,) + x.shape[1:], x.dtype)])  # noqa: E731
    terminal = jnp.broadcast_to(jnp.asarray(terminal_at_end, bool), (num,))
    rewards_p, continues_p, terminal_p = pad(rewards), pad(continues.astype(bool)), pad(terminal)
    t = jnp.arange(num)
    total = jnp.zeros_like(rewards)
    discount = jnp.ones(num, rewards.dtype)
    boot = t
    alive = jnp.ones(num, bool)  # transition t + i belongs to t's episode
    ended = jnp.zeros(num, bool)  # the return reached its episode's terminal end
    for i in range(n):
        # a transition counts if its next observation was seen, or if it ended the episode by termination
        counted = alive & (t + i < num) & (continues_p[t + i] | terminal_p[t + i])
        total = total + jnp.where(counted, discount, 0.0)[(...,) + extra] * rewards_p[t + i]
        discount = jnp.where(counted, discount * gamma, discount)
        boot = jnp.where(counted, t + i + 1, boot)
        ended = ended | (counted & ~continues_p[t + i])
        alive = counted & continues_p[t + i]
    bootstrap = jnp.where(ended, 0.0, discount)[(...,) + extra] * values[boot]
    return total + bootstrap, boot > t


def terminal_transitions(seq: Sequence, args: Args):
    """bool [T-1]: transition t ends its episode by termination (with --time-limit-is-termination, every end)."""
    return seq.steps.terminal[:-1] | args.time_limit_is_termination


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


def successor_features(net, target_net, seq: Sequence):
    """Torso maps and states (h, c) [T, ...] along a sequence, and the online and (stop-gradient) target psi
    [T, A, C] of z = w."""
    maps, states = unroll(net.core, seq)
    h_target = jax.lax.stop_gradient(unroll(target_net.core, seq)[1][0])
    return maps, states, jax.vmap(net.psi)(states[0], seq.steps.w), jax.vmap(target_net.psi)(h_target, seq.steps.w)


def sf_td_error(psi, psi_target, q, cumulants, seq: Sequence, terminal, args: Args):
    """n-step double-Q SF TD errors [T-1, C], one TD problem per cumulant dimension with cumulants[t] the
    pseudo-reward of transition t; the online q = psi . w [T, A] picks the bootstrap action; terminal: as
    n_step_targets' terminal_at_end. Returns (errors, valid)."""
    s = seq.steps
    targets, valid = n_step_targets(cumulants, double_q_bootstrap(q, psi_target), ~s.first[1:], args.n_step,
                                    args.gamma, terminal)
    return jax.lax.stop_gradient(targets) - psi[jnp.arange(q.shape[0] - 1), s.action[:-1]], valid


def sequence_loss(net: MSFANetwork, target_net: MSFANetwork, seq: Sequence, args: Args):
    """The three MSFA losses of one sequence, and the TD errors that set its priority."""
    s = seq.steps
    maps, states, psi, psi_target = successor_features(net, target_net, seq)  # psi [T, A, C]
    q = jnp.einsum("tac,tc->ta", psi, s.w)
    q_target = jnp.einsum("tac,tc->ta", psi_target, s.w)
    phi = jax.vmap(net.phi)(next_states(net.core, maps, seq, states), states[0][:-1])  # [T-1, C]
    steps, taken = jnp.arange(q.shape[0] - 1), s.action[:-1]
    terminal = terminal_transitions(seq, args)

    # n-step double Q-learning on Q = psi . w
    q_targets, valid = n_step_targets(s.reward[:-1], double_q_bootstrap(q, q_target), ~s.first[1:], args.n_step,
                                      args.gamma, terminal)
    delta_q = jax.lax.stop_gradient(q_targets) - q[steps, taken]
    loss_q = masked_mean(0.5 * delta_q**2, valid)

    # n-step SF learning with the (stop-gradient) learned cumulants as pseudo-rewards
    delta_psi, _ = sf_td_error(psi, psi_target, q, jax.lax.stop_gradient(phi), seq, terminal, args)  # [T-1, C]
    loss_psi = masked_mean(jnp.mean(0.5 * delta_psi**2, axis=-1), valid)

    # cumulants regressed so that phi . w predicts the reward
    phi_error = 0.5 * (jnp.sum(phi * s.w[:-1], -1) - s.reward[:-1]) ** 2

    return {"loss_q": loss_q, "loss_psi": loss_psi, "phi_error_sum": jnp.sum(phi_error * valid),
            "phi_count": jnp.sum(valid), "q_mean": masked_mean(q[steps, taken], valid), "phi": phi, "valid": valid,
            "priority": sequence_priority(jnp.mean(delta_psi, -1), valid, args.max_priority_weight)
            + args.priority_from_q * sequence_priority(delta_q, valid, args.max_priority_weight)}


LOSS_NAMES = ("loss", "loss_q", "loss_psi", "loss_phi", "q_mean", "grad_norm")
"""what an SGD step reports (metrics.csv columns): batch_loss's losses and the gradient's norm"""


def batch_loss(net: MSFANetwork, target_net: MSFANetwork, batch: Sequence, probabilities, args: Args):
    """alpha_psi mean_b(IS_b L_psi,b) + alpha_Q mean_b L_Q,b + alpha_phi (masked mean of the phi error)."""
    out = jax.vmap(lambda seq: sequence_loss(net, target_net, seq, args))(batch)
    weights = importance_weights(probabilities, args.importance_exponent)
    loss_phi = jnp.sum(out["phi_error_sum"]) / (jnp.sum(out["phi_count"]) + 1e-5)
    loss = (args.sf_coeff * jnp.mean(weights * out["loss_psi"]) + args.q_coeff * jnp.mean(out["loss_q"])
            + args.phi_coeff * loss_phi)
    losses = {"loss": loss, "loss_q": jnp.mean(out["loss_q"]), "loss_psi": jnp.mean(out["loss_psi"]),
              "loss_phi": loss_phi, "q_mean": jnp.mean(out["q_mean"])}
    return loss, (out["priority"], losses, cumulant_stats(out["phi"], batch.steps.phi[:, :-1], out["valid"]))


# =====================================================================================================================
# Training state, acting and one jitted chunk of training
# =====================================================================================================================
class Actor(NamedTuple):
    """Per-env acting state (the envs themselves live on the host, in Setup.envs)."""
    seed_index: jax.Array  # which seed's envs these are (the procgen backend's callback steps envs[seed_index])
    env_state: object  # the JAX envs' states [E] (None with procgen: its games live on the host)
    image: jax.Array  # the frames the envs show now
    kept: object  # what replay keeps instead of them (kept_in_replay): GameViews, or None (the frames themselves)
    w: jax.Array
    prev_action: jax.Array
    prev_reward: jax.Array
    first: jax.Array
    rnn: tuple
    epsilon: jax.Array
    episode_return: jax.Array
    episode_length: jax.Array  # env steps of the current episode so far


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
    """Everything static a run needs, built once from Args."""
    envs: list  # procgen backend: one common.envs.fruitbot.Fruitbot of num_envs envs per seed, stepped on the host
    env: object  # JAX backend: the fruitbot_jax.FruitbotJax env (None with procgen)
    env_params: object  # and its params: the training tasks and their level pools
    static: object  # the network's non-array parts (eqx.partition)
    optimizer: optax.GradientTransformation
    buffer: object  # flashbax prioritised item buffer of Sequences
    epsilons: jax.Array


def make_network(args: Args, key) -> MSFANetwork:
    return MSFANetwork(args, TRAIN_TASKS.shape[1], key)


def make_env(args: Args, num_envs: int, seed: int, tasks=TRAIN_TASKS, num_levels: int | None = None,
             task_of_env=None) -> Fruitbot:
    return Fruitbot(num_envs, tasks, seed=seed, num_levels=args.train_levels if num_levels is None else num_levels,
                    distribution_mode=args.distribution_mode, max_levels=args.max_levels, task_of_env=task_of_env)


def make_setup(args: Args, seeds: list[int] | None = None) -> Setup:
    """seeds: whose training envs to build (none: a setup for the network, losses and evaluation only)."""
    env = env_params = None
    if args.env_backend == "jax":
        env = fruitbot_jax.FruitbotJax(fruitbot.JAX_GAMES[args.distribution_mode], max_levels=args.max_levels)
        env_params = env.make_params(TRAIN_TASKS, num_levels=args.train_levels, seed=0)
    envs = [make_env(args, args.num_envs, seed) for seed in (seeds or []) if args.env_backend == "procgen"]
    # the network's structure, its weights only shapes (eval_shape: nothing computed; every array in it is a weight)
    _, static = eqx.partition(eqx.filter_eval_shape(make_network, args, jax.random.PRNGKey(0)),
                              lambda x: isinstance(x, jax.ShapeDtypeStruct))
    optimizer = optax.chain(optax.clip_by_global_norm(args.max_grad_norm),
                            optax.adam(args.learning_rate, eps=args.adam_eps))
    buffer = fbx.make_prioritised_item_buffer(
        max_length=args.replay_size, min_length=args.min_replay_size, sample_batch_size=args.batch_size,
        add_batches=True, priority_exponent=args.priority_exponent,
        device="cpu" if jax.default_backend() == "cpu" else "gpu")
    lo, hi = args.epsilon_exponents
    epsilons = jnp.logspace(lo, hi, args.num_epsilons, base=args.epsilon_base)
    return Setup(envs, env, env_params, static, optimizer, buffer, epsilons)


def fresh_actors(setup: Setup, args: Args, seed_index: int, key) -> Actor:
    """Every env of one seed at the start of a new episode (at the start of a run, and, with procgen, on resume:
    the host envs are not in the checkpoint, so a resumed run starts new episodes)."""
    e = args.num_envs
    key, k_env = jax.random.split(key)
    env_state = None
    if setup.env is not None:
        obs, env_state = jax.vmap(setup.env.reset, (0, None))(jax.random.split(k_env, e), setup.env_params)
        obs = {"image": obs.image, "w": obs.w}
    else:
        obs = setup.envs[seed_index].reset()
    initial = (jnp.zeros((args.num_modules, args.module_size)),) * 2  # FARM's initial (h, c)
    image = jnp.asarray(obs["image"])
    return Actor(seed_index=jnp.asarray(seed_index, jnp.int32), env_state=env_state, image=image,
                 kept=kept_in_replay(setup, args, env_state), w=jnp.asarray(obs["w"]),
                 prev_action=jnp.zeros(e, jnp.int32), prev_reward=jnp.zeros(e),
                 first=jnp.ones(e, bool), rnn=jax.tree.map(lambda x: jnp.broadcast_to(x, (e,) + x.shape), initial),
                 epsilon=jax.random.choice(key, setup.epsilons, (e,)), episode_return=jnp.zeros(e),
                 episode_length=jnp.zeros(e, jnp.int32))


def init_train_state(setup: Setup, args: Args, key, actors: Actor) -> TrainState:
    k_net, k_target, k_run = jax.random.split(key, 3)
    params, _ = eqx.partition(make_network(args, k_net), eqx.is_inexact_array)
    # as in the original, the target network starts from its own random init until the first copy
    target_params, _ = eqx.partition(make_network(args, k_target), eqx.is_inexact_array)
    example = jax.tree.map(lambda x: x[0], make_sequences(
        jax.tree.map(lambda x: jnp.zeros((args.sequence_period,) + x.shape, x.dtype), step_before_acting(actors)),
        actors, actors.rnn))
    state = TrainState(params=params, target_params=target_params, opt_state=setup.optimizer.init(params),
                       buffer=setup.buffer.init(example), actors=actors, key=k_run,
                       env_steps=jnp.zeros((), jnp.int32), sgd_steps=jnp.zeros((), jnp.int32))
    # flashbax leaves a weakly typed scalar; strong types everywhere keep the chunk from compiling twice
    return jax.tree.map(lambda x: jnp.asarray(x, x.dtype), state)


def step_before_acting(actors: Actor) -> Step:
    """The step every env is at now, before it acts: its frame and what led to it; action, reward, phi and terminal
    are placeholders that acting fills in."""
    return Step(obs=actors.image if actors.kept is None else actors.kept, w=actors.w, prev_action=actors.prev_action,
                prev_reward=actors.prev_reward, first=actors.first, action=actors.prev_action,
                reward=actors.prev_reward, phi=jnp.zeros_like(actors.w), terminal=jnp.zeros_like(actors.first))


def make_sequences(steps: Step, actors: Actor, start_rnn) -> Sequence:
    """One sequence per env: the period's steps [P, E] plus the step the envs are at now (action/reward 0)."""
    last = step_before_acting(actors)._replace(action=jnp.zeros_like(actors.prev_action),
                                         reward=jnp.zeros_like(actors.prev_reward))
    steps = jax.tree.map(lambda xs, x: jnp.concatenate([xs, x[None]]), steps, last)
    return Sequence(steps=jax.tree.map(lambda x: jnp.swapaxes(x, 0, 1), steps), state=start_rnn)


def env_step(setup: Setup, args: Args, actors: Actor, action, key):
    """Step one seed's envs: the JAX envs vmapped, or the host's procgen envs from inside the jitted program."""
    e = args.num_envs
    if setup.env is not None:
        obs, env_state, reward, terminated, truncated, info = jax.vmap(setup.env.step, (0, 0, 0, None))(
            jax.random.split(key, e), actors.env_state, action, setup.env_params)
        return env_state, (obs.image, obs.w, reward, terminated, truncated, info["phi"])
    return None, fruitbot.step_in_jit(setup.envs, actors.seed_index, action)  # procgen on the host


def act_step(setup: Setup, args: Args, params, actors: Actor, key):
    """One env step in every env: epsilon-greedy on Q = psi . w for the training task w (no GPI)."""
    net = eqx.combine(params, setup.static)
    k_explore, k_action, k_eps, k_env = jax.random.split(key, 4)
    e = args.num_envs
    rnn = reset_where(actors.first, actors.rnn, net.core.initial_state())
    rnn = jax.vmap(partial(core_step, net.core))(actors.image, actors.prev_action, actors.prev_reward, rnn)
    q = jax.vmap(partial(q_values, net))(rnn[0], actors.w)
    explore = jax.random.uniform(k_explore, (e,)) < actors.epsilon
    action = jnp.where(explore, jax.random.randint(k_action, (e,), 0, NUM_ACTIONS), jnp.argmax(q, -1))
    env_state, (image, w, reward, terminated, truncated, phi) = env_step(setup, args, actors, action, k_env)
    done = terminated | truncated
    step = step_before_acting(actors)._replace(action=action, reward=reward, phi=phi, terminal=terminated)
    episode_return = actors.episode_return + reward
    episode_length = actors.episode_length + 1
    finished = {"done": done, "return": episode_return, "task": jnp.argmax(actors.w, -1),
                "length": episode_length}
    actors = actors._replace(
        env_state=env_state, image=image, kept=kept_in_replay(setup, args, env_state), w=w,
        prev_action=jnp.where(done, 0, action),
        prev_reward=jnp.where(done, 0.0, reward), first=done, rnn=rnn,
        epsilon=jnp.where(done, jax.random.choice(k_eps, setup.epsilons, (e,)), actors.epsilon),
        episode_return=jnp.where(done, 0.0, episode_return), episode_length=jnp.where(done, 0, episode_length))
    return actors, (step, finished)


def sgd_step(setup: Setup, args: Args, state: TrainState, key):
    """Sample a batch of sequences, take one Adam step, refresh their priorities, maybe copy the target."""
    sample = setup.buffer.sample(state.buffer, key)
    batch = sample.experience._replace(steps=replay_frames(setup, sample.experience.steps))
    target_net = eqx.combine(state.target_params, setup.static)

    def loss_fn(params):
        return batch_loss(eqx.combine(params, setup.static), target_net, batch, sample.probabilities, args)

    grads, (priorities, losses, stats) = jax.grad(loss_fn, has_aux=True)(state.params)
    updates, opt_state = setup.optimizer.update(grads, state.opt_state, state.params)
    params = eqx.apply_updates(state.params, updates)
    buffer = setup.buffer.set_priorities(state.buffer, sample.indices, priorities)
    sgd_steps = state.sgd_steps + 1
    copy = sgd_steps % args.target_update_period == 0
    target_params = jax.tree.map(lambda p, t: jnp.where(copy, p, t), params, state.target_params)
    metrics = SGDMetrics(losses | {"grad_norm": optax.tree.norm(grads)}, stats)
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
        return state, (jax.tree.map(lambda x: jnp.mean(x, 0), metrics), jnp.ones(()))

    def wait(state):  # replay cannot be sampled yet: no SGD step, the SGD step's metrics as zeros
        return state, (SGDMetrics.none_taken(LOSS_NAMES, TRAIN_TASKS.shape[1]), jnp.zeros(()))

    state, (sgd, learning) = jax.lax.cond(setup.buffer.can_sample(state.buffer), learn, wait, state)
    return state, IterationMetrics(sgd, learning, **finished_episodes(finished, TRAIN_TASKS.shape[0]),
                                   epsilon=jnp.mean(actors.epsilon))


def make_train_chunk(setup: Setup, args: Args, iterations: int):
    """A jitted function running `iterations` training iterations for every (vmapped) seed."""
    def chunk(state):
        return jax.lax.scan(partial(train_iteration, setup, args), state, None, length=iterations)
    return jax.jit(jax.vmap(chunk), donate_argnums=0)


# =====================================================================================================================
# Evaluation: greedy lifetimes on unrestricted levels, on train and test tasks, with GPI and without
# =====================================================================================================================
GPI_SETTINGS = (0, 1)
"""eval.csv's gpi column: 0 acts on psi(s, a, w) . w, 1 on max_z psi(s, a, z) . w over the --gpi-support tasks"""
EVAL_TASKS = np.concatenate([TRAIN_TASKS, TEST_TASKS])


def make_evaluate(setup: Setup, args: Args, tasks=EVAL_TASKS, gpi_settings=GPI_SETTINGS):
    """evaluate(params, key) -> returns [gpi_settings, tasks, episodes] of one seed's params: every (task, episode)
    is one env of a Fruitbot, played greedily until each env has finished one lifetime. The JAX game: one jitted
    loop on the evaluation levels (make_jax_evaluate); procgen: unrestricted levels, the network acting for all envs
    at once (jitted), the envs stepping on the host. gpi_settings picks the settings played (tools/evaluate.py
    --gpi on|off plays one); each keeps its own keys and levels, so its returns are those of playing both."""
    policies = jnp.asarray(TRAIN_TASKS if args.gpi_support == "train" else TEST_TASKS)
    tasks = np.asarray(tasks, np.float32)
    if setup.env is not None:
        return make_jax_evaluate(setup, args, tasks, policies, gpi_settings)

    @partial(jax.jit, static_argnames="use_gpi")
    def act(params, image, w, prev_action, prev_reward, first, rnn, use_gpi: bool):
        net = eqx.combine(params, setup.static)
        rnn = reset_where(first, rnn, net.core.initial_state())
        rnn = jax.vmap(partial(core_step, net.core))(image, prev_action, prev_reward, rnn)
        if use_gpi:
            q = jax.vmap(lambda h, w: gpi_q_values(net, h, w, policies))(rnn[0], w)
        else:
            q = jax.vmap(partial(q_values, net))(rnn[0], w)
        return jnp.argmax(q, -1), rnn

    def evaluate(params, key):
        seed = int(jax.random.randint(key, (), 0, 2**31 - 1))  # the host envs' level seed
        task_of_env = np.repeat(np.arange(len(tasks)), args.eval_episodes)
        initial = eqx.combine(params, setup.static).core.initial_state()
        return np.stack([play_first_episodes(  # each setting on its own envs (one per task and episode)
            make_env(args, len(task_of_env), seed, tasks, num_levels=0, task_of_env=task_of_env),
            partial(act, params, use_gpi=g == 1), "image", initial).reshape(len(tasks), args.eval_episodes)
            for g in gpi_settings])

    return evaluate


def make_jax_evaluate(setup: Setup, args: Args, tasks: np.ndarray, policies, gpi_settings):
    """The JAX backend's evaluate(params, key): every (task, episode) is one env on the evaluation levels, all
    played greedily in one jitted loop until each has finished one lifetime."""
    env, e = setup.env, args.eval_episodes
    eval_params = env.make_params(tasks, num_levels=args.eval_levels, seed=1)  # key 1: not the training levels
    task_of_env = jnp.repeat(jnp.arange(len(tasks)), e)

    @partial(jax.jit, static_argnames="use_gpi")
    def play(params, key, use_gpi: bool):
        net = eqx.combine(params, setup.static)

        def act(image, w, prev_action, prev_reward, rnn):
            rnn = jax.vmap(partial(core_step, net.core))(image, prev_action, prev_reward, rnn)
            if use_gpi:
                q = jax.vmap(lambda h, w: gpi_q_values(net, h, w, policies))(rnn[0], w)
            else:
                q = jax.vmap(partial(q_values, net))(rnn[0], w)
            return jnp.argmax(q, -1), rnn

        returns = fruitbot_jax.play_first_lifetimes(env, eval_params, task_of_env, act, net.core.initial_state(), key,
                                                    args.max_levels * fruitbot_jax.TIMEOUT)
        return returns.reshape(len(tasks), e)

    def evaluate(params, key):
        return np.stack([np.asarray(play(params, key, use_gpi=g == 1)) for g in gpi_settings])

    return evaluate


# =====================================================================================================================
# Main: build, (resume,) then alternate jitted training chunks with logging, evaluation and checkpoints
# =====================================================================================================================
@exit_on_config_error
def main(args: Args) -> None:
    check_args(args)
    check_replay_memory(args, replay_bytes(args))
    per_iteration = steps_per_iteration(args)
    total_steps = whole_iterations(args.total_timesteps, per_iteration) * per_iteration
    run = RunDir(args, "fruitbot", method_name(args), total_steps)  # refuses a used, missing or unwritable directory
    seeds = [args.seed + i for i in range(args.num_seeds)]
    setup = make_setup(args, seeds)

    def actors_of_every_seed():
        return jax.tree.map(lambda *xs: jnp.stack(xs), *[
            fresh_actors(setup, args, i, jax.random.fold_in(jax.random.PRNGKey(s), 1)) for i, s in enumerate(seeds)])

    actors = actors_of_every_seed()
    # jitted, so that the replay (tens of GB at the paper's size) is allocated once, not built up in eager steps
    state = jax.jit(jax.vmap(lambda k, a: init_train_state(setup, args, k, a)))(
        jnp.stack([jax.random.PRNGKey(s) for s in seeds]), actors)
    num_params = count_params(eqx.combine(jax.tree.map(lambda x: x[0], state.params), setup.static))
    kept = "game states" if keeps_game_views(args) else "frames"
    print(f"{method_name(args)} network: {num_params:,} parameters; replay of {kept}: "
          f"{replay_bytes(args) / 2**30:.2f} GiB per seed (frames: {replay_bytes(args, frames=True) / 2**30:.2f} GiB)",
          flush=True)
    if args.resume:
        state, _ = run.restore(state)
        if args.env_backend == "procgen":  # the host envs start new episodes (they are not in the checkpoint)
            state = state._replace(actors=actors)
    run.write_config({"method": method_name(args), "num_params": num_params,
                      "sgd_steps_per_iteration": sgd_steps_per_iteration(args),
                      "core_backend": getattr(setup.static.core, "backend", None)})  # FARM's, as resolved
    train_in_chunks(run, args, state, seeds, Training(
        make_chunk=partial(make_train_chunk, setup, args), evaluate=make_evaluate(setup, args), eval_tasks=EVAL_TASKS,
        num_train_tasks=len(TRAIN_TASKS), gpi_settings=GPI_SETTINGS, loss_names=LOSS_NAMES,
        steps_per_iteration=per_iteration, sgd_steps_per_iteration=sgd_steps_per_iteration(args),
        num_cumulants=TRAIN_TASKS.shape[1]))


if __name__ == "__main__":
    main(parse_args(Args))
