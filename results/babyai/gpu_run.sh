#!/usr/bin/env bash
# The one prepared command to run first whenever a GPU is lent (README "Paper scale on a lent GPU"):
#   bash results/babyai/gpu_run.sh BUDGET_SECONDS OUT_DIR [more flags for results/gpu_run.py]
# It trains the paper's BabyAI protocol (every script's defaults, 10 seeds per method) for as many methods as the
# budget allows, in the order the paper's claims need them, stops cleanly before the budget ends, and leaves at most
# 8 files of at most 16 MiB in OUT_DIR (summary.json, results.tar.gz, params_<method>[_<k>].tar.gz).
# The GPU machine lacks flashbax, gymnax, tyro, minigrid and tensorboardX: build their wheels here first with
# `bash results/babyai/gpu_wheels.sh` (into .whl/) and carry .whl; results/gpu_run.sh installs them when missing.
# Tests run it on the CPU at tiny settings (--extra "..."): the same commands, smaller numbers.
exec bash "$(dirname "$0")/../gpu_run.sh" babyai "$@"
