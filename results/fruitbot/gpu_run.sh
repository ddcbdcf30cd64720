#!/usr/bin/env bash
# The prepared command for Procgen Fruitbot on a lent GPU (README "Paper scale on a lent GPU"):
#   bash results/fruitbot/gpu_run.sh BUDGET_SECONDS OUT_DIR [more flags for results/gpu_run.py]
# It trains the paper's Fruitbot setting (every script's defaults: 10M env steps, replay 70,000 sequences = 33 GiB
# per seed in GPU memory) with as many seeds as fit the GPU (1 on an H100 80 GB, 2 on an H200 141 GB), one method at
# a time in the order the paper's claims need them (MSFA first), stops cleanly before the budget ends, and leaves at
# most 8 files of at most 16 MiB in OUT_DIR (summary.json, results.tar.gz, params_<method>[_<k>].tar.gz).
# The GPU machine lacks procgen, gym3 and the packages BabyAI needs: build their wheels here first with
# `bash results/fruitbot/gpu_wheels.sh` (into .whl-fruitbot/) and carry .whl-fruitbot.
# Tests run it on the CPU at tiny settings (--extra "..."): the same commands, smaller numbers.
exec bash "$(dirname "$0")/../gpu_run.sh" fruitbot "$@"
