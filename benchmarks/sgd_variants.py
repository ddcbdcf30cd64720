"""The SGD step, old and new and its variants, side by side: one prepared command for a lent GPU (and a tiny run here).

    python -m benchmarks.sgd_variants --budget-seconds 540 --out OUT_DIR      # on a GPU, one call
    python -m benchmarks.sgd_variants --tiny --budget-seconds 240             # here: tiny networks, same code

Each row times one SGD step (the gradient of the script's own batch_loss, and Adam) of MSFA for K vmapped seeds on
random batches (random episode starts, tasks, rewards and stored states; three batches used in turn), in its own
subprocess with its own XLA_FLAGS, so that a flag this XLA does not know fails that row only. Rows:
- `old`: the learner before FARM's step was fused (tests/reference_learner.py): three loops per SGD step;
- `new`: the scripts' defaults; `fused`, `joint`, `after`, `joint+after`: FARM's fused step alone, then with the
  online and target networks in one loop (--joint-target-unroll) and/or the recurrent weight's gradient formed
  after the loop (--lstm-grad-after-loop); `unroll N`: --learner-unroll N;
- XLA flag rows (command buffers for whole loops, no Triton GEMM, ...) on top of a code variant;
- `bf16`: every matmul with bfloat16 inputs and float32 accumulation (jax.default_matmul_precision
  "BF16_BF16_F32"), marked NOT exact: its gradient error says how far it is from the reference;
- `chunk`: one whole training iteration (acting 32 envs x 40 steps, insertion, 24 SGD steps) for BabyAI;
- Fruitbot's and MiniHack's step (Impala torso), with the patch convolutions chosen for the CPU and with XLA's own
  (`native_conv`), for their protocol projections.
Every row reports compile seconds, ms per step (median of blocks of calls, and the blocks' min-max), the HLO ops
executed per step (entry + each loop's trip count x its body: kernels, on a GPU; `--xla_dump_to` is not needed), the
loops and ops per iteration, the worst per-parameter gradient error and priority error against the old step at
`highest` matmul precision (the `reference` row), and the projected protocol minutes of 10 seeds.

It chooses nothing silently: the table ends with the fastest exact row and the command line that would use it; the
scripts' defaults change only when a person changes them on such a measurement. Results: OUT_DIR/results.json, the
log (sgd_variants.log), and the compiled programs of the old, the default and the fastest row (gzipped HLO text).
"""

from __future__ import annotations

import dataclasses
import gzip
import json
import os
import re
import shlex
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import tyro

ROOT = Path(__file__).resolve().parent.parent
SCRIPTS = {"babyai": "msfa_babyai", "fruitbot": "msfa_fruitbot", "minihack": "msfa_minihack"}
TASK_DIMS = {"babyai": 4, "fruitbot": 4, "minihack": 3}
CODE = {  # variant: the scripts' speed settings (everything else is each script's defaults)
    "new": {},  # the scripts' defaults
    "old": dict(joint_target_unroll=False, lstm_grad_after_loop=False),  # with tests/reference_learner.py patched in
    "reference": dict(joint_target_unroll=False, lstm_grad_after_loop=False),  # the same, at `highest` precision
    "fused": dict(joint_target_unroll=False, lstm_grad_after_loop=False),
    "joint": dict(joint_target_unroll=True, lstm_grad_after_loop=False),
    "after": dict(joint_target_unroll=False, lstm_grad_after_loop=True),
    "joint+after": dict(joint_target_unroll=True, lstm_grad_after_loop=True),
}
COMMAND_BUFFERS = ("--xla_gpu_enable_command_buffer=FUSION,CUBLAS,CUBLASLT,CUSTOM_CALL,CUDNN,WHILE,CONDITIONAL "
                   "--xla_gpu_graph_min_graph_size=1")
"""XLA:GPU records whole loops (WHILE) into CUDA graphs; flag names change between XLA versions (a row fails
with the unknown flag's message)"""


@dataclass(frozen=True)
class Row:
    name: str
    code: str  # a key of CODE
    seeds: int
    env: str = "babyai"
    xla_flags: str = ""
    unroll: int = 1
    precision: str | None = None  # jax.default_matmul_precision of the step (None: the device's default)
    native_conv: bool = False  # the Impala torso with XLA's own convolution (common.networks.Conv2d.native)
    chunk: bool = False  # time a whole training iteration instead of one SGD step

    @property
    def exact(self) -> bool:
        return self.precision is None


