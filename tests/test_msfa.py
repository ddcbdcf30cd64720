"""MSFA on BabyAI: targets and losses against hand-worked examples, masking, GPI, modularity, and tiny end-to-end
runs (determinism, seeds, resume)."""

import csv
from pathlib import Path

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import msfa_babyai as msfa
from common import r2d2
from common.babyai import GotoAvoid
from common.gpi import gpi_action, gpi_values
from helpers import random_sequence

TINY = dict(num_envs=4, sequence_period=8, sequence_length=9, num_modules=2, module_size=16, attention_heads=1,
            psi_hidden=(8,), phi_hidden=(8,), replay_size=64, min_replay_size=8, batch_size=4,
            samples_per_insert=2.0, target_update_period=3, eval_episodes=2)


# --------------------------------------------------------------------------------------------------- n-step targets
def test_n_step_targets_hand_worked():
    rewards = jnp.array([1.0, 2, 3, 4, 5])
    values = jnp.array([10.0, 20, 30, 40, 50, 60])
    g, valid = r2d2.n_step_targets(rewards, values, jnp.ones(5, bool), n=2, gamma=0.5)
    # G_t = r_t + .5 r_{t+1} + .25 v_{t+2}; the last transition only has one step left: r_4 + .5 v_5
    np.testing.assert_allclose(g, [1 + 1 + 7.5, 2 + 1.5 + 10, 3 + 2 + 12.5, 4 + 2.5 + 15, 5 + 30])
    assert valid.all()


def test_n_step_targets_cut_at_an_episode_end():
    rewards = jnp.array([1.0, 2, 3, 4, 5])
    values = jnp.array([10.0, 20, 30, 40, 50, 60])
    continues = jnp.array([True, True, False, True, True])  # step 3 starts a new episode
    g, valid = r2d2.n_step_targets(rewards, values, continues, n=2, gamma=0.5)
    assert valid.tolist() == [True, True, False, True, True]  # transition 2 -> 3 crosses the time limit: masked
    np.testing.assert_allclose(np.asarray(g)[[0, 1, 3, 4]], [1 + 1 + 7.5, 2 + 0.5 * 30, 4 + 2.5 + 15, 5 + 30])


def test_n_step_targets_of_vector_cumulants_are_per_dimension():
    rewards = jnp.array([[1.0, 0], [0, 1], [1, 1]])
    values = jnp.array([[0.0, 0], [0, 0], [0, 0], [8, 4]])
    g, valid = r2d2.n_step_targets(rewards, values, jnp.ones(3, bool), n=5, gamma=0.5)
    # t=0: (1,0) + .5 (0,1) + .25 (1,1) + .125 (8,4); t=2: (1,1) + .5 (8,4)
    np.testing.assert_allclose(g, [[1.25 + 1, 0.75 + 0.5], [0.5 + 2, 1.5 + 1], [5, 3]])


def test_double_q_bootstrap_uses_online_argmax_and_target_values():
    q_online = jnp.array([[1.0, 3, 2], [5, 4, 0]])
    q_target = jnp.array([[10.0, 20, 30], [40, 50, 60]])
    np.testing.assert_allclose(r2d2.double_q_bootstrap(q_online, q_target), [20, 40])
    psi_target = jnp.arange(12.0).reshape(2, 3, 2)
    np.testing.assert_allclose(r2d2.double_q_bootstrap(q_online, psi_target), [[2, 3], [6, 7]])


def test_priority_mixes_max_and_mean_of_valid_errors():
    delta = jnp.array([1.0, -3, 2, 100])
    valid = jnp.array([True, True, True, False])
    # 0.9 * 3 + 0.1 * (1 + 3 + 2) / 3
    np.testing.assert_allclose(r2d2.sequence_priority(delta, valid, 0.9), 2.7 + 0.2, rtol=1e-5)
    np.testing.assert_allclose(r2d2.masked_mean(delta, valid), 0.0, atol=1e-4)


# -------------------------------------------------------------------------------------------------------------- GPI
def test_gpi_is_argmax_over_actions_of_max_over_policies():
    psi = jax.random.normal(jax.random.PRNGKey(0), (3, 4, 2))  # [policies, actions, cumulants]
    w = jnp.array([1.0, -0.5])
    brute = max(range(4), key=lambda a: max(float(psi[z, a] @ w) for z in range(3)))
    assert int(gpi_action(psi, w)) == brute
    np.testing.assert_allclose(gpi_values(psi, w), np.max(np.einsum("zac,c->za", psi, w), 0))
    hand = jnp.array([[[1.0, 0], [0, 0]], [[0, 0], [0, 2]]])  # policy 0 is good at action 0, policy 1 at action 1
    assert int(gpi_action(hand, jnp.array([1.0, 1]))) == 1 and int(gpi_action(hand, jnp.array([1.0, 0]))) == 0


