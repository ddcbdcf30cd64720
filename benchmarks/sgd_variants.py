"""The SGD step on each FARM backend and its variants, and a slice of real training per backend: one command measures
the whole table on a GPU in at most 9 minutes.

    python -m benchmarks.sgd_variants --out OUT_DIR                 # on a GPU: every row, 540 s in all
    python -m benchmarks.sgd_variants --tiny --budget-seconds 300    # on a CPU: tiny networks, the same code

Rows (ROWS, in the order a short budget runs them) time one SGD step (the gradient of the script's own batch_loss,
and Adam) for K vmapped seeds on random batches (random episode starts, tasks, rewards and stored states; three
batches in turn), or, for `train_*`, a slice of msfa_babyai.py's real training loop (acting, insertion, SGD steps)
reporting env steps/s per seed. The variants: the backend (--core-backend fused, pallas, pallas-bf16; plain, the
definition), K = 10 or 1 seeds, UVFA-FARM and the Impala torso's scripts (Fruitbot, MiniHack), Fruitbot's SGD step
drawing its batch's frames from replay's game states (fruitbot_states_*, msfa_fruitbot.py's default) against reading
stored frames (fruitbot_*), the kernels' block sizes and warps, and XLA flags (command buffers for whole loops).

Rows with the same XLA_FLAGS share one process (one import; each row compiles its own program); each set of flags
runs in its own process, so that a flag this XLA does not know fails those rows only, with its message. A row that
fails for any reason (a kernel that does not compile, an out-of-memory) records its whole error text; the others
still run. No row runs at `highest` precision: exactness is the CPU tests' job (tests/test_farm_kernels.py); here
each row's gradient and priorities are compared with the fused row of the same problem and seeds, at the device's
default precision, and the difference is reported.

The table ends with the projected protocol minutes per method and backend, and the backend this device kind should
default to (common/farm.py's FASTEST_MEASURED: a person changes it on this measurement). Results: OUT_DIR/results.json,
OUT_DIR/sgd_variants.log and the compiled programs of the fused and pallas rows (gzipped HLO text). Each SGD row
also reports its matrix FLOPs counted through the loops (benchmarks/hlo.py).
"""

from __future__ import annotations

import dataclasses
import gzip
import inspect
import json
import os
import re
import shlex
import subprocess
import sys
import time
import traceback
from dataclasses import dataclass
from pathlib import Path

import tyro

from benchmarks.hlo import hlo_stats, matmul_flops

ROOT = Path(__file__).resolve().parent.parent
PROBLEMS = {  # name: (script module, its settings, env)
    "msfa_babyai": ("msfa_babyai", {}, "babyai"),
    "uvfa-farm_babyai": ("uvfa", {"farm": True}, "babyai"),
    "msfa_fruitbot": ("msfa_fruitbot", {}, "fruitbot"),  # frames read from replay (--replay-frames)
    "msfa_fruitbot_states": ("msfa_fruitbot", {}, "fruitbot-states"),  # frames drawn from replay's game states
    "msfa_minihack": ("msfa_minihack", {}, "minihack"),
}
TASK_DIMS = {"babyai": 4, "fruitbot": 4, "fruitbot-states": 4, "minihack": 3}
COMMAND_BUFFERS = ("--xla_gpu_enable_command_buffer=FUSION,CUBLAS,CUBLASLT,CUSTOM_CALL,CUDNN,WHILE,CONDITIONAL "
                   "--xla_gpu_graph_min_graph_size=1")
"""XLA:GPU records whole loops (WHILE) and custom calls into CUDA graphs (flag names change between XLA versions: an
unknown one fails its rows with XLA's message)"""


@dataclass(frozen=True)
class Row:
    name: str
    backend: str = "fused"  # --core-backend
    problem: str = "msfa_babyai"
    seeds: int | None = None  # None: --seeds
    xla_flags: str = ""
    kernel: tuple = ()  # common.farm_pallas.Config settings, e.g. (("block", 16),)
    train: bool = False  # a slice of msfa_babyai.py's training loop instead of one SGD step

    @property
    def exact(self) -> bool:
        return self.backend != "pallas-bf16"