def rows_in_order(seeds: int) -> list[Row]:
    """The rows in the order a short budget should run them (run_rows puts a reference row first for every env and
    number of seeds: every row's gradient error needs it). `new` is the scripts' defaults, now the fused step."""
    k, one = seeds, 1
    return [
        Row("old", "old", k), Row("new", "new", k),
        Row("joint+after", "joint+after", k), Row("joint", "joint", k),
        Row("after", "after", k),
        Row("old+cmdbuf", "old", k, xla_flags=COMMAND_BUFFERS),
        Row("joint+after+cmdbuf", "joint+after", k, xla_flags=COMMAND_BUFFERS),
        Row("fused+cmdbuf", "fused", k, xla_flags=COMMAND_BUFFERS),
        Row("old_k1", "old", one), Row("new_k1", "new", one), Row("joint+after_k1", "joint+after", one),
        Row("joint+after+unroll2", "joint+after", k, unroll=2), Row("joint+after+unroll4", "joint+after", k, unroll=4),
        Row("fused+unroll2", "fused", k, unroll=2), Row("fused+unroll4", "fused", k, unroll=4),
        Row("joint+after+no_triton", "joint+after", k, xla_flags="--xla_gpu_enable_triton_gemm=false"),
        Row("joint+after+bf16", "joint+after", k, precision="BF16_BF16_F32"),
        Row("chunk_old", "old", k, chunk=True), Row("chunk_new", "new", k, chunk=True),
        Row("fruitbot_old", "old", k, env="fruitbot"), Row("fruitbot_new", "new", k, env="fruitbot"),
        Row("fruitbot_new_native_conv", "new", k, env="fruitbot", native_conv=True),
        Row("minihack_old", "old", k, env="minihack"), Row("minihack_new", "new", k, env="minihack"),
        Row("minihack_new_native_conv", "new", k, env="minihack", native_conv=True),
    ]


@dataclass
class Args:
    budget_seconds: float = 540.0
    """wall time for everything; rows that no longer fit are listed as not run"""
    out: str | None = None
    """folder for results.json, the log and up to three compiled programs (at most 5 files)"""
    seeds: int = 10
    """vmapped seeds of the K-seed rows (the *_k1 rows use one)"""
    rows: tuple[str, ...] = ()
    """run only these rows, in this order (default: all, in the order of rows_in_order)"""
    custom_flags: str = ""
    """add a row `custom`: the scripts' defaults under these XLA_FLAGS (e.g. a flag to probe)"""
    row_seconds: float = 120.0
    """the most one row may take (compilation included)"""
    reserve_seconds: float = 20.0
    """kept back for the table and the files"""
    calls: int = 20
    """SGD steps per timed block (5 blocks after 5 warm-up calls)"""
    tiny: bool = False
    """tiny networks and sequences (the CPU test of this command); timings are then meaningless"""
    row: str | None = None
    """internal: run one row in this process and print its result"""
    work_dir: str = "/tmp/msfa-sgd-variants"
    """internal: where rows exchange the reference gradient"""


# ------------------------------------------------------------------------------------------------- compiled programs
TRIVIAL = {"parameter", "get-tuple-element", "tuple", "constant", "bitcast", "after-all", "opt-barrier", "copy-start",
           "copy-done", "partition-id", "replica-id"}
"""HLO instructions that launch no work"""


def _computations(text: str) -> tuple[dict[str, list[str]], str]:
    comps, current, entry = {}, None, ""
    for line in text.splitlines():
        if not line.startswith(" "):
            m = re.match(r"^(ENTRY )?%?([\w.\-]+) .*\{\s*$", line)
            if m:
                current = m.group(2)
                comps[current] = []
                entry = current if m.group(1) else entry
                continue
        if line.startswith("}"):
            current = None
        elif current and line.strip():
            comps[current].append(line.strip())
    return comps, entry


def _op(line: str) -> str | None:
    """The opcode of one HLO instruction line (`%x = f32[2]{0} add(...)`, tuple types included)."""
    m = re.match(r"(?:ROOT )?%?[\w.\-]+ = ", line)
    if not m:
        return None
    rest = line[m.end():]
    if rest.startswith("("):  # a tuple type: skip past its closing parenthesis
        depth = 0
        for i, ch in enumerate(rest):
            depth += (ch == "(") - (ch == ")")
            if depth == 0:
                rest = rest[i + 1:]
                break
    else:
        rest = rest.split(" ", 1)[1] if " " in rest else ""
    m = re.match(r"\s*([\w\-]+)\(", rest)
    return m.group(1) if m else None


