"""Greedy returns of a saved agent on any task vectors, with and without GPI, per seed, as eval.csv rows.

    python -m tools.evaluate RUN_DIR --tasks "1,1,0,0;-1,1,-1,1" --episodes 40 [--gpi both|on|off] [--out FILE]

Any run of any script: BabyAI, Fruitbot and MiniHack (task vectors of the run's env; on the host envs every episode
is played on a fresh, unrestricted level, as the runs' own evaluations are).

Reads the run's small parameter files (params_seed<N>.eqx, written at every evaluation: the online parameters of
seed N and, in their header, the step, the method and the run's arguments), rebuilds each seed's network with the
script that trained it, and runs that script's own evaluation on the given tasks. Rows go to stdout (or --out) in
eval.csv's format: step, seed, split, task, gpi, episodes, return_mean, return_std.
"""

from __future__ import annotations

import csv
import dataclasses
import importlib
import json
import sys
from dataclasses import dataclass
from pathlib import Path

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import tyro

from common.envs import babyai
from common.run import (EVAL_FIELDS, ConfigError, evaluation_parts, evaluation_rows, exit_on_config_error,
                        format_task, load_script, require)
from tools.compact_agents import open_params
from tools.run_reader import method_reader, recorded_env, tasks_of_env
from tools.script_contract import EVALUATE, has_psi, require_names

MSFA_SCRIPTS = {"babyai": "msfa_babyai", "fruitbot": "msfa_fruitbot", "minihack": "msfa_minihack"}
BASELINE_SCRIPTS = {"USFA": "usfa", "UVFA": "uvfa", "UVFA-FARM": "uvfa", "MVFA": "uvfa"}  # one script per family, --env


@dataclass
class Args:
    run_dir: tyro.conf.Positional[str]
    """a run directory holding params_seed<N>.eqx files"""
    tasks: str = "train;test"
    """task vectors separated by ';', each comma-separated weights (e.g. "1,1,0,0;-1,1,-1,1"), or train/test (the run's
    env's task sets)"""
    episodes: int = 40
    """greedy episodes per task, seed and GPI setting"""
    gpi: str = "both"
    """both, on (GPI over the train tasks) or off (act on w); methods without GPI have off only. One setting is
    played alone (half the time of both) and gives the same rows as that setting of both"""
    seed: int = 0
    """seed of the evaluation episodes (a run's own evaluation at step S used 10000 + S)"""
    out: str | None = None
    """write the rows to this CSV file instead of stdout"""
    truncate_task_input: bool = False
    """play with the task input truncated to integers, as the authors' environment fed it to the agent (int32(w):
    [-.5,1,-.5,-.5] is seen as the train task [0,1,0,0]); the rewards use the true w. BabyAI runs (their scripts'
    --truncate-task-input)"""


def parse_tasks(text: str, train=babyai.TRAIN_TASKS, test=babyai.TEST_TASKS) -> np.ndarray:
    """"1,0,0,0;train" -> the task matrix [n, dim]; 'train'/'test' stand for the env's task sets (BabyAI's by
    default)."""
    rows = []
    for part in text.split(";"):
        part = part.strip()
        if part in ("train", "test"):
            rows.extend(train if part == "train" else test)
            continue
        try:
            w = [float(x) for x in part.split(",")]
        except ValueError:
            raise ConfigError(f"--tasks: {part!r} is not a task vector; write comma-separated numbers, tasks "
                              "separated by ';', e.g. \"1,1,0,0;-1,1,-1,1\"") from None
        require(len(w) == train.shape[1], f"--tasks: {part!r} has {len(w)} weights; a task of this env has "
                                          f"{train.shape[1]}")
        rows.append(w)
    return np.asarray(rows, np.float32)


def params_files(run_dir: Path) -> list[Path]:
    """A run's parameter files, params_seed<N>.eqx (or their compact form .eqz, tools/compact_agents.py), in seed order;
    of a protocol's method trained seed by seed and not merged yet, its complete seeds' (run_reader.method_reader);
    one line if there are none."""
    require(run_dir.is_dir(), f"{run_dir} is not a directory: no params_seed<N>.eqx there; pass a run directory that "
                              "has evaluated at least once")
    files = sorted(method_reader(run_dir).saved_agents(), key=lambda p: int(p.stem.split("seed")[1]))
    require(files, f"no params_seed<N>.eqx (or .eqz) in {run_dir}; pass a run directory that has evaluated at least "
                   "once")
    seeds = [p.stem for p in files]
    for twice in sorted({s for s in seeds if seeds.count(s) > 1})[:1]:
        require(False, f"{run_dir} holds both {twice}.eqx and {twice}.eqz: keep one (the .eqx is the newer if the run "
                       "went on after tools.compact_agents)")
    return files


