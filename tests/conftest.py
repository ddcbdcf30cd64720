"""Share compiled XLA programs between the tests' tiny training runs (identical programs compile once)."""

import os
import tempfile

import jax

jax.config.update("jax_compilation_cache_dir", os.path.join(tempfile.gettempdir(), "msfa-jax-test-xla-cache"))
jax.config.update("jax_persistent_cache_min_compile_time_secs", 1.0)
