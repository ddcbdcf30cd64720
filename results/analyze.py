"""The paper's analyses of saved agents: Table A, cumulant quality, pickup heatmaps and module activity.

    python -m results.analyze RUN_DIR [RUN_DIR ...] --out results/babyai/analysis [--episodes 40] [--gpi on]

Each RUN_DIR holds params_seed<N>.eqx files (written at every evaluation; results/evaluate.py loads them). For every
run and seed this plays greedy episodes of every train and test task with the agent's own evaluation policy (GPI over
the train tasks, or acting on w with --gpi off), records per step the reward r, the env's cumulant phi_env (pickups
per category), the learned cumulant phi (methods that learn one) and each module's share of the chosen action's
value, and writes to --out:

- analysis.md: Table A, the reward-prediction error of the learned cumulants on the test tasks, |phi . w - r| and
  (phi . w - r)^2 per transition, mean ± std over the transitions of all episodes and seeds, beside the paper's
  numbers (its formula is not in the authors' code, so both are given); the cumulant quality per category
  (common.run.cumulant_quality: correlation of phi^k with the pickups of category k, and its error on pickup and
  other transitions), over all tasks' episodes; and the mean pickups per episode of each category.
- per_seed.csv: per method, seed and task, the greedy episodes' mean return and (learned cumulants) the mean
  |phi . w - r| and (phi . w - r)^2 of their transitions: Table A per seed on every task (results.claims reads it).
- pickup_heatmaps.png: per method, the mean pickups of each category per episode on each test task.
- module_activity.png: one episode of --activity-task per SF run (seed 1 or its first): each module's contribution
  sum_{c in module k} psi_c(s, a, z*) w_c to the value of the chosen action a (z* the policy GPI chose), against the
  pickups of each category.

The learned cumulant of transition t is phi(h_{t+1}, h_t); the last transition of an episode has no h_{t+1} (the
env resets at the time limit before the final view is seen), so the statistics use the first T-1 transitions.
"""

from __future__ import annotations

import csv
from dataclasses import dataclass
from pathlib import Path

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import tyro

from common.envs.babyai import CATEGORY_KINDS, TEST_TASKS, TRAIN_TASKS
from common.run import cumulant_quality, cumulant_stats, exit_on_config_error, format_task, require
from results import contract
from results.contract import play_names, require_names, run_label
from results.evaluate import greedy_step, load_agent, params_files, parse_tasks
from results.summarize import run_env

PAPER_TABLE_A = {  # the paper's Table A: task -> (MSFA, USFA-learned-phi), mean ± std over 40 episodes per task
    "1,1,0,0": ((0.0003, 0.0090), (0.1362, 0.3410)),
    "1,1,0.5,0.5": ((0.0069, 0.0405), (0.3922, 0.7051)),
    "1,1,1,1": ((0.0118, 0.0856), (2.5530, 4.0324)),
    "-0.5,1,-0.5,-0.5": ((0.0095, 0.0478), (0.0556, 0.1041)),
    "-1,1,0,1": ((0.0014, 0.0264), (0.0652, 0.2470)),
}
CATEGORIES = [f"{color} {kind}" for kind, color in CATEGORY_KINDS]


@dataclass
class Args:
    run_dirs: tyro.conf.Positional[tuple[str, ...]]
    """run directories holding params_seed<N>.eqx files (e.g. MSFA's and USFA-learned's)"""
    out: str = "analysis"
    """folder for analysis.md, per_seed.csv, pickup_heatmaps.png and module_activity.png"""
    episodes: int = 40
    """greedy episodes per task and seed (the paper's Table A: 40)"""
    gpi: str = "on"
    """on: the evaluation policy of the SF methods (GPI over the train tasks); off: act on w (also the UVFA family)"""
    activity_task: str = "-1,1,0,1"
    """the task of the module-activity episode"""
    seed: int = 0
    """seed of the episodes"""