ROWS = [
    Row("fused"), Row("pallas", "pallas"), Row("pallas-bf16", "pallas-bf16"),
    Row("fused+cmdbuf", xla_flags=COMMAND_BUFFERS), Row("pallas+cmdbuf", "pallas", xla_flags=COMMAND_BUFFERS),
    Row("pallas-bf16+cmdbuf", "pallas-bf16", xla_flags=COMMAND_BUFFERS),
    Row("train_pallas", "pallas", train=True), Row("train_fused", train=True),
    Row("fused_k1", seeds=1), Row("pallas_k1", "pallas", seeds=1), Row("plain", "plain"),
    Row("uvfa-farm_fused", problem="uvfa-farm_babyai"), Row("uvfa-farm_pallas", "pallas", problem="uvfa-farm_babyai"),
    Row("fruitbot_fused", problem="msfa_fruitbot"), Row("fruitbot_pallas", "pallas", problem="msfa_fruitbot"),
    Row("fruitbot_states_fused", problem="msfa_fruitbot_states"),
    Row("minihack_fused", problem="msfa_minihack"), Row("minihack_pallas", "pallas", problem="msfa_minihack"),
    Row("pallas_block16", "pallas", kernel=(("block", 16),)),
    Row("pallas_lstm_columns256", "pallas", kernel=(("lstm_columns", 256),)),
    Row("pallas_warps8", "pallas", kernel=(("num_warps", 8),)),
    Row("pallas_warps2_stages2", "pallas", kernel=(("num_warps", 2), ("num_stages", 2))),
]
"""the rows, most wanted first (a shorter budget drops the last)"""


@dataclass
class Args:
    out: str | None = None
    """folder for results.json, the log and the fused and pallas rows' compiled programs"""
    budget_seconds: float = 540.0
    """wall time for everything; rows that no longer fit are listed as not run"""
    seeds: int = 10
    """vmapped seeds of the rows that do not say"""
    rows: tuple[str, ...] = ()
    """run only these rows (default: all of ROWS); a fused row of the same problem and seeds is added before a
    pallas row for its comparison"""
    custom_flags: str = ""
    """add a row `custom`: the fused row under these XLA_FLAGS (e.g. a flag to probe)"""
    calls: int = 20
    """SGD steps per timed block (5 blocks after 5 warm-up calls)"""
    train_seconds: float = 60.0
    """seconds of a training-loop slice (after its compilation)"""
    min_row_seconds: float = 40.0
    """a row starts only with at least this much of the budget left"""
    tiny: bool = False
    """tiny networks and sequences (the CPU test of this command); timings are then meaningless"""
    group: tuple[str, ...] = ()
    """internal: run these rows in this process and print their results"""
    deadline: float = 0.0
    """internal: the budget's end (time.time())"""
    work_dir: str = "/tmp/msfa-sgd-variants"
    """internal: where rows exchange the fused rows' gradients"""


# ---------------------------------------------------------------------------------------------------- random input
def random_views(setup, key, shape: tuple):
    """Fruitbot GameViews [*shape] of random training levels, the agent and the keys anywhere in the level and a tenth
    of the level's slots gone (what the learner draws frames from)."""
    import jax
    import jax.numpy as jnp

    from common.envs.fruitbot_jax import GameView

    config, pool = setup.env.config, setup.env_params.pool
    levels = pool.x.shape[0] * pool.x.shape[1]
    k = jax.random.split(key, 3)
    level = jax.random.randint(k[0], shape, 0, levels)
    size = jnp.array([config.main_width, config.main_height], jnp.float32)
    xy = 0.4 + jax.random.uniform(k[1], shape + (len(setup.env.moving_slots()), 2)) * (size - 0.8)
    alive = pool.alive.reshape(levels, -1)[level] & (jax.random.uniform(k[2], shape + (pool.alive.shape[-1],)) > 0.1)
    return GameView(level, xy, jnp.packbits(alive, axis=-1))


