"""The same hand-worked examples against every training script's own functions.

Each script holds its whole algorithm (the users' design card), so the replay, the n-step targets, the double-Q
bootstrap, masking, priorities, GPI and the run loop are written once per script. These tests run one set of
examples against each script's copy, so the methods cannot drift apart unnoticed; and they check the shape the
design card asks for: no script imports another, and common/ holds no RL algorithm."""

import ast
import csv
import dataclasses
import json
from pathlib import Path

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import usfa
from common.envs.babyai import GotoAvoid
from common.run import EVAL_FIELDS, RESPONSE_FIELDS, cumulant_quality, cumulant_stats
from helpers import SCRIPTS, VARIANTS, only_transitions, random_sequence

ROOT = Path(__file__).resolve().parent.parent
RENDER = GotoAvoid().rgb_from_symbolic
scripts = pytest.mark.parametrize("script", list(SCRIPTS.values()), ids=list(SCRIPTS))
variants = pytest.mark.parametrize("variant", list(VARIANTS))


# -------------------------------------------------------------------------------------------------- design card
def imported_modules(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module.split(".")[0])
    return names


def test_no_script_imports_another_and_common_imports_no_script():
    for name in SCRIPTS:
        assert not imported_modules(ROOT / f"{name}.py") & set(SCRIPTS), name
    for path in (ROOT / "common").rglob("*.py"):
        assert not imported_modules(path) & set(SCRIPTS), path.name


def test_common_holds_no_rl_algorithm():
    algorithm = {"n_step_targets", "double_q_bootstrap", "sequence_priority", "sgd_step", "act_step",
                 "make_train_chunk", "batch_loss", "sequence_loss", "unroll", "make_evaluate"}
    for path in (ROOT / "common").rglob("*.py"):  # module-level names (the cores' own unroll is the network's)
        defined = {node.name for node in ast.parse(path.read_text()).body
                   if isinstance(node, (ast.FunctionDef, ast.ClassDef))}
        assert not defined & algorithm, (path.name, defined & algorithm)


# ------------------------------------------------------------------------------------------------ n-step targets
@scripts
def test_n_step_targets_hand_worked(script):
    rewards = jnp.array([1.0, 2, 3, 4, 5])
    values = jnp.array([10.0, 20, 30, 40, 50, 60])
    g, valid = script.n_step_targets(rewards, values, jnp.ones(5, bool), n=2, gamma=0.5)
    # G_t = r_t + .5 r_{t+1} + .25 v_{t+2}; the last transition only has one step left: r_4 + .5 v_5
    np.testing.assert_allclose(g, [1 + 1 + 7.5, 2 + 1.5 + 10, 3 + 2 + 12.5, 4 + 2.5 + 15, 5 + 30])
    assert valid.all()


@scripts
def test_n_step_targets_cut_at_an_episode_end(script):
    rewards = jnp.array([1.0, 2, 3, 4, 5])
    values = jnp.array([10.0, 20, 30, 40, 50, 60])
    continues = jnp.array([True, True, False, True, True])  # step 3 starts a new episode
    g, valid = script.n_step_targets(rewards, values, continues, n=2, gamma=0.5)
    assert valid.tolist() == [True, True, False, True, True]  # transition 2 -> 3 crosses the time limit: masked
    np.testing.assert_allclose(np.asarray(g)[[0, 1, 3, 4]], [1 + 1 + 7.5, 2 + 0.5 * 30, 4 + 2.5 + 15, 5 + 30])


