#!/usr/bin/env bash
# The XLA tests (tests/xla) in their own environment: torch-xla 2.9.0 pins torch 2.9.0, so it
# cannot share .venv. One XLA:CPU device in the pytest process; the multi-replica tests start
# their own 4-device subprocess. Called by scripts/test.sh; runs alone as well. The whole set runs
# on one pytest-xdist worker per core (at most 4; LARGEBATCH_TEST_WORKERS=N sets it), each with its
# share of the cores as torch threads: XLA:CPU compiles each graph on one thread, so one process
# left a core of two idle most of the time.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup_env.sh xla
export PJRT_DEVICE=CPU
cores=$(OMP_NUM_THREADS='' nproc)
workers=${LARGEBATCH_TEST_WORKERS:-$((cores < 4 ? cores : 4))}
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-$((cores / workers > 0 ? cores / workers : 1))}
# No arguments: all of tests/ (all but tests/xla skip here, with the reason); else pytest's arguments.
if (($#)); then
  .venv-xla/bin/python -m pytest -q "$@"
else
  LARGEBATCH_TIME_BUDGET=1 .venv-xla/bin/python -m pytest -q --durations=20 -n "$workers" --dist loadgroup tests  # held to its time budget
fi