# -------------------------------------------------------------------------------------------------------- network
@pytest.fixture(scope="module")
def paper_net():
    return msfa.MSFANetwork(msfa.Args(), 4, jax.random.PRNGKey(0))


def test_parameter_count_matches_the_paper(paper_net):
    from common.networks import count_params

    n = count_params(paper_net)
    assert abs(n - 2.176e6) / 2.176e6 < 0.01, n  # protocol: 2.176M from the code (paper table: "2.1M")


def test_modules_own_their_psi_and_phi(paper_net):
    """d psi^k / d h^j = 0 and d phi^k / d h^j = 0 for j != k, and nonzero for j = k."""
    h = jax.random.normal(jax.random.PRNGKey(1), (4, 150))
    h_next = jax.random.normal(jax.random.PRNGKey(2), (4, 150))
    w = jnp.array([1.0, -1, 0.5, 1])
    d_psi = jax.jacobian(lambda h: paper_net.psi(h, w))(h)  # [A, C, n, d]
    d_phi = jax.jacobian(lambda hn, h: paper_net.phi(hn, h), argnums=(0, 1))(h_next, h)  # 2 x [C, n, d]
    for k in range(4):
        for j in range(4):
            blocks = [d_psi[:, k, j], d_phi[0][k, j], d_phi[1][k, j]]
            if j == k:
                assert all(jnp.abs(b).max() > 0 for b in blocks)
            else:
                assert all(jnp.abs(b).max() == 0 for b in blocks), (k, j)


def test_shapes(paper_net):
    state = paper_net.core.initial_state()
    image = jnp.zeros((40, 40, 3), jnp.uint8)
    h, c = r2d2.core_step(paper_net.core, image, jnp.array(2), jnp.array(0.5), state)
    assert h.shape == c.shape == (4, 150)
    assert paper_net.psi(h, jnp.ones(4)).shape == (4, 4)
    assert paper_net.phi(h, h).shape == (4,)


# -------------------------------------------------------------------------------------------------------- masking
def make_sequence(key, args, episode_end=None):
    """A random sequence of T steps from a nonzero stored state; if episode_end = e, step e + 1 starts an episode."""
    net = msfa.MSFANetwork(args, 4, jax.random.PRNGKey(0))
    return random_sequence(key, args.sequence_length, jax.tree.map(lambda x: x + 0.1, net.core.initial_state()),
                           episode_end)


def test_data_after_an_episode_end_changes_neither_loss_nor_gradient():
    args = msfa.Args(**TINY)
    e = 4  # step 5 of the 9 starts another episode
    seq = make_sequence(jax.random.PRNGKey(3), args, episode_end=e)
    other = make_sequence(jax.random.PRNGKey(4), args, episode_end=e)
    after = jnp.arange(args.sequence_length) > e
    changed = r2d2.Sequence(
        steps=jax.tree.map(lambda a, b: jnp.where(after.reshape((-1,) + (1,) * (a.ndim - 1)), b, a), seq.steps,
                           other.steps),
        state=seq.state)
    net = msfa.MSFANetwork(args, 4, jax.random.PRNGKey(5))
    target = msfa.MSFANetwork(args, 4, jax.random.PRNGKey(6))
    params, static = eqx.partition(net, eqx.is_inexact_array)
    render = GotoAvoid().rgb_from_symbolic
    in_episode = jnp.arange(args.sequence_length - 1) < e  # transitions 0..e-1 (e -> e+1 crosses the end)

    def loss(params, s, mask):
        out = msfa.sequence_loss(eqx.combine(params, static), target, render, s, args, step_mask=mask)
        return out["loss_q"] + out["loss_psi"] + out["phi_error_sum"] / out["phi_count"], out

    (l1, o1), g1 = jax.value_and_grad(loss, has_aux=True)(params, seq, in_episode)
    (l2, o2), g2 = jax.value_and_grad(loss, has_aux=True)(params, changed, in_episode)
    assert float(l1) == float(l2)
    assert all(jnp.array_equal(a, b) for a, b in zip(jax.tree.leaves(g1), jax.tree.leaves(g2)))
    assert float(o1["phi_count"]) == e  # transition e (the truncated one) is masked too
    # the check can fail: over the whole sequence the next episode's data does count
    (l3, _), _ = jax.value_and_grad(loss, has_aux=True)(params, seq, None)
    (l4, _), _ = jax.value_and_grad(loss, has_aux=True)(params, changed, None)
    assert float(l3) != float(l4)


