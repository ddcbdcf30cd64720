"""usfa.py and uvfa.py --env fruitbot: the paper's Fruitbot sizes, the terminal transition's cumulant, the UVFA
family's value transform, bad input, tiny runs through the host env (USFA both ways, MVFA; UVFA and UVFA-FARM traced
through a training iteration)."""

import csv

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import usfa
import uvfa
from common.fruitbot import TEST_TASKS, TRAIN_TASKS
from common.networks import count_params, oar_vector
from helpers import assert_a_uvfa_training_iteration_traces

RUN = dict(env="fruitbot", num_envs=4, sequence_period=8, sequence_length=9, replay_size=64, min_replay_size=8,
           batch_size=4, samples_per_insert=1.0, target_update_period=3, eval_episodes=1, lstm_size=16, max_levels=1)
TINY = RUN | dict(psi_hidden=(8,), phi_hidden=(8,))
TINY_UVFA = RUN | dict(num_modules=2, module_size=8, attention_heads=1, q_hidden=(8,))


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
    maps, states = usfa.unroll(net.core, lambda x: x, seq, args)
    h_next = usfa.next_states(net.core, lambda x: x, seq, states, args, maps)
    carried = net.core.recur(maps[3], oar_vector(steps.action[2], steps.reward[2], 15), (states[0][2], states[1][2]))
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
    (dict(env="fruitbot", distribution_mode="medium"), "--distribution-mode must be one of"),
    (dict(env="fruitbot", replay_size=10_000_000), "GiB, more than this machine"),
])
def test_bad_input_gets_one_line(overrides, message, capsys, tmp_path):
    with pytest.raises(SystemExit) as exit_info:
        usfa.main(usfa.Args(**dict(run_dir=str(tmp_path / "run"), replay_size=1000, min_replay_size=100) | overrides))
    err = capsys.readouterr().err.strip().splitlines()
    assert exit_info.value.code == 2 and len(err) == 1 and message in err[0], err
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("learned", [False, True], ids=["hand-designed", "learned"])
def test_tiny_run_end_to_end(learned, tmp_path, capsys):
    run = tmp_path / "run"
    usfa.main(usfa.Args(**TINY | dict(learned_cumulants=learned, total_timesteps=64, log_every=32, eval_every=64,
                                      run_dir=str(run), gpi_support="test")))
    rows = list(csv.DictReader(open(run / "eval.csv")))
    assert {r["task"] for r in rows} == {",".join(f"{x:g}" for x in w) for w in np.concatenate([TRAIN_TASKS,
                                                                                                 TEST_TASKS])}
    assert {r["gpi"] for r in rows} == {"0", "1"}
    assert int(list(csv.DictReader(open(run / "metrics.csv")))[-1]["sgd_steps"]) > 0
    assert "paper: " in capsys.readouterr().out
    if not learned:
        return  # resuming is the same code for both: checked once (each tiny Fruitbot run compiles the Impala torso)
    usfa.main(usfa.Args(**TINY | dict(learned_cumulants=learned, total_timesteps=96, log_every=32, eval_every=64,
                                      run_dir=str(run), gpi_support="test", resume=True)))
    assert int(list(csv.DictReader(open(run / "metrics.csv")))[-1]["step"]) == 96


@pytest.mark.parametrize("flags", [{}, {"farm": True}], ids=["uvfa", "farm"])
def test_the_other_uvfa_variants_train_on_this_env(flags):
    """UVFA's and UVFA-FARM's networks on this env's observations, through a whole training iteration (traced, not
    run; MVFA runs for real below)."""
    assert_a_uvfa_training_iteration_traces(uvfa.Args(**TINY_UVFA | flags), len(TRAIN_TASKS))


def test_uvfa_tiny_run_end_to_end(tmp_path):
    """MVFA (FARM modules, a Q head per module), the variant with the most machinery, runs for real; the others'
    networks are traced through training above (the loop, replay and evaluation code is the same for all)."""
    run = tmp_path / "run"
    uvfa.main(uvfa.Args(**TINY_UVFA | dict(modular=True, total_timesteps=64, log_every=32, eval_every=64,
                                           run_dir=str(run))))
    rows = list(csv.DictReader(open(run / "eval.csv")))
    assert {r["gpi"] for r in rows} == {"0"} and len(rows) == len(TRAIN_TASKS) + len(TEST_TASKS)
    assert int(list(csv.DictReader(open(run / "metrics.csv")))[-1]["sgd_steps"]) > 0


def test_uvfa_bad_input_gets_one_line(capsys, tmp_path):
    with pytest.raises(SystemExit) as exit_info:
        uvfa.main(uvfa.Args(env="fruitbot", value_transform="log", replay_size=1000, min_replay_size=100,
                            run_dir=str(tmp_path / "run")))
    err = capsys.readouterr().err.strip().splitlines()
    assert exit_info.value.code == 2 and len(err) == 1 and "--value-transform must be one of" in err[0]
