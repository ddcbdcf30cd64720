"""Seeds trained apart (Protocol.seeds_apart): each seed's run in OUT_DIR/<method>/seed<k>/, a method's progress
over them, and OUT_DIR/<method>/ made of them once all are complete, so that every tool reads one run of all its
seeds; and a method's runs re-opened when --method-steps extends them."""

from __future__ import annotations

import json
import os

from common.run import PACKED, portable_config, read_table
from tools.protocol.settings import Protocol, jobs, reached, seeds_of, steps_of
from tools.run_reader import RunReader, saved_agents


def merge_seeds(protocol: Protocol, name: str) -> bool:
    """With seeds_apart: once every seed's run of a method is complete, OUT_DIR/<method>/ gets them as one run of
    all its seeds (the first seed's config.json with num_seeds set; every seed's metrics.csv and eval.csv rows; their
    parameter files, hard-linked, .eqx or the compact .eqz of tools.export), so that the tools read it as
    they read a run of vmapped seeds. Returns whether the method is complete."""
    out = protocol.out_dir / name
    seed_dirs = [protocol.out_dir / job for job, _, _ in jobs(protocol, name)]
    if reached(protocol, name, out) or not all(reached(protocol, name, d) for d in seed_dirs):
        return reached(protocol, name, out)
    for table in ("metrics.csv", "eval.csv"):  # rows by (step, seed), as a vmapped run writes them
        parts = [read_table(d / table).splitlines() for d in seed_dirs]
        rows = sorted((r for p in parts for r in p[1:]), key=lambda r: tuple(int(x) for x in r.split(",")[:2]))
        (out / table).write_text("\n".join([parts[0][0], *rows]) + "\n")
    for d in seed_dirs:
        for params in saved_agents(d):
            (out / params.name).unlink(missing_ok=True)
            os.link(params, out / params.name)
    config = RunReader(seed_dirs[0]).config
    config["args"] |= {"seed": 1, "num_seeds": seeds_of(protocol, name)}
    config["seeds_trained_apart"] = [str(d.relative_to(out)) for d in seed_dirs]
    config = portable_config(config, run_dir_as=str(seed_dirs[0].relative_to(out)))  # (the command is its seed's)
    (out / "config.json").write_text(json.dumps(config, indent=2))  # last: complete() reads it
    return True


def method_progress(protocol: Protocol, name: str) -> tuple[int, int | None]:
    """(env steps per seed every seed reached, the protocol's total) of a method."""
    if not protocol.seeds_apart or reached(protocol, name, protocol.out_dir / name):
        steps, total = RunReader(protocol.out_dir / name).progress()
    else:
        runs = [RunReader(protocol.out_dir / job).progress() for job, _, _ in jobs(protocol, name)]
        steps, total = min(r[0] for r in runs), next((r[1] for r in runs if r[1]), None)
    return steps, steps_of(protocol, name) or total


MERGED = ("config.json", "metrics.csv", "eval.csv")
"""what merge_seeds writes into OUT_DIR/<method>/ besides its seeds' parameter files (hard links); the tables may
be packed (.xz: a protocol resumed from tools.export's copy)"""


def extend(protocol: Protocol) -> None:
    """Re-opens the runs that --method-steps extends past their end, before they go on: each analysis made at the
    earlier end moves to analysis_at_<steps>/ beside it (kept: it describes the agent at that step, and the
    protocol plays the agent again at the new end), and a merge of seeds is undone (its files are made of the
    seeds', which stay; merge_seeds makes it again once every seed reaches the new end). A run not begun, or
    already at its new end, is left as it is."""
    for name in protocol.methods:
        if steps_of(protocol, name) is None or not (protocol.out_dir / name).exists():
            continue
        method_dir = protocol.out_dir / name
        runs = [method_dir, *(protocol.out_dir / job for job, _, _ in jobs(protocol, name) if job != name)]
        for run in runs:
            reader = RunReader(run)
            if not reader.complete() or reached(protocol, name, run):
                continue  # (not at an earlier end: still training, or extended already)
            step = reader.progress()[0]
            if (run / "analysis").is_dir():
                (run / "analysis").rename(run / f"analysis_at_{step}")
            if run == method_dir and protocol.seeds_apart:  # config.json first: complete() reads it
                tables = [run / f"{table}{packed}" for table in MERGED[1:] for packed in ("", PACKED)]
                for path in [run / MERGED[0], *tables, *reader.saved_agents()]:
                    path.unlink(missing_ok=True)
            print(f"[protocol] {run.relative_to(protocol.out_dir)}: extended from {step:,} to "
                  f"{steps_of(protocol, name):,} env steps per seed", flush=True)
