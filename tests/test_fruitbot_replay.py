"""Fruitbot's replay of game states (common.envs.fruitbot_jax.GameView, 38 bytes a step instead of a 12,288-byte
frame) in msfa_fruitbot.py, usfa.py and uvfa.py: the frames the learner draws from replay are the frames the actors
saw, a run keeping game states learns exactly as the same run keeping frames, replay_bytes is what the buffer holds,
and a run resumed from its checkpoint (replay of game states included) continues exactly.

Each script runs a tiny program keeping game states, two jitted chunks of 8 iterations each: 4 envs x 8 steps an
iteration, learning from the second iteration on (one SGD step an iteration), 15 SGD steps. msfa_fruitbot.py also
runs it keeping frames (--replay-frames), and the two runs are compared step by step (usfa.py and uvfa.py draw with the
same code and the same FruitbotJax.draw; a second compile of each would double this file's time in CI). The 64
sequences in replay cover the paper game's deaths, lifetime ends and episode starts (lifetimes of one level, 128 steps
per env); tests/test_fruitbot_jax.py checks the drawing over longer play, level completions within a lifetime, and
stock hard's keys and doors."""

import dataclasses
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import msfa_fruitbot
import usfa
import uvfa
from common.envs import fruitbot_jax
from common.run.checkpoint import load_checkpoint, save_checkpoint

RUN = dict(num_envs=4, sequence_period=8, sequence_length=9, replay_size=64, min_replay_size=8, batch_size=4,
           samples_per_insert=1.0, target_update_period=3, eval_episodes=1, max_levels=1, train_levels=8,
           eval_levels=4)
SCRIPTS = {
    "msfa": (msfa_fruitbot, RUN | dict(num_modules=2, module_size=8, attention_heads=1, psi_hidden=(8,),
                                       phi_hidden=(8,))),
    "usfa": (usfa, RUN | dict(env="fruitbot", lstm_size=16, psi_hidden=(8,), phi_hidden=(8,), learned_cumulants=True)),
    "mvfa": (uvfa, RUN | dict(env="fruitbot", modular=True, num_modules=2, module_size=8, attention_heads=1,
                              q_hidden=(8,))),
}
ITERATIONS = 8


def first_state(script, args):
    """One seed's setup and new train state, with the seed axis the chunk vmaps over."""
    setup = script.make_setup(args, [args.seed])
    key = jax.random.PRNGKey(args.seed)
    if script is msfa_fruitbot:
        actors = script.fresh_actors(setup, args, 0, jax.random.fold_in(key, 1))
        state = jax.jit(lambda k, a: script.init_train_state(setup, args, k, a))(key, actors)
    else:
        state = jax.jit(lambda k: script.init_train_state(setup, args, k))(key)
    return setup, jax.tree.map(lambda x: x[None], state)


RUNS = {}


def run_script(name, tmp_path_factory):
    """Per replay kind (game states; frames too for msfa_fruitbot.py): args, setup, the state after two chunks and
    both chunks' metrics; and the game-state run's checkpoint after its first chunk. Run once per script."""
    if name in RUNS:
        return RUNS[name]
    script, tiny = SCRIPTS[name]
    checkpoint = tmp_path_factory.mktemp(name) / "checkpoint.eqx"
    out = {}
    for kind in ("states", "frames") if script is msfa_fruitbot else ("states",):
        args = script.Args(**tiny | dict(replay_frames=kind == "frames"))
        setup, state = first_state(script, args)
        chunk = script.make_train_chunk(setup, args, ITERATIONS)
        state, first = chunk(state)
        if kind == "states":
            save_checkpoint(checkpoint, state, {"step": 1})
        state, second = chunk(state)
        out[kind] = dict(args=args, setup=setup, state=state, chunk=chunk,
                         metrics=jax.tree.map(lambda a, b: np.concatenate([a, b], 1), first, second))
    RUNS[name] = script, out, checkpoint
    return RUNS[name]


@pytest.fixture(scope="module", params=sorted(SCRIPTS))
def runs(request, tmp_path_factory):
    return run_script(request.param, tmp_path_factory)


@pytest.fixture(scope="module")
def msfa_runs(tmp_path_factory):
    """msfa_fruitbot.py's runs, both replay kinds."""
    return run_script("msfa", tmp_path_factory)


def test_the_replay_kinds(runs):
    script, out, _ = runs
    args = out["states"]["args"]
    assert script.keeps_game_views(args) and not script.keeps_game_views(dataclasses.replace(args, replay_frames=True))
    assert isinstance(out["states"]["state"].buffer.experience.steps.obs, fruitbot_jax.GameView)
    if "frames" in out:
        assert out["frames"]["state"].buffer.experience.steps.obs.dtype == jnp.uint8


