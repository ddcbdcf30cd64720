"""A protocol folder's results, small enough to commit and complete enough to continue the protocol from.

    python -m tools.export OUT_DIR DEST                     # the results and what --resume needs to go on
    python -m tools.export OUT_DIR DEST --agents msfa usfa  # and these complete methods' agents, compacted
    python -m tools.export OUT_DIR DEST --agents msfa --agent-seed 1 --metrics-every 4   # seed 1's agent; 4x fewer
                                                                                         # metrics rows
    python -m tools.export OUT_DIR DEST --agents msfa=3 usfa --agent-seed 1   # msfa's seed 3, usfa's seed 1

A protocol folder (tools.protocol) holds, beside its results, what only a running protocol needs: each run's
checkpoint (its replay, from tens of MB at the miniature's settings to GBs at the paper's), TensorBoard files, the
logs and the cache of compiled programs. DEST gets the rest:

- protocol.json (the settings `--resume` keeps), summary.json, claims.md (tools.claims) and figures/;
- each complete method: config.json, metrics.csv.xz, eval.csv.xz and analysis/ (tools.analyze, which the
  protocol runs as soon as a method completes); its parameter files in tools.compact_agents's form (.eqz) if --agents
  names it, or while its analysis has not run;
- each complete seed of a method that was trained seed by seed and is not complete yet: the seed's config.json,
  metrics.csv.xz, eval.csv.xz and its analysis' records.json (the protocol plays each seed as it completes; the
  method is reported from its seeds' records), or its agent (.eqz) if it was not played yet; and the agent of the
  seed --agents names for it (`--agents METHOD=K`), so that a method's agent is kept from its first complete seeds
  on (the protocol's merge takes the .eqz in when the method completes).

The tables go packed with lzma, their decimal numbers to 6 significant digits (a float32's precision; a seed's
metrics.csv at the miniature's settings: 334 kB as written, 72 kB packed), and with --metrics-every K a seed's K
consecutive metrics.csv rows made one (common.run.compact_metrics: as if the run had logged K times less often;
training returns pooled over whole blocks unchanged; 21 kB with K = 4): every tool, and --resume, reads a run's
metrics.csv.xz and eval.csv.xz where it has no plain metrics.csv and eval.csv (common.run.open_table); so do
pandas.read_csv and `xzcat`.

Runs that are not complete are left out (all they have to continue from is their checkpoint): in a copy of DEST they
start over. So a protocol stopped part way on one machine continues on another, or later on one that kept
nothing, from its exported results: `cp -r DEST OUT && python -m tools.protocol OUT --resume` trains what is
missing, then plays, merges, reports and summarises as it would have without the stop.

DEST is new, or an earlier export of the same protocol (its protocol.json), which is brought up to date: the files
an export writes are rewritten, the carried seeds of methods that have since completed are removed, and the agents
of methods not named in --agents are removed. Other files there (a README, say) are left alone. The export stops
before writing anything where DEST's claims.md, summary.json or a figure differs from OUT_DIR's and is the newer: made
again in DEST after DEST was copied to OUT_DIR, it would otherwise be replaced by the older copy."""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass
from pathlib import Path

import tyro

from common.run import exit_on_config_error, pack_table, pooled_windows, portable_config, require
from tools.compact_agents import compress, portable_header
from tools.protocol import ANALYSES, analyzed, complete, saved_agents
from tools.protocol.settings import method_steps
from tools.run_reader import RunReader

TOP_FILES = ("protocol.json", "summary.json", "claims.md")
TOP_FOLDERS = ("figures",)
TABLES = ("metrics.csv", "eval.csv")  # packed (common.run.pack_table): metrics.csv.xz, eval.csv.xz
UNFINISHED = ("(not complete: the protocol's --resume continues it from its checkpoint; resumed from a copy made "
              "by this export, which holds no checkpoints, it would train from the start)")


@dataclass
class Args:
    out_dir: tyro.conf.Positional[str]
    """the protocol's folder (tools.protocol OUT_DIR)"""
    dest: tyro.conf.Positional[str]
    """where the results go: a new folder, or an earlier export of this protocol"""
    agents: tuple[str, ...] = ()
    """methods whose agents (every seed's parameters, compacted) go too, each METHOD (complete) or METHOD=K (its seed
    K's agent alone; a method trained seed by seed may be in progress, seed K complete); the analysis needs none"""
    agent_seed: int | None = None
    """with --agents: that seed's agent alone for the methods named without =K (e.g. 1: one agent per method, enough
    to play its results again)"""
    metrics_every: int = 1
    """metrics.csv's rows made one every this many per seed (common.run.compact_metrics: pooled returns over whole
    blocks unchanged), as if the runs had logged that much less often: 1 keeps every row. Counted in the runs'
    logging windows, so a run resumed from an earlier export (its rows pooled already) is not pooled twice"""


