"""MiniHack rooms as a multitask environment: the paper's train and test rooms on the real NLE, with its observation.

Tasks are labels here, not reward weights: each task names a room, and the reward is the room's own (+1 on reaching
the stairs down, 0 on death or at the time limit, no step penalty). Train tasks: Room-Monster [1,0,0] (a monster),
Room-Trap [0,1,0] (teleportation traps), Room-Dark [0,0,1] (an unlit room); test task: Room-Ultimate [1,1,1] (all
three). The room size is 5x5 (1 monster, 1 trap, 100 steps) or 15x15 (3 monsters, 15 traps, 300 steps).

Observation. The paper's agent sees MiniHack's `pixel_crop` (the 9x9 tiles around the agent, 16 px each: 144x144x3)
resized to 64x64x3 by `cv2.resize(..., INTER_LINEAR)`. NLE renders that crop with a Python loop over tiles (about
half the env's speed), and a replay of 64x64x3 frames takes 12 KB per step. Here the env returns the crop as 81 tile
indices (int16, 162 bytes per step) and `render` draws the paper's image from them inside jitted code: it gathers
the tiles and resizes with OpenCV's own fixed-point arithmetic (11-bit coefficients; the vertical pass on values
shifted right by 4 with a high-half multiply, as OpenCV's vectorised code does), so the image is bit-identical to the
resized `pixel_crop` (tests check it on real states of every room against cv2 itself).

Episodes. The room is drawn uniformly from `tasks` at every episode start (or pinned per env for evaluation, with
`task_of_env`). Training levels come from a fixed set of level seeds (200 for 5x5, 1000 for 15x15. The original's
env.seed(randint(num_train_seeds)) seeded NLE's core RNG with the level seed and left the display RNG random; here
both get the level seed, so a level replays exactly); evaluation
levels are fresh (seeds drawn far outside the training set). Reaching the stairs and dying end an episode
(termination); the time limit, which NLE reports as end_status ABORTED, is a truncation. The envs auto-reset: the
observation returned with an ending step is the next episode's first, and info["final_tiles"] holds the crop the
ending step led to. Each env draws its rooms and levels from its own random stream, so `ParallelRooms` (the envs
split among worker processes, for machines with cores to spare; the scripts' --env-workers) plays the same episodes.
"""

from __future__ import annotations

import functools
import pickle
from importlib import resources

import jax.numpy as jnp
import numpy as np

from common.run import exit_on_config_error, format_task, require

# NLE and MiniHack are imported where an env or the tile set is made, not here: the module's constants and `render`
# need neither (usfa.py and uvfa.py import this module for every env, also on machines without NLE)

NUM_ACTIONS = 8  # MiniHack navigation's compass directions: N, E, S, W, NE, SE, SW, NW
TASK_DIM = 3
CROP = 9  # tiles on each side of the agent-centred crop
TILE_PX = 16  # pixels per tile side in MiniHack's tile set
IMAGE_SHAPE = (64, 64, 3)
ROOM_SIZES = ("5x5", "15x15")
TRAIN_LEVELS = {"5x5": 200, "15x15": 1000}  # level seeds 0..n-1 (the original's num_train_seeds)
TIME_LIMIT = {"5x5": 100, "15x15": 300}  # MiniHack's max_episode_steps = 20 * size
EVAL_SEED_OFFSET = 1 << 40  # evaluation level seeds are drawn above this: never a training level

ROOM_OF_TASK = {(1, 0, 0): "Monster", (0, 1, 0): "Trap", (0, 0, 1): "Dark", (1, 1, 1): "Ultimate"}
TRAIN_TASKS = np.eye(TASK_DIM, dtype=np.float32)
TEST_TASKS = np.array([[1, 1, 1]], dtype=np.float32)

# NLE's end_status values
RUNNING, DEATH, SUCCESS, ABORTED = 0, 1, 2, -1


