"""How tools.protocol runs its training runs: as SLURM jobs through submitit, or on this machine.

A run is a script's command and its run directory. Started anew it gets the command as is; a directory that holds a
run's settings or checkpoint gets `--resume` (the scripts continue exactly from their checkpoint, and a run stopped
before its first one starts over with its saved settings), one with other files `--overwrite`. So a job that is
requeued, preempted, timed out or killed and submitted again always continues where the run's files stand.

On SLURM (`TrainingJob`, one job per run, all submitted at once; SLURM schedules them): submitit's job process
supervises the script as its child. SLURM's warning before preemption or the time limit (USR2, `signal_delay_s`
ahead) reaches submitit, which calls `TrainingJob.checkpoint`: the script is sent SIGTERM, checkpoints and stops, and
submitit requeues the job, which resumes it. A job that SLURM itself ends (`scontrol requeue`, `scancel`, the time
limit reached) sends SIGTERM to every process of the job, the script included, which checkpoints within KillWait.
The child ignores USR2 (its default action would kill it before the checkpoint).

On one machine (`LocalRunner`): submitit's LocalExecutor cannot serve here. It starts every submitted job at once
(no queue: one method per device at a time would need a scheduler around it anyway), it has no way to pin a job to
a CPU core, and on Ctrl-C its controller SIGKILLs a job one second after SIGINT, before a run can write its
checkpoint. So a small runner does what it cannot: a queue of runs, one per device (CUDA_VISIBLE_DEVICES) or per
core (pinned, single-threaded) at a time, each in its own session so that Ctrl-C reaches it once, through SIGTERM.
"""

from __future__ import annotations

import contextlib
import io
import os
import shlex
import shutil
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import submitit

from common.run import ROOT

SINGLE_THREADED = "--xla_cpu_multi_thread_eigen=false"
"""XLA_FLAGS of a seed's run pinned to one core (XLA:CPU's ops stay on its thread)"""
LIVE_STATES = ("PENDING", "CONFIGURING", "RUNNING", "COMPLETING", "REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED",
               "RESIZING", "SUSPENDED", "STAGE_OUT", "SIGNALING")
"""SLURM job states of a job that will still run (or is running) its run"""
TIME_FORMAT = "%Y-%m-%d %H:%M:%S"
"""a run record's "ended" (local time)"""


def run_log(out: Path, job: str) -> Path:
    """OUT_DIR's log of a run's job (the script's output): OUT_DIR/<method>.log, or <method>.seed<k>.log for a seed
    trained apart."""
    return out / f"{job.replace('/', '.')}.log"


@dataclass
class Run:
    """One training run: its name in the protocol (the job's name), the script's command (without --run-dir and the
    resume flags), its run directory and its log (the script's output)."""

    name: str
    command: list[str]
    run_dir: Path
    log: Path

    def launch_command(self, max_minutes: float | None = None) -> list[str]:
        command = [*self.command, "--run-dir", str(self.run_dir)]
        if (self.run_dir / "checkpoint.eqx").exists() or (self.run_dir / "config.json").exists():
            command.append("--resume")
        elif self.run_dir.exists() and any(self.run_dir.iterdir()):
            command.append("--overwrite")
        if max_minutes is not None:
            command += ["--max-minutes", f"{max(max_minutes, 1.0 / 60):.2f}"]
        return command