@scripts
def test_n_step_targets_with_the_time_limit_as_a_termination(script):
    """--time-limit-is-termination: the same episode end, but transition 2 (the last of its episode) is learned with
    target r_2, and returns reaching the end stop there without bootstrapping."""
    rewards = jnp.array([1.0, 2, 3, 4, 5])
    values = jnp.array([10.0, 20, 30, 40, 50, 60])
    continues = jnp.array([True, True, False, True, True])
    g, valid = script.n_step_targets(rewards, values, continues, n=2, gamma=0.5, terminal_at_end=True)
    assert valid.all()
    np.testing.assert_allclose(g, [1 + 1 + 7.5, 2 + 0.5 * 3, 3, 4 + 2.5 + 15, 5 + 30])
    # vector cumulants end the same way in every dimension
    g, _ = script.n_step_targets(jnp.stack([rewards, -rewards], -1), jnp.stack([values, values], -1), continues,
                                 n=2, gamma=0.5, terminal_at_end=True)
    np.testing.assert_allclose(g[:3, 1], [-1 - 1 + 7.5, -2 - 1.5, -3])


@scripts
def test_n_step_targets_of_vector_cumulants_are_per_dimension(script):
    rewards = jnp.array([[1.0, 0], [0, 1], [1, 1]])
    values = jnp.array([[0.0, 0], [0, 0], [0, 0], [8, 4]])
    g, valid = script.n_step_targets(rewards, values, jnp.ones(3, bool), n=5, gamma=0.5)
    # t=0: (1,0) + .5 (0,1) + .25 (1,1) + .125 (8,4); t=2: (1,1) + .5 (8,4)
    np.testing.assert_allclose(g, [[1.25 + 1, 0.75 + 0.5], [0.5 + 2, 1.5 + 1], [5, 3]])


@scripts
def test_double_q_bootstrap_uses_online_argmax_and_target_values(script):
    q_online = jnp.array([[1.0, 3, 2], [5, 4, 0]])
    q_target = jnp.array([[10.0, 20, 30], [40, 50, 60]])
    np.testing.assert_allclose(script.double_q_bootstrap(q_online, q_target), [20, 40])
    psi_target = jnp.arange(12.0).reshape(2, 3, 2)
    np.testing.assert_allclose(script.double_q_bootstrap(q_online, psi_target), [[2, 3], [6, 7]])


@scripts
def test_priority_mixes_max_and_mean_of_valid_errors(script):
    delta = jnp.array([1.0, -3, 2, 100])
    valid = jnp.array([True, True, True, False])
    # 0.9 * 3 + 0.1 * (1 + 3 + 2) / 3
    np.testing.assert_allclose(script.sequence_priority(delta, valid, 0.9), 2.7 + 0.2, rtol=1e-5)
    np.testing.assert_allclose(script.masked_mean(delta, valid), 0.0, atol=1e-4)


@scripts
def test_importance_weights_hand_worked(script):
    p = jnp.array([0.5, 0.25, 0.125])
    np.testing.assert_allclose(script.importance_weights(p, 1.0), [0.25, 0.5, 1.0], rtol=1e-4)
    np.testing.assert_allclose(script.importance_weights(p, 0.0), [1.0, 1.0, 1.0])


@scripts
def test_one_sgd_step_per_replay_ratio(script):
    args = script.Args(num_envs=32, batch_size=8, samples_per_insert=6.0)
    assert script.steps_per_iteration(args) == 32 * 40 and script.sgd_steps_per_iteration(args) == 24


def test_cumulant_quality_hand_worked():
    """Category 1: phi^1 = .8, .1, .3 (and .5 on a masked step) against pickups 1, 0, 0: corr 0.4 / sqrt(.26 * 2/3)
    = 0.96077, error on the pickup |.8 - 1| = .2, elsewhere (.1 + .3) / 2 = .2. Category 2: never picked up, so its
    correlation and pickup error are undefined; elsewhere (0 + .2 + .4) / 3 = .2."""
    phi = jnp.array([[[0.8, 0.0], [0.1, -0.2], [0.3, 0.4], [0.5, 9.0]]])  # [B=1, T-1=4, C=2]
    phi_env = jnp.array([[[1.0, 0.0], [0.0, 0.0], [0.0, 0.0], [1.0, 0.0]]])
    valid = jnp.array([[True, True, True, False]])
    quality = cumulant_quality(cumulant_stats(phi, phi_env, valid))
    np.testing.assert_allclose(quality["corr"][0], 0.4 / np.sqrt(0.26 * 2 / 3), rtol=1e-5)
    np.testing.assert_allclose(quality["error_pickup"][0], 0.2, rtol=1e-5)
    np.testing.assert_allclose(quality["error_other"], [0.2, 0.2], rtol=1e-5)
    assert np.isnan(quality["corr"][1]) and np.isnan(quality["error_pickup"][1])


