#!/usr/bin/env bash
# What results/<env>/gpu_run.sh run (README "Paper scale on a lent GPU"):
#   bash results/gpu_run.sh babyai|fruitbot|minihack BUDGET_SECONDS OUT_DIR [more flags for results/gpu_run.py]
# It makes the env's scripts importable (results/gpu_setup.sh: the wheels of .whl/, .whl-fruitbot/ or
# .whl-minihack/, carried with the run, where the machine lacks them), then runs python -m results.gpu_run --env ENV
# with the other arguments.
set -euo pipefail
usage="usage: bash results/gpu_run.sh babyai|fruitbot|minihack BUDGET_SECONDS OUT_DIR [flags]"
[ $# -ge 3 ] || { echo "$usage" >&2; exit 2; }
env=$1
shift
cd "$(dirname "$0")/.."
case $env in babyai|fruitbot|minihack) ;; *) echo "$usage" >&2; exit 2 ;; esac
source results/gpu_setup.sh
gpu_setup "$env" || exit 2
# training processes (and the analysis after them) share the one GPU: allocate as needed, not 75% each at start
export XLA_PYTHON_CLIENT_PREALLOCATE=false
exec "$PYTHON" -m results.gpu_run --env "$env" "$@"
