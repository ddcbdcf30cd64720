"""Memory of a Fruitbot run at the paper's settings: replay bytes per seed, game states against frames, and XLA's
memory analysis of the compiled training chunk for K vmapped seeds (nothing is allocated: the train state is
abstract, so a frame replay that no device holds still compiles and is measured).

    python -m benchmarks.replay_memory                              # msfa_fruitbot.py, 10 seeds, game states
    python -m benchmarks.replay_memory --frames                     # the same with a replay of frames
    python -m benchmarks.replay_memory --script usfa --flags="--env fruitbot --learned-cumulants"

XLA's numbers: arguments (the train state: replay, networks, optimiser, actors), outputs (the same state, donated:
"alias" counts the bytes shared with the arguments), temporaries (the learner's and actors' scratch), and the peak a
device needs, arguments + outputs - alias + temporaries. On a CPU the temporaries are the CPU compiler's; run it on the
GPU to have the GPU's.
"""

from __future__ import annotations

import importlib
import shlex
import time
from dataclasses import dataclass

import tyro


@dataclass
class Args:
    script: str = "msfa_fruitbot"
    """the script (module name): msfa_fruitbot, usfa or uvfa (with --flags "--env fruitbot ...")"""
    flags: str = ""
    """the script's flags (its defaults are the paper's settings)"""
    seeds: int = 10
    """vmapped seeds of the compiled chunk"""
    frames: bool = False
    """a replay of frames (--replay-frames) instead of game states"""


def gib(n: float) -> str:
    return f"{n / 2**30:.2f} GiB"


def main(bench: Args) -> None:
    import jax
    import jax.numpy as jnp

    script = importlib.import_module(bench.script)
    args = tyro.cli(script.Args, args=[*shlex.split(bench.flags), *(["--replay-frames"] if bench.frames else []),
                                       "--num-seeds", str(bench.seeds)])
    kept = "game states" if script.keeps_game_views(args) else "frames"
    print(f"{bench.script} {bench.flags} ({script.method_name(args)}), {bench.seeds} seeds, replay of {kept}: "
          f"{gib(script.replay_bytes(args))} per seed (game states {gib(script.replay_bytes(args, frames=False))}, "
          f"frames {gib(script.replay_bytes(args, frames=True))}); {jax.devices()[0].device_kind} "
          f"({jax.default_backend()}), jax {jax.__version__}", flush=True)
    seeds = list(range(1, bench.seeds + 1))
    setup = script.make_setup(args, seeds)
    keys = jnp.stack([jax.random.PRNGKey(s) for s in seeds])
    if script.__name__ == "msfa_fruitbot":
        actors = jax.vmap(lambda k, i: script.fresh_actors(setup, args, i, k))(keys, jnp.arange(bench.seeds))
        state = jax.eval_shape(jax.vmap(lambda k, a: script.init_train_state(setup, args, k, a)), keys, actors)
    else:
        state = jax.eval_shape(jax.vmap(lambda k: script.init_train_state(setup, args, k)), keys)
    replay = sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(state.buffer.experience))
    start = time.perf_counter()
    compiled = script.make_train_chunk(setup, args, 1).lower(state).compile()
    memory = compiled.memory_analysis()
    peak = (memory.argument_size_in_bytes + memory.output_size_in_bytes - memory.alias_size_in_bytes
            + memory.temp_size_in_bytes)
    print(f"replay arrays of the train state: {gib(replay)} ({gib(replay / bench.seeds)} per seed)")
    print(f"XLA memory analysis of one training iteration (compiled in {time.perf_counter() - start:.0f} s): "
          f"arguments {gib(memory.argument_size_in_bytes)}, outputs {gib(memory.output_size_in_bytes)}, alias "
          f"{gib(memory.alias_size_in_bytes)}, temporaries {gib(memory.temp_size_in_bytes)}, generated code "
          f"{memory.generated_code_size_in_bytes / 2**20:.1f} MiB; peak {gib(peak)}", flush=True)


if __name__ == "__main__":
    main(tyro.cli(Args))
