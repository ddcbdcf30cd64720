"""--reward-input off: the recurrent core cannot read the previous reward, on every path an agent is played or
trained through (docs/cumulants.md). Perturbing the previous reward changes nothing, exactly, with off, and changes
the states with on (the paper's agent), for every script and env and for the plain and fused FARM:

- core_step, the one step that acting, evaluation and every tool (analyze, evaluate, video, compare) play
  a saved agent with;
- the learner's SGD step (the online and the target unrolls, and the losses and priorities built on them);
- next_states, where a learned cumulant's h_{t+1} is recomputed from the transition's reward (episode ends)."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import msfa_babyai
import msfa_fruitbot
import msfa_minihack
import usfa
import uvfa
from helpers import RENDER_OF_ENV, TINY_MSFA, TINY_USFA, TINY_UVFA

CASES = {  # name: (script, tiny settings, env)
    "msfa_babyai": (msfa_babyai, TINY_MSFA | dict(time_limit_is_termination=True), "babyai"),
    "msfa_fruitbot": (msfa_fruitbot, TINY_MSFA, "fruitbot"),
    "msfa_minihack": (msfa_minihack, TINY_MSFA | dict(num_modules=3), "minihack"),
    "usfa-learned_babyai": (usfa, TINY_USFA | dict(learned_cumulants=True, time_limit_is_termination=True), "babyai"),
    "usfa-learned_fruitbot": (usfa, TINY_USFA | dict(learned_cumulants=True, env="fruitbot"), "fruitbot"),
    "usfa-learned_minihack": (usfa, TINY_USFA | dict(learned_cumulants=True, env="minihack"), "minihack"),
    "uvfa_babyai": (uvfa, TINY_UVFA, "babyai"),
    "uvfa-farm_babyai": (uvfa, TINY_UVFA | dict(farm=True), "babyai"),
    "mvfa_babyai": (uvfa, TINY_UVFA | dict(modular=True), "babyai"),
}
FARM_CASES = ("msfa_babyai", "msfa_fruitbot", "msfa_minihack", "uvfa-farm_babyai", "mvfa_babyai")
PARAMS = [(case, backend) for case in CASES for backend in (("plain", "fused") if case in FARM_CASES else (None,))]


def settings(case: str, backend: str | None, reward_input: str):
    script, tiny, env = CASES[case]
    return script, script.Args(**tiny, reward_input=reward_input,
                               **({"core_backend": backend} if backend else {})), env


def other_rewards(batch):
    """The batch with every step's previous reward replaced by other values (nothing else changed)."""
    steps = batch.steps._replace(prev_reward=3.0 * batch.steps.prev_reward[..., ::-1] + 1.0)
    return batch._replace(steps=steps)


def observation(script, env: str, key):
    """A random observation as the script's core_step takes it (rendered where the script renders first)."""
    if env == "babyai":
        raw = jax.random.randint(key, (5, 5, 3), 0, 7).astype(jnp.uint8)
    elif env == "fruitbot":
        raw = jax.random.randint(key, (64, 64, 3), 0, 256).astype(jnp.uint8)
    else:
        from common.envs.minihack import tile_set
        raw = jax.random.randint(key, (9, 9), 0, len(tile_set()[0])).astype(jnp.int16)
    return raw if script in (msfa_fruitbot, msfa_minihack) else RENDER_OF_ENV[env](raw)


def changes(a, b) -> float:
    return max(float(np.max(np.abs(np.asarray(x, np.float64) - np.asarray(y, np.float64))))
               for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)))


@pytest.mark.parametrize("case,backend", PARAMS)
def test_one_step_reads_the_reward_only_with_reward_input_on(case, backend):
    """core_step: acting, evaluation and the tools."""
    for reward_input, blind in (("off", True), ("on", False)):
        script, args, env = settings(case, backend, reward_input)
        net = script.make_network(args, jax.random.PRNGKey(1))
        assert net.core.reward_input is (not blind)
        k = jax.random.split(jax.random.PRNGKey(2), 3)
        state = jax.tree.map(lambda x: 0.5 * jax.random.normal(k[0], x.shape), net.core.initial_state())
        obs = observation(script, env, k[1])
        step = jax.jit(lambda r: script.core_step(net.core, obs, jnp.int32(1), r, state))
        difference = changes(step(jnp.float32(1.0)), step(jnp.float32(-0.5)))
        assert (difference == 0.0) if blind else (difference > 1e-4), (reward_input, difference)


