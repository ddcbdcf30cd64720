"""One env's protocol from start to end: its runs that are not complete (training_runs), trained on this machine
(run_here: one per device or pinned core at a time, each analysed as it completes) or submitted as SLURM jobs
(submit: every run at once, then the finishing job), and its end (finish: seeds merged, analysis, summary.json).
The executors themselves are tools.protocol.runners'."""

from __future__ import annotations

import dataclasses
import os
import shlex
import shutil
import subprocess
import sys
import time

import tools.protocol.ledger as ledger
from common.run import ConfigError
from tools.protocol.analysis import analyze
from tools.protocol.ledger import JobsRecord, MethodSummary, RunRecord, Summary, summary_before, write_summary
from tools.protocol.runners import (LIVE_STATES, FinishJob, LocalRunner, Run, SlurmOptions, run_log, slurm_states,
                                    submit_to_slurm)
from tools.protocol.seeds import merge_seeds
from tools.protocol.settings import Protocol, jobs, reached, run_flags
from tools.protocol.status import pid_alive

COMMAND = f"python -m {__spec__.parent}"
"""the protocol's command line, as its messages say how to continue or follow it"""


def training_runs(protocol: Protocol, names: list[str]) -> list[Run]:
    """The runs (tools.protocol.runners.Run) of these methods that are not complete, in order."""
    out = protocol.out_dir
    runs = []
    for name in names:
        for job, seed, seeds in jobs(protocol, name):
            if not reached(protocol, job, out / job):
                runs.append(Run(job, [sys.executable, *run_flags(protocol, name, seed, seeds)], out / job,
                                run_log(out, job)))
    return runs


def finish(protocol: Protocol, outcome: dict[str, RunRecord] | None = None, not_started: tuple[str, ...] = (),
           stopped: bool = False, wall_seconds: float | None = None, before: dict[str, MethodSummary] | None = None,
           analysis: dict[str, str] | None = None) -> Summary:
    """The end of a protocol: merge seeds' runs, tools.analyze of every method's saved agents (unless stopped),
    OUT_DIR/summary.json. On SLURM the last job calls it, after every run's job has ended. analysis: what this
    invocation's analyses already said (as its runs ended), which a stopped protocol reports as they were."""
    for name in protocol.methods:
        if protocol.seeds_apart:
            merge_seeds(protocol, name)
    analysis = dict(analysis or {})
    if not stopped:
        analysis |= analyze(protocol, [m for m in protocol.methods if (protocol.out_dir / m).exists()])
    return write_summary(protocol, outcome, before, analysis, not_started, wall_seconds, in_progress=False)