def hlo_stats(text: str) -> dict:
    """Of a compiled program's HLO text: the ops executed per call (entry ops + trip count x body ops of every while
    loop, nested loops included), and each loop's (trip count, ops per iteration)."""
    comps, entry = _computations(text)

    def count(name: str) -> tuple[int, list[tuple[int, int]]]:
        executed, loops = 0, []
        for line in comps.get(name, []):
            op = _op(line)
            if op is None or op in TRIVIAL:
                continue
            if op != "while":
                executed += 1
                continue
            body = re.search(r"body=%?([\w.\-]+)", line).group(1)
            trip = re.search(r'"known_trip_count":\{"n":"(\d+)"', line)
            trip = int(trip.group(1)) if trip else 1
            body_executed, body_loops = count(body)
            per_iteration = sum(1 for b in comps.get(body, []) if _op(b) not in TRIVIAL | {None, "while"})
            loops += [(trip, per_iteration), *body_loops]
            executed += trip * body_executed
        return executed, loops

    executed, loops = count(entry)
    return {"ops_per_call": executed, "loops": loops, "ops_per_iteration": sum(n for _, n in loops)}


# ---------------------------------------------------------------------------------------------------- random input
def random_batch(script, args, env: str, key, batch: int | None = None):
    """Random sequences of a script's own types: episodes start at random steps (a fifth of them, the first step
    included), some ending by termination; a random task per sequence, random rewards, pickups and stored states.
    Observations: BabyAI's symbolic views, Fruitbot's frames, MiniHack's tile-index crops."""
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
        from common.minihack import tile_set

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
    if not (env == "minihack" or getattr(script, "keeps_final_view", lambda a: False)(args)):
        fields["final_obs"] = jnp.zeros((b, t, 0), jnp.uint8)
    steps = script.Step(**{name: fields[name] for name in script.Step._fields})
    state = jax.tree.map(lambda x: 0.5 * jax.random.normal(k[11], (b,) + x.shape), net.core.initial_state())
    return script.Sequence(steps=steps, state=state)


# -------------------------------------------------------------------------------------------------------- one row
TINY = dict(num_envs=4, sequence_period=8, sequence_length=9, replay_size=64, min_replay_size=8, batch_size=4,
            samples_per_insert=2.0, num_modules=2, module_size=16, attention_heads=1, psi_hidden=(8,),
            phi_hidden=(8,))


