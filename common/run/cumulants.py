"""What a run measures of its learned cumulants phi (nothing here reaches a loss): how closely each phi^k tracks the
env's pickups of category k over replayed transitions (metrics.csv), and the cumulant response on greedy episodes of
the train tasks (eval.csv, tools.analyze): what every phi^i does where a category is picked up, rewarded or not.

Why the response matters (docs/cumulants.md): phi(h_{t+1}, h_t) reads the recurrent state, which has received the
previous reward. With one-hot train tasks, "category k picked up in task e_k" and "reward 1" are the same event, so a
phi^k that detects the reward fits its regression target as well as one that detects category k. The response tells
them apart from the episodes themselves: a category detector's phi^i is ~1 at every pickup of category i and ~0 at
other pickups; a reward detector's is ~1 at every rewarded pickup (of any category) and ~0 at unrewarded ones.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from common.run.errors import require

CUMULANT_SUMS = ("count", "phi", "phi_sq", "env", "env_sq", "phi_env", "pickups", "error_pickup", "error_other")
"""The sums over transitions [9, C] (this order) that a script with learned cumulants reports per SGD step as
"cumulant_stats" (its function `cumulant_stats`, which tools/analyze.py also calls on greedy episodes): per
category k, the count of transitions, sum phi^k, sum (phi^k)^2, sum phi_env^k, sum (phi_env^k)^2,
sum phi^k phi_env^k, the number of pickups of category k (phi_env^k != 0), and sum |phi^k - phi_env^k| over the
pickup and the other transitions. Sums, not means, so that SGD steps and chunks pool exactly."""


def cumulant_stats(phi, phi_env, valid):
    """The sums [9, C] of CUMULANT_SUMS over the valid transitions: how closely each learned phi^k
    tracks the env's pickups of category k (metrics.csv's phi_corr_k, phi_error_pickup_k, phi_error_other_k).
    phi, phi_env [..., C]; valid [...]. Only a measurement: nothing here reaches the loss."""
    phi = jax.lax.stop_gradient(phi).reshape(-1, phi.shape[-1])
    phi_env = phi_env.reshape(phi.shape)
    v = jnp.broadcast_to(valid.reshape(-1, 1), phi.shape).astype(phi.dtype)
    picked = (phi_env != 0) * v
    error = jnp.abs(phi - phi_env)
    return jnp.stack([v, phi * v, phi**2 * v, phi_env * v, phi_env**2 * v, phi * phi_env * v, picked,
                      error * picked, error * (v - picked)]).sum(1)


def cumulant_quality(sums) -> dict[str, np.ndarray]:
    """How well learned cumulants track the env's pickups, per category k, from CUMULANT_SUMS [9, C]: "corr" (the
    Pearson correlation of phi^k with phi_env^k), "error_pickup" and "error_other" (mean |phi^k - phi_env^k| on
    the transitions that picked up category k and on the rest). NaN where undefined (no pickups, or no variance).
    Not yet learned: corr near 0; learned the wrong thing: corr high but errors large (an offset or a scale)."""
    n, sx, sxx, sy, syy, sxy, picks, err_pick, err_other = np.asarray(sums, np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        cov = n * sxy - sx * sy
        var = (n * sxx - sx**2) * (n * syy - sy**2)
        corr = np.where(var > 0, cov / np.sqrt(np.maximum(var, 1e-300)), np.nan)
        return {"corr": corr, "error_pickup": np.where(picks > 0, err_pick / picks, np.nan),
                "error_other": np.where(n - picks > 0, err_other / (n - picks), np.nan)}


def cumulant_columns(num_categories: int) -> list[str]:
    """metrics.csv's cumulant-quality columns (category k = 1..C)."""
    return [f"phi_{name}_{k + 1}" for name in ("corr", "error_pickup", "error_other") for k in range(num_categories)]


# ---------------------------------------------------------------------------------------------- the response
RESPONSE = ("own_rewarded", "own_unrewarded", "crosstalk", "cross_unrewarded")
"""The response's four summary numbers, on greedy episodes of the one-hot train tasks e_k (acting on w):
- own_rewarded: phi^i at pickups of category i in task e_i (what the reward regression trains; ~1 either way);
- own_unrewarded: phi^i at pickups of category i in tasks e_k, k != i (a category detector: ~1; a reward reader: ~0);
- crosstalk (c): phi^i at pickups of category k in task e_k, k != i, rewarded (a category detector: ~0; a reward
  reader: ~1); GPI values policy k on a task w at about (w_k + c sum_{j != k} w_j) V_k (docs/cumulants.md);
- cross_unrewarded: phi^i at pickups of category k in tasks e_m, m != k, i != k, m (~0 either way).
Each is a direct mean over (pickup, i) pairs, not a fit."""
RESPONSE_FIELDS = [f"phi_{name}" for name in RESPONSE] + ["pickups_rewarded", "pickups_unrewarded"]
"""eval.csv's columns of the response, on the train tasks' rows acting on w (gpi 0) of methods that learn phi
(empty elsewhere): the four means of RESPONSE over that task's episodes, and the pickups behind them (own_rewarded
and crosstalk: the rewarded pickups; own_unrewarded and cross_unrewarded: the unrewarded ones), so that rows pool
exactly: weight each row's mean by its pickups."""


