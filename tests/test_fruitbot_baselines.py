"""usfa.py and uvfa.py --env fruitbot: the paper's Fruitbot sizes, the terminal transition's cumulant, the UVFA
family's value transform, bad input, tiny runs with the JAX game (USFA both ways, MVFA; UVFA and UVFA-FARM traced
through a training iteration) and through the procgen host env (USFA, UVFA)."""

import csv

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import usfa
import uvfa
from common.envs.fruitbot import TEST_TASKS, TRAIN_TASKS
from common.networks import count_params, prev_action_reward
from helpers import assert_a_uvfa_training_iteration_traces, replayed_evaluation

# the JAX game's level pools are kept small (8 training levels per task, 4 evaluation levels): quick to generate
RUN = dict(env="fruitbot", num_envs=4, sequence_period=8, sequence_length=9, replay_size=64, min_replay_size=8,
           batch_size=4, samples_per_insert=1.0, target_update_period=3, eval_episodes=1, lstm_size=16, max_levels=1,
           train_levels=8, eval_levels=4)
TINY = RUN | dict(psi_hidden=(8,), phi_hidden=(8,))
TINY_UVFA = RUN | dict(num_modules=2, module_size=8, attention_heads=1, q_hidden=(8,))
PROCGEN = dict(env_backend="procgen", distribution_mode="hard")
JAX_STEPS = 320  # 80 steps per env: the paper game's first barrier row is up to 30 rows up, so lifetimes end


@pytest.mark.parametrize("learned, paper", [(True, 1.98e6), (False, None)])
def test_parameter_counts_follow_the_papers_fruitbot_sizes(learned, paper):
    """USFA with learned cumulants on Fruitbot: paper 1.98M (LSTM 300, Impala torso, psi MLP [512, 512])."""
    args = usfa.Args(env="fruitbot", learned_cumulants=learned)
    assert (args.lstm_size, args.psi_hidden, args.replay_size, args.importance_exponent) == (300, (512, 512), 70_000,
                                                                                             0.6)
    num = count_params(usfa.make_network(args, jax.random.PRNGKey(0)))
    assert num == (1_980_016 if learned else 1_759_340)
    if paper:
        assert abs(num - paper) / paper < 0.05


def test_babyai_defaults_are_unchanged():
    args = usfa.Args()
    assert (args.lstm_size, args.psi_hidden, args.replay_size, args.min_replay_size, args.total_timesteps) == (
        512, (128,), 100_000, 100, 5_000_000)


