"""Seeds trained apart (Protocol.seeds_apart): each seed's run in OUT_DIR/<method>/seed<k>/, a method's progress
over them, and OUT_DIR/<method>/ made of them once all are complete, so that every tool reads one run of all its
seeds."""

from __future__ import annotations

import json
import os

from common.run import portable_config, read_table
from tools.protocol.settings import Protocol, jobs, seeds_of
from tools.run_reader import RunReader, complete, saved_agents


def merge_seeds(protocol: Protocol, name: str) -> bool:
    """With seeds_apart: once every seed's run of a method is complete, OUT_DIR/<method>/ gets them as one run of
    all its seeds (the first seed's config.json with num_seeds set; every seed's metrics.csv and eval.csv rows; their
    parameter files, hard-linked, .eqx or the compact .eqz of tools.export), so that the tools read it as
    they read a run of vmapped seeds. Returns whether the method is complete."""
    out = protocol.out_dir / name
    seed_dirs = [protocol.out_dir / job for job, _, _ in jobs(protocol, name)]
    if complete(out) or not all(complete(d) for d in seed_dirs):
        return complete(out)
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
    if not protocol.seeds_apart or complete(protocol.out_dir / name):
        return RunReader(protocol.out_dir / name).progress()
    reached = [RunReader(protocol.out_dir / job).progress() for job, _, _ in jobs(protocol, name)]
    return min(r[0] for r in reached), next((r[1] for r in reached if r[1]), None)
