"""Env steps/s of the jitted, vmapped JAX envs against their reference implementations, in one run on one machine.

BabyAI (`--env babyai`): JAX GotoAvoid against its minigrid twin. Fruitbot (`--env fruitbot`): common/envs/fruitbot_jax.py
(frames included) against raw procgen (ProcgenGym3Env, its own threads, timed in its own environment) and the procgen host env the scripts used
before (common.envs.fruitbot.Fruitbot: cumulants read from procgen's state), and the env's share of msfa_fruitbot.py's
jitted training iteration (the iteration's time against the same env steps alone).

Random actions, auto-reset included. The JAX figure times `lax.scan` over the steps of `vmap(env.step)` and reduces
every observation to a checksum so nothing is optimised away. Each figure is the median of `--repeats`.

    python -m benchmarks.env_throughput                       # BabyAI
    python -m benchmarks.env_throughput --env fruitbot --batch-sizes 32 256
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

from common.envs.babyai import NUM_ACTIONS, GotoAvoid
from common.envs.fruitbot import JAX_GAMES
from common.envs.minigrid_twin import GotoAvoidMiniGrid
from common.run import exit_on_config_error, require


@dataclass
class Args:
    env: str = "babyai"
    """babyai or fruitbot"""
    batch_sizes: tuple[int, ...] = (1, 64, 256, 1024, 4096)
    """numbers of vmapped JAX envs"""
    env_steps: int = 500_000
    """env steps (over all envs) per timed JAX call; each env runs env_steps // envs steps, clipped to [100, 2000]"""
    twin_steps: int = 4000
    """steps per timed run of the minigrid twin"""
    repeats: int = 5
    """timed repetitions; the median is reported"""
    seed: int = 0
    training_share: bool = True
    """Fruitbot: also time msfa_fruitbot.py's training iteration against the same env steps alone"""


def jax_steps_per_second(mode: str, num_envs: int, steps: int, repeats: int, seed: int, devices: int = 1) -> float:
    """Steps/s of `num_envs` vmapped envs; with devices > 1, that many such batches run under pmap, one per core.
    mode: BabyAI's "rgb" or "symbolic", or "fruitbot-<config>" (common.envs.fruitbot_jax.CONFIGS)."""
    if mode.startswith("fruitbot-"):
        from common.envs.fruitbot_jax import TRAIN_TASKS, FruitbotJax

        env = FruitbotJax(mode.removeprefix("fruitbot-"))
        params = env.make_params(TRAIN_TASKS, num_levels=200)
        num_actions = env.num_actions
    else:
        env = GotoAvoid(obs_mode=mode)
        params = env.default_params
        num_actions = NUM_ACTIONS

    def run(key):
        key_reset, key_run = jax.random.split(key)
        _, state = jax.vmap(env.reset, (0, None))(jax.random.split(key_reset, num_envs), params)

        def step(carry, key):
            state, checksum = carry
            key_act, key_env = jax.random.split(key)
            action = jax.random.randint(key_act, (num_envs,), 0, num_actions)
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


def procgen_steps_per_second(num_envs: int, steps: int, repeats: int, seed: int, host_env: bool = False) -> float:
    """Raw procgen Fruitbot (hard, random actions, num_threads 2), timed inside procgen's own environment
    (common/envs/procgen_env.py), or with host_env the procgen env the scripts step through io_callback
    (common.envs.fruitbot.Fruitbot: exact cumulants from the game's state; its procgen answers over a pipe)."""
    from common.envs import procgen_env
    from common.envs.fruitbot import Fruitbot

    if not host_env:
        options = dict(num=num_envs, env_name="fruitbot", distribution_mode="hard", num_levels=200, rand_seed=seed,
                       num_threads=2)
        times = procgen_env.server().call("time_random_play", options, steps, repeats, seed)
        return num_envs * steps / float(np.median(times))
    rng = np.random.default_rng(seed)
    env = Fruitbot(num_envs, seed=seed)
    env.reset()
    times = []
    for _ in range(repeats):
        actions = rng.integers(0, 15, (steps, num_envs)).astype(np.int32)
        start = time.perf_counter()
        for a in actions:
            env.step(a)
        times.append(time.perf_counter() - start)
    env.close()
    return num_envs * steps / float(np.median(times))


