"""Share compiled XLA programs between the tests' tiny training runs (identical programs compile once).

The suite runs in parallel processes (pytest-xdist, pytest.ini): each worker has its own cache folder, since JAX
writes cache entries without a lock (a worker could read another's half-written entry). The folder is also put in
the environment, so the runs that tests start as subprocesses (the GPU commands, `python msfa_babyai.py`) share it."""

import os
import tempfile

import jax

os.environ["JAX_COMPILATION_CACHE_DIR"] = os.path.join(
    tempfile.gettempdir(), f"msfa-jax-test-xla-cache-{os.environ.get('PYTEST_XDIST_WORKER', 'main')}")
os.environ["JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"] = "1"
jax.config.update("jax_compilation_cache_dir", os.environ["JAX_COMPILATION_CACHE_DIR"])
jax.config.update("jax_persistent_cache_min_compile_time_secs", 1.0)