def random_batch(script, args, env: str, key, batch: int | None = None, setup=None):
    """Random sequences of a script's own types: episodes start at random steps (a fifth of them, the first step
    included), some ending by termination; a random task per sequence, random rewards, pickups and stored states.
    Observations: BabyAI's symbolic views, Fruitbot's frames (or GameViews: env fruitbot-states, with the script's
    setup), MiniHack's tile-index crops."""
    import jax
    import jax.numpy as jnp

    b, t = batch or args.batch_size, args.sequence_length
    net = script.make_network(args, jax.random.PRNGKey(0))
    num_tasks, num_actions = TASK_DIMS[env], net.core.num_actions
    k = jax.random.split(key, 12)
    first = jax.random.uniform(k[0], (b, t)) < 0.2
    picked = jax.random.uniform(k[1], (b, t)) < 0.3

    def observe(key):
        if env == "babyai":
            return jax.random.randint(key, (b, t, 5, 5, 3), 0, 7).astype(jnp.uint8)
        if env == "fruitbot":
            return jax.random.randint(key, (b, t, 64, 64, 3), 0, 256).astype(jnp.uint8)
        if env == "fruitbot-states":
            return random_views(setup, key, (b, t))
        from common.envs.minihack import tile_set

        return jax.random.randint(key, (b, t, 9, 9), 0, len(tile_set()[0])).astype(jnp.int16)

    fields = dict(
        obs=observe(k[2]),
        w=jnp.broadcast_to(jax.random.normal(k[3], (b, 1, num_tasks)), (b, t, num_tasks)),
        prev_action=jax.random.randint(k[4], (b, t), 0, num_actions),
        prev_reward=jax.random.normal(k[5], (b, t)),
        first=first,
        action=jax.random.randint(k[6], (b, t), 0, num_actions),
        reward=jax.random.normal(k[7], (b, t)),
        phi=jax.nn.one_hot(jax.random.randint(k[8], (b, t), 0, num_tasks), num_tasks) * picked[..., None],
        final_obs=observe(k[9]),
        terminal=jnp.concatenate([first[:, 1:] & (jax.random.uniform(k[10], (b, t - 1)) < 0.5),
                                  jnp.zeros((b, 1), bool)], axis=1),
    )
    keeps_final_view = getattr(script, "keeps_final_view", lambda a: getattr(a, "time_limit_is_termination", False))
    if env == "fruitbot-states" or not (env == "minihack" or keeps_final_view(args)):
        fields["final_obs"] = jnp.zeros((b, t, 0), jnp.uint8)
    steps = script.Step(**{name: fields[name] for name in script.Step._fields})
    state = jax.tree.map(lambda x: 0.5 * jax.random.normal(k[11], (b,) + x.shape), net.core.initial_state())
    return script.Sequence(steps=steps, state=state)


# -------------------------------------------------------------------------------------------------------- one row
TINY = dict(num_envs=4, sequence_period=8, sequence_length=9, replay_size=64, min_replay_size=8, batch_size=4,
            samples_per_insert=2.0, num_modules=2, module_size=16, attention_heads=1)
TINY_HEADS = {"msfa_babyai": dict(psi_hidden=(8,), phi_hidden=(8,)), "msfa_fruitbot": dict(psi_hidden=(8,),
              phi_hidden=(8,)), "msfa_fruitbot_states": dict(psi_hidden=(8,), phi_hidden=(8,), train_levels=8),
              "msfa_minihack": dict(psi_hidden=(8,), phi_hidden=(8,)),
              "uvfa-farm_babyai": dict(q_hidden=(8,), lstm_size=16)}


