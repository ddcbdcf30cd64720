"""Share compiled XLA programs between the tests' tiny training runs (identical programs compile once).

The suite runs in parallel processes (pytest-xdist, pytest.ini) that share one cache folder, so that a program one
worker compiled is not compiled again in the others (a whole suite on 2 workers, each with a folder of its own,
compiled 1,760 of the same programs twice). JAX writes an entry without a lock: a worker that reads an entry the
other is still writing fails to decompress it, warns and compiles the program itself, so sharing costs at worst
that compile. The folder is also put in the environment, so the runs that tests start as subprocesses (the
protocol's, `python msfa_babyai.py`) share it.

Every program is cached, however fast it compiled (JAX's default keeps only those over a second): a fresh process
otherwise recompiles the ~300 small programs that building a network eagerly and the env make (one per weight shape
for its random initialisation, each 0.2-0.5 s on this CPU). Measured on a tiny MSFA run in a fresh process, the
cache warm: 97 s with the 1 s threshold, 39 s with none."""

import os
import tempfile

import jax

os.environ["JAX_COMPILATION_CACHE_DIR"] = os.path.join(tempfile.gettempdir(), "msfa-jax-test-xla-cache")
os.environ["JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"] = "0"
jax.config.update("jax_compilation_cache_dir", os.environ["JAX_COMPILATION_CACHE_DIR"])
jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)

# submitit (tools.protocol's SLURM runner) configures logging when first imported (logging.config.dictConfig), which
# closes every handler there is; absl's (installed by flax's import) holds the stderr of its time, under pytest a
# capture, so a test that first imported tools.protocol after another module had imported flax closed pytest's
# capture of stderr and crashed the session ("lost sys.stderr"). Imported here, first, its configuration finds none.
import submitit  # noqa: E402,F401


# ------------------------------------------------------------------------------------------------------- the tiers
SLOW = {  # test file -> the tests (names, parametrisations aside) in the slow tier, or "*" for all of them
    # whole files: trained runs and what reads them
    "test_learning.py": "*",  # the README's first run, as written: MSFA trained until it learns
    "test_slurm.py": "*",  # a one-node SLURM cluster
    "test_scale.py": "*",  # the protocol's real runs, killed and resumed
    "test_copy_and_modify.py": "*",  # copies trained tiny, then every tool on them
    "test_benchmarks.py": "*",  # the benchmark commands
    "test_analyze.py": "*",  # tiny trained runs of three methods
    "test_video.py": "*",  # a tiny trained UVFA-FARM run
    "test_fruitbot_replay.py": "*",  # every Fruitbot script trained twice (game states, frames), and resumed
    # the speed-only FARM backends (fused, Pallas kernels) against the plain FARM, and the SGD steps built on them
    "test_farm_fast.py": "*", "test_farm_kernels.py": "*", "test_farm_kernels_scripts.py": "*",
    "test_fused_learner.py": "*",
    # the JAX Fruitbot against stock procgen step by step, and env worker processes
    "test_fruitbot_jax.py": ("test_dynamics_match_procgen", "test_generated_levels_match_procgen"),
    "test_minihack.py": ("test_worker_processes_play_the_same_episodes_as_one_process",),
    "test_compact.py": ("test_the_committed_agent_loads_from_its_compact_form",),
    # tiny end-to-end runs, resume and the tools on real runs
    "test_runs.py": ("test_sigint_at_a_random_moment_then_resume_gives_the_uninterrupted_run",
                     "test_a_run_killed_before_its_first_checkpoint_starts_over_on_resume",
                     "test_resume_without_settings_says_the_one_command_that_works",
                     "test_a_second_run_into_a_used_directory_is_refused_and_leaves_it_untouched",
                     "test_overwrite_moves_the_old_run_aside", "test_a_moved_run_resumes_from_its_saved_settings_alone",
                     "test_resuming_a_finished_run_says_so_and_changes_nothing",
                     "test_a_run_saved_before_a_setting_existed_resumes_with_its_default",
                     "test_resume_refuses_a_changed_setting_that_is_not_safe_to_change",
                     "test_a_broken_checkpoint_gets_one_line_and_the_csvs_are_untouched",
                     "test_another_methods_checkpoint_is_refused",
                     "test_a_nan_stops_the_run_and_keeps_the_last_good_checkpoint_written_by_time",
                     "test_a_saved_agent_evaluates_on_any_task_and_reproduces_its_runs_evaluation",
                     "test_one_gpi_setting_alone_gives_that_settings_rows_of_both", "test_evaluate_bad_input_gets_one_line",
                     "test_the_run_records_its_env_where_the_tools_read_it",
                     "test_a_save_on_a_full_disk_stops_with_one_line_and_loses_nothing",
                     "test_a_run_trains_the_steps_asked_and_evaluates_where_asked"),
    "test_learners.py": ("test_tiny_run_with_the_time_limit_as_termination", "test_tiny_run_of_every_script_and_variant",
                         "test_same_seed_gives_identical_results_and_seeds_differ", "test_resume_continues_the_run"),
    "test_msfa_fruitbot.py": ("test_tiny_run_end_to_end",),
    "test_msfa_minihack.py": ("test_tiny_run_end_to_end",),
    "test_fruitbot_baselines.py": ("test_tiny_run_end_to_end", "test_uvfa_tiny_run_end_to_end",
                                   "test_the_other_uvfa_variants_train_on_this_env"),
    "test_minihack_baselines.py": ("test_usfa_tiny_run_end_to_end", "test_uvfa_tiny_run_end_to_end",
                                   "test_the_other_uvfa_variants_train_on_this_env"),
}
"""The fast tier (`pytest -m "not slow"`, a developer's loop) is the rest: env rules, every hand-worked target and
loss against every script, the contract, masking, bad input, equivalences at small sizes."""

