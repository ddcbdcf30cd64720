"""msfa_fruitbot.py: paper sizes, terminations vs truncations in the targets, the terminal transition's cumulant,
GPI support, bad input, and tiny end-to-end runs with the JAX game and through the procgen host env (io_callback)."""

import csv

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import msfa_fruitbot as script
from common.envs.fruitbot import TEST_TASKS, TRAIN_TASKS
from common.networks import count_params, prev_action_reward
from helpers import only_transitions, replayed_evaluation

TINY = dict(num_envs=4, sequence_period=8, sequence_length=9, replay_size=64, min_replay_size=8, batch_size=4,
            samples_per_insert=1.0, target_update_period=3, eval_episodes=1, num_modules=2, module_size=8,
            attention_heads=1, psi_hidden=(8,), phi_hidden=(8,), max_levels=1)


def random_sequence(key, args, length: int, first=(), terminal=()):
    """A random Fruitbot replay sequence; `first` lists steps that start an episode, `terminal` steps whose action
    ended one by termination."""
    k = jax.random.split(key, 5)
    steps = script.Step(
        obs=jax.random.randint(k[0], (length, 64, 64, 3), 0, 255).astype(jnp.uint8),
        w=jnp.broadcast_to(jnp.array([1.0, 0, 0, 0]), (length, 4)),
        prev_action=jax.random.randint(k[1], (length,), 0, 15), prev_reward=jax.random.normal(k[2], (length,)),
        first=jnp.zeros(length, bool).at[jnp.array(first, int)].set(True),
        action=jax.random.randint(k[3], (length,), 0, 15), reward=jax.random.normal(k[4], (length,)),
        phi=jnp.zeros((length, 4)), terminal=jnp.zeros(length, bool).at[jnp.array(terminal, int)].set(True))
    state = (jnp.zeros((args.num_modules, args.module_size)),) * 2
    return script.Sequence(steps=steps, state=state)


def test_parameter_count_is_the_papers():
    """Paper: MSFA on Fruitbot has 1.66M parameters (4 modules x 60, Impala torso, psi MLP [512, 512])."""
    num = count_params(script.make_network(script.Args(), jax.random.PRNGKey(0)))
    assert abs(num - 1.66e6) / 1.66e6 < 0.05 and num == 1_660_740


def test_termination_is_learned_and_truncation_masked_in_one_sequence():
    """Episode A ends at transition 1 by termination (learned: target r_1, no bootstrap); episode B ends at
    transition 3 by truncation (masked); the returns of A's transition 0 stop at A's end."""
    rewards = jnp.array([1.0, 2, 3, 4, 5])
    values = jnp.array([10.0, 20, 30, 40, 50, 60])
    continues = jnp.array([True, False, True, False, True])
    terminal = jnp.array([False, True, False, False, False])
    g, valid = script.n_step_targets(rewards, values, continues, n=3, gamma=0.5, terminal_at_end=terminal)
    assert valid.tolist() == [True, True, True, False, True]
    np.testing.assert_allclose(np.asarray(g)[[0, 1, 2, 4]], [1 + 0.5 * 2, 2, 3 + 0.5 * 40, 5 + 0.5 * 60])


def test_the_terminal_transitions_next_state_carries_the_state_onto_the_next_frame():
    """phi of a transition that ended its episode reads h_{t+1} = core(next frame, a_t, r_t; h_t) without the
    reset (procgen shows the next level's first frame; the original did the same); elsewhere h_{t+1} is the
    unrolled state."""
    args = script.Args(**TINY)
    net = script.make_network(args, jax.random.PRNGKey(0))
    seq = random_sequence(jax.random.PRNGKey(1), args, 6, first=(3,), terminal=(2,))
    maps, states = script.unroll(net.core, seq)
    h_next = script.next_states(net.core, maps, seq, states)
    s = seq.steps
    carried = net.core.recur(maps[3], prev_action_reward(s.action[2], s.reward[2], 15), (states[0][2], states[1][2]))[0]
    np.testing.assert_allclose(h_next[2], carried, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(h_next[np.array([0, 1, 3, 4])], states[0][np.array([1, 2, 4, 5])])
    assert not np.allclose(h_next[2], states[0][3])  # the unrolled state was reset there


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
        action=seq.steps.action.at[5:].set(3)))
    np.testing.assert_allclose(loss(net, seq), loss(net, other), rtol=1e-5)
    g1, g2 = (eqx.filter_grad(loss)(net, x) for x in (seq, other))
    for a, b in zip(jax.tree.leaves(g1), jax.tree.leaves(g2)):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6)