# ------------------------------------------------------------------------------------- masking and the unroll
def sequence_objective(variant, net, target, seq, args, mask):
    """The variant's whole per-sequence loss (what its gradient trains) and its priority."""
    script = VARIANTS[variant][0]
    with only_transitions(script, mask):
        if variant == "usfa":
            out = script.oracle_sequence_loss(net, target, RENDER, seq, args)
            return out["loss_psi"], out["priority"]
        out = script.sequence_loss(net, target, RENDER, seq, args)
    if "loss_q" in out:  # MSFA's three losses (MSFA, its ablations, USFA with learned cumulants)
        loss_phi = out["phi_error_sum"] / jnp.maximum(out["phi_count"], 1)
        return out["loss_q"] + out["loss_psi"] + loss_phi, out["priority"]
    return out["loss"], out["priority"]


@variants
def test_data_after_an_episode_end_changes_neither_loss_nor_gradient_nor_priority(variant):
    script, settings, _ = VARIANTS[variant]
    args = script.Args(**settings)
    net = script.make_network(args, jax.random.PRNGKey(5))
    target = script.make_network(args, jax.random.PRNGKey(6))
    stored = jax.tree.map(lambda x: x + 0.1, net.core.initial_state())
    e = 4  # step 5 of the 9 starts another episode
    seq = random_sequence(script, jax.random.PRNGKey(3), args.sequence_length, stored, e, pickups=True)
    other = random_sequence(script, jax.random.PRNGKey(4), args.sequence_length, stored, e, pickups=True)
    after = jnp.arange(args.sequence_length) > e
    changed = seq._replace(steps=jax.tree.map(
        lambda a, b: jnp.where(after.reshape((-1,) + (1,) * (a.ndim - 1)), b, a), seq.steps, other.steps))
    params, static = eqx.partition(net, eqx.is_inexact_array)
    in_episode = jnp.arange(args.sequence_length - 1) < e  # transitions 0..e-1 (e -> e+1 crosses the end)

    def loss(params, s, mask):
        return sequence_objective(variant, eqx.combine(params, static), target, s, args, mask)

    (l1, p1), g1 = jax.value_and_grad(loss, has_aux=True)(params, seq, in_episode)
    (l2, p2), g2 = jax.value_and_grad(loss, has_aux=True)(params, changed, in_episode)
    assert float(l1) == float(l2) and float(p1) == float(p2)
    assert all(jnp.array_equal(a, b) for a, b in zip(jax.tree.leaves(g1), jax.tree.leaves(g2)))
    # the check can fail: over the whole sequence the next episode's data does count
    (l3, _), _ = jax.value_and_grad(loss, has_aux=True)(params, seq, None)
    (l4, _), _ = jax.value_and_grad(loss, has_aux=True)(params, changed, None)
    assert float(l3) != float(l4)


