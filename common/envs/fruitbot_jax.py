"""Procgen Fruitbot as a pure JAX environment: the game on the accelerator, proven against procgen.

Written from procgen's rules (openai/procgen `fruitbot.cpp`, `basic-abstract-game.cpp`, `game.cpp`, `entity.cpp`)
and, for the paper's setting, from the original MSFA code's per-task games (wcarvalho/msfa_iclr2023,
`envs/procgen/procgen/src/games/wilkabot*.cpp`); docs/fruitbot.md states every rule with its source.

The game. A level is `main_width` units wide and `main_height` tall. The agent (a 0.4-radius robot) starts at the
bottom at a random x and always thrusts up; actions 0-8 steer left / none / right (a // 3 - 1), actions 9-14 stand
the steering still and action 9 also fires a key (at most one every 8 steps, flying up 0.5 a step for 8 steps).
Velocity: v <- 0.9 (0.5 v + 0.5 * 0.85 * thrust), thrust = (steer, 0.2); the move runs in 4 sub-steps (y then x),
each blocked only by the level's edges. Barrier rows (two barrier blocks with a gap; in hard mode sometimes a locked
door in the gap, opened by a key hitting its lock) cross the level; touching a barrier or a locked door ends the
level (a death), touching the row of presents at the top completes it, touching a fruit or food collects it. A
level also ends after 1000 steps. Collisions are tested after the move, every entity against the agent, keys
against barriers and locks (newest key first), then collected and hit entities vanish.

Configurations (`CONFIGS`): `stock-hard` and `stock-easy` are procgen's Fruitbot (the stock game's own reward:
+1 a fruit, -4 a food, +10 a present tile touched, reported as info["stock_reward"]); `paper` is the original
code's per-task games: easy mode, levels 90 tall, each task its own object lists and counts (a train task shows
its category and one distractor category, only 2 of each category's 3 sprites ever appear), no completion bonus.

The environment (`FruitbotJax`, gymnax >= 1.0 API like `common.envs.babyai.GotoAvoid`): an episode ("lifetime") is up to
4 levels of one task w; the reward is w . phi, phi the objects of each category collected on the step
(C1 fruit 1-3, C2 fruit 4-6, C3 food 1-3, C4 food 4-6). Completing a level continues the episode (discount 1),
completing the 4th or dying ends it (termination), the level timeout truncates it. Same-step auto-reset: the
observation returned with an ending step is the next episode's first. Training levels come from a fixed pool
generated once (procgen's num_levels=200: the paper trained on level seeds 0..199); `num_levels=0` generates a
fresh level at every level start (evaluation, procgen's unrestricted levels).

Replay of game states: a frame is a function of the game state, and within a pool level only the agent and the keys
move, so `GameView` (the level's index in the pool, the agent's and keys' centres, every slot's alive bit: 38 bytes)
and the pool give the frame exactly (`FruitbotJax.view`, `FruitbotJax.draw`); the training scripts keep these in
replay instead of 12,288-byte frames and draw each sampled batch's frames in the SGD step.

Procgen's random stream cannot be matched (mt19937 inside C++); the generator follows procgen's rules and its
distributions are tested against procgen's levels (tests/test_fruitbot_jax.py). The dynamics are tested against
procgen state by state: a procgen state is loaded (`game_from_procgen`), both step with the same action, and the
next states are compared entity by entity.
"""

from __future__ import annotations

import dataclasses
import functools
import struct
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct as flax_struct
from gymnax.environments import environment, spaces

from common.envs import fruitbot_frame as frame
from common.run import require

NUM_ACTIONS = 15
TASK_DIM = 4
IMAGE_SHAPE = (64, 64, 3)
MAX_LEVELS = 4
TIMEOUT = 1000  # procgen's per-level step limit (game.cpp)
TRAIN_TASKS = np.eye(TASK_DIM, dtype=np.float32)
TEST_TASKS = np.array(
    [[1, 0, 1, 1], [1, 0, 0, 1], [1, 1, 1, 1], [1, -1, -1, -1], [1, 0, -1, -1], [1, 0, 0, -1]], dtype=np.float32)

# procgen's entity types (fruitbot.cpp; NEUTRAL only in the original's per-task games)
PLAYER, BARRIER, BULLET, BAD, GOOD, NEUTRAL, DOOR, LOCK, PRESENT = 0, 1, 3, 4, 7, 8, 10, 11, 12
AGENT_R = 0.4
MIXRATE, MAXSPEED, THRUST_Y = 0.5, 0.85, 0.2
SUB_STEPS = 4  # int(4 |v|) with |v| <= 0.71 (the speed's fixed point): always procgen's minimum of 4
MARGIN = 0.98  # sub_step's corner margin
KEY_DURATION, KEY_SPEED, KEY_R = 8, 0.5, 0.25
WALL_RY, LOCK_RX, LOCK_RY, DOOR_ASPECT = 0.3, 0.25, 0.45, 3.25
MIN_SEP, BUF_H = 4, 4
OBJECT_R = 0.5
PLACEMENT_TRIES = 16  # procgen redraws an overlapping object up to 100 times; here the first of 16 free draws
BULLET_SLOTS = 2  # a key lives 9 steps and one fires at most every 8: never more than two at once
NUM_SPRITE_TYPES = 12  # fruit 1-6, food 1-6: the collectable sprites
TYPE_CATEGORY = np.repeat(np.arange(TASK_DIM), 3)  # fruit 1-3: C1, fruit 4-6: C2, food 1-3: C3, food 4-6: C4
FRUIT_SPRITES = tuple(frame.FRUIT + k for k in range(6))
FOOD_SPRITES = tuple(frame.FOOD + k for k in range(6))


# ---------------------------------------------------------------------------------------------------------------------
# Configurations
# ---------------------------------------------------------------------------------------------------------------------
class ObjectGroup(NamedTuple):
    """One spawn_entities call: `base + randn(10)` objects of procgen type `kind`, each drawn as
    `sprites[randn(group_size)]` (only the first group_size sprites of the list can appear)."""
    kind: int
    base: int
    sprites: tuple
    reward: float  # the game's own reward for collecting one (stock_reward)


