"""The paper's protocol for one environment: every method in the paper's order (or --methods), each with --seeds
vmapped seeds at its script's defaults (the paper's settings), resumable, one method per device at a time. On a CPU
each seed trains in its own process instead, pinned to one core with XLA single-threaded, one per core at a time:
on a 2-core machine that trains 1.25x the env steps of one process using both cores, and vmapped seeds gain nothing
there (benchmarks/cpu_seeds.py, docs/scale.md); the seeds' runs (OUT_DIR/<method>/seed<k>/) are merged into
OUT_DIR/<method>/ when all are complete, so every tool reads it as one run of all its seeds.

    python -m tools.protocol OUT_DIR --env babyai                   # the nine BabyAI methods, 10 seeds each
    python -m tools.protocol OUT_DIR --env babyai --devices 0 1 2 3  # four GPUs: four methods at a time
    python -m tools.protocol OUT_DIR --resume                        # continue where it stopped
    python -m tools.protocol OUT_DIR --resume --method-steps msfa=5000000  # take a method's runs further
    python -m tools.protocol OUT_DIR --env minihack --max-minutes 120 --methods msfa usfa_learned
    python -m tools.protocol OUT_DIR --env babyai fruitbot minihack --slurm --slurm-partition gpu  # a cluster
    python -m tools.protocol OUT_DIR --status                        # each run's job, state, progress, log

With --slurm every run is a SLURM job submitted through submitit, all at once (SLURM schedules them; preempted and
timed-out jobs checkpoint, requeue and resume), and the analysis a job after them; tools/protocol/runners.py says how,
and docs/scale.md what each job asks for. Without it the runs run here, one per device or core at a time. Several --env
make one protocol per env, in OUT_DIR/<env>/.

OUT_DIR/<method>/ is each method's own run directory (config.json, metrics.csv, eval.csv, checkpoint.eqx, the
per-seed parameter files, TensorBoard files); OUT_DIR/<method>.log its output, which the terminal also shows, each line
prefixed with the method. A method whose eval.csv reaches its protocol's last step is complete and is skipped; one
that stopped (Ctrl-C, --max-minutes, a crash) resumes from its checkpoint. Ctrl-C or SIGTERM stops every run cleanly
(each checkpoints first); `--resume OUT_DIR` then continues with the same settings (OUT_DIR/protocol.json).

Where the env has an analysis (BabyAI: the reward-prediction table, the cumulants' quality), tools.analyze plays
each run's saved agents as it completes (on SLURM: at the end), and a method trained seed by seed is reported from its
seeds' records into OUT_DIR/<method>/analysis/, once; OUT_DIR/summary.json records the device and, per method, the
env steps reached, the share of the protocol, the wall time and the exit status, what its analysis last said (kept
through stops and resumes), and, where it was left to run, which seeds. Figures and tables: `python -m
tools.plot OUT_DIR/<method>` and `python -m tools.summarize OUT_DIR/*/`. `python -m tools.export OUT_DIR DEST`
copies what is small enough to commit (no checkpoints), a folder in which `--resume` continues the protocol: its
complete runs are kept, the others start over.

Memory: one method's runs hold --seeds replays (docs/scale.md gives the bytes per seed); for Fruitbot the seeds default
to as many as fit the device by each script's replay_bytes (at most 10: a replay of game states, 0.33-0.39 GiB per
seed, lets all 10 fit; one of frames, with --extra "--replay-frames", 33 GiB per seed, 1 on an 80 GB GPU).

The code, by concern: methods.py (each env's methods and scales), settings.py (the command line, Args; one env's
resolved Protocol, protocol.json), orchestration.py (one env's protocol here or on SLURM), runners.py (the executors),
seeds.py (seeds trained apart), analysis.py (tools.analyze), ledger.py (jobs.json and summary.json, typed) and
status.py (--status); tools/run_reader.py reads each run directory.
"""

from __future__ import annotations

import dataclasses
import os
import shutil

from common.run import exit_on_config_error, require
from tools.protocol.ledger import JobsRecord, run_record
from tools.protocol.methods import ANALYSES, BLIND, METHODS, SCALES, paper_methods
from tools.protocol.orchestration import run_here, submit
from tools.protocol.runners import LIVE_STATES, SINGLE_THREADED, slurm_states
from tools.protocol.seeds import extend
from tools.protocol.settings import (Args, Protocol, choose_seeds, protocol_dirs, replay_bytes_per_seed, resolve,
                                     run_flags, save_settings, slurm_options)
from tools.protocol.status import status_lines
from tools.run_reader import analyzed, complete, saved_agents

__all__ = ["ANALYSES", "BLIND", "METHODS", "SCALES", "SINGLE_THREADED", "Args", "Protocol", "analyzed",
           "choose_seeds", "complete", "main", "paper_methods", "replay_bytes_per_seed", "resolve", "run_flags",
           "run_record", "saved_agents"]
"""what other code imports from tools.protocol (tools.export, the tests); the rest from its modules"""


@exit_on_config_error
def main(args: Args) -> None:
    """The command line's protocols (one per --env, or each saved one with --resume or --status): each checked
    before any starts, then run here one after the other, or all submitted to SLURM."""
    require(args.max_minutes is None or args.max_minutes > 0, f"--max-minutes must be positive, got {args.max_minutes}")
    os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")  # this process only reads the devices
    if args.status:
        print(f"{'env':9s} {'run':24s} {'job':>8s} {'state':22s} {'env steps':>11s} / {'of':<11s} "
              f"{'last test return':>18s}  log")
        for _, folder in protocol_dirs(args):
            print("\n".join(status_lines(resolve(dataclasses.replace(args, out_dir=str(folder), resume=True,
                                                                     status=False)))))
        return
    options = slurm_options(args)
    protocols = [resolve(dataclasses.replace(args, out_dir=str(folder)), env) for env, folder in protocol_dirs(args)]
    for one in protocols:
        record = JobsRecord.read(one.out_dir)
        if options is None and record.executor == "slurm" and shutil.which("scontrol"):
            states = slurm_states(list(record.jobs.values()))
            live = [j for j, (state, _) in states.items() if state in LIVE_STATES]
            require(not live, f"{one.out_dir}: SLURM jobs {' '.join(live)} still run this protocol; wait for them "
                              "(--status) or scancel them before resuming it here")
    for one in protocols:
        one.out_dir.mkdir(parents=True, exist_ok=True)
        if options is not None:
            submit(one, options)  # (protocol.json after: a submission SLURM refuses leaves OUT_DIR as it was)
        save_settings(one)
        extend(one)  # (runs --method-steps takes past their end: re-opened)
        if options is None:
            run_here(one)
