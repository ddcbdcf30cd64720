"""The protocol's records, each with one reader and one writer: OUT_DIR/jobs.json (JobsRecord: how the runs were
started, each run's process or SLURM job) and OUT_DIR/summary.json (Summary: the device, the settings and, per
method, its progress, its runs' records through every invocation, what its analysis said and why it is not done).

summary.json is written as each run ends as well as at the protocol's end (write_summary); a run's record is what its
job returned (RunRecord), kept with its keys in the order the job gave them, so that a record read back and written
again is the same text."""

from __future__ import annotations

import json
import shlex
import time
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Callable, TypedDict

from common.run import ROOT
from tools.protocol.runners import TIME_FORMAT, job_outcome, run_log
from tools.protocol.seeds import method_progress
from tools.protocol.settings import Protocol, jobs, method_seeds, reached, run_flags


def write_json(path: Path, data: dict) -> None:
    """path written whole or not at all (a reader, or a protocol cut off mid-write, never sees half a file)"""
    path.with_name(path.name + ".tmp").write_text(json.dumps(data, indent=1))
    path.with_name(path.name + ".tmp").replace(path)


# ------------------------------------------------------------------------------------------------------ jobs.json
@dataclass
class JobsRecord:
    """OUT_DIR/jobs.json: how the runs were started (executor "local" or "slurm"; None: not yet) and each run's job
    ({run: its process id, or its SLURM job id}); the protocol's own process (local) or its finishing job (SLURM);
    when each local run's process started (time.time()), so that a run cut off with the protocol (the machine or
    the session ended under it: no exit status was recorded) still has its wall time counted (cut_off_runs)."""

    executor: str | None = None
    protocol_pid: int | None = None
    jobs: dict[str, int | str] = field(default_factory=dict)
    finish: str | None = None
    started: dict[str, float] = field(default_factory=dict)

    @classmethod
    def read(cls, out: Path) -> JobsRecord:
        """OUT_DIR's record (an empty one where no run was started there)."""
        path = out / "jobs.json"
        if not path.exists():
            return cls()
        data = json.loads(path.read_text())
        return cls(data["executor"], data.get("protocol_pid"), data["jobs"], data.get("finish"),
                   data.get("started", {}))

    def write(self, out: Path) -> None:
        """OUT_DIR/jobs.json: executor and jobs, and the pid, finishing job and start times where there are any."""
        write_json(out / "jobs.json", {f.name: getattr(self, f.name) for f in fields(self)
                                       if f.name in ("executor", "jobs") or getattr(self, f.name)})


# --------------------------------------------------------------------------------------------------- summary.json
class RunRecord(TypedDict, total=False):
    """summary.json's record of a run's job: what it returned (tools.protocol.runners: exit status, wall time, end;
    or its error, or another result), its SLURM job id, and the records of the run's jobs before this one."""

    exit_status: int
    wall_seconds: float
    ended: str
    error: str
    result: str
    job_id: str
    earlier: list[RunRecord]


RUN_RECORD = tuple(RunRecord.__annotations__)
"""what summary.json records of a run's job (tools.protocol.runners), and of its jobs before this one ("earlier")"""


def run_record(before: RunRecord | None, now: RunRecord | None) -> RunRecord:
    """summary.json's record of a run: its job in this protocol's invocation, the earlier invocations' jobs of it
    listed under "earlier" (a run stopped and resumed, or started over); the earlier record alone where this
    invocation did not run it (it came complete), so that a resumed protocol keeps every run's times.

    A job is known by its SLURM job id: the same id recorded again (another invocation's finishing job, or a job
    first seen running and now ended) updates its record. A local job is always this invocation's own, however alike
    its record is to an earlier one (two short runs can end in the same second after the same wall time)."""
    if not now:
        return dict(before or {})
    if not before:
        return dict(now)
    before = dict(before)
    earlier = before.pop("earlier", [])
    if now.get("job_id") is not None and before.get("job_id") == now["job_id"]:
        return {**now, "earlier": earlier} if earlier else dict(now)
    return {**now, "earlier": [*earlier, before]}