@dataclasses.dataclass(frozen=True, eq=False)  # hashed by identity: a static argument of jitted functions
class GameConfig:
    name: str
    main_width: int
    main_height: int
    num_walls: int
    min_pct: float  # the smallest gap, as a share of the width
    door_prob: float
    group_size: int  # procgen's object_group_size: the sprite theme is randn(group_size)
    completion_bonus: float
    games: dict  # task vector (tuple) -> tuple of ObjectGroup, in spawn order; key None: every task

    def groups(self, task) -> tuple:
        if None in self.games:
            return self.games[None]
        key = tuple(float(v) for v in np.asarray(task))
        require(key in self.games, f"the {self.name!r} Fruitbot config has no game for task {list(key)}: its "
                                   f"games are the tasks {[list(k) for k in self.games]}")
        return self.games[key]

    @property
    def max_objects(self) -> int:
        return max(sum(g.base + 9 for g in groups) for groups in self.games.values())


def _stock_groups(penalty=-4.0):
    return (ObjectGroup(GOOD, 10, FRUIT_SPRITES, 1.0), ObjectGroup(BAD, 10, FOOD_SPRITES, penalty))


def _paper_games():
    """The original's wilkabot{signs}.cpp games; a sign per category: p +1, z 0, n -1 (f = fruit, d = food)."""
    f = lambda *k: tuple(frame.FRUIT + i - 1 for i in k)  # noqa: E731
    d = lambda *k: tuple(frame.FOOD + i - 1 for i in k)  # noqa: E731
    games = {}
    for task, good in (((1, 0, 0, 0), f(1, 2, 3)), ((0, 1, 0, 0), f(4, 5, 6)), ((0, 0, 1, 0), d(1, 2, 3)),
                       ((0, 0, 0, 1), d(4, 5, 6))):
        others = tuple(s for s in f(1, 2, 3, 4, 5, 6) + d(1, 2, 3, 4, 5, 6) if s not in good)
        games[task] = (ObjectGroup(GOOD, 5, good * 2, 1.0), ObjectGroup(BAD, 15, others, 0.0))  # pzzz .. zzzp
    games[(1, 1, 1, 1)] = (ObjectGroup(GOOD, 10, f(1, 2, 3, 4, 5, 6), 1.0),
                           ObjectGroup(BAD, 10, d(1, 2, 3, 4, 5, 6), 1.0))  # pppp
    games[(1, -1, -1, -1)] = (ObjectGroup(GOOD, 5, f(1, 2, 3) * 2, 1.0),
                              ObjectGroup(BAD, 15, f(4, 5, 6) + d(1, 2, 3, 4, 5, 6), -1.0))  # pnnn
    for task, penalty in (((1, 0, -1, -1), -1.0), ((1, 0, 1, 1), 1.0)):  # pznn, pzpp
        games[task] = (ObjectGroup(GOOD, 5, f(1, 2, 3) * 2, 1.0), ObjectGroup(NEUTRAL, 5, f(4, 5, 6) * 2, 0.0),
                       ObjectGroup(BAD, 10, d(1, 2, 3, 4, 5, 6), penalty))
    for task, penalty in (((1, 0, 0, -1), -1.0), ((1, 0, 0, 1), 1.0)):  # pzzn, pzzp
        games[task] = (ObjectGroup(GOOD, 5, f(1, 2, 3) * 2, 1.0), ObjectGroup(NEUTRAL, 10, f(4, 5, 6) + d(1, 2, 3), 0.0),
                       ObjectGroup(BAD, 5, d(4, 5, 6) * 2, penalty))
    return {tuple(float(v) for v in k): g for k, g in games.items()}


CONFIGS = {
    "stock-hard": GameConfig("stock-hard", 20, 60, 10, 0.1, 0.125, 6, 10.0, {None: _stock_groups()}),
    "stock-easy": GameConfig("stock-easy", 10, 60, 5, 0.2, 0.0, 2, 10.0, {None: _stock_groups()}),
    "paper": GameConfig("paper", 10, 90, 5, 0.2, 0.0, 2, 0.0, _paper_games()),
}


class Layout(NamedTuple):
    """Entity slots in procgen's list order: agent | walls (per row: barrier, barrier, door, lock) | presents |
    objects | keys. Procgen erases entities from its list; here a slot dies instead, so the order stays."""
    walls: int
    presents: int
    objects: int
    bullets: int
    size: int


def layout(config: GameConfig) -> Layout:
    walls, presents, objects = 1, 1 + 4 * config.num_walls, 1 + 4 * config.num_walls + config.main_width
    bullets = objects + config.max_objects
    return Layout(walls, presents, objects, bullets, bullets + BULLET_SLOTS)


# ---------------------------------------------------------------------------------------------------------------------
# The game state and one step of procgen's rules
# ---------------------------------------------------------------------------------------------------------------------
class Game(NamedTuple):
    """One level in play: every entity slot's fields, and the level clock."""
    x: jax.Array  # float32 [N] centre
    y: jax.Array
    vx: jax.Array  # float32 [N] velocity (the agent's, and the keys' 0.5 upward)
    vy: jax.Array
    rx: jax.Array  # float32 [N] half extents
    ry: jax.Array
    kind: jax.Array  # int32 [N] procgen entity type
    sprite: jax.Array  # int32 [N] common.envs.fruitbot_frame sprite id
    alive: jax.Array  # bool [N]
    life: jax.Array  # int32 [N] steps lived (keys expire after 8)
    cur_time: jax.Array  # int32: steps into the level
    last_fire: jax.Array  # int32: cur_time of the last key fired
    background: jax.Array  # int32: index into fruitbot_frame.BACKGROUND_FILES


class Events(NamedTuple):
    collected: jax.Array  # int32 [12]: fruit 1-6, food 1-6 collected on the step
    stock_reward: jax.Array  # float32: the game's own reward (config's rewards and completion bonus)
    done: jax.Array  # bool: the level ended (death, completion or timeout)
    level_complete: jax.Array  # bool: the agent reached the presents
    timed_out: jax.Array  # bool: the level's clock ran out (and the level was not completed)


_C_HI = np.float32(0.9)
_C_LO = np.float32(0.9 - float(_C_HI))


def _times_0_9(v):
    """float32(0.9 * v) with 0.9 a double and the product rounded once, as procgen's `.9 * agent->vx` does
    (rounding 0.9 to float first would differ in about a fifth of the cases). Two-product without FMA (Dekker)."""
    split = jnp.float32(4097.0)
    def halves(a):
        t = a * split
        hi = t - (t - a)
        return hi, a - hi
    p = v * _C_HI
    v_hi, v_lo = halves(v)
    c_hi, c_lo = halves(jnp.float32(_C_HI))
    err = ((v_hi * c_hi - p) + v_hi * c_lo + v_lo * c_hi) + v_lo * c_lo
    return p + (err + v * _C_LO)


