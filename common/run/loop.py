"""The host side of every training script's main: its jitted training chunks alternate with logging, evaluation and
checkpoints until --total-timesteps (or --max-minutes), and Ctrl-C / SIGTERM stop it cleanly. Everything a method
learns is in what the script passes in (its jitted chunk of training iterations and its evaluation); this is the
bookkeeping around them."""

from __future__ import annotations

import time
from typing import Callable

import jax
import numpy as np

from common.run.logs import eval_line, metric_fields, metric_rows, progress_line, require_finite
from common.run.run_dir import RunDir, StopSignals


def whole_iterations(args, per_iteration: int) -> tuple[int, int]:
    """(iterations of the whole run, iterations between evaluations): --total-timesteps and --eval-every rounded up
    to whole training iterations of per_iteration env steps (never fewer steps or rarer evaluations than asked)."""
    return -(-args.total_timesteps // per_iteration), -(-args.eval_every // per_iteration)


def train_in_chunks(run: RunDir, args, state, seeds: list[int], per_iteration: int, sgd_per_iteration: int,
                    make_chunk: Callable, evaluate_rows: Callable, loss_names: tuple[str, ...],
                    task_names: list[str], num_cumulants: int = 0) -> None:
    """Train from run.start_step to the end: chunks of --log-every env steps (shorter ones to land on evaluations
    and the end), each `make_chunk(n)(state) -> (state, metrics [seeds, n])`, compiled once per length. After each
    chunk a metrics.csv row per seed and a progress line; at every evaluation `evaluate_rows(params, step)` (eval.csv
    rows), the parameter files and a checkpoint; a checkpoint also every --checkpoint-minutes. The metrics are the
    one host sync per chunk."""
    total_iterations, eval_every = whole_iterations(args, per_iteration)
    total_steps = total_iterations * per_iteration
    chunk_iterations = max(1, args.log_every // per_iteration)
    print(f"{args.num_seeds} seed(s) x {args.num_envs} envs, {sgd_per_iteration} SGD steps per {per_iteration} env "
          f"steps; logging every {chunk_iterations * per_iteration:,} steps; run dir {run.path}")
    rounded = [f"--{name} {asked:,} -> {whole * per_iteration:,}" for name, asked, whole in (
        ("total-timesteps", args.total_timesteps, total_iterations), ("eval-every", args.eval_every, eval_every))
        if asked != whole * per_iteration]
    if rounded:
        print(f"rounded up to whole iterations of {per_iteration} env steps: {'; '.join(rounded)}", flush=True)

    chunks = {}  # iterations -> the jitted chunk
    iteration = run.start_step // per_iteration
    next_eval = (iteration // eval_every + 1) * eval_every
    start_time, start_iteration = time.time(), iteration
    with StopSignals() as signals, run.open_logs(metric_fields(loss_names, task_names, num_cumulants)) as logs:
        while iteration < total_iterations:
            chunk_start = time.time()
            n = min(chunk_iterations, total_iterations - iteration, next_eval - iteration)
            if n not in chunks:
                chunks[n] = make_chunk(n)
            state, metrics = chunks[n](state)
            metrics = jax.tree.map(np.asarray, metrics)  # [seeds, iterations]: the one host sync per chunk
            iteration += n
            step = iteration * per_iteration
            sps = n * per_iteration / (time.time() - chunk_start)
            rows = metric_rows(metrics, state.sgd_steps, seeds, step, sps, loss_names, task_names)
            logs.write_metrics(rows)
            require_finite(rows, loss_names, run.checkpoint)  # stops on NaN/inf, keeping the last good checkpoint
            eta = (time.time() - start_time) / (iteration - start_iteration) * (total_iterations - iteration)
            print(progress_line(rows, total_steps, eta), flush=True)
            last = iteration >= total_iterations or run.out_of_time()
            if iteration >= next_eval or last:
                rows = evaluate_rows(state.params, step)
                logs.write_eval(rows)
                print(eval_line(rows), flush=True)
                next_eval += eval_every
                run.save_params(state.params, step, seeds)
                run.save(state, step, seeds)
            elif run.checkpoint_due():
                run.save(state, step, seeds)
            signals.stop_if_asked(run, state, step, seeds)  # Ctrl-C / SIGTERM: checkpoint, then one line and exit
            if last and iteration < total_iterations:
                print(f"stopped by --max-minutes at step {step:,} of {total_steps:,}", flush=True)
                break
