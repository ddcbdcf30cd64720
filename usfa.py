"""USFA baselines on BabyAI GotoAvoid, Procgen Fruitbot and MiniHack rooms: Universal Successor Feature Approximators (Borsa et al.,
2019), in one file.

One LSTM state h (no modules). psi(s, a, z) = MLP([h; z]) -> [A, C], Q = psi . w, GPI at test time over the train
tasks: argmax_a max_z psi(s, a, z) . w_test.

- Default, hand-designed cumulants: phi is the env's pickup indicator of each object category, and the only loss is
  n-step successor-feature learning with it as pseudo-reward (as in the original). The cumulant of transition
  t -> t+1 is the phi the env returned with r_t (r_t = phi_t . w); the original used the phi of the transition
  *into* o_t, one step early (docs/protocol.md, quirk 7): see the README.
- `--learned-cumulants` (USFA with learned phi): phi_t = MLP([h_{t+1}; h_t]) and exactly MSFA's three losses
  (Q-learning on psi . w, SF learning on the stop-gradient phi, phi . w regressed on r), so that the comparison
  with MSFA differs only in the state and heads. tests/test_learners.py runs the same hand-worked examples
  against this file's functions and msfa_babyai.py's, so the two cannot drift apart.

The file reads top to bottom as the whole algorithm: arguments (the paper's settings for --env as defaults), the
environment, the network and its Q/GPI heads, replay items, the recurrent unroll, n-step targets and the losses,
acting, the jitted training program, evaluation, and main (see msfa_babyai.py for the shape of the program). One
training loop serves every environment: BabyAI and, by default, Fruitbot are JAX and step inside the jitted chunk
(Fruitbot: common/envs/fruitbot_jax.py, the original's per-task games with --distribution-mode paper, as msfa_fruitbot.py);
MiniHack (NLE), and Fruitbot with --env-backend procgen (stock hard or easy), run on the host and step from inside the
same chunk through io_callback (as msfa_minihack.py; benchmarks/host_env.py). MiniHack's rooms define no cumulants, so
there USFA only learns them.

    python usfa.py --seed 3                         # USFA, hand-designed cumulants
    python usfa.py --learned-cumulants --seed 3     # USFA with learned cumulants
    python usfa.py --env fruitbot --replay-size 10000 --min-replay-size 500   # on Fruitbot (sizes: the paper's)
    python usfa.py --env minihack --learned-cumulants  # on MiniHack's small rooms (the only USFA defined there)
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
from common.gpi import gpi_values
from common.networks import DQN_CHANNELS, MLP, LSTMCore, count_params
from common.run import (Evaluation, IterationMetrics, RunArgs, RunDir, SGDMetrics, Training, check_replay_args,
                        check_replay_memory, check_run_args, cumulant_response, cumulant_stats, exit_on_config_error,
                        finished_episodes, parse_args, require, require_non_negative, require_positive, shard_seeds,
                        train_in_chunks, whole_iterations)


# =====================================================================================================================
# Arguments: defaults are the paper's settings for --env (docs/protocol.md)
# =====================================================================================================================
@dataclass
class Args(RunArgs):
    # --- The algorithm: network, losses, sequences and targets, replay, optimiser, acting (defaults: the paper's) ---
    learned_cumulants: bool = False
    """learn phi = MLP([h_{t+1}; h_t]) with MSFA's three losses instead of using the env's cumulants"""
    reward_input: Literal["on", "off"] = "on"
    """on: the recurrent core reads the previous reward tanh(r_{t-1}) beside the previous action (the paper's agent);
    off: its entry is 0, so the state, and learned cumulants phi read from it, cannot see the reward (the
    cumulants' confound: docs/cumulants.md)"""
    lstm_size: int | None = None
    """size of the LSTM state h (default: 512 on BabyAI, 300 on Fruitbot and MiniHack)"""
    psi_hidden: tuple[int, ...] | None = None
    """hidden sizes of the psi MLP on [h; z] (default: 128 on BabyAI, 512 512 on Fruitbot and MiniHack)"""
    phi_hidden: tuple[int, ...] = (256, 256)
    """hidden sizes of the phi MLP (--learned-cumulants only)"""
    q_coeff: float = 0.5
    """weight alpha_Q of the Q-learning loss on psi . w (--learned-cumulants only)"""
    sf_coeff: float = 1.0
    """weight alpha_psi of the successor-feature loss"""
    phi_coeff: float = 1.0
    """weight alpha_phi of the reward regression phi . w ~ r (--learned-cumulants only)"""
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
    batch_size: int | None = None
    """sequences per SGD step (default 8; 32 for USFA-learned in MiniHack's large room: the original's search gave it
    batches of 128 sequences there, split into 4 SGD steps)"""
    priority_exponent: float = 0.9
    """replay samples sequences with probability ~ priority^exponent"""
    importance_exponent: float | None = None
    """exponent of the importance weights that correct prioritised sampling (0: no correction; default: 0 on BabyAI,
    0.6 on Fruitbot)"""
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

    def __post_init__(self):
        """Settings left at None take the paper's value for --env."""
        settings = PAPER_SETTINGS.get(self.env, {})
        if self.env == "minihack" and self.room_size in minihack.ROOM_SIZES:
            settings = settings | dict(total_timesteps={"5x5": 3_000_000, "15x15": 5_000_000}[self.room_size],
                                       train_levels=minihack.TRAIN_LEVELS[self.room_size])
        large_room = self.env == "minihack" and self.room_size == "15x15"
        settings = settings | dict(batch_size=32 if large_room and self.learned_cumulants else 8)
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
    of being masked; learned cumulants then need the final view, which replay stores (on Fruitbot the next level's
    first frame stands for it, see next_states)"""
    gpi_support: str = "train"
    """the policies GPI maximises over at evaluation: "train" (the train tasks) or, on Fruitbot and MiniHack, "test"
    (the test tasks: the original code's evaluators)"""

    # --- Run controls: seeds, budget, evaluation, logging, speed-only options (the rest: common.run.RunArgs) ---
    exp_name: str = os.path.splitext(os.path.basename(__file__))[0]
    """name of the experiment (prefix of the default run directory): the script's file name, so a copy names its own"""
    seed: int = 1
    """seed of the first run; vmapped runs use seed, seed + 1, ..."""
    num_seeds: int = 1
    """independent runs trained side by side in one program (vmapped)"""
    total_timesteps: int | None = None
    """env steps per seed (rounded up to whole iterations of num_envs x sequence_period; default: the paper's, 5M on
    BabyAI, 10M on Fruitbot, 3M / 5M in MiniHack's small / large rooms)"""
    eval_episodes: int | None = None
    """greedy episodes per task and per GPI setting at each evaluation (default: 20 on BabyAI and MiniHack, 10 on
    Fruitbot)"""
    eval_every: int | None = None
    """env steps (per seed) between evaluations; one more runs at the end (default: 250k on BabyAI and MiniHack, 500k
    on Fruitbot)"""
    log_every: int = 2_560
    """env steps (per seed) between progress lines and metrics rows"""
    env_workers: int = 1
    """MiniHack: processes stepping each seed's envs in parallel (1: in this process; more on a machine with many
    cores: the same episodes, faster)"""
    ALSO_SAFE_TO_CHANGE: ClassVar[tuple[str, ...]] = ("env_workers",)
    """--resume may change these too (common.run.safe_to_change): the same episodes, stepped by more processes"""


PAPER_SETTINGS = {
    "babyai": dict(total_timesteps=5_000_000, eval_episodes=20, eval_every=250_000, lstm_size=512, psi_hidden=(128,),
                   replay_size=100_000, min_replay_size=100, importance_exponent=0.0),
    "fruitbot": dict(total_timesteps=10_000_000, eval_episodes=10, eval_every=500_000, lstm_size=300,
                     psi_hidden=(512, 512), replay_size=70_000, min_replay_size=10_000, importance_exponent=0.6,
                     train_levels=fruitbot.TRAIN_LEVELS),
    "minihack": dict(eval_episodes=20, eval_every=250_000, lstm_size=300, psi_hidden=(512, 512), replay_size=70_000,
                     min_replay_size=100, importance_exponent=0.6),
}
ENVS = {"babyai": babyai, "fruitbot": fruitbot, "minihack": minihack}
TORSOS = {"babyai": "dqn", "fruitbot": "impala", "minihack": "impala"}
LEVEL_ENVS = ("fruitbot", "minihack")  # games of levels, frames and whole-number tasks (BabyAI has none of them)
GPI_SUPPORTS = ("train", "test")


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
    require(args.env != "minihack" or args.learned_cumulants, "USFA with hand-designed cumulants has no phi on "
                                                              "MiniHack (its rooms define none): add --learned-cumulants")
    if args.env == "fruitbot":
        fruitbot.check_game(args.distribution_mode, args.env_backend)
        require_non_negative(args, "eval_levels")
        require_positive(args, "max_levels")
    require(args.env == "fruitbot" or not args.replay_frames, f"--replay-frames is a Fruitbot setting ({args.env} "
                                                              f"replay keeps its small views)")
    require(args.gpi_support in GPI_SUPPORTS, f"--gpi-support must be one of {', '.join(GPI_SUPPORTS)}, got "
                                              f"{args.gpi_support!r}")
    require(args.env in LEVEL_ENVS or args.gpi_support == "train", "--gpi-support test is the original's Fruitbot "
                                                                  "evaluator; BabyAI's GPI is over the train tasks")
    require_positive(args, "num_seeds", "total_timesteps", "num_envs", "eval_episodes", "eval_every", "log_every",
                     "n_step", "replay_size", "batch_size", "target_update_period", "sequence_period", "num_epsilons",
                     "lstm_size", "learning_rate", "adam_eps", "max_grad_norm", "epsilon_base",
                     "samples_per_insert")
    require_non_negative(args, "q_coeff", "sf_coeff", "phi_coeff", "seed", "importance_exponent")
    require(all(x > 0 for x in args.psi_hidden + args.phi_hidden), "--psi-hidden and --phi-hidden sizes must be "
                                                                   "positive")
    require(args.learned_cumulants or not args.priority_from_q, "--priority-from-q needs --learned-cumulants (USFA "
                                                                "with the env's cumulants learns no Q TD error)")
    check_replay_args(args)


def method_name(args: Args) -> str:
    parts = [name for name, on in (("learned cumulants", args.learned_cumulants),
                                   ("reward-blind", args.reward_input == "off")) if on]
    return f"USFA ({', '.join(parts)})" if parts else "USFA"


def keeps_game_views(args: Args) -> bool:
    """Whether replay keeps Fruitbot's JAX game states (GameViews, drawn into frames by the learner), not frames."""
    return args.env == "fruitbot" and not on_host(args) and args.train_levels > 0 and not args.replay_frames


def replay_bytes(args: Args, frames: bool | None = None) -> int:
    """Memory replay takes per seed: every step's observation (BabyAI's symbolic view; MiniHack's crop of int16 tile
    indices; Fruitbot's GameView, or its 64x64x3 uint8 frame with frames or where replay keeps them), the final view
    where it keeps one, the step's other fields, and each sequence's recurrent state (h, c)."""
    frames = not keeps_game_views(args) if frames is None else frames
    fruitbot_obs = (int(np.prod(fruitbot.IMAGE_SHAPE)) if frames
                    else fruitbot_jax.view_bytes(fruitbot.JAX_GAMES[args.distribution_mode]))
    obs = {"fruitbot": fruitbot_obs, "minihack": 2 * minihack.CROP**2}.get(args.env, 75)
    obs *= 2 if keeps_final_view(args) else 1  # Step.final_obs
    per_step = obs + 4 * (2 * fruitbot.TASK_DIM + 4) + 2  # w, phi, prev action and reward, action, reward; 2 bools
    return args.replay_size * (args.sequence_length * per_step + 2 * 4 * args.lstm_size)


def steps_per_iteration(args: Args) -> int:
    """Env steps per seed per iteration: every env adds one sequence period."""
    return args.num_envs * args.sequence_period


def sgd_steps_per_iteration(args: Args) -> int:
    """SGD steps after each iteration, so that sampled/inserted sequences ~ samples_per_insert."""
    return max(1, round(args.samples_per_insert * args.num_envs / args.batch_size))


# =====================================================================================================================
# Network: DQN (BabyAI) or Impala (Fruitbot, MiniHack) torso -> LSTM -> psi(s, a, z) = MLP([h; z]) and, with learned cumulants, phi = MLP([h_{t+1}; h_t])
# =====================================================================================================================
class USFANetwork(eqx.Module):
    core: LSTMCore
    psi_mlp: MLP  # [h; z] -> A x C
    phi_mlp: MLP | None  # [h_{t+1}; h_t] -> C (learned cumulants only)
    task_dim: int = eqx.field(static=True)
    num_actions: int = eqx.field(static=True)

    def __init__(self, args: Args, task_dim: int, key):
        k_core, k_psi, k_phi = jax.random.split(key, 3)
        self.num_actions = env_module(args).NUM_ACTIONS
        self.core = LSTMCore(self.num_actions, args.lstm_size, k_core, torso=TORSOS[args.env],
                             torso_channels=args.torso_channels if args.env == "babyai" else None,
                             reward_input=args.reward_input == "on")
        self.psi_mlp = MLP((args.lstm_size + task_dim, *args.psi_hidden, self.num_actions * task_dim), k_psi)
        self.phi_mlp = (MLP((2 * args.lstm_size, *args.phi_hidden, task_dim), k_phi)
                        if args.learned_cumulants else None)
        self.task_dim = task_dim

    def psi(self, h, z):
        """Successor features [A, C] of policy z."""
        return self.psi_mlp(jnp.concatenate([h, z])).reshape(self.num_actions, self.task_dim)

    def phi(self, h_next, h):
        """Learned cumulants [C] of the transition between states h and h_next."""
        return self.phi_mlp(jnp.concatenate([h_next, h]))


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
    obs: jax.Array  # BabyAI's symbolic view uint8 [5, 5, 3] or MiniHack's crop of tile indices int16 [9, 9]
    #                 (rendered to RGB by the network's caller), or Fruitbot's frame uint8 [64, 64, 3] (in replay,
    #                 the JAX game's GameView it is drawn from: replay_frames)
    w: jax.Array  # float32 [C], the task as the agent sees it
    prev_action: jax.Array  # int32
    prev_reward: jax.Array  # float32
    first: jax.Array  # bool: obs starts an episode (the recurrent state is reset before it)
    action: jax.Array  # int32, taken at obs
    reward: jax.Array  # float32, received for action
    phi: jax.Array  # float32 [C], the env's cumulant of the same transition: reward = phi . w (MiniHack: none, 0)
    final_obs: jax.Array  # the view the action led to where it ended the episode (kept, for the learned cumulant of
    #                       that transition, on MiniHack and with --time-limit-is-termination, not on Fruitbot; else [0])
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
    """The torso's maps [T, ...] of a sequence's views (the torso runs outside the loop) and the recurrent states
    (h, c) [T, ...] along it."""
    maps = jax.vmap(lambda o: core.torso(render(o)))(seq.steps.obs)
    vectors = jax.vmap(core.input_vector)(seq.steps.prev_action, seq.steps.prev_reward)
    return maps, core.unroll(maps, vectors, seq.steps.first, seq.state)


def keeps_final_view(args) -> bool:
    """Whether replay stores the view that ends an episode (see Step.final_obs): learned cumulants need it where
    episodes end by termination, which MiniHack's do (the stairs, deaths), and with --time-limit-is-termination.
    Fruitbot stores none: its ended episodes read the next level's first frame instead (next_states), on either
    backend, as msfa_fruitbot.py does."""
    return args.learned_cumulants and args.env != "fruitbot" and (args.time_limit_is_termination
                                                                   or args.env == "minihack")


def next_states(core, render, seq: Sequence, states, args, maps=None):
    """h_{t+1} [T-1, ...] of each transition t, for its learned cumulant phi(h_{t+1}, h_t): the next step's state;
    with --time-limit-is-termination, where the episode ended at t, the state after its final view instead (the
    next step belongs to another episode; without the flag that transition is masked; MiniHack's terminations always
    use it). Fruitbot: procgen (and the JAX game, which resets alike) renders the next level before it returns, so
    where an episode ended, that first frame (maps[t+1]) read with the state carried on stands for the final view, as
    in the original and msfa_fruitbot.py; only terminal transitions use it."""
    h_next = states[0][1:]
    s = seq.steps
    if args.env == "fruitbot":
        vectors = jax.vmap(core.input_vector)(s.action[:-1], s.reward[:-1])
        carried, _ = jax.vmap(core.recur)(maps[1:], vectors, jax.tree.map(lambda x: x[:-1], states))
        return jnp.where(s.first[1:].reshape((-1,) + (1,) * (h_next.ndim - 1)), carried, h_next)
    if not keeps_final_view(args):
        return h_next
    final, _ = jax.vmap(partial(core_step, core))(jax.vmap(render)(s.final_obs[:-1]), s.action[:-1], s.reward[:-1],
                                                  jax.tree.map(lambda x: x[:-1], states))
    return jnp.where(s.first[1:].reshape((-1,) + (1,) * (h_next.ndim - 1)), final, h_next)


# =====================================================================================================================
# n-step targets, priorities and the losses (learned cumulants: MSFA's three; hand-designed: SF learning only)
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


def successor_features(net, target_net, render, seq: Sequence):
    """Torso maps and states (h, c) [T, ...] along a sequence, and the online and (stop-gradient) target psi
    [T, A, C] of z = w."""
    maps, states = unroll(net.core, render, seq)
    h_target = jax.lax.stop_gradient(unroll(target_net.core, render, seq)[1][0])
    return maps, states, jax.vmap(net.psi)(states[0], seq.steps.w), jax.vmap(target_net.psi)(h_target, seq.steps.w)


def sf_td_error(psi, psi_target, q, cumulants, seq: Sequence, terminal, args: Args):
    """n-step double-Q SF TD errors [T-1, C], one TD problem per cumulant dimension with cumulants[t] the
    pseudo-reward of transition t; the online q = psi . w [T, A] picks the bootstrap action; terminal: as
    n_step_targets' terminal_at_end. Returns (errors, valid)."""
    s = seq.steps
    targets, valid = n_step_targets(cumulants, double_q_bootstrap(q, psi_target), ~s.first[1:], args.n_step,
                                    args.gamma, terminal)
    return jax.lax.stop_gradient(targets) - psi[jnp.arange(q.shape[0] - 1), s.action[:-1]], valid


def sequence_loss(net: USFANetwork, target_net: USFANetwork, render, seq: Sequence, args: Args):
    """Learned cumulants: MSFA's three losses of one sequence, and the TD errors that set its priority."""
    s = seq.steps
    maps, states, psi, psi_target = successor_features(net, target_net, render, seq)  # psi [T, A, C]
    q = jnp.einsum("tac,tc->ta", psi, s.w)
    q_target = jnp.einsum("tac,tc->ta", psi_target, s.w)
    phi = jax.vmap(net.phi)(next_states(net.core, render, seq, states, args, maps), states[0][:-1])  # [T-1, C]
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


def oracle_sequence_loss(net: USFANetwork, target_net: USFANetwork, render, seq: Sequence, args: Args):
    """Hand-designed cumulants: n-step double-Q SF learning with the env's cumulants, one TD problem per dimension;
    and the priority. The pseudo-reward of transition t is steps.phi[t], the cumulant of the same transition as
    steps.reward[t]."""
    _, _, psi, psi_target = successor_features(net, target_net, render, seq)
    q = jnp.einsum("tac,tc->ta", psi, seq.steps.w)
    delta_psi, valid = sf_td_error(psi, psi_target, q, seq.steps.phi[:-1], seq, terminal_transitions(seq, args),
                                   args)  # [T-1, C]
    steps, taken = jnp.arange(delta_psi.shape[0]), seq.steps.action[:-1]
    return {"loss_psi": masked_mean(jnp.mean(0.5 * delta_psi**2, axis=-1), valid),
            "q_mean": masked_mean(q[steps, taken], valid),
            "priority": sequence_priority(jnp.mean(delta_psi, -1), valid, args.max_priority_weight)}


def loss_names(args: Args) -> tuple[str, ...]:
    """What an SGD step reports (metrics.csv columns): batch_loss's losses and the gradient's norm."""
    if args.learned_cumulants:
        return ("loss", "loss_q", "loss_psi", "loss_phi", "q_mean", "grad_norm")
    return ("loss", "loss_psi", "q_mean", "grad_norm")


def batch_loss(net: USFANetwork, target_net: USFANetwork, render, batch: Sequence, probabilities, args: Args):
    """Learned cumulants: alpha_psi mean_b(IS_b L_psi,b) + alpha_Q mean_b L_Q,b + alpha_phi (masked mean of the phi
    error). Hand-designed cumulants: alpha_psi mean_b(IS_b L_psi,b)."""
    weights = importance_weights(probabilities, args.importance_exponent)
    if not args.learned_cumulants:
        out = jax.vmap(lambda seq: oracle_sequence_loss(net, target_net, render, seq, args))(batch)
        loss = args.sf_coeff * jnp.mean(weights * out["loss_psi"])
        losses = {"loss": loss, "loss_psi": jnp.mean(out["loss_psi"]), "q_mean": jnp.mean(out["q_mean"])}
        return loss, (out["priority"], losses, None)
    out = jax.vmap(lambda seq: sequence_loss(net, target_net, render, seq, args))(batch)
    loss_phi = jnp.sum(out["phi_error_sum"]) / (jnp.sum(out["phi_count"]) + 1e-5)
    loss = (args.sf_coeff * jnp.mean(weights * out["loss_psi"]) + args.q_coeff * jnp.mean(out["loss_q"])
            + args.phi_coeff * loss_phi)
    losses = {"loss": loss, "loss_q": jnp.mean(out["loss_q"]), "loss_psi": jnp.mean(out["loss_psi"]),
              "loss_phi": loss_phi, "q_mean": jnp.mean(out["q_mean"])}
    stats = cumulant_stats(out["phi"], batch.steps.phi[:, :-1], out["valid"]) if measures_cumulants(args) else None
    return loss, (out["priority"], losses, stats)


def measures_cumulants(args: Args) -> bool:
    """Whether metrics.csv compares the learned cumulants with the env's (MiniHack has none to compare with)."""
    return args.learned_cumulants and args.env != "minihack"


def num_measured_cumulants(args: Args) -> int:
    """How many cumulants those comparisons have (metrics.csv's phi_* columns): C, or 0 where there are none."""
    return env_module(args).TRAIN_TASKS.shape[1] if measures_cumulants(args) else 0


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


def make_network(args: Args, key) -> USFANetwork:
    return USFANetwork(args, env_module(args).TASK_DIM if args.env in LEVEL_ENVS else babyai.NUM_CATEGORIES, key)


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
    """seeds: whose host training envs to build (none: a setup for the network, losses and evaluation only)."""
    if on_host(args):
        env, env_params = [make_env(args, args.num_envs, seed) for seed in seeds or []], None
        if args.env == "minihack":
            tile_images = jnp.asarray(minihack.tile_set()[0])
            render = partial(minihack.render, tile_images=tile_images)
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
    initial = (jnp.zeros(args.lstm_size),) * 2  # the LSTM's initial (h, c)
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
        jax.tree.map(lambda x: jnp.zeros((args.sequence_period,) + x.shape, x.dtype), step_before_acting(actors, args)),
        actors, actors.rnn, args))
    state = TrainState(params=params, target_params=target_params, opt_state=setup.optimizer.init(params),
                       buffer=setup.buffer.init(example), actors=actors, key=k_run,
                       env_steps=jnp.zeros((), jnp.int32), sgd_steps=jnp.zeros((), jnp.int32))
    # flashbax leaves a weakly typed scalar; strong types everywhere keep the chunk from compiling twice
    return jax.tree.map(lambda x: jnp.asarray(x, x.dtype), state)


def step_before_acting(actors: Actor, args: Args) -> Step:
    """The step every env is at now, before it acts: its observation and what led to it; action, reward, phi,
    final_obs and terminal are placeholders that acting fills in."""
    return Step(obs=actors.obs.image if actors.kept is None else actors.kept, w=actors.obs.w,
                prev_action=actors.prev_action, prev_reward=actors.prev_reward, first=actors.first,
                action=actors.prev_action, reward=actors.prev_reward,
                phi=jnp.zeros_like(actors.obs.w),
                final_obs=jnp.zeros(actors.obs.image.shape if keeps_final_view(args) else actors.prev_action.shape
                                    + (0,), actors.obs.image.dtype), terminal=jnp.zeros_like(actors.first))


def make_sequences(steps: Step, actors: Actor, start_rnn, args: Args) -> Sequence:
    """One sequence per env: the period's steps [P, E] plus the step the envs are at now (action/reward 0)."""
    last = step_before_acting(actors, args)._replace(action=jnp.zeros_like(actors.prev_action),
                                               reward=jnp.zeros_like(actors.prev_reward))
    steps = jax.tree.map(lambda xs, x: jnp.concatenate([xs, x[None]]), steps, last)
    return Sequence(steps=jax.tree.map(lambda x: jnp.swapaxes(x, 0, 1), steps), state=start_rnn)


def host_step(setup: Setup, args: Args, seed_index, action, observation):
    """Step one seed's host envs from inside the jitted program (jax.experimental.io_callback). Under the seed vmap
    JAX runs the callback once per seed, in turn; the actions of step t+1 depend on its observations, so the calls
    of one seed stay in order. Returns (obs, w, reward, terminated, truncated, phi, final view): Fruitbot (procgen)
    gives its cumulants and no final view (keeps_final_view); MiniHack gives the crop the step led to and no
    cumulants (zeros)."""
    e, c = args.num_envs, env_module(args).TASK_DIM
    view = jax.ShapeDtypeStruct(observation.shape, observation.dtype)
    final_view = view if keeps_final_view(args) else jax.ShapeDtypeStruct((e, 0), observation.dtype)

    def host(seed_index, action):
        obs, reward, terminated, truncated, info = setup.env[int(seed_index)].step(np.asarray(action))
        if args.env == "minihack":
            phi, final = np.zeros((e, c), np.float32), info["final_tiles"]
        else:  # Fruitbot: next_states reads the next level's first frame instead of a final view
            phi, final = info["phi"], None
        final = final if keeps_final_view(args) else np.zeros(final_view.shape, final_view.dtype)
        return obs[HOST_OBS[args.env]], obs["w"], reward, terminated, truncated, phi, final

    shapes = (view, jax.ShapeDtypeStruct((e, c), jnp.float32), jax.ShapeDtypeStruct((e,), jnp.float32),
              jax.ShapeDtypeStruct((e,), jnp.bool_), jax.ShapeDtypeStruct((e,), jnp.bool_),
              jax.ShapeDtypeStruct((e, c), jnp.float32), final_view)
    return io_callback(host, shapes, seed_index, action)


def act_step(setup: Setup, args: Args, params, actors: Actor, key):
    """One env step in every env: epsilon-greedy on Q = psi . w for the training task w (no GPI)."""
    net = eqx.combine(params, setup.static)
    k_explore, k_action, k_env, k_eps = jax.random.split(key, 4)
    e = args.num_envs
    rnn = reset_where(actors.first, actors.rnn, net.core.initial_state())
    rnn = jax.vmap(partial(core_step, net.core))(jax.vmap(setup.render)(actors.obs.image),
                                                 actors.prev_action, actors.prev_reward, rnn)
    q = jax.vmap(partial(q_values, net))(rnn[0], actors.obs.w)
    explore = jax.random.uniform(k_explore, (e,)) < actors.epsilon
    action = jnp.where(explore, jax.random.randint(k_action, (e,), 0, net.num_actions), jnp.argmax(q, -1))
    if on_host(args):
        image, w, reward, terminated, truncated, phi, final_image = host_step(setup, args, actors.env_state, action,
                                                                               actors.obs.image)
        obs, env_state = Observation(image, w), actors.env_state
    else:  # the JAX envs: BabyAI (its episodes end by their time limit only) and Fruitbot (info["phi"]: exact)
        obs, env_state, reward, terminated, truncated, info = jax.vmap(setup.env.step, (0, 0, 0, None))(
            jax.random.split(k_env, e), actors.env_state, action, setup.env_params)
        phi, final_image = info["phi"], info["final_image"]
    done = terminated | truncated
    step = step_before_acting(actors, args)._replace(action=action, reward=reward, phi=phi, terminal=terminated)
    if keeps_final_view(args):
        step = step._replace(final_obs=final_image)
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
    buffer = setup.buffer.add(state.buffer, make_sequences(steps, actors, start_rnn, args))
    state = state._replace(buffer=buffer, actors=actors, key=key,
                           env_steps=state.env_steps + steps_per_iteration(args))

    def learn(state):
        state, metrics = jax.lax.scan(partial(sgd_step, setup, args), state,
                                      jax.random.split(k_learn, sgd_steps_per_iteration(args)))
        return state, (jax.tree.map(lambda x: jnp.mean(x, 0), metrics), jnp.ones(()))

    def wait(state):  # replay cannot be sampled yet: no SGD step, the SGD step's metrics as zeros
        return state, (SGDMetrics.none_taken(loss_names(args), num_measured_cumulants(args)), jnp.zeros(()))

    state, (sgd, learning) = jax.lax.cond(setup.buffer.can_sample(state.buffer), learn, wait, state)
    return state, IterationMetrics(sgd, learning, **finished_episodes(finished, env_module(args).TRAIN_TASKS.shape[0]),
                                   epsilon=jnp.mean(actors.epsilon))


def make_train_chunk(setup: Setup, args: Args, iterations: int):
    """A jitted function running `iterations` training iterations for every (vmapped) seed."""
    def chunk(state):
        return jax.lax.scan(partial(train_iteration, setup, args), state, None, length=iterations)
    return jax.jit(jax.vmap(chunk), donate_argnums=0)


# =====================================================================================================================
# Evaluation: greedy, on train and test tasks, with GPI over the train tasks and without
# =====================================================================================================================
GPI_SETTINGS = (0, 1)
"""eval.csv's gpi column: 0 acts on psi(s, a, w) . w, 1 on max_z psi(s, a, z) . w over the train tasks"""


def eval_tasks(args: Args) -> np.ndarray:
    """The env's train tasks, then its test tasks."""
    return np.concatenate([env_module(args).TRAIN_TASKS, env_module(args).TEST_TASKS])


def make_evaluate(setup: Setup, args: Args, tasks=None, gpi_settings=GPI_SETTINGS):
    """evaluate(params, key) -> returns [gpi_settings, tasks, episodes] of one seed's params, on the train and test
    tasks (or any task vectors: tools/evaluate.py); on BabyAI an Evaluation, which with learned cumulants holds
    their response on the episodes acting on w too (eval.csv reads it on the train tasks: common/run/cumulants.py). BabyAI and Fruitbot's JAX game: one jitted program; host envs
    (MiniHack, Fruitbot on procgen): greedy episodes on unrestricted levels, the network acting for all (task,
    episode) envs at once, the envs on the host. gpi_settings picks the settings played (tools/evaluate.py --gpi
    on|off plays one); each keeps its own keys and levels, so its returns are those of playing both."""
    tasks = eval_tasks(args) if tasks is None else tasks
    if on_host(args):
        return make_host_evaluate(setup, args, tasks, gpi_settings)
    if args.env == "fruitbot":
        return make_jax_evaluate(setup, args, np.asarray(tasks, np.float32), gpi_policies(args), gpi_settings)
    env = setup.env
    policies = jnp.asarray(babyai.TRAIN_TASKS)
    measure = args.learned_cumulants  # the response of the learned cumulants (the env's are exact)

    def episode(params, key, w, use_gpi: bool):
        """One greedy episode: its return and, acting on w with learned cumulants, their response (the first T-1
        transitions: the last has no h_{t+1})."""
        net = eqx.combine(params, setup.static)
        env_params = env.task_params(w)
        key_reset, key_run = jax.random.split(key)
        obs, env_state = env.reset(key_reset, env_params)
        carry0 = (env_state, obs, jnp.zeros((), jnp.int32), jnp.zeros(()), net.core.initial_state())
        kept = measure and not use_gpi

        def step(carry, key):
            env_state, obs, prev_action, prev_reward, rnn = carry
            rnn = core_step(net.core, env.rgb_from_symbolic(obs.image), prev_action, prev_reward, rnn)
            q = gpi_q_values(net, rnn[0], obs.w, policies) if use_gpi else q_values(net, rnn[0], obs.w)
            action = jnp.argmax(q)
            obs, env_state, reward, _, _, info = env.step(key, env_state, action, env_params)
            return (env_state, obs, action, reward, rnn), (reward, rnn[0] if kept else None, info["phi"])

        keys = jax.random.split(key_run, env_params.max_steps_in_episode)
        _, (rewards, h, phi_env) = jax.lax.scan(step, carry0, keys)
        if not kept:
            return rewards.sum(), None
        phi = jax.vmap(net.phi)(h[1:], h[:-1])
        return rewards.sum(), cumulant_response(phi, phi_env[:-1], jnp.ones(phi.shape[0], bool))

    tasks = jnp.asarray(tasks)

    @jax.jit
    def evaluate(params, key):
        keys = jax.random.split(key, (2, len(tasks), args.eval_episodes))
        returns, response = [], (None, None)
        for g in gpi_settings:
            per_episode = jax.vmap(partial(episode, use_gpi=g == 1), (None, 0, None))
            played, measured = jax.vmap(per_episode, (None, 0, 0))(params, keys[g], tasks)
            returns.append(played)
            if measured is not None:  # summed over each task's episodes
                response = jax.tree.map(lambda x: x.sum(1), measured)
        return Evaluation(jnp.stack(returns), *response)

    return evaluate


def gpi_policies(args: Args):
    """The policies z GPI maximises over at evaluation (--gpi-support): the env's train or test tasks."""
    env_tasks = env_module(args)
    return jnp.asarray(env_tasks.TRAIN_TASKS if args.gpi_support == "train" else env_tasks.TEST_TASKS)


def make_jax_evaluate(setup: Setup, args: Args, tasks: np.ndarray, policies, gpi_settings):
    """Fruitbot's JAX backend's evaluate(params, key): every (task, episode) is one env on the evaluation levels, all
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


def make_host_evaluate(setup: Setup, args: Args, tasks, gpi_settings):
    policies = gpi_policies(args)
    tasks = np.asarray(tasks, np.float32)

    @partial(jax.jit, static_argnames="use_gpi")
    def act(params, image, w, prev_action, prev_reward, first, rnn, use_gpi: bool):
        net = eqx.combine(params, setup.static)
        rnn = reset_where(first, rnn, net.core.initial_state())
        rnn = jax.vmap(partial(core_step, net.core))(jax.vmap(setup.render)(image), prev_action, prev_reward, rnn)
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
            partial(act, params, use_gpi=g == 1), HOST_OBS[args.env], initial).reshape(len(tasks), args.eval_episodes)
            for g in gpi_settings])

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
    train_tasks = env_module(args).TRAIN_TASKS
    train_in_chunks(run, args, state, seeds, Training(
        make_chunk=partial(make_train_chunk, setup, args), evaluate=make_evaluate(setup, args),
        eval_tasks=eval_tasks(args), num_train_tasks=len(train_tasks), gpi_settings=GPI_SETTINGS,
        loss_names=loss_names(args), steps_per_iteration=per_iteration,
        sgd_steps_per_iteration=sgd_steps_per_iteration(args),
        num_cumulants=num_measured_cumulants(args)))


if __name__ == "__main__":
    main(parse_args(Args))
