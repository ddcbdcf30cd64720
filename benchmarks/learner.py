"""Learner speed at the paper's BabyAI settings, for 1, 5 and 10 vmapped seeds, in one run on one machine.

Prints, per method: the time of one SGD step (8 sequences of 41 steps per seed: online and target unrolls, the
losses, gradient, Adam) for K vmapped seeds, its FLOPs from XLA's cost analysis, the achieved GFLOP/s against the
machine's plain jitted-matmul figure measured in the same run, and what K seeds cost against one; the end-to-end
env steps/s of the jitted training chunk (acting 32 envs x 40 steps, insertion, 24 SGD steps: replay ratio 6); and
the projected wall time of the paper protocol (5M env steps per seed) for 10 seeds. Seeds are spread over the local
devices as the scripts spread them (on this CPU: XLA_FLAGS=--xla_force_host_platform_device_count=2 makes its two
cores two devices). The replay is small (the
paper's 100k sequences change what the memory holds, not the time of a step). Medians of --repeats.

    python -m benchmarks.learner [--method msfa|usfa|usfa-learned|uvfa|uvfa-farm|mvfa|all] [--seeds 1 5 10]
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import tyro

import msfa_babyai
import usfa
import uvfa
from common.networks import Conv2d
from common.run import exit_on_config_error, require, shard_seeds

METHODS = {  # name: (script, its non-default flags)
    "msfa": (msfa_babyai, {}),
    "usfa": (usfa, {}),
    "usfa-learned": (usfa, {"learned_cumulants": True}),
    "uvfa": (uvfa, {}),
    "uvfa-farm": (uvfa, {"farm": True}),
    "mvfa": (uvfa, {"modular": True}),
}
PAPER_STEPS = 5_000_000


@dataclass
class Args:
    method: str = "msfa"
    """msfa, usfa, usfa-learned, uvfa, uvfa-farm, mvfa, or all"""
    seeds: tuple[int, ...] = (1, 5, 10)
    """numbers of vmapped seeds to time"""
    repeats: int = 3
    """timed calls per figure (the median is reported); slow end-to-end calls stop after --max-seconds"""
    max_seconds: float = 30.0
    """time spent on the repeats of one end-to-end figure at most (after one timed call)"""
    replay_size: int = 2_000
    """replay capacity in sequences (small: the step time does not depend on it)"""
    matmul_size: int = 2048
    compare_conv: bool = False
    """time the first method twice in this run: its torso convolutions as plain patches (before), then folded
    space-to-depth (after, the default)"""


def timed(fn, *args, repeats: int, max_seconds: float = float("inf")) -> float:
    """Median wall time of fn(*args) over repeats calls (after one untimed call), each call's result awaited."""
    jax.block_until_ready(fn(*args))
    times, start = [], time.perf_counter()
    while len(times) < repeats and (not times or time.perf_counter() - start < max_seconds):
        t = time.perf_counter()
        jax.block_until_ready(fn(*args))
        times.append(time.perf_counter() - t)
    return float(np.median(times))


def flops_of(jitted, *args) -> float:
    cost = jitted.lower(*args).compile().cost_analysis()
    cost = cost[0] if isinstance(cost, (list, tuple)) else cost
    return float(cost["flops"])


def random_batch(script, args, key):
    """A batch of random sequences (the script's own types) from the network's initial state."""
    b, t = args.batch_size, args.sequence_length
    k = jax.random.split(key, 4)
    fields = dict(
        obs=jax.random.randint(k[0], (b, t, 5, 5, 3), 0, 7).astype(jnp.uint8),
        w=jnp.broadcast_to(jnp.eye(4)[0], (b, t, 4)),
        prev_action=jax.random.randint(k[1], (b, t), 0, 4),
        prev_reward=jnp.zeros((b, t)),
        first=jnp.zeros((b, t), bool).at[:, 0].set(True),
        action=jax.random.randint(k[2], (b, t), 0, 4),
        reward=jax.random.normal(k[3], (b, t)),
        phi=jnp.zeros((b, t, 4)),
        final_obs=jnp.zeros((b, t, 0), jnp.uint8),  # replay keeps no final view under the default settings
        terminal=jnp.zeros((b, t), bool),
    )
    initial = script.make_network(args, jax.random.PRNGKey(0)).core.initial_state()
    return script.Sequence(steps=script.Step(**{f: fields[f] for f in script.Step._fields}),
                           state=jax.tree.map(lambda x: jnp.broadcast_to(x, (b,) + x.shape), initial))


