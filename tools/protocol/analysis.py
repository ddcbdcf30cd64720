"""The protocol's analysis: tools.analyze of each method's saved agents into OUT_DIR/<method>/analysis/, where the
env has one (methods.ANALYSES): a seed trained apart is played as soon as it is complete, and its method reported
from its seeds' records once all are."""

from __future__ import annotations

import shlex
import subprocess
import sys
import time
from pathlib import Path

import tools.protocol.methods as methods
from common.run import ROOT
from tools.protocol.runners import Run, run_environment
from tools.protocol.settings import Protocol, jobs, reached
from tools.run_reader import analyzed, saved_agents


def run_analysis(protocol: Protocol, name: str, run_dir: Path, flags: list[str]) -> bool:
    """One tools.analyze into run_dir/analysis/, its output in OUT_DIR/<name>.analysis.log; whether it worked."""
    from tools import analyze as analysis_module  # (its module path, not written out: a moved tool moves here too)

    command = [sys.executable, "-m", analysis_module.__spec__.name, *flags, "--out", str(run_dir / "analysis"),
               "--episodes", str(protocol.analysis_episodes)]
    log = protocol.out_dir / f"{name.replace('/', '.')}.analysis.log"
    print(f"[protocol] {time.strftime('%H:%M:%S')} analyse {name}: {shlex.join(command)}", flush=True)
    env = run_environment(Run(f"{name}.analysis", command, run_dir, log))  # the runs' compile cache
    with log.open("w") as f:
        return subprocess.run(command, cwd=ROOT, stdout=f, stderr=subprocess.STDOUT, env=env).returncode == 0


def analyze(protocol: Protocol, names: list[str]) -> dict[str, str]:
    """tools.analyze of each method's saved agents into OUT_DIR/<method>/analysis/ (where the env has one), once.
    Trained seed by seed, each complete seed is played as soon as it is (OUT_DIR/<method>/seed<k>/analysis/, its
    records), and the method, once complete, is reported from its seeds' records (--records): so a seed's agent is
    needed only until it is played, and tools.export carries the records instead. Returns what each method's
    analysis says (summary.json's "analysis")."""
    outcome = {}
    for name in names:
        run_dir = protocol.out_dir / name
        if protocol.env not in methods.ANALYSES:  # (looked up now: tests stand in another table)
            outcome[name] = f"none for {protocol.env}"
            continue
        if analyzed(run_dir):
            outcome[name] = "ok"
            continue
        if not protocol.seeds_apart:
            if not saved_agents(run_dir):
                outcome[name] = "no saved agents"
            elif not run_analysis(protocol, name, run_dir, [str(run_dir)]):
                outcome[name] = f"failed ({name}.analysis.log)"
            else:
                outcome[name] = "ok"
            continue
        seed_jobs = [job for job, _, _ in jobs(protocol, name)]
        seed_dirs = [protocol.out_dir / job for job in seed_jobs]
        failed = []
        for job, seed_dir in zip(seed_jobs, seed_dirs):
            if reached(protocol, name, seed_dir) and not analyzed(seed_dir):
                if not saved_agents(seed_dir) or not run_analysis(protocol, job, seed_dir, [str(seed_dir)]):
                    failed.append(job)
        played = [d for d in seed_dirs if analyzed(d)]
        if failed:
            outcome[name] = f"failed: {', '.join(failed)} (their .analysis.log)"
        elif not reached(protocol, name, run_dir):
            outcome[name] = f"{len(played)} of {len(seed_dirs)} seeds played"
        elif len(played) < len(seed_dirs):
            outcome[name] = f"seeds without records: {[d.name for d in seed_dirs if d not in played]}"
        elif run_analysis(protocol, name, run_dir, ["--records", *(str(d / "analysis") for d in played)]):
            outcome[name] = "ok"
        else:
            outcome[name] = f"failed ({name}.analysis.log)"
    return outcome
