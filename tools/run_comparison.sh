#!/usr/bin/env bash
# Trains MSFA, every baseline and every ablation at the setting of results/babyai/README.md (1M env steps, 2 seeds,
# replay ratio 1, target copy every 400 SGD steps), all at once, each run in its own process.
#   bash tools/run_comparison.sh [RUNS_DIR] [TIME_LIMIT_SECONDS]
# (PYTHON picks the interpreter; EXTRA adds flags to every run, e.g. EXTRA="--eval-every 100000")
# A run stopped by the time limit keeps the evaluations it reached (every 250k steps) in its eval.csv.
set -u
runs=${1:-runs/comparison}
limit=${2:-0}  # 0: no limit
common="--seed 1 --num-seeds 2 --total-timesteps 1000000 --samples-per-insert 1 --target-update-period 400
        --eval-every 250000 --log-every 5120 ${EXTRA:-}"
declare -A variants=(
  [msfa]="msfa_babyai.py"
  [msfa_entangled_psi]="msfa_babyai.py --entangled-psi"
  [msfa_entangled_phi]="msfa_babyai.py --entangled-phi"
  [msfa_entangled_both]="msfa_babyai.py --entangled-psi --entangled-phi"
  [usfa]="usfa.py"
  [usfa_learned]="usfa.py --learned-cumulants"
  [uvfa]="uvfa.py"
  [uvfa_farm]="uvfa.py --farm"
  [mvfa]="uvfa.py --modular"
)
mkdir -p "$runs"
for name in "${!variants[@]}"; do
  # shellcheck disable=SC2086
  timeout "$limit" ${PYTHON:-python} ${variants[$name]} $common --run-dir "$runs/$name" > "$runs/$name.log" 2>&1 &
done
wait
for name in "${!variants[@]}"; do echo "== $name"; tail -n 3 "$runs/$name.log"; done
