#!/usr/bin/env bash
# What results/<env>/gpu_run.sh run (README "Paper scale on a lent GPU"):
#   bash results/gpu_run.sh babyai|fruitbot|minihack BUDGET_SECONDS OUT_DIR [more flags for results/gpu_run.py]
# Where the env's scripts cannot import their packages (the GPU machine), it installs the wheels that
# `bash results/gpu_wheels.sh ENV` put in .whl/ (BabyAI), .whl-fruitbot/ or .whl-minihack/, carried with the run; then
# it runs python -m results.gpu_run --env ENV with the other arguments.
set -euo pipefail
usage="usage: bash results/gpu_run.sh babyai|fruitbot|minihack BUDGET_SECONDS OUT_DIR [flags]"
[ $# -ge 3 ] || { echo "$usage" >&2; exit 2; }
env=$1
shift
cd "$(dirname "$0")/.."
case $env in  # what each env's scripts import that the GPU machine lacks (minigrid only where BabyAI is made)
  babyai) wheels=.whl modules="flashbax, gymnax, tyro, minigrid, tensorboardX" ;;
  fruitbot) wheels=.whl-fruitbot modules="flashbax, gymnax, tyro, tensorboardX, procgen" ;;
  minihack) wheels=.whl-minihack modules="flashbax, gymnax, tyro, tensorboardX, nle, minihack" ;;
  *) echo "$usage" >&2; exit 2 ;;
esac
PYTHON=${PYTHON:-python3}
if ! "$PYTHON" -c "import $modules" 2>/dev/null; then
  [ -d "$wheels" ] || { echo "missing packages and no $wheels/: run bash results/gpu_wheels.sh $env here first" >&2
                       exit 2; }
  "$PYTHON" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
    "$wheels"/*.whl
  export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
  "$PYTHON" -c "import $modules" || { echo "error: the imports above still fail with $wheels/ installed" >&2; exit 2; }
fi
# several training processes share the one GPU: allocate as needed instead of 75% each at start
export XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONUNBUFFERED=1
exec "$PYTHON" -m results.gpu_run --env "$env" "$@"