@dataclass
class MethodSummary:
    """summary.json's entry of a method: its command and progress, then its runs' records (a method trained whole:
    its run's RunRecord, whose keys stand in the entry itself; seeds trained apart: seed_runs, {job: RunRecord}),
    what its analysis last said, and where this invocation ended before its turn, what is left of it (status)."""

    command: str
    env_steps_per_seed: int
    total_timesteps: int | None
    share_of_protocol: float
    complete: bool
    run: RunRecord = field(default_factory=dict)
    seed_runs: dict[str, RunRecord] | None = None
    analysis: str | None = None
    status: str | None = None

    def to_json(self) -> dict:
        """The entry as summary.json holds it."""
        entry = {"command": self.command, "env_steps_per_seed": self.env_steps_per_seed,
                 "total_timesteps": self.total_timesteps, "share_of_protocol": self.share_of_protocol,
                 "complete": self.complete}
        if self.seed_runs is not None:
            entry["seed_runs"] = self.seed_runs
        entry |= self.run
        entry |= {k: getattr(self, k) for k in ("analysis", "status") if getattr(self, k) is not None}
        return entry

    @classmethod
    def from_json(cls, entry: dict) -> MethodSummary:
        """An entry as summary.json holds it ({}: a method it does not hold yet); its run's record in RUN_RECORD's
        order."""
        return cls(entry.get("command", ""), entry.get("env_steps_per_seed", 0), entry.get("total_timesteps"),
                   entry.get("share_of_protocol", 0.0), entry.get("complete", False),
                   {k: entry[k] for k in RUN_RECORD if k in entry}, entry.get("seed_runs"), entry.get("analysis"),
                   entry.get("status"))


@dataclass
class Summary:
    """OUT_DIR/summary.json: the device, the protocol's settings, how its runs were started (jobs.json's executor),
    this invocation's wall time (at its end), whether it is under way, and each method's entry in the protocol's
    order."""

    device: str
    env: str
    scale: str
    seeds: int
    method_seeds: dict[str, int]
    seeds_apart: bool
    extra: str
    devices: list[str]
    executor: str | None
    wall_seconds: float | None
    in_progress: bool
    methods: dict[str, MethodSummary] = field(default_factory=dict)

    @classmethod
    def read(cls, out: Path) -> Summary | None:
        """OUT_DIR/summary.json (None where there is none; a setting an older protocol did not record: None)."""
        path = out / "summary.json"
        if not path.exists():
            return None
        data = json.loads(path.read_text())
        return cls(**{f.name: data.get(f.name) for f in fields(cls) if f.name != "methods"},
                   methods={name: MethodSummary.from_json(entry) for name, entry in data["methods"].items()})

    def write(self, out: Path) -> None:
        """OUT_DIR/summary.json, whole or not at all."""
        write_json(out / "summary.json", {f.name: getattr(self, f.name) for f in fields(self)} |
                   {"methods": {name: entry.to_json() for name, entry in self.methods.items()}})


def summary_before(out: Path) -> dict[str, MethodSummary]:
    """summary.json's records of the methods as an invocation of the protocol found them (an earlier invocation's)."""
    summary = Summary.read(out)
    return summary.methods if summary is not None else {}


CUT_OFF = "cut off with the protocol (no exit status)"
"""a RunRecord's result where the run's process ended with the protocol's, unrecorded (cut_off_runs)"""