def test_the_last_steps_in_replay_draw_the_frames_the_actors_see(runs):
    """The sequences inserted last end with the step every env is at now: drawn from replay, each is the frame the
    actor acts on next."""
    script, out, _ = runs
    run = out["states"]
    actors, steps = run["state"].actors, run["state"].buffer.experience.steps
    image = actors.image if script is msfa_fruitbot else actors.obs.image  # [seeds, envs, 64, 64, 3]
    n = RUN["num_envs"]
    assert bool(run["state"].buffer.is_full[0]) and int(run["state"].buffer.current_index[0]) == 0  # wrapped exactly
    last = jax.tree.map(lambda a: a[0, 0, -n:, -1], steps.obs)  # so the last n sequences inserted are at the end
    np.testing.assert_array_equal(np.asarray(run["setup"].env.draw(last, run["setup"].env_params)),
                                  np.asarray(image[0]))


def test_frames_drawn_from_replay_are_the_frames_the_actors_saw(msfa_runs):
    """Every step of every sequence in replay: the frame drawn from the game-state run's GameView equals, bit for bit,
    the frame the frame run stored (the same actors, acting on the same frames), and every other field is equal."""
    script, out, _ = msfa_runs
    states, frames = out["states"]["state"].buffer.experience, out["frames"]["state"].buffer.experience
    filled = 2 * ITERATIONS * RUN["num_envs"]
    views = jax.tree.map(lambda a: a[0, 0, :filled], states.steps.obs)  # [seeds, 1, capacity, time, ...]
    drawn = out["states"]["setup"].env.draw(views, out["states"]["setup"].env_params)
    stored = np.asarray(frames.steps.obs[0, 0, :filled])
    assert stored.shape == (filled, RUN["sequence_length"], 64, 64, 3) and stored.any()
    np.testing.assert_array_equal(np.asarray(drawn), stored)
    for name in states.steps._fields[1:]:
        np.testing.assert_array_equal(getattr(states.steps, name), getattr(frames.steps, name), err_msg=name)
    first = np.asarray(states.steps.first[0, 0, :filled])
    assert first[:, 1:].any() and first[:, 0].any()  # sequences cross episode starts, and some begin with one
    levels = np.asarray(views.level) // out["states"]["setup"].env_params.pool.x.shape[1]
    assert len(np.unique(levels)) > 1  # several tasks' pools


def test_a_run_keeping_game_states_learns_exactly_as_one_keeping_frames(msfa_runs):
    """The same seed's losses, Q means and gradient norms at every SGD step (every loss the script reports), and the
    final parameters, are equal."""
    script, out, _ = msfa_runs
    a, b = out["states"]["metrics"], out["frames"]["metrics"]
    learning = np.asarray(a.learning)[0] > 0
    assert learning.sum() == 2 * ITERATIONS - 1
    for name in script.LOSS_NAMES:
        np.testing.assert_array_equal(a.sgd.losses[name], b.sgd.losses[name], err_msg=name)
        assert np.all(np.asarray(a.sgd.losses[name])[0, learning] != 0), name
    for x, y in zip(jax.tree.leaves(out["states"]["state"].params), jax.tree.leaves(out["frames"]["state"].params)):
        np.testing.assert_array_equal(x, y)


def test_replay_bytes_is_what_the_buffer_holds(runs):
    """The script's replay_bytes (printed at start, used by tools.protocol to fit seeds) against the replay's
    arrays, for both kinds."""
    script, out, _ = runs
    for kind in out:
        held = sum(x.nbytes for x in jax.tree.leaves(out[kind]["state"].buffer.experience))
        assert script.replay_bytes(out[kind]["args"]) == held, kind
    if "frames" in out:
        assert script.replay_bytes(out["states"]["args"], frames=True) == script.replay_bytes(out["frames"]["args"])


def test_a_resumed_run_continues_exactly(runs):
    """The game-state run's checkpoint after its first chunk (actors' games, replay of game states, priorities, the
    networks and the key), loaded into a fresh state's skeleton, runs the second chunk to the same state."""
    _, out, checkpoint = runs
    run = out["states"]
    skeleton = first_state(runs[0], run["args"])[1]
    state, meta = load_checkpoint(Path(checkpoint), skeleton)
    assert meta == {"step": 1}
    state, metrics = run["chunk"](state)
    for name in ("loss", "q_mean", "grad_norm"):
        np.testing.assert_array_equal(metrics.sgd.losses[name],
                                      np.asarray(run["metrics"].sgd.losses[name])[:, ITERATIONS:], err_msg=name)
    for x, y in zip(jax.tree.leaves(state), jax.tree.leaves(run["state"])):
        np.testing.assert_array_equal(x, y)
