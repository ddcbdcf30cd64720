"""Reference returns (the BFS oracle, scripted and random play), played once per env setting and stored as data.

    python -m tools.reference_returns babyai [--grid-size 10] [--objects-per-category 3] [--episode-steps 200]
                                        [--episodes 100] [--seed 0] [--overwrite]
    python -m tools.reference_returns fruitbot [--distribution-mode hard] [--episodes 20] [--seed 0] [--overwrite]

Playing the references takes minutes (BabyAI's BFS oracle in the paper's room: over a minute on 2 cores), and they
depend only on the env's setting, so the tools (tools.summarize) read them from results/references.json
instead of playing them for every table. Each command plays one setting's references with the env module's own
functions (common.envs.babyai.bfs_oracle_returns and random_policy_returns, common.envs.fruitbot.policy_returns),
each split's tasks in one batch as the env modules' tables play them, so the stored numbers are the ones those
tables print (docs/babyai.md, results/fruitbot/README.md).

The command adds its entry to the file, or refreshes it: an entry is named by its env, setting, episodes and seed,
and one with the same name is replaced only when the numbers agree, or with --overwrite (the docs quote the stored
numbers: numbers that changed mean that the env changed, and the docs need the new ones too).

The file: {env: [entry, ...]}, an entry
    {"setting": the env's parameters (BabyAI's room: grid_size, objects_per_category, episode_steps),
     "episodes": per task, "seed": the PRNG seed, "command": the command that wrote it, "date": the day it was played,
     "returns": {policy: {task: {"mean": ..., "se": ...}}}}
with the means and standard errors exactly as the functions return them (JSON keeps every float).

Fruitbot's entries are stock procgen's (the scripts' --env-backend procgen, on unrestricted levels as it evaluates):
the JAX game's references (`python -m common.envs.fruitbot_jax`, its evaluation levels) are not stored, and the tools
say so for its runs. MiniHack's random play is not stored at all: NetHack reads the local date and time (its phase of
the moon and night-time rules), so `python -m common.envs.minihack` prints other numbers on other days
(results/minihack/README.md's table is one day's, and the same seed gives other success rates with TZ a day back).
"""

from __future__ import annotations

import datetime
import json
import re
from pathlib import Path

import numpy as np

from common.envs import babyai
from common.run import ROOT, ConfigError, exit_on_config_error, format_task, require

REFERENCES = ROOT / "results" / "references.json"
"""the stored references, in the repository"""

POLICIES = {"babyai": ("BFS oracle", "random"), "fruitbot": ("scripted gap-seeker", "random")}
"""each env's reference policies, in the order the tables print them"""

DEFAULTS = {"babyai": {"episodes": 100, "seed": 0}, "fruitbot": {"episodes": 20, "seed": 0}}
"""the episodes and seed of the reference tables that docs/babyai.md and results/fruitbot/README.md quote"""


def room_setting(room) -> dict:
    """A BabyAI room's setting: what its references depend on (the observation mode does not change returns)."""
    return {"grid_size": room.grid_size, "objects_per_category": room.objects_per_category,
            "episode_steps": room.episode_steps}


def per_task(tasks, mean, se) -> dict:
    """{task: {"mean", "se"}} of one batch of tasks, as Python floats (exactly the values the functions return)."""
    return {format_task(w): {"mean": float(m), "se": float(s)} for w, m, s in zip(tasks, mean, se)}


def babyai_returns(setting: dict, episodes: int, seed: int) -> dict:
    """The BFS oracle's and random play's returns in a BabyAI room, the train and the test tasks each one batch."""
    room = babyai.GotoAvoid(obs_mode="symbolic", **setting)
    returns = {"BFS oracle": {}, "random": {}}
    for tasks in (babyai.TRAIN_TASKS, babyai.TEST_TASKS):
        returns["BFS oracle"].update(per_task(tasks, *babyai.bfs_oracle_returns(tasks, episodes, seed, room)))
        returns["random"].update(per_task(tasks, *babyai.random_policy_returns(tasks, episodes, seed, room)))
    return returns


