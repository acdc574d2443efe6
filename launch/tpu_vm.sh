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
#   PYTHON        the interpreter with torch-xla (default: the active virtualenv's, else this
#                 checkout's .venv-xla, else python3 on PATH, whichever has torch_xla and largebatch)
#   PJRT_DEVICE   the PJRT runtime: TPU (default), CPU, CUDA or NEURON (upper case)
#   CPU_NUM_DEVICES  replicas under PJRT_DEVICE=CPU, 1 or more (torch_xla's default 1); more than 8
#                 per core start after a warning line (each gets a sliver of a core)
#   LB_DRY_RUN=1  print the command instead of running it (same as --dry-run)
# Exit code: the XLA launcher's (largebatch.errors); 2 and one line, before anything starts,
#   where no interpreter has torch_xla and largebatch (see PYTHON) or a variable above holds a
#   value it cannot take (PJRT_DEVICE=FOO, CPU_NUM_DEVICES=0).
# A spot/preemptible VM: give run_dir=... resume=auto and start the same command again after
# a preemption; it continues from the last checkpoint. A pod slice: launch/tpu_pod.sh.
set -euo pipefail

if [[ ${1:-} == --dry-run ]]; then
  LB_DRY_RUN=1
  shift
fi

# shellcheck source-path=SCRIPTDIR source=lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

run() {  # run CMD...: replace this shell with CMD, or print it shell-quoted under LB_DRY_RUN=1
  if [[ ${LB_DRY_RUN:-0} == 1 ]]; then
    local line
    printf -v line '%q ' "$@"
    echo "${line% }"
  else
    exec "$@"
  fi
}

check_env "${0##*/}" PJRT_DEVICE CPU_NUM_DEVICES LB_DRY_RUN
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
find_python "${0##*/}" "$root/.venv-xla" "run 'scripts/setup_env.sh xla'" \
  torch torch_xla hydra largebatch

xla_env=(PJRT_DEVICE="${PJRT_DEVICE:-TPU}")
# shown in the dry-run line too: the replicas it starts under PJRT_DEVICE=CPU
if [[ -n ${CPU_NUM_DEVICES:-} ]]; then xla_env+=(CPU_NUM_DEVICES="$CPU_NUM_DEVICES"); fi
run env "${xla_env[@]}" "$python" -m largebatch.launch.xla "$@"
