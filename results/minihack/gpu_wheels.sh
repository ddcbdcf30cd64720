#!/usr/bin/env bash
# Wheels (Python 3.12, x86-64) of the packages the lent GPU machine lacks for MiniHack, into .whl-minihack/ at the
# repository root; carry .whl-minihack with the run and results/minihack/gpu_run.sh installs them there. The
# versions are requirements.txt's.
exec bash "$(dirname "$0")/../gpu_wheels.sh" minihack
