# Sourced by results/gpu_run.sh: `gpu_setup ENV` makes ENV's scripts importable on a
# lent GPU machine. Where they cannot import their packages, it installs the wheels that
# `bash results/gpu_wheels.sh ENV` put in .whl/ (BabyAI), .whl-fruitbot/ or .whl-minihack/, carried with the run, and
# exports PYTHONPATH; PYTHON (default python3) is the interpreter.
gpu_setup() {
  local wheels modules
  case $1 in  # what each env's scripts import that the GPU machine lacks (minigrid only where BabyAI is made)
    babyai) wheels=.whl modules="flashbax, gymnax, tyro, minigrid, tensorboardX" ;;
    fruitbot) wheels=.whl-fruitbot modules="flashbax, gymnax, tyro, tensorboardX, procgen" ;;
    minihack) wheels=.whl-minihack modules="flashbax, gymnax, tyro, tensorboardX, nle, minihack" ;;
    *) echo "unknown env $1: babyai, fruitbot or minihack" >&2; return 2 ;;
  esac
  PYTHON=${PYTHON:-python3}
  if ! "$PYTHON" -c "import $modules" 2>/dev/null; then
    [ -d "$wheels" ] || { echo "missing packages and no $wheels/: run bash results/gpu_wheels.sh $1 here first" >&2
                         return 2; }
    "$PYTHON" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
      "$wheels"/*.whl
    export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
    "$PYTHON" -c "import $modules" || { echo "error: the imports above still fail with $wheels/ installed" >&2
                                        return 2; }
  fi
  export PYTHONUNBUFFERED=1
}
