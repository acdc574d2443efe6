#!/usr/bin/env bash
# Shared by launch/torchrun.sh and launch/torchrun_multinode.sh (sourced, not run): the run
# wrapper that passes on the workers' documented exit code, and the node's GPU count.
# launch/slurm.sbatch keeps its own copy of worker_exit_code: SLURM runs a copy of the batch
# script from its spool directory, where this file is not next to it.

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
  # A scheduler (SLURM, Kubernetes, kill -- -PGID, Ctrl-C) signals the whole process group,
  # this shell included. Without a trap the shell dies at once (143/130) and the workers'
  # code (75: saved, resumable) is lost. With one, the shell waits for torchrun, which
  # passes the signal to its workers and gives them --shutdown-timeout (default 30 s) to
  # save. A command trap, not '' (ignore): an ignored signal would be ignored by torchrun too.
  trap ':' TERM INT
  "$@" || rc=$?
  trap - TERM INT
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
