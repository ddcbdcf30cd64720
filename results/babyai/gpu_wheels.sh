#!/usr/bin/env bash
# Wheels (Python 3.12, x86-64) of the packages the lent GPU machine lacks, into .whl/ at the repository root; carry
# .whl with the run and results/babyai/gpu_run.sh installs them there. The versions are requirements.txt's.
exec bash "$(dirname "$0")/../gpu_wheels.sh" babyai
