#!/usr/bin/env bash
# The whole suite: sets up both environments, then runs pytest in each, side by side. `.ci/run` calls this.
#   1. .venv (torch 2.14.1): every test (tests/xla skip: no torch-xla), distributed ones on real gloo ranks;
#   2. .venv-xla (torch 2.9.0 + torch-xla 2.9.0): tests/xla under PJRT_DEVICE=CPU, set up while
#      .venv is, then run beside the main tests; their output follows the main run's.
# Any non-zero pytest code fails the run, 5 (no test collected) included.
#   scripts/test.sh                # everything
#   scripts/test.sh -k lars        # extra arguments go to the first pytest run (no time budget then)
# The whole suite runs on one pytest-xdist worker per core (at most 4; LARGEBATCH_TEST_WORKERS=N
# sets it), each with its share of the cores as torch threads (OMP_NUM_THREADS sets it), prints its 20 slowest tests and fails over its time budget (tests/time_budget.json).
set -euo pipefail
cd "$(dirname "$0")/.."
user_threads=${OMP_NUM_THREADS:-}
cores=$(OMP_NUM_THREADS='' nproc)
workers() { echo "${LARGEBATCH_TEST_WORKERS:-$((cores < 4 ? cores : 4))}"; }
# torch threads a worker (unless OMP_NUM_THREADS is set): the cores shared out, at least 1. Two
# workers of 2 threads on 2 cores spin in OpenMP's barriers while the other runs: measured on
# tests/test_cli.py + test_resume.py, 1 thread a worker took 0.56x the CPU time of 2.
worker_threads() { local w; w=$(workers); echo "${user_threads:-$((cores / w > 0 ? cores / w : 1))}"; }
export OMP_NUM_THREADS
OMP_NUM_THREADS=$(worker_threads)
export LARGEBATCH_CACHE=${LARGEBATCH_CACHE:-$PWD/.cache/largebatch}
# .venv-xla is set up meanwhile (pip's unpacking waits on the disk more than on the CPU), then
# its tests run beside the main ones, with a worker's threads: one process, mostly on one core,
# where the main run on 2 cores leaves about a sixth idle (tests waiting on ranks, signals and
# SLURM jobs, its last long tests). On a clean clone, 2 cores, one after the other: 35 min.
# Both write logs: the set-up's is shown if it fails, the XLA tests' after the main run's output.
mkdir -p .cache
xla_setup_log=.cache/setup-xla.log xla_tests_log=.cache/tests-xla.log
rm -f "$xla_tests_log"
xla_side() {
  scripts/setup_env.sh xla > "$xla_setup_log" 2>&1 || return 100  # the set-up failed, not a test
  scripts/test_xla.sh > "$xla_tests_log" 2>&1
}
set -m  # the XLA side in its own process group: an interrupted run stops all of it, pytest included
xla_side &
xla=$!
set +m
trap 'kill -- -"$xla" 2> /dev/null || :' EXIT
trap 'exit 130' INT
trap 'exit 143' TERM
scripts/setup_env.sh main
main_status=0
if (($#)); then
  .venv/bin/python -m pytest -q "$@" tests || main_status=$?  # tests/xla skip here, with the reason
else
  # the whole suite on LARGEBATCH_TEST_WORKERS pytest-xdist workers (default: one per core, at
  # most 4; the SLURM tests share one worker, tests/test_slurm.py); its 20 slowest tests, and
  # held to its time budget (tests/time_budget.py)
  LARGEBATCH_TIME_BUDGET=1 .venv/bin/python -m pytest -q --durations=20 -n "$(workers)" --dist loadgroup tests \
    || main_status=$?
fi
xla_status=0
wait "$xla" || xla_status=$?
trap - EXIT INT TERM
if ((xla_status == 100)); then
  cat "$xla_setup_log" >&2
  echo "test.sh: setting up .venv-xla failed (its output is above); scripts/setup_env.sh xla retries it" >&2
  exit 1
fi
echo "--- the XLA tests (.venv-xla, tests/xla), run beside the main tests: scripts/test_xla.sh"
cat "$xla_tests_log"
if ((main_status || xla_status)); then
  echo "test.sh: failed: the main tests exited $main_status, the XLA tests $xla_status (scripts/test_xla.sh reruns them)" >&2
  exit 1
fi