def run_environment(run: Run, device: str | None = None, cpu_core: bool = False) -> dict[str, str]:
    """The environment of a run's process: on a GPU its CUDA_VISIBLE_DEVICES; pinned to a CPU core, XLA single-
    threaded (the pinning itself is taskset's).

    The protocol's runs share one cache of compiled programs (the folder .xla_cache beside their logs, which the
    OUT_DIR/*/ of the tools' commands does not match; JAX_COMPILATION_CACHE_DIR names another): a method's
    seeds run the same programs, so only its first seed compiles them (on a CPU core ~50 s of a miniature BabyAI
    seed's start). A cached program is the same executable, so the results do not change; an entry that a run reads
    while another still writes it is compiled again (JAX warns)."""
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    env.setdefault("JAX_COMPILATION_CACHE_DIR", str(run.log.parent / ".xla_cache"))
    env.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")  # also the many small programs of the start
    if device is not None and cpu_core:
        env["XLA_FLAGS"] = (env.get("XLA_FLAGS", "") + " " + SINGLE_THREADED).strip()
    elif device is not None:
        env["CUDA_VISIBLE_DEVICES"] = device
    env.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")  # runs (and the analysis) may share a device
    return env


def last_line(log: Path) -> str:
    lines = log.read_text(errors="replace").strip().splitlines() if log.exists() else []
    return lines[-1] if lines else "(empty log)"


def _ignore_preemption_signal() -> None:
    signal.signal(signal.SIGUSR2, signal.SIG_IGN)


# ---------------------------------------------------------------------------------------------------------- SLURM
class TrainingJob(submitit.helpers.Checkpointable):
    """A run as one SLURM job (submitit): the script runs as the job's child process, its output appended to the
    run's log. Returns the run's exit status; a run that fails raises with the log's last line (submitit records it
    as the job's error)."""

    def __init__(self, run: Run):
        self.run = run
        self.child: subprocess.Popen | None = None

    def __call__(self) -> dict:
        started = time.time()
        with self.run.log.open("a") as log:
            command = self.run.launch_command()
            print(f"[job {os.environ.get('SLURM_JOB_ID', '?')} restart {os.environ.get('SLURM_RESTART_COUNT', 0)}] "
                  f"{shlex.join(command)}", file=log, flush=True)
            self.child = subprocess.Popen(command, cwd=ROOT, env=run_environment(self.run), stdout=log,
                                          stderr=subprocess.STDOUT, preexec_fn=_ignore_preemption_signal)
            while self.child.poll() is None:  # (a signal handler may interrupt this loop; see checkpoint)
                time.sleep(1.0)
        status = self.child.returncode
        if status not in (0, 128 + signal.SIGTERM, 128 + signal.SIGINT):
            raise RuntimeError(f"{self.run.name} exited with status {status}: {last_line(self.run.log)}")
        return {"exit_status": status, "wall_seconds": round(time.time() - started, 1),
                "ended": time.strftime(TIME_FORMAT)}

    def checkpoint(self) -> submitit.helpers.DelayedSubmission:
        """Preemption or the time limit ahead (submitit's handler of SLURM's warning signal): the script checkpoints
        on SIGTERM and stops; the requeued job continues the run from that checkpoint."""
        child = self.child
        if child is not None and child.poll() is None:
            child.send_signal(signal.SIGTERM)
            try:  # (os.waitpid: Popen.wait's lock may be held by the interrupted poll above)
                os.waitpid(child.pid, 0)
            except ChildProcessError:
                pass
        return submitit.helpers.DelayedSubmission(TrainingJob(self.run))


class FinishJob:
    """The protocol's last job on SLURM (after every run's job ended, whatever their outcome): the analysis and
    summary.json."""

    def __init__(self, finish, *args):
        self.finish, self.args = finish, args

    def __call__(self):
        return self.finish(*self.args)


@dataclass
class SlurmOptions:
    partition: str | None
    account: str | None
    qos: str | None
    time_min: int
    gpus: int
    cpus: int
    mem: str | None
    sbatch: dict[str, str]
    job_prefix: str

    def executor(self, folder: Path) -> submitit.SlurmExecutor:
        executor = submitit.SlurmExecutor(folder=folder / "%j", max_num_timeout=1000)  # as many jobs as a run needs
        parameters = dict(time=self.time_min, cpus_per_task=self.cpus, signal_delay_s=120, stderr_to_stdout=True,
                          setup=[f"export PYTHONPATH={shlex.quote(str(ROOT))}${{PYTHONPATH:+:$PYTHONPATH}}",
                                 f"cd {shlex.quote(str(ROOT))}"],
                          additional_parameters=dict(self.sbatch))
        parameters |= {k: v for k, v in (("partition", self.partition), ("account", self.account),
                                          ("qos", self.qos), ("mem", self.mem)) if v is not None}
        if self.gpus:
            parameters["gpus_per_node"] = self.gpus
        executor.update_parameters(**parameters)
        return executor


