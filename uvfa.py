"""UVFA baselines on BabyAI GotoAvoid, Procgen Fruitbot and MiniHack rooms: universal value functions Q(s, a, w) learned with n-step
double Q-learning, in one file.

- Default, UVFA (Schaul et al., 2015): one LSTM state h; Q = duelling MLP([h; w]).
- `--farm`, UVFA-FARM: FARM module states h^1..h^n (as in MSFA); Q = duelling MLP([h^1; ...; h^n; w]).
- `--modular`, MVFA (the paper's baseline 3, after Haarnoja et al., 2018): FARM module states, and module k learns
  its own value Q^k(s^k, w^k) from its state and its slice of w with its own duelling MLP; Q = sum_k Q^k, trained
  end to end on the reward. The original code never wired MVFA; this is our reading of the paper's one sentence
  ("modules learn individual Q-values Q^(i)(s^(i), w^(i))"). Module-specific heads (not one shared head) keep its
  size within 1% of UVFA-FARM's.
No method here has GPI: evaluation acts greedily on Q(s, a, w_test) (eval.csv rows with gpi = 0 only).

On Fruitbot and MiniHack the targets go through the signed-hyperbolic value transform, as the original's UVFA
family did there
(docs/protocol.md, quirk 12): G = h(sum_i gamma^i r + gamma^n h^-1(Q_target)), h(x) = sign(x)(sqrt(|x| + 1) - 1) + 1e-3 x.

The file reads top to bottom as the whole algorithm: arguments (the paper's settings for --env as defaults), the
environment, the network and its Q head, replay items, the recurrent unroll, n-step targets and the loss, acting,
the jitted training program, evaluation, and main (see msfa_babyai.py for the shape of the program). One training
loop serves every environment: BabyAI and, by default, Fruitbot are JAX and step inside the jitted chunk (Fruitbot:
common/envs/fruitbot_jax.py, the original's per-task games with --distribution-mode paper, as msfa_fruitbot.py); MiniHack's
host envs, and Fruitbot's with --env-backend procgen (stock hard or easy), step from inside the same chunk through
io_callback.

    python uvfa.py --seed 3                 # UVFA
    python uvfa.py --farm --seed 3          # UVFA-FARM
    python uvfa.py --modular --seed 3       # MVFA
    python uvfa.py --env fruitbot --farm --replay-size 10000 --min-replay-size 500   # on Fruitbot
    python uvfa.py --env minihack --farm    # on MiniHack's small rooms
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from functools import partial
from typing import ClassVar, Literal, NamedTuple

import equinox as eqx
import flashbax as fbx
import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax.experimental import io_callback

from common.envs import babyai, fruitbot, fruitbot_jax, minihack
from common.envs.babyai import GotoAvoid, Observation, check_room
from common.envs.host import play_first_episodes
from common.farm import FarmCore, apply_per_module
from common.networks import DQN_CHANNELS, MLP, LSTMCore, count_params
from common.run import (IterationMetrics, RunArgs, RunDir, SGDMetrics, Training, check_replay_args, check_replay_memory,
                        check_run_args, exit_on_config_error, finished_episodes, parse_args, require,
                        require_non_negative, require_positive, shard_seeds, train_in_chunks, whole_iterations)


# =====================================================================================================================
# Arguments: defaults are the paper's settings for --env (docs/protocol.md)
# =====================================================================================================================
@dataclass
class Args(RunArgs):
    # --- The algorithm: network, losses, sequences and targets, replay, optimiser, acting (defaults: the paper's) ---
    farm: bool = False
    """UVFA-FARM: FARM module states instead of one LSTM"""
    modular: bool = False
    """MVFA: FARM module states, Q = sum_k Q^k(s^k, w^k) (implies FARM states)"""
    reward_input: Literal["on", "off"] = "on"
    """on: the recurrent core reads the previous reward tanh(r_{t-1}) beside the previous action (the paper's agent);
    off: its entry is 0, so the state cannot see the reward (the reward-blind core of docs/cumulants.md)"""
    num_modules: int | None = None
    """FARM modules (--farm, --modular; default: 4, 3 on MiniHack)"""
    module_size: int | None = None
    """size of each module's state (--farm, --modular; default: 150 on BabyAI, 64 on Fruitbot, 80 on MiniHack)"""
    attention_heads: int | None = None
    """heads of FARM's inter-module attention (--farm, --modular; default: 2, 1 on MiniHack)"""
    projection_dim: int = 16
    """channels of FARM's feature attention (--farm, --modular)"""
    lstm_size: int | None = None
    """LSTM state size (UVFA; default: 512 on BabyAI, 256 on Fruitbot and MiniHack)"""
    q_hidden: tuple[int, ...] | None = None
    """hidden sizes of the value and advantage MLPs of the duelling head (default: 128 on BabyAI, 512 512 on
    Fruitbot and MiniHack)"""
    value_transform: str | None = None
    """the targets' value transform: identity or signed_hyperbolic (default: identity on BabyAI, signed_hyperbolic on
    Fruitbot and MiniHack, as the original)"""
    sequence_length: int = 41
    """steps per replayed sequence (sequence period + 1)"""
    sequence_period: int = 40
    """env steps between the starts of consecutive sequences (consecutive sequences share one step)"""
    n_step: int = 5
    """steps of the n-step targets"""
    gamma: float = 0.99
    """discount"""
    replay_size: int | None = None
    """replay capacity in sequences (default: 100k on BabyAI, 70k on Fruitbot: under 0.5 GiB of game states, ~33 GiB
    of frames)"""
    min_replay_size: int | None = None
    """sequences in replay before learning starts (default: 100 on BabyAI, 10k on Fruitbot)"""
    samples_per_insert: float = 6.0
    """sampled sequences per inserted sequence (the replay ratio)"""
    batch_size: int = 8
    """sequences per SGD step"""
    priority_exponent: float = 0.9
    """replay samples sequences with probability ~ priority^exponent"""
    importance_exponent: float | None = None
    """exponent of the importance weights that correct prioritised sampling (0: no correction; default: 0 on BabyAI,
    0.6 on Fruitbot)"""
    max_priority_weight: float = 0.9
    """priority = w max|delta| + (1 - w) mean|delta| over the sequence"""
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

    def __post_init__(self):
        """Settings left at None take the paper's value for --env."""
        settings = PAPER_SETTINGS.get(self.env, {})
        if self.env == "minihack" and self.room_size in minihack.ROOM_SIZES:
            settings = settings | dict(total_timesteps={"5x5": 3_000_000, "15x15": 5_000_000}[self.room_size],
                                       train_levels=minihack.TRAIN_LEVELS[self.room_size])
        for name, value in settings.items():
            if getattr(self, name) is None:
                setattr(self, name, value)

    # --- The environment and its levels ---
    env: str = "babyai"
    """environment: babyai, fruitbot or minihack (the defaults marked "default: ..." follow it)"""
    distribution_mode: str = "paper"
    """Fruitbot: the game: "paper" (the original's per-task games: easy mode, levels 90 tall, each task its own object
    lists, no completion bonus; JAX only), or stock procgen's "hard" (all 12 object types, doors) or "easy" (4 types)"""
    env_backend: str = "jax"
    """Fruitbot: "jax": the game in JAX inside the jitted program (common/envs/fruitbot_jax.py); "procgen": stock procgen on
    the host through io_callback (hard or easy only)"""
    room_size: str = "5x5"
    """MiniHack: 5x5 (the paper's small room) or 15x15 (the large room)"""
    grid_size: int = babyai.ROOM_SIZE
    """BabyAI: the room's side, walls included (the paper's: 10, 8 x 8 walkable; smaller: the miniature BabyAI)"""
    objects_per_category: int = babyai.OBJECTS_PER_CATEGORY
    """BabyAI: objects of each of the 4 categories in the room"""
    episode_steps: int = babyai.MAX_STEPS
    """BabyAI: the episode's time limit (a truncation)"""
    torso_channels: tuple[int, int, int] = DQN_CHANNELS
    """BabyAI: widths of the DQN torso's first three convolutions (its map is 5 x 5 x 16 whatever they are)"""
    train_levels: int | None = None
    """Fruitbot, MiniHack: training levels: level seeds 0..train_levels-1 (procgen, MiniHack), or with Fruitbot's JAX
    backend a pool of that many levels per task drawn once from key 0 (the same for every seed, as procgen's); 0: a
    fresh level every time (default: 200 on Fruitbot and MiniHack's small room, 1000 in the large room)"""
    eval_levels: int = 1_000
    """Fruitbot, JAX: evaluation levels per task, a pool drawn from another key than the training levels (0: a fresh
    level every time, slower); procgen evaluates on unrestricted levels"""
    max_levels: int = fruitbot.MAX_LEVELS
    """Fruitbot: levels per episode (lifetime)"""
    replay_frames: bool = False
    """Fruitbot: keep each step's 64x64x3 frame in replay (12,288 bytes) instead of the JAX game's state it is drawn
    from (38 bytes: GameView; the learner draws the frames of each sampled batch, the same pixels the actors saw); the
    procgen backend and fresh training levels (--train-levels 0) have no such state and always keep frames"""

    # --- The original code's quirks (off: the method as the paper describes it; on: as the authors' code ran it) ---
    truncate_task_input: bool = False
    """feed int32(w) to the agent as the original code did ([1,1,.5,.5] became [1,1,0,0]); rewards use float w"""
    time_limit_is_termination: bool = False
    """the original's time limit: an episode's last transition is learned as a terminal one (no bootstrap) instead
    of being masked"""

    # --- Run controls: seeds, budget, evaluation, logging, speed-only options (the rest: common.run.RunArgs) ---
    exp_name: str = os.path.splitext(os.path.basename(__file__))[0]
    """name of the experiment (prefix of the default run directory): the script's file name, so a copy names its own"""
    seed: int = 1
    """seed of the first run; vmapped runs use seed, seed + 1, ..."""
    num_seeds: int = 1
    """independent runs trained side by side in one program (vmapped)"""
    total_timesteps: int | None = None
    """env steps per seed (rounded up to whole iterations of num_envs x sequence_period; default: the paper's, 5M on
    BabyAI, 10M on Fruitbot)"""
    eval_episodes: int | None = None
    """greedy episodes per task at each evaluation (default: 20 on BabyAI, 10 on Fruitbot)"""
    eval_every: int | None = None
    """env steps (per seed) between evaluations; one more runs at the end (default: 250k on BabyAI, 500k on
    Fruitbot)"""
    log_every: int = 2_560
    """env steps (per seed) between progress lines and metrics rows"""
    env_workers: int = 1
    """MiniHack: processes stepping each seed's envs in parallel (1: in this process; more on a machine with many
    cores: the same episodes, faster)"""
    ALSO_SAFE_TO_CHANGE: ClassVar[tuple[str, ...]] = ("env_workers",)
    """--resume may change these too (common.run.safe_to_change): the same episodes, stepped by more processes"""
    core_backend: str | None = None
    """speed only: how FARM's recurrence is computed (common/farm.py): plain (FARM.step in a lax.scan: the
    definition), fused (the same function arranged for speed, common/farm_fast.py), pallas (that as GPU kernels,
    common/farm_pallas.py), pallas-bf16 (those with the LSTMs' weight in bfloat16: not exact); default: the fastest
    measured on this device kind, plain for an edited FARM (docs/learner_speed.md)"""


PAPER_SETTINGS = {
    "babyai": dict(total_timesteps=5_000_000, eval_episodes=20, eval_every=250_000, lstm_size=512, module_size=150,
                   q_hidden=(128,), replay_size=100_000, min_replay_size=100, importance_exponent=0.0,
                   value_transform="identity", num_modules=4, attention_heads=2),
    "fruitbot": dict(total_timesteps=10_000_000, eval_episodes=10, eval_every=500_000, lstm_size=256, module_size=64,
                     q_hidden=(512, 512), replay_size=70_000, min_replay_size=10_000, importance_exponent=0.6,
                     value_transform="signed_hyperbolic", num_modules=4, attention_heads=2,
                     train_levels=fruitbot.TRAIN_LEVELS),
    "minihack": dict(eval_episodes=20, eval_every=250_000, lstm_size=256, module_size=80, q_hidden=(512, 512),
                     replay_size=70_000, min_replay_size=100, importance_exponent=0.6,
                     value_transform="signed_hyperbolic", num_modules=3, attention_heads=1),
}
ENVS = {"babyai": babyai, "fruitbot": fruitbot, "minihack": minihack}
TORSOS = {"babyai": "dqn", "fruitbot": "impala", "minihack": "impala"}
LEVEL_ENVS = ("fruitbot", "minihack")  # games of levels, frames and whole-number tasks (BabyAI has none of them)
VALUE_TRANSFORMS = ("identity", "signed_hyperbolic")


def env_module(args: Args):
    """common.envs.babyai, common.envs.fruitbot or common.envs.minihack: the env's actions and tasks."""
    return ENVS[args.env]


def on_host(args: Args) -> bool:
    """Whether the env steps on the host, from inside the jitted chunk through io_callback: MiniHack (NLE), and
    Fruitbot with --env-backend procgen (C++); BabyAI and Fruitbot's JAX game step inside the program."""
    return args.env == "minihack" or (args.env == "fruitbot" and args.env_backend == "procgen")


BABYAI_SIZES = ("grid_size", "objects_per_category", "episode_steps", "torso_channels")
"""settings of BabyAI's room and of its DQN torso (the miniature BabyAI changes them)"""


def check_args(args: Args) -> None:
    """Refuse settings that cannot work, with one line saying what to change."""
    check_run_args(args)
    require(args.env in ENVS, f"--env must be one of {', '.join(ENVS)}, got {args.env!r}")
    require(args.env != "minihack" or args.room_size in minihack.ROOM_SIZES,
            f"--room-size must be one of {', '.join(minihack.ROOM_SIZES)}, got {args.room_size!r}")
    babyai_only = [f for f in BABYAI_SIZES if getattr(args, f) != getattr(Args, f)]
    require(args.env == "babyai" or not babyai_only, f"{', '.join('--' + f.replace('_', '-') for f in babyai_only)} "
                                                     f"set BabyAI's room and torso; --env {args.env} has its own "
                                                     "sizes: leave them out")
    if args.env == "babyai":
        check_room(args.grid_size, args.objects_per_category, args.episode_steps)
        require(all(c > 0 for c in args.torso_channels), f"--torso-channels must be positive, got {args.torso_channels}")
    require_positive(args, "env_workers")
    require(args.env == "minihack" or args.env_workers == 1, f"--env-workers is a MiniHack setting ({args.env}'s envs "
                                                             f"step in this process)")
    if args.env in LEVEL_ENVS:
        require(not args.truncate_task_input, f"--truncate-task-input is a BabyAI setting ({args.env} tasks are whole "
                                              f"numbers)")
        require_non_negative(args, "train_levels")
    if args.env == "fruitbot":
        fruitbot.check_game(args.distribution_mode, args.env_backend)
        require_non_negative(args, "eval_levels")
        require_positive(args, "max_levels")
    require(args.env == "fruitbot" or not args.replay_frames, f"--replay-frames is a Fruitbot setting ({args.env} "
                                                              f"replay keeps its small views)")
    require(args.value_transform in VALUE_TRANSFORMS, f"--value-transform must be one of "
                                                      f"{', '.join(VALUE_TRANSFORMS)}, got {args.value_transform!r}")
    require_positive(args, "num_seeds", "total_timesteps", "num_envs", "eval_episodes", "eval_every", "log_every",
                     "n_step", "replay_size", "batch_size", "target_update_period", "sequence_period", "num_epsilons",
                     "lstm_size", "num_modules", "module_size", "attention_heads", "projection_dim", "learning_rate",
                     "adam_eps", "max_grad_norm", "epsilon_base", "samples_per_insert")
    FarmCore.backend_to_run(args.core_backend)  # one of BACKENDS, and a fast one only for common/farm.py's FARM
    require_non_negative(args, "seed", "importance_exponent")
    require(all(x > 0 for x in args.q_hidden), f"--q-hidden sizes must be positive, got {args.q_hidden}")
    task_dim = env_module(args).TRAIN_TASKS.shape[1]
    require(not args.modular or task_dim % args.num_modules == 0,
            f"--modular: --num-modules must divide the task dimension {task_dim}, got {args.num_modules}")
    check_replay_args(args)




def keeps_game_views(args: Args) -> bool:
    """Whether replay keeps Fruitbot's JAX game states (GameViews, drawn into frames by the learner), not frames."""
    return args.env == "fruitbot" and not on_host(args) and args.train_levels > 0 and not args.replay_frames


def replay_bytes(args: Args, frames: bool | None = None) -> int:
    """Memory replay takes per seed: every step's observation (BabyAI's symbolic view; MiniHack's crop of int16 tile
    indices; Fruitbot's GameView, or its 64x64x3 uint8 frame with frames or where replay keeps them) and its other
    fields, and each sequence's recurrent state (h, c)."""
    frames = not keeps_game_views(args) if frames is None else frames
    fruitbot_obs = (int(np.prod(fruitbot.IMAGE_SHAPE)) if frames
                    else fruitbot_jax.view_bytes(fruitbot.JAX_GAMES[args.distribution_mode]))
    obs = {"fruitbot": fruitbot_obs, "minihack": 2 * minihack.CROP**2}.get(args.env, 75)
    per_step = obs + 4 * (fruitbot.TASK_DIM + 4) + 2  # w, prev_action, prev_reward, action, reward; first, terminal
    state = args.num_modules * args.module_size if args.farm or args.modular else args.lstm_size
    return args.replay_size * (args.sequence_length * per_step + 2 * 4 * state)


def method_name(args: Args) -> str:
    name = "MVFA" if args.modular else "UVFA-FARM" if args.farm else "UVFA"
    return f"{name} (reward-blind)" if args.reward_input == "off" else name


def steps_per_iteration(args: Args) -> int:
    """Env steps per seed per iteration: every env adds one sequence period."""
    return args.num_envs * args.sequence_period


def sgd_steps_per_iteration(args: Args) -> int:
    """SGD steps after each iteration, so that sampled/inserted sequences ~ samples_per_insert."""
    return max(1, round(args.samples_per_insert * args.num_envs / args.batch_size))


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
        num_actions, torso = env_module(args).NUM_ACTIONS, TORSOS[args.env]
        channels = args.torso_channels if args.env == "babyai" else None
        if args.farm or args.modular:
            n, d = args.num_modules, args.module_size
            self.core = FarmCore(num_actions, n, d, args.attention_heads, args.projection_dim, k_core, torso=torso,
                                 backend=args.core_backend, torso_channels=channels,
                                 reward_input=args.reward_input == "on")
            state_size = n * d
        else:
            self.core = LSTMCore(num_actions, args.lstm_size, k_core, torso=torso, torso_channels=channels,
                                 reward_input=args.reward_input == "on")
            state_size = args.lstm_size
        if args.modular:
            per_module = task_dim // args.num_modules
            self.head = eqx.filter_vmap(lambda k: DuellingMLP(args.module_size + per_module, args.q_hidden,
                                                              num_actions, k))(
                jax.random.split(k_head, args.num_modules))
        else:
            self.head = DuellingMLP(state_size + task_dim, args.q_hidden, num_actions, k_head)

    def module_q(self, h, w):
        """MVFA: Q^k(s^k, a, w^k) [n, A], module k reading its state and its slice of w."""
        return apply_per_module(self.head, jnp.concatenate([h, w.reshape(h.shape[0], -1)], axis=-1))

    def q(self, h, w):
        """Q(s, a, w) [A]."""
        if self.modular:
            return jnp.sum(self.module_q(h, w), axis=0)
        return self.head(jnp.concatenate([h.reshape(-1), w]))


def q_values(net, h, w):
    """Q(s, a; w): acting on the training task, and evaluation."""
    return net.q(h, w)


# =====================================================================================================================
# Replay items and the recurrent unroll
# =====================================================================================================================
class Step(NamedTuple):
    obs: jax.Array  # BabyAI's symbolic view uint8 [5, 5, 3] or MiniHack's crop of tile indices int16 [9, 9]
    #                 (rendered to RGB by the network's caller), or Fruitbot's frame uint8 [64, 64, 3] (in replay,
    #                 the JAX game's GameView it is drawn from: replay_frames)
    w: jax.Array  # float32 [C], the task as the agent sees it
    prev_action: jax.Array  # int32
    prev_reward: jax.Array  # float32
    first: jax.Array  # bool: obs starts an episode (the recurrent state is reset before it)
    action: jax.Array  # int32, taken at obs
    reward: jax.Array  # float32, received for action
    terminal: jax.Array  # bool: action ended the episode by termination (Fruitbot: a barrier or the last level;
    #                      MiniHack: the stairs or a death)


class Sequence(NamedTuple):
    """A replay item: sequence_length steps and the recurrent state before the first (R2D2's stored state)."""
    steps: Step  # each field [T, ...]
    state: tuple  # (h, c): the recurrent state before steps[0] (reset there if steps.first[0])


def kept_in_replay(setup, args: Args, env_state):
    """What replay keeps instead of the envs' current observations: Fruitbot's JAX game states as GameViews
    (keeps_game_views), or None (replay keeps the observations)."""
    return jax.vmap(setup.env.view, (0, None))(env_state, setup.env_params) if keeps_game_views(args) else None


def replay_frames(setup, steps: Step) -> Step:
    """A sampled batch's steps with Fruitbot's frames drawn from the GameViews replay keeps, in one batched render of
    every step of every sequence (the online and the target unroll then read the same frames); others as they are."""
    if not isinstance(steps.obs, fruitbot_jax.GameView):
        return steps
    return steps._replace(obs=setup.env.draw(steps.obs, setup.env_params))


def reset_where(first, state, initial):
    """The recurrent state, replaced by the initial one where a new episode starts (first: [] or [E])."""
    def pick(s, i):
        return jnp.where(first.reshape(first.shape + (1,) * (s.ndim - first.ndim)), i, s)
    return jax.tree.map(pick, state, initial)


def core_step(core, rgb, prev_action, prev_reward, state):
    """One step of the recurrent core on one observation."""
    return core.recur(core.torso(rgb), core.input_vector(prev_action, prev_reward), state)


def unroll(core, render, seq: Sequence):
    """The recurrent states (h, c) [T, ...] along a sequence (the torso reads all its views at once, outside the
    recurrence)."""
    maps = jax.vmap(lambda o: core.torso(render(o)))(seq.steps.obs)
    vectors = jax.vmap(core.input_vector)(seq.steps.prev_action, seq.steps.prev_reward)
    return core.unroll(maps, vectors, seq.steps.first, seq.state)


# =====================================================================================================================
# n-step targets, priorities and the n-step double Q-learning loss
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


def signed_hyperbolic(x, eps: float = 1e-3):
    """h(x) = sign(x)(sqrt(|x| + 1) - 1) + eps x: squashes large returns (Pohlen et al., 2018; rlax's pair)."""
    return jnp.sign(x) * (jnp.sqrt(jnp.abs(x) + 1) - 1) + eps * x


def signed_parabolic(x, eps: float = 1e-3):
    """The inverse of signed_hyperbolic."""
    z = jnp.sqrt(1 + 4 * eps * (eps + 1 + jnp.abs(x)))
    return jnp.sign(x) * (((z - 1) / (2 * eps)) ** 2 - 1)


def value_transform_pair(args: Args):
    """(h, h^-1) of the targets: G = h(n-step return of the rewards, bootstrapping from h^-1(Q_target))."""
    if args.value_transform == "signed_hyperbolic":
        return signed_hyperbolic, signed_parabolic
    return (lambda x: x), (lambda x: x)


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


def sequence_loss(net: UVFANetwork, target_net: UVFANetwork, render, seq: Sequence, args: Args):
    """0.5 delta^2 of n-step double Q-learning, masked-averaged over the sequence; and the priority."""
    s = seq.steps
    h, _ = unroll(net.core, render, seq)
    h_target = jax.lax.stop_gradient(unroll(target_net.core, render, seq)[0])
    q = jax.vmap(net.q)(h, s.w)  # [T, A]
    q_target = jax.vmap(target_net.q)(h_target, s.w)
    steps, taken = jnp.arange(q.shape[0] - 1), s.action[:-1]
    h_fn, h_inv = value_transform_pair(args)
    targets, valid = n_step_targets(s.reward[:-1], h_inv(double_q_bootstrap(q, q_target)), ~s.first[1:],
                                    args.n_step, args.gamma, terminal_transitions(seq, args))
    targets = h_fn(targets)
    delta = jax.lax.stop_gradient(targets) - q[steps, taken]
    return {"loss": masked_mean(0.5 * delta**2, valid), "q_mean": masked_mean(q[steps, taken], valid),
            "priority": sequence_priority(delta, valid, args.max_priority_weight)}


LOSS_NAMES = ("loss", "q_mean", "grad_norm")
"""what an SGD step reports (metrics.csv columns): batch_loss's losses and the gradient's norm"""


def batch_loss(net: UVFANetwork, target_net: UVFANetwork, render, batch: Sequence, probabilities, args: Args):
    """mean_b(IS_b L_b)."""
    out = jax.vmap(lambda seq: sequence_loss(net, target_net, render, seq, args))(batch)
    loss = jnp.mean(importance_weights(probabilities, args.importance_exponent) * out["loss"])
    return loss, (out["priority"], {"loss": loss, "q_mean": jnp.mean(out["q_mean"])})


# =====================================================================================================================
# Training state, acting and one jitted chunk of training
# =====================================================================================================================
class Actor(NamedTuple):
    """Per-env acting state."""
    env_state: object  # JAX envs (BabyAI, Fruitbot): their states; host envs: the seed's index (envs live on the host)
    obs: Observation  # (image, w)
    kept: object  # what replay keeps instead of obs.image (kept_in_replay): Fruitbot's GameViews, or None
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
    env: object  # BabyAI: GotoAvoid; Fruitbot: fruitbot_jax.FruitbotJax; host envs: one vectorised host env per seed
    env_params: object  # the JAX env's EnvParams (Fruitbot's: the training tasks and their level pools; None on host
    #                     envs)
    render: object  # stored observation -> RGB (BabyAI and MiniHack draw theirs; Fruitbot stores frames)
    static: object  # the network's non-array parts (eqx.partition)
    optimizer: optax.GradientTransformation
    buffer: object  # flashbax prioritised item buffer of Sequences
    epsilons: jax.Array


def make_network(args: Args, key) -> UVFANetwork:
    return UVFANetwork(args, env_module(args).TRAIN_TASKS.shape[1], key)


def make_env(args: Args, num_envs: int, seed: int, tasks=None, num_levels: int | None = None, task_of_env=None):
    """num_envs Fruitbot lifetimes (procgen) or MiniHack episodes stepped together on the host (tasks: the train
    tasks)."""
    tasks = env_module(args).TRAIN_TASKS if tasks is None else tasks
    num_levels = args.train_levels if num_levels is None else num_levels
    if args.env == "minihack":
        return minihack.make_rooms(num_envs, tasks, workers=args.env_workers, size=args.room_size, seed=seed,
                                   num_levels=num_levels, task_of_env=task_of_env)
    return fruitbot.Fruitbot(num_envs, tasks, seed=seed, distribution_mode=args.distribution_mode,
                             num_levels=num_levels, max_levels=args.max_levels, task_of_env=task_of_env)


HOST_OBS = {"fruitbot": "image", "minihack": "tiles"}
"""the key of a host env's observation (Fruitbot's frames, MiniHack's crops of tile indices)"""


def make_setup(args: Args, seeds: list[int] | None = None) -> Setup:
    """seeds: whose host training envs to build (none: a setup for the network, loss and evaluation only)."""
    if on_host(args):
        env, env_params = [make_env(args, args.num_envs, seed) for seed in seeds or []], None
        if args.env == "minihack":
            render = partial(minihack.render, tile_images=jnp.asarray(minihack.tile_set()[0]))
        else:
            render = lambda image: image  # noqa: E731  (Fruitbot stores frames)
    elif args.env == "fruitbot":
        env = fruitbot_jax.FruitbotJax(fruitbot.JAX_GAMES[args.distribution_mode], max_levels=args.max_levels)
        env_params = env.make_params(fruitbot.TRAIN_TASKS, num_levels=args.train_levels, seed=0)
        render = lambda image: image  # noqa: E731  (Fruitbot stores frames)
    else:
        env = GotoAvoid(obs_mode="symbolic", truncate_task_input=args.truncate_task_input, grid_size=args.grid_size,
                        objects_per_category=args.objects_per_category, episode_steps=args.episode_steps)
        env_params, render = env.make_params(babyai.TRAIN_TASKS), env.rgb_from_symbolic
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
    return Setup(env, env_params, render, static, optimizer, buffer, epsilons)


def fresh_actors(setup: Setup, args: Args, k_env, k_eps, seed_index: int = 0) -> Actor:
    """Every env of one seed at the start of a new episode. JAX envs (BabyAI, Fruitbot) reset in JAX (jittable); host
    envs reset the seed's envs on the host (at the start of a run, and on resume: host envs are not in the
    checkpoint)."""
    e = args.num_envs
    if on_host(args):
        reset = setup.env[seed_index].reset()
        obs = Observation(jnp.asarray(reset[HOST_OBS[args.env]]), jnp.asarray(reset["w"]))
        env_state = jnp.int32(seed_index)
    else:
        obs, env_state = jax.vmap(setup.env.reset, (0, None))(jax.random.split(k_env, e), setup.env_params)
    shape = (args.num_modules, args.module_size) if args.farm or args.modular else (args.lstm_size,)
    initial = (jnp.zeros(shape),) * 2  # the core's initial (h, c)
    return Actor(env_state=env_state, obs=obs, kept=kept_in_replay(setup, args, env_state),
                 prev_action=jnp.zeros(e, jnp.int32), prev_reward=jnp.zeros(e),
                 first=jnp.ones(e, bool), rnn=jax.tree.map(lambda x: jnp.broadcast_to(x, (e,) + x.shape), initial),
                 epsilon=jax.random.choice(k_eps, setup.epsilons, (e,)), episode_return=jnp.zeros(e),
                 episode_length=jnp.zeros(e, jnp.int32))


def init_train_state(setup: Setup, args: Args, key, actors: Actor | None = None) -> TrainState:
    """A new run's state; actors: the envs' start (needed on host envs, which reset on the host)."""
    k_net, k_target, k_env, k_eps, k_run = jax.random.split(key, 5)
    params, _ = eqx.partition(make_network(args, k_net), eqx.is_inexact_array)
    # as in the original, the target network starts from its own random init until the first copy
    target_params, _ = eqx.partition(make_network(args, k_target), eqx.is_inexact_array)
    if actors is None:
        actors = fresh_actors(setup, args, k_env, k_eps)
    example = jax.tree.map(lambda x: x[0], make_sequences(
        jax.tree.map(lambda x: jnp.zeros((args.sequence_period,) + x.shape, x.dtype), step_before_acting(actors)),
        actors, actors.rnn))
    state = TrainState(params=params, target_params=target_params, opt_state=setup.optimizer.init(params),
                       buffer=setup.buffer.init(example), actors=actors, key=k_run,
                       env_steps=jnp.zeros((), jnp.int32), sgd_steps=jnp.zeros((), jnp.int32))
    # flashbax leaves a weakly typed scalar; strong types everywhere keep the chunk from compiling twice
    return jax.tree.map(lambda x: jnp.asarray(x, x.dtype), state)


def step_before_acting(actors: Actor) -> Step:
    """The step every env is at now, before it acts: its observation and what led to it; action, reward and
    terminal are placeholders that acting fills in."""
    return Step(obs=actors.obs.image if actors.kept is None else actors.kept, w=actors.obs.w,
                prev_action=actors.prev_action, prev_reward=actors.prev_reward, first=actors.first,
                action=actors.prev_action, reward=actors.prev_reward,
                terminal=jnp.zeros_like(actors.first))


def make_sequences(steps: Step, actors: Actor, start_rnn) -> Sequence:
    """One sequence per env: the period's steps [P, E] plus the step the envs are at now (action/reward 0)."""
    last = step_before_acting(actors)._replace(action=jnp.zeros_like(actors.prev_action),
                                         reward=jnp.zeros_like(actors.prev_reward))
    steps = jax.tree.map(lambda xs, x: jnp.concatenate([xs, x[None]]), steps, last)
    return Sequence(steps=jax.tree.map(lambda x: jnp.swapaxes(x, 0, 1), steps), state=start_rnn)


def host_step(setup: Setup, args: Args, seed_index, action, observation):
    """Step one seed's host envs from inside the jitted program (jax.experimental.io_callback). Under the seed vmap
    JAX runs the callback once per seed, in turn; the actions of step t+1 depend on its observations, so the calls
    of one seed stay in order."""
    e, c = args.num_envs, env_module(args).TASK_DIM

    def host(seed_index, action):
        obs, reward, terminated, truncated, _ = setup.env[int(seed_index)].step(np.asarray(action))
        return obs[HOST_OBS[args.env]], obs["w"], reward, terminated, truncated

    shapes = (jax.ShapeDtypeStruct(observation.shape, observation.dtype), jax.ShapeDtypeStruct((e, c), jnp.float32),
              jax.ShapeDtypeStruct((e,), jnp.float32), jax.ShapeDtypeStruct((e,), jnp.bool_),
              jax.ShapeDtypeStruct((e,), jnp.bool_))
    return io_callback(host, shapes, seed_index, action)


def act_step(setup: Setup, args: Args, params, actors: Actor, key):
    """One env step in every env: epsilon-greedy on Q(s, a, w) for the training task w."""
    net = eqx.combine(params, setup.static)
    k_explore, k_action, k_env, k_eps = jax.random.split(key, 4)
    e = args.num_envs
    rnn = reset_where(actors.first, actors.rnn, net.core.initial_state())
    rnn = jax.vmap(partial(core_step, net.core))(jax.vmap(setup.render)(actors.obs.image),
                                                 actors.prev_action, actors.prev_reward, rnn)
    q = jax.vmap(partial(q_values, net))(rnn[0], actors.obs.w)
    explore = jax.random.uniform(k_explore, (e,)) < actors.epsilon
    action = jnp.where(explore, jax.random.randint(k_action, (e,), 0, net.core.num_actions), jnp.argmax(q, -1))
    if on_host(args):
        image, w, reward, terminated, truncated = host_step(setup, args, actors.env_state, action, actors.obs.image)
        obs, env_state = Observation(image, w), actors.env_state
    else:  # the JAX envs: BabyAI (its episodes end by their time limit only) and Fruitbot
        obs, env_state, reward, terminated, truncated, _ = jax.vmap(setup.env.step, (0, 0, 0, None))(
            jax.random.split(k_env, e), actors.env_state, action, setup.env_params)
    done = terminated | truncated
    step = step_before_acting(actors)._replace(action=action, reward=reward, terminal=terminated)
    episode_return = actors.episode_return + reward
    episode_length = actors.episode_length + 1
    finished = {"done": done, "return": episode_return, "task": jnp.argmax(actors.obs.w, -1),
                "length": episode_length}
    actors = Actor(
        env_state=env_state, obs=obs, kept=kept_in_replay(setup, args, env_state),
        prev_action=jnp.where(done, 0, action),
        prev_reward=jnp.where(done, 0.0, reward), first=done, rnn=rnn,
        epsilon=jnp.where(done, jax.random.choice(k_eps, setup.epsilons, (e,)), actors.epsilon),
        episode_return=jnp.where(done, 0.0, episode_return),
        episode_length=jnp.where(done, 0, episode_length))
    return actors, (step, finished)


def sgd_step(setup: Setup, args: Args, state: TrainState, key):
    """Sample a batch of sequences, take one Adam step, refresh their priorities, maybe copy the target."""
    sample = setup.buffer.sample(state.buffer, key)
    batch = sample.experience._replace(steps=replay_frames(setup, sample.experience.steps))
    target_net = eqx.combine(state.target_params, setup.static)

    def loss_fn(params):
        return batch_loss(eqx.combine(params, setup.static), target_net, setup.render, batch, sample.probabilities,
                          args)

    grads, (priorities, losses) = jax.grad(loss_fn, has_aux=True)(state.params)
    updates, opt_state = setup.optimizer.update(grads, state.opt_state, state.params)
    params = eqx.apply_updates(state.params, updates)
    buffer = setup.buffer.set_priorities(state.buffer, sample.indices, priorities)
    sgd_steps = state.sgd_steps + 1
    copy = sgd_steps % args.target_update_period == 0
    target_params = jax.tree.map(lambda p, t: jnp.where(copy, p, t), params, state.target_params)
    metrics = SGDMetrics(losses | {"grad_norm": optax.tree.norm(grads)})
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
        return state, (SGDMetrics.none_taken(LOSS_NAMES), jnp.zeros(()))

    state, (sgd, learning) = jax.lax.cond(setup.buffer.can_sample(state.buffer), learn, wait, state)
    return state, IterationMetrics(sgd, learning, **finished_episodes(finished, env_module(args).TRAIN_TASKS.shape[0]),
                                   epsilon=jnp.mean(actors.epsilon))


def make_train_chunk(setup: Setup, args: Args, iterations: int):
    """A jitted function running `iterations` training iterations for every (vmapped) seed."""
    def chunk(state):
        return jax.lax.scan(partial(train_iteration, setup, args), state, None, length=iterations)
    return jax.jit(jax.vmap(chunk), donate_argnums=0)


# =====================================================================================================================
# Evaluation: greedy, on train and test tasks (no GPI: the UVFA family has no successor features)
# =====================================================================================================================
GPI_SETTINGS = (0,)
"""eval.csv's gpi column: 0, acting on Q(s, a, w_test)"""


def eval_tasks(args: Args) -> np.ndarray:
    """The env's train tasks, then its test tasks."""
    return np.concatenate([env_module(args).TRAIN_TASKS, env_module(args).TEST_TASKS])


def make_evaluate(setup: Setup, args: Args, tasks=None, gpi_settings=GPI_SETTINGS):
    """evaluate(params, key) -> returns [GPI settings, tasks, episodes] of one seed's params, on the train and test
    tasks (or any task vectors: tools/evaluate.py). BabyAI and Fruitbot's JAX game: one jitted program; host envs
    (MiniHack, Fruitbot on procgen): greedy episodes on unrestricted levels, the network acting for all (task,
    episode) envs at once, the envs on the host. A UVFA has no GPI: gpi_settings (every script's parameter) can only
    be GPI_SETTINGS."""
    require(tuple(gpi_settings) == GPI_SETTINGS, f"a UVFA has no GPI: gpi_settings must be {GPI_SETTINGS}, "
                                                 f"got {tuple(gpi_settings)}")
    tasks = eval_tasks(args) if tasks is None else tasks
    if on_host(args):
        return make_host_evaluate(setup, args, tasks)
    if args.env == "fruitbot":
        return make_jax_evaluate(setup, args, np.asarray(tasks, np.float32))
    env = setup.env

    def episode_return(params, key, w):
        net = eqx.combine(params, setup.static)
        env_params = env.task_params(w)
        key_reset, key_run = jax.random.split(key)
        obs, env_state = env.reset(key_reset, env_params)
        carry0 = (env_state, obs, jnp.zeros((), jnp.int32), jnp.zeros(()), net.core.initial_state())

        def step(carry, key):
            env_state, obs, prev_action, prev_reward, rnn = carry
            rnn = core_step(net.core, env.rgb_from_symbolic(obs.image), prev_action, prev_reward, rnn)
            action = jnp.argmax(q_values(net, rnn[0], obs.w))
            obs, env_state, reward, _, _, _ = env.step(key, env_state, action, env_params)
            return (env_state, obs, action, reward, rnn), reward

        _, rewards = jax.lax.scan(step, carry0, jax.random.split(key_run, env_params.max_steps_in_episode))
        return rewards.sum()

    tasks = jnp.asarray(tasks)

    @jax.jit
    def evaluate(params, key):
        keys = jax.random.split(key, (2, len(tasks), args.eval_episodes))  # [1]: unused (GPI in the SF scripts)
        per_episode = jax.vmap(episode_return, (None, 0, None))
        return jax.vmap(per_episode, (None, 0, 0))(params, keys[0], tasks)[None]

    return evaluate


def make_jax_evaluate(setup: Setup, args: Args, tasks: np.ndarray):
    """Fruitbot's JAX backend's evaluate(params, key): every (task, episode) is one env on the evaluation levels, all
    played greedily in one jitted loop until each has finished one lifetime."""
    env, e = setup.env, args.eval_episodes
    eval_params = env.make_params(tasks, num_levels=args.eval_levels, seed=1)  # key 1: not the training levels
    task_of_env = jnp.repeat(jnp.arange(len(tasks)), e)

    @jax.jit
    def play(params, key):
        net = eqx.combine(params, setup.static)

        def act(image, w, prev_action, prev_reward, rnn):
            rnn = jax.vmap(partial(core_step, net.core))(image, prev_action, prev_reward, rnn)
            return jnp.argmax(jax.vmap(partial(q_values, net))(rnn[0], w), -1), rnn

        returns = fruitbot_jax.play_first_lifetimes(env, eval_params, task_of_env, act, net.core.initial_state(), key,
                                                    args.max_levels * fruitbot_jax.TIMEOUT)
        return returns.reshape(len(tasks), e)

    def evaluate(params, key):
        return np.asarray(play(params, key))[None]  # [GPI settings (0 only), tasks, episodes]

    return evaluate


def make_host_evaluate(setup: Setup, args: Args, tasks):
    tasks = np.asarray(tasks, np.float32)

    @jax.jit
    def act(params, image, w, prev_action, prev_reward, first, rnn):
        net = eqx.combine(params, setup.static)
        rnn = reset_where(first, rnn, net.core.initial_state())
        rnn = jax.vmap(partial(core_step, net.core))(jax.vmap(setup.render)(image), prev_action, prev_reward, rnn)
        return jnp.argmax(jax.vmap(partial(q_values, net))(rnn[0], w), -1), rnn

    def evaluate(params, key):
        seed = int(jax.random.randint(key, (), 0, 2**31 - 1))  # the host envs' level seed
        task_of_env = np.repeat(np.arange(len(tasks)), args.eval_episodes)
        env = make_env(args, len(task_of_env), seed, tasks, num_levels=0, task_of_env=task_of_env)
        returns = play_first_episodes(env, partial(act, params), HOST_OBS[args.env],
                                      eqx.combine(params, setup.static).core.initial_state())
        return returns.reshape(1, len(tasks), args.eval_episodes)

    return evaluate


# =====================================================================================================================
# Main: build, (resume,) then alternate jitted training chunks with logging, evaluation and checkpoints
# =====================================================================================================================
@exit_on_config_error
def main(args: Args) -> None:
    check_args(args)
    if args.env in LEVEL_ENVS:
        check_replay_memory(args, replay_bytes(args))
    per_iteration = steps_per_iteration(args)
    total_steps = whole_iterations(args.total_timesteps, per_iteration) * per_iteration
    run = RunDir(args, args.env, method_name(args), total_steps)  # refuses a used, missing or unwritable directory
    seeds = [args.seed + i for i in range(args.num_seeds)]
    setup = make_setup(args, seeds)
    keys = jnp.stack([jax.random.PRNGKey(s) for s in seeds])

    def actors_of_every_seed():  # each seed's envs reset in turn (host envs on the host)
        return jax.tree.map(lambda *xs: jnp.stack(xs), *[
            fresh_actors(setup, args, *jax.random.split(jax.random.fold_in(k, 1)), seed_index=i)
            for i, k in enumerate(keys)])

    # jitted: one compile builds every seed's networks (eager ops would compile one by one), and the replay
    # (Fruitbot's frames: tens of GB at the paper's size) is allocated once
    if args.env in LEVEL_ENVS:
        state = jax.jit(jax.vmap(lambda k, a: init_train_state(setup, args, k, a)))(keys, actors_of_every_seed())
    else:
        state = jax.jit(jax.vmap(lambda k: init_train_state(setup, args, k)))(keys)
    num_params = count_params(eqx.combine(jax.tree.map(lambda x: x[0], state.params), setup.static))
    states = f" of game states (frames: {replay_bytes(args, frames=True) / 2**30:.2f} GiB)"
    print(f"{method_name(args)} network: {num_params:,} parameters; replay "
          f"{replay_bytes(args) / 2**30:.2f} GiB per seed{states if keeps_game_views(args) else ''}", flush=True)
    if args.resume:
        state, _ = run.restore(state)
        if on_host(args):  # the host envs start new episodes (they are not in the checkpoint)
            state = state._replace(actors=actors_of_every_seed())
    if args.env == "babyai":
        state = shard_seeds(state, args.num_seeds)  # seeds in parallel over the local devices, if there are several
    run.write_config({"method": method_name(args), "num_params": num_params,
                      "sgd_steps_per_iteration": sgd_steps_per_iteration(args),
                      "core_backend": getattr(setup.static.core, "backend", None)})  # FARM's, as resolved
    train_in_chunks(run, args, state, seeds, Training(
        make_chunk=partial(make_train_chunk, setup, args), evaluate=make_evaluate(setup, args),
        eval_tasks=eval_tasks(args), num_train_tasks=len(env_module(args).TRAIN_TASKS), gpi_settings=GPI_SETTINGS,
        loss_names=LOSS_NAMES, steps_per_iteration=per_iteration,
        sgd_steps_per_iteration=sgd_steps_per_iteration(args)))


if __name__ == "__main__":
    main(parse_args(Args))
