"""Stock procgen, the reference that Fruitbot's JAX game is proven against, run in its own Python environment.

procgen's wheel (procgen-mirror 0.10.7) pins numpy < 2; the project runs current JAX on numpy 2. So procgen's C++
game lives in a second virtual environment, `.venv-procgen` in the repository (or the Python named by
$MSFA_PROCGEN_PYTHON), which this module starts as one server process (common/envs/procgen_server.py) and talks to
over a pipe. `ProcgenEnv` offers the part of procgen's `ProcgenGym3Env` that the project uses (act, observe,
get_info, the serialized game states). Who uses it: `--env-backend procgen` (common/envs/fruitbot.py), the tests
that hold the JAX game and its frames equal to procgen's, and the benchmarks that time procgen.

Fruitbot's images (procgen's sprites and backgrounds, MIT licence) are copied out of that environment once, into
common/envs/procgen_images/ (not committed: 4 MB), so that the JAX game needs no procgen when it runs.

    python -m common.envs.procgen_env setup     # creates .venv-procgen (procgen + numpy 1.26) and copies the images
    python -m common.envs.procgen_env check     # says whether it is there and works
"""

from __future__ import annotations

import atexit
import os
import pickle
import shutil
import struct
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np

from common.envs.fruitbot_images import BACKGROUND_FILES, SPRITE_FILES
from common.envs.procgen_server import decode, encode
from common.run.errors import ConfigError

ROOT = Path(__file__).resolve().parents[2]
VENV = ROOT / ".venv-procgen"
REQUIREMENTS = ROOT / "requirements-procgen.txt"
SERVER = Path(__file__).with_name("procgen_server.py")
IMAGES = Path(__file__).with_name("procgen_images")
SETUP = "python -m common.envs.procgen_env setup"


def python() -> Path:
    """The procgen environment's Python ($MSFA_PROCGEN_PYTHON, else .venv-procgen's)."""
    return Path(os.environ.get("MSFA_PROCGEN_PYTHON", VENV / "bin" / "python"))


def available() -> bool:
    return python().exists()


def require_procgen(what: str = "stock procgen") -> None:
    """Stop with one line where the procgen environment is not set up."""
    if not available():
        raise ConfigError(f"{what} needs stock procgen's own Python environment (procgen needs numpy < 2), which is "
                          f"not set up at {python()}: run `{SETUP}` once")


class _Server:
    """The procgen environment's server process: one per process of ours, shared by every ProcgenEnv (a lock
    keeps each request and its reply together)."""

    def __init__(self):
        require_procgen()
        self.process = subprocess.Popen([str(python()), str(SERVER)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                        cwd=SERVER.parent)
        self.lock = threading.Lock()
        self.handles = 0

    def call(self, method: str, *args):
        payload = pickle.dumps((method, encode(args)), protocol=4)
        with self.lock:
            self.process.stdin.write(struct.pack("<Q", len(payload)) + payload)
            self.process.stdin.flush()
            header = self.process.stdout.read(8)
            if len(header) < 8:
                raise RuntimeError(f"the procgen server ({python()}) stopped (exit status {self.process.poll()}); "
                                   f"its error is above")
            status, value = pickle.loads(self.process.stdout.read(struct.unpack("<Q", header)[0]))
        if status != "ok":
            raise RuntimeError(f"procgen: {value}")
        return decode(value)

    def close(self):
        if self.process.poll() is None:
            self.process.stdin.close()
            self.process.wait(timeout=30)


_server: _Server | None = None


def server() -> _Server:
    global _server
    if _server is None or _server.process.poll() is not None:
        _server = _Server()
        atexit.register(_server.close)
    return _server


class ProcgenEnv:
    """`num` procgen games stepped together, as procgen's ProcgenGym3Env(num=num, **options) in the procgen
    environment (options: env_name, distribution_mode, num_levels, start_level, rand_seed, num_threads, ...)."""

    def __init__(self, num: int, **options):
        self.num = num
        self.server = server()
        self.server.handles += 1
        self.handle = self.server.handles
        self.server.call("make", self.handle, dict(num=num, **options))

    def act(self, actions) -> None:
        self.server.call("act", self.handle, np.asarray(actions, np.int32))

    def observe(self):
        """(reward [num], {"rgb": uint8 [num, 64, 64, 3]}, first [num]), as gym3's observe."""
        reward, rgb, first = self.server.call("observe", self.handle)
        return reward, {"rgb": rgb}, first

    def get_info(self) -> list[dict]:
        return self.server.call("get_info", self.handle)

    def get_state(self, i: int) -> bytes:
        """Game i's serialized state (procgen's Game::serialize)."""
        return self.server.call("get_state", self.handle, i)

    def get_states(self) -> list[bytes]:
        return self.server.call("get_states", self.handle, list(range(self.num)))

    def set_state(self, i: int, state: bytes) -> None:
        self.server.call("set_state", self.handle, i, state)

    def close(self) -> None:
        if self.handle is not None and self.server.process.poll() is None:
            self.server.call("close", self.handle)
        self.handle = None


# ---------------------------------------------------------------------------------------------------------------------
# Fruitbot's images, copied out of the procgen environment once
# ---------------------------------------------------------------------------------------------------------------------
def copy_images(names) -> Path:
    """Copy procgen's images `names` (paths under its data/assets folder) and its licence into IMAGES."""
    source = Path(server().call("asset_dir"))
    for name in names:
        (IMAGES / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(source / name, IMAGES / name)
    shutil.copyfile(source.parents[2] / "procgen_mirror-0.10.7.dist-info" / "LICENSE", IMAGES / "LICENSE")
    return IMAGES


def image_dir(names) -> Path:
    """The folder holding Fruitbot's images: copied from the procgen environment the first time they are asked
    for (stops with one line where neither the copies nor that environment exist)."""
    if not all((IMAGES / name).exists() for name in names):
        require_procgen("Fruitbot's images (procgen's, copied once into common/envs/procgen_images/)")
        copy_images(names)
    return IMAGES


def setup(base_python: str) -> None:
    """Create .venv-procgen with requirements-procgen.txt, then copy Fruitbot's images out of it."""
    if not python().exists():
        subprocess.run([base_python, "-m", "venv", str(VENV)], check=True)
        subprocess.run([str(python()), "-m", "pip", "install", "--quiet", "-r", str(REQUIREMENTS)], check=True)
    copy_images(SPRITE_FILES + BACKGROUND_FILES)
    check()


def check() -> None:
    env = ProcgenEnv(1, env_name="fruitbot", distribution_mode="hard", num_levels=0, start_level=0, rand_seed=0)
    env.act(np.zeros(1, np.int32))
    reward, ob, first = env.observe()
    env.close()
    print(f"procgen works in {python()} (frame {ob['rgb'].shape}); Fruitbot's images in {IMAGES}")


if __name__ == "__main__":
    import argparse

    parser = argparse.ArgumentParser(description="stock procgen's own Python environment")
    parser.add_argument("command", choices=("setup", "check"))
    parser.add_argument("--python", default=getattr(sys, "_base_executable", sys.executable),
                        help="the Python that creates .venv-procgen (default: the one this venv was made from)")
    cli = parser.parse_args()
    try:
        setup(cli.python) if cli.command == "setup" else check()
    except ConfigError as error:
        raise SystemExit(f"error: {error}") from None
