"""Learner speed at the paper's BabyAI settings (MSFA by default; --method picks a baseline), in one run on one machine.

Prints: the time of one SGD step (8 sequences of 41 steps: online and target unrolls, the three losses, gradient,
Adam), its FLOPs from XLA's cost analysis, the achieved GFLOP/s, the machine's plain jitted-matmul GFLOP/s measured
in the same run, and the end-to-end env steps/s of the training chunk (acting + replay + SGD at the default replay
ratio) for 1 and 4 vmapped seeds. Medians of --repeats.

    python -m benchmarks.learner [--method usfa-learned]
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
from common.run import exit_on_config_error, require

METHODS = {  # name: (script, its non-default flags)
    "msfa": (msfa_babyai, {}),
    "usfa": (usfa, {}),
    "usfa-learned": (usfa, {"learned_cumulants": True}),
    "uvfa": (uvfa, {}),
    "uvfa-farm": (uvfa, {"farm": True}),
    "mvfa": (uvfa, {"modular": True}),
}


def script_and_args(name: str):
    script, flags = METHODS[name]
    return script, script.Args(**flags)


@dataclass
class Args:
    method: str = "msfa"
    """msfa, usfa, usfa-learned, uvfa, uvfa-farm or mvfa"""
    repeats: int = 5
    seeds: tuple[int, ...] = (1, 4)
    """numbers of vmapped seeds for the end-to-end figure"""
    chunk_iterations: int = 2
    """training iterations (each: num_envs x 40 env steps + its SGD steps) per timed end-to-end call"""
    matmul_size: int = 2048


def median_time(fn, *args, repeats: int) -> float:
    jax.block_until_ready(fn(*args))
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        jax.block_until_ready(fn(*args))
        times.append(time.perf_counter() - start)
    return float(np.median(times))


def flops_of(jitted, *args) -> float:
    cost = jitted.lower(*args).compile().cost_analysis()
    cost = cost[0] if isinstance(cost, (list, tuple)) else cost
    return float(cost["flops"])


def random_batch(script, args, key):
    b, t = args.batch_size, args.sequence_length
    k = jax.random.split(key, 4)
    steps = script.Step(
        obs=jax.random.randint(k[0], (b, t, 5, 5, 3), 0, 7).astype(jnp.uint8),
        w=jnp.broadcast_to(jnp.eye(4)[0], (b, t, 4)),
        prev_action=jax.random.randint(k[1], (b, t), 0, 4),
        prev_reward=jnp.zeros((b, t)),
        first=jnp.zeros((b, t), bool).at[:, 0].set(True),
        action=jax.random.randint(k[2], (b, t), 0, 4),
        reward=jax.random.normal(k[3], (b, t)),
        **({"phi": jnp.zeros((b, t, 4))} if "phi" in script.Step._fields else {}),
    )
    initial = script.make_network(args, jax.random.PRNGKey(0)).core.initial_state()
    return script.Sequence(steps=steps, state=jax.tree.map(lambda x: jnp.broadcast_to(x, (b,) + x.shape), initial))


@exit_on_config_error
def main(bench: Args) -> None:
    require(bench.repeats > 0 and bench.chunk_iterations > 0, "repeats and chunk-iterations must be positive")
    require(all(s > 0 for s in bench.seeds), f"seeds must be positive, got {bench.seeds}")
    require(bench.method in METHODS, f"--method must be one of {', '.join(METHODS)}, got {bench.method!r}")
    script, args = script_and_args(bench.method)
    setup = script.make_setup(args)
    print(f"{script.method_name(args)}: jax {jax.__version__} on {jax.devices()[0].device_kind}; median of {bench.repeats}; "
          f"paper settings: batch {args.batch_size} x {args.sequence_length} steps")

    n = bench.matmul_size
    a = jax.random.normal(jax.random.PRNGKey(0), (n, n))
    matmul = jax.jit(lambda x: x @ x)
    matmul_gflops = 2 * n**3 / median_time(matmul, a, repeats=bench.repeats) / 1e9
    print(f"plain jitted matmul {n}x{n}: {matmul_gflops:.1f} GFLOP/s")

    state = script.init_train_state(setup, args, jax.random.PRNGKey(1))
    batch = random_batch(script, args, jax.random.PRNGKey(2))
    probabilities = jnp.full(args.batch_size, 1e-3)

    @jax.jit
    def update(params, opt_state, target_params, batch):
        def loss(params):
            return script.batch_loss(eqx.combine(params, setup.static), eqx.combine(target_params, setup.static),
                                     setup.env.rgb_from_symbolic, batch, probabilities, args)

        grads, (priorities, metrics) = jax.grad(loss, has_aux=True)(params)
        updates, opt_state = setup.optimizer.update(grads, opt_state, params)
        return eqx.apply_updates(params, updates), opt_state, priorities

    inputs = (state.params, state.opt_state, state.target_params, batch)
    flops = flops_of(update, *inputs)
    seconds = median_time(update, *inputs, repeats=bench.repeats)
    print(f"SGD step: {seconds * 1e3:.1f} ms, {flops / 1e9:.2f} GFLOP (XLA cost analysis), "
          f"{flops / seconds / 1e9:.1f} GFLOP/s = {flops / seconds / 1e9 / matmul_gflops:.0%} of the matmul figure")
    del state, inputs

    per_chunk = bench.chunk_iterations * script.steps_per_iteration(args)
    print(f"end to end ({args.num_envs} envs, {script.sgd_steps_per_iteration(args)} SGD steps per "
          f"{script.steps_per_iteration(args)} env steps, replay {args.replay_size:,} sequences):")
    chunk = script.make_train_chunk(setup, args, bench.chunk_iterations)
    for num_seeds in bench.seeds:
        keys = jnp.stack([jax.random.PRNGKey(s) for s in range(num_seeds)])
        state = jax.vmap(lambda k: script.init_train_state(setup, args, k))(keys)
        state, _ = chunk(state)  # compile, and fill replay past min_replay_size so every timed chunk learns
        times = []
        for _ in range(bench.repeats):
            start = time.perf_counter()
            state, metrics = chunk(state)
            jax.block_until_ready(metrics)
            times.append(time.perf_counter() - start)
        sps = per_chunk / float(np.median(times))
        print(f"  {num_seeds} seed(s): {sps:,.0f} env steps/s per seed, {num_seeds * sps:,.0f} in all")
        del state


if __name__ == "__main__":
    main(tyro.cli(Args))