def _hits(x1, y1, rx1, ry1, x2, y2, rx2, ry2):
    """procgen's has_collision with margin 0: the boxes overlap strictly."""
    return (jnp.abs(x1 - x2) < rx1 + rx2) & (jnp.abs(y1 - y2) < ry1 + ry2)


def _out_of_bounds(x, y, rx, ry, width, height):
    return (x + rx < 0) | (y + ry < 0) | (x - rx > width) | (y - ry > height)


def _sub_step(x, y, dx, dy, config: GameConfig):
    """procgen's sub_step for the agent: move by (dx, dy) unless a corner (at 0.98 of the radius) leaves the grid,
    in which case snap to the edge. Entities never block the agent (none is a wall)."""
    w, h = config.main_width, config.main_height
    nx, ny = x + dx, y + dy
    corner = jnp.float32(AGENT_R) * jnp.float32(MARGIN)
    block = jnp.zeros((), bool)
    for cx in (nx - corner, nx + corner):
        for cy in (ny - corner, ny + corner):
            block |= (cx < 0) | (cy < 0) | (jnp.floor(cx) >= w) | (jnp.floor(cy) >= h)
    horizontal = dx != 0
    r = jnp.float32(AGENT_R)
    snapped_x = jnp.where(dx > 0, jnp.floor(nx + r) - r, jnp.ceil(nx - r) + r)
    snapped_y = jnp.where(dy > 0, jnp.floor(ny + r) - r, jnp.ceil(ny - r) + r)
    nx = jnp.where(block & horizontal, snapped_x, nx)
    ny = jnp.where(block & ~horizontal, snapped_y, ny)
    return nx, ny, block


