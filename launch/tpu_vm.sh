#!/usr/bin/env bash
# Single-host TPU VM training (e.g. v4-8, v5e-8): run this ON the TPU VM. The XLA launcher
# (python -m largebatch.launch.xla) starts one replica per local TPU chip under PJRT.
# Hydra overrides pass through unchanged.
#
#   scripts/setup_env.sh xla && .venv-xla/bin/pip install -c constraints/xla.txt 'torch-xla[tpu]'
#   launch/tpu_vm.sh optimizer=lars global_batch_size=4096 data=imagenet data.root=/data/imagenet
#   PJRT_DEVICE=CPU launch/tpu_vm.sh debug=smoke      # the same path on a CPU, as a try-out
#
# Reads:
#   PYTHON        the interpreter with torch-xla (default: this checkout's .venv-xla/bin/python
#                 when it exists, else python3)
#   PJRT_DEVICE   the PJRT runtime (default TPU)
#   LB_DRY_RUN=1  print the command instead of running it (same as --dry-run)
# A spot/preemptible VM: give run_dir=... resume=auto and start the same command again after
# a preemption; it continues from the last checkpoint. A pod slice: launch/tpu_pod.sh.
set -euo pipefail

if [[ ${1:-} == --dry-run ]]; then
  LB_DRY_RUN=1
  shift
fi

run() {  # run CMD...: replace this shell with CMD, or print it shell-quoted under LB_DRY_RUN=1
  if [[ ${LB_DRY_RUN:-0} == 1 ]]; then
    local line
    printf -v line '%q ' "$@"
    echo "${line% }"
  else
    exec "$@"
  fi
}

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
python=${PYTHON:-}
if [[ -z $python ]]; then
  python=python3
  [[ -x $root/.venv-xla/bin/python ]] && python=$root/.venv-xla/bin/python
fi

run env PJRT_DEVICE="${PJRT_DEVICE:-TPU}" "$python" -m largebatch.launch.xla "$@"
