"""Procgen Fruitbot as a multitask environment with exact per-category cumulants (stock procgen, no patched C++).

The agent flies up a level, always moving forward; it steers left/right, fires keys at locked doors (action 9) and
collects objects on the way. Hard mode (the default) draws every object's sprite from 6 themes, so 12 object types
appear: fruit themes 0-5 and food themes 0-5. The paper groups them into 4 categories, C1 = fruit 0-2,
C2 = fruit 3-5, C3 = food 0-2, C4 = food 3-5, and a task w in R^4 pays w_k per object of category k collected.

Cumulants are read exactly from the serialized game state, never estimated from pixels. The game's own reward is
1 per fruit, -4 per food and +10 per present tile touched at the end of a level, so a non-zero stock reward on an
ordinary step means something was collected: only then is the state read (`get_state`, ~80 us) and the change in
each type's count taken. At a level boundary procgen has already reset to the next level; a reward of exactly the
completion bonus (10 or 20 per present tile touched) or 0 (a death) says nothing was collected. Otherwise (or to
render the final view) the step is replayed in a scratch env from the last state read, with barriers, locked doors
and presents made inert and the level's timeout lifted (the agent's motion depends only on the grid, and the RNG is
part of the state): the counts after the replay are the counts at the moment the level ended, and its frame is the
view the ending step led to. Every step checks that the stock reward equals fruit - 4 food (+ the completion
bonus); a mismatch stops the run. The one blind spot: 4 fruit and a food on one step sum to 0 (never observed).

An episode ("lifetime") is up to `max_levels` levels: completing a level continues the episode (the recurrent
state and the return carry on, discount 1), completing the last one or hitting a barrier or a locked door ends it
(termination), and the per-level timeout of 1000 steps is a truncation. The env auto-resets: the observation
returned with an ending step is the next episode's first (with final_view=True, `info["final_image"]` holds the
view the ending step led to). The task is drawn uniformly from `tasks` at every episode start. The reward is w . phi: no completion bonus
and no -4 food penalty (the original's patched games did the same).

This is the scripts' `--env-backend procgen`: stock procgen, hard (the default here) or easy mode. The scripts'
default is the JAX game (common/envs/fruitbot_jax.py), which also plays the original's per-task games (easy mode, levels
10 wide and 90 tall, per-task object lists: docs/fruitbot.md) that stock procgen cannot; the tests prove the JAX
game's stock modes against this procgen state by state.
"""

from __future__ import annotations

import struct

import numpy as np

from common.envs.procgen_env import ProcgenEnv, require_procgen  # noqa: F401  (the scripts' check)
from common.run import exit_on_config_error, format_task, require

NUM_ACTIONS = 15  # procgen's full action set: 9 moves (only left/none/right matter here), fire, and 5 no-ops
FIRE = 9
TASK_DIM = 4
IMAGE_SHAPE = (64, 64, 3)
MAX_LEVELS = 4
DISTRIBUTION_MODES = ("hard", "easy")
TRAIN_LEVELS = 200  # training levels come from level seeds 0..199; evaluation levels are unrestricted

JAX_GAMES = {"paper": "paper", "hard": "stock-hard", "easy": "stock-easy"}
"""the training scripts' --distribution-mode -> the game of common/envs/fruitbot_jax.py (paper: the original's
per-task games; hard, easy: stock procgen's)"""
ENV_BACKENDS = ("jax", "procgen")
"""the training scripts' --env-backend: the JAX game inside the jitted program, or procgen's C++ game on the host"""


def check_game(distribution_mode: str, env_backend: str) -> None:
    """Refuse a game the training scripts cannot play (--distribution-mode, --env-backend), with one line."""
    require(distribution_mode in JAX_GAMES,
            f"--distribution-mode must be one of {', '.join(JAX_GAMES)}, got {distribution_mode!r}")
    require(env_backend in ENV_BACKENDS, f"--env-backend must be one of {', '.join(ENV_BACKENDS)}, got {env_backend!r}")
    require(env_backend == "jax" or distribution_mode != "paper",
            "--distribution-mode paper (the original's per-task games) runs only with --env-backend jax; procgen "
            "plays stock hard or easy")
    if env_backend == "procgen":
        require_procgen("--env-backend procgen")

