"""msfa_minihack.py: paper sizes, the final view in the terminal transition's cumulant, terminations vs
truncations, GPI support, bad input, and a tiny end-to-end run through the host env (io_callback)."""

import csv

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import msfa_minihack as script
from common.envs.minihack import TEST_TASKS, TRAIN_TASKS
from common.networks import count_params
from helpers import check_video_is_the_evaluations, only_transitions, replayed_evaluation

TINY = dict(num_envs=4, sequence_period=8, sequence_length=9, replay_size=64, min_replay_size=8, batch_size=4,
            samples_per_insert=1.0, target_update_period=3, eval_episodes=1, num_modules=3, module_size=8,
            attention_heads=1, psi_hidden=(8,), phi_hidden=(8,))


def random_sequence(key, args, length: int, first=(), terminal=()):
    """A random MiniHack replay sequence (crops of random tile indices); `first` lists steps that start an
    episode, `terminal` steps whose action ended one by termination."""
    k = jax.random.split(key, 6)
    steps = script.Step(
        obs=jax.random.randint(k[0], (length, 9, 9), 0, 1000).astype(jnp.int16),
        w=jnp.broadcast_to(jnp.array([1.0, 0, 0]), (length, 3)),
        prev_action=jax.random.randint(k[1], (length,), 0, 8), prev_reward=jax.random.uniform(k[2], (length,)),
        first=jnp.zeros(length, bool).at[jnp.array(first, int)].set(True),
        action=jax.random.randint(k[3], (length,), 0, 8), reward=jax.random.uniform(k[4], (length,)),
        terminal=jnp.zeros(length, bool).at[jnp.array(terminal, int)].set(True),
        final_obs=jax.random.randint(k[5], (length, 9, 9), 0, 1000).astype(jnp.int16))
    state = (jnp.zeros((args.num_modules, args.module_size)),) * 2
    return script.Sequence(steps=steps, state=state)


def test_parameter_count_and_replay_size_are_the_papers():
    """Paper: MSFA on MiniHack has 1.7M parameters (3 modules x 80, Impala torso, psi MLP [512, 512]); its replay
    of 70,000 sequences fits in memory because it holds tile crops, not frames."""
    args = script.Args()
    num = count_params(script.make_network(args, jax.random.PRNGKey(0)))
    assert abs(num - 1.7e6) / 1.7e6 < 0.05 and num == 1_700_482
    assert script.replay_bytes(args) < 1.1 * 2**30  # 1.07 GiB with the stored FARM states (frames: 33 GiB)
    assert (args.total_timesteps, args.train_levels) == (3_000_000, 200)
    assert (script.Args(room_size="15x15").total_timesteps, script.Args(room_size="15x15").train_levels) == (
        5_000_000, 1000)


def test_the_terminal_transitions_next_state_sees_the_final_view():
    """phi of a transition that ended its episode reads h_{t+1} = core(final view, a_t, r_t; h_t) (the true last
    observation, not the next episode's first); elsewhere h_{t+1} is the unrolled state."""
    args = script.Args(**TINY)
    net = script.make_network(args, jax.random.PRNGKey(0))
    seq = random_sequence(jax.random.PRNGKey(1), args, 6, first=(3,), terminal=(2,))
    states = script.unroll(net.core, seq)
    h_next = script.next_states(net.core, seq, states)
    s = seq.steps
    final = script.core_step(net.core, s.final_obs[2], s.action[2], s.reward[2], (states[0][2], states[1][2]))[0]
    np.testing.assert_allclose(h_next[2], final, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(h_next[np.array([0, 1, 3, 4])], states[0][np.array([1, 2, 4, 5])])
    assert not np.allclose(h_next[2], states[0][3])


def test_termination_is_learned_and_truncation_masked_in_one_sequence():
    """Episode A ends at transition 1 at the stairs (learned: target r_1 = 1, no bootstrap); episode B ends at
    transition 3 at the time limit (masked)."""
    rewards = jnp.array([0.0, 1, 0, 0, 0])
    values = jnp.array([10.0, 20, 30, 40, 50, 60])
    continues = jnp.array([True, False, True, False, True])
    terminal = jnp.array([False, True, False, False, False])
    g, valid = script.n_step_targets(rewards, values, continues, n=3, gamma=0.5, terminal_at_end=terminal)
    assert valid.tolist() == [True, True, True, False, True]
    np.testing.assert_allclose(np.asarray(g)[[0, 1, 2, 4]], [0 + 0.5 * 1, 1, 0 + 0.5 * 40, 0 + 0.5 * 60])


def test_data_after_a_truncation_changes_neither_loss_nor_gradient():
    args = script.Args(**TINY)
    net = script.make_network(args, jax.random.PRNGKey(0))
    target = script.make_network(args, jax.random.PRNGKey(1))
    seq = random_sequence(jax.random.PRNGKey(2), args, 9, first=(5,))
    mask = jnp.arange(8) < 4  # episode A: transitions 0-3; transition 4 crosses the truncation

    def loss(net, seq):
        with only_transitions(script, mask):
            out = script.sequence_loss(net, target, seq, args)
        return out["loss_q"] + out["loss_psi"] + out["phi_error_sum"]

    other = seq._replace(steps=seq.steps._replace(
        obs=seq.steps.obs.at[5:].set(0), reward=seq.steps.reward.at[4:].set(7.0),
        action=seq.steps.action.at[5:].set(3), final_obs=seq.steps.final_obs.at[4:].set(1)))
    np.testing.assert_allclose(loss(net, seq), loss(net, other), rtol=1e-5)
    g1, g2 = (eqx.filter_grad(loss)(net, x) for x in (seq, other))
    for a, b in zip(jax.tree.leaves(g1), jax.tree.leaves(g2)):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6)