def test_the_terminal_transitions_next_state_carries_the_state_onto_the_next_frame():
    args = usfa.Args(**TINY, learned_cumulants=True)
    net = usfa.make_network(args, jax.random.PRNGKey(0))
    k = jax.random.split(jax.random.PRNGKey(1), 4)
    length = 6
    steps = usfa.Step(
        obs=jax.random.randint(k[0], (length, 64, 64, 3), 0, 255).astype(jnp.uint8),
        w=jnp.broadcast_to(jnp.array([0.0, 1, 0, 0]), (length, 4)), prev_action=jnp.zeros(length, jnp.int32),
        prev_reward=jnp.zeros(length), first=jnp.zeros(length, bool).at[3].set(True),
        action=jax.random.randint(k[1], (length,), 0, 15), reward=jax.random.normal(k[2], (length,)),
        phi=jnp.zeros((length, 4)), final_obs=jnp.zeros((length, 0), jnp.uint8),
        terminal=jnp.zeros(length, bool).at[2].set(True))
    seq = usfa.Sequence(steps=steps, state=(jnp.zeros(16),) * 2)
    maps, states = usfa.unroll(net.core, lambda x: x, seq)
    h_next = usfa.next_states(net.core, lambda x: x, seq, states, args, maps)
    carried = net.core.recur(maps[3], prev_action_reward(steps.action[2], steps.reward[2], 15), (states[0][2], states[1][2]))
    np.testing.assert_allclose(h_next[2], carried[0], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(h_next[np.array([0, 1, 3, 4])], states[0][np.array([1, 2, 4, 5])])


@pytest.mark.parametrize("flags, count, paper", [({}, 1_964_624, 1.96e6), ({"farm": True}, 2_148_992, 2.15e6),
                                                ({"modular": True}, 3_752_624, None)], ids=["uvfa", "farm", "mvfa"])
def test_uvfa_family_parameter_counts_follow_the_papers_fruitbot_sizes(flags, count, paper):
    """Paper: UVFA 1.96M (LSTM 256), UVFA-FARM 2.15M (4 modules x 64); MVFA is not reported (its module-specific
    duelling heads of [512, 512] make it larger)."""
    args = uvfa.Args(env="fruitbot", **flags)
    assert args.value_transform == "signed_hyperbolic" and uvfa.Args().value_transform == "identity"
    num = count_params(uvfa.make_network(args, jax.random.PRNGKey(0)))
    assert num == count
    if paper:
        assert abs(num - paper) / paper < 0.05


def test_signed_hyperbolic_targets_hand_worked():
    """h(x) = sign(x)(sqrt(|x| + 1) - 1) + 1e-3 x and its inverse; G = h(r_0 + gamma h^-1(v_1)) for one step."""
    x = jnp.array([-10.0, -1, 0, 0.5, 3, 100])
    h = uvfa.signed_hyperbolic(x)
    np.testing.assert_allclose(h[4], 1.0 + 3e-3, rtol=1e-6)  # sqrt(4) - 1 + 0.003
    np.testing.assert_allclose(uvfa.signed_parabolic(h), x, rtol=1e-4, atol=1e-5)
    args = uvfa.Args(env="fruitbot")
    h_fn, h_inv = uvfa.value_transform_pair(args)
    g, _ = uvfa.n_step_targets(jnp.array([2.0]), h_inv(jnp.array([0.0, h[4]])), jnp.array([True]), 1, 0.5)
    np.testing.assert_allclose(h_fn(g), uvfa.signed_hyperbolic(jnp.array([2.0 + 0.5 * 3.0])), rtol=1e-4)


@pytest.mark.parametrize("overrides, message", [
    (dict(env="atari"), "--env must be one of babyai, fruitbot, minihack"),
    (dict(env="fruitbot", truncate_task_input=True), "--truncate-task-input is a BabyAI setting"),
    (dict(gpi_support="test"), "--gpi-support test is the original's Fruitbot evaluator"),
    (dict(env="fruitbot", distribution_mode="medium"), "--distribution-mode must be one of paper, hard, easy"),
    (dict(env="fruitbot", env_backend="gym"), "--env-backend must be one of jax, procgen"),
    (dict(env="fruitbot", env_backend="procgen"),
     "--distribution-mode paper (the original's per-task games) runs only with --env-backend jax"),
    (dict(env="fruitbot", eval_levels=-1), "--eval-levels must not be negative"),
    (dict(env="fruitbot", replay_size=10_000_000), "GiB, more than this machine"),
])
def test_bad_input_gets_one_line(overrides, message, capsys, tmp_path):
    with pytest.raises(SystemExit) as exit_info:
        usfa.main(usfa.Args(**dict(run_dir=str(tmp_path / "run"), replay_size=1000, min_replay_size=100) | overrides))
    err = capsys.readouterr().err.strip().splitlines()
    assert exit_info.value.code == 2 and len(err) == 1 and message in err[0], err
    assert not (tmp_path / "run").exists()


def assert_lifetimes_ended(run, num_envs: int):
    """Training lifetimes ended (the JAX game's or procgen's terminations reach the logs) and none is longer than an
    env's steps so far."""
    ended = [r for r in csv.DictReader(open(run / "metrics.csv")) if r["episode_length"]]
    assert ended and all(1 <= float(r["episode_length"]) <= int(r["step"]) / num_envs for r in ended)


@pytest.mark.parametrize("learned, backend", [(False, "jax"), (True, "procgen")],
                         ids=["hand-designed", "learned-procgen"])
def test_tiny_run_end_to_end(learned, backend, tmp_path, capsys):
    """USFA with the env's cumulants on the JAX paper game (the default: info["phi"], inside the jitted chunk), and
    with learned cumulants through procgen (io_callback): training, evaluation on every task with and without GPI;
    tools/evaluate.py replays the JAX run's evaluation from its saved agent, and the procgen run resumes (the rest
    of the code is shared: each tiny Fruitbot run compiles the Impala torso, and each JAX evaluation traces the
    game's renderer, so each check runs once)."""
    run = tmp_path / "run"
    tiny = TINY | dict(learned_cumulants=learned, gpi_support="test") | (PROCGEN if backend == "procgen" else {})
    steps = JAX_STEPS if backend == "jax" else 64
    usfa.main(usfa.Args(**tiny | dict(total_timesteps=steps, log_every=32, eval_every=steps, run_dir=str(run))))
    rows = list(csv.DictReader(open(run / "eval.csv")))
    assert {r["task"] for r in rows} == {",".join(f"{x:g}" for x in w) for w in np.concatenate([TRAIN_TASKS,
                                                                                                 TEST_TASKS])}
    assert {r["gpi"] for r in rows} == {"0", "1"}
    assert int(list(csv.DictReader(open(run / "metrics.csv")))[-1]["sgd_steps"]) > 0
    assert " parameters; replay " in capsys.readouterr().out
    if backend == "jax":
        assert_lifetimes_ended(run, TINY["num_envs"])
        again, ran = replayed_evaluation(run, steps, tmp_path)  # tools/evaluate.py on the saved agent
        assert again == ran and len(ran) == 2 * (len(TRAIN_TASKS) + len(TEST_TASKS))
        return
    usfa.main(usfa.Args(**tiny | dict(total_timesteps=steps + 32, log_every=32, eval_every=steps, run_dir=str(run),
                                      resume=True)))  # the host envs start new episodes
    assert int(list(csv.DictReader(open(run / "metrics.csv")))[-1]["step"]) == steps + 32


@pytest.mark.parametrize("flags", [{}, {"farm": True}], ids=["uvfa", "farm"])
def test_the_other_uvfa_variants_train_on_this_env(flags):
    """UVFA's and UVFA-FARM's networks on this env's observations, through a whole training iteration (traced, not
    run; MVFA runs for real below)."""
    assert_a_uvfa_training_iteration_traces(uvfa.Args(**TINY_UVFA | flags), len(TRAIN_TASKS))


@pytest.mark.parametrize("flags, backend", [({"modular": True}, "jax"), ({}, "procgen")], ids=["mvfa", "uvfa-procgen"])
def test_uvfa_tiny_run_end_to_end(flags, backend, tmp_path):
    """MVFA (FARM modules, a Q head per module), the variant with the most machinery, runs for real on the JAX game,
    UVFA through procgen; the others' networks are traced through training above (the loop, replay and evaluation
    code is the same for all)."""
    run = tmp_path / "run"
    steps = JAX_STEPS if backend == "jax" else 64
    uvfa.main(uvfa.Args(**TINY_UVFA | flags | (PROCGEN if backend == "procgen" else {})
                        | dict(total_timesteps=steps, log_every=32, eval_every=steps, run_dir=str(run))))
    rows = list(csv.DictReader(open(run / "eval.csv")))
    assert {r["gpi"] for r in rows} == {"0"} and len(rows) == len(TRAIN_TASKS) + len(TEST_TASKS)
    assert int(list(csv.DictReader(open(run / "metrics.csv")))[-1]["sgd_steps"]) > 0
    if backend == "jax":
        assert_lifetimes_ended(run, TINY_UVFA["num_envs"])


@pytest.mark.parametrize("overrides, message", [
    (dict(value_transform="log"), "--value-transform must be one of"),
    (dict(env_backend="gym"), "--env-backend must be one of jax, procgen"),
    (dict(env_backend="procgen"), "--distribution-mode paper (the original's per-task games) runs only with"),
    (dict(eval_levels=-1), "--eval-levels must not be negative"),
])
def test_uvfa_bad_input_gets_one_line(overrides, message, capsys, tmp_path):
    with pytest.raises(SystemExit) as exit_info:
        uvfa.main(uvfa.Args(**dict(env="fruitbot", replay_size=1000, min_replay_size=100,
                                   run_dir=str(tmp_path / "run")) | overrides))
    err = capsys.readouterr().err.strip().splitlines()
    assert exit_info.value.code == 2 and len(err) == 1 and message in err[0], err