def load_agent(path: Path):
    """(script module, its Args, the seed's online params, header) from a params_seed<N>.eqx (or .eqz) file."""
    with open_params(path) as f:
        try:
            header = json.loads(f.readline().decode())
        except ValueError:
            raise ConfigError(f"{path} is not a parameter file (no JSON header)") from None
        if "script" in header:  # the script that trained it (a copy with its own network and losses included)
            script = load_script(header["script"], str(path))
        else:  # files written before runs named their script: the repository's script of the method and env
            family = str(header.get("method", "")).split(" ")[0]  # "MSFA (entangled psi)" -> "MSFA"
            require(family == "MSFA" or family in BASELINE_SCRIPTS, f"{path}: unknown method {header.get('method')!r}")
            env = recorded_env(header)
            require(env in MSFA_SCRIPTS, f"{path}: unknown environment {env!r}")
            script = importlib.import_module(MSFA_SCRIPTS[env] if family == "MSFA" else BASELINE_SCRIPTS[family])
        require_names(script, EVALUATE, "every tool that loads agents", str(path))
        fields = {f.name for f in dataclasses.fields(script.Args)}
        args = script.Args(**{k: tuple(v) if isinstance(v, list) else v for k, v in header["args"].items()
                              if k in fields})
        # the weights' shapes only (eval_shape computes nothing); every array of the networks is a weight
        skeleton = eqx.filter(eqx.filter_eval_shape(script.make_network, args, jax.random.PRNGKey(0)),
                              lambda x: isinstance(x, jax.ShapeDtypeStruct))
        try:
            params = eqx.tree_deserialise_leaves(f, skeleton)
        except Exception as e:  # equinox raises several types for short or mismatched files
            raise ConfigError(f"{path} is truncated or does not match its header's network ({type(e).__name__})") \
                from None
    return script, args, params, header


def greedy_step(script, net, to_input, policies, use_gpi: bool, image, w, prev_action, prev_reward, state):
    """One step of a script's evaluation policy, with what it computed on the way (tools.analyze and tools.video
    replay evaluation episodes through it): the core's step on the stored observation (to_input: what core_step
    takes), the greedy action of max_z psi(s, a, z) . w over `policies` (GPI) or of Q(s, a; w), that action's value,
    the policy z* GPI followed (w without GPI), psi_c(s, a, z*) w_c per cumulant c (zeros for agents without
    successor features: they sum to the value) and the new recurrent state."""
    state = script.core_step(net.core, to_input(image), prev_action, prev_reward, state)
    h = state[0]
    if not has_psi(script):
        q = script.q_values(net, h, w)
        action = jnp.argmax(q)
        return action, q[action], w, jnp.zeros_like(w), state
    q = script.gpi_q_values(net, h, w, policies) if use_gpi else script.q_values(net, h, w)
    action = jnp.argmax(q)
    z = policies if use_gpi else w[None]
    psi = jax.vmap(net.psi, (None, 0))(h, z)[:, action]  # [Z, C]
    chosen = jnp.argmax(psi @ w)
    return action, q[action], z[chosen], psi[chosen] * w, state


def play_evaluation(script, run_args, params, tasks: np.ndarray, settings: tuple, key):
    """The script's evaluation of the GPI settings asked for, as it returns it: the returns [settings, tasks,
    episodes], or an Evaluation holding them and the cumulant response. Each setting keeps its own keys, so --gpi off
    gives the rows of --gpi both's off setting at half the cost."""
    setup = script.make_setup(run_args)
    return script.make_evaluate(setup, run_args, tasks, gpi_settings=settings)(params, key)


def play(script, run_args, params, tasks: np.ndarray, settings: tuple, key) -> np.ndarray:
    """The returns [settings, tasks, episodes] of play_evaluation."""
    return np.asarray(evaluation_parts(play_evaluation(script, run_args, params, tasks, settings, key)).returns)


@exit_on_config_error
def main(args: Args) -> None:
    run_dir = Path(args.run_dir)
    files = params_files(run_dir)
    require(args.gpi in ("both", "on", "off"), f"--gpi must be both, on or off, got {args.gpi!r}")
    require(args.episodes > 0, f"--episodes must be positive, got {args.episodes}")
    agents = [load_agent(path) for path in files]
    envs = {recorded_env(header) for *_, header in agents}  # the files alone say it (config.json may be absent)
    require(len(envs) == 1, f"{run_dir}'s parameter files come from different environments ({', '.join(sorted(envs))})")
    train_tasks, test_tasks = tasks_of_env(envs.pop())
    tasks = parse_tasks(args.tasks, train_tasks, test_tasks)
    train = {format_task(w) for w in train_tasks}
    rows = []
    for script, run_args, params, header in agents:
        settings = tuple(g for g in script.GPI_SETTINGS if args.gpi == "both" or g == (args.gpi == "on"))
        require(settings, f"{header['method']} has no GPI: use --gpi off or both")
        run_args = dataclasses.replace(run_args, eval_episodes=args.episodes)
        if args.truncate_task_input:
            require(hasattr(run_args, "truncate_task_input"), f"{header['method']}'s script has no "
                                                              "--truncate-task-input (BabyAI's scripts do)")
            run_args = dataclasses.replace(run_args, truncate_task_input=True)
        out = play_evaluation(script, run_args, params, tasks, settings,
                              jax.random.fold_in(jax.random.PRNGKey(args.seed), header["seed"]))
        is_train = [format_task(w) in train for w in tasks]  # (the response is read on the train tasks' rows)
        rows += evaluation_rows(out, header["seed"], header["step"], tasks, is_train, settings)
    out = open(args.out, "w", newline="") if args.out else sys.stdout
    writer = csv.DictWriter(out, EVAL_FIELDS)
    writer.writeheader()
    writer.writerows(rows)
    if args.out:
        out.close()


if __name__ == "__main__":
    main(tyro.cli(Args))
