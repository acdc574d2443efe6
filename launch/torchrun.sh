#!/usr/bin/env bash
# Single-node training under torchrun: one process per GPU (NCCL), or NPROC_PER_NODE gloo
# processes on a CPU machine. Hydra overrides pass through unchanged.
#
#   launch/torchrun.sh optimizer=lars global_batch_size=1024 data=imagenet data.root=/data/imagenet
#   NPROC_PER_NODE=2 launch/torchrun.sh backend=cpu debug=smoke     # 2 gloo ranks on a CPU
#   launch/torchrun.sh --dry-run optimizer=lars                     # print the command only
#
# Reads:
#   NPROC_PER_NODE  processes to start (default: the GPUs in CUDA_VISIBLE_DEVICES, else those
#                   nvidia-smi lists, else 1); torchrun also takes gpu | cpu | auto
#   MAX_RESTARTS    times torchrun restarts the whole group after a failure (default 0); pass
#                   run_dir=... resume=auto so a restart continues from the last checkpoint
#   TORCHRUN        the torchrun command (default: torchrun; e.g. ".venv/bin/torchrun")
#   LB_DRY_RUN=1    print the command instead of running it (same as --dry-run)
# Exit code: the workers' documented code (75 preempted, 2 bad input, 3 non-finite, 74
#   checkpoint write failed), not torchrun's generic 1; torchrun's code if no worker wrote one.
set -euo pipefail

if [[ ${1:-} == --dry-run ]]; then
  LB_DRY_RUN=1
  shift
fi

run() {  # run CMD...: run CMD and exit with the workers' code, or print it under LB_DRY_RUN=1
  if [[ ${LB_DRY_RUN:-0} == 1 ]]; then
    local line
    printf -v line '%q ' "$@"
    echo "${line% }"
    exit 0
  fi
  local rc=0
  LARGEBATCH_EXIT_DIR=${LARGEBATCH_EXIT_DIR:-$(mktemp -d)}
  export LARGEBATCH_EXIT_DIR
  "$@" || rc=$?
  rc=$(worker_exit_code "$LARGEBATCH_EXIT_DIR" "$rc")
  rm -rf "$LARGEBATCH_EXIT_DIR"
  exit "$rc"
}

# worker_exit_code DIR RC: the documented code the workers of the last restart wrote to DIR
# (largebatch/launch/exit_code.py: 2 bad input, 3 non-finite, 74 checkpoint write, 75
# preempted), a rank's own failure preferred over 75/130 (the others were only stopped);
# RC (torchrun's code) when no worker wrote one (a crash, a kill) or all succeeded.
worker_exit_code() {
  local dir=$1 rc=$2 f n code latest=-1 best=""
  if [[ $rc == 0 ]]; then
    echo 0
    return
  fi
  for f in "$dir"/exit-*-*; do
    [[ -f $f ]] || continue
    n=${f##*/exit-}
    n=${n%%-*}
    if (( n > latest )); then latest=$n; fi
  done
  for f in "$dir"/exit-"$latest"-*; do
    [[ -f $f ]] || continue
    read -r code < "$f" || continue
    [[ $code == 0 ]] && continue
    if [[ -z $best || $best == 75 || $best == 130 ]]; then best=$code; fi
  done
  echo "${best:-$rc}"
}

gpu_count() {  # GPUs this node may use: CUDA_VISIBLE_DEVICES, else nvidia-smi, else 0
  if [[ -n ${CUDA_VISIBLE_DEVICES:-} ]]; then
    local ids
    IFS=, read -r -a ids <<< "$CUDA_VISIBLE_DEVICES"
    echo "${#ids[@]}"
  elif command -v nvidia-smi > /dev/null 2>&1; then
    nvidia-smi -L 2> /dev/null | grep -c '^GPU' || true
  else
    echo 0
  fi
}

nproc=${NPROC_PER_NODE:-$(gpu_count)}
[[ $nproc == 0 ]] && nproc=1
read -r -a torchrun <<< "${TORCHRUN:-torchrun}"

run "${torchrun[@]}" --standalone --nproc-per-node="$nproc" --max-restarts="${MAX_RESTARTS:-0}" \
  -m largebatch.train "$@"