def game_step(game: Game, action, config: GameConfig, rewards: jax.Array) -> tuple[Game, Events]:
    """One step of procgen's Fruitbot (Game::step without the reset). `rewards` [12]: the game's own reward per
    collected sprite type (only for Events.stock_reward)."""
    lay = layout(config)
    w, h = config.main_width, config.main_height
    f32 = jnp.float32
    cur_time = game.cur_time + 1
    action = jnp.asarray(action, jnp.int32)
    special = jnp.where(action >= 9, action - 8, 0)
    move = jnp.where(action >= 9, 4, action % 9)
    steer = (move // 3 - 1).astype(f32)

    # the agent's velocity (update_agent_velocity, decay_agent_velocity)
    vx = f32(1 - MIXRATE) * game.vx[0] + f32(MIXRATE) * f32(MAXSPEED) * steer
    vy = f32(1 - MIXRATE) * game.vy[0] + (f32(MIXRATE) * f32(MAXSPEED)) * f32(THRUST_Y)
    vx, vy = _times_0_9(vx), _times_0_9(vy)

    # keys fly (Entity::step): they are stepped before the agent but nothing they do depends on it
    key = jnp.arange(lay.size) >= lay.bullets
    x = jnp.where(key, game.x + game.vx, game.x)
    y = jnp.where(key, game.y + game.vy, game.y)
    life = game.life + 1
    erase = key & (life > KEY_DURATION)

    # the agent moves (basic_step_object): 4 sub-steps, y first (the agent always thrusts up)
    ax, ay = game.x[0], game.y[0]
    moved_x = moved_y = jnp.zeros((), jnp.int32)
    stopped = jnp.zeros((), bool)
    pct = f32(1.0 / SUB_STEPS)
    for _ in range(SUB_STEPS):
        nx, ny, block_y = _sub_step(ax, ay, f32(0), vy * pct, config)
        nx, ny, block_x = _sub_step(nx, ny, vx * pct, f32(0), config)
        ax, ay = jnp.where(stopped, ax, nx), jnp.where(stopped, ay, ny)
        moved_x += jnp.where(stopped | block_x, 0, 1)
        moved_y += jnp.where(stopped | block_y, 0, 1)
        stopped |= block_x & block_y
    vx = vx * (moved_x.astype(f32) / SUB_STEPS)
    vy = vy * (moved_y.astype(f32) / SUB_STEPS)
    x, y = x.at[0].set(ax), y.at[0].set(ay)

    # collisions with the agent (handle_agent_collision): every live entity, erased or not this step
    others = game.alive & (jnp.arange(lay.size) > 0)
    touch = others & _hits(x, y, game.rx, game.ry, ax, ay, f32(AGENT_R), f32(AGENT_R))
    kind = game.kind
    collectable = (kind == GOOD) | (kind == BAD) | (kind == NEUTRAL)
    collect = touch & collectable
    died = jnp.any(touch & ((kind == BARRIER) | (kind == DOOR)))
    presents = jnp.sum(touch & (kind == PRESENT))
    erase |= collect

    # keys against barriers and locks (handle_collision), newest key first; within a key, the last entity in the
    # list that it overlaps decides (a lock comes after its row's barriers)
    order = jnp.argsort(life[lay.bullets:])  # youngest first
    for b in range(BULLET_SLOTS):
        slot = lay.bullets + order[b]
        live = game.alive[slot] & ~erase[slot]
        target = game.alive & ~erase & ((kind == BARRIER) | (kind == LOCK)) & _hits(
            x[slot], y[slot], game.rx[slot], game.ry[slot], x, y, game.rx, game.ry)
        last = lay.size - 1 - jnp.argmax(target[::-1])
        hit = live & jnp.any(target)
        erase = erase.at[slot].set(erase[slot] | hit)
        opens = hit & (kind[last] == LOCK)
        erase = erase.at[last].set(erase[last] | opens)
        erase = erase.at[last - 1].set(erase[last - 1] | opens)  # the lock's row's door sits just before it

    sprite_type = jnp.clip(game.sprite - frame.FRUIT, 0, NUM_SPRITE_TYPES - 1)
    collected = jnp.zeros(NUM_SPRITE_TYPES, jnp.int32).at[sprite_type].add(collect.astype(jnp.int32))
    alive = game.alive & ~erase & ~_out_of_bounds(x, y, game.rx, game.ry, w, h)
    done = died | (presents > 0) | _out_of_bounds(ax, ay, f32(AGENT_R), f32(AGENT_R), w, h)

    # fire a key (FruitBotGame::game_step, after the base step): into the older key's slot
    fire = (special == 1) & (cur_time - game.last_fire >= KEY_DURATION)
    slot = lay.bullets + jnp.where(alive[lay.bullets:].all(), jnp.argmax(life[lay.bullets:]),
                                   jnp.argmin(alive[lay.bullets:]))
    new = dict(x=ax, y=ay, vx=f32(0), vy=f32(KEY_SPEED), rx=f32(KEY_R), ry=f32(KEY_R), kind=BULLET,
               sprite=frame.KEY_SPRITE, alive=True, life=0)
    fields = dict(x=x, y=y, vx=game.vx.at[0].set(vx), vy=game.vy.at[0].set(vy), rx=game.rx, ry=game.ry,
                  kind=game.kind, sprite=game.sprite, alive=alive, life=life)
    fields = {k: v.at[slot].set(jnp.where(fire, jnp.asarray(new[k], v.dtype), v[slot])) for k, v in fields.items()}
    last_fire = jnp.where(fire, cur_time, game.last_fire)

    timed_out = cur_time >= TIMEOUT
    complete = presents > 0
    stock = (collected.astype(f32) @ rewards) + f32(config.completion_bonus) * presents.astype(f32)
    events = Events(collected, stock, done | timed_out, complete, timed_out & ~complete)
    return Game(**fields, cur_time=cur_time, last_fire=last_fire, background=game.background), events


def category_counts(collected: jax.Array) -> jax.Array:
    """phi [4]: the objects of each category among the collected sprite types [12]."""
    return jnp.zeros(TASK_DIM, jnp.float32).at[TYPE_CATEGORY].add(collected.astype(jnp.float32))


# ---------------------------------------------------------------------------------------------------------------------
# Level generation (game_reset), in procgen's order, with JAX's random stream
# ---------------------------------------------------------------------------------------------------------------------
class TaskGames(NamedTuple):
    """The object groups of each task's game, as arrays: [tasks, groups] and sprites [tasks, groups, 6]."""
    kind: jax.Array
    base: jax.Array  # -1: no such group in this task's game
    sprites: jax.Array
    rewards: jax.Array  # [tasks, 12]: the game's own reward per collectable sprite


def task_games(config: GameConfig, tasks) -> TaskGames:
    tasks = np.asarray(tasks, np.float32)
    n_groups = max(len(g) for g in config.games.values())
    kind = np.zeros((len(tasks), n_groups), np.int32)
    base = np.full((len(tasks), n_groups), -1, np.int32)
    sprites = np.zeros((len(tasks), n_groups, 6), np.int32)
    rewards = np.zeros((len(tasks), NUM_SPRITE_TYPES), np.float32)
    for t, task in enumerate(tasks):
        for g, group in enumerate(config.groups(task)):
            kind[t, g], base[t, g] = group.kind, group.base
            sprites[t, g, :min(6, len(group.sprites))] = group.sprites[:6]  # themes are randn(group_size <= 6)
            # only the first group_size sprites ever appear, so each sprite has one kind within a game
            for s in group.sprites[:config.group_size]:
                rewards[t, s - frame.FRUIT] = group.reward
    return TaskGames(*map(jnp.asarray, (kind, base, sprites, rewards)))


def generate_level(key, config: GameConfig, games: TaskGames, task) -> Game:
    """A fresh level of task `task`'s game (BasicAbstractGame::game_reset + FruitBotGame::game_reset)."""
    lay = layout(config)
    w, h, nw = config.main_width, config.main_height, config.num_walls
    f32 = jnp.float32
    keys = iter(jax.random.split(key, 16))
    uniform = lambda shape=(): jax.random.uniform(next(keys), shape, f32)  # noqa: E731
    n = lay.size
    x, y = jnp.zeros(n, f32), jnp.zeros(n, f32)
    rx, ry = jnp.zeros(n, f32), jnp.zeros(n, f32)
    kind, sprite = jnp.zeros(n, jnp.int32), jnp.zeros(n, jnp.int32)
    alive = jnp.zeros(n, bool)

    background = jax.random.randint(next(keys), (), 0, len(frame.BACKGROUND_FILES))
    x = x.at[0].set(uniform() * (w - 2 * AGENT_R) + AGENT_R)
    y = y.at[0].set(f32(AGENT_R))
    rx, ry = rx.at[0].set(AGENT_R), ry.at[0].set(AGENT_R)
    alive = alive.at[0].set(True)
    sprite = sprite.at[0].set(frame.PLAYER_SPRITE)

    # barrier rows: the spare height split among the rows by uniform draws (rand_gen.partition)
    spare = h - MIN_SEP * nw - BUF_H
    part = jnp.zeros(nw, jnp.int32).at[jax.random.randint(next(keys), (spare,), 0, nw)].add(1)
    row_y = jnp.cumsum(MIN_SEP + part).astype(f32)
    use_door = (MIN_SEP + part > 5) & (uniform((nw,)) < config.door_prob)
    pct = f32(config.min_pct) + f32(0.2) * uniform((nw,))
    lock_pct = 2 * LOCK_RX / w
    door_pct = (WALL_RY * 2 * DOOR_ASPECT) / w
    pct = jnp.where(use_door, 2 * lock_pct + door_pct * jnp.ceil((pct + 0.1 - 2 * lock_pct) / door_pct), pct)
    gap = pct * w
    w1 = uniform((nw,)) * (w - gap)
    w2 = w - w1 - gap
    right = jax.random.randint(next(keys), (nw,), 0, 2).astype(f32)
    rows = lay.walls + 4 * jnp.arange(nw)
    row_fields = {
        "x": jnp.stack([w1 / 2, w - w2 / 2, w1 + gap / 2 - (right * 2 - 1) * LOCK_RX,
                        w1 + LOCK_RX + right * (gap - 2 * LOCK_RX)], 1),
        "y": jnp.stack([row_y, row_y, row_y, row_y - LOCK_RY + WALL_RY], 1),
        "rx": jnp.stack([w1 / 2, w2 / 2, gap / 2 - LOCK_RX, jnp.full(nw, LOCK_RX, f32)], 1),
        "ry": jnp.stack([jnp.full(nw, WALL_RY, f32)] * 3 + [jnp.full(nw, LOCK_RY, f32)], 1),
    }
    idx = (rows[:, None] + jnp.arange(4)).reshape(-1)
    x, y = x.at[idx].set(row_fields["x"].reshape(-1)), y.at[idx].set(row_fields["y"].reshape(-1))
    rx, ry = rx.at[idx].set(row_fields["rx"].reshape(-1)), ry.at[idx].set(row_fields["ry"].reshape(-1))
    kind = kind.at[idx].set(jnp.tile(jnp.array([BARRIER, BARRIER, DOOR, LOCK]), nw))
    sprite = sprite.at[idx].set(jnp.tile(jnp.array([frame.BARRIER_SPRITE, frame.BARRIER_SPRITE, frame.DOOR_SPRITE,
                                                    frame.LOCK_SPRITE]), nw))
    alive = alive.at[idx].set(jnp.stack([jnp.ones(nw, bool)] * 2 + [use_door] * 2, 1).reshape(-1))

    # the presents: one tile per column on the top row
    p = lay.presents + jnp.arange(w)
    x, y = x.at[p].set(jnp.arange(w) + f32(0.5)), y.at[p].set(f32(h - 0.5))
    rx, ry = rx.at[p].set(0.5), ry.at[p].set(0.5)
    kind = kind.at[p].set(PRESENT)
    sprite = sprite.at[p].set(frame.PRESENT + jax.random.randint(next(keys), (w,), 0, 3))
    alive = alive.at[p].set(True)

    # the objects: each group's count, then one by one at a random spot that overlaps nothing placed so far
    counts = jnp.where(games.base[task] >= 0, games.base[task] + jax.random.randint(
        next(keys), games.base[task].shape, 0, 10), 0)
    m = jnp.arange(config.max_objects)
    group = jnp.searchsorted(jnp.cumsum(counts), m, side="right")
    present = m < counts.sum()
    group = jnp.minimum(group, len(counts) - 1)
    theme = jax.random.randint(next(keys), (config.max_objects,), 0, config.group_size)
    obj_sprite = games.sprites[task, group, theme]
    aspect = jnp.asarray(frame.sprite_aspect_ratios())[obj_sprite]
    candidates = jnp.stack([uniform((config.max_objects, PLACEMENT_TRIES)) * (w - 2 * OBJECT_R) + OBJECT_R,
                            uniform((config.max_objects, PLACEMENT_TRIES)) * (h - 2 * OBJECT_R) + OBJECT_R], -1)

    def place(carry, inputs):
        x, y, rx, ry, alive = carry
        slot, cand, on = inputs
        free = ~jnp.any(alive[None] & _hits(cand[:, :1], cand[:, 1:], OBJECT_R, OBJECT_R, x, y, rx, ry), 1)
        pick = jnp.where(free.any(), jnp.argmax(free), PLACEMENT_TRIES - 1)
        x = x.at[slot].set(jnp.where(on, cand[pick, 0], x[slot]))
        y = y.at[slot].set(jnp.where(on, cand[pick, 1], y[slot]))
        rx, ry = rx.at[slot].set(OBJECT_R), ry.at[slot].set(OBJECT_R)
        return (x, y, rx, ry, alive.at[slot].set(on)), None

    (x, y, rx, ry, alive), _ = jax.lax.scan(place, (x, y, rx, ry, alive), (lay.objects + m, candidates, present))
    # fit_aspect_ratio: the sprite's aspect ratio shrinks one half extent
    o = lay.objects + m
    rx = rx.at[o].set(jnp.where(aspect > 1, f32(OBJECT_R), f32(OBJECT_R) * aspect))
    ry = ry.at[o].set(jnp.where(aspect > 1, f32(OBJECT_R) / aspect, f32(OBJECT_R)))
    kind = kind.at[o].set(games.kind[task, group])
    sprite = sprite.at[o].set(obj_sprite)
    zeros = jnp.zeros(n, f32)
    return Game(x, y, zeros, zeros, rx, ry, kind, sprite, alive, jnp.zeros(n, jnp.int32), jnp.zeros((), jnp.int32),
                jnp.zeros((), jnp.int32), background)


# ---------------------------------------------------------------------------------------------------------------------
# Procgen's serialized state -> Game (for the tests against procgen)
# ---------------------------------------------------------------------------------------------------------------------
def game_from_procgen(state: bytes, config: GameConfig) -> Game:
    """A procgen Fruitbot state (ProcgenGym3Env's get_state) as a Game: the same entities in the same slots.
    Classification uses image_type (procgen's type at creation), so states with neutralised types load too."""
    from common.envs.fruitbot import CUR_TIME_FIELD, StateLayout

    lay = layout(config)
    states = StateLayout(state)
    table = states.entity_table(state)
    floats = table.view(np.float32)
    n = lay.size
    out = {k: np.zeros(n, np.float32) for k in ("x", "y", "vx", "vy", "rx", "ry")}
    kind, sprite, life = np.zeros(n, np.int32), np.zeros(n, np.int32), np.zeros(n, np.int32)
    alive = np.zeros(n, bool)
    slots = []
    image_type, theme = table[:, 7], table[:, 8]
    rows = sorted({float(f) for f in floats[image_type == BARRIER, 1]})
    next_object, next_bullet, next_present = lay.objects, lay.bullets, lay.presents
    for i, t in enumerate(image_type):
        if t == PLAYER:
            slot, s = 0, frame.PLAYER_SPRITE
        elif t in (BARRIER, DOOR, LOCK):
            row = min(range(len(rows)), key=lambda r: abs(rows[r] - floats[i, 1]))
            offset = {DOOR: 2, LOCK: 3}.get(int(t), 0)
            if t == BARRIER:
                offset = 1 if (lay.walls + 4 * row) in slots else 0
            slot = lay.walls + 4 * row + offset
            s = {BARRIER: frame.BARRIER_SPRITE, DOOR: frame.DOOR_SPRITE, LOCK: frame.LOCK_SPRITE}[int(t)]
        elif t == PRESENT:
            slot, s, next_present = next_present, frame.PRESENT + int(theme[i]), next_present + 1
        elif t in (GOOD, BAD):
            slot, next_object = next_object, next_object + 1
            s = (frame.FRUIT if t == GOOD else frame.FOOD) + int(theme[i])
        elif t == BULLET:
            slot, s, next_bullet = next_bullet, frame.KEY_SPRITE, next_bullet + 1
        else:
            raise ValueError(f"procgen entity of image type {t} has no slot here")
        slots.append(slot)
        for k, field in (("x", 0), ("y", 1), ("vx", 2), ("vy", 3), ("rx", 4), ("ry", 5)):
            out[k][slot] = floats[i, field]
        kind[slot], sprite[slot], life[slot], alive[slot] = t, s, table[i, 18], True
    require(next_bullet <= lay.size and next_object <= lay.bullets, "procgen state has more entities than slots")
    after = states.entities + 4 * table.size
    background = struct.unpack_from("<i", state, after + 4)[0]
    last_fire = struct.unpack_from("<i", state, len(state) - 8)[0]
    return Game(**{k: jnp.asarray(v) for k, v in out.items()}, kind=jnp.asarray(kind), sprite=jnp.asarray(sprite),
                alive=jnp.asarray(alive), life=jnp.asarray(life),
                cur_time=jnp.asarray(states.step_field(state, CUR_TIME_FIELD), jnp.int32),
                last_fire=jnp.asarray(last_fire, jnp.int32), background=jnp.asarray(background, jnp.int32))


# ---------------------------------------------------------------------------------------------------------------------
# The environment: lifetimes of up to 4 levels, reward w . phi, auto-reset
# ---------------------------------------------------------------------------------------------------------------------
@flax_struct.dataclass
class EnvState(environment.EnvState):
    game: Game = None
    task: jax.Array = None  # int32: index into params.tasks
    levels: jax.Array = None  # int32: levels completed in this episode
    level: jax.Array = None  # int32: the level's index in the task's pool (-1: a fresh level, num_levels = 0)


@flax_struct.dataclass
class EnvParams(environment.EnvParams):
    max_steps_in_episode: int = MAX_LEVELS * TIMEOUT
    tasks: jax.Array = None  # float32 [T, 4]
    games: TaskGames = None
    pool: Game = None  # [T, L, ...] pre-generated levels per task (L = num_levels; empty when num_levels = 0)


class Observation(NamedTuple):
    image: jax.Array  # uint8 [64, 64, 3]
    w: jax.Array  # float32 [4]


class GameView(NamedTuple):
    """What a frame of a pool level needs beyond the level itself: 38 bytes in the paper's games (41 in stock hard)
    instead of the frame's 12,288. Within a level only the agent and the keys move; walls, objects and presents stay
    where the level put them and can only vanish, and a key slot, once alive, is always a key. So the pool's level,
    these centres and the slots' alive bits give the frame exactly (FruitbotJax.draw; tests/test_fruitbot_jax.py
    checks it frame by frame against the rendered states). Replay keeps these; the learner draws the frames."""
    level: jax.Array  # int32: task * pool size + the level's index in the task's pool
    xy: jax.Array  # float32 [1 + BULLET_SLOTS, 2]: the centres of the agent (slot 0) and the key slots
    alive: jax.Array  # uint8 [ceil(slots / 8)]: every slot's alive bit (jnp.packbits order)


def view_bytes(config: str) -> int:
    """Bytes of one GameView of a config's levels: what replay keeps of an observation instead of its frame."""
    return 4 + 4 * 2 * (1 + BULLET_SLOTS) + -(-layout(CONFIGS[config]).size // 8)


@functools.lru_cache(maxsize=None)
def _level_pool(config: GameConfig):
    """jitted (keys [L], games of T tasks) -> levels [T, L]: task t's level l from key l (compiled once a config)."""
    def pool(keys, games):
        tasks = jnp.arange(games.base.shape[0])
        return jax.vmap(jax.vmap(lambda k, t: generate_level(k, config, games, t), (0, None)), (None, 0))(keys, tasks)
    return jax.jit(pool)


class FruitbotJax(environment.Environment):
    """Fruitbot lifetimes in JAX. step -> (obs, state, reward, terminated, truncated, info); info: phi [4],
    stock_reward, level_complete, levels (completed in the episode, counting this step), died, timed_out,
    final_image (with final_view=True the view the step led to, before the auto-reset; zeros without), w (the task
    the step was taken under)."""

    def __init__(self, config: str = "paper", max_levels: int = MAX_LEVELS, final_view: bool = False):
        require(config in CONFIGS, f"Fruitbot config must be one of {sorted(CONFIGS)}, got {config!r}")
        require(max_levels > 0, f"max_levels must be positive, got {max_levels}")
        super().__init__()
        self.config, self.max_levels, self.final_view = CONFIGS[config], max_levels, final_view
        self.images = frame.frame_images()
        self._default_params = None

    def make_params(self, tasks, num_levels: int = 200, seed: int = 0) -> EnvParams:
        """Params for `tasks`; num_levels > 0 draws that many levels per task once (from `seed`), as procgen's
        num_levels does; 0 makes a fresh level at every level start."""
        tasks = np.asarray(tasks, np.float32)
        require(tasks.ndim == 2 and tasks.shape[1] == TASK_DIM and len(tasks) > 0,
                f"Fruitbot tasks must be an [n, {TASK_DIM}] array, got shape {tasks.shape}")
        require(num_levels >= 0, f"num_levels must be non-negative (0: unrestricted), got {num_levels}")
        games = task_games(self.config, tasks)
        keys = jax.random.split(jax.random.PRNGKey(seed), max(num_levels, 1))
        pool = _level_pool(self.config)(keys, games)
        if num_levels == 0:
            pool = jax.tree.map(lambda a: a[:, :0], pool)
        return EnvParams(tasks=jnp.asarray(tasks), games=games, pool=pool)

    @property
    def default_params(self) -> EnvParams:
        """The train tasks, 200 levels each: drawn once (concretely, also when first asked for inside a jitted
        function) and kept, so reset and step without params do not redraw the pool at every call."""
        if self._default_params is None:
            with jax.ensure_compile_time_eval():
                self._default_params = self.make_params(TRAIN_TASKS)
        return self._default_params

    @property
    def name(self) -> str:
        return f"Fruitbot-{self.config.name}"

    @property
    def num_actions(self) -> int:
        return NUM_ACTIONS

    def action_space(self, params=None):
        return spaces.Discrete(NUM_ACTIONS)

    def observation_space(self, params=None):
        return spaces.Dict({"image": spaces.Box(0, 255, IMAGE_SHAPE, jnp.uint8),
                            "w": spaces.Box(-1.0, 1.0, (TASK_DIM,), jnp.float32)})

    def new_level(self, key, task, params: EnvParams) -> tuple[Game, jax.Array]:
        """A level of task `task` and its index in the task's pool (-1: generated fresh, with num_levels = 0)."""
        if params.pool.x.shape[1] == 0:
            return generate_level(key, self.config, params.games, task), jnp.full((), -1, jnp.int32)
        index = jax.random.randint(key, (), 0, params.pool.x.shape[1])
        return jax.tree.map(lambda a: a[task, index], params.pool), index

    def render(self, game: Game) -> jax.Array:
        return frame.render(self.images, game.x, game.y, game.rx, game.ry, game.sprite, game.alive, game.background,
                            self.config.main_width, self.config.main_height)

    def moving_slots(self) -> np.ndarray:
        """The slots whose centres GameView keeps: the agent's and the keys'."""
        bullets = layout(self.config).bullets
        return np.array([0, *range(bullets, bullets + BULLET_SLOTS)])

    def view(self, state: EnvState, params: EnvParams) -> GameView:
        """The GameView of a state on a pool level (one env; vmap it). The pool's level must be where the state's
        came from: a fresh level (num_levels = 0) has no view."""
        slots = self.moving_slots()
        return GameView(level=state.task * params.pool.x.shape[1] + state.level,
                        xy=jnp.stack([state.game.x[slots], state.game.y[slots]], -1),
                        alive=jnp.packbits(state.game.alive))

    def draw(self, view: GameView, params: EnvParams) -> jax.Array:
        """The frames uint8 [..., 64, 64, 3] of GameViews with any leading axes (replay's [batch, time]): each view's
        pool level with the view's moving slots and alive bits, drawn as one flat batch by the batched renderer
        (fruitbot_frame.render_batch: this runs in the learner's SGD step, where render's custom_vmap cannot)."""
        lay, slots = layout(self.config), self.moving_slots()
        keys = slots[1:]
        lead = view.level.shape
        flat = jax.tree.map(lambda a: a.reshape((-1,) + a.shape[len(lead):]), view)
        game = jax.tree.map(lambda a: a.reshape((-1,) + a.shape[2:])[flat.level], params.pool)  # [M, N]
        x, y = game.x.at[:, slots].set(flat.xy[..., 0]), game.y.at[:, slots].set(flat.xy[..., 1])
        rx, ry = game.rx.at[:, keys].set(KEY_R), game.ry.at[:, keys].set(KEY_R)
        sprite = game.sprite.at[:, keys].set(frame.KEY_SPRITE)
        alive = jnp.unpackbits(flat.alive, axis=-1, count=lay.size).astype(bool)
        frames = frame.render_batch(self.images, x, y, rx, ry, sprite, alive, game.background,
                                    self.config.main_width, self.config.main_height)
        return frames.reshape(lead + frames.shape[1:])

    def observe(self, state: EnvState, params: EnvParams) -> Observation:
        return Observation(self.render(state.game), params.tasks[state.task])

    def reset_env(self, key, params: EnvParams):
        k_task, k_level = jax.random.split(key)
        task = jax.random.randint(k_task, (), 0, params.tasks.shape[0])
        game, level = self.new_level(k_level, task, params)
        state = EnvState(game=game, task=task, levels=jnp.zeros((), jnp.int32), level=level,
                         time=jnp.zeros((), jnp.int32))
        return self.observe(state, params), state

    def reset_to(self, key, task, params: EnvParams):
        """reset_env with the task given (params.tasks[task]) instead of drawn: evaluation pins one per env."""
        game, level = self.new_level(key, task, params)
        state = EnvState(game=game, task=jnp.asarray(task, jnp.int32), levels=jnp.zeros((), jnp.int32), level=level,
                         time=jnp.zeros((), jnp.int32))
        return self.observe(state, params), state

    def reset(self, key, params: EnvParams | None = None):
        return self.reset_env(key, self.default_params if params is None else params)

    def step_env(self, key, state, action, params):
        return self.step(key, state, action, params)

    def step(self, key, state: EnvState, action, params: EnvParams | None = None):
        params = self.default_params if params is None else params
        game, events = game_step(state.game, action, self.config, params.games.rewards[state.task])
        levels = state.levels + events.level_complete.astype(jnp.int32)
        phi = category_counts(events.collected)
        w = params.tasks[state.task]
        died = events.done & ~events.level_complete & ~events.timed_out
        terminated = died | (events.level_complete & (levels >= self.max_levels))
        truncated = events.timed_out
        episode_over = terminated | truncated
        # the view the step led to costs a second frame: only with final_view (zeros otherwise)
        final_image = self.render(game) if self.final_view else jnp.zeros(IMAGE_SHAPE, jnp.uint8)
        k_task, k_level = jax.random.split(key)
        task = jnp.where(episode_over, jax.random.randint(k_task, (), 0, params.tasks.shape[0]), state.task)
        fresh, fresh_level = self.new_level(k_level, task, params)
        game = jax.tree.map(lambda a, b: jnp.where(events.done, a, b), fresh, game)
        state = EnvState(game=game, task=task, levels=jnp.where(episode_over, 0, levels),
                         level=jnp.where(events.done, fresh_level, state.level),
                         time=jnp.where(episode_over, 0, state.time + 1))
        info = {"phi": phi, "stock_reward": events.stock_reward, "level_complete": events.level_complete,
                "levels": levels, "died": died, "timed_out": events.timed_out, "final_image": final_image, "w": w}
        return self.observe(state, params), state, (phi * w).sum(), terminated, truncated, info


# ---------------------------------------------------------------------------------------------------------------------
# Reference play: random, and a scripted gap-seeker that completes levels without choosing objects
# ---------------------------------------------------------------------------------------------------------------------
LEFT, STRAIGHT, RIGHT, FIRE = 0, 3, 6, 9  # actions 0-8 steer by (a // 3) - 1; 9 fires a key


def play_first_lifetimes(env: FruitbotJax, params: EnvParams, task_of_env, act, initial_state, key,
                         max_steps: int) -> jax.Array:
    """Returns [n] of n envs (env i on a level of its task task_of_env[i] from params), each played until its first
    lifetime ends (what comes after is not counted), all in one lax.while_loop (jit it with the caller);
    act(image, w, prev_action, prev_reward, state) -> (action, state) is the script's greedy policy on all n envs,
    initial_state the recurrent core's of one env. The JAX twin of common.envs.host.play_first_episodes."""
    n = task_of_env.shape[0]
    k_reset, key = jax.random.split(key)
    obs, env_state = jax.vmap(env.reset_to, (0, 0, None))(jax.random.split(k_reset, n), task_of_env, params)
    state = jax.tree.map(lambda x: jnp.broadcast_to(x, (n,) + x.shape), initial_state)

    def body(carry):
        t, key, obs, env_state, state, prev_action, prev_reward, returns, running = carry
        key, k_step = jax.random.split(key)
        action, state = act(obs.image, obs.w, prev_action, prev_reward, state)
        obs, env_state, reward, terminated, truncated, _ = jax.vmap(env.step, (0, 0, 0, None))(
            jax.random.split(k_step, n), env_state, action, params)
        returns = returns + jnp.where(running, reward, 0.0)
        running = running & ~(terminated | truncated)
        return t + 1, key, obs, env_state, state, action, reward, returns, running

    carry = (0, key, obs, env_state, state, jnp.zeros(n, jnp.int32), jnp.zeros(n), jnp.zeros(n), jnp.ones(n, bool))
    return jax.lax.while_loop(lambda c: c[-1].any() & (c[0] < max_steps), body, carry)[-2]


def gap_seeking_action(game: Game, config: GameConfig) -> jax.Array:
    """Steer towards the gap of the next barrier row ahead; where a locked door closes it, line up under its lock
    and fire (common.envs.fruitbot.gap_seeking_action's rule, on the JAX state). Task-agnostic."""
    lay = layout(config)
    rows = lay.walls + 4 * jnp.arange(config.num_walls)
    ax, ay = game.x[0], game.y[0]
    ahead = game.y[rows] + game.ry[rows] + AGENT_R > ay
    r = rows[jnp.argmin(jnp.where(ahead, game.y[rows], jnp.inf))]
    margin = AGENT_R + 0.15
    lo, hi = game.x[r] + game.rx[r] + margin, game.x[r + 1] - game.rx[r + 1] - margin
    target = jnp.where(lo <= hi, jnp.clip(ax, lo, hi), (lo + hi) / 2)
    door = game.alive[r + 2]
    target = jnp.where(door, game.x[r + 3], target)
    steer = jnp.where(jnp.abs(target - ax) < 0.1, STRAIGHT, jnp.where(target > ax, RIGHT, LEFT))
    action = jnp.where(door & (jnp.abs(target - ax) < 0.2), FIRE, steer)
    return jnp.where(ahead.any(), action, STRAIGHT)


def policy_returns(policy: str, config: str = "paper", tasks=TRAIN_TASKS, num_episodes: int = 100, seed: int = 0,
                   num_levels: int = 200, level_key: int = 0):
    """Per task: mean and standard error of the lifetime return of "random" or "scripted" play, and the mean
    levels completed, on a pool of num_levels levels per task drawn from level_key (the scripts' training levels:
    200 from key 0; their evaluation levels: 1000 from key 1) or on fresh levels (num_levels 0)."""
    require(policy in ("random", "scripted"), f"policy must be random or scripted, got {policy!r}")
    require(num_episodes >= 2, f"num_episodes must be at least 2 to give a standard error, got {num_episodes}")
    env = FruitbotJax(config)
    tasks = np.asarray(tasks, np.float32)
    params = env.make_params(tasks, num_levels=num_levels, seed=level_key)
    n = len(tasks) * num_episodes
    task_of_env = jnp.repeat(jnp.arange(len(tasks)), num_episodes)

    @jax.jit
    def play(key):
        k_reset, key = jax.random.split(key)
        _, state = jax.vmap(env.reset_to, (0, 0, None))(jax.random.split(k_reset, n), task_of_env, params)

        def body(carry):
            t, key, state, returns, levels, running = carry
            key, k_act, k_step = jax.random.split(key, 3)
            if policy == "random":
                action = jax.random.randint(k_act, (n,), 0, NUM_ACTIONS)
            else:
                action = jax.vmap(lambda g: gap_seeking_action(g, env.config))(state.game)
            _, state, reward, terminated, truncated, info = jax.vmap(env.step, (0, 0, 0, None))(
                jax.random.split(k_step, n), state, action, params)
            returns += jnp.where(running, reward, 0.0)
            levels = jnp.where(running, info["levels"], levels)
            return t + 1, key, state, returns, levels, running & ~(terminated | truncated)

        carry = (0, key, state, jnp.zeros(n), jnp.zeros(n, jnp.int32), jnp.ones(n, bool))
        carry = jax.lax.while_loop(lambda c: c[-1].any() & (c[0] < env.max_levels * TIMEOUT), body, carry)
        return carry[3], carry[4]

    returns, levels = (np.asarray(x) for x in play(jax.random.PRNGKey(seed)))
    returns = returns.reshape(len(tasks), num_episodes)
    return returns.mean(1), returns.std(1, ddof=1) / np.sqrt(num_episodes), levels.mean()


def _print_reference_table(config: str = "paper", episodes: int = 100, seed: int = 0, num_levels: int = 200,
                           level_key: int = 0):
    from common.run import format_task

    levels = "fresh levels" if num_levels == 0 else f"{num_levels} levels per task from key {level_key}"
    print(f"| split | task | random | scripted gap-seeker |  ({episodes} lifetimes of up to {MAX_LEVELS} levels, "
          f"{config}, {levels}, seed {seed})")
    print("|---|---|---:|---:|")
    for split, tasks in (("train", TRAIN_TASKS), ("test", TEST_TASKS)):
        results = [policy_returns(p, config, tasks, episodes, seed, num_levels, level_key)
                   for p in ("random", "scripted")]
        for i, w in enumerate(tasks):
            print(f"| {split} | {format_task(w)} | "
                  + " | ".join(f"{mean[i]:.3f} ± {se[i]:.3f}" for mean, se, _ in results) + " |")
        print(f"| {split} | mean | " + " | ".join(f"{mean.mean():.3f} ± {np.sqrt((se ** 2).sum()) / len(se):.3f}"
                                                  for mean, se, _ in results) + " |")
        print(f"levels completed per lifetime ({split}): random {results[0][2]:.2f}, scripted {results[1][2]:.2f}")


if __name__ == "__main__":
    import argparse

    from common.run import exit_on_config_error

    parser = argparse.ArgumentParser(description="reference returns of random and scripted play in JAX Fruitbot")
    parser.add_argument("--config", default="paper", choices=sorted(CONFIGS))
    parser.add_argument("--episodes", type=int, default=100)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--num-levels", type=int, default=200,
                        help="levels per task in the pool (200 with key 0: the scripts' training levels; 1000 with key "
                             "1: their evaluation levels); 0: fresh levels")
    parser.add_argument("--level-key", type=int, default=0, help="the key the level pool is drawn from")
    cli = parser.parse_args()
    exit_on_config_error(_print_reference_table)(cli.config, cli.episodes, cli.seed, cli.num_levels, cli.level_key)