def room_id(task, size: str) -> str:
    """The gymnasium id of the room a task names, e.g. MiniHack-Room-Trap-5x5-v0."""
    key = tuple(int(x) for x in np.asarray(task).round())
    require(key in ROOM_OF_TASK and np.allclose(task, key),
            f"a MiniHack task must be one of {[list(k) for k in ROOM_OF_TASK]} (it names a room), got {list(task)}")
    return f"MiniHack-Room-{ROOM_OF_TASK[key]}-{size}-v0"


# ---------------------------------------------------------------------------------------------------------------------
# The paper's observation, drawn from tile indices
# ---------------------------------------------------------------------------------------------------------------------
@functools.cache
def tile_set() -> tuple[np.ndarray, np.ndarray]:
    """MiniHack's tile images and glyph map: (images uint8 [num_tiles, 16, 16, 3], glyph_to_tile int16 [MAX_GLYPH])."""
    from minihack.tiles import glyph2tile
    from nle import nethack

    with resources.files("minihack").joinpath("tiles", "tiles.pkl").open("rb") as f:
        tiles = pickle.load(f)  # {tile index: [16, 16, 3] uint8}, written by MiniHack's own build
    images = np.stack([np.asarray(tiles[i], np.uint8) for i in range(len(tiles))])
    glyph_to_tile = np.asarray(glyph2tile, np.int16)
    require(glyph_to_tile.shape == (nethack.MAX_GLYPH,) and glyph_to_tile.max() < len(images),
            "MiniHack's glyph2tile does not match its tiles.pkl: reinstall minihack (requirements.txt's version)")
    return images, glyph_to_tile


def _resize_taps(src: int, dst: int):
    """OpenCV's INTER_LINEAR taps for one axis: source indices (lo, hi) and 11-bit fixed-point weights (w_lo, w_hi),
    computed in float32 as cv::resize does (half-pixel centres, cvRound of the weights)."""
    f = np.float32((np.arange(dst) + 0.5) * (src / dst) - 0.5)
    lo = np.floor(f).astype(np.int32)
    f = (f - lo).astype(np.float32)
    f = np.where(lo < 0, np.float32(0), f)
    lo = np.maximum(lo, 0)
    f = np.where(lo >= src - 1, np.float32(0), f)
    lo = np.minimum(lo, src - 1)
    w_hi = np.rint(f * np.float32(2048)).astype(np.int32)
    w_lo = np.rint((np.float32(1) - f) * np.float32(2048)).astype(np.int32)
    return lo, np.minimum(lo + 1, src - 1), w_lo, w_hi


_SIDE = CROP * TILE_PX
_ROWS = _resize_taps(_SIDE, IMAGE_SHAPE[0])
_COLS = _resize_taps(_SIDE, IMAGE_SHAPE[1])


def render(tiles, tile_images):
    """The paper's observation, uint8 [64, 64, 3], from a crop of tile indices [9, 9] (jit- and vmap-able).

    Equals cv2.resize(pixel_crop, (64, 64), interpolation=cv2.INTER_LINEAR) bit for bit: the horizontal pass keeps
    the exact sums (pixel x 2048 weights); the vertical pass multiplies (sum >> 4) by its weights keeping the high
    16 bits, adds 2 and shifts by 2, which is how OpenCV's vectorised linear resize rounds."""
    crop = tile_images[tiles].astype(jnp.int32)  # [9, 9, 16, 16, 3]
    image = crop.transpose(0, 2, 1, 3, 4).reshape(_SIDE, _SIDE, 3)
    x_lo, x_hi, wx_lo, wx_hi = _COLS
    rows = image[:, x_lo] * wx_lo[:, None] + image[:, x_hi] * wx_hi[:, None]  # [144, 64, 3], pixel x 2048
    y_lo, y_hi, wy_lo, wy_hi = _ROWS
    top = ((rows[y_lo] >> 4) * wy_lo[:, None, None]) >> 16
    bottom = ((rows[y_hi] >> 4) * wy_hi[:, None, None]) >> 16
    return jnp.clip((top + bottom + 2) >> 2, 0, 255).astype(jnp.uint8)


