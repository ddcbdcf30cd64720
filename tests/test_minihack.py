"""MiniHack rooms (common/envs/minihack.py): the paper's observation drawn from tile indices, the end of an episode
(success, death, time limit), levels, and bad input."""

import cv2
import gymnasium as gym
import jax
import jax.numpy as jnp
import minihack  # noqa: F401  (registers the MiniHack-* gymnasium ids)
import numpy as np
import pytest

from common.envs.minihack import (CROP, NUM_ACTIONS, TEST_TASKS, TIME_LIMIT, TRAIN_TASKS, MiniHackRooms, ParallelRooms,
                             make_rooms, render, tile_set)
from common.run import ConfigError

ALL_TASKS = np.concatenate([TRAIN_TASKS, TEST_TASKS])
STAIRS_DOWN_GLYPH = 2383  # NLE's cmap glyph S_dnstair ('>'), the rooms' goal
# compass actions in MiniHack's order (N, E, S, W, NE, SE, SW, NW) as (row, column) moves
MOVES = [(-1, 0), (0, 1), (1, 0), (0, -1), (-1, 1), (1, 1), (1, -1), (-1, -1)]
render_batch = jax.jit(jax.vmap(render, in_axes=(0, None)))


def paper_observations(room: str, steps: int, seed: int):
    """(tile crops, the paper's images) along random play in one room: NLE's own pixel_crop, resized by cv2."""
    images, glyph_to_tile = tile_set()
    env = gym.make(f"MiniHack-Room-{room}-v0", observation_keys=("pixel_crop", "glyphs_crop"), penalty_step=0.0)
    rng = np.random.default_rng(seed)
    obs, _ = env.reset(seed=seed)
    crops, expected = [], []
    for _ in range(steps):
        crops.append(glyph_to_tile[obs["glyphs_crop"]])
        expected.append(cv2.resize(obs["pixel_crop"], (64, 64), interpolation=cv2.INTER_LINEAR))
        obs, _, done, _, _ = env.step(int(rng.integers(NUM_ACTIONS)))
        if done:
            obs, _ = env.reset()
    env.close()
    return np.stack(crops), np.stack(expected)


def test_render_is_the_resized_pixel_crop_bit_for_bit():
    """1,200 real states of every room (lit and dark, monsters, traps, both sizes) against cv2 itself."""
    images = jnp.asarray(tile_set()[0])
    rooms = ["Monster-5x5", "Trap-5x5", "Dark-5x5", "Ultimate-5x5", "Monster-15x15", "Ultimate-15x15"]
    seen = set()
    for k, room in enumerate(rooms):
        crops, expected = paper_observations(room, 200, seed=k)
        seen |= set(np.unique(crops).tolist())
        out = np.asarray(render_batch(jnp.asarray(crops), images))
        assert out.shape == expected.shape == (200, 64, 64, 3) and out.dtype == np.uint8
        assert np.array_equal(out, expected), f"{room}: {np.sum(out != expected)} values differ"
    assert len(seen) >= 8  # floor, stone, dark floor, agent, stairs, monsters, traps: many different tiles were drawn
    # a crop shifted by one tile is a different image: the check above would see a misplaced tile
    shifted = np.asarray(render_batch(jnp.asarray(np.roll(crops, 1, axis=2)), images))
    assert not np.array_equal(shifted, expected)


def test_render_follows_opencv_rounding_on_arbitrary_pixels():
    """Every 16-px tile pattern, not only MiniHack's: random tile images, resized by cv2 and by render."""
    rng = np.random.default_rng(0)
    images = rng.integers(0, 256, (81, 16, 16, 3), dtype=np.uint8)
    crops = np.stack([rng.permutation(81).reshape(CROP, CROP) for _ in range(20)])
    out = np.asarray(render_batch(jnp.asarray(crops), jnp.asarray(images)))
    for crop, image in zip(crops, out):
        big = images[crop].transpose(0, 2, 1, 3, 4).reshape(144, 144, 3)
        assert np.array_equal(image, cv2.resize(big, (64, 64), interpolation=cv2.INTER_LINEAR))