def bench_method(name: str, bench: Args, matmul_gflops: float) -> dict:
    script, flags = METHODS[name]
    args = script.Args(**flags, replay_size=bench.replay_size, min_replay_size=32)
    setup = script.make_setup(args)
    print(f"\n{script.method_name(args)} (batch {args.batch_size} x {args.sequence_length} steps per seed, "
          f"{args.num_envs} envs, {script.sgd_steps_per_iteration(args)} SGD steps per "
          f"{script.steps_per_iteration(args)} env steps)")

    def update(params, opt_state, target_params, batch, probabilities):
        def loss(params):
            return script.batch_loss(eqx.combine(params, setup.static), eqx.combine(target_params, setup.static),
                                     setup.env.rgb_from_symbolic, batch, probabilities, args)

        grads, (priorities, _) = jax.grad(loss, has_aux=True)(params)
        updates, opt_state = setup.optimizer.update(grads, opt_state, params)
        return eqx.apply_updates(params, updates), opt_state, priorities

    sgd_update = jax.jit(jax.vmap(update))
    chunk = script.make_train_chunk(setup, args, 1)
    out = {"sgd_ms": {}, "sps": {}}
    for k in bench.seeds:
        keys = jnp.stack([jax.random.PRNGKey(s) for s in range(k)])
        state = jax.vmap(lambda key: script.init_train_state(setup, args, key))(keys)
        batch = jax.vmap(lambda key: random_batch(script, args, key))(keys)
        state = shard_seeds(state, k)  # seeds over the local devices, as the scripts do
        inputs = shard_seeds((state.params, state.opt_state, state.target_params, batch,
                              jnp.full((k, args.batch_size), 1e-3)), k)
        flops = flops_of(sgd_update, *inputs) * len(jax.tree.leaves(inputs)[0].sharding.device_set)  # per device
        seconds = timed(sgd_update, *inputs, repeats=bench.repeats)
        out["sgd_ms"][k] = seconds * 1e3
        gflops = flops / seconds / 1e9
        print(f"  {k:>2} seed(s): SGD step {seconds * 1e3:8.1f} ms, {flops / 1e9:6.2f} GFLOP, {gflops:6.1f} GFLOP/s = "
              f"{gflops / matmul_gflops:4.0%} of the matmul figure; {seconds * 1e3 / out['sgd_ms'][bench.seeds[0]]:.2f}"
              f" x the step of {bench.seeds[0]} seed(s)", flush=True)
        del inputs, batch
        state, _ = chunk(state)  # compile, and fill replay past its minimum so that every timed chunk learns
        times, start = [], time.perf_counter()
        while len(times) < bench.repeats and (not times or time.perf_counter() - start < bench.max_seconds):
            t = time.perf_counter()
            state, metrics = chunk(state)  # the chunk takes its state by donation: carry it along
            jax.block_until_ready(metrics)
            times.append(time.perf_counter() - t)
        seconds = float(np.median(times))
        sps = script.steps_per_iteration(args) / seconds
        out["sps"][k] = sps
        first = bench.seeds[0]
        print(f"  {k:>2} seed(s): end to end {sps:8,.0f} env steps/s per seed, {k * sps:8,.0f} in all; "
              f"{seconds:.2f} s per iteration = {out['sps'][first] / sps:.2f} x the time of {first} seed(s)",
              flush=True)
        del state
    k = max(bench.seeds)
    hours = PAPER_STEPS / out["sps"][k] / 3600
    out["projection"] = (k, hours)
    print(f"  paper protocol ({PAPER_STEPS / 1e6:.0f}M env steps per seed) for {k} seeds in one process: "
          f"{hours:.2f} h ({hours * 60:.0f} min) on this machine", flush=True)
    return out


@exit_on_config_error
def main(bench: Args) -> None:
    require(bench.repeats > 0 and bench.replay_size >= 32, "--repeats must be positive and --replay-size >= 32")
    require(bench.seeds and all(s > 0 for s in bench.seeds), f"--seeds must be positive, got {bench.seeds}")
    names = list(METHODS) if bench.method == "all" else [bench.method]
    require(all(n in METHODS for n in names), f"--method must be all or one of {', '.join(METHODS)}, "
                                              f"got {bench.method!r}")
    print(f"jax {jax.__version__} on {jax.devices()[0].device_kind} ({len(jax.devices())} device(s)); "
          f"median of {bench.repeats}")
    n = bench.matmul_size
    a = jax.random.normal(jax.random.PRNGKey(0), (n, n))
    matmul_gflops = 2 * n**3 / timed(jax.jit(lambda x: x @ x), a, repeats=bench.repeats) / 1e9
    print(f"plain jitted matmul {n}x{n}: {matmul_gflops:.1f} GFLOP/s")
    before = None
    if bench.compare_conv:
        Conv2d.space_to_depth = False
        print("\nBEFORE: torso convolutions as plain patches")
        before = bench_method(names[0], bench, matmul_gflops)
        Conv2d.space_to_depth = True
        print("\nAFTER: torso convolutions folded space-to-depth (the default)")
    results = {name: bench_method(name, bench, matmul_gflops) for name in names}
    if before is not None:
        after = results[names[0]]
        for k in bench.seeds:
            print(f"{names[0]}, {k} seed(s): SGD step {before['sgd_ms'][k]:.1f} -> {after['sgd_ms'][k]:.1f} ms "
                  f"({before['sgd_ms'][k] / after['sgd_ms'][k]:.2f}x); end to end {before['sps'][k]:,.0f} -> "
                  f"{after['sps'][k]:,.0f} env steps/s per seed ({after['sps'][k] / before['sps'][k]:.2f}x)")
    k = max(bench.seeds)
    print(f"\nprojected paper protocol, {k} seeds, one method per process on this machine:")
    for name, r in results.items():
        print(f"  {name:>13}: {r['projection'][1]:.2f} h")


if __name__ == "__main__":
    main(tyro.cli(Args))