# ---------------------------------------------------------------------------------------------------------------------
# The environment
# ---------------------------------------------------------------------------------------------------------------------
def checked_actions(actions, num_envs: int) -> np.ndarray:
    """actions as an array, refused with one line unless they are num_envs compass directions."""
    actions = np.asarray(actions)
    require(actions.shape == (num_envs,) and np.all((0 <= actions) & (actions < NUM_ACTIONS)),
            f"actions must be {num_envs} integers in [0, {NUM_ACTIONS}), got {actions!r}")
    return actions


class MiniHackRooms:
    """N MiniHack room episodes stepped together on the host, the room (task) drawn per episode.

    reset() -> obs; step(actions) -> (obs, reward, terminated, truncated, info). obs = {"tiles": int16 [N, 9, 9]
    (tile indices of the agent-centred crop; `render` draws the image), "w": float32 [N, 3] (the task label)};
    reward: float32 [N], the room's own; info: success, died, timed_out (bool [N]), final_tiles (the crop the step led
    to, before any reset), w (the task of the step)."""

    def __init__(self, num_envs: int, tasks=TRAIN_TASKS, *, size: str = "5x5", seed: int = 0,
                 num_levels: int | None = None, task_of_env=None, first_env: int = 0):
        tasks = np.asarray(tasks, np.float32)
        require(num_envs > 0, f"num_envs must be positive, got {num_envs}")
        require(size in ROOM_SIZES, f"the MiniHack room size must be one of {ROOM_SIZES}, got {size!r}")
        require(tasks.ndim == 2 and tasks.shape[1] == TASK_DIM and len(tasks) > 0,
                f"MiniHack tasks must be an [n, {TASK_DIM}] array (one label per room), got shape {tasks.shape}")
        num_levels = TRAIN_LEVELS[size] if num_levels is None else num_levels
        require(num_levels >= 0, f"num_levels must be non-negative (0: fresh levels), got {num_levels}")
        self.num_envs, self.tasks, self.size, self.num_levels = num_envs, tasks, size, num_levels
        self.room_ids = [room_id(w, size) for w in tasks]
        self.task_of_env = None if task_of_env is None else np.asarray(task_of_env)
        require(self.task_of_env is None or (self.task_of_env.shape == (num_envs,)
                                             and 0 <= self.task_of_env.min() and self.task_of_env.max() < len(tasks)),
                f"task_of_env must give each of the {num_envs} envs a task index below {len(tasks)}")
        # each env draws its rooms and levels from its own stream (seed, index), so that splitting the envs among
        # worker processes (ParallelRooms; first_env: the index of this object's env 0) plays the same episodes
        self.rngs = [np.random.default_rng((seed, first_env + i)) for i in range(num_envs)]
        self.glyph_to_tile = tile_set()[1]
        self.envs = [{} for _ in range(num_envs)]  # env i's NLE instance of each room it has played, made on demand
        self.task = np.zeros(num_envs, np.int64)

    def _room(self, i: int, task: int):
        env = self.envs[i].get(task)
        if env is None:
            import gymnasium as gym
            import minihack  # noqa: F401  (registers the MiniHack-* gymnasium ids)

            made = gym.make(self.room_ids[task], observation_keys=("glyphs_crop",), penalty_step=0.0)
            env = self.envs[i][task] = made.unwrapped  # no gymnasium checkers on the hot path
        return env

    def _level_seed(self, rng) -> int:
        if self.num_levels:
            return int(rng.integers(self.num_levels))
        return EVAL_SEED_OFFSET + int(rng.integers(1 << 40))

    def _start(self, i: int) -> np.ndarray:
        """Start env i's next episode in a room drawn for it; returns its first crop as tile indices."""
        rng = self.rngs[i]
        self.task[i] = self.task_of_env[i] if self.task_of_env is not None else rng.integers(len(self.tasks))
        env = self._room(i, self.task[i])
        level = self._level_seed(rng)
        env.seed(level, level, reseed=False)
        obs, _ = env.reset()
        return self.glyph_to_tile[obs["glyphs_crop"]]

    def reset(self):
        self.tiles = np.stack([self._start(i) for i in range(self.num_envs)])
        return {"tiles": self.tiles.copy(), "w": self.tasks[self.task]}

    def step(self, actions):
        actions = checked_actions(actions, self.num_envs)
        n = self.num_envs
        w = self.tasks[self.task]
        reward = np.zeros(n, np.float32)
        status = np.zeros(n, np.int64)
        final_tiles = np.empty((n, CROP, CROP), np.int16)
        tiles = np.empty((n, CROP, CROP), np.int16)
        for i in range(n):
            env = self.envs[i][self.task[i]]
            obs, reward[i], done, _, info = env.step(int(actions[i]))
            final_tiles[i] = self.glyph_to_tile[obs["glyphs_crop"]]
            status[i] = info["end_status"]
            if done:
                require(status[i] in (DEATH, SUCCESS, ABORTED),
                        f"MiniHack ended an episode with end_status {status[i]}, which this env does not know")
                tiles[i] = self._start(i)
            else:
                tiles[i] = final_tiles[i]
        success, died, timed_out = status == SUCCESS, status == DEATH, status == ABORTED
        if not np.array_equal(reward, success.astype(np.float32)):
            raise RuntimeError(f"MiniHack paid {reward.tolist()} where the successes were {success.tolist()}: the "
                               f"rooms' reward is not the sparse +1 at the stairs this env assumes")
        info = {"success": success, "died": died, "timed_out": timed_out, "final_tiles": final_tiles, "w": w}
        self.tiles = tiles
        return {"tiles": tiles, "w": self.tasks[self.task]}, reward, success | died, timed_out, info

    def close(self):
        for rooms in self.envs:
            for env in rooms.values():
                env.close()