EXHAUSTIVE = {  # test file -> tests (with their parametrisation) that repeat a slow check CI already makes once
    # a tiny end-to-end run: CI runs one per script (msfa, usfa-learned, uvfa-farm); the other variants' losses and
    # masking are the fast tier's, per variant
    "test_learners.py": (
        *(f"test_tiny_run_of_every_script_and_variant[{v}]"
          for v in ("msfa-entangled-psi", "msfa-entangled-phi", "msfa-entangled-both", "usfa", "uvfa", "mvfa")),
        "test_tiny_run_with_the_time_limit_as_termination[usfa-learned]",  # CI: [msfa]
        "test_tiny_run_with_the_time_limit_as_termination[uvfa]",
        *(f"{t}[{s}]" for t in ("test_same_seed_gives_identical_results_and_seeds_differ",
                                "test_resume_continues_the_run") for s in ("usfa", "uvfa"))),  # CI: [msfa]
    # Fruitbot: CI runs MSFA on the JAX game and USFA and UVFA on stock procgen (the host env path)
    "test_msfa_fruitbot.py": ("test_tiny_run_end_to_end[procgen]",),
    "test_fruitbot_baselines.py": ("test_tiny_run_end_to_end[hand-designed]", "test_uvfa_tiny_run_end_to_end[mvfa]"),
    "test_fruitbot_replay.py": tuple(f"{t}[{s}]" for t in (  # CI: [msfa]
        "test_the_replay_kinds", "test_the_last_steps_in_replay_draw_the_frames_the_actors_see",
        "test_replay_bytes_is_what_the_buffer_holds", "test_a_resumed_run_continues_exactly") for s in ("mvfa", "usfa")),
    "test_minihack_baselines.py": ("test_uvfa_tiny_run_end_to_end",),  # CI: USFA's and MSFA's MiniHack runs
    # the speed-only FARM backends: CI compares them with the plain FARM on BabyAI's MSFA and an odd small case
    "test_fused_learner.py": tuple(f"test_the_sgd_step_is_the_same_with_the_fused_farm[{v}]" for v in (
        "msfa-entangled-psi", "msfa-entangled-phi", "msfa-entangled-both", "uvfa-farm", "mvfa",
        "msfa-time-limit-is-termination", "msfa_fruitbot", "msfa_minihack")),
    "test_farm_kernels_scripts.py": ("test_the_sgd_step_is_the_same_with_the_kernels[msfa_fruitbot]",
                                     "test_the_sgd_step_is_the_same_with_the_kernels[uvfa-farm]"),
    "test_farm_kernels.py": tuple(f"test_the_kernels_compute_farm[{c}]"
                                  for c in ("msfa_fruitbot", "msfa_minihack", "single_module")),
    "test_farm_fast.py": tuple(f"test_the_fused_backend_computes_farm[{c}]"
                               for c in ("msfa_fruitbot", "msfa_minihack", "single_module")),
    # the previous reward perturbed through the SGD step: CI takes every BabyAI case, both FARM backends on BabyAI's
    # MSFA and the plain FARM on Fruitbot's and MiniHack's (the one-step test covers every case and backend)
    "test_reward_input.py": tuple(f"test_the_sgd_step_reads_the_reward_input_only_with_reward_input_on[{c}]" for c in (
        "msfa_fruitbot-fused", "msfa_minihack-fused", "usfa-learned_fruitbot-None", "usfa-learned_minihack-None")),
    # the benchmark commands (tools that measure, asserting nothing of the method): CI runs the MiniHack env rows and
    # the FLOP count they all use
    "test_benchmarks.py": ("test_the_learner_benchmark_runs_tiny[msfa]", "test_the_learner_benchmark_runs_tiny[usfa]",
                           "test_the_sgd_variants_command_runs_its_rows_and_survives_an_unknown_xla_flag",
                           "test_the_sgd_variants_fruitbot_rows_time_drawing_against_stored_frames"),
}
"""The exhaustive tier: the slow checks repeated for every other script, variant, env backend and FARM backend.
Plain `pytest` (the README's test command, what CI runs) is both tiers without these, so that it stays well under 30
minutes on 2 cores; `pytest --exhaustive` adds them (run it before changing what they repeat: a script's run loop,
an env backend, a FARM backend). A test named on the command line (file::test) always runs."""