def test_gpi_support_flag_picks_the_policies(monkeypatch):
    seen = []
    monkeypatch.setattr(script, "gpi_q_values", lambda net, h, w, policies: seen.append(policies) or
                        script.q_values(net, h, w))
    params_args = script.Args(**TINY)
    params, _ = eqx.partition(script.make_network(params_args, jax.random.PRNGKey(0)), eqx.is_inexact_array)
    for support, tasks in (("train", TRAIN_TASKS), ("test", TEST_TASKS)):
        args = script.Args(**TINY | dict(gpi_support=support, eval_episodes=1))
        evaluate = script.make_evaluate(script.make_setup(args), args, tasks=TEST_TASKS[:1])
        returns = evaluate(params, jax.random.PRNGKey(0))
        assert returns.shape == (2, 1, 1)
        np.testing.assert_array_equal(seen[-1], tasks)


@pytest.mark.parametrize("overrides, message", [
    (dict(gpi_support="all"), "--gpi-support must be one of train, test"),
    (dict(distribution_mode="medium"), "--distribution-mode must be one of paper, hard, easy"),
    (dict(env_backend="gym"), "--env-backend must be one of jax, procgen"),
    (dict(env_backend="procgen"), "--distribution-mode paper (the original's per-task games) runs only with"),
    (dict(eval_levels=-1), "--eval-levels must not be negative"),
    (dict(max_levels=0), "--max-levels must be positive"),
    (dict(train_levels=-1), "--train-levels must not be negative"),
    (dict(replay_size=10_000_000, min_replay_size=100), "GiB, more than this machine"),
])
def test_bad_input_gets_one_line(overrides, message, capsys, tmp_path):
    with pytest.raises(SystemExit) as exit_info:
        script.main(script.Args(**dict(replay_size=1000, min_replay_size=100, run_dir=str(tmp_path / "run"))
                                | overrides))
    err = capsys.readouterr().err.strip().splitlines()
    assert exit_info.value.code == 2 and len(err) == 1 and message in err[0], err
    assert not (tmp_path / "run").exists()


# the JAX game's level pools are kept small (8 training levels per task, 4 evaluation levels): quick to generate
BACKENDS = {"jax": dict(eval_levels=4, train_levels=8), "procgen": dict(env_backend="procgen", distribution_mode="hard")}


@pytest.mark.parametrize("backend", sorted(BACKENDS))
def test_tiny_run_end_to_end(backend, tmp_path, capsys):
    """Acting through the env inside the jitted chunk (the JAX paper game, or procgen through io_callback),
    learning, evaluation on every task with and without GPI, two seeds, and the run directory's files."""
    run = tmp_path / "run"
    tiny = TINY | BACKENDS[backend]
    first = 320  # 80 steps per env: the paper game's first barrier row is up to 30 rows up
    script.main(script.Args(**tiny | dict(total_timesteps=first, log_every=32, eval_every=first - 32, num_seeds=2,
                                          run_dir=str(run))))
    out = capsys.readouterr().out
    assert " parameters; replay of " in out
    rows = list(csv.DictReader(open(run / "eval.csv")))
    assert {r["seed"] for r in rows} == {"1", "2"} and {r["gpi"] for r in rows} == {"0", "1"}
    assert len({r["task"] for r in rows}) == len(TRAIN_TASKS) + len(TEST_TASKS)
    metrics = list(csv.DictReader(open(run / "metrics.csv")))
    assert int(metrics[-1]["sgd_steps"]) > 0
    # lifetimes end (random-like play dies within tens of steps) and none is longer than an env's steps so far
    ended = [r for r in metrics if r["episode_length"]]
    assert ended and all(1 <= float(r["episode_length"]) <= int(r["step"]) / TINY["num_envs"] for r in ended)
    assert (run / "params_seed1.eqx").exists() and (run / "checkpoint.eqx").exists()
    last = first
    if backend == "procgen":  # resume: the host envs start new episodes (the JAX game's resume is exact:
        last = first + 32     # tests/test_fruitbot_replay.py checks it for every Fruitbot script)
        script.main(script.Args(**tiny | dict(total_timesteps=last, log_every=32, eval_every=first - 32,
                                              num_seeds=2, run_dir=str(run), resume=True)))
        assert "resumed" in capsys.readouterr().out
        assert int(list(csv.DictReader(open(run / "metrics.csv")))[-1]["step"]) == last
    again, ran = replayed_evaluation(run, last, tmp_path)  # tools/evaluate.py on the saved agents
    assert again == ran and len(ran) == 2 * 2 * (len(TRAIN_TASKS) + len(TEST_TASKS))
    again, ran = replayed_evaluation(run, last, tmp_path, gpi="on")  # GPI alone: the same rows
    assert again == ran and {r["gpi"] for r in ran} == {"1"}