def _serve_rooms() -> None:
    """A worker process of ParallelRooms: builds its slice of the envs from the first message on stdin, then answers
    each command (reset, step with actions, close) with one pickled reply on stdout, until close or until its parent
    is gone (stdin ends). Ctrl-C is the parent's to handle (it checkpoints at the next chunk, and needs the envs until
    then), so the worker ignores SIGINT."""
    import os
    import signal
    import sys
    import warnings

    signal.signal(signal.SIGINT, signal.SIG_IGN)
    warnings.filterwarnings("ignore", message="pkg_resources is deprecated")  # printed once by the parent already
    inbox, outbox = sys.stdin.buffer, os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)  # anything NLE or MiniHack prints goes to stderr, not into the replies
    env = MiniHackRooms(**pickle.load(inbox))
    while True:
        try:
            command, data = pickle.load(inbox)
        except EOFError:  # the parent exited without close(): close the NLE envs (they remove their temp folders)
            env.close()
            return
        try:
            reply = ("ok", env.reset() if command == "reset" else env.step(data) if command == "step" else env.close())
        except Exception as error:  # noqa: BLE001  (handed to the parent, which raises it)
            reply = ("error", error)
        pickle.dump(reply, outbox, protocol=pickle.HIGHEST_PROTOCOL)
        outbox.flush()
        if command == "close" or reply[0] == "error":
            return


