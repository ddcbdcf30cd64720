"""The README's first run, as the README writes it: MSFA on BabyAI for a couple of minutes, its summary and its
learning-curve PNG. It must learn: the final greedy train-task return at least twice random play's (the stored
reference of the room)."""

import csv
import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def first_run_commands() -> list[str]:
    """The README's first-run block: its lines from the FIRST= settings to the plot (set-up and tests left out)."""
    readme = (ROOT / "README.md").read_text()
    section = readme.split("## Set up and a first run", 1)[1].split("\n## ", 1)[0]
    block = re.search(r"```bash\n(.*?)```", section, re.S).group(1)
    lines = block.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("FIRST="))
    end = next(i for i, line in enumerate(lines) if line.startswith("python -m tools.plot"))
    return lines[start:end + 1]


def test_the_readmes_first_run_learns_and_ends_with_a_summary_and_a_figure(tmp_path):
    commands = "\n".join(first_run_commands()).replace("runs/first", str(tmp_path / "first"))
    env = os.environ | {"PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}
    done = subprocess.run(["bash", "-euo", "pipefail", "-c", commands], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=1200)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    run = tmp_path / "first"
    assert (run / "learning_curves.png").stat().st_size > 10_000
    assert "| train |" in done.stdout and "random" in done.stdout  # tools.summarize's table beside the references
    rows = list(csv.DictReader(open(run / "eval.csv")))
    last = max(int(r["step"]) for r in rows)
    train = [float(r["return_mean"]) for r in rows if int(r["step"]) == last and r["split"] == "train"
             and r["gpi"] == "0"]
    from common.envs.babyai import TRAIN_TASKS
    from tools import reference_returns
    from tools.run_reader import RunReader

    stored = reference_returns.stored("babyai", reference_returns.room_setting(RunReader(run).babyai_room()))
    random = sum(stored["returns"]["random"][",".join(f"{x:g}" for x in w)]["mean"] for w in TRAIN_TASKS) / 4
    print(f"first run: greedy train-task return {sum(train) / len(train):.2f} at step {last:,}; random play "
          f"{random:.2f}")
    assert sum(train) / len(train) >= 2 * random, (train, random)