def protocol_sgd_steps(script, args) -> int:
    """SGD steps of the paper's protocol for one seed at the script's defaults."""
    iterations = -(-args.total_timesteps // script.steps_per_iteration(args))
    return iterations * script.sgd_steps_per_iteration(args)


def run_row(row: Row, bench: Args) -> dict:
    """Compile and time one row in this process (its XLA_FLAGS were set by the parent)."""
    import contextlib
    import importlib

    import equinox as eqx
    import jax
    import jax.numpy as jnp
    import numpy as np
    import optax

    script = importlib.import_module(SCRIPTS[row.env])
    from common.networks import Conv2d

    Conv2d.native = row.native_conv
    settings = (TINY if bench.tiny else {}) | CODE[row.code]
    args = script.Args(**settings, learner_unroll=row.unroll)
    args = dataclasses.replace(args, replay_size=min(args.replay_size, 2_000),  # the step's time does not depend on it
                               min_replay_size=min(32, args.replay_size))
    old = row.code in ("old", "reference")
    if old:
        sys.path.insert(0, str(ROOT / "tests"))
        import reference_learner
    patch = reference_learner.patched(script) if old else contextlib.nullcontext()
    precision = jax.default_matmul_precision("highest" if row.code == "reference" else row.precision) \
        if row.code == "reference" or row.precision else contextlib.nullcontext()
    setup = script.make_setup(args) if row.env == "babyai" else None
    k = row.seeds
    keys = jnp.stack([jax.random.PRNGKey(s) for s in range(k)])
    nets = jax.vmap(lambda key: eqx.filter(script.make_network(args, key), eqx.is_inexact_array))(keys)
    targets = jax.vmap(lambda key: eqx.filter(script.make_network(args, key), eqx.is_inexact_array))(keys + 1)
    static = eqx.partition(script.make_network(args, jax.random.PRNGKey(0)), eqx.is_inexact_array)[1]
    batches = [jax.vmap(lambda key: random_batch(script, args, row.env, key))(
        jnp.stack([jax.random.PRNGKey(1_000 * i + s) for s in range(k)])) for i in range(3)]
    probabilities = jax.random.uniform(jax.random.PRNGKey(7), (k, args.batch_size), minval=0.01, maxval=0.1)
    render = (setup.env.rgb_from_symbolic,) if row.env == "babyai" else ()
    optimizer = optax.chain(optax.clip_by_global_norm(args.max_grad_norm),
                            optax.adam(args.learning_rate, eps=args.adam_eps))
    def grads_and_priorities(params, target_params, batch, probabilities):
        def loss(params):
            return script.batch_loss(eqx.combine(params, static), eqx.combine(target_params, static), *render,
                                     batch, probabilities, args)
        grads, (priorities, _) = jax.grad(loss, has_aux=True)(params)
        return grads, priorities

    def update(params, opt_state, target_params, batch, probabilities):
        grads, priorities = grads_and_priorities(params, target_params, batch, probabilities)
        updates, opt_state = optimizer.update(grads, opt_state, params)
        return eqx.apply_updates(params, updates), opt_state, grads, priorities

    opt_states = jax.vmap(optimizer.init)(nets)
    result = {"row": row.name, "env": row.env, "seeds": k, "exact": row.exact, "xla_flags": row.xla_flags,
              "device": f"{jax.devices()[0].device_kind} ({jax.default_backend()}), jax {jax.__version__}"}
    with patch, precision:
        if row.chunk:
            return result | time_chunk(script, args, k)
        start = time.perf_counter()
        compiled = jax.jit(jax.vmap(update)).lower(nets, opt_states, targets, batches[0], probabilities).compile()
        result["compile_s"] = round(time.perf_counter() - start, 1)
    result |= hlo_stats(compiled.as_text())
    _, _, grads, priorities = compiled(nets, opt_states, targets, batches[0], probabilities)
    work = Path(bench.work_dir)
    reference = work / f"reference_{row.env}_{k}_{'tiny' if bench.tiny else 'paper'}.npz"
    work.mkdir(parents=True, exist_ok=True)
    if row.code == "reference":
        np.savez(reference, priorities=np.asarray(priorities), *[np.asarray(g) for g in jax.tree.leaves(grads)])
    result |= gradient_error(grads, priorities, reference)
    if row.code == "reference":  # its gradient is the point, not its time (at `highest` precision)
        return result
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
               "ms_max": round(max(blocks), 3), "nan": bool(any(np.isnan(np.asarray(x)).any()
                                                               for x in jax.tree.leaves(out)))}
    paper = script.Args()
    result["protocol_sgd_steps"] = protocol_sgd_steps(script, paper)
    result["learner_minutes"] = round(result["protocol_sgd_steps"] * result["ms"] / 60_000, 1)
    if bench.out:  # the parent keeps those of the old, the default and the fastest row
        (work / f"hlo_{row.name}.txt").write_text(compiled.as_text())
    return result


def gradient_error(grads, priorities, reference: Path) -> dict:
    """The worst per-leaf error against the reference gradient (|g - ref| / (|ref| + 1e-3 max_leaf|ref|), so that a
    leaf whose exact gradient is 0, like FARM's key bias, is judged on the scale of the largest one) and the
    priorities' worst relative error; None without a reference."""
    import jax
    import numpy as np

    if not reference.exists():
        return {"grad_error": None, "priority_error": None}
    saved = np.load(reference)
    leaves = [np.asarray(g, np.float64) for g in jax.tree.leaves(grads)]
    refs = [saved[f"arr_{i}"].astype(np.float64) for i in range(len(leaves))]
    scale = max(np.linalg.norm(r) for r in refs)
    worst = max(np.linalg.norm(g - r) / (np.linalg.norm(r) + 1e-3 * scale) for g, r in zip(leaves, refs))
    ref_p = saved["priorities"]
    return {"grad_error": float(f"{worst:.3g}"),
            "priority_error": float(f"{np.max(np.abs(np.asarray(priorities) - ref_p) / np.abs(ref_p)):.3g}")}


