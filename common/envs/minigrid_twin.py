"""GotoAvoid as a minigrid environment: the reference common/envs/babyai.py's JAX env is tested against
(tests/test_babyai_equivalence.py) and timed against (benchmarks/env_throughput.py).

Kept apart from common/envs/babyai.py because importing minigrid imports pygame (12 MB): the training scripts import
common.envs.babyai for every env, and an install for Fruitbot or MiniHack alone then needs them only for BabyAI itself.
"""

from __future__ import annotations

import numpy as np
from minigrid.minigrid_env import MiniGridEnv

from common.envs.babyai import (CATEGORY_KINDS, DIR_TO_VEC, FORWARD, LEFT, MAX_STEPS, NUM_ACTIONS, NUM_CATEGORIES,
                                OBJECTS_PER_CATEGORY, OBS_MODES, RESPAWN_MIN_DISTANCE, RIGHT, ROOM_SIZE, TRAIN_TASKS,
                                _minigrid_objects, check_room, make_params)
from common.run import require


class GotoAvoidMiniGrid(MiniGridEnv):
    """GotoAvoid as a minigrid environment: the reference the JAX env is tested against, usable on its own, in the
    paper's room or another (grid_size with walls, objects_per_category, max_steps: GotoAvoid's sizes).

    Observations are dicts {"image", "w"} (RGB from minigrid's POV render, or `gen_obs()["image"]`), `info["phi"]`
    is the transition's cumulant. `reset(options={"layout": (agent_pos, agent_dir, obj_pos), "w": w})` forces a
    layout and task; set `respawn_uniform` to a function returning u in [0, 1) to replay given respawns.
    """

    def __init__(
        self,
        tasks=TRAIN_TASKS,
        obs_mode: str = "rgb",
        view_size: int = 5,
        tile_size: int = 8,
        truncate_task_input: bool = False,
        max_steps: int = MAX_STEPS,
        render_mode: str | None = None,
        grid_size: int = ROOM_SIZE,
        objects_per_category: int = OBJECTS_PER_CATEGORY,
    ):
        import gymnasium
        from minigrid.core.mission import MissionSpace

        require(obs_mode in OBS_MODES, f"unknown observation mode {obs_mode!r}; use one of {OBS_MODES}")
        require(
            isinstance(view_size, int) and view_size >= 3 and view_size % 2 == 1,
            f"view size must be an odd integer >= 3 (minigrid's rule), got {view_size!r}",
        )
        check_room(grid_size, objects_per_category, max_steps)
        self.objects_per_category = objects_per_category
        self.tasks = np.asarray(make_params(tasks, max_steps).tasks)
        self.obs_mode = obs_mode
        self.obs_tile_size = tile_size
        self.truncate_task_input = truncate_task_input
        self.respawn_uniform = None
        self.w = self.tasks[0]
        self._forced = {}
        super().__init__(
            mission_space=MissionSpace(mission_func=lambda: "pick up the objects the task rewards"),
            grid_size=grid_size,
            max_steps=max_steps,
            see_through_walls=False,
            agent_view_size=view_size,
            render_mode=render_mode,
        )
        self.action_space = gymnasium.spaces.Discrete(NUM_ACTIONS)
        shape = (view_size * tile_size, view_size * tile_size, 3) if obs_mode == "rgb" else (view_size, view_size, 3)
        self.observation_space = gymnasium.spaces.Dict(
            {
                "image": gymnasium.spaces.Box(0, 255, shape, np.uint8),
                "w": gymnasium.spaces.Box(-np.inf, np.inf, (NUM_CATEGORIES,), np.float32),
            }
        )

    def reset(self, *, seed=None, options=None):
        self._forced = dict(options or {})
        return super().reset(seed=seed)

    def _gen_grid(self, width, height):
        from minigrid.core.grid import Grid

        forced_w = self._forced.get("w")
        if forced_w is not None:
            self.w = np.asarray(make_params(forced_w).tasks[0])
        else:
            self.w = self.tasks[self.np_random.integers(len(self.tasks))]
        layout = self._forced.get("layout")
        while True:
            self.grid = Grid(width, height)
            self.grid.wall_rect(0, 0, width, height)
            objects = [obj for obj in _minigrid_objects() for _ in range(self.objects_per_category)]
            objects = [type(o)(o.color) for o in objects]  # distinct instances
            if layout is not None:
                agent_pos, agent_dir, obj_pos = (np.asarray(a) for a in layout)
                for obj, (x, y) in zip(objects, obj_pos):
                    self.put_obj(obj, int(x), int(y))
                self.agent_pos, self.agent_dir = (int(agent_pos[0]), int(agent_pos[1])), int(agent_dir)
                return
            for obj in objects:
                self.place_obj(obj)
            self.place_agent()
            if self._layout_is_valid(objects):
                return

    def _layout_is_valid(self, objects) -> bool:
        front = self.grid.get(*self.front_pos)
        if front is not None and front.type != "wall":
            return False
        reached, frontier = {tuple(self.agent_pos)}, [tuple(self.agent_pos)]
        while frontier:
            x, y = frontier.pop()
            for dx, dy in DIR_TO_VEC:
                cell = (x + int(dx), y + int(dy))
                if cell not in reached and self.grid.get(*cell) is None:
                    reached.add(cell)
                    frontier.append(cell)
        return all(
            any((o.cur_pos[0] + int(dx), o.cur_pos[1] + int(dy)) in reached for dx, dy in DIR_TO_VEC)
            for o in objects
        )

    def step(self, action):
        if action not in range(NUM_ACTIONS):
            raise ValueError(f"action must be one of 0..{NUM_ACTIONS - 1} (left, right, forward, pickup), got {action!r}")
        self.step_count += 1
        reward = np.float32(0.0)
        phi = np.zeros(NUM_CATEGORIES, np.float32)
        u = None
        fwd_pos = self.front_pos
        fwd_cell = self.grid.get(*fwd_pos)
        if action == LEFT:
            self.agent_dir = (self.agent_dir - 1) % 4
        elif action == RIGHT:
            self.agent_dir = (self.agent_dir + 1) % 4
        elif action == FORWARD:
            if fwd_cell is None or fwd_cell.can_overlap():
                self.agent_pos = tuple(int(c) for c in fwd_pos)
        elif fwd_cell is not None and fwd_cell.can_pickup():
            k = CATEGORY_KINDS.index((fwd_cell.type, fwd_cell.color))
            phi[k] = 1.0
            reward = np.float32(self.w[k])
            self.grid.set(*fwd_pos, None)
            u = self._respawn(fwd_cell)
        truncated = self.step_count >= self.max_steps
        return self.gen_obs(), float(reward), False, truncated, {"phi": phi, "respawn_u": u}

    min_respawn_distance = RESPAWN_MIN_DISTANCE

    def _respawn(self, obj) -> float:
        """Put obj back at the k-th empty cell (row-major) at Manhattan distance >= 2, k = floor(u * n)."""
        u = np.float32(self.respawn_uniform() if self.respawn_uniform is not None else self.np_random.random())
        ax, ay = self.agent_pos
        candidates = [
            (x, y)
            for y in range(self.height)
            for x in range(self.width)
            if self.grid.get(x, y) is None and abs(x - ax) + abs(y - ay) >= self.min_respawn_distance
        ]
        n = len(candidates)
        k = min(int(np.floor(u * np.float32(n))), n - 1)
        self.put_obj(obj, *candidates[k])
        return float(u)

    def gen_obs(self):
        if self.obs_mode == "rgb":
            image = self.get_pov_render(self.obs_tile_size)
        else:
            image = super().gen_obs()["image"]
        w = np.trunc(self.w) if self.truncate_task_input else self.w
        return {"image": image, "w": np.asarray(w, np.float32)}
