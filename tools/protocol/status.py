"""`--status`: one line per run of a protocol (per seed's run with seeds apart): its job and state, the env steps
reached, the last evaluation, its log; a failed one with its error's last line. It submits and runs nothing."""

from __future__ import annotations

import os
from pathlib import Path

from tools.protocol.ledger import JobsRecord
from tools.protocol.runners import LIVE_STATES, job_outcome, last_line, run_log, slurm_states
from tools.protocol.settings import Protocol, jobs, reached, steps_of
from tools.run_reader import RunReader


def last_evaluation(run_dir: Path) -> str:
    """The last evaluation's mean test return (with GPI where the method has it), over tasks and seeds."""
    reader = RunReader(run_dir)
    if not reader.has_eval():
        return "-"
    rows = [r for r in reader.eval_rows if r["split"] == "test"]
    if not rows:
        return "-"
    last = max(int(r["step"]) for r in rows)
    rows = [r for r in rows if int(r["step"]) == last]
    gpi = [r for r in rows if r["gpi"] == "1"] or rows
    return f"{sum(float(r['return_mean']) for r in gpi) / len(gpi):.2f} at {last:,}"


def status_lines(protocol: Protocol) -> list[str]:
    """One line per run of one env's protocol (per seed's run with seeds apart): job, state, progress, evaluation,
    log; a failed one with its error's last line."""
    out = protocol.out_dir
    record = JobsRecord.read(out)
    states = slurm_states(list(record.jobs.values())) if record.executor == "slurm" else {}
    protocol_alive = record.executor == "local" and pid_alive(record.protocol_pid)
    lines = []
    for name in protocol.methods:
        if protocol.seeds_apart and reached(protocol, name, out / name):
            names = [name]
        else:
            names = [job for job, _, _ in jobs(protocol, name)]
        for job in names:
            run_dir, job_id = out / job, record.jobs.get(job)
            steps, total = RunReader(run_dir).progress()
            total = steps_of(protocol, name) or total
            error = ""
            if reached(protocol, job, run_dir):
                state = "done"
            elif record.executor == "slurm" and job_id is not None:
                state, restarts = states.get(str(job_id), ("", 0))
                outcome = job_outcome(out / "slurm", str(job_id))
                if state in LIVE_STATES:
                    state = ("requeued" if state == "PENDING" and restarts else state.lower()) + (
                        f" (restarts {restarts})" if restarts else "")
                elif outcome is not None and "error" in outcome:
                    state, error = "failed", outcome["error"]
                else:
                    state = f"{state.lower() or 'ended'} before the end"
            elif record.executor == "local" and job_id is not None:
                state = "running" if pid_alive(job_id) else ("stopped" if not protocol_alive else "ended")
            else:
                state = "pending" if protocol_alive or record.executor == "slurm" else "not started"
            log = run_log(out, job)
            if state == "failed" and not error:
                error = last_line(log)
            lines.append(f"{protocol.env:9s} {job:24s} {str(job_id or '-'):>8s} {state:22s} "
                         f"{steps:>11,} / {total or 0:<11,} {last_evaluation(run_dir):>18s}  {log}"
                         + (f"\n{'':9s} error: {error}" if error else ""))
    return lines


def pid_alive(pid: int | None) -> bool:
    """Whether a local run's (or the protocol's own) process still exists: jobs.json keeps its pid."""
    if not pid:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