def stairs_move(tiles: np.ndarray, stairs_tile: int):
    """The compass action that steps towards the stairs in a crop (the agent is at its centre), or None."""
    found = np.argwhere(tiles == stairs_tile)
    if len(found) == 0:
        return None
    dy, dx = np.sign(found[0] - CROP // 2)
    return MOVES.index((int(dy), int(dx)))


def test_walking_into_the_stairs_is_a_success_with_reward_one_and_a_termination():
    stairs_tile = tile_set()[1][STAIRS_DOWN_GLYPH]
    env = MiniHackRooms(4, [[0, 1, 0]], seed=1)  # Room-Trap: lit, stairs visible from anywhere in the 5x5 room
    obs = env.reset()
    rng = np.random.default_rng(0)
    successes = 0
    for _ in range(300):
        actions = np.array([stairs_move(t, stairs_tile) for t in obs["tiles"]], dtype=object)
        actions = np.where(actions == None, rng.integers(0, NUM_ACTIONS, 4), actions).astype(np.int64)  # noqa: E711
        obs, reward, terminated, truncated, info = env.step(actions)
        assert np.array_equal(reward, info["success"].astype(np.float32))
        assert np.all(terminated == (info["success"] | info["died"])) and np.all(truncated == info["timed_out"])
        assert not np.any(info["died"])  # no monster in the trap room
        successes += info["success"].sum()
    assert successes >= 20


def test_the_time_limit_is_a_truncation_at_exactly_the_limit_and_the_next_episode_starts_afresh():
    """Always walking north in the dark room bumps the stone edge until the 100-step limit (unless the stairs lie
    on the way): those episodes end truncated at exactly 100 steps with reward 0, and the next one starts afresh."""
    env = MiniHackRooms(6, [[0, 0, 1]], seed=2)
    env.reset()
    length, limits = np.zeros(6, int), 0
    for _ in range(3 * TIME_LIMIT["5x5"]):
        obs, reward, terminated, truncated, info = env.step(np.zeros(6, np.int64))
        length += 1
        for i in np.flatnonzero(truncated):
            assert length[i] == TIME_LIMIT["5x5"] and reward[i] == 0 and not terminated[i]
            assert info["timed_out"][i] and not info["success"][i] and not info["died"][i]
            limits += 1
        for i in np.flatnonzero(terminated):
            assert info["success"][i] and reward[i] == 1.0 and length[i] < TIME_LIMIT["5x5"]
        length[terminated | truncated] = 0
    assert limits >= 6


def test_a_death_is_a_termination_with_reward_zero():
    env = MiniHackRooms(16, [[1, 0, 0]], size="15x15", seed=3)  # three monsters: random play dies in ~20% of episodes
    env.reset()
    rng = np.random.default_rng(3)
    deaths = 0
    for _ in range(400):
        _, reward, terminated, truncated, info = env.step(rng.integers(0, NUM_ACTIONS, 16))
        died = info["died"]
        assert np.all(terminated[died]) and not np.any(truncated[died]) and np.all(reward[died] == 0)
        deaths += died.sum()
        if deaths >= 3:
            break
    assert deaths >= 3


def test_training_levels_repeat_and_evaluation_levels_are_fresh():
    first = lambda env: [env._start(0).copy() for _ in range(12)]  # noqa: E731
    one_level = first(MiniHackRooms(1, [[0, 1, 0]], seed=0, num_levels=1))
    assert all(np.array_equal(one_level[0], c) for c in one_level)
    fresh = first(MiniHackRooms(1, [[0, 1, 0]], seed=0, num_levels=0))
    assert len({c.tobytes() for c in fresh}) > 6
    # the same seed gives the same levels; the task is drawn per episode from the given tasks
    env_a, env_b = MiniHackRooms(8, ALL_TASKS, seed=5), MiniHackRooms(8, ALL_TASKS, seed=5)
    a, b = env_a.reset(), env_b.reset()
    assert np.array_equal(a["tiles"], b["tiles"]) and np.array_equal(a["w"], b["w"])
    assert {tuple(w) for w in a["w"]} <= {tuple(w) for w in ALL_TASKS}


def test_evaluation_pins_a_task_to_each_env():
    env = MiniHackRooms(4, ALL_TASKS, seed=0, num_levels=0, task_of_env=np.arange(4))
    obs = env.reset()
    rng = np.random.default_rng(0)
    for _ in range(150):
        assert np.array_equal(obs["w"], ALL_TASKS)
        obs, *_ = env.step(rng.integers(0, NUM_ACTIONS, 4))


def test_worker_processes_play_the_same_episodes_as_one_process():
    """ParallelRooms splits the envs among worker processes; each env draws its rooms and levels from its own stream,
    so 7 envs in 3 workers (slices of 2, 2, 3) play exactly the episodes the same 7 envs play in this process: the
    same crops, rewards, ends and final views, through many resets (training levels, and fresh levels with pinned
    tasks as evaluation uses)."""
    for kwargs in (dict(seed=4), dict(seed=9, num_levels=0, task_of_env=np.arange(7) % 4)):
        one, split = make_rooms(7, ALL_TASKS, **kwargs), make_rooms(7, ALL_TASKS, workers=3, **kwargs)
        assert isinstance(one, MiniHackRooms) and isinstance(split, ParallelRooms)
        rng = np.random.default_rng(0)
        a, b = one.reset(), split.reset()
        ends = 0
        for t in range(120):
            assert all(np.array_equal(a[k], b[k]) for k in ("tiles", "w")), f"step {t}"
            actions = rng.integers(0, NUM_ACTIONS, 7)
            (a, *rest_a), (b, *rest_b) = one.step(actions), split.step(actions)
            for x, y in zip(rest_a[:3], rest_b[:3]):
                assert np.array_equal(x, y), f"step {t}"
            assert all(np.array_equal(rest_a[3][k], rest_b[3][k]) for k in rest_a[3]), f"step {t}"
            ends += int(np.sum(rest_a[1] | rest_a[2]))
        assert ends >= 7  # episodes ended and restarted in new rooms and levels
        one.close()
        split.close()
        split.close()  # safe twice


def test_worker_processes_refuse_bad_input_with_one_line():
    with pytest.raises(ConfigError, match="the env workers must be at least 1"):
        make_rooms(4, workers=0)
    with pytest.raises(ConfigError, match="room size"):  # checked here, before any worker starts
        make_rooms(4, size="10x10", workers=2)
    assert isinstance(make_rooms(1, workers=4), MiniHackRooms)  # one env: no worker to split among
    env = make_rooms(4, workers=2)
    env.reset()
    with pytest.raises(ConfigError, match="actions must be"):
        env.step(np.array([0, 1, 2, NUM_ACTIONS]))
    env.procs[1].kill()  # a worker that dies (killed, out of memory) stops the next step with one line
    env.procs[1].wait()
    with pytest.raises(RuntimeError, match=r"MiniHack worker process 1 \(exit status -9\) ended unexpectedly"):
        env.step(np.zeros(4, int))
    with pytest.raises(ConfigError, match="closed"):  # and the others were ended with it
        env.reset()


@pytest.mark.parametrize("make, message", [
    (lambda: MiniHackRooms(2, size="10x10"), "room size"),
    (lambda: MiniHackRooms(2, [[1, 0, 0, 0]]), "[n, 3]"),
    (lambda: MiniHackRooms(2, [[1, 1, 0]]), "names a room"),
    (lambda: MiniHackRooms(0), "num_envs"),
    (lambda: MiniHackRooms(2, task_of_env=[0, 5]), "task_of_env"),
])
def test_bad_input_stops_with_one_line(make, message):
    with pytest.raises(ConfigError) as caught:
        make()
    assert message in str(caught.value) and "\n" not in str(caught.value)


def test_bad_actions_stop_with_one_line():
    env = MiniHackRooms(2)
    env.reset()
    with pytest.raises(ConfigError, match="actions must be"):
        env.step(np.array([0, NUM_ACTIONS]))


def test_the_reference_table_plays_the_training_levels_when_asked_and_refuses_one_episode(capsys):
    """Random play's table on the small room's training levels: one row per room, with its success rate, s.e. and
    death rate, and the level set named; a refusal prints nothing before its one line."""
    from common.envs import minihack

    minihack._print_reference_table(episodes=4, seed=3, sizes=("5x5",), num_levels=None)
    lines = capsys.readouterr().out.splitlines()
    assert "5x5: levels 0-199" in lines[0]
    rows = [line.strip("| ").split(" | ") for line in lines[2:]]
    assert [r[1] for r in rows] == ["1,0,0", "0,1,0", "0,0,1", "1,1,1"] and all(r[2] == "5x5" for r in rows)
    for r in rows:
        rate, se = (float(x) for x in r[3].split(" ± "))
        assert 0 <= rate <= 1 and rate * 4 == round(rate * 4) and 0 <= float(r[4]) <= 1  # 4 episodes of 0/1
        assert se == pytest.approx(np.sqrt(rate * (1 - rate) * 4 / 3) / 2, abs=1e-3)  # std (ddof 1) / sqrt(4)
    with pytest.raises(ConfigError, match="num_episodes must be at least 2"):
        minihack._print_reference_table(episodes=1, sizes=("5x5",))
    assert capsys.readouterr().out == ""
