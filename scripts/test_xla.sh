#!/usr/bin/env bash
# The XLA tests (tests/xla) in their own environment: torch-xla 2.9.0 pins torch 2.9.0, so it
# cannot share .venv. One XLA:CPU device in the pytest process; the multi-replica tests start
# their own 4-device subprocess. Called by scripts/test.sh; runs alone as well.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup_env.sh xla
export PJRT_DEVICE=CPU
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-2}
# No arguments: all of tests/ (all but tests/xla skip here, with the reason); else pytest's arguments.
if (($#)); then
  .venv-xla/bin/python -m pytest -q "$@"
else
  LARGEBATCH_TIME_BUDGET=1 .venv-xla/bin/python -m pytest -q --durations=20 tests  # held to its time budget
fi