def fruitbot_returns(setting: dict, episodes: int, seed: int) -> dict:
    """Scripted (gap-seeking) and random play's lifetime returns in stock procgen Fruitbot, on unrestricted levels
    (as evaluation), the train and the test tasks each one batch (`python -m common.envs.fruitbot`'s table)."""
    from common.envs import fruitbot

    returns = {"scripted gap-seeker": {}, "random": {}}
    for tasks in (fruitbot.TRAIN_TASKS, fruitbot.TEST_TASKS):
        for policy, name in (("scripted", "scripted gap-seeker"), ("random", "random")):
            mean, se, _ = fruitbot.policy_returns(policy, tasks, episodes, seed, setting["distribution_mode"],
                                                  setting["num_levels"])
            returns[name].update(per_task(tasks, mean, se))
    return returns


PLAY = {"babyai": babyai_returns, "fruitbot": fruitbot_returns}


def computable(env: str, setting: dict) -> bool:
    """Whether `python -m tools.reference_returns` can play this setting's references (every BabyAI room; Fruitbot's stock
    procgen on unrestricted levels, lifetimes of 4 levels: what its functions play)."""
    if env == "fruitbot":
        return (setting.get("backend"), setting.get("max_levels"), setting.get("num_levels")) == ("procgen", 4, 0)
    return env == "babyai"


def command(env: str, setting: dict, episodes: int, seed: int) -> str:
    """The command that plays and stores one entry (its flags spelled out, so that it names the setting)."""
    if env == "babyai":
        flags = (f"--grid-size {setting['grid_size']} --objects-per-category {setting['objects_per_category']} "
                 f"--episode-steps {setting['episode_steps']}")
    else:
        flags = f"--distribution-mode {setting['distribution_mode']}"
    return f"python -m {__spec__.name} {env} {flags} --episodes {episodes} --seed {seed}"


def default_command(env: str, setting: dict) -> str:
    """The command that stores a setting's references at its env's default episodes and seed."""
    return command(env, setting, **DEFAULTS[env])


def play(env: str, setting: dict, episodes: int, seed: int = 0) -> dict:
    """{policy: {task: {"mean", "se", ...}}} of a setting's references, played now."""
    require(env in PLAY, f"no references for env {env!r}; known: {', '.join(PLAY)}")
    require(computable(env, setting), f"{env}'s references cannot be played in the setting {setting}: "
                                      f"`python -m {__spec__.name} {env} --help` says which can")
    return PLAY[env](setting, episodes, seed)


def read(path: Path = REFERENCES) -> dict:
    """The stored references ({} where the file does not exist yet)."""
    path = Path(path)
    try:
        return json.loads(path.read_text()) if path.exists() else {}
    except json.JSONDecodeError as e:
        raise ConfigError(f"{path} is not valid JSON ({e}); restore it with `git checkout {path}`") from None


def stored(env: str, setting: dict, path: Path = REFERENCES) -> dict | None:
    """The stored entry of an env's setting (of several, the one over the most episodes, then the lowest seed), or
    None where none is stored."""
    entries = [e for e in read(path).get(env, []) if e["setting"] == setting]
    return max(entries, key=lambda e: (e["episodes"], -e["seed"]), default=None)


def entry_name(entry: dict) -> tuple:
    """What names an entry in the file (and orders the entries): its setting, episodes and seed."""
    return json.dumps(entry["setting"], sort_keys=True), entry["episodes"], entry["seed"]


def with_entry(references: dict, env: str, entry: dict, overwrite: bool) -> dict:
    """`references` with `entry` added, or replacing the entry of the same name when their numbers agree or
    `overwrite` (the docs quote the stored numbers: changed ones are never replaced silently)."""
    entries = references.get(env, [])
    for old in (e for e in entries if entry_name(e) == entry_name(entry)):
        require(old["returns"] == entry["returns"] or overwrite,
                f"the stored {env} references of {old['setting']} ({old['episodes']} episodes, seed {old['seed']}, "
                f"{old['date']}) differ from the ones played now: the env changed. Pass --overwrite to store the new "
                "ones (and update the tables that quote them)")
    kept = [e for e in entries if entry_name(e) != entry_name(entry)]
    return {**references, env: sorted(kept + [entry], key=entry_name)}


