#!/usr/bin/env bash
# Single-node training under torchrun: one process per GPU (NCCL), or NPROC_PER_NODE gloo
# processes on a CPU machine. Hydra overrides pass through unchanged.
#
#   launch/torchrun.sh optimizer=lars global_batch_size=1024 data=imagenet data.root=/data/imagenet
#   NPROC_PER_NODE=2 launch/torchrun.sh backend=cpu debug=smoke     # 2 gloo ranks on a CPU
#   launch/torchrun.sh --dry-run optimizer=lars                     # print the command only
#
# Reads:
#   NPROC_PER_NODE  processes to start, 1 or more, or gpu | cpu | auto (torchrun counts them)
#                   (default: the GPUs in CUDA_VISIBLE_DEVICES, counted as CUDA does: up to the first
#                   entry that is not a device, so -1 is none; else those nvidia-smi lists, else 1)
#   LB_OVERSUBSCRIBE=1  start more CPU ranks than 8 per core of a GPU-less node (refused without
#                   it: each rank gets a sliver of a core and their memory can bring on the OOM killer)
#   MAX_RESTARTS    times torchrun restarts the whole group after a failure, 0 or more (default 0); pass
#                   run_dir=... resume=auto so a restart continues from the last checkpoint. A
#                   rank that exits 75 (preempted, saved) is not a failure: the job ends 75
#   PYTHON          the interpreter (default: the active virtualenv's, else this checkout's .venv,
#                   else python3 on PATH, whichever has torch, hydra and largebatch)
#   TORCHRUN        the torchrun command (default: that python -m largebatch.launch.torchrun, torchrun
#                   minus its traceback after the ranks reported; e.g. ".venv/bin/torchrun")
#   LB_DRY_RUN=1    print the command instead of running it (same as --dry-run)
# Exit code: the workers' documented code (75 preempted, 2 bad input, 3 non-finite, 74
#   checkpoint write failed), not torchrun's generic 1; torchrun's code if no worker wrote one.
#   2 and one line, before anything starts, where no interpreter has largebatch (see PYTHON) or
#   a variable above holds a value it cannot take (NPROC_PER_NODE=abc, MAX_RESTARTS=-1). More
#   CPU ranks than twice a GPU-less node's cores start, after a warning line; more than 8 per
#   core only with LB_OVERSUBSCRIBE=1. NNODES, NODE_RANK and RDZV_ENDPOINT are not read (this
#   script starts one node): set, they get a warning line naming launch/torchrun_multinode.sh.
#   A stop before the first step is 75 too; a rank killed by a signal 128 + it (137: SIGKILL).
#   The agent and the ranks end with this script (kill -KILL of its group leaves nothing running).
set -euo pipefail

if [[ ${1:-} == --dry-run ]]; then
  LB_DRY_RUN=1
  shift
fi

# shellcheck source-path=SCRIPTDIR source=lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
under_tini_if_pid1 "$0" "$@"

check_env "${0##*/}" LB_OVERSUBSCRIBE NPROC_PER_NODE MAX_RESTARTS LB_DRY_RUN
ignored=""
for var in NNODES NODE_RANK RDZV_ENDPOINT; do
  if [[ -n ${!var:-} ]]; then ignored+=" $var=${!var}"; fi
done
if [[ -n $ignored ]]; then
  echo "${0##*/}: warning:$ignored ignored: this script starts one node (torchrun --standalone); for several nodes run launch/torchrun_multinode.sh" >&2
fi
nproc=${NPROC_PER_NODE:-$(gpu_count)}
[[ $nproc == 0 ]] && nproc=1  # the default on a node without GPUs (NPROC_PER_NODE=0 is refused)
torchrun_command "${0##*/}" "$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)/.venv"

LB_LOCAL_RANKS=$nproc run "${torchrun[@]}" --standalone --nproc-per-node="$nproc" --max-restarts="${MAX_RESTARTS:-0}" \
  -m largebatch.train "$@"
