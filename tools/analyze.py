"""The paper's analyses of saved agents: Table A, cumulant quality, pickup heatmaps and module activity.

    python -m tools.analyze RUN_DIR [RUN_DIR ...] --out results/babyai/analysis [--episodes 40] [--gpi on]
    python -m tools.analyze --records A/analysis B/analysis --out DIR   # seeds played apart, reported together

Each RUN_DIR holds params_seed<N>.eqx files (written at every evaluation; tools/evaluate.py loads them). For every
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
  |phi . w - r| and (phi . w - r)^2 of their transitions: Table A per seed on every task (tools.claims reads it).
- pickup_heatmaps.png: per method, the mean pickups of each category per episode on each test task.
- module_activity.png: one episode of --activity-task per SF run (seed 1 or its first): each module's contribution
  sum_{c in module k} psi_c(s, a, z*) w_c to the value of the chosen action a (z* the policy GPI chose), against the
  pickups of each category.
- records.json: per seed, what all of the above is made of, as sums over its transitions (a few kB per seed).

Every table is computed from the records, and a seed's record depends on that seed alone (its episodes' keys are
--seed folded with the agent's seed), so seeds played apart and reported together (--records: the folders of
earlier analyses) give the analysis of playing them together. tools.protocol plays each seed as it completes and
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
from common.run import (RESPONSE, cumulant_quality, cumulant_response, cumulant_stats, exit_on_config_error,
                        format_task, require, response_means, response_sums)
from tools import script_contract
from tools.script_contract import play_names, require_names, run_label
from tools.evaluate import greedy_step, load_agent, params_files, parse_tasks
from tools.figures import save_figure
from tools.run_reader import RunReader, record_response, record_rows

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
    method: str  # the run's label (script_contract.run_label): its method, or a copy's exp_name
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
        require_names(script, play_names(script), __spec__.name, str(path))
        agents.append(agent)
    return agents


def has_psi(agent: Agent) -> bool:
    return script_contract.has_psi(agent.script)


def has_learned_phi(agent: Agent) -> bool:
    return has_psi(agent) and getattr(agent.args, "learned_cumulants", True)  # MSFA always learns phi


def module_groups(agent: Agent, num_categories: int) -> int:
    """How many modules share the task vector's columns: MSFA's modules (unless psi is entangled); else one per
    category (USFA's contributions are per category)."""
    if hasattr(agent.args, "num_modules") and not getattr(agent.args, "entangled_psi", False):
        return agent.args.num_modules
    return num_categories


def rollout(agent: Agent, tasks: np.ndarray, episodes: int, use_gpi: bool, key,
            response: bool = False) -> dict[str, np.ndarray]:
    """Greedy episodes [tasks, episodes, T, ...] of one saved seed. The policy is the script's own evaluation policy
    (its q_values / gpi_q_values), with make_evaluate's key layout, so the returns equal its evaluation's. Returns
    reward [.., T], phi_env [.., T, C], phi [.., T-1, C] (learned cumulants, where the method has them), q [.., T]
    (the value the policy gave the chosen action a) and contribution [.., T, C] (psi_c(s, a, z*) w_c, z* the
    policy GPI chose: its sum over c is q). With response (learned cumulants, acting on w): also phi_counterfactual
    [.., T-1, C], phi(h'_{t+1}, h_t) with h'_{t+1} the core's step from the true h_t on the same view and action but
    the previous reward 0 (a reward reader's phi drops, a category detector's stays), and psi [.., T, C], the
    successor features psi(s, a_t, w) of the action taken."""
    script = agent.script
    setup = script.make_setup(agent.args)
    env = setup.env
    net = eqx.combine(agent.params, setup.static)
    policies = jnp.asarray(TRAIN_TASKS)
    learned = has_learned_phi(agent)
    response = response and learned and not use_gpi

    def episode(key, w):
        env_params = env.task_params(w)
        key_reset, key_run = jax.random.split(key)
        obs, env_state = env.reset(key_reset, env_params)
        carry0 = (env_state, obs, jnp.zeros((), jnp.int32), jnp.zeros(()), net.core.initial_state())

        def step(carry, key):
            env_state, obs, prev_action, prev_reward, rnn = carry
            rgb = env.rgb_from_symbolic(obs.image)
            action, q, _, contribution, new = greedy_step(script, net, env.rgb_from_symbolic, policies, use_gpi,
                                                          obs.image, obs.w, prev_action, prev_reward, rnn)
            extra = ()
            if response:  # h'_t: this step from the previous state without the previous reward; psi of the action
                blind = script.core_step(net.core, rgb, prev_action, jnp.zeros_like(prev_reward), rnn)
                extra = (blind[0], net.psi(new[0], obs.w)[action])
            obs, env_state, reward, _, _, info = env.step(key, env_state, action, env_params)
            return (env_state, obs, action, reward, new), (reward, info["phi"], new[0], q, contribution, *extra)

        _, (reward, phi_env, h, q, contribution, *extra) = jax.lax.scan(
            step, carry0, jax.random.split(key_run, env_params.max_steps_in_episode))
        out = {"reward": reward, "phi_env": phi_env, "q": q, "contribution": contribution}
        if learned:
            out["phi"] = jax.vmap(net.phi)(h[1:], h[:-1])
        if response:
            h_blind, psi = extra
            out["phi_counterfactual"] = jax.vmap(net.phi)(h_blind[1:], h[:-1])
            out["psi"] = psi
        return out

    keys = jax.random.split(key, (2, len(tasks), episodes))[int(use_gpi)]  # make_evaluate's keys of this setting
    run = jax.jit(jax.vmap(jax.vmap(episode, (0, None)), (0, 0)))
    return jax.tree.map(np.asarray, run(keys, jnp.asarray(tasks)))


def response_record(trace: dict, tasks: np.ndarray) -> dict:
    """A seed's cumulant response on the train tasks (a rollout with response=True), as sums for JSON: per task the
    response matrix as played and with the counterfactual (common.run.cumulant_response: sums [C, C], counts [C]),
    the successor-feature matrix (sums [C] of psi(s, a_t, e_k) over the task's states, and their count), and the
    mean return acting on w (GPI's cost on the train tasks is this minus the return with GPI)."""
    valid = np.ones(trace["phi"].shape[1:3], bool)  # (episodes, T-1): the first T-1 transitions of every episode
    record = {"tasks": [format_task(w) for w in tasks], "sums": [], "sums_counterfactual": [], "counts": [],
              "psi_sums": [], "psi_count": [], "returns_acting_on_w": trace["reward"].sum(-1).mean(-1).tolist()}
    for t in range(len(tasks)):
        env = trace["phi_env"][t, :, :-1]
        sums, counts = cumulant_response(jnp.asarray(trace["phi"][t]), jnp.asarray(env), jnp.asarray(valid))
        blind, _ = cumulant_response(jnp.asarray(trace["phi_counterfactual"][t]), jnp.asarray(env),
                                     jnp.asarray(valid))
        record["sums"].append(np.asarray(sums, np.float64).tolist())
        record["sums_counterfactual"].append(np.asarray(blind, np.float64).tolist())
        record["counts"].append(np.asarray(counts).astype(int).tolist())
        psi = trace["psi"][t].astype(np.float64)
        record["psi_sums"].append(psi.reshape(-1, psi.shape[-1]).sum(0).tolist())
        record["psi_count"].append(int(np.prod(psi.shape[:-1])))
    return record


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
    that intervals over seeds can be drawn: tools.claims)."""
    with path.open("w", newline="") as f:
        writer = csv.DictWriter(f, PER_SEED_FIELDS)
        writer.writeheader()
        for name, records in runs.items():
            writer.writerows(row for r in records for row in record_rows(name, r))


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


def pooled_seed_response(records: list[dict], counterfactual: bool = False) -> tuple[dict, dict]:
    """RESPONSE over a method's seeds: ({name: mean over all seeds' pickups}, {name: pickups behind it})."""
    r0 = records[0]["response"]
    key = "sums_counterfactual" if counterfactual else "sums"
    sums = sum(np.asarray(r["response"][key]) for r in records)
    counts = sum(np.asarray(r["response"]["counts"]) for r in records)
    summed = response_sums(sums, counts, parse_tasks(";".join(r0["tasks"])))
    return response_means(summed), {name: int(v[2]) for name, v in summed.items()}


def spread(values: list[float]) -> str:
    """A seeds' values as their mean and 95% t-interval (one seed: its value)."""
    values = [v for v in values if not np.isnan(v)]
    if not values:
        return "-"
    if len(values) == 1:
        return f"{values[0]:.3f}"
    from scipy import stats

    mean, se = float(np.mean(values)), float(np.std(values, ddof=1) / np.sqrt(len(values)))
    half = float(stats.t.ppf(0.975, len(values) - 1)) * se
    return f"{mean:.3f} [{mean - half:.3f}, {mean + half:.3f}]"


