"""What a compiled XLA program does per call, read from its HLO text: ops executed (loop bodies times their trip
counts) and the FLOPs of its matrix products counted the same way.

XLA's own cost analysis (`compiled.cost_analysis()["flops"]`) counts a while loop's body once, whatever its trip
count: for an SGD step of three 41-step unrolls it reports about half the work. `matmul_flops` counts every dot and
convolution at every execution: 2 x (result elements) x (contracted elements), inside fusions too, each computation
weighted by how often it runs (a loop's body: its known trip count times its caller's count). Elementwise work is
not counted: the figure is the matrix work, the part a plain matmul benchmark is comparable with.
"""

from __future__ import annotations

import math
import re

TRIVIAL = {"parameter", "get-tuple-element", "tuple", "constant", "bitcast", "after-all", "opt-barrier", "copy-start",
           "copy-done", "partition-id", "replica-id"}
"""HLO instructions that launch no work"""

_SHAPE = re.compile(r"^[a-z]+[0-9]*\[([0-9,]*)\]")


def computations(text: str) -> tuple[dict[str, list[str]], dict[str, str], str]:
    """(computation name -> its instruction lines, computation name -> its header line, the entry's name)."""
    comps, headers, current, entry = {}, {}, None, ""
    for line in text.splitlines():
        if not line.startswith(" "):
            m = re.match(r"^(ENTRY )?%?([\w.\-]+) .*\{\s*$", line)
            if m:
                current = m.group(2)
                comps[current], headers[current] = [], line
                entry = current if m.group(1) else entry
                continue
        if line.startswith("}"):
            current = None
        elif current and line.strip():
            comps[current].append(line.strip())
    return comps, headers, entry


def op_of(line: str) -> str | None:
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


def _trip_count(line: str) -> int:
    trip = re.search(r'"known_trip_count":\{"n":"(\d+)"', line)
    return int(trip.group(1)) if trip else 1


def hlo_stats(text: str) -> dict:
    """Ops executed per call (entry ops + trip count x body ops of every while loop, nested loops included: on a
    GPU, kernels), and each loop's (trip count, ops per iteration)."""
    comps, _, entry = computations(text)

    def count(name: str) -> tuple[int, list[tuple[int, int]]]:
        executed, loops = 0, []
        for line in comps.get(name, []):
            op = op_of(line)
            if op is None or op in TRIVIAL:
                continue
            if op != "while":
                executed += 1
                continue
            body = re.search(r"body=%?([\w.\-]+)", line).group(1)
            trip = _trip_count(line)
            body_executed, body_loops = count(body)
            per_iteration = sum(1 for b in comps.get(body, []) if op_of(b) not in TRIVIAL | {None, "while"})
            loops += [(trip, per_iteration), *body_loops]
            executed += trip * body_executed
        return executed, loops

    executed, loops = count(entry)
    return {"ops_per_call": executed, "loops": loops, "ops_per_iteration": sum(n for _, n in loops)}


def _dims(shape_text: str) -> list[int]:
    m = _SHAPE.match(shape_text)
    return [int(d) for d in m.group(1).split(",") if d] if m else []


def _product_flops(line: str, shapes: dict[str, list[int]]) -> int:
    """2 x result elements x contracted elements of one dot or convolution instruction."""
    result = _dims(line.split(" = ", 1)[1])
    operands = re.search(r"(?:dot|convolution)\(([^)]*)\)", line).group(1)
    names = [o.strip().split(" ")[-1].lstrip("%") for o in operands.split(",")]
    lhs = shapes.get(names[0], [])
    if " dot(" in line:
        contracting = re.search(r"lhs_contracting_dims=\{([0-9,]*)\}", line).group(1)
        contracted = math.prod(lhs[int(d)] for d in contracting.split(",") if d)
    else:  # convolution: the kernel's elements per output feature
        rhs = shapes.get(names[1], [])
        window = re.search(r"dim_labels=[^_]*_([^-]*)->", line).group(1)
        out_feature = window.index("o")
        contracted = math.prod(rhs) // max(rhs[out_feature], 1)
    return 2 * math.prod(result) * contracted


