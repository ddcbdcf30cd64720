"""The paper's analyses of saved agents: Table A, cumulant quality, pickup heatmaps and module activity.

    python -m results.analyze RUN_DIR [RUN_DIR ...] --out results/babyai/analysis [--episodes 40] [--gpi on]
    python -m results.analyze --records A/analysis B/analysis --out DIR   # seeds played apart, reported together

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
- records.json: per seed, what all of the above is made of, as sums over its transitions (a few kB per seed).

Every table is computed from the records, and a seed's record depends on that seed alone (its episodes' keys are
--seed folded with the agent's seed), so seeds played apart and reported together (--records: the folders of
earlier analyses) give the analysis of playing them together. results.protocol plays each seed as it completes and
reports a method from its seeds' records, so a method's agents are not needed once its seeds are played.

The learned cumulant of transition t is phi(h_{t+1}, h_t); the last transition of an episode has no h_{t+1} (the
env resets at the time limit before the final view is seen), so the statistics use the first T-1 transitions.
"""

from __future__ import annotations

import csv
import json
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
TEST_NAMES = {format_task(w) for w in TEST_TASKS}


@dataclass
class Args:
    run_dirs: tyro.conf.Positional[tuple[str, ...]] = ()
    """run directories holding params_seed<N>.eqx files (e.g. MSFA's and USFA-learned's)"""
    records: tuple[str, ...] = ()
    """folders of earlier analyses (their records.json) to report with the runs played now: a method's seeds,
    each played apart, are one run"""
    out: str = "analysis"
    """folder for analysis.md, per_seed.csv, records.json, pickup_heatmaps.png and module_activity.png"""
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


def seed_record(agent: Agent, trace: dict, tasks: np.ndarray, use_gpi: bool, activity: dict | None) -> dict:
    """One seed's episodes as the report needs them, ready for JSON: per task the mean return and the mean pickups of
    each category per episode; with learned cumulants, per task the sums over its transitions of |phi . w - r|,
    (phi . w - r)^2 and its square (from which Table A's mean and std pool over seeds), and cumulant_stats' sums over
    every task's transitions; for SF runs, the module-activity episode (the first seed played of a run)."""
    record = {"method": agent.method, "run": agent.run, "seed": agent.seed, "step": agent.step, "gpi": bool(use_gpi),
              "episodes": int(trace["reward"].shape[1]), "tasks": [format_task(w) for w in tasks],
              "returns": trace["reward"].sum(-1).mean(-1).tolist(),
              "pickups": trace["phi_env"].sum(2).mean(1).tolist(), "activity": activity}
    if "phi" in trace:
        absolute, squared = (e.astype(np.float64) for e in prediction_errors(trace, tasks))
        valid = np.ones(trace["phi"].shape[:-1], bool)  # (the first T-1 transitions of every episode)
        sums = np.asarray(cumulant_stats(trace["phi"], trace["phi_env"][:, :, :-1], valid), np.float64)
        record["errors"] = {"transitions": absolute.shape[1], "abs": absolute.sum(1).tolist(),
                            "sq": squared.sum(1).tolist(), "sq_sq": (squared**2).sum(1).tolist()}
        record["cumulant_sums"] = sums.tolist()
    return record


def pooled(records: list[dict], t: int, first: str, second: str) -> str:
    """mean ± std over the transitions of task t of all the records' seeds, from the sums of x (first) and x^2."""
    n = sum(r["errors"]["transitions"] for r in records)
    mean = sum(r["errors"][first][t] for r in records) / n
    square = sum(r["errors"][second][t] for r in records) / n
    return f"{mean:.4f} ± {np.sqrt(max(square - mean**2, 0.0)):.4f}"


def table_a(runs: dict[str, list[dict]], tasks: list[str]) -> list[str]:
    learned = [name for name, records in runs.items() if "errors" in records[0]]
    if not learned:
        return ["(no run with learned cumulants: Table A needs MSFA or USFA --learned-cumulants)"]
    test = [t for t, task in enumerate(tasks) if task in TEST_NAMES]
    lines = ["| task | " + " | ".join(f"{n}: abs. error | {n}: sq. error" for n in learned)
             + " | paper: MSFA | paper: USFA-learned |",
             "|---|" + "---:|---:|" * len(learned) + "---:|---:|"]
    for t in test:
        cells = []
        for name in learned:
            cells += [pooled(runs[name], t, "abs", "sq"), pooled(runs[name], t, "sq", "sq_sq")]
        paper = PAPER_TABLE_A.get(tasks[t])
        paper_cells = [f"{m:.4f} ± {s:.4f}" for m, s in paper] if paper else ["-", "-"]
        lines.append(f"| {tasks[t]} | " + " | ".join(cells + paper_cells) + " |")
    return lines