def response_table(runs: dict[str, list[dict]]) -> list[str]:
    """Per method, the response as played and with the previous reward 0 (the counterfactual): each number the
    mean over the seeds' own means and its 95% t-interval over seeds, then the pooled pickups behind it."""
    lines = ["| method | previous reward | " + " | ".join(RESPONSE_TITLES[n] for n in RESPONSE)
             + " | rewarded / unrewarded pickups |", "|---|---|" + "---:|" * (len(RESPONSE) + 1)]
    for name, records in runs.items():
        if "response" not in records[0]:
            continue
        for counterfactual in (False, True):
            per_seed = [record_response(r, counterfactual) for r in records]
            _, pickups = pooled_seed_response(records, counterfactual)
            lines.append(f"| {name} | {'0 (counterfactual)' if counterfactual else 'as played'} | "
                         + " | ".join(spread([s[n] for s in per_seed]) for n in RESPONSE)
                         + f" | {pickups['own_rewarded']:,} / {pickups['own_unrewarded']:,} |")
    if len(lines) == 2:
        return ["(no run with learned cumulants: only MSFA and USFA --learned-cumulants learn phi)"]
    return lines


RESPONSE_TITLES = {"own_rewarded": "own, rewarded", "own_unrewarded": "own, unrewarded",
                   "crosstalk": "crosstalk c", "cross_unrewarded": "cross, unrewarded"}