def training_share(num_envs: int, repeats: int) -> tuple[float, float]:
    """(seconds of one msfa_fruitbot.py training iteration at the paper's network and replay ratio with num_envs
    envs, seconds of the same env steps of the JAX env alone): the env's share of the jitted training loop."""
    import msfa_fruitbot as script

    args = script.Args(num_envs=num_envs, replay_size=200, min_replay_size=64, eval_episodes=1)
    setup = script.make_setup(args, [0])
    actors = jax.tree.map(lambda x: x[None], script.fresh_actors(setup, args, 0, jax.random.PRNGKey(1)))
    state = jax.jit(jax.vmap(lambda k, a: script.init_train_state(setup, args, k, a)))(
        jax.random.PRNGKey(0)[None], actors)
    chunk = script.make_train_chunk(setup, args, 1)
    state, _ = chunk(state)
    jax.block_until_ready(state)  # compiled, and replay past min_replay_size? (not needed: the SGD steps run below)
    while not bool(setup.buffer.can_sample(jax.tree.map(lambda x: x[0], state.buffer))):
        state, _ = chunk(state)
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        state, metrics = chunk(state)
        jax.block_until_ready(metrics)
        times.append(time.perf_counter() - start)
    env_alone = num_envs * args.sequence_period / jax_steps_per_second(
        f"fruitbot-{JAX_GAMES[args.distribution_mode]}", num_envs, args.sequence_period, repeats, 0)
    return float(np.median(times)), env_alone


def fruitbot_rows(args: Args) -> None:
    print("| implementation | envs | steps/s | x raw procgen |")
    print("|---|---:|---:|---:|")
    for b in args.batch_sizes:
        raw = procgen_steps_per_second(b, max(args.twin_steps // b, 20), args.repeats, args.seed)
        print(f"| raw procgen (hard, 2 threads) | {b} | {raw:,.0f} | 1.0 |", flush=True)
        if b <= 64:
            host = procgen_steps_per_second(b, max(args.twin_steps // b, 20), args.repeats, args.seed, True)
            print(f"| procgen host env (common/envs/fruitbot.py) | {b} | {host:,.0f} | {host / raw:.2f} |", flush=True)
        for config in ("paper", "stock-hard"):
            steps = min(max(args.env_steps // b, 100), 2000)
            sps = jax_steps_per_second(f"fruitbot-{config}", b, steps, args.repeats, args.seed)
            print(f"| JAX {config}, jit + vmap | {b} | {sps:,.0f} | {sps / raw:.2f} |", flush=True)
    if not args.training_share:
        return
    iteration, env_alone = training_share(32, args.repeats)
    print(f"\nmsfa_fruitbot.py training iteration (32 envs x 40 steps, 24 SGD steps of batch 8, paper network): "
          f"{iteration * 1e3:,.0f} ms; the same 1,280 env steps alone: {env_alone * 1e3:,.1f} ms "
          f"(the env's share: {env_alone / iteration:.1%})")


@exit_on_config_error
def main(args: Args) -> None:
    require(args.env in ("babyai", "fruitbot"), f"--env must be babyai or fruitbot, got {args.env!r}")
    require(all(b > 0 for b in args.batch_sizes), f"batch sizes must be positive, got {args.batch_sizes}")
    require(args.env_steps > 0 and args.twin_steps > 0 and args.repeats > 0, "env-steps, twin-steps and repeats must be positive")
    print(f"jax {jax.__version__} on {jax.local_device_count()} x {jax.devices()[0].device_kind}; median of {args.repeats} runs\n")
    if args.env == "fruitbot":
        return fruitbot_rows(args)
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
