#!/usr/bin/env bash
# Wheels (Python 3.12, x86-64) of the packages the lent GPU machine lacks, into .whl/ at the repository root; carry
# .whl with the run and results/babyai/gpu_run.sh installs them there. The versions are requirements.txt's.
set -euo pipefail
cd "$(dirname "$0")/../.."
grep -qx '/.whl/' .git/info/exclude 2>/dev/null || echo '/.whl/' >> .git/info/exclude
PYTHON=${PYTHON:-python3}
version() { grep -i "^$1==" requirements.txt | cut -d= -f3 | cut -d' ' -f1; }
"$PYTHON" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform any \
  -d .whl $(for name in flashbax gymnax tyro minigrid gymnasium tensorboardX pygame-ce farama-notifications \
                       docstring-parser typeguard; do echo "$name==$(version "$name")"; done)
ls -l .whl
