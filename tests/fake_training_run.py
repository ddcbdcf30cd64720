"""A stand-in for a training script, for testing tools/protocol/'s scheduling without JAX (test_scale.py).

It takes the flags the protocol passes to every script (--seed, --num-seeds, --run-dir, --max-minutes, --resume,
--overwrite, --env-workers), and writes a run directory's small files as a run would: config.json (with the device
it was given in CUDA_VISIBLE_DEVICES, or the cores it may run on and its XLA_FLAGS), metrics.csv and eval.csv at
each of its steps, checkpoint.eqx and params_seed*.eqx, one step every --seconds-per-step, up to --total-timesteps;
with --resume it continues from its last step. SIGTERM, or --max-minutes running out, stops it after a step with the checkpoint written; --fail makes it
exit 1 after its first step."""

import argparse
import json
import os
import signal
import time
from pathlib import Path

parser = argparse.ArgumentParser()
parser.add_argument("--seed", type=int, required=True)
parser.add_argument("--num-seeds", type=int, required=True)
parser.add_argument("--run-dir", required=True)
parser.add_argument("--max-minutes", type=float, default=None)
parser.add_argument("--resume", action="store_true")
parser.add_argument("--overwrite", action="store_true")
parser.add_argument("--env-workers", type=int, default=1)
parser.add_argument("--total-timesteps", type=int, default=4)
parser.add_argument("--seconds-per-step", type=float, default=0.2)
parser.add_argument("--fail", action="store_true")
args = parser.parse_args()
started = time.time()
stop = []
signal.signal(signal.SIGTERM, lambda signum, frame: stop.append(signum))

run = Path(args.run_dir)
if args.resume:
    config = json.loads((run / "config.json").read_text())
    step = int((run / "metrics.csv").read_text().splitlines()[-1].split(",")[0])
    was = config["args"]["total_timesteps"]
    changed = {"total_timesteps": [was, args.total_timesteps]} if was != args.total_timesteps else {}  # (extended)
    config["resumes"] = config.get("resumes", []) + [{"step": step, "changed": changed}]  # as the scripts record it
    config["args"]["total_timesteps"] = args.total_timesteps
else:
    assert args.overwrite or not run.exists() or not any(run.iterdir()), "a used run directory"
    run.mkdir(parents=True, exist_ok=True)
    config = {"args": {"total_timesteps": args.total_timesteps, "seed": args.seed, "num_seeds": args.num_seeds},
              "device": os.environ.get("CUDA_VISIBLE_DEVICES"), "cores": sorted(os.sched_getaffinity(0)),
              "xla_flags": os.environ.get("XLA_FLAGS", ""), "started": started}
    step = 0
    (run / "metrics.csv").write_text("step,seed\n")
    (run / "eval.csv").write_text("step,seed\n")
(run / "config.json").write_text(json.dumps(config))
while step < args.total_timesteps:
    time.sleep(args.seconds_per_step)
    step += 1
    seeds = range(args.seed, args.seed + args.num_seeds)
    with (run / "metrics.csv").open("a") as f:
        f.write("".join(f"{step},{seed}\n" for seed in seeds))
    (run / "checkpoint.eqx").write_text(str(step))
    if args.fail:
        raise SystemExit(1)
    out_of_time = args.max_minutes is not None and time.time() - started > 60 * args.max_minutes
    if step == args.total_timesteps or stop or out_of_time:
        with (run / "eval.csv").open("a") as f:
            f.write("".join(f"{step},{seed}\n" for seed in seeds))
        for seed in seeds:
            (run / f"params_seed{seed}.eqx").write_bytes(b"{}\n" + bytes(10))  # a JSON header line, as real ones
    if stop:
        raise SystemExit(128 + stop[0])
    if out_of_time:
        break
print(f"step {step}", flush=True)