def gpi_cost(record: dict) -> float:
    """GPI's cost on the train tasks of one seed: mean return acting on w minus with GPI (NaN where the record was
    played without GPI)."""
    if not record["gpi"] or "response" not in record:
        return float("nan")
    train = [t for t, task in enumerate(record["tasks"]) if task not in TEST_NAMES]
    return float(np.mean(record["response"]["returns_acting_on_w"]) - np.mean([record["returns"][t] for t in train]))


def gpi_cost_table(runs: dict[str, list[dict]]) -> list[str]:
    lines = ["| method | train return, acting on w | train return, GPI | GPI's cost (difference) |",
             "|---|---:|---:|---:|"]
    for name, records in runs.items():
        costs = [gpi_cost(r) for r in records]
        if all(np.isnan(costs)):
            continue
        train = [t for t, task in enumerate(records[0]["tasks"]) if task not in TEST_NAMES]
        on_w = [float(np.mean(r["response"]["returns_acting_on_w"])) for r in records]
        with_gpi = [float(np.mean([r["returns"][t] for t in train])) for r in records]
        lines.append(f"| {name} | {spread(on_w)} | {spread(with_gpi)} | {spread(costs)} |")
    if len(lines) == 2:
        return ["(none: GPI's cost needs a run with learned cumulants analysed with --gpi on)"]
    return lines


