"""A single-node SLURM cluster on this machine, for the tests of `tools.protocol --slurm`: MUNGE, slurmctld and
slurmd (Debian's `slurm-wlm` and `munge`, which .ci/run installs), configured by a slurm.conf in a temporary folder
and stopped by the daemons' own process ids. It needs root (the daemons run as root here, as on a CI machine).

    with SlurmCluster(tmp_path) as cluster:    # sets SLURM_CONF for this process and its children
        subprocess.run(["sbatch", ...], env=cluster.env)
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

DAEMONS = ("munged", "slurmctld", "slurmd")
MUNGE_KEY = Path("/etc/munge/munge.key")


def missing() -> str | None:
    """Why no cluster can start here (None: it can)."""
    path = f"{os.environ['PATH']}:/usr/sbin:/sbin"
    absent = [d for d in (*DAEMONS, "sbatch", "squeue", "scontrol") if not shutil.which(d, path=path)]
    if absent:
        return f"SLURM is not installed (no {', '.join(absent)}): apt-get install slurm-wlm munge"
    if os.geteuid() != 0:
        return "the test cluster's daemons must start as root"
    return None


class SlurmCluster:
    """MUNGE + slurmctld + slurmd with one node (this machine's CPUs) and one partition, `debug`."""

    def __init__(self, folder: Path, cpus: int | None = None):
        self.folder = Path(folder)
        self.host = socket.gethostname().split(".")[0]
        self.cpus = cpus or os.cpu_count()
        self.conf = self.folder / "slurm.conf"
        self.env = dict(os.environ, SLURM_CONF=str(self.conf), PATH=f"{os.environ['PATH']}:/usr/sbin:/sbin")
        self.pids: dict[str, int] = {}

    def _write_conf(self) -> None:
        f = self.folder
        for d in ("state", "spool", "munge"):
            (f / d).mkdir(parents=True, exist_ok=True)
        self.conf.write_text("\n".join([
            "ClusterName=msfa-test", f"SlurmctldHost={self.host}", "SlurmUser=root", "SlurmdUser=root",
            "AuthType=auth/munge", f"AuthInfo=socket={f / 'munge' / 'munge.socket'}",
            f"StateSaveLocation={f / 'state'}", f"SlurmdSpoolDir={f / 'spool'}",
            f"SlurmctldPidFile={f / 'slurmctld.pid'}", f"SlurmdPidFile={f / 'slurmd.pid'}",
            f"SlurmctldLogFile={f / 'slurmctld.log'}", f"SlurmdLogFile={f / 'slurmd.log'}",
            "ProctrackType=proctrack/linuxproc", "TaskPlugin=task/none", "JobAcctGatherType=jobacct_gather/none",
            "SelectType=select/cons_tres", "SelectTypeParameters=CR_Core", "ReturnToService=2",
            "SchedulerType=sched/builtin", "SchedulerParameters=sched_interval=2", "MinJobAge=600",
            "KillWait=60", "MpiDefault=none",
            f"NodeName={self.host} CPUs={self.cpus} State=UNKNOWN",
            f"PartitionName=debug Nodes={self.host} Default=YES MaxTime=INFINITE State=UP", ""]))

    def __enter__(self) -> "SlurmCluster":
        self._write_conf()
        socket_path = self.folder / "munge" / "munge.socket"
        if not MUNGE_KEY.exists():
            MUNGE_KEY.parent.mkdir(parents=True, exist_ok=True)
            MUNGE_KEY.write_bytes(os.urandom(1024))
            MUNGE_KEY.chmod(0o400)
        munge_pid = self.folder / "munged.pid"
        subprocess.run(["munged", "--force", f"--socket={socket_path}", f"--pid-file={munge_pid}",
                        f"--log-file={self.folder / 'munged.log'}", f"--seed-file={self.folder / 'munge.seed'}"],
                       check=True, env=self.env, capture_output=True)
        self.pids["munged"] = int(munge_pid.read_text())
        for daemon in ("slurmctld", "slurmd"):
            subprocess.run([daemon], check=True, env=self.env, capture_output=True)
        for daemon in ("slurmctld", "slurmd"):
            self.pids[daemon] = self._wait_for_pid(self.folder / f"{daemon}.pid")
        deadline = time.time() + 60
        while time.time() < deadline:
            state = subprocess.run(["sinfo", "-h", "-o", "%T"], env=self.env, capture_output=True, text=True)
            if state.returncode == 0 and state.stdout.strip() == "idle":
                return self
            time.sleep(0.5)
        self.__exit__()
        raise RuntimeError(f"the test cluster's node did not become idle: see {self.folder}/slurm*.log")

    @staticmethod
    def _wait_for_pid(path: Path) -> int:
        deadline = time.time() + 30
        while time.time() < deadline:
            if path.exists() and path.read_text().strip():
                return int(path.read_text())
            time.sleep(0.1)
        raise RuntimeError(f"{path} did not appear")

    def __exit__(self, *exc) -> None:
        subprocess.run(["scancel", "--full", "--user=root"], env=self.env, capture_output=True)
        for daemon in ("slurmd", "slurmctld", "munged"):
            pid = self.pids.pop(daemon, None)
            if pid is None:
                continue
            try:
                os.kill(pid, signal.SIGTERM)
            except ProcessLookupError:
                continue
            deadline = time.time() + 15
            while time.time() < deadline:
                try:
                    os.kill(pid, 0)
                except ProcessLookupError:
                    break
                time.sleep(0.1)
            else:
                os.kill(pid, signal.SIGKILL)
