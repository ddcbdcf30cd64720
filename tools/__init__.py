"""The tools that run, read and report the training scripts' runs (`python -m tools.<name> --help` for each). They
hold no algorithm: every agent is rebuilt and played with the script that trained it (docs/contract.md), so a copy of
a script works with all of them. The committed runs they read and write live apart, in results/ (data only).

Running
- protocol: the paper's protocol for an env (every method, its seeds, resumable; here, on several GPUs, or as SLURM
  jobs), its status, and the analysis of each method as it completes.
- export: a protocol folder's results, small enough to commit and enough to continue the protocol from.

Reading saved agents (params_seed<N>.eqx / .eqz)
- evaluate: greedy returns on any task vectors, with and without GPI, as eval.csv rows.
- analyze: the paper's analyses of BabyAI agents (Table A, the cumulant response, pickups, module activity).
- video: one greedy episode as an animated GIF.
- compact_agents: parameter files in a compact form that loads byte for byte.

Reading runs' tables (eval.csv, metrics.csv)
- plot: learning curves, per-task returns and the cumulant response over training (PNG).
- summarize: a run's final evaluation beside its env's reference returns (markdown).
- compare_runs: several runs side by side, method x task (markdown).
- claims: the paper's BabyAI claims on a protocol's runs, with intervals over seeds (markdown).
- select_settings: how a candidate miniature setting did on the train tasks (the criterion settings are chosen by).

Reference data
- reference_returns: the BFS oracle's, scripted and random play's returns per env setting (results/references.json).
- script_contract: what a training script exposes to these tools.

Shared by the tools
- run_reader: one reader of a run directory (config.json, eval.csv, metrics.csv, parameter files, analysis/), which
  every tool reads runs through.
- tables: the cells of the markdown tables (a mean ± s.e. over seeds).
"""
