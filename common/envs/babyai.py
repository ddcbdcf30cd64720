"""BabyAI GotoAvoid: the paper's object-pickup room, JAX-native, with a minigrid twin as its reference.

One 10x10 room (8x8 walkable), 4 object categories x 3 instances, actions left/right/forward/pickup. Picking up the
object in front pays w[k] for its category k and respawns it at a uniformly random empty cell at Manhattan
distance >= 2 from the agent; the agent never carries. Episodes last 200 steps and end by truncation only. Those
are the paper's sizes; `GotoAvoid(grid_size=..., objects_per_category=..., episode_steps=...)` makes the same game
in another room (grid_size: its side, walls included); the miniature BabyAI (docs/babyai.md) is one.
The agent sees an egocentric 5x5 view with minigrid's occlusion, as RGB (40x40x3 uint8, minigrid's own tiles at
8 px) or as the symbolic 5x5x3 minigrid encoding. Every step also yields the task w and the cumulant phi
(one-hot of the category picked up on that transition).

`GotoAvoid` is a gymnax (>= 1.0) environment: jittable, vmappable, auto-resetting. `common.envs.minigrid_twin` holds the
same game as a `minigrid.MiniGridEnv`; tests/test_babyai_equivalence.py shows the two agree step for step. minigrid
(and the pygame it imports) is imported only where its tiles or the twin are used, so the scripts that import this
module for other envs run without it.

Layouts: the objects (12 in the paper's room) and the agent take distinct interior cells drawn uniformly, with a uniform direction;
a layout is redrawn until the agent does not face an object and every object has a reachable free neighbour
(as the original's rejection sampling). The original also kept objects out of the cells within distance 1 of the
room centre (a side effect of minigrid placing the agent there first); this room does not.
Respawns: the new cell is the k-th candidate cell in row-major (y, then x) order with k = floor(u * n) for
u ~ U[0, 1) and n candidates, so a twin given the same u picks the same cell.
"""

from __future__ import annotations

from functools import partial
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct
from gymnax.environments import environment, spaces

from common.run import format_task, require

ROOM_SIZE = 10  # the paper's room's side, walls included (GotoAvoid's grid_size)
NUM_CATEGORIES = 4
OBJECTS_PER_CATEGORY = 3
NUM_OBJECTS = NUM_CATEGORIES * OBJECTS_PER_CATEGORY
MAX_STEPS = 200
RESPAWN_MIN_DISTANCE = 2  # Manhattan distance from the agent
LEFT, RIGHT, FORWARD, PICKUP = 0, 1, 2, 3
NUM_ACTIONS = 4
OBS_MODES = ("rgb", "symbolic")

# (minigrid type, colour) of each category, in the order of the task vector.
CATEGORY_KINDS = (("ball", "red"), ("ball", "blue"), ("key", "green"), ("box", "yellow"))

TRAIN_TASKS = np.eye(NUM_CATEGORIES, dtype=np.float32)
TEST_TASKS = np.array(
    [
        [1, 1, 0, 0],
        [1, 1, 0.5, 0.5],
        [1, 1, 1, 1],
        [-1, 1, 0, 1],
        [-1, 1, -1, 0.5],
        [-1, 1, -1, 1],
        [-1, 1, -1, -1],
        [-0.5, 1, -0.5, -0.5],
    ],
    dtype=np.float32,
)

# minigrid's DIR_TO_VEC: 0 = +x (right), 1 = +y (down), 2 = -x, 3 = -y.
DIR_TO_VEC = np.array([[1, 0], [0, 1], [-1, 0], [0, -1]], dtype=np.int32)

# Cell codes of the world grid (indexed [x, y]); object category k has code OBJECT + k.
EMPTY, WALL, OBJECT = 0, 1, 2


def interior_cells(grid_size: int = ROOM_SIZE) -> np.ndarray:
    """The room's walkable cells in row-major (y, then x) order: the order used to pick layouts and respawn cells."""
    return np.array([(x, y) for y in range(1, grid_size - 1) for x in range(1, grid_size - 1)], np.int32)


