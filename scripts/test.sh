#!/usr/bin/env bash
# The whole test suite: sets up both environments, then runs pytest in each. `.ci/run` calls this.
#   1. .venv (torch 2.14.1): every test (tests/xla skip: no torch-xla), distributed ones on real gloo ranks;
#   2. .venv-xla (torch 2.9.0 + torch-xla 2.9.0): tests/xla under PJRT_DEVICE=CPU (set up while
#      the first runs).
# Any non-zero pytest code fails the run, 5 (no test collected) included.
#   scripts/test.sh                # everything
#   scripts/test.sh -k lars        # extra arguments go to the first pytest run (no time budget then)
# The whole suite runs on one pytest-xdist worker per core (at most 4; LARGEBATCH_TEST_WORKERS=N
# sets it), each with its share of the cores as torch threads (OMP_NUM_THREADS sets it), prints its 20 slowest tests and fails over its time budget (tests/time_budget.json).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup_env.sh main
# .venv-xla is set up while the main suite runs (pip's unpacking waits on the disk more than on the
# CPU): minutes off a fresh clone's run. It starts after .venv is in, so its check of the free space
# sees what .venv took, and only where it leaves room for the suite's files (SUITE_GIB): else it
# exits 74 at once and is set up after the suite, whose files are gone by then. Two set-ups started
# together each saw the same free space and filled the disk between them. Its output goes to a log,
# shown if the set-up fails.
SUITE_GIB=4
mkdir -p .cache
xla_log=.cache/setup-xla.log
HEADROOM_GIB=$SUITE_GIB scripts/setup_env.sh xla > "$xla_log" 2>&1 &
xla_setup=$!
trap 'kill "$xla_setup" 2> /dev/null || :' EXIT
user_threads=${OMP_NUM_THREADS:-}
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-2}
cores=$(OMP_NUM_THREADS='' nproc)
workers() { echo "${LARGEBATCH_TEST_WORKERS:-$((cores < 4 ? cores : 4))}"; }
# torch threads a worker (unless OMP_NUM_THREADS is set): the cores shared out, at least 1. Two
# workers of 2 threads on 2 cores spin in OpenMP's barriers while the other runs: measured on
# tests/test_cli.py + test_resume.py, 1 thread a worker took 0.56x the CPU time of 2.
worker_threads() { local w; w=$(workers); echo "${user_threads:-$((cores / w > 0 ? cores / w : 1))}"; }
export LARGEBATCH_CACHE=${LARGEBATCH_CACHE:-$PWD/.cache/largebatch}
if (($#)); then
  .venv/bin/python -m pytest -q "$@" tests  # tests/xla skip here, with the reason
else
  # the whole suite on LARGEBATCH_TEST_WORKERS pytest-xdist workers (default: one per core, at
  # most 4; the SLURM tests share one worker, tests/test_slurm.py); its 20 slowest tests, and
  # held to its time budget (tests/time_budget.py)
  OMP_NUM_THREADS=$(worker_threads) LARGEBATCH_TIME_BUDGET=1 \
    .venv/bin/python -m pytest -q --durations=20 -n "$(workers)" --dist loadgroup tests
fi
xla_rc=0
wait "$xla_setup" || xla_rc=$?
if ((xla_rc == 74)); then  # no room beside the suite: now, alone
  cat "$xla_log" >&2
  echo "test.sh: setting up .venv-xla now, after the main suite" >&2
  xla_rc=0
  scripts/setup_env.sh xla > "$xla_log" 2>&1 || xla_rc=$?
fi
if ((xla_rc)); then
  cat "$xla_log" >&2
  echo "test.sh: setting up .venv-xla failed (its output is above); scripts/setup_env.sh xla retries it" >&2
  exit 1
fi
scripts/test_xla.sh
