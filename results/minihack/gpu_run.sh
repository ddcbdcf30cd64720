#!/usr/bin/env bash
# The prepared command for MiniHack rooms on a lent GPU (README "Paper scale on a lent GPU"):
#   bash results/minihack/gpu_run.sh BUDGET_SECONDS OUT_DIR [more flags for results/gpu_run.py]
# It trains the paper's MiniHack setting (every script's defaults: the 5x5 room, 3M env steps, replay of tile-index
# crops, 10 seeds per method), one method at a time (an SGD step of 10 seeds needs 42 GiB) in the order the paper's
# claims need them (MSFA first; methods already committed under results/minihack/paper_protocol_*/ last), stops
# cleanly 3 minutes before the budget ends (the host envs' final evaluation), and leaves at most 8 files of at most
# 16 MiB in OUT_DIR (summary.json, results.tar.gz, params_<method>[_<k>].tar.gz).
# The GPU machine lacks NLE, MiniHack and the scripts' other packages: build their wheels here first with
# `bash results/minihack/gpu_wheels.sh` (into .whl-minihack/) and carry .whl-minihack.
exec bash "$(dirname "$0")/../gpu_run.sh" minihack "$@"
