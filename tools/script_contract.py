"""What a training script exposes to the tools (docs/contract.md), in one place.

A run names the script that trained it, and the tools rebuild its agents with that script's own code, so that a
copy (`msfa_myidea.py`) with its own network or losses works with every tool as long as it keeps these names. Each
tool asks for the names it uses when it loads a script (`require_names`), and a copy lacking one stops with one line
naming it. A copy's runs are labelled by their `exp_name` (`run_label`)."""

from __future__ import annotations

from pathlib import Path

from common.run import REPOSITORY_SCRIPTS, require

SCRIPT_NAMES = {
    "Args": "the settings dataclass (tyro): exp_name labels the run; eval_episodes; env (usfa.py, uvfa.py)",
    "make_network": "make_network(args, key): the network, whose inexact arrays the parameter files hold",
    "make_setup": "make_setup(args): what a run builds once (.static, the network's non-array parts; BabyAI's .env)",
    "make_evaluate": "make_evaluate(setup, args, tasks, gpi_settings): a jitted evaluate(params, key) -> greedy "
                     "returns [settings, tasks, episodes] of one seed",
    "GPI_SETTINGS": "the eval.csv gpi values the script plays: (0, 1), or (0,) without GPI",
    "core_step": "core_step(core, observation, prev_action, prev_reward, state): one recurrent step",
    "q_values": "q_values(net, h, w): Q(s, a; w) from the core's state",
    "gpi_q_values": "gpi_q_values(net, h, w, policies): max over z of psi(s, a, z) . w (scripts with GPI)",
    "make_env": "make_env(args, ...): the host env (Fruitbot's procgen backend, MiniHack)",
}
"""every name a tool may use, and what it is"""

EVALUATE = ("Args", "make_network", "make_setup", "make_evaluate", "GPI_SETTINGS")
"""what tools.evaluate (and so every tool that loads agents) uses"""

PLAY = ("core_step", "q_values")
"""what tools.analyze and tools.video use to play a saved agent step by step (and gpi_q_values with GPI)"""



def require_names(script, names, tool: str, origin: str = "") -> None:
    """Stop with one line if the script lacks any of `names` (what `tool` uses)."""
    missing = [n for n in names if not hasattr(script, n)]
    where = getattr(script, "__file__", script.__name__)
    require(not missing, f"{origin + ': ' if origin else ''}{where} lacks {', '.join(missing)}, which {tool} uses "
                         f"(docs/contract.md: what a training script exposes to the tools)")


def has_psi(script) -> bool:
    """Whether the script's agents have successor features (and so GPI): its GPI_SETTINGS include 1."""
    return 1 in tuple(script.GPI_SETTINGS)


def play_names(script) -> tuple[str, ...]:
    """What playing an agent step by step uses of this script."""
    return PLAY + (("gpi_q_values",) if has_psi(script) else ())


def run_label(config: dict, fallback: str) -> str:
    """A run's name in tables and figures: its method (config.json's "method") for the repository's scripts, its
    exp_name for a copy (a copy of msfa_babyai.py is not MSFA), else `fallback` (e.g. the directory's name)."""
    script = Path(str(config.get("script", ""))).stem
    exp_name = config.get("args", {}).get("exp_name")
    if script and script not in REPOSITORY_SCRIPTS and exp_name:
        return exp_name
    return config.get("method") or exp_name or fallback