def dumps(references: dict) -> str:
    """The file's text: JSON indented by one space, with every innermost object (a setting, a task's mean and s.e.)
    on one line, so that an entry reads (and diffs) as a table."""
    text = json.dumps(references, indent=1)
    return re.sub(r"\{[^{}]*\}", lambda m: json.dumps(json.loads(m.group())), text) + "\n"


def store(env: str, setting: dict, episodes: int, seed: int, overwrite: bool, path: Path = REFERENCES) -> None:
    """Play one setting's references and add (or refresh) its entry in the file."""
    require(episodes >= 2, f"--episodes must be at least 2 to give a standard error, got {episodes}")
    entry = {"setting": setting, "episodes": episodes, "seed": seed, "command": command(env, setting, episodes, seed),
             "date": datetime.date.today().isoformat(), "returns": play(env, setting, episodes, seed)}
    references = with_entry(read(path), env, entry, overwrite)
    Path(path).write_text(dumps(references))
    print(f"{path}: stored {env}'s references of {setting} over {episodes} episodes (seed {seed})")
    for policy, returns in entry["returns"].items():
        print(f"{policy}: " + ", ".join(f"{t} {r['mean']:.2f} ± {r['se']:.2f}" for t, r in returns.items()))


def store_babyai(grid_size: int = babyai.ROOM_SIZE, objects_per_category: int = babyai.OBJECTS_PER_CATEGORY,
                 episode_steps: int = babyai.MAX_STEPS, episodes: int = DEFAULTS["babyai"]["episodes"],
                 seed: int = DEFAULTS["babyai"]["seed"], overwrite: bool = False, file: str = str(REFERENCES)) -> None:
    """BabyAI GotoAvoid: the BFS oracle and random play per task in one room (the paper's: grid 10, 3 objects per
    category, 200-step episodes; the miniature: --grid-size 6 --objects-per-category 1 --episode-steps 50).

    Args:
        grid_size: the room's side, walls included
        objects_per_category: objects of each of the 4 categories
        episode_steps: the episode length
        episodes: episodes per task
        seed: the PRNG seed of the episodes
        overwrite: replace a stored entry of the same room, episodes and seed whose numbers differ
        file: the references file
    """
    room = babyai.GotoAvoid(obs_mode="symbolic", grid_size=grid_size, objects_per_category=objects_per_category,
                            episode_steps=episode_steps)  # a room that cannot be played stops here with one line
    store("babyai", room_setting(room), episodes, seed, overwrite, Path(file))


def store_fruitbot(distribution_mode: str = "hard", episodes: int = DEFAULTS["fruitbot"]["episodes"],
                   seed: int = DEFAULTS["fruitbot"]["seed"], overwrite: bool = False,
                   file: str = str(REFERENCES)) -> None:
    """Fruitbot, stock procgen (the scripts' --env-backend procgen): scripted gap-seeking and random play's lifetime
    return per task on unrestricted levels (as that backend evaluates). Needs .venv-procgen.

    Args:
        distribution_mode: procgen's hard or easy mode
        episodes: lifetimes per task
        seed: the seed of the actions and levels
        overwrite: replace a stored entry of the same mode, episodes and seed whose numbers differ
        file: the references file
    """
    from common.envs.fruitbot import DISTRIBUTION_MODES

    require(distribution_mode in DISTRIBUTION_MODES,
            f"--distribution-mode must be one of {', '.join(DISTRIBUTION_MODES)}, got {distribution_mode!r}")
    setting = {"backend": "procgen", "distribution_mode": distribution_mode, "max_levels": 4, "num_levels": 0}
    store("fruitbot", setting, episodes, seed, overwrite, Path(file))


if __name__ == "__main__":
    import tyro

    exit_on_config_error(tyro.extras.subcommand_cli_from_dict)({"babyai": store_babyai, "fruitbot": store_fruitbot})