def protocol_sgd_steps(script, args) -> int:
    """SGD steps of the paper's protocol for one seed at the script's defaults."""
    iterations = -(-args.total_timesteps // script.steps_per_iteration(args))
    return iterations * script.sgd_steps_per_iteration(args)


def script_args(row: Row, bench: Args, **more):
    import importlib

    module, settings, _ = PROBLEMS[row.problem]
    script = importlib.import_module(module)
    tiny = (TINY | TINY_HEADS[row.problem]) if bench.tiny else {}
    args = script.Args(**settings, **tiny, core_backend=row.backend, **more)
    return script, args


def device_name() -> str:
    import jax

    return f"{jax.devices()[0].device_kind} ({jax.default_backend()}), jax {jax.__version__}"


def run_sgd_row(row: Row, bench: Args) -> dict:
    """Compile and time one row's SGD step; its gradient against the fused row's of the same problem and seeds."""
    import equinox as eqx
    import jax
    import jax.numpy as jnp
    import numpy as np
    import optax

    script, args = script_args(row, bench)
    # the step's time does not depend on the replay's size
    args = dataclasses.replace(args, replay_size=min(args.replay_size, 2_000), min_replay_size=min(32, args.batch_size))
    env = PROBLEMS[row.problem][2]
    k = row.seeds or bench.seeds
    keys = jnp.stack([jax.random.PRNGKey(s) for s in range(k)])
    nets = jax.vmap(lambda key: eqx.filter(script.make_network(args, key), eqx.is_inexact_array))(keys)
    targets = jax.vmap(lambda key: eqx.filter(script.make_network(args, key), eqx.is_inexact_array))(keys + 1)
    static = eqx.partition(script.make_network(args, jax.random.PRNGKey(0)), eqx.is_inexact_array)[1]
    setup = script.make_setup(args) if env == "fruitbot-states" else None  # the level pool frames are drawn from
    batches = [jax.vmap(lambda key: random_batch(script, args, env, key, setup=setup))(
        jnp.stack([jax.random.PRNGKey(1_000 * i + s) for s in range(k)])) for i in range(3)]
    probabilities = jax.random.uniform(jax.random.PRNGKey(7), (k, args.batch_size), minval=0.01, maxval=0.1)
    render = ()
    if "render" in inspect.signature(script.batch_loss).parameters:
        from common.envs.babyai import GotoAvoid

        render = (GotoAvoid().rgb_from_symbolic,)
    optimizer = optax.chain(optax.clip_by_global_norm(args.max_grad_norm),
                            optax.adam(args.learning_rate, eps=args.adam_eps))

    def update(params, opt_state, target_params, batch, probabilities):
        if setup is not None:  # the frames drawn from the game states, as the script's sgd_step does
            batch = batch._replace(steps=script.replay_frames(setup, batch.steps))

        def loss(params):
            return script.batch_loss(eqx.combine(params, static), eqx.combine(target_params, static), *render,
                                     batch, probabilities, args)
        grads, (priorities, *_) = jax.grad(loss, has_aux=True)(params)
        updates, opt_state = optimizer.update(grads, opt_state, params)
        return eqx.apply_updates(params, updates), opt_state, grads, priorities

    opt_states = jax.vmap(optimizer.init)(nets)
    start = time.perf_counter()
    compiled = jax.jit(jax.vmap(update)).lower(nets, opt_states, targets, batches[0], probabilities).compile()
    text = compiled.as_text()
    result = {"compile_s": round(time.perf_counter() - start, 1), "gflop": round(matmul_flops(text) / 1e9, 3)} | \
        hlo_stats(text)
    result["triton_calls"] = text.count("__gpu$xla.gpu.triton")  # the Pallas kernels' calls in the program (GPU)
    _, _, grads, priorities = compiled(nets, opt_states, targets, batches[0], probabilities)
    result |= compare_with_fused(row, k, bench, grads, priorities)
    for _ in range(5):  # warm-up
        out = compiled(nets, opt_states, targets, batches[0], probabilities)
    jax.block_until_ready(out)
    blocks = []
    for b in range(5):
        start = time.perf_counter()
        for i in range(bench.calls):
            out = compiled(nets, opt_states, targets, batches[i % 3], probabilities)
        jax.block_until_ready(out)
        blocks.append((time.perf_counter() - start) / bench.calls * 1e3)
    result |= {"ms": round(float(np.median(blocks)), 3), "ms_min": round(min(blocks), 3),
               "ms_max": round(max(blocks), 3),
               "nan": bool(any(np.isnan(np.asarray(x)).any() for x in jax.tree.leaves(out)))}
    result["protocol_sgd_steps"] = protocol_sgd_steps(script, script.Args(**PROBLEMS[row.problem][1]))
    result["learner_minutes"] = round(result["protocol_sgd_steps"] * result["ms"] / 60_000, 1)
    if bench.out and row.name in ("fused", "pallas"):
        (Path(bench.work_dir) / f"hlo_{row.name}.txt").write_text(text)
    return result


def compare_with_fused(row: Row, seeds: int, bench: Args, grads, priorities) -> dict:
    """The fused row saves its gradient; every other row reports its worst per-leaf difference from it
    (|g - g_fused| / (|g_fused| + 1e-3 max_leaf |g_fused|)) and its priorities' worst relative difference."""
    import jax
    import numpy as np

    path = Path(bench.work_dir) / f"fused_{row.problem}_{seeds}.npz"
    leaves = [np.asarray(g, np.float64) for g in jax.tree.leaves(grads)]
    if row.backend == "fused" and not path.exists():  # the first fused row of its problem: the others' reference
        np.savez(path, priorities=np.asarray(priorities), *leaves)
        return {"grad_diff": None, "priority_diff": None}
    if not path.exists():
        return {"grad_diff": None, "priority_diff": None}
    saved = np.load(path)
    refs = [saved[f"arr_{i}"].astype(np.float64) for i in range(len(leaves))]
    scale = max(np.linalg.norm(r) for r in refs)
    worst = max(np.linalg.norm(g - r) / (np.linalg.norm(r) + 1e-3 * scale) for g, r in zip(leaves, refs))
    ref_p = saved["priorities"]
    return {"grad_diff": float(f"{worst:.3g}"),
            "priority_diff": float(f"{np.max(np.abs(np.asarray(priorities) - ref_p) / np.abs(ref_p)):.3g}")}


def run_train_row(row: Row, bench: Args) -> dict:
    """A slice of msfa_babyai.py's training loop (acting, insertion, SGD steps) for K seeds: env steps/s per seed,
    median over chunks after the first (compiling) one."""
    import jax
    import jax.numpy as jnp
    import numpy as np

    script, args = script_args(row, bench, num_seeds=row.seeds or bench.seeds)
    setup = script.make_setup(args)
    per_chunk = 4  # iterations per chunk: 5,120 env steps per seed at the paper's settings
    chunk = script.make_train_chunk(setup, args, per_chunk)
    state = jax.vmap(lambda key: script.init_train_state(setup, args, key))(
        jnp.stack([jax.random.PRNGKey(s) for s in range(args.num_seeds)]))
    start = time.perf_counter()
    state, metrics = chunk(state)
    jax.block_until_ready(metrics)
    compile_s = time.perf_counter() - start
    rates, began = [], time.perf_counter()
    seconds = 3.0 if bench.tiny else bench.train_seconds
    while time.perf_counter() - began < seconds or len(rates) < 3:
        start = time.perf_counter()
        state, metrics = chunk(state)
        jax.block_until_ready(metrics)
        rates.append(per_chunk * script.steps_per_iteration(args) / (time.perf_counter() - start))
    sps = float(np.median(rates))
    paper = script.Args()
    return {"compile_s": round(compile_s, 1), "env_sps_per_seed": round(sps), "sps_min": round(min(rates)),
            "sps_max": round(max(rates)), "chunks": len(rates),
            "learning": bool(np.asarray(metrics.learning).all()),
            "protocol_minutes": round((paper.total_timesteps / sps + compile_s) / 60, 1)}


def run_group(bench: Args) -> None:
    """Run bench.group's rows in this process, one ROW_RESULT line each (errors included), within the deadline."""
    table = row_table(bench)
    for name in bench.group:
        row = table[name]
        base = {"row": name, "backend": row.backend, "problem": row.problem, "seeds": row.seeds or bench.seeds,
                "xla_flags": row.xla_flags, "kernel": dict(row.kernel), "exact": row.exact, "train": row.train}
        if time.time() > bench.deadline - bench.min_row_seconds:
            print("ROW_RESULT " + json.dumps(base | {"status": "not run: out of budget"}), flush=True)
            continue
        try:
            from common import farm_pallas

            with farm_pallas.overrides(**dict(row.kernel)):
                result = run_train_row(row, bench) if row.train else run_sgd_row(row, bench)
            result = base | {"device": device_name()} | result | {"status": "ok"}
        except Exception:  # noqa: BLE001  (a row's failure is its result)
            result = base | {"status": "failed", "error": traceback.format_exc()}
        print("ROW_RESULT " + json.dumps(result), flush=True)


# ----------------------------------------------------------------------------------------------------- the parent
LOG: list[str] = []


def say(line: str = "") -> None:
    """Print a line and keep it for OUT_DIR/sgd_variants.log."""
    print(line, flush=True)
    LOG.append(line)


def row_table(bench: Args) -> dict[str, Row]:
    rows = list(ROWS)
    if bench.custom_flags:
        rows.append(Row("custom", xla_flags=bench.custom_flags))
    return {r.name: r for r in rows}


def chosen_rows(bench: Args) -> list[Row]:
    """The rows to run, in order, each other backend's row preceded somewhere by the fused row it is compared with."""
    table = row_table(bench)
    names = list(bench.rows) or [r.name for r in ROWS] + (["custom"] if bench.custom_flags else [])
    unknown = [n for n in names if n not in table]
    if unknown:
        raise SystemExit(f"error: unknown rows {unknown}; choose from {', '.join(table)}")
    if bench.custom_flags and "custom" not in names:
        names.append("custom")
    rows = [table[n] for n in names]
    out: list[Row] = []
    for row in rows:
        if row.backend != "fused" and not row.train:
            partner = next((r for r in ROWS if r.backend == "fused" and not r.train and not r.xla_flags
                            and r.problem == row.problem and r.seeds == row.seeds), None)
            if partner is not None and partner not in out:
                out.append(partner)
        if row not in out:
            out.append(row)
    return out


def phases(rows: list[Row]) -> list[tuple[str, list[Row]]]:
    """Consecutive rows with the same XLA_FLAGS run in one process (in the rows' order)."""
    out: list[tuple[str, list[Row]]] = []
    for row in rows:
        if out and out[-1][0] == row.xla_flags:
            out[-1][1].append(row)
        else:
            out.append((row.xla_flags, [row]))
    return out


def run_phase(flags: str, rows: list[Row], bench: Args, deadline: float) -> list[dict]:
    env = dict(os.environ, XLA_FLAGS=f"{os.environ.get('XLA_FLAGS', '')} {flags}".strip())
    command = [sys.executable, "-m", "benchmarks.sgd_variants", "--group", *[r.name for r in rows],
               "--deadline", str(deadline), "--seeds", str(bench.seeds), "--calls", str(bench.calls),
               "--train-seconds", str(bench.train_seconds), "--min-row-seconds", str(bench.min_row_seconds),
               "--work-dir", bench.work_dir, f"--custom-flags={bench.custom_flags}",
               *(["--tiny"] if bench.tiny else []), *(["--out", bench.out] if bench.out else [])]
    say(f"[sgd_variants] {time.strftime('%H:%M:%S')} rows {', '.join(r.name for r in rows)} "
        f"({deadline - time.time():.0f} s left): XLA_FLAGS={shlex.quote(env['XLA_FLAGS'])}")
    results: dict[str, dict] = {}
    process = subprocess.Popen(command, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        out, err = process.communicate(timeout=max(1.0, deadline - time.time()))
    except subprocess.TimeoutExpired:
        process.kill()
        out, err = process.communicate()
        err += "\n(stopped at the end of the budget)"
    for line in out.splitlines():
        if line.startswith("ROW_RESULT "):
            result = json.loads(line[len("ROW_RESULT "):])
            results[result["row"]] = result
            say(f"[sgd_variants]   {summary_line(result)}")
    for row in rows:  # rows the process never reported: it died (an unknown flag, a crash) or ran out of time
        if row.name not in results:
            results[row.name] = {"row": row.name, "backend": row.backend, "problem": row.problem,
                                 "seeds": row.seeds or bench.seeds, "xla_flags": row.xla_flags, "exact": row.exact,
                                 "train": row.train, "status": "failed", "error": err.strip()[-20_000:]
                                 or f"exit {process.returncode}"}
            say(f"[sgd_variants]   {summary_line(results[row.name])}")
    return [results[r.name] for r in rows]


def summary_line(r: dict) -> str:
    if r["status"] != "ok":
        return f"{r['row']}: {r['status']}: {last_error(r.get('error', ''))}"
    if r.get("train"):
        return f"{r['row']}: {r['env_sps_per_seed']:,} env steps/s per seed (compile {r['compile_s']} s)"
    return (f"{r['row']}: {r['ms']} ms per SGD step ({r['ms_min']}-{r['ms_max']}), compile {r['compile_s']} s, "
            f"{r['ops_per_call']} ops, grad diff vs fused {fmt(r.get('grad_diff'))}")


def last_error(text: str) -> str:
    """The line of an error text that says why (the last naming an error, else the last with words)."""
    lines = [line.strip() for line in text.splitlines() if any(c.isalnum() for c in line)]
    named = [line for line in lines if "rror" in line or "nknown" in line]
    return ((named or lines or ["(no output)"])[-1])[:300]


def fmt(x, spec: str = "") -> str:
    return "-" if x is None else format(x, spec)


def report(results: list[dict], bench: Args) -> dict:
    """The table, the projected protocol minutes per method and backend, and the default this device should get."""
    say("\n| row | problem | seeds | XLA flags | compile s | ms per SGD step (min-max) / env steps/s per seed | "
        "ops per call | loops x ops/iter | grad diff vs fused | prio diff | protocol min | exact | status |\n"
        "|---|---|---:|---|---:|---|---:|---|---:|---:|---:|---|---|")
    for r in results:
        flags = "cmdbuf" if r["xla_flags"] == COMMAND_BUFFERS else r["xla_flags"]
        if r["status"] != "ok":
            say(f"| {r['row']} | {r['problem']} | {r['seeds']} | {flags} | | | | | | | | | {r['status']}: "
                f"{last_error(r.get('error', ''))} |")
            continue
        if r.get("train"):
            say(f"| {r['row']} | {r['problem']} (training loop) | {r['seeds']} | {flags} | {r['compile_s']} | "
                f"{r['env_sps_per_seed']:,} ({r['sps_min']:,}-{r['sps_max']:,}) | | | | | {r['protocol_minutes']} | "
                f"{'yes' if r['exact'] else 'NO'} | ok |")
            continue
        loops = " + ".join(f"{t}x{n}" for t, n in r.get("loops", [])) or "-"
        say(f"| {r['row']} | {r['problem']} | {r['seeds']} | {flags} | {r['compile_s']} | {r['ms']} ({r['ms_min']}-"
            f"{r['ms_max']}) | {r['ops_per_call']} | {loops} | {fmt(r.get('grad_diff'))} | "
            f"{fmt(r.get('priority_diff'))} | {r['learner_minutes']} | {'yes' if r['exact'] else 'NO'} | ok |")
    ok = [r for r in results if r["status"] == "ok"]
    for r in ok:  # drawing Fruitbot's frames from replay's game states against reading stored frames
        frames = next((f for f in ok if r["problem"] == "msfa_fruitbot_states" and f["problem"] == "msfa_fruitbot"
                       and (f["backend"], f["seeds"], f["xla_flags"], f["kernel"]) == (
                           r["backend"], r["seeds"], r["xla_flags"], r["kernel"])), None)
        if frames is not None:
            say(f"\nFruitbot's SGD step ({r['backend']}, {r['seeds']} seeds): {r['ms']} ms drawing the batch's frames "
                f"from game states, {frames['ms']} ms reading stored frames: ratio {r['ms'] / frames['ms']:.2f}")
    say(f"\nProjected protocol minutes per method ({bench.seeds} seeds; the learner's SGD steps alone, or the whole "
        "loop from a training-loop row):")
    for problem in PROBLEMS:
        cells = [f"{r['backend']}{'+cmdbuf' if r['xla_flags'] else ''} {r['learner_minutes']}" for r in ok
                 if r["problem"] == problem and not r.get("train") and r["seeds"] == bench.seeds and not r["kernel"]]
        trained = [f"{r['backend']} {r['protocol_minutes']} (whole loop)" for r in ok
                   if r["problem"] == problem and r.get("train")]
        if cells or trained:
            say(f"  {problem}: {', '.join(cells + trained)}")
    # the default: the fastest exact backend on BabyAI MSFA, by the training loop where it ran, else by the SGD step
    trains = [r for r in ok if r.get("train") and r["exact"]]
    steps = [r for r in ok if not r.get("train") and r["exact"] and r["problem"] == "msfa_babyai"
             and r["seeds"] == bench.seeds and not r["kernel"] and not r["xla_flags"]]
    choice = {}
    if trains:
        best = max(trains, key=lambda r: r["env_sps_per_seed"])
        choice = {"backend": best["backend"], "by": f"{best['env_sps_per_seed']:,} env steps/s per seed"}
    elif steps:
        best = min(steps, key=lambda r: r["ms"])
        choice = {"backend": best["backend"], "by": f"{best['ms']} ms per SGD step"}
    if choice:
        kind = ok[0]["device"].split(" (")[0]
        choice["device_kind"] = kind
        say(f"\nfastest exact backend here: {choice['backend']} ({choice['by']}); to make it this device's default, "
            f"add to common/farm.py's FASTEST_MEASURED:\n  {kind!r}: {choice['backend']!r},")
    return choice


def main(bench: Args) -> None:
    if bench.group:
        run_group(bench)
        return
    if bench.budget_seconds <= bench.min_row_seconds:
        raise SystemExit(f"error: --budget-seconds must exceed --min-row-seconds ({bench.min_row_seconds}), got "
                         f"{bench.budget_seconds}")
    rows = chosen_rows(bench)
    deadline = time.time() + bench.budget_seconds - 10  # 10 s kept for the table and the files
    work = Path(bench.work_dir)
    work.mkdir(parents=True, exist_ok=True)
    for stale in work.glob("*"):
        stale.unlink()
    say(f"[sgd_variants] budget {bench.budget_seconds:.0f} s, {bench.seeds} seeds{' (tiny networks)' * bench.tiny}, "
        f"{len(rows)} rows")
    results = []
    for flags, group in phases(rows):
        results += run_phase(flags, group, bench, deadline)
    choice = report(results, bench)
    if bench.out:
        out = Path(bench.out)
        out.mkdir(parents=True, exist_ok=True)
        (out / "results.json").write_text(json.dumps({"rows": results, "choice": choice, "seeds": bench.seeds,
                                                      "tiny": bench.tiny}, indent=1))
        (out / "sgd_variants.log").write_text("\n".join(LOG) + "\n")
        for name in ("fused", "pallas"):
            source = work / f"hlo_{name}.txt"
            if source.exists():
                with gzip.open(out / f"hlo_{name}.txt.gz", "wt") as f:
                    f.write(source.read_text())


if __name__ == "__main__":
    main(tyro.cli(Args))
