#!/usr/bin/env bash
# The one prepared command to run first whenever a GPU is lent (README "Paper scale on a lent GPU"):
#   bash benchmarks/sgd_variants.sh OUT_DIR [more flags for python -m benchmarks.sgd_variants]
# carrying .whl (bash results/gpu_wheels.sh babyai, here). Within 540 s it times the SGD step old and new and its
# variants in subprocesses and leaves at most 5 files in OUT_DIR (results.json, sgd_variants.log, compiled programs).
set -euo pipefail
[ $# -ge 1 ] || { echo "usage: bash benchmarks/sgd_variants.sh OUT_DIR [flags]" >&2; exit 2; }
out=$1
shift
cd "$(dirname "$0")/.."
source results/gpu_setup.sh
gpu_setup babyai || exit 2
exec "$PYTHON" -m benchmarks.sgd_variants --budget-seconds 540 --out "$out" "$@"
