"""MSFA learns: one seed at the miniature BabyAI's settings (tools.protocol's --scale mini) for 384k env steps,
then each path that learns is checked on greedy episodes of the train tasks, the way tools.analyze plays them.

- The Q loss: the greedy train-task return beats random play's in the same room.
- The phi loss (phi . w regressed on the reward): the reward-prediction error |phi . w - r| is small.
- The SF loss (phi as psi's pseudo-reward): along a greedy episode of train task w = e_k, Q = psi_k(s, a, e_k), so
  psi_k(s_t, a_t) - gamma psi_k(s_t+1, a_t+1) is the cumulant psi accounts for at step t; at pickups, where
  phi_k ~ 1, it must be a good part of phi_k (the SF TD target's phi term is what puts it there).

The margins come from measured runs of this test (docs/babyai.md, "The learning test"): as written, the greedy
train-task return 3.06 (random play: 0.39), |phi . w - r| 0.015 and psi's share of phi_k at pickups 0.30. With phi
left out of the SF TD target: 1.10, 0.004 and 0.01 (the Q loss alone still learns a policy; only the share fails).
With the reward regression removed: 0.06, 0.102, and 5 pickups in 80 episodes (all three fail).
"""

import shlex

import jax
import numpy as np
import pytest

import msfa_babyai as msfa
from common.envs.babyai import TRAIN_TASKS, random_policy_returns
from common.run import parse_args
from tools import analyze
from tools.protocol import SCALES
from tools.run_reader import RunReader

BUDGET = 384_000
EPISODES = 20


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """One seed of MSFA at the miniature settings, trained to BUDGET; its saved agent."""
    run_dir = tmp_path_factory.mktemp("learning") / "msfa"
    mini = SCALES["mini"]["babyai"]
    flags = [*shlex.split(mini["all"]), *shlex.split(mini["msfa"]), "--total-timesteps", str(BUDGET),
             "--eval-every", str(BUDGET), "--run-dir", str(run_dir)]
    msfa.main(parse_args(msfa.Args, flags))
    (agent,) = analyze.load_agents(run_dir)
    trace = analyze.rollout(agent, TRAIN_TASKS, EPISODES, use_gpi=False, key=jax.random.PRNGKey(0))
    return run_dir, agent, trace


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
