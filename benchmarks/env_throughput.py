"""Env steps/s of the jitted, vmapped JAX GotoAvoid against its minigrid twin, in one run on one machine.

Random actions, auto-reset included. The JAX figure times `lax.scan` over `--steps` steps of `vmap(env.step)` and
reduces every observation to a checksum so nothing is optimised away. Each figure is the median of `--repeats`.

    python -m benchmarks.env_throughput
"""

from __future__ import annotations

import os

# One XLA CPU device per core, so the envs can also be sharded across the cores (the `pmap` rows); the plain
# rows use one device. Must be set before jax is imported.
os.environ.setdefault("XLA_FLAGS", f"--xla_force_host_platform_device_count={os.cpu_count()}")

import time
from dataclasses import dataclass

import jax
import jax.numpy as jnp
import numpy as np
import tyro

from common.babyai import NUM_ACTIONS, GotoAvoid
from common.minigrid_twin import GotoAvoidMiniGrid
from common.run import exit_on_config_error, require


@dataclass
class Args:
    batch_sizes: tuple[int, ...] = (1, 64, 256, 1024, 4096)
    """numbers of vmapped JAX envs"""
    env_steps: int = 500_000
    """env steps (over all envs) per timed JAX call; each env runs env_steps // envs steps, clipped to [100, 2000]"""
    twin_steps: int = 4000
    """steps per timed run of the minigrid twin"""
    repeats: int = 5
    """timed repetitions; the median is reported"""
    seed: int = 0


def jax_steps_per_second(mode: str, num_envs: int, steps: int, repeats: int, seed: int, devices: int = 1) -> float:
    """Steps/s of `num_envs` vmapped envs; with devices > 1, that many such batches run under pmap, one per core."""
    env = GotoAvoid(obs_mode=mode)
    params = env.default_params

    def run(key):
        key_reset, key_run = jax.random.split(key)
        _, state = jax.vmap(env.reset, (0, None))(jax.random.split(key_reset, num_envs), params)

        def step(carry, key):
            state, checksum = carry
            key_act, key_env = jax.random.split(key)
            action = jax.random.randint(key_act, (num_envs,), 0, NUM_ACTIONS)
            obs, state, reward, _, _, _ = jax.vmap(env.step, (0, 0, 0, None))(
                jax.random.split(key_env, num_envs), state, action, params
            )
            return (state, checksum + obs.image.sum(dtype=jnp.int32) + reward.sum().astype(jnp.int32)), None

        (_, checksum), _ = jax.lax.scan(step, (state, jnp.zeros((), jnp.int32)), jax.random.split(key_run, steps))
        return checksum

    run = jax.jit(run) if devices == 1 else jax.pmap(run, devices=jax.devices()[:devices])
    split = (lambda k: k) if devices == 1 else (lambda k: jax.random.split(k, devices))
    key = jax.random.PRNGKey(seed)
    run(split(key)).block_until_ready()  # compile
    times = []
    for _ in range(repeats):
        key, sub = jax.random.split(key)
        start = time.perf_counter()
        run(split(sub)).block_until_ready()
        times.append(time.perf_counter() - start)
    return devices * num_envs * steps / float(np.median(times))


def twin_steps_per_second(mode: str, steps: int, repeats: int, seed: int) -> float:
    env = GotoAvoidMiniGrid(obs_mode=mode)
    rng = np.random.default_rng(seed)
    env.reset(seed=seed)
    times = []
    for _ in range(repeats):
        actions = rng.integers(0, NUM_ACTIONS, steps)
        start = time.perf_counter()
        for a in actions:
            _, _, terminated, truncated, _ = env.step(int(a))
            if terminated or truncated:
                env.reset()
        times.append(time.perf_counter() - start)
    return steps / float(np.median(times))


@exit_on_config_error
def main(args: Args) -> None:
    require(all(b > 0 for b in args.batch_sizes), f"batch sizes must be positive, got {args.batch_sizes}")
    require(args.env_steps > 0 and args.twin_steps > 0 and args.repeats > 0, "env-steps, twin-steps and repeats must be positive")
    print(f"jax {jax.__version__} on {jax.local_device_count()} x {jax.devices()[0].device_kind}; median of {args.repeats} runs\n")
    print("| obs | implementation | envs | steps/s | × twin |")
    print("|---|---|---:|---:|---:|")
    for mode in ("rgb", "symbolic"):
        twin = twin_steps_per_second(mode, args.twin_steps, args.repeats, args.seed)
        print(f"| {mode} | minigrid twin | 1 | {twin:,.0f} | 1.0 |", flush=True)
        for b in args.batch_sizes:
            steps = min(max(args.env_steps // b, 100), 2000)
            sps = jax_steps_per_second(mode, b, steps, args.repeats, args.seed)
            print(f"| {mode} | JAX, jit + vmap | {b} | {sps:,.0f} | {sps / twin:,.1f} |", flush=True)
        n = jax.local_device_count()
        if n > 1:
            for b in args.batch_sizes:
                if b % n == 0 and b >= 64:
                    steps = min(max(args.env_steps // b, 100), 2000)
                    sps = jax_steps_per_second(mode, b // n, steps, args.repeats, args.seed, devices=n)
                    print(f"| {mode} | JAX, vmap, pmap over {n} cores | {b} | {sps:,.0f} | {sps / twin:,.1f} |", flush=True)


if __name__ == "__main__":
    main(tyro.cli(Args))