def sgd_step_outputs(script, args, env: str):
    """A jitted f(batch) -> the script's batch_loss outputs (the loss, the priorities, every loss term) for fixed
    online and target parameters, and a random batch of the script's sequences."""
    import inspect

    import equinox as eqx

    from benchmarks.sgd_variants import random_batch

    k = jax.random.split(jax.random.PRNGKey(0), 4)
    net, target = script.make_network(args, k[0]), script.make_network(args, k[1])
    batch = random_batch(script, args, env, k[2], batch=3)
    probabilities = jax.random.uniform(k[3], (3,), minval=0.01, maxval=0.1)
    render = (RENDER_OF_ENV[env],) if "render" in inspect.signature(script.batch_loss).parameters else ()

    @eqx.filter_jit
    def outputs(batch):
        loss, (priorities, losses, *_) = script.batch_loss(net, target, *render, batch, probabilities, args)
        return loss, priorities, losses

    return outputs, batch


@pytest.mark.parametrize("case,backend", PARAMS)
def test_the_sgd_step_reads_the_reward_input_only_with_reward_input_on(case, backend):
    """The learner: its online and target unrolls, and the losses and priorities built on them."""
    for reward_input, blind in (("off", True), ("on", False)):
        script, args, env = settings(case, backend, reward_input)
        outputs, batch = sgd_step_outputs(script, args, env)
        difference = changes(outputs(batch), outputs(other_rewards(batch)))
        assert (difference == 0.0) if blind else (difference > 1e-6), (reward_input, difference)


NEXT_STATES = ("msfa_babyai", "msfa_fruitbot", "msfa_minihack", "usfa-learned_babyai", "usfa-learned_fruitbot",
               "usfa-learned_minihack")


@pytest.mark.parametrize("case", NEXT_STATES)
def test_next_states_read_the_transitions_reward_only_with_reward_input_on(case):
    """Where an episode ends, h_{t+1} of a learned cumulant is recomputed from the transition's action and reward."""
    from benchmarks.sgd_variants import random_batch

    for reward_input, blind in (("off", True), ("on", False)):
        script, args, env = settings(case, "plain" if case.startswith("msfa") else None, reward_input)
        net = script.make_network(args, jax.random.PRNGKey(1))
        seq = jax.tree.map(lambda x: x[0], random_batch(script, args, env, jax.random.PRNGKey(3), batch=1))
        seq = seq._replace(steps=seq.steps._replace(first=seq.steps.first.at[4].set(True)))  # an episode ends at 3
        other = seq._replace(steps=seq.steps._replace(reward=2.0 * seq.steps.reward + 1.0))

        def h_next(seq):
            if script is msfa_babyai:
                states = script.unroll(net.core, RENDER_OF_ENV[env], seq)
                return script.next_states(net.core, RENDER_OF_ENV[env], seq, states, args)
            if script is msfa_fruitbot:
                maps, states = script.unroll(net.core, seq)
                return script.next_states(net.core, maps, seq, states)
            if script is msfa_minihack:
                return script.next_states(net.core, seq, script.unroll(net.core, seq))
            maps, states = script.unroll(net.core, RENDER_OF_ENV[env], seq)
            return script.next_states(net.core, RENDER_OF_ENV[env], seq, states, args, maps)

        difference = changes(h_next(seq), h_next(other))
        assert (difference == 0.0) if blind else (difference > 1e-6), (reward_input, difference)


def test_the_switch_is_part_of_the_method_name_and_a_setting():
    assert msfa_babyai.method_name(msfa_babyai.Args(reward_input="off")) == "MSFA (reward-blind)"
    assert msfa_babyai.method_name(msfa_babyai.Args(entangled_psi=True, reward_input="off")) == \
        "MSFA (entangled psi, reward-blind)"
    assert usfa.method_name(usfa.Args(learned_cumulants=True, reward_input="off")) == \
        "USFA (learned cumulants, reward-blind)"
    assert uvfa.method_name(uvfa.Args(modular=True, reward_input="off")) == "MVFA (reward-blind)"
    assert msfa_babyai.method_name(msfa_babyai.Args()) == "MSFA"
    for f in dataclasses.fields(msfa_babyai.Args):
        if f.name == "reward_input":
            assert f.default == "on"  # the paper's agent by default