@pytest.mark.parametrize("variant", ["msfa", "usfa-learned"])
def test_priority_from_q_adds_the_q_td_error_priority(variant):
    """--priority-from-q: the sequence's priority is the psi TD errors' plus that of the Q TD error, the latter
    recomputed here from the script's own pieces (n-step double-Q targets of psi . w)."""
    script, settings, _ = VARIANTS[variant]
    args = script.Args(**settings)
    net = script.make_network(args, jax.random.PRNGKey(5))
    target = script.make_network(args, jax.random.PRNGKey(6))
    seq = random_sequence(script, jax.random.PRNGKey(3), args.sequence_length, net.core.initial_state(), 4, True)
    off = script.sequence_loss(net, target, RENDER, seq, args)["priority"]
    on = script.sequence_loss(net, target, RENDER, seq, dataclasses.replace(args, priority_from_q=True))["priority"]
    psi, psi_target = script.successor_features(net, target, RENDER, seq)[-2:]
    q, q_target = (jnp.einsum("tac,tc->ta", x, seq.steps.w) for x in (psi, psi_target))
    targets, valid = script.n_step_targets(seq.steps.reward[:-1], script.double_q_bootstrap(q, q_target),
                                           ~seq.steps.first[1:], args.n_step, args.gamma)
    delta_q = targets - q[jnp.arange(len(targets)), seq.steps.action[:-1]]
    expected = script.sequence_priority(delta_q, valid, args.max_priority_weight)
    assert float(expected) > 0.01
    np.testing.assert_allclose(on - off, expected, rtol=1e-5)


@pytest.mark.parametrize("variant", ["msfa", "usfa", "uvfa-farm"])
def test_transition_into_a_new_episode_is_masked(variant):
    """The last transition of an episode (its next observation never seen) adds nothing to the losses."""
    script, settings, _ = VARIANTS[variant]
    args = script.Args(**settings)
    net = script.make_network(args, jax.random.PRNGKey(5))
    seq = random_sequence(script, jax.random.PRNGKey(3), args.sequence_length, net.core.initial_state(), 4)
    step_t4 = jnp.arange(args.sequence_length - 1) == 4  # transition 4 -> 5 crosses the episode end
    loss, _ = sequence_objective(variant, net, net, seq, args, step_t4)
    assert float(loss) == 0.0
    loss, _ = sequence_objective(variant, net, net, seq, args, step_t4 | (jnp.arange(args.sequence_length - 1) == 3))
    assert float(loss) != 0.0


@pytest.mark.parametrize("variant", ["msfa", "usfa", "usfa-learned", "uvfa"])
def test_time_limit_as_termination_learns_the_last_transition(variant):
    """With --time-limit-is-termination the episode's last transition trains (no bootstrap); learned cumulants take
    its next state from the stored final view, so that view changes the loss and the next episode's data does not."""
    script, settings, _ = VARIANTS[variant]
    args = script.Args(**settings, time_limit_is_termination=True)
    net = script.make_network(args, jax.random.PRNGKey(5))
    target = script.make_network(args, jax.random.PRNGKey(6))
    seq = random_sequence(script, jax.random.PRNGKey(3), args.sequence_length, net.core.initial_state(), 4, True)
    seq = seq._replace(steps=seq.steps._replace(reward=seq.steps.reward.at[4].set(1.0)))
    episode = jnp.arange(args.sequence_length - 1) <= 4  # transitions 0..4, 4 -> 5 ending the episode
    step_t4 = jnp.arange(args.sequence_length - 1) == 4
    loss, _ = sequence_objective(variant, net, target, seq, args, step_t4)
    assert float(loss) > 0.0
    after = (jnp.arange(args.sequence_length) > 4).reshape(-1, 1, 1, 1)
    other = seq._replace(steps=seq.steps._replace(obs=jnp.where(after, seq.steps.obs[::-1], seq.steps.obs)))
    base, _ = sequence_objective(variant, net, target, seq, args, episode)
    assert float(base) == float(sequence_objective(variant, net, target, other, args, episode)[0])
    if variant == "uvfa":  # Q-learning needs no final view
        return
    new_view = seq._replace(steps=seq.steps._replace(final_obs=seq.steps.final_obs.at[4].set(seq.steps.obs[0])))
    changed = float(sequence_objective(variant, net, target, new_view, args, episode)[0])
    assert (changed != float(base)) == (variant in ("msfa", "usfa-learned"))


