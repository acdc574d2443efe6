#!/usr/bin/env bash
# TPU pod-slice training (v4-32, v5p-128, ...): run this on your workstation. gcloud runs the
# XLA launcher (python -m largebatch.launch.xla) on every host of the slice at once
# (--worker=all) with PJRT_DEVICE=TPU; each host starts one replica per local chip and PJRT
# joins all hosts into one job. Hydra overrides pass through unchanged.
#
#   # first time: copy this checkout to every host, set up .venv-xla there, then a smoke run
#   TPU_NAME=my-v4-32 ZONE=us-central2-b LB_TPU_SETUP=1 launch/tpu_pod.sh debug=smoke max_steps=20
#   TPU_NAME=my-v4-32 ZONE=us-central2-b launch/tpu_pod.sh optimizer=lars global_batch_size=32768 \
#       data=imagenet data.root=/mnt/imagenet
#   # after a preemption: the same command with the run directory it printed
#   RUN_DIR=runs/tpu-my-v4-32-20250101-120000 TPU_NAME=my-v4-32 ZONE=us-central2-b launch/tpu_pod.sh ...
#
# Reads:
#   TPU_NAME, ZONE  the TPU VM (required); PROJECT: its gcloud project (default: gcloud's own)
#   REMOTE_DIR      the checkout on every host, relative to the home folder (default largebatch)
#   REMOTE_PYTHON   the interpreter on the hosts, relative to REMOTE_DIR (default .venv-xla/bin/python);
#                   a host without it stops with one line naming it (exit 2): run with LB_TPU_SETUP=1
#   RUN_DIR         the run directory (default runs/tpu-$TPU_NAME-<date-time>, relative to
#                   REMOTE_DIR), passed as run_dir= with resume=auto
#   LB_TPU_SETUP=1  first copy this checkout's HEAD (git archive: commit your changes) to every
#                   host and run scripts/setup_env.sh xla plus torch-xla[tpu] (libtpu) there
#   GCLOUD          the gcloud command (default gcloud)
#   LB_DRY_RUN=1    print the commands instead of running them (same as --dry-run)
# Exit code: gcloud's (the hosts' launcher's); 2 and one line, before anything starts, where
#   TPU_NAME or ZONE is unset, or LB_TPU_SETUP or LB_DRY_RUN is other than 0 or 1.
# Every host reads its own shard of data.root: it must exist on all hosts (a persistent disk
# attached read-only to all, or a gcsfuse mount). Rank 0 (worker 0) writes the run directory;
# put RUN_DIR on a shared mount (Filestore, gcsfuse) to resume after worker 0 is replaced.
set -euo pipefail

if [[ ${1:-} == --dry-run ]]; then
  LB_DRY_RUN=1
  shift
fi

# shellcheck source-path=SCRIPTDIR source=lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

run() {  # run CMD...: run it, or print it shell-quoted under LB_DRY_RUN=1
  if [[ ${LB_DRY_RUN:-0} == 1 ]]; then
    local line
    printf -v line '%q ' "$@"
    echo "${line% }"
  else
    "$@"
  fi
}

# one line and exit 2, as for a bad value (bash's ${VAR:?} exits 1 naming a script line)
if [[ -z ${TPU_NAME:-} ]]; then
  echo "tpu_pod.sh: TPU_NAME is not set: set it to the TPU VM's name (gcloud compute tpus tpu-vm list)" >&2
  exit 2
fi
if [[ -z ${ZONE:-} ]]; then
  echo "tpu_pod.sh: ZONE is not set: set it to the TPU VM's zone (e.g. us-central2-b)" >&2
  exit 2
fi
check_env tpu_pod.sh LB_TPU_SETUP LB_DRY_RUN
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
remote_dir=${REMOTE_DIR:-largebatch}
run_dir=${RUN_DIR:-runs/tpu-$TPU_NAME-$(date +%Y%m%d-%H%M%S)}
read -r -a gcloud <<< "${GCLOUD:-gcloud}"
tpu=("${gcloud[@]}" compute tpus tpu-vm)
where=(--zone="$ZONE" --worker=all)
[[ -n ${PROJECT:-} ]] && where+=(--project="$PROJECT")

if [[ ${LB_TPU_SETUP:-0} == 1 ]]; then
  tarball=${TMPDIR:-/tmp}/largebatch-$TPU_NAME.tar.gz
  run git -C "$root" archive --format=tar.gz -o "$tarball" HEAD
  run "${tpu[@]}" scp "$tarball" "$TPU_NAME:largebatch.tar.gz" "${where[@]}"
  printf -v setup 'mkdir -p %q && tar -xzf largebatch.tar.gz -C %q && cd %q' \
    "$remote_dir" "$remote_dir" "$remote_dir"
  setup+=" && scripts/setup_env.sh xla"
  setup+=" && .venv-xla/bin/pip install -q -c constraints/xla.txt 'torch-xla[tpu]'"
  run "${tpu[@]}" ssh "$TPU_NAME" "${where[@]}" --command="$setup"
fi

printf -v overrides ' %q' "run_dir=$run_dir" resume=auto "$@"
# a host without the checkout or its interpreter says so in one line (exit 2), not bash's
# "No such file" or a ModuleNotFoundError traceback per host
remote_python=${REMOTE_PYTHON:-.venv-xla/bin/python}
shown=$remote_python
[[ $shown == /* ]] || shown=$remote_dir/$shown
# shellcheck disable=SC2016  # $(hostname) expands on each host
printf -v remote 'cd %q 2> /dev/null && [ -x %q ] || { echo "tpu_pod.sh: $(hostname) has no %q: run once with LB_TPU_SETUP=1 (or set REMOTE_DIR, REMOTE_PYTHON)" >&2 && exit 2; }; PJRT_DEVICE=TPU %q -m largebatch.launch.xla' \
  "$remote_dir" "$remote_python" "$shown" "$remote_python"
echo "run_dir=$run_dir (on worker 0; relative to ~/$remote_dir)" >&2
run "${tpu[@]}" ssh "$TPU_NAME" "${where[@]}" --command="$remote$overrides"