@dataclass
class Agent:
    """One saved seed of a run, rebuilt with the script that trained it."""
    run: str  # the run's label and folder
    method: str  # the run's label (contract.run_label): its method, or a copy's exp_name
    seed: int
    step: int
    script: object
    args: object
    params: object


def load_agents(run_dir: Path) -> list[Agent]:
    files = params_files(run_dir)
    agents = []
    for path in files:
        script, args, params, header = load_agent(path)
        label = run_label(header, run_dir.name)
        agent = Agent(f"{label} ({run_dir.name})", label, header["seed"], header["step"], script, args, params)
        require_names(script, play_names(script), "results.analyze", str(path))
        agents.append(agent)
    return agents


def has_psi(agent: Agent) -> bool:
    return contract.has_psi(agent.script)


def has_learned_phi(agent: Agent) -> bool:
    return has_psi(agent) and getattr(agent.args, "learned_cumulants", True)  # MSFA always learns phi


def module_groups(agent: Agent, num_categories: int) -> int:
    """How many modules share the task vector's columns: MSFA's modules (unless psi is entangled); else one per
    category (USFA's contributions are per category)."""
    if hasattr(agent.args, "num_modules") and not getattr(agent.args, "entangled_psi", False):
        return agent.args.num_modules
    return num_categories


def rollout(agent: Agent, tasks: np.ndarray, episodes: int, use_gpi: bool, key) -> dict[str, np.ndarray]:
    """Greedy episodes [tasks, episodes, T, ...] of one saved seed. The policy is the script's own evaluation policy
    (its q_values / gpi_q_values), with make_evaluate's key layout, so the returns equal its evaluation's. Returns
    reward [.., T], phi_env [.., T, C], phi [.., T-1, C] (learned cumulants, where the method has them), q [.., T]
    (the value the policy gave the chosen action a) and contribution [.., T, C] (psi_c(s, a, z*) w_c, z* the
    policy GPI chose: its sum over c is q)."""
    script = agent.script
    setup = script.make_setup(agent.args)
    env = setup.env
    net = eqx.combine(agent.params, setup.static)
    policies = jnp.asarray(TRAIN_TASKS)
    learned = has_learned_phi(agent)

    def episode(key, w):
        env_params = env.task_params(w)
        key_reset, key_run = jax.random.split(key)
        obs, env_state = env.reset(key_reset, env_params)
        carry0 = (env_state, obs, jnp.zeros((), jnp.int32), jnp.zeros(()), net.core.initial_state())

        def step(carry, key):
            env_state, obs, prev_action, prev_reward, rnn = carry
            action, q, _, contribution, rnn = greedy_step(script, net, env.rgb_from_symbolic, policies, use_gpi,
                                                          obs.image, obs.w, prev_action, prev_reward, rnn)
            obs, env_state, reward, _, _, info = env.step(key, env_state, action, env_params)
            return (env_state, obs, action, reward, rnn), (reward, info["phi"], rnn[0], q, contribution)

        _, (reward, phi_env, h, q, contribution) = jax.lax.scan(
            step, carry0, jax.random.split(key_run, env_params.max_steps_in_episode))
        out = {"reward": reward, "phi_env": phi_env, "q": q, "contribution": contribution}
        if learned:
            out["phi"] = jax.vmap(net.phi)(h[1:], h[:-1])
        return out

    keys = jax.random.split(key, (2, len(tasks), episodes))[int(use_gpi)]  # make_evaluate's keys of this setting
    run = jax.jit(jax.vmap(jax.vmap(episode, (0, None)), (0, 0)))
    return jax.tree.map(np.asarray, run(keys, jnp.asarray(tasks)))