def copy_agents(run: Path, dest: Path, seed: int | None = None) -> list[Path]:
    """The run's parameter files (of `seed` alone, if given) into dest as .eqz (a .eqx is compacted; an .eqz is
    copied as it is); the other parameter files dest held are removed. Returns the files written."""
    written = []
    for params in saved_agents(run):
        if seed is not None and params.stem != f"params_seed{seed}":
            continue
        data = params.read_bytes()
        target = dest / f"{params.stem}.eqz"
        target.write_bytes(portable_header(data if params.suffix == ".eqz" else compress(data)))
        written.append(target)
    for stale in set(saved_agents(dest)) - set(written):
        stale.unlink()
    return written


def copy_run(run: Path, dest: Path, with_agents: bool, analysis: str = "all", agent_seed: int | None = None,
             metrics_every: int = 1) -> list[Path]:
    """A complete run's results into dest: its tables (metrics.csv compacted by metrics_every), its analysis ("all"
    of it, its "records" alone, or "none") and, if asked, its agents (agent_seed's alone, if given)."""
    dest.mkdir(parents=True, exist_ok=True)
    written = []
    reader = RunReader(run)
    config = portable_config(reader.config)  # (older runs named their folders)
    (dest / "config.json").write_text(json.dumps(config, indent=2))
    written.append(dest / "config.json")
    # a run resumed from an earlier export holds its pooled rows (a merge of seeds: some seeds' rows): count
    # metrics_every in each seed's logging windows
    pooled = {seed: pooled_windows(rows, int(reader.args.get("log_every", 0)),
                                   int(config.get("sgd_steps_per_iteration", 0)))
              for seed, rows in reader.metrics_of_seeds().items()} if metrics_every > 1 else {}
    for k in sorted(set(pooled.values()) - {1}):
        seeds = ", ".join(str(seed) for seed, windows in pooled.items() if windows == k)
        then = f"made one every {metrics_every // k} rows" if metrics_every > k else "as they are"
        print(f"[export] {run}/metrics.csv pools {k} logging windows a row already (an earlier export's) for seed(s) "
              f"{seeds}: {then}")
    written.extend(pack_table(run / name, dest / name, metrics_every, {str(s): k for s, k in pooled.items()})
                   for name in TABLES)
    if analysis == "all" and (run / "analysis").is_dir():
        shutil.copytree(run / "analysis", dest / "analysis", dirs_exist_ok=True)
        written.extend(p for p in (dest / "analysis").rglob("*") if p.is_file())
    elif analysis == "records" and analyzed(run):
        (dest / "analysis").mkdir(exist_ok=True)
        shutil.copyfile(run / "analysis" / "records.json", dest / "analysis" / "records.json")
        written.append(dest / "analysis" / "records.json")
    for earlier in sorted(run.glob("analysis_at_*/")) if analysis != "none" else []:  # (a run --method-steps
        files = sorted(p for p in earlier.rglob("*") if p.is_file())           # extended: its earlier end's)
        for file in files if analysis == "all" else [f for f in files if f.name == "records.json"]:
            (dest / file.relative_to(run)).parent.mkdir(parents=True, exist_ok=True)
            written.append(Path(shutil.copyfile(file, dest / file.relative_to(run))))
    if with_agents:
        written.extend(copy_agents(run, dest, agent_seed))
    else:
        for stale in saved_agents(dest):
            stale.unlink()
    return written


def newer_and_different(target: Path, source: Path) -> bool:
    """target exists, was written after source and differs from it: a claims.md or figure made again in DEST (from
    the export itself, as results/*/README.md do) after DEST was copied into the protocol's folder to resume it."""
    return (target.is_file() and target.stat().st_mtime > source.stat().st_mtime
            and target.read_bytes() != source.read_bytes())