def time_chunk(script, args, seeds: int) -> dict:
    """One training iteration of the BabyAI script (acting, insertion, SGD steps) for `seeds` vmapped seeds."""
    import jax
    import jax.numpy as jnp
    import numpy as np

    args = dataclasses.replace(args, min_replay_size=args.batch_size)
    setup = script.make_setup(args)
    chunk = script.make_train_chunk(setup, args, 1)
    state = jax.vmap(lambda key: script.init_train_state(setup, args, key))(
        jnp.stack([jax.random.PRNGKey(s) for s in range(seeds)]))
    start = time.perf_counter()
    state, metrics = chunk(state)
    jax.block_until_ready(metrics)
    compile_s = time.perf_counter() - start
    times = []
    for _ in range(5):
        start = time.perf_counter()
        state, metrics = chunk(state)
        jax.block_until_ready(metrics)
        times.append(time.perf_counter() - start)
    iterations = -(-script.Args().total_timesteps // script.steps_per_iteration(script.Args()))
    seconds = float(np.median(times))
    return {"compile_s": round(compile_s, 1), "ms": round(seconds * 1e3, 1), "ms_min": round(min(times) * 1e3, 1),
            "ms_max": round(max(times) * 1e3, 1), "per": "training iteration",
            "protocol_minutes": round((iterations * seconds + compile_s) / 60, 1)}


# ----------------------------------------------------------------------------------------------------- the parent
LOG: list[str] = []


def say(line: str = "") -> None:
    """Print a line and keep it for OUT_DIR/sgd_variants.log."""
    print(line, flush=True)
    LOG.append(line)


def row_table(bench: Args) -> dict[str, Row]:
    """Every row by name: rows_in_order's, `custom` with --custom-flags, and `reference_<env>_k<seeds>` for every env
    and number of seeds among them."""
    rows = rows_in_order(bench.seeds) + [Row("custom", "new", bench.seeds, xla_flags=bench.custom_flags)]
    references = [Row(f"reference_{env}_k{seeds}", "reference", seeds, env=env)
                  for env, seeds in dict.fromkeys((r.env, r.seeds) for r in rows)]
    return {r.name: r for r in references + rows}


def run_rows(bench: Args) -> list[dict]:
    start = time.time()
    table = row_table(bench)
    if not bench.custom_flags:
        del table["custom"]
    names = list(bench.rows) or [n for n in table if table[n].code != "reference"]
    unknown = [n for n in names if n not in table]
    if unknown:
        raise SystemExit(f"error: unknown rows {unknown}; choose from {', '.join(table)}")
    if bench.custom_flags and "custom" not in names:
        names.insert(min(3, len(names)), "custom")
    for env, seeds in dict.fromkeys((table[n].env, table[n].seeds) for n in names if not table[n].chunk):
        reference = f"reference_{env}_k{seeds}"  # every (env, seeds) of the rows gets its reference, first
        if reference not in names:
            names.insert(0, reference)
    Path(bench.work_dir).mkdir(parents=True, exist_ok=True)
    for stale in Path(bench.work_dir).glob("*"):
        stale.unlink()
    results = []
    for name in names:
        row = table[name]
        left = start + bench.budget_seconds - bench.reserve_seconds - time.time()
        if left < min(bench.row_seconds, 60.0):
            results.append({"row": name, "status": "not run: out of budget"})
            continue
        env = dict(os.environ, XLA_FLAGS=f"{os.environ.get('XLA_FLAGS', '')} {row.xla_flags}".strip())
        command = [sys.executable, "-m", "benchmarks.sgd_variants", "--row", name, "--seeds", str(bench.seeds),
                   "--calls", str(bench.calls), "--work-dir", bench.work_dir, f"--custom-flags={bench.custom_flags}",
                   *(["--tiny"] if bench.tiny else []), *(["--out", bench.out] if bench.out else [])]
        say(f"[sgd_variants] {time.strftime('%H:%M:%S')} row {name} ({left:.0f} s left): XLA_FLAGS="
            f"{shlex.quote(env['XLA_FLAGS'])}")
        try:
            done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True,
                                  timeout=min(bench.row_seconds, left))
            lines = [line for line in done.stdout.splitlines() if line.startswith("ROW_RESULT ")]
            if done.returncode == 0 and lines:
                result = json.loads(lines[-1][len("ROW_RESULT "):]) | {"status": "ok"}
            else:
                result = {"row": name, "status": f"failed (exit {done.returncode}): {last_error(done.stderr)}"}
        except subprocess.TimeoutExpired:
            result = {"row": name, "status": f"timed out after {min(bench.row_seconds, left):.0f} s"}
        say(f"[sgd_variants]   {json.dumps(result)}")
        results.append(result)
    return results


