#!/usr/bin/env bash
# The whole test suite: sets up the environment(s), then runs pytest. `.ci/run` calls this.
# pytest's exit code 5 (no tests collected) is a failure here, like any non-zero code.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup_env.sh main
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-2}
export LARGEBATCH_CACHE=${LARGEBATCH_CACHE:-$PWD/.cache/largebatch}
.venv/bin/python -m pytest -q "$@" tests
