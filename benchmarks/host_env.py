"""How a host (C++) env meets the jitted learner: env steps/s of each way of driving Fruitbot, in one run.

    python -m benchmarks.host_env [--num-envs 32] [--steps 300] [--repeats 3] [--no-train-loop]

Prints, for N envs stepped together (medians of the repeats, ratios to the raw env from the same run):
  raw procgen        gym3 act + observe with random actions, nothing else: timed inside procgen's own environment
                     (common/envs/procgen_env.py), then from here through its pipe;
  Fruitbot env       common.envs.fruitbot.Fruitbot: the same plus exact sparse cumulants, tasks and lifetimes;
  io_callback        one jitted lax.scan over the steps: the network acts, the env steps through
                     jax.experimental.io_callback inside the same program (the BabyAI scripts' shape);
  host loop          a Python loop around a jitted act (Podracer's Sebulba shape): act, copy to host, step;
  training loop      msfa_fruitbot.py's own jitted chunk: acting as io_callback does, plus replay and SGD steps.
Both acting options run the same network (the Impala torso and a linear head, vmapped over the envs) and take
random actions from it, so the envs see the same kind of play in every row.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import tyro
from jax.experimental import io_callback

from common.envs import procgen_env
from common.envs.fruitbot import IMAGE_SHAPE, NUM_ACTIONS, TASK_DIM, Fruitbot
from common.networks import ImpalaTorso, linear


@dataclass
class Args:
    num_envs: int = 32
    """envs stepped together"""
    steps: int = 300
    """steps of every env per timed call"""
    repeats: int = 3
    """timed calls per figure (the median is reported)"""
    train_loop: bool = True
    """also time msfa_fruitbot.py's whole training loop (one iteration per call: slow on a CPU)"""
    samples_per_insert: float = 6.0
    """the training loop's replay ratio (the paper's: 6)"""


class Policy(eqx.Module):
    torso: ImpalaTorso
    head: eqx.nn.Linear

    def __init__(self, key):
        k1, k2 = jax.random.split(key)
        self.torso, self.head = ImpalaTorso(k1), linear(8 * 8 * 32 + TASK_DIM, NUM_ACTIONS, k2)

    def __call__(self, image, w, key, epsilon):
        """epsilon-greedy; epsilon arrives at run time (1: random play), so XLA cannot drop the network."""
        q = self.head(jnp.concatenate([self.torso(image).reshape(-1), w]))
        explore = jax.random.uniform(key) < epsilon
        return jnp.where(explore, jax.random.randint(jax.random.fold_in(key, 1), (), 0, NUM_ACTIONS), jnp.argmax(q))


def train_loop_sps(script, args) -> float:
    """Env steps/s of a host-env script's own jitted chunk (msfa_fruitbot.py, msfa_minihack.py: act through
    io_callback, insert, SGD at args.samples_per_insert), paper network sizes, a small replay; median over
    args.repeats of one iteration each."""
    run_args = script.Args(num_envs=args.num_envs, samples_per_insert=args.samples_per_insert, replay_size=200,
                           min_replay_size=args.num_envs)
    setup = script.make_setup(run_args, [1])
    actors = jax.tree.map(lambda x: x[None], script.fresh_actors(setup, run_args, 0, jax.random.PRNGKey(1)))
    state = jax.vmap(lambda k, a: script.init_train_state(setup, run_args, k, a))(jax.random.PRNGKey(0)[None], actors)
    chunk = script.make_train_chunk(setup, run_args, 1)
    holder = {"state": chunk(state)[0]}  # fills replay past min_replay_size and compiles

    def run():
        holder["state"], metrics = chunk(holder["state"])
        jax.block_until_ready(metrics)

    return script.steps_per_iteration(run_args) / timed(run, args.repeats)


def timed(run, repeats: int) -> float:
    run()  # warm-up (and compilation)
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        run()
        times.append(time.perf_counter() - start)
    return float(np.median(times))