def last_error(stderr: str) -> str:
    """The line of a failed row's output that says why (the last one naming an error, else the last with words)."""
    lines = [line.strip() for line in stderr.splitlines() if any(c.isalnum() for c in line)]
    named = [line for line in lines if "rror" in line or "nknown" in line]
    return ((named or lines or ["(no output)"])[-1])[:300]


def fmt(x, spec: str = "") -> str:
    return "-" if x is None else format(x, spec)


def report(results: list[dict], bench: Args) -> dict:
    """The table, the fastest exact SGD-step row of BabyAI at K seeds, and the command that would use it."""
    say("\n| row | seeds | compile s | ms/step (min-max) | ops/step | loops x ops/iter | grad err | prio err | "
        "protocol min (learner) | exact | status |\n|---|---:|---:|---|---:|---|---:|---:|---:|---|---|")
    for r in results:
        if r.get("status") != "ok":
            say(f"| {r['row']} | | | | | | | | | | {r['status']} |")
            continue
        loops = " + ".join(f"{t}x{n}" for t, n in r.get("loops", [])) or "-"
        if "ms" not in r:  # a reference row: compiled, not timed
            say(f"| {r['row']} | {r['seeds']} | {r['compile_s']} | (reference: not timed) | {r['ops_per_call']} | "
                f"{loops} | | | | | ok |")
            continue
        minutes = r.get("protocol_minutes", r.get("learner_minutes"))
        say(f"| {r['row']} | {r['seeds']} | {r['compile_s']} | {r['ms']} ({r['ms_min']}-{r['ms_max']}) "
              f"{r.get('per', '')}| {fmt(r.get('ops_per_call'))} | {loops} | {fmt(r.get('grad_error'))} | "
              f"{fmt(r.get('priority_error'))} | {fmt(minutes)} | {'yes' if r['exact'] else 'NO'} | ok |")
    candidates = [r for r in results if r.get("status") == "ok" and r["exact"] and r["env"] == "babyai"
                  and r["seeds"] == bench.seeds and "per" not in r and "ms" in r]
    choice = {}
    if candidates:
        best = min(candidates, key=lambda r: r["ms"])
        row = row_table(bench)[best["row"]]
        if row.code == "old":
            say(f"\nfastest exact row: {best['row']} ({best['ms']} ms): the old learner; nothing to change")
            return {"row": best["row"], "ms": best["ms"]}
        settings = CODE[row.code] | {"learner_unroll": row.unroll}
        flags = " ".join(f"--{k.replace('_', '-')} {v}" if not isinstance(v, bool) else
                         f"--{'' if v else 'no-'}{k.replace('_', '-')}" for k, v in settings.items())
        old = next((r for r in candidates if r["row"] == "old"), None)
        gain = f", {old['ms'] / best['ms']:.2f}x the old step's {old['ms']} ms" if old else ""
        say(f"\nfastest exact row: {best['row']} ({best['ms']} ms per SGD step{gain}); to use it:\n"
              f"  XLA_FLAGS={shlex.quote(row.xla_flags)} python msfa_babyai.py {flags} ...\n"
              f"(the scripts' defaults are unchanged: change them only on this measurement, naming the device)")
        choice = {"row": best["row"], "ms": best["ms"], "script_flags": flags, "xla_flags": row.xla_flags}
    return choice


def main(bench: Args) -> None:
    if bench.row is not None:
        print("ROW_RESULT " + json.dumps(run_row(row_table(bench)[bench.row], bench)), flush=True)
        return
    if bench.budget_seconds <= bench.reserve_seconds + 30:
        raise SystemExit(f"error: --budget-seconds must exceed --reserve-seconds + 30, got {bench.budget_seconds}")
    say(f"[sgd_variants] budget {bench.budget_seconds:.0f} s, {bench.seeds} seeds{' (tiny networks)' * bench.tiny}")
    results = run_rows(bench)
    choice = report(results, bench)
    if bench.out:
        out = Path(bench.out)
        out.mkdir(parents=True, exist_ok=True)
        (out / "results.json").write_text(json.dumps({"rows": results, "choice": choice, "seeds": bench.seeds,
                                                      "tiny": bench.tiny}, indent=1))
        (out / "sgd_variants.log").write_text("\n".join(LOG) + "\n")
        for name in ("old", "new", choice.get("row")):
            source = Path(bench.work_dir) / f"hlo_{name}.txt"
            if name and source.exists():
                with gzip.open(out / f"hlo_{name}.txt.gz", "wt") as f:
                    f.write(source.read_text())


if __name__ == "__main__":
    main(tyro.cli(Args))