def submit_to_slurm(options: SlurmOptions, folder: Path, runs: list[Run], finish: FinishJob,
                    running: tuple[str, ...] = ()) -> dict[str, str]:
    """Submits one job per run and, after all of them and the jobs `running` (ids) have ended, the finishing job;
    returns {run or "finish": job id}. A submission SLURM refuses (sbatch's own message) cancels those already
    submitted and stops with one line."""
    from common.run import require

    executor = options.executor(folder)
    ids: dict[str, str] = {}
    try:
        with contextlib.redirect_stderr(io.StringIO()):  # (submitit echoes sbatch's refusal; said once, below)
            for run in runs:
                executor.update_parameters(job_name=f"{options.job_prefix}{run.name}")
                ids[run.name] = executor.submit(TrainingJob(run)).job_id
            after = [*running, *ids.values()]
            executor.update_parameters(job_name=f"{options.job_prefix}finish",
                                       **({"dependency": f"afterany:{':'.join(after)}"} if after else {}))
            ids["finish"] = executor.submit(finish).job_id
    except submitit.core.utils.FailedJobError as refused:
        if ids:
            subprocess.run(["scancel", *ids.values()], capture_output=True)
        message = " ".join(line.strip() for line in str(refused).splitlines() if "error" in line.lower())
        require(False, f"--slurm: sbatch refused the job{' (the ones submitted are cancelled)' if ids else ''}: "
                       f"{message or str(refused).strip().splitlines()[-1]}")
    return ids


def slurm_states(job_ids: list[str]) -> dict[str, tuple[str, int]]:
    """{job id: (SLURM's state, times requeued)} of the jobs SLURM still knows (a finished job for MinJobAge)."""
    states = {}
    for job_id in filter(None, job_ids):
        shown = subprocess.run(["scontrol", "show", "job", "--oneliner", job_id], capture_output=True, text=True)
        fields = dict(f.split("=", 1) for f in shown.stdout.split() if "=" in f)
        if shown.returncode == 0 and "JobState" in fields:
            states[job_id] = (fields["JobState"], int(fields.get("Restarts", "0")))
    return states


def job_outcome(folder: Path, job_id: str) -> dict | None:
    """What a job returned ({"exit_status", "wall_seconds", "ended"}) or {"error": its traceback's last line}, from
    submitit's result file (None: the job wrote none: not ended, or killed)."""
    result = submitit.SlurmJob(folder / "%j", job_id).paths.result_pickle
    if not result.exists():
        return None
    outcome, value = submitit.core.utils.pickle_load(result)
    if outcome == "success":
        return dict(value) if isinstance(value, dict) else {"result": str(value)}
    return {"error": (str(value).strip().splitlines() or [""])[-1]}


# ---------------------------------------------------------------------------------------------------- one machine
def share_niceness(pid: int) -> None:
    """Give the session of process `pid` (a run: a session of its own) this process's niceness.

    Linux kernels that schedule each session as a group (autogroup, on by default in many distributions) share a core
    between sessions by the session's niceness, not its processes': a run inherits `nice python -m tools.protocol`'s
    niceness, but as a session of its own it would still take an equal share of the cores from the machine's other
    work. Where the kernel has no such groups there is nothing to do (the file is missing)."""
    niceness = os.nice(0)
    if niceness > 0:
        try:
            Path(f"/proc/{pid}/autogroup").write_text(str(niceness))
        except FileNotFoundError:  # no session groups in this kernel: the run's own niceness is what counts
            pass
        except OSError as error:
            print(f"[protocol] run {pid}'s session could not be made as nice as the protocol ({error}): it takes an "
                  "equal share of the cores from the machine's other work", file=sys.stderr)