class ParallelRooms:
    """MiniHackRooms with its envs split among worker processes that step in parallel: the same interface and the same
    episodes (each env has its own random stream), for machines with cores to spare. Under the seed vmap a training
    script steps its seeds' envs one seed at a time (io_callback), so one process steps every env of every seed; with
    workers, a seed's envs step on several cores at once. Each worker is a fresh Python (`python -c`, not a fork of
    this process, which runs JAX's threads, nor multiprocessing's spawn, which would import the training script again)
    talking pickles over its stdin and stdout."""

    def __init__(self, num_envs: int, tasks=TRAIN_TASKS, *, workers: int, **kwargs):
        import os
        import subprocess
        import sys
        from pathlib import Path

        require(workers >= 2, f"ParallelRooms needs at least 2 workers (1: use MiniHackRooms), got {workers}")
        require(num_envs >= workers, f"ParallelRooms needs at least one env per worker: {num_envs} envs, {workers} "
                                     f"workers")
        task_of_env = kwargs.pop("task_of_env", None)
        MiniHackRooms(num_envs, tasks, task_of_env=task_of_env, **kwargs)  # bad settings: one line, here
        self.num_envs, self.tasks = num_envs, np.asarray(tasks, np.float32)
        bounds = np.linspace(0, num_envs, workers + 1).astype(int)
        self.slices = [slice(a, b) for a, b in zip(bounds[:-1], bounds[1:])]
        root = str(Path(__file__).resolve().parents[2])  # the repository (common/envs/minihack.py)
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")])))
        self.procs = []
        for part in self.slices:
            proc = subprocess.Popen([sys.executable, "-c", "from common.envs.minihack import _serve_rooms; _serve_rooms()"],
                                    stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env, cwd=root)
            pickle.dump(dict(kwargs, num_envs=part.stop - part.start, tasks=self.tasks, first_env=part.start,
                             task_of_env=None if task_of_env is None else np.asarray(task_of_env)[part]),
                        proc.stdin, protocol=pickle.HIGHEST_PROTOCOL)
            self.procs.append(proc)

    def _all(self, command: str, data=None):
        require(self.procs, "these MiniHack rooms were closed")
        try:
            for proc, part in zip(self.procs, self.slices):
                pickle.dump((command, None if data is None else data[part]), proc.stdin,
                            protocol=pickle.HIGHEST_PROTOCOL)
                proc.stdin.flush()
            replies = [pickle.load(proc.stdout) for proc in self.procs]
        except (BrokenPipeError, EOFError):
            gone = [f"{i} (exit status {proc.poll()})" for i, proc in enumerate(self.procs) if proc.poll() is not None]
            self.close()
            raise RuntimeError(f"MiniHack worker process {', '.join(gone) or '?'} ended unexpectedly; its error, if "
                               f"any, is on stderr above") from None
        for status, reply in replies:
            if status == "error":
                self.close()
                raise reply
        return [reply for _, reply in replies]

    @staticmethod
    def _join(parts):
        """Concatenate the workers' replies along the env axis (arrays, dicts of arrays, tuples of those)."""
        first = parts[0]
        if isinstance(first, dict):
            return {k: ParallelRooms._join([p[k] for p in parts]) for k in first}
        if isinstance(first, tuple):
            return tuple(ParallelRooms._join(list(x)) for x in zip(*parts))
        return np.concatenate(parts)

    def reset(self):
        return self._join(self._all("reset"))

    def step(self, actions):
        actions = checked_actions(actions, self.num_envs)
        return self._join(self._all("step", actions))

    def close(self):
        """Ends the workers (those already gone are skipped); safe to call twice."""
        procs, self.procs = self.procs, []
        for proc in procs:
            if proc.poll() is None:
                try:
                    pickle.dump(("close", None), proc.stdin)
                    proc.stdin.close()
                except (BrokenPipeError, OSError):
                    pass
        for proc in procs:
            try:
                proc.wait(timeout=30)
            except Exception:  # noqa: BLE001
                proc.kill()


def step_in_jit(envs: list, seed_index, action):
    """Step one seed's MiniHack rooms from inside a jitted program (common.envs.host.step_in_jit): tiles int16
    [E, 9, 9] (the agent-centred crop), w, reward, terminated, truncated, and final_tiles [E, 9, 9] (the crop the
    step led to, before any reset)."""
    from common.envs.host import step_in_jit as step

    return step(envs, seed_index, action, ("tiles", (CROP, CROP), np.int16), ("final_tiles", (CROP, CROP), np.int16),
                TASK_DIM)


