#!/usr/bin/env bash
# Wheels (Python 3.12, x86-64) of the packages the lent GPU machine lacks, at requirements.txt's versions, into the
# folder results/gpu_run.sh installs them from there (carry it with the run):
#   bash results/gpu_wheels.sh babyai      # .whl/
#   bash results/gpu_wheels.sh fruitbot    # .whl-fruitbot/: what the scripts import, and procgen's
#   bash results/gpu_wheels.sh minihack    # .whl-minihack/: what the scripts import, and NLE's and MiniHack's
set -euo pipefail
cd "$(dirname "$0")/.."
# what every script imports that the GPU machine lacks; BabyAI's tiles come from minigrid (which imports pygame)
common="flashbax gymnax tyro gymnasium tensorboardX farama-notifications docstring-parser typeguard"
case ${1:-} in
  babyai) wheels=.whl names="$common minigrid pygame-ce" ;;
  fruitbot) wheels=.whl-fruitbot names="$common procgen-mirror gym3 gym-notices cffi pycparser" sdists=gym ;;
  minihack) wheels=.whl-minihack names="$common nle" sdists=minihack ;;
  *) echo "usage: bash results/gpu_wheels.sh babyai|fruitbot|minihack" >&2; exit 2 ;;
esac
grep -qx "/$wheels/" .git/info/exclude 2>/dev/null || echo "/$wheels/" >> .git/info/exclude
PYTHON=${PYTHON:-python3}
version() { grep -i "^$1==" requirements.txt | cut -d= -f3 | cut -d' ' -f1; }
"$PYTHON" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform any \
  -d "$wheels" $(for name in $names; do echo "$name==$(version "$name")"; done)
for name in ${sdists:-}; do  # pure Python, published (for this Python) as source only: built into a py3 wheel here
  "$PYTHON" -m pip wheel -q --no-deps -w "$wheels" "$name==$(version "$name")"
done
ls -l "$wheels"
# a lent machine receives the tracked files and the carried folders together, at most 64 MiB
tracked=$(git ls-files -z | xargs -0 stat -c %s | awk '{s += $1} END {print s / 1048576}')
carried=$(du -sb "$wheels" | awk '{print $1 / 1048576}')
awk -v t="$tracked" -v c="$carried" -v w="$wheels" 'BEGIN {printf "%s/ %.1f MiB + tracked files %.1f MiB = %.1f MiB \
of the 64 MiB a lent machine receives%s\n", w, c, t, c + t, (c + t > 64 ? ": TOO LARGE to carry" : "")}'
