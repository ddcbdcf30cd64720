"""Test data and settings shared by the learner tests."""

import contextlib
import csv
import dataclasses
import inspect
from functools import partial
from pathlib import Path

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import msfa_babyai
import msfa_fruitbot
import msfa_minihack
import usfa
import uvfa
from common.envs.babyai import GotoAvoid
from common.envs.minihack import render as render_minihack, tile_set

RUN = dict(num_envs=4, sequence_period=8, sequence_length=9, replay_size=64, min_replay_size=8, batch_size=4,
           samples_per_insert=2.0, target_update_period=3, eval_episodes=2)
FARM = dict(num_modules=2, module_size=16, attention_heads=1)
TINY_MSFA = RUN | FARM | dict(psi_hidden=(8,), phi_hidden=(8,))
TINY_USFA = RUN | dict(lstm_size=16, psi_hidden=(8,), phi_hidden=(8,))
TINY_UVFA = RUN | FARM | dict(lstm_size=16, q_hidden=(8,))

VARIANTS = {  # name: (script, tiny settings, has GPI)
    "msfa": (msfa_babyai, TINY_MSFA, True),
    "msfa-entangled-psi": (msfa_babyai, TINY_MSFA | dict(entangled_psi=True), True),
    "msfa-entangled-phi": (msfa_babyai, TINY_MSFA | dict(entangled_phi=True), True),
    "msfa-entangled-both": (msfa_babyai, TINY_MSFA | dict(entangled_psi=True, entangled_phi=True), True),
    "usfa": (usfa, TINY_USFA, True),
    "usfa-learned": (usfa, TINY_USFA | dict(learned_cumulants=True), True),
    "uvfa": (uvfa, TINY_UVFA, False),
    "uvfa-farm": (uvfa, TINY_UVFA | dict(farm=True), False),
    "mvfa": (uvfa, TINY_UVFA | dict(modular=True), False),
}
SCRIPTS = {"msfa_babyai": msfa_babyai, "msfa_fruitbot": msfa_fruitbot, "msfa_minihack": msfa_minihack, "usfa": usfa,
           "uvfa": uvfa}


def random_sequence(script, key, length: int, state, episode_end=None, pickups: bool = False):
    """A random replay sequence (the script's own Sequence type) of `length` steps from recurrent `state`, task
    w = [1, -1, 0.5, 0]; env cumulants are zero, or random one-hots on a third of the steps if `pickups`; if
    episode_end = e, step e + 1 starts a new episode."""
    k = jax.random.split(key, 7)
    first = jnp.zeros(length, bool)
    if episode_end is not None:
        first = first.at[episode_end + 1].set(True)
    phi = jnp.zeros((length, 4))
    if pickups:
        picked = jax.random.uniform(k[5], (length,)) < 1 / 3
        phi = jax.nn.one_hot(jax.random.randint(k[6], (length,), 0, 4), 4) * picked[:, None]
    fields = dict(
        obs=jax.random.randint(k[0], (length, 5, 5, 3), 0, 7).astype(jnp.uint8),
        w=jnp.broadcast_to(jnp.array([1.0, -1, 0.5, 0]), (length, 4)),
        prev_action=jax.random.randint(k[1], (length,), 0, 4),
        prev_reward=jax.random.normal(k[2], (length,)),
        first=first,
        action=jax.random.randint(k[3], (length,), 0, 4),
        reward=jax.random.normal(k[4], (length,)),
        phi=phi,
        final_obs=jax.random.randint(k[0], (length, 5, 5, 3), 0, 7).astype(jnp.uint8)[::-1],
        terminal=jnp.zeros(length, bool),  # BabyAI's episodes end by their time limit (a truncation)
    )
    steps = script.Step(**{name: fields[name] for name in script.Step._fields})
    return script.Sequence(steps=steps, state=state)


def replayed_evaluation(run_dir, step: int, tmp_path, gpi: str = "both") -> tuple[list[dict], list[dict]]:
    """(tools/evaluate.py's rows for a run's saved agents with the key the run's own evaluation at `step` used,
    the run's eval.csv rows of that step and GPI setting): a saved agent of any script and env must reproduce its
    run's numbers, also when one GPI setting is played alone (--gpi on|off)."""
    from tools import evaluate

    ran = [r for r in csv.DictReader(open(run_dir / "eval.csv")) if r["step"] == str(step)
           and (gpi == "both" or r["gpi"] == str(int(gpi == "on")))]
    evaluate.main(evaluate.Args(run_dir=str(run_dir), tasks="train;test", episodes=int(ran[0]["episodes"]),
                                seed=10_000 + step, gpi=gpi, out=str(tmp_path / "again.csv")))
    return list(csv.DictReader(open(tmp_path / "again.csv"))), ran


