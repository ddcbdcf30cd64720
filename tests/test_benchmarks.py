"""The benchmarks build their inputs from the scripts' own types: a change to a replay item must not break them
unnoticed (benchmarks/learner.py once did, found only on a lent GPU). Timings are never asserted."""

import jax
import pytest

from benchmarks import learner


@pytest.mark.parametrize("name", list(learner.METHODS))
def test_learner_benchmark_batch_is_a_valid_replay_item(name):
    script, flags = learner.METHODS[name]
    args = script.Args(**flags, replay_size=64, min_replay_size=8)
    batch = jax.eval_shape(lambda key: learner.random_batch(script, args, key), jax.random.PRNGKey(0))
    assert set(batch.steps._fields) == set(script.Step._fields)
    assert batch.steps.obs.shape[:2] == (args.batch_size, args.sequence_length)


def test_minihack_benchmark_runs_its_env_rows(capsys):
    """The MiniHack observation benchmark's env rows on a few steps, worker processes included (the training-loop row
    compiles the Impala network: left to the benchmark itself)."""
    from benchmarks import minihack_env

    minihack_env.main(minihack_env.Args(num_envs=4, steps=3, repeats=1, train_loop=False))
    out = capsys.readouterr().out
    assert "NLE + pixel_crop" in out and "tile crops + jitted render" in out and "worker processes" in out
