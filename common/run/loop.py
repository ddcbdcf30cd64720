"""The host side of every training script's main: its jitted training chunks alternate with logging, evaluation and
checkpoints until --total-timesteps (or --max-minutes), and Ctrl-C / SIGTERM stop it cleanly. Everything a method
learns is in what the script passes in (its jitted chunk of training iterations and its evaluation); this is the
bookkeeping around them."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable

import jax
import numpy as np

from common.run.logs import (eval_line, eval_rows, format_task, metric_fields, metric_rows, progress_line,
                             require_finite)
from common.run.run_dir import RunDir, StopSignals


def whole_iterations(steps: int, per_iteration: int) -> int:
    """`steps` env steps as training iterations of per_iteration env steps, rounded up (a run never trains fewer
    steps, or evaluates more rarely, than asked)."""
    return -(-steps // per_iteration)


@dataclass(frozen=True)
class Training:
    """What a script hands the loop: its jitted training program, its evaluation, and what their outputs are.

    make_chunk(n) -> a jitted chunk(state) -> (state, IterationMetrics [seeds, n, ...]) running n iterations;
    evaluate(params of one seed, key) -> greedy returns [len(gpi_settings), len(eval_tasks), episodes] (the script's
    make_evaluate), eval_tasks the train tasks first; loss_names: the SGD step's losses (metrics.csv's columns);
    num_cumulants > 0 for a method that learns cumulants (their quality columns)."""
    make_chunk: Callable
    evaluate: Callable
    eval_tasks: np.ndarray
    num_train_tasks: int
    gpi_settings: tuple[int, ...]
    loss_names: tuple[str, ...]
    steps_per_iteration: int
    sgd_steps_per_iteration: int
    num_cumulants: int = 0


def train_in_chunks(run: RunDir, args, state, seeds: list[int], training: Training) -> None:
    """Train from run.start_step to the end: chunks of --log-every env steps (shorter ones to land on evaluations
    and the end), each `training.make_chunk(n)`, compiled once per length. After each chunk a metrics.csv row per
    seed and a progress line; at every evaluation the eval.csv rows, the parameter files and a checkpoint; a
    checkpoint also every --checkpoint-minutes. The metrics are the one host sync per chunk."""
    per_iteration = training.steps_per_iteration
    total_iterations = whole_iterations(args.total_timesteps, per_iteration)
    eval_every = whole_iterations(args.eval_every, per_iteration)
    total_steps = total_iterations * per_iteration
    chunk_iterations = max(1, args.log_every // per_iteration)
    train_tasks = [format_task(w) for w in training.eval_tasks[:training.num_train_tasks]]
    print(f"{args.num_seeds} seed(s) x {args.num_envs} envs, {training.sgd_steps_per_iteration} SGD steps per "
          f"{per_iteration} env steps; logging every {chunk_iterations * per_iteration:,} steps; run dir {run.path}")
    rounded = [f"--{name} {asked:,} -> {whole * per_iteration:,}" for name, asked, whole in (
        ("total-timesteps", args.total_timesteps, total_iterations), ("eval-every", args.eval_every, eval_every))
        if asked != whole * per_iteration]
    if rounded:
        print(f"rounded up to whole iterations of {per_iteration} env steps: {'; '.join(rounded)}", flush=True)

    chunks = {}  # iterations -> the jitted chunk
    iteration = run.start_step // per_iteration
    next_eval = (iteration // eval_every + 1) * eval_every
    start_time, start_iteration = time.time(), iteration
    fields = metric_fields(training.loss_names, train_tasks, training.num_cumulants)
    with StopSignals() as signals, run.open_logs(fields) as logs:
        while iteration < total_iterations:
            chunk_start = time.time()
            n = min(chunk_iterations, total_iterations - iteration, next_eval - iteration)
            if n not in chunks:
                chunks[n] = training.make_chunk(n)
            state, metrics = chunks[n](state)
            metrics = jax.tree.map(np.asarray, metrics)  # [seeds, iterations]: the one host sync per chunk
            iteration += n
            step = iteration * per_iteration
            sps = n * per_iteration / (time.time() - chunk_start)
            rows = metric_rows(metrics, state.sgd_steps, seeds, step, sps, training.loss_names, train_tasks)
            logs.write_metrics(rows)
            require_finite(rows, training.loss_names, run.checkpoint)  # NaN/inf: stop, keep the last good checkpoint
            eta = (time.time() - start_time) / (iteration - start_iteration) * (total_iterations - iteration)
            print(progress_line(rows, total_steps, eta), flush=True)
            last = iteration >= total_iterations or run.out_of_time()
            if iteration >= next_eval or last:
                rows = eval_rows(training.evaluate, state.params, seeds, step, training.eval_tasks,
                                 training.num_train_tasks, training.gpi_settings)
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