def run_here(protocol: Protocol) -> None:
    """One env's protocol on this machine: its runs in order, one per device (or pinned core) at a time, then the
    analysis and summary.json."""
    out = protocol.out_dir
    start = time.time()
    deadline = None if protocol.max_minutes is None else start + 60 * protocol.max_minutes
    done = [m for m in protocol.methods
            if reached(protocol, m, out / m) or (protocol.seeds_apart and merge_seeds(protocol, m))]
    queue = training_runs(protocol, [m for m in protocol.methods if m not in done])
    slots = (list(protocol.devices) or
             ([str(c) for c in sorted(os.sched_getaffinity(0))] if protocol.seeds_apart else [None]))
    how = (f"each seed apart, {len(slots)} at a time (one per core)" if protocol.seeds_apart else
           f"{len(slots)} at a time")
    counts = (f"{protocol.seeds} seeds per method" +
              (f" ({', '.join(protocol.method_seeds)})" if protocol.method_seeds else ""))
    print(f"[protocol] {ledger.device_name()}; {protocol.env}; {counts}, {how}; "
          f"complete: {', '.join(done) or 'none'}"
          f"; to run: {', '.join(dict.fromkeys(r.name.split('/')[0] for r in queue)) or 'none'}", flush=True)
    found = summary_before(out)
    before = ledger.cut_off_runs(out, JobsRecord.read(out), found, pid_alive)
    if before != found:  # (now: jobs.json, which tells them, is written anew below)
        write_summary(protocol, None, before, {})
    record = JobsRecord("local", os.getpid())
    record.write(out)
    analysis = {}

    def started(name: str, pid: int) -> None:
        """jobs.json names the run's process and its start as it starts (--status, and a protocol run again, read
        it)."""
        record.jobs[name] = pid
        record.started[name] = round(time.time(), 1)
        record.write(out)

    def finished(name: str) -> None:
        """A run ended: its method merged and analysed where it is complete, summary.json written."""
        method = name.split("/")[0]
        if protocol.seeds_apart:
            merge_seeds(protocol, method)
        if not runner.stopped and reached(protocol, name, out / name):
            # now, while its agents are here: tools.export need not carry them after
            analysis.update(analyze(protocol, [method]))
        write_summary(protocol, runner.outcome, before, analysis)

    runner = LocalRunner(slots, protocol.seeds_apart, deadline, started, finished)
    left = runner.run(queue, protocol.max_minutes)
    summary = finish(protocol, runner.outcome, tuple(r.name for r in left), bool(runner.stopped),
                     round(time.time() - start, 1), before, analysis)
    for name, entry in summary.methods.items():
        exit_status = f", exit {entry.run['exit_status']}" if "exit_status" in entry.run else ""
        print(f"[protocol] {name}: {entry.env_steps_per_seed:,} env steps per seed ({entry.share_of_protocol:.0%}"
              f" of the protocol){exit_status}", flush=True)
    unfinished = [m for m, e in summary.methods.items() if not e.complete]
    if unfinished:
        print(f"[protocol] not complete: {', '.join(unfinished)}; continue with: {COMMAND} {shlex.quote(str(out))} "
              "--resume", flush=True)
    if runner.stopped:
        raise SystemExit(128 + runner.stopped[0])
    if any(e.run.get("exit_status") not in (None, 0) for e in summary.methods.values()):
        raise SystemExit(1)


def submit(protocol: Protocol, options: SlurmOptions) -> None:
    """One env's protocol on SLURM: a job for each run that is not complete and has no live job, and the finishing
    job after them; returns once submitted (`--status` follows them)."""
    out = protocol.out_dir
    record = JobsRecord.read(out)
    states = slurm_states([*record.jobs.values(), record.finish or ""]) if record.executor == "slurm" else {}
    live = {job_id for job_id, (state, _) in states.items() if state in LIVE_STATES}
    unfinished = training_runs(protocol, list(protocol.methods))
    runs = [r for r in unfinished if record.jobs.get(r.name) not in live]
    running = tuple(record.jobs[r.name] for r in unfinished if record.jobs.get(r.name) in live)
    prefix = f"{options.job_prefix}{protocol.env}-"
    first = not (out / "slurm").exists()
    try:
        ids = submit_to_slurm(dataclasses.replace(options, job_prefix=prefix), out / "slurm", runs,
                              FinishJob(finish, protocol), running)
    except ConfigError:  # refused: OUT_DIR is left as it was (a new one is not created)
        if first:
            shutil.rmtree(out / "slurm", ignore_errors=True)
        if not any(out.iterdir()):
            out.rmdir()
        raise
    if record.finish in live:  # the earlier finishing job: this one, after every run, replaces it
        subprocess.run(["scancel", record.finish], capture_output=True)
    earlier_jobs = record.jobs if record.executor == "slurm" else {}
    JobsRecord("slurm", jobs={**earlier_jobs, **{k: v for k, v in ids.items() if k != "finish"}},
               finish=ids["finish"]).write(out)
    print(f"[protocol] {protocol.env}: submitted {len(runs)} run(s) as SLURM jobs "
          f"{' '.join(ids[r.name] for r in runs) or '(none left to run)'}, then the analysis as job {ids['finish']}; "
          f"follow them with: {COMMAND} {shlex.quote(str(out))} --status", flush=True)
