"""usfa.py --env minihack --learned-cumulants and uvfa.py --env minihack: the paper's MiniHack sizes, the final view
in the terminal transition's learned cumulant, bad input (USFA without learned cumulants has no phi there), and tiny
runs through the host env (USFA, MVFA; UVFA and UVFA-FARM traced through a training iteration)."""

import csv

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import usfa
import uvfa
from common.envs.minihack import TEST_TASKS, TRAIN_TASKS
from common.networks import count_params
from helpers import replayed_evaluation, assert_a_uvfa_training_iteration_traces

RUN = dict(env="minihack", num_envs=4, sequence_period=8, sequence_length=9, replay_size=64, min_replay_size=8,
           batch_size=4, samples_per_insert=1.0, target_update_period=3, eval_episodes=1, lstm_size=16)
TINY = RUN | dict(psi_hidden=(8,), phi_hidden=(8,), learned_cumulants=True)
TINY_UVFA = RUN | dict(module_size=8, q_hidden=(8,))
ALL_TASKS = {",".join(f"{x:g}" for x in w) for w in np.concatenate([TRAIN_TASKS, TEST_TASKS])}


def test_usfa_parameter_count_and_settings_follow_the_papers_minihack_sizes():
    """USFA with learned cumulants on MiniHack: paper 1.95M (LSTM 300, Impala torso, psi MLP [512, 512])."""
    args = usfa.Args(env="minihack", learned_cumulants=True)
    assert (args.total_timesteps, args.train_levels, args.replay_size, args.min_replay_size) == (3_000_000, 200,
                                                                                                  70_000, 100)
    assert usfa.Args(env="minihack", room_size="15x15").total_timesteps == 5_000_000
    num = count_params(usfa.make_network(args, jax.random.PRNGKey(0)))
    assert num == 1_952_379 and abs(num - 1.95e6) / 1.95e6 < 0.05
    assert usfa.keeps_final_view(args)  # MiniHack's terminations need the true final view for phi


@pytest.mark.parametrize("flags, count, paper", [({}, 1_952_841, 1.95e6), ({"farm": True}, 2_063_234, 2.06e6),
                                                ({"modular": True}, 3_125_140, None)], ids=["uvfa", "farm", "mvfa"])
def test_uvfa_family_parameter_counts_follow_the_papers_minihack_sizes(flags, count, paper):
    """Paper: UVFA 1.95M (LSTM 256), UVFA-FARM 2.06M (3 modules x 80, 1 head); MVFA is not reported."""
    args = uvfa.Args(env="minihack", **flags)
    assert args.value_transform == "signed_hyperbolic" and (args.num_modules, args.module_size) == (3, 80)
    num = count_params(uvfa.make_network(args, jax.random.PRNGKey(0)))
    assert num == count
    if paper:
        assert abs(num - paper) / paper < 0.05