def test_env_reports_the_final_view_before_the_reset():
    """info["final_image"] is the view the action led to: the returned observation on every step but the last,
    where the env has already reset and returns the next episode's first view."""
    env = GotoAvoid(obs_mode="symbolic")
    params = env.default_params
    obs, state = env.reset(jax.random.PRNGKey(0), params)
    for t in range(params.max_steps_in_episode):
        obs, state, _, _, truncated, info = env.step(jax.random.PRNGKey(t), state, jnp.int32(t % 3), params)
        assert bool(truncated) == (t == params.max_steps_in_episode - 1)
        assert bool(jnp.array_equal(info["final_image"], obs.image)) != bool(truncated)


@pytest.mark.parametrize("variant", ["msfa", "usfa-learned", "uvfa"])
def test_tiny_run_with_the_time_limit_as_termination(variant, tmp_path):
    """Long enough for every env to cross the 200-step time limit, so replay holds final views that the loss uses."""
    script, settings, _ = VARIANTS[variant]
    args = script.Args(**(settings | dict(run_dir=str(tmp_path / "run"), total_timesteps=1024, log_every=512,
                                          eval_every=1024, time_limit_is_termination=True, eval_episodes=1)))
    script.main(args)
    metrics = read(tmp_path / "run" / "metrics.csv")
    assert len(metrics) == 2 and np.isfinite(float(metrics[-1]["loss"]))
    # each env has made 128 steps by the first row (no episode ended yet) and 256 by the second (one 200-step episode)
    assert metrics[0]["episode_length"] == "" and float(metrics[1]["episode_length"]) == 200.0
    if variant == "uvfa":
        return
    # what replay holds after 26 iterations of 8 steps in each of 4 envs (each crosses the limit at its step 200):
    # the final view of a step is the next step's view, except where the next step starts a new episode
    setup = script.make_setup(args)
    state = jax.tree.map(lambda x: x[None], script.init_train_state(setup, args, jax.random.PRNGKey(0)))
    state, _ = script.make_train_chunk(setup, args, 26)(state)
    assert bool(state.buffer.is_full[0])  # its 64 sequences are the last 64 inserted, the episode ends among them
    steps = jax.tree.map(lambda x: np.asarray(x[0, 0]), state.buffer.experience.steps)
    assert steps.final_obs.shape[-3:] == (5, 5, 3)
    same = (steps.final_obs[:, :-1] == steps.obs[:, 1:]).all(axis=(-3, -2, -1))
    ends = steps.first[:, 1:]
    assert ends.sum() == 4 and same[~ends].all() and not same[ends].any()
    plain = dataclasses.replace(args, time_limit_is_termination=False)
    state = script.init_train_state(script.make_setup(plain), plain, jax.random.PRNGKey(0))
    assert state.buffer.experience.steps.final_obs.shape[-1] == 0  # nothing stored without the flag


@pytest.mark.parametrize("variant", ["msfa", "usfa", "uvfa", "uvfa-farm"])
def test_recurrent_state_is_reset_at_episode_starts(variant):
    script, settings, _ = VARIANTS[variant]
    args = script.Args(**settings)
    net = script.make_network(args, jax.random.PRNGKey(8))
    stored = jax.tree.map(lambda x: x + 0.1, net.core.initial_state())
    seq = random_sequence(script, jax.random.PRNGKey(7), args.sequence_length, stored, episode_end=3)
    h = states_along(script, net.core, seq)
    # the new episode from step 4 on sees nothing of the stored state or of steps 0..3
    fresh = seq._replace(steps=jax.tree.map(lambda x: x[4:], seq.steps), state=net.core.initial_state())
    np.testing.assert_allclose(h[4:], states_along(script, net.core, fresh), atol=1e-6)
    reset = seq._replace(state=net.core.initial_state())
    assert not np.allclose(h[:4], states_along(script, net.core, reset)[:4])


def states_along(script, core, seq):
    """h [T, ...] of the script's unroll (usfa's also returns the torso's maps, which its next_states reads)."""
    out = script.unroll(core, RENDER, seq)
    return (out[1] if script is usfa else out)[0]