LONGEST_FIRST = ("test_scale.py", "test_fruitbot_jax.py", "test_learners.py", "test_runs.py", "test_msfa_fruitbot.py",
                 "test_msfa_minihack.py", "test_learning.py", "test_copy_and_modify.py", "test_analyze.py",
                 "test_slurm.py", "test_fruitbot_baselines.py", "test_reward_input.py", "test_minihack_baselines.py",
                 "test_fruitbot_replay.py", "test_video.py", "test_farm_kernels.py", "test_babyai.py")
"""The files whose tests take longest (plain pytest's durations on 2 cores, 2026-12-06: 870 s down to 90 s),
collected first: pytest-xdist hands a worker one file at a time in collection order (with --no-loadscope-reorder,
pytest.ini: by default xdist 3 hands out the files with the most tests first), and a long file left to the end keeps
one worker busy while the other has nothing left to do. The rest follow in their usual order."""


def pytest_addoption(parser):
    parser.addoption("--exhaustive", action="store_true",
                     help="also run the exhaustive tier (tests/conftest.py EXHAUSTIVE): every slow check repeated for "
                          "every script, variant and backend")


def pytest_collection_modifyitems(config, items):
    import pytest

    rank = {name: i for i, name in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))  # (stable: each file's order is kept)
    seen, seen_names = {}, {}
    for item in items:
        seen.setdefault(item.path.name, set()).add(item.originalname)
        seen_names.setdefault(item.path.name, set()).add(item.name)
        slow = SLOW.get(item.path.name, ())
        if slow == "*" or item.originalname in slow or item.name in EXHAUSTIVE.get(item.path.name, ()):
            item.add_marker(pytest.mark.slow)
    whole_files = not config.getoption("keyword") and all("::" not in a for a in config.args)
    for name, tests in seen.items() if whole_files else ():  # a renamed test must not fall into a faster tier
        unknown = set() if SLOW.get(name) == "*" else set(SLOW.get(name, ())) - tests
        unknown |= set(EXHAUSTIVE.get(name, ())) - seen_names[name]
        if unknown:
            raise pytest.UsageError(f"tests/conftest.py SLOW or EXHAUSTIVE names tests that {name} does not have: "
                                    f"{sorted(unknown)}")
    if config.getoption("exhaustive") or not whole_files:
        return
    exhaustive = [item for item in items if item.name in EXHAUSTIVE.get(item.path.name, ())]
    if exhaustive:
        config.hook.pytest_deselected(items=exhaustive)
        items[:] = [item for item in items if item.name not in EXHAUSTIVE.get(item.path.name, ())]