def object_categories(num_objects: int) -> np.ndarray:
    """The category of each object: object i belongs to category i // (objects per category)."""
    return np.repeat(np.arange(NUM_CATEGORIES, dtype=np.int32), num_objects // NUM_CATEGORIES)


def check_room(grid_size: int, objects_per_category: int, episode_steps: int) -> None:
    """Refuse a room in which the game cannot be played, with one line saying what fits."""
    require(isinstance(grid_size, int) and grid_size >= 3,
            f"the grid size (the room's side, walls included) must be an integer >= 3, got {grid_size!r}")
    require(isinstance(objects_per_category, int) and objects_per_category >= 1,
            f"objects per category must be a positive integer, got {objects_per_category!r}")
    require(isinstance(episode_steps, int) and episode_steps >= 1,
            f"the episode length must be a positive integer, got {episode_steps!r}")
    cells, objects = (grid_size - 2) ** 2, NUM_CATEGORIES * objects_per_category
    # a pick-up frees one cell and respawns the object 2 or more steps from the agent: at most 5 cells (the agent's
    # and its 4 neighbours) are too close, so a respawn always has a cell when the room has objects + 5 of them
    fits = max(m for m in range(0, cells + 1) if cells >= NUM_CATEGORIES * m + 5) if cells >= NUM_CATEGORIES + 5 else 0
    require(cells >= objects + 5, f"a grid of size {grid_size} ({cells} walkable cells) cannot hold {objects} objects "
                                  f"({objects_per_category} per category) with room to respawn them (objects + 5 cells"
                                  f" needed): {'at most ' + str(fits) + ' per category fit' if fits else 'use a grid of size 5 or more'}")


def _minigrid_objects():
    """Fresh minigrid objects for the 4 categories (world_object classes from minigrid itself)."""
    from minigrid.core.world_object import Ball, Box, Key

    make = {"ball": Ball, "key": Key, "box": Box}
    return [make[kind](color) for kind, color in CATEGORY_KINDS]


def _tables(tile_size: int):
    """Symbolic encoding and RGB tile of each view-cell index, taken from minigrid.

    Index 0 is an unseen cell, then EMPTY, WALL and the categories (cell code + 1), then the agent's own cell.
    """
    from minigrid.core.grid import Grid
    from minigrid.core.world_object import Wall

    cells = [None, Wall(), *_minigrid_objects()]
    encoding = [(0, 0, 0)] + [(1, 0, 0) if c is None else c.encode() for c in cells]
    tiles = [Grid.render_tile(None, highlight=False, tile_size=tile_size)]
    tiles += [Grid.render_tile(c, highlight=True, tile_size=tile_size) for c in cells]
    tiles += [Grid.render_tile(None, agent_dir=3, highlight=True, tile_size=tile_size)]
    return np.array(encoding, np.uint8), np.stack(tiles).astype(np.uint8)


def _shift4(x: jax.Array, fill) -> jax.Array:
    """The 4 neighbours of every cell of an [x, y] map, stacked on axis 0 (order of DIR_TO_VEC)."""
    padded = jnp.pad(x, 1, constant_values=fill)
    n = x.shape[0]
    return jnp.stack(
        [padded[2:, 1:-1], padded[1:-1, 2:], padded[: n, 1:-1], padded[1:-1, : n]]
    )


def world_grid(obj_pos: jax.Array, grid_size: int = ROOM_SIZE) -> jax.Array:
    """Cell codes [x, y] of the room with its objects (the agent is not drawn)."""
    base = np.full((grid_size, grid_size), WALL, np.int32)
    base[1:-1, 1:-1] = EMPTY
    categories = object_categories(obj_pos.shape[0])
    return jnp.asarray(base).at[obj_pos[:, 0], obj_pos[:, 1]].set(OBJECT + jnp.asarray(categories))


def visibility(transparent: jax.Array) -> jax.Array:
    """minigrid's Grid.process_vis on a view [x, y] whose agent sits at (V // 2, V - 1), facing y = 0."""
    v = transparent.shape[0]
    t = [[transparent[i, j] for j in range(v)] for i in range(v)]
    m = [[jnp.zeros((), bool) for _ in range(v)] for _ in range(v)]
    m[v // 2][v - 1] = jnp.ones((), bool)
    for j in reversed(range(v)):
        for i in range(v - 1):  # left to right
            see = m[i][j] & t[i][j]
            m[i + 1][j] = m[i + 1][j] | see
            if j > 0:
                m[i + 1][j - 1] = m[i + 1][j - 1] | see
                m[i][j - 1] = m[i][j - 1] | see
        for i in reversed(range(1, v)):  # right to left
            see = m[i][j] & t[i][j]
            m[i - 1][j] = m[i - 1][j] | see
            if j > 0:
                m[i - 1][j - 1] = m[i - 1][j - 1] | see
                m[i][j - 1] = m[i][j - 1] | see
    return jnp.stack([jnp.stack(col) for col in m])


@struct.dataclass
class EnvState(environment.EnvState):
    agent_pos: jax.Array  # int32 [2], (x, y)
    agent_dir: jax.Array  # int32 [], index into DIR_TO_VEC
    obj_pos: jax.Array  # int32 [objects, 2]; object i belongs to category i // (objects per category)
    w: jax.Array  # float32 [NUM_CATEGORIES], the task of this episode


@struct.dataclass
class EnvParams(environment.EnvParams):
    max_steps_in_episode: int = MAX_STEPS
    # Each reset draws the episode's task uniformly from these rows.
    tasks: jax.Array = struct.field(default_factory=lambda: jnp.asarray(TRAIN_TASKS))


class Observation(NamedTuple):
    image: jax.Array  # uint8: RGB [V*tile, V*tile, 3] or symbolic [V, V, 3] (indexed [x, y, channel])
    w: jax.Array  # float32 [NUM_CATEGORIES], as the agent sees it


def make_params(tasks=TRAIN_TASKS, max_steps_in_episode: int = MAX_STEPS) -> EnvParams:
    """EnvParams with validated tasks (one task vector, or a [n, 4] set drawn from at each reset)."""
    tasks = np.asarray(tasks, np.float32)
    if tasks.ndim == 1:
        tasks = tasks[None]
    require(
        tasks.ndim == 2 and tasks.shape[1] == NUM_CATEGORIES and tasks.shape[0] >= 1,
        f"a task vector must have {NUM_CATEGORIES} weights (one per object category), got shape "
        f"{tuple(np.asarray(tasks).shape)}; pass e.g. [1, -1, 0, 0.5]",
    )
    require(max_steps_in_episode >= 1, f"max_steps_in_episode must be positive, got {max_steps_in_episode}")
    return EnvParams(max_steps_in_episode=int(max_steps_in_episode), tasks=jnp.asarray(tasks))


class GotoAvoid(environment.Environment[EnvState, EnvParams]):
    """The GotoAvoid room as a gymnax environment (see the module docstring for the rules).

    `step` follows gymnax >= 1.0 (`obs, state, reward, terminated, truncated, info`) and auto-resets on the same
    step. It renders one observation per step (after the reset), so `info` has no `final_observation`: the
    episode only ends by truncation, and the learners here mask targets across it. `info["phi"]` is the cumulant
    of the transition and `info["respawn_u"]` the uniform number that chose a respawn cell (for replaying it).
    """

    def __init__(
        self,
        obs_mode: str = "rgb",
        view_size: int = 5,
        tile_size: int = 8,
        truncate_task_input: bool = False,
        grid_size: int = ROOM_SIZE,
        objects_per_category: int = OBJECTS_PER_CATEGORY,
        episode_steps: int = MAX_STEPS,
    ):
        """grid_size: the room's side, walls included (the paper's room: 10, 8 x 8 walkable); episode_steps: the time
        limit."""
        require(obs_mode in OBS_MODES, f"unknown observation mode {obs_mode!r}; use one of {OBS_MODES}")
        require(
            isinstance(view_size, int) and view_size >= 3 and view_size % 2 == 1,
            f"view size must be an odd integer >= 3 (minigrid's rule), got {view_size!r}",
        )
        require(isinstance(tile_size, int) and tile_size > 0, f"tile size must be positive, got {tile_size!r}")
        check_room(grid_size, objects_per_category, episode_steps)
        self.grid_size, self.objects_per_category, self.episode_steps = grid_size, objects_per_category, episode_steps
        self.num_objects = NUM_CATEGORIES * objects_per_category
        self.obs_mode = obs_mode
        self.view_size = view_size
        self.tile_size = tile_size
        # The original fed int32(w) to the agent (so 0.5 became 0) while paying float w; off by default.
        self.truncate_task_input = truncate_task_input
        encoding, tiles = _tables(tile_size)
        self._encoding = encoding
        self._tiles = tiles
        self._visibility = visibility_table(view_size, grid_size)

    def make_params(self, tasks=TRAIN_TASKS) -> EnvParams:
        """EnvParams of this room's episodes with validated tasks (one task vector, or a [n, 4] set drawn from at
        each reset)."""
        return make_params(tasks, self.episode_steps)

    def task_params(self, w: jax.Array) -> EnvParams:
        """EnvParams of this room's episodes of the one task w [4], inside a jitted program (w may be traced: not
        checked, as make_params checks)."""
        return EnvParams(max_steps_in_episode=self.episode_steps, tasks=jnp.asarray(w, jnp.float32)[None])

    # ----------------------------------------------------------------------------------------------- gymnax API
    @property
    def default_params(self) -> EnvParams:
        return self.make_params()

    @property
    def name(self) -> str:
        return "GotoAvoid"

    @property
    def num_actions(self) -> int:
        return NUM_ACTIONS

    def action_space(self, params: EnvParams | None = None) -> spaces.Discrete:
        return spaces.Discrete(NUM_ACTIONS)

    @property
    def image_shape(self) -> tuple[int, int, int]:
        v = self.view_size
        return (v * self.tile_size, v * self.tile_size, 3) if self.obs_mode == "rgb" else (v, v, 3)

    def observation_space(self, params: EnvParams | None = None) -> spaces.Dict:
        return spaces.Dict(
            {
                "image": spaces.Box(0, 255, self.image_shape, jnp.uint8),
                "w": spaces.Box(-jnp.inf, jnp.inf, (NUM_CATEGORIES,), jnp.float32),
            }
        )

    def reset_env(self, key: jax.Array, params: EnvParams) -> tuple[Observation, EnvState]:
        state = self.initial_state(key, params)
        return self.observe(state), state

    def step_env(self, key, state, action, params):
        state, reward, info = self.transition(key, state, action, params)
        return self.observe(state), state, reward, jnp.zeros((), bool), info

    @partial(jax.jit, static_argnames=("self",))
    def step(self, key, state, action, params=None):
        """One step with auto-reset; the observation is rendered once, after the reset (see the class doc)."""
        if params is None:
            params = self.default_params
        key_step, key_reset = jax.random.split(key)
        stepped, reward, info = self.transition(key_step, state, action, params)
        truncated = self.is_truncated(stepped, params)
        state = self.reset_where(key_reset, stepped, truncated, params)
        terminated = jnp.zeros((), bool)
        # the view the action led to, before any reset: what a learner that treats the time limit as a termination
        # needs for its last transition (under jit it costs nothing where unused)
        info = {**info, "terminated": terminated, "truncated": truncated, "final_image": self.observe(stepped).image}
        return self.observe(state), state, reward, terminated, truncated, info

    def is_terminated(self, state: EnvState, params: EnvParams) -> jax.Array:
        return jnp.zeros((), bool)

    # ------------------------------------------------------------------------------------------------- dynamics
    def initial_state(self, key: jax.Array, params: EnvParams) -> EnvState:
        """A new episode: a valid layout (see the module doc) and a task drawn from params.tasks."""
        blank = EnvState(
            time=jnp.zeros((), jnp.int32),
            agent_pos=jnp.zeros(2, jnp.int32),
            agent_dir=jnp.zeros((), jnp.int32),
            obj_pos=jnp.zeros((self.num_objects, 2), jnp.int32),
            w=jnp.zeros(NUM_CATEGORIES, jnp.float32),
        )
        return self.reset_where(key, blank, jnp.ones((), bool), params)

    def reset_where(self, key: jax.Array, state: EnvState, reset: jax.Array, params: EnvParams) -> EnvState:
        """`state` with a new episode where `reset` is true.

        Layouts are drawn inside a while_loop that runs while the env still needs one: under vmap the loop stops
        as soon as no env in the batch needs a layout, so steps on which no env resets pay nothing for it.
        """
        interior, n = interior_cells(self.grid_size), self.num_objects

        def draw(k):
            k_cells, k_dir, k_task = jax.random.split(k, 3)
            order = jax.random.permutation(k_cells, len(interior))[: n + 1]
            cells = jnp.asarray(interior)[order]
            w = params.tasks[jax.random.randint(k_task, (), 0, params.tasks.shape[0])].astype(jnp.float32)
            return cells[n], jax.random.randint(k_dir, (), 0, 4), cells[:n], w

        def redraw(carry):
            k, _, _ = carry
            k, sub = jax.random.split(k)
            episode = draw(sub)
            return k, episode, ~layout_is_valid(*episode[:3], grid_size=self.grid_size)

        episode = (state.agent_pos, state.agent_dir, state.obj_pos, state.w)
        _, (agent_pos, agent_dir, obj_pos, w), _ = jax.lax.while_loop(lambda c: c[2], redraw, (key, episode, reset))
        return EnvState(
            time=jnp.where(reset, 0, state.time).astype(jnp.int32),
            agent_pos=agent_pos.astype(jnp.int32),
            agent_dir=agent_dir.astype(jnp.int32),
            obj_pos=obj_pos.astype(jnp.int32),
            w=w,
        )

    def transition(self, key: jax.Array, state: EnvState, action, params: EnvParams):
        """Apply one action (no reset). Returns (state, reward, info with phi and respawn_u)."""
        vec = jnp.asarray(DIR_TO_VEC)
        front = state.agent_pos + vec[state.agent_dir]
        grid = world_grid(state.obj_pos, self.grid_size)
        front_code = grid[front[0], front[1]]

        agent_dir = jnp.where(
            action == LEFT, (state.agent_dir + 3) % 4, jnp.where(action == RIGHT, (state.agent_dir + 1) % 4, state.agent_dir)
        )
        moves = (action == FORWARD) & (front_code == EMPTY)
        agent_pos = jnp.where(moves, front, state.agent_pos)

        picked = (action == PICKUP) & jnp.all(state.obj_pos == front, axis=-1)  # [objects], at most one True
        category = jnp.asarray(object_categories(self.num_objects))[jnp.argmax(picked)]
        phi = jax.nn.one_hot(category, NUM_CATEGORIES) * picked.any()
        reward = jnp.sum(phi * state.w)

        u = jax.random.uniform(key)
        cell = respawn_cell(grid.at[front[0], front[1]].set(EMPTY), state.agent_pos, u)
        obj_pos = jnp.where(picked[:, None], cell, state.obj_pos)

        state = state.replace(time=state.time + 1, agent_pos=agent_pos, agent_dir=agent_dir, obj_pos=obj_pos)
        return state, reward, {"phi": phi, "respawn_u": u}

    # ------------------------------------------------------------------------------------------------ rendering
    def view_cells(self, state: EnvState) -> jax.Array:
        """Cell codes of the agent's view [i, j] (minigrid view coordinates), walls outside the room."""
        x, y = view_coords(state.agent_pos, state.agent_dir, self.view_size)
        return cell_codes(x, y, state.obj_pos, self.grid_size)

    def observe(self, state: EnvState) -> Observation:
        codes = self.view_cells(state)
        visible = jnp.asarray(self._visibility)[state.agent_pos[0], state.agent_pos[1], state.agent_dir]
        index = jnp.where(visible, codes + 1, 0)  # 0 = unseen, else cell code + 1
        image = jnp.asarray(self._encoding)[index] if self.obs_mode == "symbolic" else self._render(index)
        w = jnp.trunc(state.w) if self.truncate_task_input else state.w
        return Observation(image=image, w=w)

    def _render(self, index: jax.Array) -> jax.Array:
        """RGB image of a view given as encoding-table indices [x, y] (see `_tables`)."""
        v, ts = self.view_size, self.tile_size
        index = index.at[v // 2, v - 1].set(len(self._tiles) - 1)  # the agent's own cell
        # Picking tiles with a one-hot product is exact (one nonzero term) and much faster on CPU than a gather.
        one_hot = (index.T[..., None] == jnp.arange(len(self._tiles))).astype(jnp.uint8)  # [y, x, tile]
        tiles = jnp.dot(one_hot, jnp.asarray(self._tiles).reshape(len(self._tiles), -1), preferred_element_type=jnp.uint8)
        return tiles.reshape(v, v, ts, ts, 3).transpose(0, 2, 1, 3, 4).reshape(v * ts, v * ts, 3)

    def rgb_from_symbolic(self, image: jax.Array) -> jax.Array:
        """The RGB observation of a symbolic one: lets replay store 75-byte views and render them in the learner."""
        matches = jnp.all(image[..., None, :] == jnp.asarray(self._encoding), axis=-1)  # [x, y, table entry]
        return self._render(jnp.argmax(matches, axis=-1))


def view_coords(agent_pos: jax.Array, agent_dir: jax.Array, v: int) -> tuple[jax.Array, jax.Array]:
    """World (x, y) of each view cell [i, j]; the agent is at view cell (v // 2, v - 1) looking toward j = 0."""
    fwd = jnp.asarray(DIR_TO_VEC)[agent_dir]
    right = jnp.stack([-fwd[1], fwd[0]])
    i = jnp.arange(v)[:, None]
    j = jnp.arange(v)[None, :]
    x = agent_pos[0] + (v - 1 - j) * fwd[0] + (i - v // 2) * right[0]
    y = agent_pos[1] + (v - 1 - j) * fwd[1] + (i - v // 2) * right[1]
    return x, y


def cell_codes(x: jax.Array, y: jax.Array, obj_pos: jax.Array, grid_size: int = ROOM_SIZE) -> jax.Array:
    """Cell code at world coordinates (x, y): WALL outside the interior, else the object there or EMPTY."""
    inside = (x >= 1) & (x <= grid_size - 2) & (y >= 1) & (y <= grid_size - 2)
    here = (x[..., None] == obj_pos[:, 0]) & (y[..., None] == obj_pos[:, 1])
    code = jnp.max(jnp.where(here, OBJECT + jnp.asarray(object_categories(obj_pos.shape[0])), EMPTY), -1)
    return jnp.where(inside, code, WALL)


def visibility_table(view_size: int, grid_size: int = ROOM_SIZE) -> np.ndarray:
    """minigrid's visibility mask [V, V] for every agent pose [x, y, dir] in the room.

    Only walls occlude in minigrid (keys, balls and boxes do not), and the walls of this room never move, so what
    the agent can see depends on its pose alone: computing it once saves the per-step occlusion pass. A variant
    with moving occluders would call `visibility` in `observe` instead.
    """
    assert all(obj.see_behind() for obj in _minigrid_objects()), "an object category occludes: use per-step visibility"
    xs, ys, ds = np.meshgrid(np.arange(grid_size), np.arange(grid_size), np.arange(4), indexing="ij")

    def pose_mask(x, y, d):
        vx, vy = view_coords(jnp.stack([x, y]), d, view_size)
        return visibility(cell_codes(vx, vy, jnp.full((NUM_CATEGORIES, 2), -1), grid_size) != WALL)

    masks = jax.jit(jax.vmap(pose_mask))(xs.ravel(), ys.ravel(), ds.ravel())
    return np.asarray(masks).reshape(grid_size, grid_size, 4, view_size, view_size)


def respawn_cell(grid: jax.Array, agent_pos: jax.Array, u: jax.Array) -> jax.Array:
    """The empty cell at Manhattan distance >= 2 from the agent chosen by u (see module doc)."""
    xs = jnp.arange(grid.shape[0])
    dist = jnp.abs(xs[:, None] - agent_pos[0]) + jnp.abs(xs[None, :] - agent_pos[1])
    candidates = ((grid == EMPTY) & (dist >= RESPAWN_MIN_DISTANCE)).T.astype(jnp.int32)  # [y, x]: row-major
    per_row = candidates.sum(1)
    through_row = jnp.cumsum(per_row)
    n = through_row[-1]
    k = jnp.minimum(jnp.floor(u * n.astype(jnp.float32)).astype(jnp.int32), n - 1)
    # Two short cumsums (rows, then within the row) are much cheaper on CPU than one over all the cells.
    y = jnp.sum(through_row <= k)
    k_in_row = k - (through_row[y] - per_row[y])
    x = jnp.sum(jnp.cumsum(candidates[y]) <= k_in_row)
    return jnp.stack([x, y]).astype(jnp.int32)


def layout_is_valid(agent_pos: jax.Array, agent_dir: jax.Array, obj_pos: jax.Array,
                    grid_size: int = ROOM_SIZE) -> jax.Array:
    """The agent does not face an object, and every object has a free neighbour the agent can reach."""
    grid = world_grid(obj_pos, grid_size)
    front = agent_pos + jnp.asarray(DIR_TO_VEC)[agent_dir]
    free = grid == EMPTY
    start = jnp.zeros_like(free).at[agent_pos[0], agent_pos[1]].set(True)

    def grow(carry):
        reach, _ = carry
        new = reach | (_shift4(reach, False).any(0) & free)
        return new, jnp.any(new != reach)

    reach, _ = jax.lax.while_loop(lambda c: c[1], grow, (start, jnp.ones((), bool)))
    next_to_reach = _shift4(reach, False).any(0)
    return (grid[front[0], front[1]] < OBJECT) & next_to_reach[obj_pos[:, 0], obj_pos[:, 1]].all()


# ----------------------------------------------------------------------------------------------------- BFS oracle
def bfs_oracle_action(state: EnvState, grid_size: int = ROOM_SIZE) -> jax.Array:
    """Fully observed oracle: walk (objects are obstacles) to the nearest object of positive weight and pick it up.

    Replans every step from a BFS distance map to the free cells next to a positive object.
    """
    vec = jnp.asarray(DIR_TO_VEC)
    grid = world_grid(state.obj_pos, grid_size)
    free = grid == EMPTY
    wanted = (grid >= OBJECT) & (state.w[jnp.clip(grid - OBJECT, 0, NUM_CATEGORIES - 1)] > 0)
    far = grid_size * grid_size
    goal = free & _shift4(wanted, False).any(0)
    dist0 = jnp.where(goal, 0, far)

    def relax(_, d):
        return jnp.where(free, jnp.minimum(d, _shift4(d, far).min(0) + 1), far)

    dist = jax.lax.fori_loop(0, far, relax, dist0)
    pos, d = state.agent_pos, state.agent_dir
    cell = lambda p: (p[0], p[1])  # noqa: E731
    ahead, left = pos + vec[d], pos + vec[(d + 3) % 4]
    here = dist[cell(pos)]
    neighbour_dist = jnp.stack([dist[cell(pos + vec[k])] for k in range(4)])
    step_dir = jnp.argmin(neighbour_dist)
    walk = jnp.where(
        dist[cell(ahead)] < here, FORWARD, jnp.where(step_dir == (d + 3) % 4, LEFT, RIGHT)
    )
    face = jnp.where(wanted[cell(left)], LEFT, RIGHT)
    action = jnp.where(here == 0, face, walk)
    action = jnp.where(here >= far, LEFT, action)  # nothing worth taking is reachable
    return jnp.where(wanted[cell(ahead)], PICKUP, action).astype(jnp.int32)


def policy_returns(policy, tasks=TEST_TASKS, num_episodes: int = 100, seed: int = 0, env: GotoAvoid | None = None):
    """Mean and standard error of the episode return of `policy(key, state) -> action` for each task, in `env`'s room
    (default: the paper's)."""
    require(num_episodes >= 2, f"num_episodes must be at least 2 to give a standard error, got {num_episodes}")
    env = env or GotoAvoid(obs_mode="symbolic")
    tasks = np.asarray(env.make_params(tasks).tasks)

    def episode_return(key, w):
        params = env.task_params(w)
        key_reset, key_steps = jax.random.split(key)
        _, state = env.reset(key_reset, params)

        def step(state, key):
            key_act, key_env = jax.random.split(key)
            _, state, reward, _, _, _ = env.step(key_env, state, policy(key_act, state), params)
            return state, reward

        _, rewards = jax.lax.scan(step, state, jax.random.split(key_steps, params.max_steps_in_episode))
        return rewards.sum()

    keys = jax.random.split(jax.random.PRNGKey(seed), (len(tasks), num_episodes))
    returns = np.asarray(jax.jit(jax.vmap(jax.vmap(episode_return, (0, None))))(keys, jnp.asarray(tasks)))
    return returns.mean(1), returns.std(1, ddof=1) / np.sqrt(num_episodes)


def bfs_oracle_returns(tasks=TEST_TASKS, num_episodes: int = 100, seed: int = 0, env: GotoAvoid | None = None):
    """The paper's "BFS State Oracle" reference: mean and standard error of its return per task."""
    env = env or GotoAvoid(obs_mode="symbolic")
    return policy_returns(lambda key, state: bfs_oracle_action(state, env.grid_size), tasks, num_episodes, seed, env)


def random_policy_returns(tasks=TEST_TASKS, num_episodes: int = 100, seed: int = 0, env: GotoAvoid | None = None):
    """Uniformly random actions: mean and standard error of the return per task."""
    return policy_returns(lambda key, state: jax.random.randint(key, (), 0, NUM_ACTIONS), tasks, num_episodes, seed,
                          env)


def _print_reference_table(episodes: int = 100, seed: int = 0, grid_size: int = ROOM_SIZE,
                           objects_per_category: int = OBJECTS_PER_CATEGORY, episode_steps: int = MAX_STEPS) -> None:
    """Print the BFS oracle's and a random policy's return for every train and test task (a markdown table)."""
    env = GotoAvoid(obs_mode="symbolic", grid_size=grid_size, objects_per_category=objects_per_category,
                    episode_steps=episode_steps)
    print(f"| split | task | BFS oracle | random policy |  ({episodes} episodes of {episode_steps} steps each, room "
          f"{grid_size}, {objects_per_category} objects per category)")
    print("|---|---|---:|---:|")
    for split, tasks in (("train", TRAIN_TASKS), ("test", TEST_TASKS)):
        oracle, oracle_se = bfs_oracle_returns(tasks, episodes, seed, env)
        rand, rand_se = random_policy_returns(tasks, episodes, seed, env)
        for w, m, se, rm, rse in zip(tasks, oracle, oracle_se, rand, rand_se):
            print(f"| {split} | {format_task(w)} | {m:.2f} ± {se:.2f} | {rm:.2f} ± {rse:.2f} |")


if __name__ == "__main__":
    import tyro

    from common.run import exit_on_config_error

    exit_on_config_error(tyro.cli)(_print_reference_table)