PER_SEED_FIELDS = ("method", "seed", "step", "gpi", "split", "task", "episodes", "return", "abs_error", "sq_error")


def write_per_seed(runs: dict[str, list[dict]], path: Path) -> None:
    """per_seed.csv: per method, seed and task, the mean return of the greedy episodes and, for learned cumulants,
    the mean |phi . w - r| and (phi . w - r)^2 over their transitions (Table A's errors per seed, on every task, so
    that intervals over seeds can be drawn: results.claims)."""
    with path.open("w", newline="") as f:
        writer = csv.DictWriter(f, PER_SEED_FIELDS)
        writer.writeheader()
        for name, records in runs.items():
            for r in records:
                errors = r.get("errors")
                for t, task in enumerate(r["tasks"]):
                    writer.writerow({
                        "method": name, "seed": r["seed"], "step": r["step"], "gpi": int(r["gpi"]),
                        "split": "test" if task in TEST_NAMES else "train", "task": task, "episodes": r["episodes"],
                        "return": f"{r['returns'][t]:.6g}",
                        "abs_error": "" if errors is None else f"{errors['abs'][t] / errors['transitions']:.6g}",
                        "sq_error": "" if errors is None else f"{errors['sq'][t] / errors['transitions']:.6g}"})


def quality_table(runs: dict[str, list[dict]]) -> list[str]:
    lines = ["| method | category | correlation | error on pickups | error elsewhere | pickups |",
             "|---|---|---:|---:|---:|---:|"]
    for name, records in runs.items():
        if "cumulant_sums" not in records[0]:
            continue
        sums = sum(np.asarray(r["cumulant_sums"]) for r in records)  # as the training scripts log them, pooled
        quality = cumulant_quality(sums)
        for k, category in enumerate(CATEGORIES):
            lines.append(f"| {name} | {k + 1} ({category}) | {quality['corr'][k]:.3f} | "
                         f"{quality['error_pickup'][k]:.3f} | {quality['error_other'][k]:.3f} | {int(sums[6, k])} |")
    if len(lines) == 2:  # a header over no rows reads as a bug; say why the table is empty, as table_a does
        return ["(no run with learned cumulants: only MSFA and USFA --learned-cumulants learn phi)"]
    return lines


def pickups(runs: dict[str, list[dict]]) -> dict[str, np.ndarray]:
    """Mean pickups per episode [tasks, C] of each run, over its seeds and episodes."""
    return {name: np.mean([r["pickups"] for r in records], axis=0) for name, records in runs.items()}


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
    require(args.run_dirs or args.records, "name at least one run directory (or --records: earlier analyses)")
    for d in args.run_dirs:
        require(run_env(Path(d)) == "babyai", f"{d} is a {run_env(Path(d))} run; results.analyze handles BabyAI runs "
                                              "only so far")
    require(args.episodes > 0, f"--episodes must be positive, got {args.episodes}")
    require(args.gpi in ("on", "off"), f"--gpi must be on or off, got {args.gpi!r}")
    activity_task = parse_tasks(args.activity_task)
    require(len(activity_task) == 1, f"--activity-task takes one task vector, got {args.activity_task!r}")
    tasks = np.concatenate([TRAIN_TASKS, TEST_TASKS])
    records = [r for folder in args.records for r in read_records(Path(folder))]
    loaded = [load_agents(Path(d)) for d in args.run_dirs]
    methods = [agents[0].method for agents in loaded]
    for agents in loaded:  # named by method, or by method and folder where a method comes twice
        name = agents[0].method if methods.count(agents[0].method) == 1 else agents[0].run
        use_gpi = args.gpi == "on" and has_psi(agents[0])
        for i, agent in enumerate(agents):
            trace = rollout(agent, tasks, args.episodes, use_gpi,
                            jax.random.fold_in(jax.random.PRNGKey(args.seed), agent.seed))
            activity = None
            if i == 0 and has_psi(agent):
                one = rollout(agent, activity_task, 1, use_gpi, jax.random.PRNGKey(args.seed))
                activity = {"task": args.activity_task, "contribution": one["contribution"][0, 0].tolist(),
                            "phi_env": one["phi_env"][0, 0].tolist(), "groups": module_groups(agent, tasks.shape[1])}
            records.append(seed_record(agent, trace, tasks, use_gpi, activity) | {"name": name})
    report(group_records(records), Path(args.out))


