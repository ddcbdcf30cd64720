"""Stock procgen in its own Python environment, served to the main one over a pipe (common/envs/procgen_env.py).

procgen's wheel pins numpy < 2 while the rest of the project runs on numpy 2 and current JAX, so its C++ game lives
in a second virtual environment (`python -m common.envs.procgen_env setup` creates it). This file runs there as a
script and imports nothing of the repository: it reads requests from stdin and writes replies to stdout, each a
length-prefixed pickle of plain Python values; arrays travel as (dtype, shape, bytes), never as pickled numpy
objects, so the two numpy versions never meet (the client imports `encode` and `decode` from here).

    request: (method, args)        reply: ("ok", value) or ("error", "ExceptionType: message")
"""

import pickle
import struct
import sys
import traceback

import numpy as np

STATE_BUFFER_BYTES = 1 << 20


def encode(value):
    if isinstance(value, np.ndarray):
        return ("__array__", value.dtype.str, value.shape, value.tobytes())
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, (list, tuple)):
        return type(value)(encode(v) for v in value)
    if isinstance(value, dict):
        return {k: encode(v) for k, v in value.items()}
    return value


def decode(value):
    if isinstance(value, tuple) and len(value) == 4 and value[0] == "__array__":
        return np.frombuffer(value[3], np.dtype(value[1])).reshape(value[2]).copy()
    if isinstance(value, (list, tuple)):
        return type(value)(decode(v) for v in value)
    if isinstance(value, dict):
        return {k: decode(v) for k, v in value.items()}
    return value


def import_procgen():
    """procgen, imported without the notice its gym 0.26 prints on import (procgen itself needs no gym)."""
    import contextlib
    import io

    with contextlib.redirect_stderr(io.StringIO()):
        import procgen
    return procgen


class Server:
    def __init__(self):
        self.envs = {}
        self.buffer = None

    def make(self, handle, options):
        ProcgenGym3Env = import_procgen().ProcgenGym3Env
        self.envs[handle] = ProcgenGym3Env(**options)
        if self.buffer is None:
            self.buffer = self.envs[handle]._ffi.new(f"char[{STATE_BUFFER_BYTES}]")

    def act(self, handle, actions):
        self.envs[handle].act(np.asarray(actions, np.int32))

    def observe(self, handle):
        reward, ob, first = self.envs[handle].observe()
        return reward, ob["rgb"], first

    def get_info(self, handle):
        return self.envs[handle].get_info()

    def get_state(self, handle, i):
        env = self.envs[handle]
        n = env.call_c_func("get_state", i, self.buffer, STATE_BUFFER_BYTES)
        return bytes(env._ffi.buffer(self.buffer, n))

    def get_states(self, handle, indices):
        return [self.get_state(handle, i) for i in indices]

    def set_state(self, handle, i, state):
        self.envs[handle].call_c_func("set_state", i, state, len(state))

    def close(self, handle):
        self.envs.pop(handle).close()

    def time_random_play(self, options, steps, repeats, seed):
        """Seconds per repeat of `steps` act + observe calls with random actions, timed here, in procgen's own
        process (the benchmarks' raw procgen figure, without the pipe)."""
        import time

        env = import_procgen().ProcgenGym3Env(**options)
        rng = np.random.default_rng(seed)
        seconds = []
        for _ in range(repeats):
            actions = rng.integers(0, 15, (steps, options["num"])).astype(np.int32)
            start = time.perf_counter()
            for a in actions:
                env.act(a)
                env.observe()
            seconds.append(time.perf_counter() - start)
        env.close()
        return seconds

    def asset_dir(self):
        import os

        return os.path.join(os.path.dirname(import_procgen().__file__), "data", "assets")


def main():
    server = Server()
    stdin, stdout = sys.stdin.buffer, sys.stdout.buffer
    sys.stdout = sys.stderr  # anything procgen prints goes to stderr, never into the replies
    while True:
        header = stdin.read(8)
        if len(header) < 8:
            return
        method, args = pickle.loads(stdin.read(struct.unpack("<Q", header)[0]))
        try:
            reply = ("ok", encode(getattr(server, method)(*decode(args))))
        except Exception as error:  # reported to the caller, which raises it there
            reply = ("error", f"{type(error).__name__}: {error}\n{traceback.format_exc()}")
        payload = pickle.dumps(reply, protocol=4)
        stdout.write(struct.pack("<Q", len(payload)) + payload)
        stdout.flush()


if __name__ == "__main__":
    main()