TRAIN_TASKS = np.eye(TASK_DIM, dtype=np.float32)
TEST_TASKS = np.array(
    [[1, 0, 1, 1], [1, 0, 0, 1], [1, 1, 1, 1], [1, -1, -1, -1], [1, 0, -1, -1], [1, 0, 0, -1]], dtype=np.float32)

# Entity types in fruitbot.cpp, and the stock game's rewards.
BARRIER, PLAYER_BULLET, FOOD, FRUIT, LOCKED_DOOR, LOCK, PRESENT = 1, 3, 4, 7, 10, 11, 12
INERT = 40  # a type no rule of the game mentions: the entity is drawn but neither blocks nor pays
FRUIT_REWARD, FOOD_REWARD, PRESENT_REWARD = 1.0, -4.0, 10.0
NUM_THEMES = 6
NUM_TYPES = 2 * NUM_THEMES  # fruit themes 0-5, then food themes 0-5
TYPE_CATEGORY = np.repeat(np.arange(TASK_DIM), NUM_TYPES // TASK_DIM)  # type index -> category
TYPE_STOCK_REWARD = np.array([FRUIT_REWARD] * NUM_THEMES + [FOOD_REWARD] * NUM_THEMES)


class CumulantError(RuntimeError):
    """The cumulants read from the game state do not explain the game's reward (a broken invariant, not a setting)."""


# ---------------------------------------------------------------------------------------------------------------------
# The serialized state (procgen's Game::serialize, BasicAbstractGame::serialize): the fields this module reads
# ---------------------------------------------------------------------------------------------------------------------
ENTITY_FIELDS = 31  # 4-byte fields per entity
ENTITY_TYPE, ENTITY_THEME = 6, 8  # field indices of `type` and `image_theme`
STEP_FIELDS = 15  # reward, done, level_complete, action, timeout, ..., cur_time, is_waiting_for_step
TIMEOUT_FIELD, CUR_TIME_FIELD = 4, 13


class StateLayout:
    """Byte offsets into one serialized state: where the step fields and the entity table start.

    The two RNG states ahead of them are variable-length text, so the offsets are found by walking the header."""

    def __init__(self, state: bytes):
        offset = 4  # version
        offset += 4 + struct.unpack_from("<i", state, offset)[0]  # game name
        offset += 17 * 4  # the options and level-seed ints
        for _ in range(2):  # level_seed_rand_gen, rand_gen: is_seeded, then an mt19937 text string
            offset += 4
            offset += 4 + struct.unpack_from("<i", state, offset)[0]
        self.step_fields = offset
        offset += STEP_FIELDS * 4 + 4  # + grid_size
        self.num_entities = struct.unpack_from("<i", state, offset)[0]
        self.entities = offset + 4

    def entity_table(self, state: bytes) -> np.ndarray:
        """int32 [n, 31]: every entity's fields (float fields as their bit patterns)."""
        return np.frombuffer(state, "<i4", self.num_entities * ENTITY_FIELDS, self.entities).reshape(-1, ENTITY_FIELDS)

    def step_field(self, state: bytes, index: int) -> int:
        return struct.unpack_from("<i", state, self.step_fields + 4 * index)[0]


def type_counts(state: bytes) -> np.ndarray:
    """int64 [12]: how many objects of each type (fruit themes 0-5, food themes 0-5) the level still holds."""
    table = StateLayout(state).entity_table(state)
    kind, theme = table[:, ENTITY_TYPE], table[:, ENTITY_THEME]
    objects = (kind == FRUIT) | (kind == FOOD)
    return np.bincount(theme[objects] + NUM_THEMES * (kind[objects] == FOOD), minlength=NUM_TYPES)


def neutralised(state: bytes) -> bytes:
    """The state with barriers, locked doors and presents made inert and the level timeout lifted, so that
    replaying the step that ended a level runs the same motion and collisions without ending anything."""
    layout = StateLayout(state)
    out = bytearray(state)
    table = np.frombuffer(out, "<i4", layout.num_entities * ENTITY_FIELDS, layout.entities).reshape(-1, ENTITY_FIELDS)
    kind = table[:, ENTITY_TYPE]
    kind[np.isin(kind, (BARRIER, LOCKED_DOOR, PRESENT))] = INERT
    struct.pack_into("<i", out, layout.step_fields + 4 * TIMEOUT_FIELD, 1 << 30)
    return bytes(out)


def category_cumulants(collected: np.ndarray) -> np.ndarray:
    """phi [..., 4] from per-type counts collected [..., 12]."""
    return (collected @ np.eye(TASK_DIM, dtype=np.int64)[TYPE_CATEGORY]).astype(np.float32)


# ---------------------------------------------------------------------------------------------------------------------
# The environment
# ---------------------------------------------------------------------------------------------------------------------
class Fruitbot:
    """N Fruitbot lifetimes stepped together (procgen's own vectorisation), with exact per-category cumulants.

    reset() -> obs; step(actions) -> (obs, reward, terminated, truncated, info). obs = {"image": uint8 [N, 64, 64, 3],
    "w": float32 [N, 4]}; reward = w . phi; info: phi [N, 4] (objects of each category collected on the step),
    stock_reward (the game's own reward), level_complete, levels (completed in the episode so far, counting this
    step), died, timed_out, and with final_view=True final_image (the view the step led to where it ended a level;
    zeros without: rendering it takes a replay at every level end)."""

    def __init__(self, num_envs: int, tasks=TRAIN_TASKS, *, seed: int = 0, num_levels: int = TRAIN_LEVELS,
                 start_level: int = 0, distribution_mode: str = "hard", max_levels: int = MAX_LEVELS,
                 num_threads: int = 2, cache_every: int | None = None, task_of_env=None, final_view: bool = False):
        tasks = np.asarray(tasks, np.float32)
        require(num_envs > 0, f"num_envs must be positive, got {num_envs}")
        require(tasks.ndim == 2 and tasks.shape[1] == TASK_DIM and len(tasks) > 0,
                f"Fruitbot tasks must be an [n, {TASK_DIM}] array (one weight per category), got shape {tasks.shape}")
        require(distribution_mode in DISTRIBUTION_MODES,
                f"distribution_mode must be one of {DISTRIBUTION_MODES}, got {distribution_mode!r}")
        require(max_levels > 0, f"max_levels must be positive, got {max_levels}")
        require(cache_every is None or cache_every > 0, f"cache_every must be positive, got {cache_every}")
        require(num_levels >= 0, f"num_levels must be non-negative (0: unrestricted), got {num_levels}")
        self.num_envs, self.tasks, self.max_levels = num_envs, tasks, max_levels
        self.distribution_mode, self.final_view = distribution_mode, final_view
        # replays run from the last state read: read one at least every cache_every steps to keep them short (they
        # run at every level end when the final view is asked for, otherwise about once in 200 level ends)
        self.cache_every = cache_every or (8 if final_view else 256)
        # procgen's games run in its own Python environment (common/envs/procgen_env.py: it needs numpy < 2)
        options = dict(env_name="fruitbot", distribution_mode=distribution_mode, num_levels=num_levels,
                       start_level=start_level, num_threads=num_threads)
        self.game = ProcgenEnv(num=num_envs, rand_seed=seed, **options)
        self.scratch = ProcgenEnv(num=1, rand_seed=seed, **options)  # replays the steps that end a level
        self.rng = np.random.default_rng(seed)
        # evaluation pins a task to each env (task_of_env[i] indexes tasks); training draws one per episode
        self.task_of_env = None if task_of_env is None else np.asarray(task_of_env)
        require(self.task_of_env is None or self.task_of_env.shape == (num_envs,),
                f"task_of_env must name one task per env ({num_envs}), got shape {np.shape(task_of_env)}")
        self.stats = {"steps": 0, "state_reads": 0, "replays": 0}
        self.no_final_image = np.zeros((num_envs,) + IMAGE_SHAPE, np.uint8)  # info["final_image"] without final_view
        self.no_final_image.flags.writeable = False

    # -- serialized state ---------------------------------------------------------------------------------------------
    def get_state(self, env: ProcgenEnv, i: int) -> bytes:
        self.stats["state_reads"] += 1
        return env.get_state(i)

    def _cache(self, i: int):
        """Remember env i's state now: the counts to diff against, and where its log of actions since restarts."""
        state = self.get_state(self.game, i)
        self.state[i], self.counts[i], self.since[i] = state, type_counts(state), 0
        layout = StateLayout(state)
        # the step count at which this level times out, counted from now
        self.steps_left[i] = layout.step_field(state, TIMEOUT_FIELD) - layout.step_field(state, CUR_TIME_FIELD)

    def _replay(self, i: int, action: int):
        """Env i's per-type counts and frame right after `action` ended its level, replayed from its cached state."""
        self.stats["replays"] += 1
        state = neutralised(self.state[i])
        self.scratch.set_state(0, state)
        for a in [*self.log[i, : self.since[i]], action]:
            self.scratch.act(np.array([a], np.int32))
        after = self.get_state(self.scratch, 0)
        return type_counts(after), self.scratch.observe()[1]["rgb"][0]

    # -- gym-like interface -------------------------------------------------------------------------------------------
    def _draw_tasks(self, envs):
        """Tasks for the episodes starting in `envs` (an index array)."""
        if self.task_of_env is not None:
            return self.tasks[self.task_of_env[envs]]
        return self.tasks[self.rng.integers(len(self.tasks), size=len(envs))]

    def _observation(self):
        return {"image": self.game.observe()[1]["rgb"], "w": self.w.copy()}

    def reset(self):
        n = self.num_envs
        self.state, self.counts = [None] * n, np.zeros((n, NUM_TYPES), np.int64)
        self.log = np.zeros((n, self.cache_every), np.int32)  # env i's actions since its cached state: log[i, :since[i]]
        self.since, self.steps_left = np.zeros(n, np.int64), np.zeros(n, np.int64)
        self.game.act(np.full(n, -1, np.int32))  # action -1 makes procgen start every env on a fresh level
        for i in range(n):
            self._cache(i)
        self.w = self._draw_tasks(np.arange(n))
        self.levels = np.zeros(n, np.int32)
        return self._observation()

    def step(self, actions):
        actions = np.asarray(actions, np.int32)
        require(actions.shape == (self.num_envs,), f"actions must have shape ({self.num_envs},), got {actions.shape}")
        n = self.num_envs
        self.game.act(actions)
        stock_reward, ob, first = self.game.observe()
        complete = np.zeros(n, bool)
        if first.any():
            complete = np.array([info["prev_level_complete"] for info in self.game.get_info()], bool) & first
        collected = np.zeros((n, NUM_TYPES), np.int64)
        final_image = np.zeros((n,) + IMAGE_SHAPE, np.uint8) if self.final_view else self.no_final_image
        timed_out = np.zeros(n, bool)
        read = first | (stock_reward != 0)
        quiet = np.flatnonzero(~read)  # nothing happened: log the action for a possible replay
        self.log[quiet, self.since[quiet]] = actions[quiet]
        self.since[quiet] += 1
        for i in np.flatnonzero(read).tolist():
            reward_i = float(stock_reward[i])
            if first[i]:  # the level ended, and procgen has already reset it
                timed_out[i] = not complete[i] and self.since[i] + 1 >= self.steps_left[i]
                bonus = (PRESENT_REWARD, 2 * PRESENT_REWARD) if complete[i] else (0.0,)
                # nothing collected explains the reward exactly (but for 4 fruit and a food on one step, never seen):
                # replay the step from the cached state only where something was, or to render the final view
                if self.final_view or reward_i not in bonus:
                    counts, image = self._replay(i, int(actions[i]))
                    collected[i] = self.counts[i] - counts
                    if self.final_view:
                        final_image[i] = image
            else:
                before = self.counts[i].copy()
                self._cache(i)
                collected[i] = before - self.counts[i]
                bonus = (0.0,)
            explained = float(collected[i] @ TYPE_STOCK_REWARD)
            if (collected[i] < 0).any() or all(abs(reward_i - explained - b) > 1e-4 for b in bonus):
                raise CumulantError(f"Fruitbot cumulants do not explain env {i}'s reward {reward_i} (collected "
                                    f"{collected[i].tolist()}): the state layout or the replay is wrong for this "
                                    f"procgen build")
            if first[i]:
                self._cache(i)  # the next level's first state
        for i in np.flatnonzero(self.since >= self.cache_every):  # keeps the replays at level ends short
            self._cache(i)
        self.stats["steps"] += n

        phi = category_cumulants(collected)
        reward = (phi * self.w).sum(1)
        levels = self.levels + complete
        terminated = (first & ~complete & ~timed_out) | (complete & (levels >= self.max_levels))
        truncated = timed_out
        done = terminated | truncated
        info = {"phi": phi, "stock_reward": stock_reward.astype(np.float32), "level_complete": complete,
                "levels": levels, "died": first & ~complete & ~timed_out, "timed_out": timed_out,
                "final_image": final_image, "w": self.w}
        self.levels = np.where(done, 0, levels)
        if done.any():  # a new array: the one just returned in info stays as it was
            self.w = self.w.copy()
            self.w[done] = self._draw_tasks(np.flatnonzero(done))
        return {"image": ob["rgb"], "w": self.w}, reward, terminated, truncated, info

    def close(self):
        """Free the procgen games (the game and the scratch env)."""
        self.game.close()
        self.scratch.close()


def step_in_jit(envs: list, seed_index, action):
    """Step one seed's procgen envs from inside a jitted program (common.envs.host.step_in_jit): frames uint8
    [E, 64, 64, 3], w, reward, terminated, truncated, and phi [E, C] (the objects of each category collected)."""
    from common.envs.host import step_in_jit as step

    return step(envs, seed_index, action, ("image", IMAGE_SHAPE, np.uint8), ("phi", (TASK_DIM,), np.float32),
                TASK_DIM)


# ---------------------------------------------------------------------------------------------------------------------
# A scripted reference policy that reads the game state: it completes levels, it does not choose objects
# ---------------------------------------------------------------------------------------------------------------------
LEFT, STRAIGHT, RIGHT = 0, 3, 6  # actions 0-8 steer by (a // 3) - 1; every step also moves up
WORLD_WIDTH = {"hard": 20.0, "easy": 10.0}


def gap_seeking_action(state: bytes, width: float = WORLD_WIDTH["hard"]) -> int:
    """Steer towards the nearest gap in the next barrier row; where a locked door closes the row, line up under
    its lock and fire. Task-agnostic: it collects whatever lies on its way (the tests' and the reference table's
    level-completing policy)."""
    table = StateLayout(state).entity_table(state)
    x, y, rx, ry = (table[:, j].view(np.float32) for j in (0, 1, 4, 5))
    kind = table[:, ENTITY_TYPE]
    player = np.flatnonzero(kind == 0)[0]
    px, py = x[player], y[player]
    walls = np.isin(kind, (BARRIER, LOCKED_DOOR)) & (y + ry + ry[player] > py)  # rows not yet passed
    if not walls.any():
        return STRAIGHT
    row = walls & (y == y[walls].min())
    margin = rx[player] + 0.15
    blocked = sorted(zip(x[row] - rx[row] - margin, x[row] + rx[row] + margin))
    gaps, left = [], 0.0 + margin
    for lo, hi in blocked:
        if lo > left:
            gaps.append((left, lo))
        left = max(left, hi)
    if width - margin > left:
        gaps.append((left, width - margin))
    if gaps:
        target = min((np.clip(px, lo, hi) for lo, hi in gaps), key=lambda t: abs(t - px))
    else:  # a locked door: shoot its lock from below
        locks = (kind == LOCK) & (y > py)
        if not locks.any():
            return STRAIGHT
        target = x[locks][np.argmin(y[locks])]
        if abs(target - px) < 0.2:
            return FIRE
    if abs(target - px) < 0.1:
        return STRAIGHT
    return RIGHT if target > px else LEFT


def scripted_actions(env: Fruitbot, rng: np.random.Generator, epsilon: float = 0.0) -> np.ndarray:
    """The gap-seeking action of every env of `env` (reading each game's state), random with probability epsilon."""
    width = WORLD_WIDTH[env.distribution_mode]
    actions = np.array([gap_seeking_action(env.get_state(env.game, i), width) for i in range(env.num_envs)])
    random = rng.random(env.num_envs) < epsilon
    return np.where(random, rng.integers(0, NUM_ACTIONS, env.num_envs), actions).astype(np.int32)


# ---------------------------------------------------------------------------------------------------------------------
# Reference returns: what random play and the scripted gap-seeker get on each task (README table)
# ---------------------------------------------------------------------------------------------------------------------
def policy_returns(policy: str, tasks=TEST_TASKS, num_episodes: int = 20, seed: int = 0,
                   distribution_mode: str = "hard", num_levels: int = 0):
    """Mean and standard error of the lifetime return of "random" or "scripted" (gap-seeking, epsilon 0) play on
    each task, on unrestricted levels (num_levels 0, as evaluation) or on levels 0..num_levels-1 (TRAIN_LEVELS: the
    levels training plays). Also returns the mean number of levels completed."""
    require(policy in ("random", "scripted"), f"policy must be random or scripted, got {policy!r}")
    require(num_episodes >= 2, f"num_episodes must be at least 2 to give a standard error, got {num_episodes}")
    tasks = np.asarray(tasks, np.float32)
    n = len(tasks) * num_episodes
    env = Fruitbot(n, tasks, seed=seed, num_levels=num_levels, distribution_mode=distribution_mode,
                   task_of_env=np.repeat(np.arange(len(tasks)), num_episodes))
    rng = np.random.default_rng(seed)
    env.reset()
    returns, levels, running = np.zeros(n), np.zeros(n), np.ones(n, bool)
    while running.any():
        actions = (scripted_actions(env, rng) if policy == "scripted" else rng.integers(0, NUM_ACTIONS, n))
        _, reward, terminated, truncated, info = env.step(actions)
        returns += np.where(running, reward, 0.0)
        levels = np.where(running, info["levels"], levels)
        running &= ~(terminated | truncated)
    env.close()
    returns = returns.reshape(len(tasks), num_episodes)
    return returns.mean(1), returns.std(1, ddof=1) / np.sqrt(num_episodes), levels.mean()


POLICY_NAMES = {"random": "random", "scripted": "scripted gap-seeker"}


def _print_reference_table(episodes: int = 20, seed: int = 0, policies=("random", "scripted"),
                           splits=("train", "test"), num_levels: int = 0) -> None:
    """A markdown table of random and/or scripted play's lifetime return on the train and/or test tasks, with each
    split's mean over its tasks."""
    split_tasks = {"train": TRAIN_TASKS, "test": TEST_TASKS}
    results = {split: [policy_returns(p, split_tasks[split], episodes, seed, num_levels=num_levels) for p in policies]
               for split in splits}  # played first: bad input stops before any output
    level_set = "unrestricted levels" if num_levels == 0 else f"levels 0-{num_levels - 1}"
    print(f"| split | task | {' | '.join(POLICY_NAMES[p] for p in policies)} |  ({episodes} lifetimes of up to "
          f"{MAX_LEVELS} levels, hard, {level_set}, seed {seed})")
    print("|---|---|" + "---:|" * len(policies))
    for split in splits:
        for i, w in enumerate(split_tasks[split]):
            cells = " | ".join(f"{mean[i]:.3f} ± {se[i]:.3f}" for mean, se, _ in results[split])
            print(f"| {split} | {format_task(w)} | {cells} |")
        # the mean over the split's tasks and its s.e. (the tasks' lifetimes are independent)
        overall = " | ".join(f"{mean.mean():.3f} ± {np.sqrt((se ** 2).sum()) / len(se):.3f}"
                             for mean, se, _ in results[split])
        print(f"| {split} | mean | {overall} |")
    for split in splits:
        levels = ", ".join(f"{p} {lv:.2f}" for p, (_, _, lv) in zip(policies, results[split]))
        print(f"levels completed per lifetime ({split}): {levels}")


if __name__ == "__main__":
    import argparse

    parser = argparse.ArgumentParser(description="reference returns of random and scripted play on every task")
    parser.add_argument("--episodes", type=int, default=20)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--policies", choices=("random", "scripted", "both"), default="both")
    parser.add_argument("--split", choices=("train", "test", "both"), default="both")
    parser.add_argument("--num-levels", type=int, default=0,
                        help=f"0: unrestricted levels (as evaluation); {TRAIN_LEVELS}: the levels training plays")
    cli = parser.parse_args()
    exit_on_config_error(_print_reference_table)(cli.episodes, cli.seed,
                                                 ("random", "scripted") if cli.policies == "both" else (cli.policies,),
                                                 ("train", "test") if cli.split == "both" else (cli.split,),
                                                 cli.num_levels)