class LocalProcess:
    """A run's process, its output copied to the terminal (prefixed) and to its log. device: a GPU
    (CUDA_VISIBLE_DEVICES), or with cpu_core a core the process is pinned to, single-threaded."""

    def __init__(self, run: Run, command: list[str], device: str | None, cpu_core: bool):
        if device is not None and cpu_core and shutil.which("taskset"):  # util-linux: the process and its threads
            command = ["taskset", "--cpu-list", device, *command]
        self.run, self.device, self.started = run, device, time.time()
        where = f" on {'core' if cpu_core else 'device'} {device}" if device is not None else ""
        print(f"[protocol] {time.strftime('%H:%M:%S')} {run.name}{where}: {shlex.join(command)}", flush=True)
        self.log = run.log.open("a")
        self.process = subprocess.Popen(command, cwd=ROOT, env=run_environment(run, device, cpu_core),
                                        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                        start_new_session=True)  # Ctrl-C reaches it through us, once
        share_niceness(self.process.pid)
        self.copier = threading.Thread(target=self._copy, daemon=True)
        self.copier.start()

    def _copy(self):
        for line in self.process.stdout:
            self.log.write(line)
            self.log.flush()
            print(f"[{self.run.name}] {line}", end="", flush=True)

    def finished(self) -> bool:
        if self.process.poll() is None:
            return False
        self.copier.join()
        self.log.close()
        return True


class LocalRunner:
    """Runs a queue of runs on this machine, one per slot (a GPU, or a CPU core with cpu_core) at a time, in order;
    Ctrl-C or SIGTERM stops every run cleanly (each checkpoints first) and starts no new one; with deadline (a
    time.time()) each run gets --max-minutes to stop by it, and none starts in its last minutes.
    on_started(run name, pid) and on_finished(run name) are called as each run starts and ends."""

    def __init__(self, slots: list[str | None], cpu_core: bool, deadline: float | None, on_started, on_finished):
        self.slots, self.cpu_core, self.deadline = list(slots), cpu_core, deadline
        self.on_started, self.on_finished = on_started, on_finished
        self.stopped: list[int] = []
        self.outcome: dict[str, dict] = {}

    def _on_signal(self, signum, frame):
        self.stopped.append(signum)
        for process in self.running.values():
            if process.process.poll() is None:
                process.process.send_signal(signal.SIGTERM)

    def run(self, queue: list[Run], max_minutes: float | None) -> list[Run]:
        """Runs the queue; returns the runs not started (stopped or out of time)."""
        queue = list(queue)
        self.running: dict[str, LocalProcess] = {}
        previous = {s: signal.signal(s, self._on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
        try:
            while queue or self.running:
                for name, process in list(self.running.items()):
                    if process.finished():
                        self.outcome[name] = {"exit_status": process.process.returncode,
                                              "wall_seconds": round(time.time() - process.started, 1),
                                              "ended": time.strftime(TIME_FORMAT)}
                        self.slots.append(process.device)
                        del self.running[name]
                        self.on_finished(name)
                margin = 0.0 if max_minutes is None else min(30.0, 0.25 * 60 * max_minutes)
                out_of_time = self.deadline is not None and time.time() > self.deadline - margin
                while queue and self.slots and not self.stopped and not out_of_time:
                    run = queue.pop(0)
                    left = None if self.deadline is None else (self.deadline - time.time()) / 60
                    self.running[run.name] = LocalProcess(run, run.launch_command(left), self.slots.pop(0),
                                                          self.cpu_core)
                    self.on_started(run.name, self.running[run.name].process.pid)
                if not self.running and (self.stopped or out_of_time or not queue):
                    break
                time.sleep(0.5)
        finally:
            for s, handler in previous.items():
                signal.signal(s, handler)
        return queue