def export(out: Path, dest: Path, agents: tuple[str, ...] = (), agent_seed: int | None = None,
           metrics_every: int = 1) -> dict[str, list[Path]]:
    """Copies the protocol in `out` into `dest` as the module docstring says. Returns, per method, the files written
    ("" for the protocol's own); prints what was left out."""
    require((out / "protocol.json").exists(), f"{out} holds no protocol (no protocol.json); pass the folder given to "
                                              "the protocol (tools/protocol/)")
    settings = json.loads((out / "protocol.json").read_text())
    agent_seeds = agents_to_keep(agents, agent_seed)
    require(not set(agent_seeds) - set(settings["methods"]),
            f"--agents: {sorted(set(agent_seeds) - set(settings['methods']))} are not methods of this protocol "
            f"({settings['methods']})")
    if dest.exists() and any(dest.iterdir()):
        require((dest / "protocol.json").exists(), f"{dest} is not empty and holds no exported protocol; pass a new "
                                                   "folder or an earlier export of this protocol")
        require(json.loads((dest / "protocol.json").read_text()) == settings,
                f"{dest} holds the export of another protocol (its protocol.json differs); pass a new folder")
    for source in [out / name for name in TOP_FILES] + [f for name in TOP_FOLDERS for f in (out / name).rglob("*")]:
        target = dest / source.relative_to(out)
        require(not (source.is_file() and newer_and_different(target, source)),
                f"{target} differs from {source} and was written after it: the export would put the older one back; "
                f"make {target.name} again in {out} (or remove it there) and export again")
    agents_from = {method: agents_run(out / method, method, seed, settings.get("seeds_apart", False),
                                      steps_of_method(settings, method))
                   for method, seed in agent_seeds.items()}
    dest.mkdir(parents=True, exist_ok=True)
    written: dict[str, list[Path]] = {"": []}
    for name in TOP_FILES:
        if (out / name).exists():
            shutil.copyfile(out / name, dest / name)
            written[""].append(dest / name)
    for name in TOP_FOLDERS:
        if (out / name).is_dir():
            shutil.copytree(out / name, dest / name, dirs_exist_ok=True)
            written[""].extend(p for p in (dest / name).rglob("*") if p.is_file())
    analysed_here = settings["env"] in ANALYSES
    for method in settings["methods"]:
        run, target = out / method, dest / method
        steps = steps_of_method(settings, method)
        wanted, kept_from = agent_seeds.get(method), agents_from.get(method)
        written[method] = []
        finished = complete(run, steps) and (analyzed(run) or not analysed_here)
        if complete(run, steps):  # its agents go too while its analysis has not run (and may need them)
            seed = wanted if finished and method in agent_seeds else None  # (an unplayed one: every seed's)
            written[method] = copy_run(run, target, method in agent_seeds or not finished, agent_seed=seed,
                                       metrics_every=metrics_every)
        if finished:
            for carried in sorted(target.glob("seed*/")):
                shutil.rmtree(carried)
            continue
        seed_runs = sorted(run.glob("seed*/")) if settings.get("seeds_apart") else []
        for seed_run in seed_runs:
            if complete(seed_run, steps):  # its records if played, else its agent (to be played); the one kept
                played = analyzed(seed_run) or not analysed_here
                written[method].extend(copy_run(seed_run, target / seed_run.name,
                                                with_agents=not played or seed_run == kept_from,
                                                analysis="records", metrics_every=metrics_every))
            else:
                print(f"[export] left out {seed_run} {UNFINISHED}")
        if not seed_runs and run.exists() and not complete(run, steps):
            print(f"[export] left out {run} {UNFINISHED}")
    return written


def agents_run(run: Path, method: str, seed: int | None, seeds_apart: bool, steps: int | None = None) -> Path:
    """The run whose agent --agents keeps for a method: the method's own where it is complete (at steps, its
    protocol's --method-steps, if given), else (trained seed by seed) its seed's; one line where that run is not
    complete or holds no parameter file of the seed."""
    kept_from = run if complete(run, steps) else run / f"seed{seed}"
    require(complete(run, steps) or (seed and seeds_apart),
            f"--agents: {method} is not complete; its seeds go with their records (or their agents, not played yet) "
            f"until it is, and one complete seed's agent with --agents {method}=K")
    require(complete(kept_from, steps), f"--agents: {kept_from} is not complete; name a complete seed")
    require(any(seed is None or p.stem == f"params_seed{seed}" for p in saved_agents(kept_from)),
            f"--agents: {kept_from} holds no parameter file" + (f" of seed {seed}; name a seed that has one "
                                                                f"(--agents {method}=K)" if seed else ""))
    return kept_from


def steps_of_method(settings: dict, method: str) -> int | None:
    """A method's env steps per seed by its protocol's --method-steps (protocol.json), or None: its runs' own end."""
    return method_steps(tuple(settings.get("method_steps", ()))).get(method)


def agents_to_keep(agents: tuple[str, ...], agent_seed: int | None) -> dict[str, int | None]:
    """--agents as {method: the seed whose agent goes, or None for every seed's}: METHOD=K names K, a bare METHOD
    takes --agent-seed."""
    kept = {}
    for entry in agents:
        method, _, seed = entry.partition("=")
        require(not seed or (seed.isdigit() and int(seed) >= 1), f"--agents {entry}: K in METHOD=K is a seed number "
                                                                 "(1, 2, ...)")
        require(method not in kept, f"--agents names {method} twice; name it once")
        kept[method] = int(seed) if seed else agent_seed
    return kept


@exit_on_config_error
def main(args: Args) -> None:
    require(args.metrics_every >= 1, f"--metrics-every must be at least 1, got {args.metrics_every}")
    require(args.agent_seed is None or args.agents, "--agent-seed picks the seed of --agents: name the methods too")
    written = export(Path(args.out_dir), Path(args.dest), args.agents, args.agent_seed, args.metrics_every)
    total = sum(p.stat().st_size for files in written.values() for p in files)
    for method, files in written.items():
        if method and files:
            seeds = sorted({p.parent.name for p in files if p.parent.name.startswith("seed")},
                           key=lambda name: int(name.removeprefix("seed")))
            what = f"complete seeds {', '.join(seeds)}" if seeds else "complete"
            print(f"[export] {method}: {what} ({sum(p.stat().st_size for p in files) / 1e6:.2f} MB)")
    nothing = [method for method, files in written.items() if method and not files]
    if nothing:
        print(f"[export] nothing complete yet: {', '.join(nothing)}")
    print(f"[export] {args.dest}: {sum(map(len, written.values()))} files, {total / 1e6:.2f} MB")


if __name__ == "__main__":
    main(tyro.cli(Args))
