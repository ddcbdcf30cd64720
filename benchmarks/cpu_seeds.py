"""How to train the most seeds per hour on a CPU: seeds vmapped in one process, or one process per core, in one run.

Each arrangement runs msfa_babyai.py's jitted training iteration (or another script's, --script, with --flags) in
fresh processes and reports env steps/s per seed and in all (medians of --repeats iterations after the compiling
one; the arrangements run in turn, --rounds times, and each figure is the median of its rounds):
- one process on every core, one seed (XLA spreads each op over the cores);
- one process on every core, one vmapped seed per core;
- one process per core, each pinned to its core with XLA single-threaded, one seed each, all at once.
tools.protocol runs seeds the way this measures fastest on a CPU (docs/scale.md).

    python -m benchmarks.cpu_seeds [--script msfa_babyai] [--flags="--module-size 32"] [--repeats 5] [--rounds 2]
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import tyro

from tools.protocol import SINGLE_THREADED  # how the protocol runs a seed pinned to one core

ROOT = Path(__file__).resolve().parent.parent


@dataclass
class Args:
    script: str = "msfa_babyai"
    """the training script (a module of the repository)"""
    flags: str = ""
    """its flags (default: the paper's settings)"""
    repeats: int = 5
    """timed iterations per process (after the compiling one)"""
    rounds: int = 2
    """each arrangement runs this many times, the arrangements in turn (the machine's speed drifts): medians"""
    replay_size: int = 2_000
    """replay capacity (small: the speed does not depend on it)"""
    worker: str = ""
    """internal: run one measurement here (JSON settings) and print its result"""


def measure(script_name: str, flags: list[str], seeds: int, repeats: int, replay_size: int) -> dict:
    """In this process: env steps/s per seed of `seeds` vmapped seeds."""
    import importlib
    import time

    import jax
    import jax.numpy as jnp
    import numpy as np

    from common.run import parse_args

    script = importlib.import_module(script_name)
    args = parse_args(script.Args, [*flags, "--num-seeds", str(seeds), "--replay-size", str(replay_size),
                                    "--min-replay-size", "32"])
    setup = script.make_setup(args)
    chunk = script.make_train_chunk(setup, args, 1)
    state = jax.vmap(lambda k: script.init_train_state(setup, args, k))(
        jnp.stack([jax.random.PRNGKey(s) for s in range(seeds)]))
    state, metrics = chunk(state)
    jax.block_until_ready(metrics)
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        state, metrics = chunk(state)
        jax.block_until_ready(metrics)
        times.append(time.perf_counter() - start)
    return {"env_sps_per_seed": script.steps_per_iteration(args) / float(np.median(times)), "seeds": seeds}


def spawn(bench: Args, seeds: int, core: int | None) -> subprocess.Popen:
    env = dict(os.environ)
    command = [sys.executable, "-m", "benchmarks.cpu_seeds", "--worker",
               json.dumps({"seeds": seeds, "core": core}), "--script", bench.script, f"--flags={bench.flags}",
               "--repeats", str(bench.repeats), "--replay-size", str(bench.replay_size)]
    if core is not None:
        env["XLA_FLAGS"] = (env.get("XLA_FLAGS", "") + " " + SINGLE_THREADED).strip()
    return subprocess.Popen(command, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)


def results_of(processes: list[subprocess.Popen]) -> list[dict]:
    out = []
    for p in processes:
        stdout, _ = p.communicate()
        lines = [line for line in stdout.splitlines() if line.startswith("RESULT ")]
        if p.returncode != 0 or not lines:
            raise SystemExit(f"error: a measurement process failed (exit {p.returncode})")
        out.append(json.loads(lines[-1][len("RESULT "):]))
    return out


def main(bench: Args) -> None:
    if bench.worker:
        setting = json.loads(bench.worker)
        if setting["core"] is not None:
            os.sched_setaffinity(0, {setting["core"]})
        result = measure(bench.script, shlex.split(bench.flags), setting["seeds"], bench.repeats, bench.replay_size)
        print("RESULT " + json.dumps(result), flush=True)
        return
    cores = sorted(os.sched_getaffinity(0))
    print(f"{bench.script} {bench.flags or '(the paper settings)'} on {len(cores)} cores; medians of {bench.repeats}"
          " iterations per process", flush=True)
    arrangements = [("one process, every core, 1 seed", lambda: [spawn(bench, 1, None)]),
                    (f"one process, every core, {len(cores)} vmapped seeds", lambda: [spawn(bench, len(cores), None)]),
                    (f"{len(cores)} processes, one pinned to each core, 1 seed each",
                     lambda: [spawn(bench, 1, core) for core in cores])]
    totals = {name: [] for name, _ in arrangements}
    for _ in range(bench.rounds):  # in turn, each alone on the machine
        for name, start in arrangements:
            results = results_of(start())
            totals[name].append((sum(x["env_sps_per_seed"] * x["seeds"] for x in results),
                                 sum(x["seeds"] for x in results)))
    medians = {name: float(np.median([t for t, _ in runs])) for name, runs in totals.items()}
    best = max(medians, key=medians.get)
    for name, runs in totals.items():
        seeds = runs[0][1]
        spread = ", ".join(f"{t:,.0f}" for t, _ in runs)
        print(f"  {name:52s} {medians[name] / seeds:8,.0f} env steps/s per seed, {medians[name]:8,.0f} in all "
              f"(rounds: {spread}){'   <- most seeds per hour' if name == best else ''}", flush=True)


if __name__ == "__main__":
    main(tyro.cli(Args))