def test_recurrent_state_is_reset_at_episode_starts():
    args = msfa.Args(**TINY)
    seq = make_sequence(jax.random.PRNGKey(7), args, episode_end=3)
    net = msfa.MSFANetwork(args, 4, jax.random.PRNGKey(8))
    render = GotoAvoid().rgb_from_symbolic
    h = r2d2.unroll(net.core, render, seq)
    # the new episode from step 4 on sees nothing of the stored state or of steps 0..3
    fresh = r2d2.Sequence(steps=jax.tree.map(lambda x: x[4:], seq.steps), state=net.core.initial_state())
    np.testing.assert_allclose(h[4:], r2d2.unroll(net.core, render, fresh), atol=1e-6)


# ------------------------------------------------------------------------------------------------- end to end runs
def run(tmp_path: Path, name: str, **overrides) -> Path:
    args = msfa.Args(**(TINY | dict(run_dir=str(tmp_path / name), total_timesteps=128, log_every=64,
                                    eval_every=64) | overrides))
    msfa.main(args)
    return Path(args.run_dir)


def read(path: Path, drop=("sps", "rss_gb")):
    with path.open() as f:
        return [{k: v for k, v in row.items() if k not in drop} for row in csv.DictReader(f)]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("runs")
    full = run(tmp, "full", num_seeds=2)
    half = run(tmp, "half", num_seeds=2, total_timesteps=64)
    half_metrics, half_eval = read(half / "metrics.csv"), read(half / "eval.csv")
    for name in ("metrics.csv", "eval.csv"):  # as if the run had logged past its checkpoint, then crashed
        with (half / name).open("a") as f:
            f.write("96,1" + ",0" * (len(read(half / name, drop=())[0]) - 2) + "\n")
    msfa.main(msfa.Args(**(TINY | dict(run_dir=str(half), total_timesteps=128, log_every=64, eval_every=64,
                                       num_seeds=2, resume=True))))
    return full, half, half_metrics, half_eval


def test_run_directory_contract(runs):
    full = runs[0]
    for name in ("config.json", "metrics.csv", "eval.csv", "checkpoint.eqx"):
        assert (full / name).exists(), name
    assert any(p.name.startswith("events.out.tfevents") for p in full.iterdir())
    metrics = read(full / "metrics.csv", drop=())
    assert list(metrics[0])[:3] == ["step", "seed", "sps"]
    assert [(r["step"], r["seed"]) for r in metrics] == [("64", "1"), ("64", "2"), ("128", "1"), ("128", "2")]
    evals = read(full / "eval.csv")
    assert list(evals[0]) == ["step", "seed", "split", "task", "gpi", "episodes", "return_mean", "return_std"]
    assert len(evals) == 2 * 2 * 2 * 12  # 2 evaluations x 2 seeds x gpi 0/1 x 12 tasks
    assert {r["task"] for r in evals if r["split"] == "test"} >= {"-1,1,-1,0.5", "1,1,0.5,0.5"}
    assert any(r["loss"] for r in metrics)  # learning started


def test_same_seed_gives_identical_results_and_seeds_differ(runs):
    full, _, half_metrics, half_eval = runs
    metrics, evals = read(full / "metrics.csv"), read(full / "eval.csv")
    assert half_metrics == metrics[:2] and half_eval == evals[:48]
    # the seeds' runs differ (a tiny run's greedy evaluation returns are often all 0, so compare training)
    assert metrics[2]["loss"] != metrics[3]["loss"] and metrics[2]["q_mean"] != metrics[3]["q_mean"]


def test_resume_continues_the_run(runs):
    full, half, _, _ = runs
    assert read(half / "metrics.csv") == read(full / "metrics.csv")
    assert read(half / "eval.csv") == read(full / "eval.csv")


@pytest.mark.parametrize(
    "overrides, message",
    [
        (dict(num_envs=0), "--num-envs must be positive"),
        (dict(num_modules=3), "--num-modules must divide the task dimension"),
        (dict(sequence_length=20), "--sequence-length must be --sequence-period + 1"),
        (dict(resume=True, run_dir="/nonexistent/run"), "no checkpoint"),
    ],
)
def test_bad_arguments_stop_with_one_line(overrides, message, capsys):
    with pytest.raises(SystemExit) as exit_info:
        msfa.main(msfa.Args(**(TINY | overrides)))
    assert exit_info.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message in err[0]


def test_results_summary_reads_a_run(runs, capsys):
    from results import summarize

    summarize.main(summarize.Args(run_dir=str(runs[0]), episodes=0))
    lines = capsys.readouterr().out.splitlines()
    rows = [line for line in lines if line.startswith("| train") or line.startswith("| test")]
    assert len(rows) == 12 and "step 128" in lines[0] and "2 seed(s)" in lines[0]
    assert all(row.count("±") == 2 for row in rows)  # GPI and no-GPI, each a mean ± s.e. over the 2 seeds