def matmul_flops(text: str) -> float:
    """FLOPs of every dot and convolution of a compiled program per call, loops counted by their trip counts."""
    comps, headers, entry = computations(text)
    runs: dict[str, float] = {}

    def visit(name: str, times: float) -> None:
        runs[name] = runs.get(name, 0.0) + times
        for line in comps.get(name, []):
            op = op_of(line)
            if op == "while":
                trip = _trip_count(line)
                visit(re.search(r"body=%?([\w.\-]+)", line).group(1), times * trip)
                visit(re.search(r"condition=%?([\w.\-]+)", line).group(1), times * (trip + 1))
            elif op in ("fusion", "call", "async-start", "custom-call"):
                for callee in re.findall(r"(?:calls|to_apply)=%?([\w.\-]+)", line):
                    visit(callee, times)
            elif op == "conditional":
                branches = re.search(r"branch_computations=\{([^}]*)\}", line)
                names = ([b.strip().lstrip("%") for b in branches.group(1).split(",")] if branches else
                         re.findall(r"(?:true|false)_computation=%?([\w.\-]+)", line))
                for callee in names:  # which branch runs is not known here: each counts (an upper bound)
                    visit(callee, times)

    visit(entry, 1.0)
    total = 0.0
    for name, times in runs.items():
        shapes = {m.group(1): _dims(m.group(2)) for m in re.finditer(r"([\w.\-]+): ([a-z]+[0-9]*\[[0-9,]*\])",
                                                                     headers.get(name, ""))}
        for line in comps.get(name, []):
            m = re.match(r"(?:ROOT )?%?([\w.\-]+) = (\S+)", line)
            if m:
                shapes[m.group(1)] = _dims(m.group(2))
        total += times * sum(_product_flops(line, shapes) for line in comps[name] if op_of(line) in ("dot",
                                                                                                    "convolution"))
    return total


def profile_ops(fn, args, repeats: int = 3, top: int = 15, out_dir: str = "/tmp/msfa-jax-profile") -> list[tuple]:
    """The ops of a compiled (or jitted) fn's program that took the most time in `repeats` calls (jax.profiler's
    trace of XLA:CPU's thunks): [(milliseconds per call, executions per call, op name, its result type and JAX source op)].
    Op times of the two cores add up (they overlap), and tracing slows the call: read them as shares."""
    import collections
    import glob
    import gzip
    import json
    import shutil

    import jax

    jax.block_until_ready(fn(*args))
    shutil.rmtree(out_dir, ignore_errors=True)
    with jax.profiler.trace(out_dir, create_perfetto_trace=True):
        for _ in range(repeats):
            jax.block_until_ready(fn(*args))
    trace = json.load(gzip.open(glob.glob(f"{out_dir}/**/*.trace.json.gz", recursive=True)[0]))
    text = fn.as_text() if hasattr(fn, "as_text") else fn.lower(*args).compile().as_text()  # compiled, or jitted
    described = {m.group(1): f"{m.group(2)} {m.group(3)[-70:]}" for m in re.finditer(
        r"^\s*(?:ROOT )?%?([\w.\-]+) = (\S+) .*?op_name=\"([^\"]*)\"", text, re.M)}
    skip = ("ThunkExecutor", "$", "SlinkyThreadPool", "PjitFunction", "ParseArguments", "while")
    total, count = collections.Counter(), collections.Counter()
    for event in trace["traceEvents"]:
        if event.get("ph") == "X" and not event["name"].startswith(skip):
            total[event["name"]] += event["dur"]
            count[event["name"]] += 1
    return [(t / repeats / 1e3, count[name] // repeats, name, described.get(name, ""))
            for name, t in total.most_common(top)]