def test_the_terminal_transitions_next_state_sees_the_final_view():
    args = usfa.Args(**TINY)
    net = usfa.make_network(args, jax.random.PRNGKey(0))
    render = usfa.make_setup(args).render
    k = jax.random.split(jax.random.PRNGKey(1), 4)
    length = 6
    steps = usfa.Step(
        obs=jax.random.randint(k[0], (length, 9, 9), 0, 1000).astype(jnp.int16),
        w=jnp.broadcast_to(jnp.array([0.0, 1, 0]), (length, 3)), prev_action=jnp.zeros(length, jnp.int32),
        prev_reward=jnp.zeros(length), first=jnp.zeros(length, bool).at[3].set(True),
        action=jax.random.randint(k[1], (length,), 0, 8), reward=jax.random.uniform(k[2], (length,)),
        phi=jnp.zeros((length, 3)), final_obs=jax.random.randint(k[3], (length, 9, 9), 0, 1000).astype(jnp.int16),
        terminal=jnp.zeros(length, bool).at[2].set(True))
    seq = usfa.Sequence(steps=steps, state=(jnp.zeros(16),) * 2)
    maps, states = usfa.unroll(net.core, render, seq)
    h_next = usfa.next_states(net.core, render, seq, states, args, maps)
    final = usfa.core_step(net.core, render(steps.final_obs[2]), steps.action[2], steps.reward[2],
                           (states[0][2], states[1][2]))
    np.testing.assert_allclose(h_next[2], final[0], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(h_next[np.array([0, 1, 3, 4])], states[0][np.array([1, 2, 4, 5])])


@pytest.mark.parametrize("script, overrides, message", [
    (usfa, dict(env="minihack"), "USFA with hand-designed cumulants has no phi on MiniHack"),
    (usfa, dict(env="minihack", learned_cumulants=True, room_size="7x7"), "--room-size must be one of 5x5, 15x15"),
    (uvfa, dict(env="minihack", room_size="7x7"), "--room-size must be one of 5x5, 15x15"),
    (uvfa, dict(env="minihack", truncate_task_input=True), "--truncate-task-input is a BabyAI setting"),
    (usfa, dict(env="babyai", env_workers=2), "--env-workers is a MiniHack setting"),
    (uvfa, dict(env="fruitbot", env_workers=2), "--env-workers is a MiniHack setting"),
    (uvfa, dict(env="minihack", env_workers=0), "--env-workers must be positive"),
])
def test_bad_input_gets_one_line(script, overrides, message, capsys, tmp_path):
    with pytest.raises(SystemExit) as exit_info:
        script.main(script.Args(**dict(run_dir=str(tmp_path / "run")) | overrides))
    err = capsys.readouterr().err.strip().splitlines()
    assert exit_info.value.code == 2 and len(err) == 1 and message in err[0], err
    assert not (tmp_path / "run").exists()


def test_usfa_tiny_run_end_to_end(tmp_path, capsys):
    """USFA with learned cumulants: acting through NLE inside the jitted chunk, learning, evaluation in every room
    with GPI and without (the original's support set), no cumulant-quality columns (MiniHack has no env phi)."""
    run = tmp_path / "run"
    usfa.main(usfa.Args(**TINY | dict(total_timesteps=64, log_every=32, eval_every=64, run_dir=str(run),
                                      gpi_support="test", env_workers=2)))  # the envs in 2 worker processes
    rows = list(csv.DictReader(open(run / "eval.csv")))
    assert {r["task"] for r in rows} == ALL_TASKS and {r["gpi"] for r in rows} == {"0", "1"}
    assert {float(r["return_mean"]) for r in rows} <= {0.0, 1.0}  # one episode each: a success or not
    metrics = list(csv.DictReader(open(run / "metrics.csv")))
    assert int(metrics[-1]["sgd_steps"]) > 0 and not any(k.startswith("phi_corr") for k in metrics[0])
    assert " parameters; replay " in capsys.readouterr().out
    (run / "config.json").unlink()  # the parameter files alone name the script and env
    again, ran = replayed_evaluation(run, 64, tmp_path)  # tools/evaluate.py picks usfa.py --env minihack
    assert again == ran and {r["task"] for r in again} == ALL_TASKS


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
    assert {r["gpi"] for r in rows} == {"0"} and {r["task"] for r in rows} == ALL_TASKS
    assert int(list(csv.DictReader(open(run / "metrics.csv")))[-1]["sgd_steps"]) > 0


def test_usfa_learned_takes_the_originals_larger_batch_in_the_large_room():
    """The original's search gave USFA-learned 128-sequence batches in the large room (4 SGD steps of 32)."""
    import usfa

    assert usfa.Args(env="minihack", room_size="15x15", learned_cumulants=True).batch_size == 32
    assert usfa.Args(env="minihack", room_size="15x15").batch_size == 8
    assert usfa.Args(env="minihack", learned_cumulants=True).batch_size == 8 and usfa.Args().batch_size == 8
