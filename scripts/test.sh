#!/usr/bin/env bash
# The whole test suite: sets up both environments, then runs pytest in each. `.ci/run` calls this.
#   1. .venv (torch 2.14.1): every test (tests/xla skip: no torch-xla), distributed ones on real gloo ranks;
#   2. .venv-xla (torch 2.9.0 + torch-xla 2.9.0): tests/xla under PJRT_DEVICE=CPU.
# Any non-zero pytest code fails the run, 5 (no test collected) included.
#   scripts/test.sh                # everything
#   scripts/test.sh -k lars        # extra arguments go to the first pytest run
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup_env.sh main
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-2}
export LARGEBATCH_CACHE=${LARGEBATCH_CACHE:-$PWD/.cache/largebatch}
.venv/bin/python -m pytest -q "$@" tests  # tests/xla skip here, with the reason
scripts/test_xla.sh
