"""A stand-in for a training script, for testing results/gpu_run.py's scheduling without JAX (test_scale.py).

It takes the flags gpu_run passes to every script (--seed, --num-seeds, --run-dir, --max-minutes, --no-checkpoint),
writes the run directory's small files as a finished run would (config.json, metrics.csv, eval.csv, params_seed*.eqx),
then sleeps --sleep seconds and exits 0; with --hang it has written half its protocol and then ignores SIGTERM and
never stops (a run overrunning its own --max-minutes), so only SIGKILL ends it."""

import argparse
import json
import signal
import time
from pathlib import Path

parser = argparse.ArgumentParser()
for flag in ("--seed", "--num-seeds", "--max-minutes"):
    parser.add_argument(flag, type=float, required=True)
parser.add_argument("--run-dir", required=True)
parser.add_argument("--no-checkpoint", action="store_true", required=True)
parser.add_argument("--sleep", type=float, default=0.0)
parser.add_argument("--hang", action="store_true")
parser.add_argument("--total-timesteps", type=int, default=100)
args = parser.parse_args()

run = Path(args.run_dir)
run.mkdir(parents=True)
step = args.total_timesteps // 2 if args.hang else args.total_timesteps
(run / "config.json").write_text(json.dumps({"args": {"total_timesteps": args.total_timesteps,
                                                      "max_minutes": args.max_minutes}, "started": time.time()}))
(run / "metrics.csv").write_text(f"step,seed\n{step},1\n")
(run / "eval.csv").write_text(f"step,seed\n{step},1\n")
for seed in range(1, int(args.num_seeds) + 1):
    (run / f"params_seed{seed}.eqx").write_bytes(bytes(10))
print(f"step {step}", flush=True)
if args.hang:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    while True:
        time.sleep(1.0)
time.sleep(args.sleep)