def test_gpi_support_flag_picks_the_policies(monkeypatch):
    seen = []
    monkeypatch.setattr(script, "gpi_q_values", lambda net, h, w, policies: seen.append(policies) or
                        script.q_values(net, h, w))
    params, _ = eqx.partition(script.make_network(script.Args(**TINY), jax.random.PRNGKey(0)), eqx.is_inexact_array)
    for support, tasks in (("train", TRAIN_TASKS), ("test", TEST_TASKS)):
        args = script.Args(**TINY | dict(gpi_support=support, eval_episodes=2))
        returns = script.make_evaluate(script.make_setup(args), args, tasks=TEST_TASKS)(params, jax.random.PRNGKey(0))
        assert returns.shape == (2, 1, 2) and set(np.unique(returns)) <= {0.0, 1.0}  # success or not
        np.testing.assert_array_equal(seen[-1], tasks)


@pytest.mark.parametrize("overrides, message", [
    (dict(room_size="10x10"), "--room-size must be one of 5x5, 15x15"),
    (dict(gpi_support="all"), "--gpi-support must be one of train, test"),
    (dict(num_modules=2), "--num-modules must divide the task dimension 3"),
    (dict(train_levels=-1), "--train-levels must not be negative"),
    (dict(env_workers=0), "--env-workers must be positive"),
])
def test_bad_input_gets_one_line(overrides, message, capsys, tmp_path):
    with pytest.raises(SystemExit) as exit_info:
        script.main(script.Args(**dict(run_dir=str(tmp_path / "run")) | overrides))
    err = capsys.readouterr().err.strip().splitlines()
    assert exit_info.value.code == 2 and len(err) == 1 and message in err[0], err
    assert not (tmp_path / "run").exists()


def test_tiny_run_end_to_end(tmp_path, capsys):
    """Acting through the host env inside the jitted chunk, learning, evaluation in every room with and without
    GPI, two seeds, the run directory's files, and resuming. The first part steps each seed's envs in two worker
    processes (--env-workers 2), the resumed part in this process."""
    run = tmp_path / "run"
    script.main(script.Args(**TINY | dict(total_timesteps=96, log_every=32, eval_every=64, num_seeds=2,
                                          run_dir=str(run), env_workers=2)))
    out = capsys.readouterr().out
    assert " parameters; replay " in out
    rows = list(csv.DictReader(open(run / "eval.csv")))
    assert {r["seed"] for r in rows} == {"1", "2"} and {r["gpi"] for r in rows} == {"0", "1"}
    assert len({r["task"] for r in rows}) == len(TRAIN_TASKS) + len(TEST_TASKS)
    assert int(list(csv.DictReader(open(run / "metrics.csv")))[-1]["sgd_steps"]) > 0
    assert (run / "params_seed1.eqx").exists() and (run / "checkpoint.eqx").exists()
    script.main(script.Args(**TINY | dict(total_timesteps=128, log_every=32, eval_every=64, num_seeds=2,
                                          run_dir=str(run), resume=True)))
    assert "resumed" in capsys.readouterr().out
    assert int(list(csv.DictReader(open(run / "metrics.csv")))[-1]["step"]) == 128
    again, ran = replayed_evaluation(run, 128, tmp_path)  # tools/evaluate.py on the saved agents
    assert again == ran and len(ran) == 2 * 2 * (len(TRAIN_TASKS) + len(TEST_TASKS))
    again, ran = replayed_evaluation(run, 128, tmp_path, gpi="on")  # GPI alone: the same levels, the same rows
    assert again == ran and {r["gpi"] for r in ran} == {"1"}
    trace = check_video_is_the_evaluations(run, "0,1,0", "on", seed=2)  # tools.video plays the same episode
    assert trace.frames[0][0].shape == (144, 144, 3) and trace.ends[-1] in ("success", "died", "timeout")


def test_the_large_room_takes_the_originals_larger_batch():
    """The original's search gave MSFA 64-sequence batches in the large room (4 SGD steps of 16); 32 (8) elsewhere."""
    assert script.Args().batch_size == 8 and script.Args(room_size="15x15").batch_size == 16
    assert script.Args(room_size="15x15", batch_size=4).batch_size == 4  # a batch given stays