def response_matrix(records: list[dict], counterfactual: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """A method's full response over its seeds: mean phi^i [K, C, C] at pickups of category j in task e_k (NaN where
    there were none), and the pickups [K, C]."""
    key = "sums_counterfactual" if counterfactual else "sums"
    sums = sum(np.asarray(r["response"][key], np.float64) for r in records)
    counts = sum(np.asarray(r["response"]["counts"], np.float64) for r in records)
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(counts[..., None] > 0, sums / counts[..., None], np.nan), counts


def sf_matrix(records: list[dict]) -> np.ndarray:
    """Mean psi^j(s, a_t, e_k) [K, C] over the states of task e_k's episodes acting on w, all seeds: what GPI
    reads of policy k (row k) for each cumulant j."""
    sums = sum(np.asarray(r["response"]["psi_sums"], np.float64) for r in records)
    count = sum(np.asarray(r["response"]["psi_count"], np.float64) for r in records)
    return sums / count[:, None]


def matrix_tables(runs: dict[str, list[dict]]) -> list[str]:
    lines = []
    for name, records in runs.items():
        if "response" not in records[0]:
            continue
        tasks = records[0]["response"]["tasks"]
        played, counts = response_matrix(records)
        blind, _ = response_matrix(records, counterfactual=True)
        c = played.shape[-1]
        phis = " | ".join(f"phi^{i + 1}" for i in range(c))
        lines += [f"**{name}**: mean phi^i at pickups of category j in task e_k (as played | previous reward 0)", "",
                  f"| task | picked | pickups | {phis} | {phis} (reward 0) |", "|---|---|---:|" + "---:|" * (2 * c)]
        for k, task in enumerate(tasks):
            for j in range(c):
                cells = " | ".join("-" if np.isnan(x) else f"{x:.3f}" for x in (*played[k, j], *blind[k, j]))
                mark = " (rewarded)" if j == np.argmax(parse_tasks(task)[0]) else ""
                lines.append(f"| {task} | {j + 1}{mark} | {int(counts[k, j])} | {cells} |")
        sf = sf_matrix(records)
        lines += ["", f"**{name}**: successor features GPI reads, mean psi^j(s, a_t, e_k) over task e_k's states", "",
                  "| policy e_k | " + " | ".join(f"psi^{j + 1}" for j in range(c)) + " |", "|---|" + "---:|" * c]
        lines += [f"| {task} | " + " | ".join(f"{x:.3f}" for x in sf[k]) + " |" for k, task in enumerate(tasks)]
        lines.append("")
    return lines or ["(no run with learned cumulants)"]


def plot_response(runs: dict[str, list[dict]], path: Path) -> bool:
    """cumulant_response.png: per method, the response matrix as played and with the previous reward 0 (rows: task
    e_k and the category picked; columns phi^i), and the successor-feature matrix. Whether there was one to draw."""
    shown = {name: records for name, records in runs.items() if "response" in records[0]}
    if not shown:
        return False
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(len(shown), 3, figsize=(11, 4.2 * len(shown)), squeeze=False,
                             gridspec_kw={"width_ratios": [1, 1, 1.05]})
    for row, (name, records) in zip(axes, shown.items()):
        tasks = records[0]["response"]["tasks"]
        counts = response_matrix(records)[1]
        c = counts.shape[-1]
        labels = [f"e{k + 1}, picked {j + 1}{' *' if j == k else ''}" for k in range(len(tasks)) for j in range(c)]
        for ax, counterfactual in zip(row[:2], (False, True)):
            matrix = response_matrix(records, counterfactual)[0].reshape(-1, c)
            ax.imshow(matrix, cmap="RdBu_r", vmin=-1.2, vmax=1.2, aspect="auto")
            for (i, j), x in np.ndenumerate(matrix):
                ax.text(j, i, "-" if np.isnan(x) else f"{x:.2f}", ha="center", va="center", fontsize=6.5)
            ax.set_xticks(range(c), [f"phi^{i + 1}" for i in range(c)], fontsize=8)
            ax.set_yticks(range(len(labels)), labels, fontsize=6.5)
            ax.set_title(f"{name}\n{'previous reward set to 0' if counterfactual else 'as played'}", fontsize=8)
        sf = sf_matrix(records)
        image = row[2].imshow(sf, cmap="viridis", aspect="auto")
        for (i, j), x in np.ndenumerate(sf):
            row[2].text(j, i, f"{x:.2f}", ha="center", va="center", fontsize=7, color="white")
        row[2].set_xticks(range(c), [f"psi^{j + 1}" for j in range(c)], fontsize=8)
        row[2].set_yticks(range(len(tasks)), [f"policy e{k + 1}" for k in range(len(tasks))], fontsize=8)
        row[2].set_title(f"{name}\nmean psi(s, a_t, e_k) on task e_k", fontsize=8)
        fig.colorbar(image, ax=row[2], fraction=0.05)
    fig.suptitle("The learned cumulants' response on the train tasks (acting on w; * rewarded pickups): a category "
                 "detector is ~1 on its own category only,\na reward detector ~1 at every rewarded pickup and ~0 at "
                 "unrewarded ones; with the previous reward 0 a reward detector drops", fontsize=9)
    fig.tight_layout()
    save_figure(fig, path, dpi=100, bbox_inches="tight")
    plt.close(fig)
    return True


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
    save_figure(fig, path, dpi=120, bbox_inches="tight")
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
    save_figure(fig, path, dpi=120, bbox_inches="tight")
    plt.close(fig)


@exit_on_config_error
def main(args: Args) -> None:
    require(args.run_dirs or args.records, "name at least one run directory (or --records: earlier analyses)")
    for d in args.run_dirs:
        env = RunReader(d).env
        require(env == "babyai", f"{d} is a {env} run; tools.analyze handles BabyAI runs only so far")
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
            record = seed_record(agent, trace, tasks, use_gpi, activity) | {"name": name}
            if has_learned_phi(agent):  # the response, on the train tasks acting on w (make_evaluate's gpi-0 keys)
                played = rollout(agent, TRAIN_TASKS, args.episodes, False,
                                 jax.random.fold_in(jax.random.PRNGKey(args.seed), agent.seed), response=True)
                record["response"] = response_record(played, TRAIN_TASKS)
            records.append(record)
    report(group_records(records), Path(args.out))


def read_records(folder: Path) -> list[dict]:
    """The seed records of an earlier analysis (its records.json), named by their method."""
    path = folder / "records.json"
    require(path.exists(), f"--records: {path} does not exist; pass folders that tools.analyze wrote")
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
             "## The cumulant response (train tasks, acting on w)", "",
             "phi^i at pickups, on greedy episodes of the one-hot train tasks e_k acting on w (common.run.RESPONSE): "
             "own, rewarded: phi^i at pickups of category i in task e_i; own, unrewarded: phi^i at pickups of i in "
             "tasks e_k, k != i; crosstalk c: phi^i at (rewarded) pickups of category k in task e_k, k != i; cross, "
             "unrewarded: phi^i at pickups of k in tasks e_m, m != k, i. A category detector gives 1, 1, 0, 0; a "
             "reward detector 1, 0, 1, 0. The counterfactual recomputes h_{t+1} from the true h_t, view and action "
             "with the previous-reward input 0: a reward reader's phi falls there, a category detector's does not. "
             "Each number: the mean of the seeds' means and its 95% t-interval over seeds.", "",
             *response_table(runs), "",
             "### GPI's cost on the train tasks", "",
             "Greedy return on the train tasks acting on w, with GPI over the train tasks, and their difference "
             "(per seed, then mean and 95% t-interval over seeds). With exact cumulants GPI costs nothing on a train "
             "task (its own policy is among those GPI maximises over).", "", *gpi_cost_table(runs), "",
             "### The response matrix and the successor features GPI reads (all seeds pooled)", "",
             *matrix_tables(runs), "",
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
    if plot_response(runs, out / "cumulant_response.png"):
        written.append("cumulant_response.png")
    if activity:
        task = next(r["activity"]["task"] for records in runs.values() for r in records if r["activity"])
        plot_activity(activity, parse_tasks(task)[0], out / "module_activity.png")
        written.append("module_activity.png")
    print(f"wrote {', '.join(str(out / f) for f in written)}")


if __name__ == "__main__":
    main(tyro.cli(Args))