def cumulant_response(phi, phi_env, valid):
    """The response matrix of some transitions: (sums [C, C], counts [C]), sums[j, i] = the sum of phi^i over the
    valid transitions that picked up category j (phi_env^j != 0), counts[j] = how many there were. phi, phi_env
    [..., C]; valid [...]. Sums, so that episodes, tasks and seeds pool exactly; jittable."""
    c = phi.shape[-1]
    picked = ((phi_env != 0) & valid[..., None]).reshape(-1, c).astype(jnp.float32)
    return picked.T @ jax.lax.stop_gradient(phi).reshape(-1, c).astype(jnp.float32), picked.sum(0)


def one_hot_index(w) -> int:
    """k of a train task e_k (one weight 1, the others 0); one line where w is not one."""
    w = np.asarray(w, np.float64)
    require(np.sum(w == 1.0) == 1 and np.sum(w == 0.0) == len(w) - 1,
            f"the cumulant response is defined on one-hot train tasks e_k; got {w.tolist()}")
    return int(np.argmax(w))


def response_sums(sums, counts, tasks) -> dict[str, tuple[float, float, float]]:
    """RESPONSE's sums from the response matrices of one-hot tasks: sums [K, C, C] and counts [K, C]
    (cumulant_response of each task's transitions), tasks [K, C]. name -> (sum of the phi^i values, how many values,
    how many pickups), so that evaluations and seeds pool exactly before the mean (sum / values)."""
    sums, counts = np.asarray(sums, np.float64), np.asarray(counts, np.float64)
    c = sums.shape[-1]
    out = {name: np.zeros(3) for name in RESPONSE}
    for t, w in enumerate(tasks):
        k = one_hot_index(w)
        others = [j for j in range(c) if j != k]
        rewarded, unrewarded = counts[t, k], counts[t, others].sum()
        out["own_rewarded"] += [sums[t, k, k], rewarded, rewarded]
        out["crosstalk"] += [sums[t, k, others].sum(), (c - 1) * rewarded, rewarded]
        out["own_unrewarded"] += [sum(sums[t, j, j] for j in others), unrewarded, unrewarded]
        out["cross_unrewarded"] += [sum(sums[t, j, i] for j in others for i in others if i != j),
                                    (c - 2) * unrewarded, unrewarded]
    return {name: tuple(float(x) for x in v) for name, v in out.items()}


def response_means(sums: dict[str, tuple[float, float, float]]) -> dict[str, float]:
    """RESPONSE's means from response_sums (NaN where there was nothing to average)."""
    return {name: (total / values if values else float("nan")) for name, (total, values, _) in sums.items()}


def response_columns(sums, counts, w) -> dict[str, object]:
    """eval.csv's RESPONSE_FIELDS of one train task's episodes ("" where undefined)."""
    summary = response_sums(np.asarray(sums)[None], np.asarray(counts)[None], np.asarray(w)[None])
    row = {f"phi_{name}": ("" if np.isnan(mean) else round(mean, 5))
           for name, mean in response_means(summary).items()}
    return row | {"pickups_rewarded": int(summary["own_rewarded"][2]),
                  "pickups_unrewarded": int(summary["own_unrewarded"][2])}


def pooled_response(rows) -> dict[str, float]:
    """RESPONSE's means over eval.csv rows (of one evaluation, or several seeds'): each row's mean weighted by the
    pickups behind it (own_rewarded, crosstalk: the rewarded; the others: the unrewarded). NaN where none."""
    out = {}
    for name in RESPONSE:
        weight = "pickups_rewarded" if name in ("own_rewarded", "crosstalk") else "pickups_unrewarded"
        pairs = [(float(r[f"phi_{name}"]), float(r[weight])) for r in rows
                 if r.get(f"phi_{name}", "") not in ("", None) and float(r.get(weight) or 0) > 0]
        total = sum(n for _, n in pairs)
        out[name] = sum(v * n for v, n in pairs) / total if total else float("nan")
    return out
