"""MSFA learns, and the README's first run is the run that shows it: its commands run as the README writes them
(MSFA on BabyAI in a 6 x 6 room with networks a quarter as wide, 128k env steps, then tools.summarize and
tools.plot), and the saved agent is checked path by path on greedy episodes of the train tasks, the way
tools.analyze plays them.

- The first run as written: it ends with tools.summarize's table beside the references and a learning-curve PNG,
  and its own last evaluation's greedy train-task return is at least twice random play's (the stored reference).
- The Q loss: the greedy train-task return beats random play's in the same room.
- The phi loss (phi . w regressed on the reward): the reward-prediction error |phi . w - r| is small.
- The SF loss (phi as psi's pseudo-reward): along a greedy episode of train task w = e_k, Q = psi_k(s, a, e_k), so
  psi_k(s_t, a_t) - gamma psi_k(s_t+1, a_t+1) is the cumulant psi accounts for at step t; at pickups, where
  phi_k ~ 1, it must be a good part of phi_k (the SF TD target's phi term is what puts it there).

The margins come from measured runs of this test, as written and with each loss broken (docs/babyai.md, "The
learning test").
"""

import csv
import os
import re
import subprocess
import sys
from pathlib import Path

import jax
import numpy as np
import pytest

from common.envs.babyai import TRAIN_TASKS, random_policy_returns
from tools import analyze, reference_returns
from tools.run_reader import RunReader

ROOT = Path(__file__).resolve().parent.parent
EPISODES = 20


def first_run_commands() -> list[str]:
    """The README's first-run block: its lines from the FIRST= settings to the plot (set-up and tests left out)."""
    readme = (ROOT / "README.md").read_text()
    section = readme.split("## Set up and a first run", 1)[1].split("\n## ", 1)[0]
    block = re.search(r"```bash\n(.*?)```", section, re.S).group(1)
    lines = block.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("FIRST="))
    end = next(i for i, line in enumerate(lines) if line.startswith("python -m tools.plot"))
    return lines[start:end + 1]


@pytest.fixture(scope="module")
def first_run(tmp_path_factory):
    """The README's first run, as written, in a folder of its own: (its folder, what it printed)."""
    run = tmp_path_factory.mktemp("learning") / "first"
    commands = "\n".join(first_run_commands()).replace("runs/first", str(run))
    env = os.environ | {"PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}
    done = subprocess.run(["bash", "-euo", "pipefail", "-c", commands], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=1800)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return run, done.stdout


@pytest.fixture(scope="module")
def trained(first_run):
    """The first run's saved agent and 20 greedy episodes of each train task, acting on w."""
    run, _ = first_run
    (agent,) = analyze.load_agents(run)
    trace = analyze.rollout(agent, TRAIN_TASKS, EPISODES, use_gpi=False, key=jax.random.PRNGKey(0))
    return run, agent, trace


def test_the_readmes_first_run_learns_and_ends_with_a_summary_and_a_figure(first_run):
    run, printed = first_run
    assert (run / "learning_curves.png").stat().st_size > 10_000
    assert "| train |" in printed and "random" in printed  # tools.summarize's table beside the references
    rows = list(csv.DictReader(open(run / "eval.csv")))
    last = max(int(r["step"]) for r in rows)
    train = [float(r["return_mean"]) for r in rows if int(r["step"]) == last and r["split"] == "train"
             and r["gpi"] == "0"]
    stored = reference_returns.stored("babyai", reference_returns.room_setting(RunReader(run).babyai_room()))
    random = np.mean([stored["returns"]["random"][",".join(f"{x:g}" for x in w)]["mean"] for w in TRAIN_TASKS])
    print(f"first run: greedy train-task return {np.mean(train):.2f} at step {last:,}; random play {random:.2f}")
    assert np.mean(train) >= 2 * random, (train, random)


def test_the_greedy_policy_beats_random_play(trained):
    run_dir, agent, trace = trained
    random_return = float(np.mean(random_policy_returns(TRAIN_TASKS, 100, env=RunReader(run_dir).babyai_room())[0]))
    greedy_return = float(trace["reward"].sum(-1).mean())
    print(f"greedy train-task return {greedy_return:.2f}, random play {random_return:.2f}")
    assert greedy_return > max(2 * random_return, 0.8), (greedy_return, random_return)


def test_phi_dot_w_predicts_the_reward(trained):
    _, _, trace = trained
    absolute, _ = analyze.prediction_errors(trace, TRAIN_TASKS)
    print(f"|phi . w - r| on the train tasks: {absolute.mean():.4f}")
    assert absolute.mean() < 0.05


def test_psi_accounts_for_the_cumulant_at_pickups(trained):
    _, agent, trace = trained
    gamma = agent.args.gamma
    q = trace["q"]  # [task, episode, T]: psi_k(s_t, a_t, e_k), the value of the chosen action
    accounted = q[..., :-1] - gamma * q[..., 1:]  # [task, episode, T-1]
    phi_own = np.stack([trace["phi"][k, ..., k] for k in range(len(TRAIN_TASKS))])  # task k's own cumulant
    pickups = trace["reward"][..., :-1] > 0
    assert pickups.sum() >= 20, "too few pickups to judge psi"
    share = float(accounted[pickups].mean() / phi_own[pickups].mean())
    print(f"share of phi_k that psi accounts for at {pickups.sum()} pickups: {share:.2f}")
    assert share > 0.15, share