def make_rooms(num_envs: int, tasks=TRAIN_TASKS, *, workers: int = 1, **kwargs):
    """The rooms in this process (workers=1) or split among `workers` processes (ParallelRooms)."""
    require(workers >= 1, f"the env workers must be at least 1, got {workers}")
    workers = min(workers, num_envs)
    return MiniHackRooms(num_envs, tasks, **kwargs) if workers == 1 else ParallelRooms(num_envs, tasks,
                                                                                       workers=workers, **kwargs)


# ---------------------------------------------------------------------------------------------------------------------
# Reference: what random play gets in each room (README table)
# ---------------------------------------------------------------------------------------------------------------------
def random_returns(tasks=np.concatenate([TRAIN_TASKS, TEST_TASKS]), num_episodes: int = 200, size: str = "5x5",
                   seed: int = 0, num_levels: int = 0):
    """Success rate (= mean return: the reward is 1 at the stairs, else 0), its standard error, and the death rate
    of uniformly random play in each room: on fresh levels (num_levels 0, as evaluation) or on the level seeds
    0..num_levels-1 (the room size's training levels: what the training actors play)."""
    require(num_episodes >= 2, f"num_episodes must be at least 2 to give a standard error, got {num_episodes}")
    tasks = np.asarray(tasks, np.float32)
    n = len(tasks) * num_episodes
    env = MiniHackRooms(n, tasks, size=size, seed=seed, num_levels=num_levels,
                        task_of_env=np.repeat(np.arange(len(tasks)), num_episodes))
    rng = np.random.default_rng(seed)
    env.reset()
    success, died, running = np.zeros(n), np.zeros(n), np.ones(n, bool)
    while running.any():
        _, reward, terminated, truncated, info = env.step(rng.integers(0, NUM_ACTIONS, n))
        success += np.where(running, reward, 0.0)
        died += running & info["died"]
        running &= ~(terminated | truncated)
    env.close()
    success, died = success.reshape(len(tasks), -1), died.reshape(len(tasks), -1)
    return success.mean(1), success.std(1, ddof=1) / np.sqrt(num_episodes), died.mean(1)


def _print_reference_table(episodes: int = 200, seed: int = 0, sizes=ROOM_SIZES, num_levels: int | None = 0) -> None:
    """A markdown table of random play's success and death rates in every room of the given sizes.

    num_levels: 0 fresh levels (as evaluation); None each size's training levels (TRAIN_LEVELS)."""
    tasks = np.concatenate([TRAIN_TASKS, TEST_TASKS])
    levels = {size: TRAIN_LEVELS[size] if num_levels is None else num_levels for size in sizes}
    level_sets = ", ".join(f"{size}: {'fresh levels' if n == 0 else f'levels 0-{n - 1}'}" for size, n in levels.items())
    results = {size: random_returns(tasks, episodes, size, seed, levels[size]) for size in sizes}  # bad input stops
    print(f"| room | task | size | random success rate | random death rate |  ({episodes} episodes; {level_sets}; "
          f"seed {seed})")
    print("|---|---|---|---:|---:|")
    for size, (rate, se, deaths) in results.items():
        for w, r, s, d in zip(tasks, rate, se, deaths):
            print(f"| {room_id(w, size)} | {format_task(w)} | {size} | {r:.3f} ± {s:.3f} | {d:.3f} |")


if __name__ == "__main__":
    import argparse

    parser = argparse.ArgumentParser(description="random play's success rate in every MiniHack room")
    parser.add_argument("--episodes", type=int, default=200)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--size", choices=(*ROOM_SIZES, "both"), default="both")
    parser.add_argument("--levels", choices=("fresh", "train"), default="fresh",
                        help=f"fresh: unrestricted level seeds (as evaluation); train: the training levels "
                             f"({', '.join(f'{k}: {v}' for k, v in TRAIN_LEVELS.items())}), as the training actors play")
    cli = parser.parse_args()
    exit_on_config_error(_print_reference_table)(cli.episodes, cli.seed,
                                                 ROOM_SIZES if cli.size == "both" else (cli.size,),
                                                 0 if cli.levels == "fresh" else None)
