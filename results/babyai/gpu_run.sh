#!/usr/bin/env bash
# The one prepared command to run first whenever a GPU is lent (README "Paper scale on a lent GPU"):
#   bash results/babyai/gpu_run.sh BUDGET_SECONDS OUT_DIR [more flags for results/gpu_run.py]
# It trains the paper's BabyAI protocol (every script's defaults, 10 seeds per method) for as many methods as the
# budget allows, in the order the paper's claims need them, stops cleanly before the budget ends, and leaves at most
# 8 files of at most 16 MiB in OUT_DIR (summary.json, results.tar.gz, params_<method>[_<k>].tar.gz).
# The GPU machine lacks flashbax, gymnax, tyro, minigrid and tensorboardX: build their wheels here first with
# `bash results/babyai/gpu_wheels.sh` (into .whl/) and carry .whl; this script installs them when they are missing.
# Tests run it on the CPU with a tiny budget and tiny settings (--extra "..."): the same commands, smaller numbers.
set -euo pipefail
[ $# -ge 2 ] || { echo "usage: bash results/babyai/gpu_run.sh BUDGET_SECONDS OUT_DIR [flags]" >&2; exit 2; }
cd "$(dirname "$0")/../.."
PYTHON=${PYTHON:-python3}
if ! "$PYTHON" -c "import flashbax, gymnax, tyro, minigrid, tensorboardX" 2>/dev/null; then
  [ -d .whl ] || { echo "missing packages and no .whl/ folder: run bash results/babyai/gpu_wheels.sh here first" >&2; exit 2; }
  "$PYTHON" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
  export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
fi
# several training processes share the one GPU: allocate as needed instead of 75% each at start
export XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONUNBUFFERED=1
exec "$PYTHON" -m results.gpu_run "$@"
