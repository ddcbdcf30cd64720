"""How a host (C++) env meets the jitted learner: env steps/s of each way of driving Fruitbot, in one run.

    python -m benchmarks.host_env [--num-envs 32] [--steps 300] [--repeats 3]

Prints, for N envs stepped together (medians of the repeats, ratios to the raw env from the same run):
  raw procgen        gym3 act + observe with random actions, nothing else;
  Fruitbot env       common.fruitbot.Fruitbot: the same plus exact sparse cumulants, tasks and lifetimes;
  io_callback        one jitted lax.scan over the steps: the network acts, the env steps through
                     jax.experimental.io_callback inside the same program (the BabyAI scripts' shape);
  host loop          a Python loop around a jitted act (Podracer's Sebulba shape): act, copy to host, step.
Both acting options run the same network (the Impala torso and a linear head, vmapped over the envs) and take
random actions from it, so the envs see the same kind of play in every row.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import tyro
from jax.experimental import io_callback
from procgen import ProcgenGym3Env

from common.fruitbot import IMAGE_SHAPE, NUM_ACTIONS, TASK_DIM, Fruitbot
from common.networks import ImpalaTorso, linear


@dataclass
class Args:
    num_envs: int = 32
    """envs stepped together"""
    steps: int = 300
    """steps of every env per timed call"""
    repeats: int = 3
    """timed calls per figure (the median is reported)"""


class Policy(eqx.Module):
    torso: ImpalaTorso
    head: eqx.nn.Linear

    def __init__(self, key):
        k1, k2 = jax.random.split(key)
        self.torso, self.head = ImpalaTorso(k1), linear(8 * 8 * 32 + TASK_DIM, NUM_ACTIONS, k2)

    def __call__(self, image, w, key):
        q = self.head(jnp.concatenate([self.torso(image).reshape(-1), w]))
        return jnp.where(True, jax.random.randint(key, (), 0, NUM_ACTIONS), jnp.argmax(q))  # random play, net computed


def timed(run, repeats: int) -> float:
    run()  # warm-up (and compilation)
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        run()
        times.append(time.perf_counter() - start)
    return float(np.median(times))


def main(args: Args) -> None:
    n, steps = args.num_envs, args.steps
    rng = np.random.default_rng(0)
    policy = Policy(jax.random.PRNGKey(0))
    act = jax.vmap(policy, (0, 0, 0))

    raw = ProcgenGym3Env(num=n, env_name="fruitbot", distribution_mode="hard", num_levels=200, rand_seed=0)

    def run_raw():
        for _ in range(steps):
            raw.act(rng.integers(0, NUM_ACTIONS, n).astype(np.int32))
            raw.observe()

    env = Fruitbot(n, seed=0)
    obs = env.reset()

    def run_env():
        for _ in range(steps):
            env.step(rng.integers(0, NUM_ACTIONS, n))

    def host_step(actions):
        o, reward, terminated, truncated, info = env.step(np.asarray(actions))
        return o["image"], o["w"], reward, terminated | truncated

    shapes = (jax.ShapeDtypeStruct((n,) + IMAGE_SHAPE, jnp.uint8), jax.ShapeDtypeStruct((n, TASK_DIM), jnp.float32),
              jax.ShapeDtypeStruct((n,), jnp.float32), jax.ShapeDtypeStruct((n,), jnp.bool_))

    @jax.jit
    def scan_steps(image, w, key):
        def body(carry, key):
            image, w = carry
            actions = act(image, w, jax.random.split(key, n))
            image, w, reward, done = io_callback(host_step, shapes, actions)
            return (image, w), reward.sum()
        (image, w), rewards = jax.lax.scan(body, (image, w), jax.random.split(key, steps))
        return image, w, rewards.sum()

    state = {"image": jnp.asarray(obs["image"]), "w": jnp.asarray(obs["w"]), "key": jax.random.PRNGKey(1)}

    def run_io():
        state["key"], key = jax.random.split(state["key"])
        image, w, total = scan_steps(state["image"], state["w"], key)
        total.block_until_ready()
        state["image"], state["w"] = image, w

    jit_act = jax.jit(act)

    def run_host():
        o = {"image": np.asarray(state["image"]), "w": np.asarray(state["w"])}
        for _ in range(steps):
            state["key"], key = jax.random.split(state["key"])
            actions = np.asarray(jit_act(o["image"], o["w"], jax.random.split(key, n)))
            o, *_ = env.step(actions)

    print(f"jax {jax.__version__} on {jax.devices()[0].device_kind}; {n} envs x {steps} steps per call, median of "
          f"{args.repeats}; Fruitbot hard")
    rows = [("raw procgen", run_raw), ("Fruitbot env (sparse cumulants)", run_env), ("io_callback in a jitted scan", run_io),
            ("host loop around a jitted act", run_host)]
    base = None
    for name, run in rows:
        sps = n * steps / timed(run, args.repeats)
        base = base or sps
        print(f"  {name:34s} {sps:9,.0f} env steps/s  = {sps / base:5.2f} x raw")
    print(f"  cumulant reads: get_state on {env.stats['state_reads'] / env.stats['steps']:.1%} of env steps, "
          f"replays on {env.stats['replays'] / env.stats['steps']:.2%}")


if __name__ == "__main__":
    main(tyro.cli(Args))
