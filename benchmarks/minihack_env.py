"""MiniHack's observation path: env steps/s of NLE with the paper's pixel_crop against ours, in one run.

    python -m benchmarks.minihack_env [--num-envs 16] [--steps 300] [--repeats 3] [--workers N] [--no-train-loop]

Prints, for N envs of the 4 rooms (5x5) stepped with random actions (medians of the repeats, ratios to the first
row from the same run):
  NLE + pixel_crop    what the original did: MiniHack renders the 144x144 crop from tiles in Python, then
                      cv2.resize to 64x64 on the host;
  NLE, tile crops     common.envs.minihack.MiniHackRooms: NLE asked for glyphs_crop only, mapped to tile indices;
  + render (jit)      the same, plus common.envs.minihack.render drawing every env's 64x64 image in one jitted call
                      (what the network does with each step's crops; bit-identical to the row above's images);
  N worker processes  common.envs.minihack.ParallelRooms: the tile-crop envs split among N processes stepping in
                      parallel (the scripts' --env-workers; default N: this machine's cores);
  training loop       msfa_minihack.py's own jitted chunk: acting through io_callback, replay insertion and SGD
                      at the given replay ratio (paper network sizes).
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import cv2
import gymnasium as gym
import jax
import jax.numpy as jnp
import minihack  # noqa: F401  (registers the MiniHack-* gymnasium ids)
import numpy as np
import tyro

from benchmarks.host_env import timed, train_loop_sps
from common.envs.minihack import (NUM_ACTIONS, TEST_TASKS, TRAIN_TASKS, MiniHackRooms, make_rooms, render, room_id,
                             tile_set)

TASKS = np.concatenate([TRAIN_TASKS, TEST_TASKS])


@dataclass
class Args:
    num_envs: int = 16
    """envs stepped together (4 of each room)"""
    steps: int = 300
    """steps of every env per timed call"""
    repeats: int = 3
    """timed calls per figure (the median is reported)"""
    train_loop: bool = True
    """also time msfa_minihack.py's whole training loop (one iteration per call: slow on a CPU)"""
    samples_per_insert: float = 6.0
    """the training loop's replay ratio (the paper's: 6)"""
    workers: int | None = None
    """worker processes of the parallel row (default: this machine's cores)"""


def main(args: Args) -> None:
    n, steps = args.num_envs, args.steps
    rng = np.random.default_rng(0)
    task_of_env = np.arange(n) % len(TASKS)

    paper = [gym.make(room_id(TASKS[k], "5x5"), observation_keys=("pixel_crop",), penalty_step=0.0).unwrapped
             for k in task_of_env]
    for env in paper:
        env.reset()

    def run_paper():
        for _ in range(steps):
            for env, action in zip(paper, rng.integers(0, NUM_ACTIONS, n)):
                obs, _, done, _, _ = env.step(int(action))
                if done:
                    obs, _ = env.reset()
                cv2.resize(obs["pixel_crop"], (64, 64), interpolation=cv2.INTER_LINEAR)

    ours = MiniHackRooms(n, TASKS, seed=0, task_of_env=task_of_env)
    ours.reset()

    def run_ours():
        for _ in range(steps):
            ours.step(rng.integers(0, NUM_ACTIONS, n))

    images = jnp.asarray(tile_set()[0])
    draw = jax.jit(jax.vmap(render, in_axes=(0, None)))

    def run_ours_rendered():
        for _ in range(steps):
            obs, *_ = ours.step(rng.integers(0, NUM_ACTIONS, n))
            draw(obs["tiles"], images).block_until_ready()

    workers = min(args.workers or os.cpu_count(), n)
    parallel = make_rooms(n, TASKS, workers=workers, seed=0, task_of_env=task_of_env)
    parallel.reset()

    def run_parallel():
        for _ in range(steps):
            parallel.step(rng.integers(0, NUM_ACTIONS, n))

    print(f"jax {jax.__version__} on {jax.devices()[0].device_kind}; {n} envs (4 rooms, 5x5) x {steps} steps per "
          f"call, random actions, median of {args.repeats}; {os.cpu_count()} cores")
    base = None
    for name, run in (("NLE + pixel_crop + cv2.resize", run_paper), ("NLE, tile crops (ours)", run_ours),
                      ("tile crops + jitted render (ours)", run_ours_rendered),
                      (f"tile crops, {workers} worker processes", run_parallel)):
        sps = n * steps / timed(run, args.repeats)
        base = base or sps
        print(f"  {name:34s} {sps:9,.0f} env steps/s  = {sps / base:5.2f} x pixel_crop")
    parallel.close()
    if args.train_loop:
        import msfa_minihack  # a benchmark may import a script; scripts never import each other

        sps = train_loop_sps(msfa_minihack, args)
        print(f"  {'msfa_minihack.py training loop':34s} {sps:9,.0f} env steps/s  = {sps / base:5.2f} x pixel_crop "
              f"({n} envs, replay ratio {args.samples_per_insert:g}, batch 8 x 41)")


if __name__ == "__main__":
    main(tyro.cli(Args))