def assert_a_uvfa_training_iteration_traces(args: "uvfa.Args", num_train_tasks: int) -> None:
    """uvfa.py's run state on its envs (one seed) and one jitted training iteration (acting through the JAX env or
    the host envs' io_callback, replay, an SGD step), traced with jax.eval_shape, so nothing is compiled or run: the
    iteration keeps the state's shapes and logs per-task returns. What a tiny run of a UVFA variant would find wrong
    in its network's shapes on an env, found in seconds; one variant per env still runs for real (the loop is the
    same)."""
    setup = uvfa.make_setup(args, [1])
    key = jax.random.PRNGKey(1)
    actors = uvfa.fresh_actors(setup, args, *jax.random.split(key), seed_index=0)
    stack = lambda tree: jax.tree.map(lambda x: x[None], tree)  # noqa: E731  (a seed axis of one)
    try:
        state = jax.eval_shape(jax.vmap(lambda k, a: uvfa.init_train_state(setup, args, k, a)), key[None],
                               stack(actors))
        new_state, metrics = jax.eval_shape(uvfa.make_train_chunk(setup, args, 1), state)
    finally:
        for env in setup.env if uvfa.on_host(args) else ():  # the host envs (a JAX env has nothing to close)
            env.close()
    assert jax.tree.structure(new_state) == jax.tree.structure(state)
    assert all(a.shape == b.shape and a.dtype == b.dtype for a, b in zip(jax.tree.leaves(new_state),
                                                                        jax.tree.leaves(state)))
    assert metrics.sgd.losses["loss"].shape == (1, 1) and metrics.return_sum.shape == (1, 1, num_train_tasks)


def evaluation_return(run_dir: Path, w, use_gpi: bool, seed: int = 0) -> float:
    """The run's own script's evaluation of one episode of task w (as tools.evaluate --episodes 1 --seed seed)."""
    from tools.evaluate import load_agent, params_files, play

    script, args, params, header = load_agent(params_files(run_dir)[0])
    args = dataclasses.replace(args, eval_episodes=1)
    returns = play(script, args, params, np.asarray([w], np.float32), (int(use_gpi),),
                   jax.random.fold_in(jax.random.PRNGKey(seed), header["seed"]))
    return float(returns[0, 0, 0])


def check_video_is_the_evaluations(run_dir: Path, task: str, gpi: str, seed: int = 0, max_steps: int = 400):
    """tools.video's episode of a saved agent is its script's evaluation's: the same return, shown in the overlay;
    the per-module values add up to the chosen action's value."""
    from tools import video

    trace, header, env, w, _ = video.record_episode(run_dir, task, gpi, seed, max_steps=max_steps)
    assert trace.complete
    expected = evaluation_return(run_dir, w, gpi == "on", seed)
    assert trace.reward.sum() == pytest.approx(expected, abs=1e-4), (trace.reward.sum(), expected)
    last = video.overlay_lines(trace, len(trace.reward) - 1, env, w, gpi == "on")
    assert f"return {expected:+.2f}" in last[0], last
    assert len(trace.frames) == len(trace.reward) == len(trace.action)
    if trace.contribution.shape[1] > 0:
        np.testing.assert_allclose(trace.contribution.sum(-1), trace.q, atol=1e-4)
    return trace


RENDER_OF_ENV = {"babyai": GotoAvoid().rgb_from_symbolic, "fruitbot": lambda x: x,
                 "minihack": partial(render_minihack, tile_images=jnp.asarray(tile_set()[0]))}
"""the render of the scripts that take one (usfa.py, uvfa.py, msfa_babyai.py)"""


def gradients_and_priorities(script, args, env: str, seed: int = 0):
    """One SGD step's gradient (every parameter) and priorities, as the script's sgd_step computes them."""
    k = jax.random.split(jax.random.PRNGKey(seed), 4)
    net, target = script.make_network(args, k[0]), script.make_network(args, k[1])
    params, static = eqx.partition(net, eqx.is_inexact_array)
    target_params = eqx.filter(target, eqx.is_inexact_array)
    from benchmarks.sgd_variants import random_batch

    batch = random_batch(script, args, env, k[2], batch=3)
    probabilities = jax.random.uniform(k[3], (batch.steps.first.shape[0],), minval=0.01, maxval=0.1)
    takes_render = "render" in inspect.signature(script.batch_loss).parameters
    render = (RENDER_OF_ENV[env],) if takes_render else ()

    def grad(params, target_params, batch, probabilities):  # data as arguments: nothing for XLA to constant-fold
        def loss(params):
            return script.batch_loss(eqx.combine(params, static), eqx.combine(target_params, static), *render, batch,
                                     probabilities, args)
        grads, (priorities, *_) = jax.grad(loss, has_aux=True)(params)
        return grads, priorities

    return jax.jit(grad)(params, target_params, batch, probabilities)


@contextlib.contextmanager
def only_transitions(script, mask):
    """Within it, the script's losses and priorities count only the transitions where mask [T-1] holds, besides its
    own masking (its n_step_targets' `valid`, and-ed with mask): the masking tests look at one episode this way."""
    if mask is None:
        yield
        return
    original = script.n_step_targets

    def masked(*args, **kwargs):
        targets, valid = original(*args, **kwargs)
        return targets, valid & mask

    script.n_step_targets = masked
    try:
        yield
    finally:
        script.n_step_targets = original