def prediction_errors(trace: dict, tasks: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """|phi . w - r| and (phi . w - r)^2 per transition [tasks, episodes * (T-1)] (Table A), with the true w."""
    predicted = np.einsum("netc,nc->net", trace["phi"], tasks)
    error = predicted - trace["reward"][..., :-1]
    return np.abs(error).reshape(len(tasks), -1), (error**2).reshape(len(tasks), -1)


def mean_std(x: np.ndarray) -> str:
    return f"{x.mean():.4f} ± {x.std():.4f}"


def table_a(runs: dict[str, dict], tasks: np.ndarray) -> list[str]:
    learned = [name for name, r in runs.items() if "phi" in r["traces"][0]]
    if not learned:
        return ["(no run with learned cumulants: Table A needs MSFA or USFA --learned-cumulants)"]
    test = [t for t, w in enumerate(tasks) if any(np.array_equal(w, x) for x in TEST_TASKS)]
    lines = ["| task | " + " | ".join(f"{n}: abs. error | {n}: sq. error" for n in learned)
             + " | paper: MSFA | paper: USFA-learned |",
             "|---|" + "---:|---:|" * len(learned) + "---:|---:|"]
    for t in test:
        cells = []
        for name in learned:
            pairs = [prediction_errors(trace, tasks) for trace in runs[name]["traces"]]
            absolute = np.concatenate([a[t] for a, _ in pairs])
            squared = np.concatenate([s[t] for _, s in pairs])
            cells += [mean_std(absolute), mean_std(squared)]
        paper = PAPER_TABLE_A.get(format_task(tasks[t]))
        paper_cells = [f"{m:.4f} ± {s:.4f}" for m, s in paper] if paper else ["-", "-"]
        lines.append(f"| {format_task(tasks[t])} | " + " | ".join(cells + paper_cells) + " |")
    return lines


PER_SEED_FIELDS = ("method", "seed", "step", "gpi", "split", "task", "episodes", "return", "abs_error", "sq_error")


def write_per_seed(runs: dict[str, dict], tasks: np.ndarray, path: Path) -> None:
    """per_seed.csv: per method, seed and task, the mean return of the greedy episodes and, for learned cumulants,
    the mean |phi . w - r| and (phi . w - r)^2 over their transitions (Table A's errors per seed, on every task, so
    that intervals over seeds can be drawn: results.claims)."""
    test = {format_task(w) for w in TEST_TASKS}
    with path.open("w", newline="") as f:
        writer = csv.DictWriter(f, PER_SEED_FIELDS)
        writer.writeheader()
        for name, r in runs.items():
            for agent, trace in zip(r["agents"], r["traces"]):
                errors = prediction_errors(trace, tasks) if "phi" in trace else None
                for t, w in enumerate(tasks):
                    task = format_task(w)
                    writer.writerow({
                        "method": name, "seed": agent.seed, "step": agent.step, "gpi": int(r["gpi"]),
                        "split": "test" if task in test else "train", "task": task,
                        "episodes": trace["reward"].shape[1], "return": f"{trace['reward'][t].sum(-1).mean():.6g}",
                        "abs_error": "" if errors is None else f"{errors[0][t].mean():.6g}",
                        "sq_error": "" if errors is None else f"{errors[1][t].mean():.6g}"})


def quality_table(runs: dict[str, dict]) -> list[str]:
    lines = ["| method | category | correlation | error on pickups | error elsewhere | pickups |",
             "|---|---|---:|---:|---:|---:|"]
    for name, r in runs.items():
        if "phi" not in r["traces"][0]:
            continue
        sums = 0.0
        for tr in r["traces"]:  # the sums the training scripts log (common.run.cumulant_stats), pooled over seeds
            valid = np.ones(tr["phi"].shape[:-1], bool)
            sums = sums + np.asarray(cumulant_stats(tr["phi"], tr["phi_env"][:, :, :-1], valid), np.float64)
        quality = cumulant_quality(sums)
        for k, category in enumerate(CATEGORIES):
            lines.append(f"| {name} | {k + 1} ({category}) | {quality['corr'][k]:.3f} | "
                         f"{quality['error_pickup'][k]:.3f} | {quality['error_other'][k]:.3f} | {int(sums[6, k])} |")
    return lines


def pickups(runs: dict[str, dict]) -> dict[str, np.ndarray]:
    """Mean pickups per episode [tasks, C] of each run, over its seeds and episodes."""
    return {name: np.mean([tr["phi_env"].sum(2).mean(1) for tr in r["traces"]], axis=0) for name, r in runs.items()}


def pickup_table(counts: dict[str, np.ndarray], tasks: np.ndarray) -> list[str]:
    lines = ["| method | task | " + " | ".join(CATEGORIES) + " | return |",
             "|---|---|" + "---:|" * (len(CATEGORIES) + 1)]
    for name, c in counts.items():
        for t, w in enumerate(tasks):
            lines.append(f"| {name} | {format_task(w)} | " + " | ".join(f"{x:.2f}" for x in c[t])
                         + f" | {float(c[t] @ w):.2f} |")
    return lines


def plot_heatmaps(counts: dict[str, np.ndarray], tasks: np.ndarray, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    test = [t for t, w in enumerate(tasks) if any(np.array_equal(w, x) for x in TEST_TASKS)] or list(range(len(tasks)))
    vmax = max(float(c[test].max()) for c in counts.values()) or 1.0
    fig, axes = plt.subplots(1, len(counts), figsize=(2.8 * len(counts) + 2.5, 0.45 * len(test) + 2.2), squeeze=False,
                             sharey=True)
    for ax, (name, c) in zip(axes[0], counts.items()):
        image = ax.imshow(c[test], cmap="viridis", vmin=0, vmax=vmax, aspect="auto")
        for i, t in enumerate(test):
            for k in range(c.shape[1]):
                color = "white" if c[t, k] < 0.6 * vmax else "black"
                weight = "bold" if tasks[t, k] > 0 else "normal"
                ax.text(k, i, f"{c[t, k]:.1f}", ha="center", va="center", fontsize=8, color=color, fontweight=weight)
        ax.set_xticks(range(c.shape[1]), CATEGORIES, rotation=35, ha="right", fontsize=8)
        ax.set_yticks(range(len(test)), [format_task(tasks[t]) for t in test])
        ax.set_title(name, fontsize=9)
    axes[0, 0].set_ylabel("test task w")
    fig.colorbar(image, ax=axes[0].tolist(), label="pickups per episode")
    fig.suptitle("Pickups per episode of each category on the test tasks (bold: categories the task rewards)",
                 fontsize=10)
    fig.savefig(path, dpi=120, bbox_inches="tight")
    plt.close(fig)


def plot_activity(activity: dict[str, tuple], task: np.ndarray, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(len(activity), 1, figsize=(11, 2.6 * len(activity)), squeeze=False, sharex=True)
    colors = plt.get_cmap("tab10").colors
    for ax, (name, (contribution, phi_env, groups)) in zip(axes[:, 0], activity.items()):
        per_group = contribution.reshape(len(contribution), groups, -1).sum(-1)
        msfa = name.startswith("MSFA")
        for k in range(groups):
            label = f"module {k + 1}" if msfa else f"category {k + 1}"
            ax.plot(per_group[:, k], color=colors[k], lw=1.2, label=label)
        for t, k in zip(*np.nonzero(phi_env)):
            ax.axvline(t, color=colors[k], ls=":", lw=1.5)
        what = "each module's sum of psi_c w_c over its columns" if msfa else "psi_c w_c per category"
        ax.set_title(f"{name}: {what}, for the chosen action (dotted: a pickup of the category of that colour)",
                     fontsize=8)
        ax.set_ylabel("contribution to Q")
        ax.legend(fontsize=7, loc="upper right", ncol=groups)
    axes[-1, 0].set_xlabel(f"step of one greedy episode of task [{format_task(task)}]")
    fig.savefig(path, dpi=120, bbox_inches="tight")
    plt.close(fig)


@exit_on_config_error
def main(args: Args) -> None:
    require(args.run_dirs, "name at least one run directory")
    for d in args.run_dirs:
        require(run_env(Path(d)) == "babyai", f"{d} is a {run_env(Path(d))} run; results.analyze handles BabyAI runs "
                                              "only so far")
    require(args.episodes > 0, f"--episodes must be positive, got {args.episodes}")
    require(args.gpi in ("on", "off"), f"--gpi must be on or off, got {args.gpi!r}")
    activity_task = parse_tasks(args.activity_task)
    require(len(activity_task) == 1, f"--activity-task takes one task vector, got {args.activity_task!r}")
    tasks = np.concatenate([TRAIN_TASKS, TEST_TASKS])
    loaded = [load_agents(Path(d)) for d in args.run_dirs]
    methods = [agents[0].method for agents in loaded]
    runs = {}
    for agents in loaded:  # named by method, or by method and folder where a method comes twice
        name = agents[0].method if methods.count(agents[0].method) == 1 else agents[0].run
        require(name not in runs, f"{name} is named twice; pass each run directory once")
        use_gpi = args.gpi == "on" and has_psi(agents[0])
        traces = [rollout(a, tasks, args.episodes, use_gpi, jax.random.fold_in(jax.random.PRNGKey(args.seed), a.seed))
                  for a in agents]
        runs[name] = {"agents": agents, "traces": traces, "gpi": use_gpi}
        returns = np.mean([tr["reward"].sum(-1).mean() for tr in traces])
        print(f"{name}: {len(agents)} seed(s) at step {agents[0].step:,}, {args.episodes} episodes per task, "
              f"{'GPI' if use_gpi else 'no GPI'}; mean return over all tasks {returns:.2f}", flush=True)

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    counts = pickups(runs)
    described = "; ".join(f"{n}: seeds {[a.seed for a in r['agents']]} at step {r['agents'][0].step:,}, "
                          f"{'GPI over the train tasks' if r['gpi'] else 'acting on w'}" for n, r in runs.items())
    lines = [f"# Analysis of saved agents ({args.episodes} greedy episodes per task and seed; {described})", "",
             "## Table A: reward-prediction error of the learned cumulants on the test tasks", "",
             "Per transition, |phi . w - r| (abs.) and (phi . w - r)^2 (sq.), mean ± std over the transitions of all "
             "episodes and seeds (the first T-1 of each episode: the last has no next state). The paper does not "
             "say which it reports.", "", *table_a(runs, tasks), "",
             "## Cumulant quality (all tasks' episodes)", "",
             "Per category k: correlation of phi^k with the pickups of k, and mean |phi^k - phi_env^k| on the "
             "transitions that picked up k and on the rest.", "", *quality_table(runs), "",
             "## Pickups per episode", "", *pickup_table(counts, tasks), ""]
    (out / "analysis.md").write_text("\n".join(lines))
    print("\n".join(lines))
    write_per_seed(runs, tasks, out / "per_seed.csv")
    plot_heatmaps(counts, tasks, out / "pickup_heatmaps.png")

    activity = {}
    for name, r in runs.items():
        agent = r["agents"][0]
        if not has_psi(agent):
            continue
        trace = rollout(agent, activity_task, 1, r["gpi"], jax.random.PRNGKey(args.seed))
        activity[f"{name}, seed {agent.seed}"] = (trace["contribution"][0, 0], trace["phi_env"][0, 0],
                                                  module_groups(agent, tasks.shape[1]))
    written = ["analysis.md", "per_seed.csv", "pickup_heatmaps.png"]
    if activity:
        plot_activity(activity, activity_task[0], out / "module_activity.png")
        written.append("module_activity.png")
    print(f"wrote {', '.join(str(out / f) for f in written)}")


if __name__ == "__main__":
    main(tyro.cli(Args))
