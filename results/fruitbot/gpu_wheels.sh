#!/usr/bin/env bash
# Wheels (Python 3.12, x86-64) of the packages the lent GPU machine lacks for Fruitbot, into .whl-fruitbot/ at the
# repository root; carry .whl-fruitbot with the run and results/fruitbot/gpu_run.sh installs them there. The versions
# are requirements.txt's.
exec bash "$(dirname "$0")/../gpu_wheels.sh" fruitbot