# -------------------------------------------------------------------------------------------------------------- GPI
@pytest.mark.parametrize("variant", ["msfa", "usfa-learned"])
def test_gpi_head_is_the_max_over_policies_of_psi_dot_w(variant):
    script, settings, _ = VARIANTS[variant]
    args = script.Args(**settings)
    net = script.make_network(args, jax.random.PRNGKey(0))
    h = jax.random.normal(jax.random.PRNGKey(1), net.core.initial_state()[0].shape)
    w = jnp.array([1.0, -1, 0.5, 0.25])
    policies = jnp.eye(4)
    brute = np.max([np.asarray(net.psi(h, z)) @ np.asarray(w) for z in policies], axis=0)
    np.testing.assert_allclose(script.gpi_q_values(net, h, w, policies), brute, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(script.q_values(net, h, w), np.asarray(net.psi(h, w)) @ np.asarray(w), rtol=1e-5,
                               atol=1e-6)
    assert script.GPI_SETTINGS == (0, 1)


def test_the_uvfa_family_has_no_gpi():
    assert SCRIPTS["uvfa"].GPI_SETTINGS == (0,) and not hasattr(SCRIPTS["uvfa"], "gpi_q_values")


# ------------------------------------------------------------------------------------------------ tiny end to end
def read(path: Path, drop=("sps", "rss_gb")):
    with path.open() as f:
        return [{k: v for k, v in row.items() if k not in drop} for row in csv.DictReader(f)]


@variants
def test_tiny_run_of_every_script_and_variant(variant, tmp_path, capsys):
    script, settings, has_gpi = VARIANTS[variant]
    run_dir = tmp_path / variant
    script.main(script.Args(**(settings | dict(run_dir=str(run_dir), total_timesteps=64, log_every=32,
                                               eval_every=64))))
    out = capsys.readouterr().out
    assert " parameters" in out
    for name in ("config.json", "metrics.csv", "eval.csv", "checkpoint.eqx"):
        assert (run_dir / name).exists(), name
    assert any(p.name.startswith("events.out.tfevents") for p in run_dir.iterdir())
    config = json.loads((run_dir / "config.json").read_text())
    assert config["method"] == script.method_name(script.Args(**settings))
    assert config["args"]["num_envs"] == settings["num_envs"] and config["versions"]["jax"] == jax.__version__
    metrics = read(run_dir / "metrics.csv", drop=())
    assert list(metrics[0])[:3] == ["step", "seed", "sps"]
    assert [r["step"] for r in metrics] == ["32", "64"]
    assert metrics[-1]["loss"] and np.isfinite(float(metrics[-1]["loss"]))
    learned_phi = variant.startswith("msfa") or variant == "usfa-learned"
    assert ("phi_corr_1" in metrics[0]) == learned_phi and ("phi_error_other_4" in metrics[0]) == learned_phi
    if learned_phi:  # most categories are never picked up in so short a run: their columns stay empty
        assert 0 <= float(metrics[-1]["phi_error_other_1"]) < 10
    evals = read(run_dir / "eval.csv", drop=())
    assert list(evals[0]) == EVAL_FIELDS
    # the cumulant response: filled (a count of pickups at least) on the train tasks' rows acting on w of a method
    # that learns phi, empty on every other row and for every other method
    measured = [r for r in evals if r["split"] == "train" and r["gpi"] == "0"]
    assert all((r["pickups_rewarded"] != "") == learned_phi for r in measured)
    assert all(r[name] == "" for r in evals if r not in measured for name in RESPONSE_FIELDS)
    assert {r["gpi"] for r in evals} == ({"0", "1"} if has_gpi else {"0"})
    assert len(evals) == (2 if has_gpi else 1) * 12
    assert {r["task"] for r in evals if r["split"] == "test"} >= {"-1,1,-1,0.5", "1,1,0.5,0.5"}

    from tools import summarize

    summarize.main(summarize.Args(run_dir=str(run_dir), episodes=0))
    rows = [line.split("|") for line in capsys.readouterr().out.splitlines() if line.startswith(("| train", "| test"))]
    assert len(rows) == 12 and all((row[3].strip() != "-") == has_gpi for row in rows)  # the GPI column


@pytest.fixture(scope="module", params=["msfa", "usfa", "uvfa"])
def runs(request, tmp_path_factory):
    """A 2-seed run of 128 steps; the same run stopped at 64 steps, then resumed to 128."""
    script, settings, _ = VARIANTS[request.param]
    tmp = tmp_path_factory.mktemp(request.param)

    def run(name, **overrides):
        args = script.Args(**(settings | dict(run_dir=str(tmp / name), total_timesteps=128, log_every=64,
                                              eval_every=64, num_seeds=2) | overrides))
        script.main(args)
        return Path(args.run_dir)

    full = run("full")
    half = run("half", total_timesteps=64)
    half_metrics, half_eval = read(half / "metrics.csv"), read(half / "eval.csv")
    for name in ("metrics.csv", "eval.csv"):  # as if the run had logged past its checkpoint, then crashed
        with (half / name).open("a") as f:
            f.write("96,1" + ",0" * (len(read(half / name, drop=())[0]) - 2) + "\n")
    run("half", resume=True)
    return full, half, half_metrics, half_eval


def test_same_seed_gives_identical_results_and_seeds_differ(runs):
    full, _, half_metrics, half_eval = runs
    metrics, evals = read(full / "metrics.csv"), read(full / "eval.csv")
    assert [(r["step"], r["seed"]) for r in metrics] == [("64", "1"), ("64", "2"), ("128", "1"), ("128", "2")]
    assert half_metrics == metrics[:2] and half_eval == evals[:len(half_eval)]
    # the seeds' runs differ (a tiny run's greedy evaluation returns are often all 0, so compare training)
    assert metrics[2]["loss"] != metrics[3]["loss"] and metrics[2]["q_mean"] != metrics[3]["q_mean"]


def test_resume_continues_the_run(runs):
    full, half, _, _ = runs
    assert read(half / "metrics.csv") == read(full / "metrics.csv")
    assert read(half / "eval.csv") == read(full / "eval.csv")


# ---------------------------------------------------------------------------------------------------- bad input
BAD = [
    (dict(num_envs=0), "--num-envs must be positive"),
    (dict(sequence_length=20), "--sequence-length must be --sequence-period + 1"),
    (dict(gamma=1.5), "--gamma must be in (0, 1]"),
    (dict(min_replay_size=2), "--min-replay-size must be at least --batch-size"),
    (dict(resume=True, run_dir="/nonexistent/run"), "there is no run in /nonexistent/run; start one there"),
    (dict(learning_rate=-1.0), "--learning-rate must be positive"),
    (dict(adam_eps=0.0), "--adam-eps must be positive"),
    (dict(replay_size=16, min_replay_size=8, num_envs=32), "--replay-size must hold one insert of --num-envs"),
    (dict(resume=True, overwrite=True), "--resume and --overwrite exclude each other"),
]
USFA_BAD = [(dict(priority_from_q=True), "--priority-from-q needs --learned-cumulants")]


@scripts
@pytest.mark.parametrize("overrides, message", BAD, ids=[m for _, m in BAD])
def test_bad_arguments_stop_with_one_line(script, overrides, message, capsys):
    with pytest.raises(SystemExit) as exit_info:
        # a small replay: Fruitbot's default (70k sequences of frames) does not fit this machine and says so first
        script.main(script.Args(**({"replay_size": 1000, "min_replay_size": 100} | overrides)))
    assert exit_info.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message in err[0]


@pytest.mark.parametrize("overrides, message", USFA_BAD, ids=[m for _, m in USFA_BAD])
def test_usfa_bad_arguments_stop_with_one_line(overrides, message, capsys):
    with pytest.raises(SystemExit) as exit_info:
        SCRIPTS["usfa"].main(SCRIPTS["usfa"].Args(**overrides))
    err = capsys.readouterr().err.strip().splitlines()
    assert exit_info.value.code == 2 and len(err) == 1 and message in err[0]