def main(args: Args) -> None:
    n, steps = args.num_envs, args.steps
    rng = np.random.default_rng(0)
    policy = Policy(jax.random.PRNGKey(0))
    act = jax.vmap(policy, (0, 0, 0, None))
    epsilon = jnp.ones(())

    options = dict(env_name="fruitbot", distribution_mode="hard", num_levels=200, rand_seed=0)
    raw = procgen_env.ProcgenEnv(num=n, **options)

    def run_raw():  # through the pipe to procgen's own environment, as the scripts' host env reaches it
        for _ in range(steps):
            raw.act(rng.integers(0, NUM_ACTIONS, n).astype(np.int32))
            raw.observe()

    env = Fruitbot(n, seed=0)
    obs = env.reset()

    def run_env():
        for _ in range(steps):
            env.step(rng.integers(0, NUM_ACTIONS, n))

    def host_step(actions):
        o, reward, terminated, truncated, info = env.step(np.asarray(actions))
        return o["image"], o["w"], reward, terminated | truncated

    shapes = (jax.ShapeDtypeStruct((n,) + IMAGE_SHAPE, jnp.uint8), jax.ShapeDtypeStruct((n, TASK_DIM), jnp.float32),
              jax.ShapeDtypeStruct((n,), jnp.float32), jax.ShapeDtypeStruct((n,), jnp.bool_))

    @jax.jit
    def scan_steps(image, w, key):
        def body(carry, key):
            image, w = carry
            actions = act(image, w, jax.random.split(key, n), epsilon)
            image, w, reward, done = io_callback(host_step, shapes, actions)
            return (image, w), reward.sum()
        (image, w), rewards = jax.lax.scan(body, (image, w), jax.random.split(key, steps))
        return image, w, rewards.sum()

    state = {"image": jnp.asarray(obs["image"]), "w": jnp.asarray(obs["w"]), "key": jax.random.PRNGKey(1)}

    def run_io():
        state["key"], key = jax.random.split(state["key"])
        image, w, total = scan_steps(state["image"], state["w"], key)
        total.block_until_ready()
        state["image"], state["w"] = image, w

    jit_act = jax.jit(act)

    def run_host():
        o = {"image": np.asarray(state["image"]), "w": np.asarray(state["w"])}
        for _ in range(steps):
            state["key"], key = jax.random.split(state["key"])
            actions = np.asarray(jit_act(o["image"], o["w"], jax.random.split(key, n), epsilon))
            o, *_ = env.step(actions)

    print(f"jax {jax.__version__} on {jax.devices()[0].device_kind}; {n} envs x {steps} steps per call, median of "
          f"{args.repeats}; Fruitbot hard")
    rows = [("raw procgen, through the pipe", run_raw), ("Fruitbot env (sparse cumulants)", run_env), ("io_callback in a jitted scan", run_io),
            ("host loop around a jitted act", run_host)]
    in_process = procgen_env.server().call("time_random_play", dict(num=n, **options), steps, args.repeats + 1, 0)
    base = n * steps / float(np.median(in_process[1:]))
    print(f"  {'raw procgen, in its own process':34s} {base:9,.0f} env steps/s  = {1:5.2f} x raw")
    for name, run in rows:
        sps = n * steps / timed(run, args.repeats)
        print(f"  {name:34s} {sps:9,.0f} env steps/s  = {sps / base:5.2f} x raw")
    if args.train_loop:
        import msfa_fruitbot  # a benchmark may import a script; scripts never import each other

        sps = train_loop_sps(msfa_fruitbot, args)
        print(f"  {'msfa_fruitbot.py training loop':34s} {sps:9,.0f} env steps/s  = {sps / base:5.2f} x raw "
              f"({args.num_envs} envs, replay ratio {args.samples_per_insert:g}, batch 8 x 41)")
    print(f"  cumulant reads: get_state on {env.stats['state_reads'] / env.stats['steps']:.1%} of env steps, "
          f"replays on {env.stats['replays'] / env.stats['steps']:.2%}")


if __name__ == "__main__":
    main(tyro.cli(Args))
