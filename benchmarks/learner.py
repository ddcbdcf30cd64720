"""Learner speed at the paper's BabyAI settings, against the machine's plain matmul, in one run on one machine.

For each method and FARM backend (--core-backend: plain, the definition; fused, the default) it prints
- the SGD step as training runs it: the script's own sgd_step (sample a batch of 8 sequences of 41 steps from
  replay, the online and target unrolls, the losses, the gradient, Adam, the new priorities) inside a lax.scan of
  --steps steps, per step;
- its matrix FLOPs counted through the loops (benchmarks/hlo.py: every dot at every one of its executions; XLA's
  own cost analysis counts a loop's body once, about half of it here, also printed), the GFLOP/s they run at, and
  that as a share of a plain 2048 x 2048 matmul measured in the same run (the CPU's figure of merit);
- end to end: the jitted training iteration (32 envs act 40 steps, insert, 24 SGD steps: replay ratio 6), env
  steps/s per seed, and the protocol's projected hours per seed (5M env steps);
- with --seeds K: the same for K vmapped seeds (per seed).
Medians of --repeats. `--json` adds one JSON line per row (the CPU table in docs/learner_speed.md is made from it).

    python -m benchmarks.learner [--method msfa|usfa|usfa-learned|uvfa|uvfa-farm|mvfa|all] [--backends plain fused]
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass
from functools import partial

import jax
import jax.numpy as jnp
import numpy as np
import tyro

import msfa_babyai
import usfa
import uvfa
from benchmarks.hlo import hlo_stats, matmul_flops, profile_ops
from common.run import exit_on_config_error, require

METHODS = {  # name: (script, its non-default flags, whether it has FARM)
    "msfa": (msfa_babyai, {}, True),
    "usfa": (usfa, {}, False),
    "usfa-learned": (usfa, {"learned_cumulants": True}, False),
    "uvfa": (uvfa, {}, False),
    "uvfa-farm": (uvfa, {"farm": True}, True),
    "mvfa": (uvfa, {"modular": True}, True),
}
PAPER_STEPS = 5_000_000
TINY = dict(num_envs=4, sequence_period=8, sequence_length=9, batch_size=4, samples_per_insert=2.0)
TINY_NETWORKS = {"msfa_babyai": dict(num_modules=2, module_size=16, attention_heads=1, psi_hidden=(8,),
                                     phi_hidden=(8,)),
                 "usfa": dict(lstm_size=16, psi_hidden=(8,), phi_hidden=(8,)),
                 "uvfa": dict(num_modules=2, module_size=16, attention_heads=1, lstm_size=16, q_hidden=(8,))}


@dataclass
class Args:
    method: str = "msfa"
    """msfa, usfa, usfa-learned, uvfa, uvfa-farm, mvfa, or all"""
    backends: tuple[str, ...] = ("plain", "fused")
    """FARM backends to time (methods without FARM run once)"""
    seeds: tuple[int, ...] = (1,)
    """numbers of vmapped seeds to time"""
    steps: int = 8
    """SGD steps per timed call (a lax.scan, as in training)"""
    repeats: int = 5
    """timed calls per figure (the median is reported)"""
    end_to_end: bool = True
    """also time the whole training iteration"""
    replay_size: int = 2_000
    """replay capacity in sequences (small: the step's time does not depend on it)"""
    matmul_size: int = 2048
    json: bool = False
    """print one JSON line per row too"""
    tiny: bool = False
    """tiny networks and sequences (the benchmark's test); timings are then meaningless"""
    profile: int = 0
    """print the SGD steps' N costliest ops (jax.profiler's trace; 0: none)"""


def timed(fn, *args, repeats: int) -> list[float]:
    """Wall times of fn(*args) over repeats calls (after one untimed call), each call's result awaited."""
    jax.block_until_ready(fn(*args))
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        jax.block_until_ready(fn(*args))
        times.append(time.perf_counter() - start)
    return times


def xla_flops(compiled) -> float:
    cost = compiled.cost_analysis()
    cost = cost[0] if isinstance(cost, (list, tuple)) else cost
    return float(cost["flops"])


def bench(name: str, backend: str | None, seeds: int, bench_args: Args, matmul: float) -> dict:
    script, flags, _ = METHODS[name]
    extra = {} if backend is None else {"core_backend": backend}
    if bench_args.tiny:
        extra |= TINY | TINY_NETWORKS[script.__name__]
    args = script.Args(**flags, **extra, replay_size=bench_args.replay_size, min_replay_size=8, num_seeds=seeds)
    setup = script.make_setup(args)
    keys = jnp.stack([jax.random.PRNGKey(s) for s in range(seeds)])
    state = jax.vmap(lambda k: script.init_train_state(setup, args, k))(keys)
    chunk = script.make_train_chunk(setup, args, 1)
    state, _ = chunk(state)  # compiles; fills replay past its minimum with real sequences

    def sgd_steps(state, keys):  # the script's own SGD step, as the training iteration scans it
        return jax.lax.scan(partial(script.sgd_step, setup, args), state, keys)[0]

    step_keys = jax.vmap(lambda k: jax.random.split(k, bench_args.steps))(keys)
    compiled = jax.jit(jax.vmap(sgd_steps)).lower(state, step_keys).compile()
    text = compiled.as_text()
    flops = matmul_flops(text) / bench_args.steps / seeds
    times = timed(compiled, state, step_keys, repeats=bench_args.repeats)
    ms = float(np.median(times)) * 1e3 / bench_args.steps
    row = {"method": name, "backend": backend or "-", "seeds": seeds, "jax": jax.__version__,
           "sgd_ms": round(ms, 2), "sgd_ms_min": round(min(times) * 1e3 / bench_args.steps, 2),
           "sgd_ms_max": round(max(times) * 1e3 / bench_args.steps, 2), "gflop": round(flops / 1e9, 3),
           "xla_gflop_per_body": round(xla_flops(compiled) / bench_args.steps / seeds / 1e9, 3),
           "gflops": round(flops * seeds / (ms / 1e3) / 1e9, 1), "matmul_gflops": round(matmul, 1),
           "ops_per_iteration": hlo_stats(text)["loops"]}
    row["share_of_matmul"] = round(row["gflops"] / matmul, 3)
    if bench_args.profile:
        ops = profile_ops(compiled, (state, step_keys), top=bench_args.profile)
        row["profile"] = [(round(ms / bench_args.steps, 2), n // bench_args.steps, name, what)
                          for ms, n, name, what in ops]
    if bench_args.end_to_end:
        times = []
        for _ in range(bench_args.repeats):
            start = time.perf_counter()
            state, metrics = chunk(state)  # the chunk takes its state by donation: carry it along
            jax.block_until_ready(metrics)
            times.append(time.perf_counter() - start)
        sps = script.steps_per_iteration(args) / float(np.median(times))
        row |= {"env_sps_per_seed": round(sps), "protocol_hours_per_seed": round(PAPER_STEPS / sps / 3600, 2)}
    return row


def describe(row: dict) -> str:
    line = (f"  {row['backend']:>6} x{row['seeds']:<2} SGD step {row['sgd_ms']:7.1f} ms ({row['sgd_ms_min']:.1f}-"
            f"{row['sgd_ms_max']:.1f}), {row['gflop']:5.2f} GFLOP of matmuls (XLA's per-body count: "
            f"{row['xla_gflop_per_body']:.2f}) at {row['gflops']:5.1f} GFLOP/s = {row['share_of_matmul']:4.0%} of the "
            f"matmul; loops x ops {row['ops_per_iteration']}")
    for ms, n, name, what in row.get("profile", []):
        line += f"\n      {ms:7.2f} ms x{n:<4} {name:30s} {what}"
    if "env_sps_per_seed" in row:
        line += (f"\n               end to end {row['env_sps_per_seed']:,} env steps/s per seed, protocol "
                 f"{row['protocol_hours_per_seed']:.2f} h per seed")
    return line


@exit_on_config_error
def main(bench_args: Args) -> None:
    names = list(METHODS) if bench_args.method == "all" else [bench_args.method]
    require(all(n in METHODS for n in names), f"--method must be all or one of {', '.join(METHODS)}, got "
                                              f"{bench_args.method!r}")
    require(bench_args.repeats > 0 and bench_args.steps > 0, "--repeats and --steps must be positive")
    require(bench_args.seeds and all(s > 0 for s in bench_args.seeds), f"--seeds must be positive, got "
                                                                        f"{bench_args.seeds}")
    n = bench_args.matmul_size
    a = jax.random.normal(jax.random.PRNGKey(0), (n, n))
    matmul = 2 * n**3 / float(np.median(timed(jax.jit(lambda x: x @ x), a, repeats=bench_args.repeats))) / 1e9
    print(f"jax {jax.__version__} on {jax.devices()[0].device_kind}, {os.cpu_count()} cores; medians of "
          f"{bench_args.repeats}; plain jitted matmul {n}x{n}: {matmul:.1f} GFLOP/s", flush=True)
    for name in names:
        script, _, has_farm = METHODS[name]
        print(f"\n{name} (paper settings: batch 8 x 41 steps per seed, 32 envs, 24 SGD steps per 1280 env steps)",
              flush=True)
        for backend in (bench_args.backends if has_farm else (None,)):
            for seeds in bench_args.seeds:
                row = bench(name, backend, seeds, bench_args, matmul)
                print(describe(row), flush=True)
                if bench_args.json:
                    print("ROW " + json.dumps(row), flush=True)


if __name__ == "__main__":
    main(tyro.cli(Args))