def cut_off_runs(out: Path, previous: JobsRecord, before: dict[str, MethodSummary],
                 alive: Callable[[int], bool]) -> dict[str, MethodSummary]:
    """before (summary_before), with a record for each local run that the previous invocation (previous: its
    jobs.json) started and never recorded as ended: its process and the protocol's ended together (a machine or a
    session ending kills both), so no exit status was returned. Its wall time is from its start (jobs.json) to the
    last line its log received; the record joins the run's earlier ones (run_record), so that summary.json counts
    every process a run took. A run whose record ended after it started (it ended, or was stopped, under the
    protocol) or whose process is still alive gets none."""
    if previous.executor != "local":
        return before
    before = dict(before)
    for job, began in previous.started.items():
        log = run_log(out, job)
        method = job.split("/")[0]
        entry = before.get(method) or MethodSummary.from_json({})
        latest = (entry.seed_runs or {}).get(job) if "/" in job else entry.run
        ended = time.mktime(time.strptime(latest["ended"], TIME_FORMAT)) if latest and "ended" in latest else None
        if (ended is not None and ended >= int(began)) or alive(int(previous.jobs.get(job, 0))) or not log.exists():
            continue
        last = log.stat().st_mtime
        cut: RunRecord = {"result": CUT_OFF, "wall_seconds": round(max(0.0, last - began), 1),
                          "ended": time.strftime(TIME_FORMAT, time.localtime(last))}
        if "/" in job:
            entry = replace(entry, seed_runs={**(entry.seed_runs or {}), job: run_record(latest, cut)})
        else:
            entry = replace(entry, run=run_record(latest, cut))
        before[method] = entry
    return before


def write_summary(protocol: Protocol, outcome: dict[str, RunRecord] | None, before: dict[str, MethodSummary] | None,
                  analysis: dict[str, str], not_started: tuple[str, ...] = (), wall_seconds: float | None = None,
                  in_progress: bool = True) -> Summary:
    """OUT_DIR/summary.json: the device and, per method, its progress and its runs' records, this invocation's
    (outcome) after the earlier invocations' (before: summary_before at this invocation's start). Written as each
    run ends (in_progress) as well as at the end, so that a protocol that never reaches its end (the machine
    restarted under it) keeps the records of the runs it finished."""
    out = protocol.out_dir
    record = JobsRecord.read(out)
    summary = Summary(device_name(), protocol.env, protocol.scale, protocol.seeds, method_seeds(protocol.method_seeds),
                      protocol.seeds_apart, protocol.extra, list(protocol.devices), record.executor, wall_seconds,
                      in_progress)
    outcome = dict(outcome or {})
    if record.executor == "slurm":
        for job, job_id in record.jobs.items():
            outcome.setdefault(job, {"job_id": job_id} | (job_outcome(out / "slurm", job_id) or {}))
    before = summary_before(out) if before is None else before
    for name in protocol.methods:
        steps, total = method_progress(protocol, name)
        script, *flags = run_flags(protocol, name)
        entry = MethodSummary(shlex.join([str(Path(script).relative_to(ROOT)), *flags]), steps, total,
                              round(steps / total, 4) if total else 0.0, reached(protocol, name, out / name))
        earlier = before.get(name) or MethodSummary.from_json({})
        if protocol.seeds_apart:
            seed_runs = earlier.seed_runs or {}
            entry.seed_runs = {job: run_record(seed_runs.get(job), outcome.get(job))
                               for job, _, _ in jobs(protocol, name) if job in outcome or job in seed_runs}
        else:
            entry.run = run_record(earlier.run, outcome.get(name))
        if name in analysis or earlier.analysis is not None:  # the latest said, this invocation's or an earlier one's
            entry.analysis = analysis.get(name, earlier.analysis)
        runs = [job for job, _, _ in jobs(protocol, name)]
        if any(job in not_started for job in runs):  # its turn had not come when this invocation ended
            begun = any((out / job).exists() for job in runs)
            left = [job.split("/")[-1] for job in runs if not reached(protocol, job, out / job)]
            entry.status = ("not started" if not begun else
                            f"seeds to run: {', '.join(left)}" if protocol.seeds_apart else "to continue")
        summary.methods[name] = entry
    summary.write(out)
    return summary


def device_name() -> str:
    """The devices JAX sees here, and its version: summary.json's and the protocol's first line's "device"."""
    import jax

    devices = jax.devices()
    return f"{len(devices)} x {devices[0].device_kind} ({jax.default_backend()}), jax {jax.__version__}"