def read_records(folder: Path) -> list[dict]:
    """The seed records of an earlier analysis (its records.json), named by their method."""
    path = folder / "records.json"
    require(path.exists(), f"--records: {path} does not exist; pass folders that results.analyze wrote")
    return [r | {"name": r["method"]} for r in json.loads(path.read_text())]


def group_records(records: list[dict]) -> dict[str, list[dict]]:
    """name -> the records of its seeds, in seed order; every record of one analysis played alike."""
    require(records, "no seeds to analyse")
    for r in records:
        require((r["episodes"], r["tasks"]) == (records[0]["episodes"], records[0]["tasks"]),
                f"seed {r['seed']} of {r['name']} was played with {r['episodes']} episodes per task on other tasks "
                f"than seed {records[0]['seed']} of {records[0]['name']} ({records[0]['episodes']}); analyse them "
                "alike")
    runs: dict[str, list[dict]] = {}
    for r in records:
        runs.setdefault(r["name"], []).append(r)
    for name, group in runs.items():
        seeds = [r["seed"] for r in group]
        require(len(set(seeds)) == len(seeds), f"{name}: seed {max(seeds, key=seeds.count)} comes twice; pass each "
                                               "run directory or analysis once")
        require(len({r["gpi"] for r in group}) == 1, f"{name}: its seeds were played with and without GPI")
        group.sort(key=lambda r: r["seed"])
    return runs


def report(runs: dict[str, list[dict]], out: Path) -> None:
    """analysis.md, per_seed.csv, records.json and the figures, from the seeds' records."""
    first = next(iter(runs.values()))[0]
    tasks = np.array([[float(x) for x in task.split(",")] for task in first["tasks"]], np.float32)
    for name, records in runs.items():
        returns = np.mean([np.mean(r["returns"]) for r in records])
        print(f"{name}: {len(records)} seed(s) at step {records[0]['step']:,}, {first['episodes']} episodes per task, "
              f"{'GPI' if records[0]['gpi'] else 'no GPI'}; mean return over all tasks {returns:.2f}", flush=True)
    out.mkdir(parents=True, exist_ok=True)
    counts = pickups(runs)
    described = "; ".join(f"{n}: seeds {[r['seed'] for r in records]} at step {records[0]['step']:,}, "
                          f"{'GPI over the train tasks' if records[0]['gpi'] else 'acting on w'}"
                          for n, records in runs.items())
    lines = [f"# Analysis of saved agents ({first['episodes']} greedy episodes per task and seed; {described})", "",
             "## Table A: reward-prediction error of the learned cumulants on the test tasks", "",
             "Per transition, |phi . w - r| (abs.) and (phi . w - r)^2 (sq.), mean ± std over the transitions of all "
             "episodes and seeds (the first T-1 of each episode: the last has no next state). The paper does not "
             "say which it reports.", "", *table_a(runs, first["tasks"]), "",
             "## Cumulant quality (all tasks' episodes)", "",
             "Per category k: correlation of phi^k with the pickups of k, and mean |phi^k - phi_env^k| on the "
             "transitions that picked up k and on the rest.", "", *quality_table(runs), "",
             "## Pickups per episode", "", *pickup_table(counts, tasks), ""]
    (out / "analysis.md").write_text("\n".join(lines))
    print("\n".join(lines))
    write_per_seed(runs, out / "per_seed.csv")
    (out / "records.json").write_text(json.dumps([{k: v for k, v in r.items() if k != "name"}
                                                  for records in runs.values() for r in records]))
    plot_heatmaps(counts, tasks, out / "pickup_heatmaps.png")
    activity = {}
    for name, records in runs.items():
        shown = next((r for r in records if r["activity"]), None)
        if shown:
            a = shown["activity"]
            activity[f"{name}, seed {shown['seed']}"] = (np.array(a["contribution"]), np.array(a["phi_env"]),
                                                         a["groups"])
    written = ["analysis.md", "per_seed.csv", "records.json", "pickup_heatmaps.png"]
    if activity:
        task = next(r["activity"]["task"] for records in runs.values() for r in records if r["activity"])
        plot_activity(activity, parse_tasks(task)[0], out / "module_activity.png")
        written.append("module_activity.png")
    print(f"wrote {', '.join(str(out / f) for f in written)}")


if __name__ == "__main__":
    main(tyro.cli(Args))
