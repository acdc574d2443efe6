#!/usr/bin/env bash
# Multi-node training under torchrun with the c10d rendezvous: run this same command on every
# node (any order); the nodes meet at RDZV_ENDPOINT, a host:port on one of them (the node whose
# address it names hosts the rendezvous store). Hydra overrides pass through unchanged and must
# be the same on every node.
#
#   # on each of 4 nodes (8 GPUs each), node0 being the rendezvous host:
#   NNODES=4 RDZV_ENDPOINT=node0:29500 launch/torchrun_multinode.sh \
#       run_dir=/shared/runs/rn50-8k resume=auto experiment=goyal2017_rn50_8k data.root=/data/imagenet
#   # elastic: start with 2 to 4 nodes, restart the group (from the last checkpoint) up to 3 times
#   NNODES=2:4 MAX_RESTARTS=3 RDZV_ENDPOINT=node0:29500 launch/torchrun_multinode.sh run_dir=... resume=auto
#
# Reads:
#   RDZV_ENDPOINT   host:port of the rendezvous, port 1-65535 (required unless NNODES=1)
#   NNODES          number of nodes, 1 or more, or MIN:MAX for an elastic job (default 1)
#   NODE_RANK       this node's rank, 0 to NNODES - 1 (optional: c10d assigns ranks in join order; pass
#                   it to keep SLURM/scheduler node numbers, it is only a hint)
#   NPROC_PER_NODE  processes per node, 1 or more, or gpu | cpu | auto (default: the GPUs in
#                   CUDA_VISIBLE_DEVICES, counted as CUDA does: up to the first entry that is not a
#                   device, so -1 is none; else those nvidia-smi lists, else 1)
#   LB_OVERSUBSCRIBE=1  start more CPU ranks than 8 per core of a GPU-less node (refused without
#                   it: each rank gets a sliver of a core and their memory can bring on the OOM killer)
#   RDZV_ID         job id shared by the nodes of one job (default: largebatch)
#   MAX_RESTARTS    group restarts after a failure or a membership change, 0 or more (default 0); a rank
#                   that exits 75 (preempted, saved) is not a failure: the job ends 75
#   PYTHON          the interpreter (default: the active virtualenv's, else this checkout's .venv,
#                   else python3 on PATH, whichever has torch, hydra and largebatch)
#   TORCHRUN        the torchrun command (default: that python -m largebatch.launch.torchrun, torchrun
#                   minus its traceback after the ranks reported)
#   LB_DRY_RUN=1    print the command instead of running it (same as --dry-run)
# Exit code: the workers' documented code (75 preempted, 2 bad input, 3 non-finite, 74
#   checkpoint write failed), not torchrun's generic 1; torchrun's code if no worker wrote one.
#   2 and one line, before anything starts, where no interpreter has largebatch (see PYTHON) or
#   a variable above holds a value it cannot take (NPROC_PER_NODE=abc, MAX_RESTARTS=-1, NODE_RANK=4
#   with NNODES=4). More CPU ranks than twice a GPU-less node's cores start, after a warning
#   line; more than 8 per core only with LB_OVERSUBSCRIBE=1.
# With MAX_RESTARTS > 0 give a fixed run_dir= and resume=auto (on a filesystem every node
# sees): a restarted group then continues from the last checkpoint instead of a new run.
# global_batch_size must divide by every world size an elastic job can reach.
# NCCL settings (NCCL_SOCKET_IFNAME, NCCL_IB_HCA, ...): see launch/slurm.sbatch.
set -euo pipefail

if [[ ${1:-} == --dry-run ]]; then
  LB_DRY_RUN=1
  shift
fi

# shellcheck source-path=SCRIPTDIR source=lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
under_tini_if_pid1 "$0" "$@"

check_env "${0##*/}" NNODES NODE_RANK LB_OVERSUBSCRIBE NPROC_PER_NODE RDZV_ENDPOINT MAX_RESTARTS LB_DRY_RUN
nnodes=${NNODES:-1}
if [[ -z ${RDZV_ENDPOINT:-} ]]; then
  if [[ $nnodes != 1 ]]; then
    echo "$0: set RDZV_ENDPOINT=host:port (a node every node can reach) for NNODES=$nnodes" >&2
    exit 2
  fi
  RDZV_ENDPOINT=127.0.0.1:29500
fi
nproc=${NPROC_PER_NODE:-$(gpu_count)}
[[ $nproc == 0 ]] && nproc=1  # the default on a node without GPUs (NPROC_PER_NODE=0 is refused)
torchrun_command "${0##*/}" "$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)/.venv"

args=(--nnodes="$nnodes" --nproc-per-node="$nproc")
[[ -n ${NODE_RANK:-} ]] && args+=(--node-rank="$NODE_RANK")
args+=(
  --rdzv-backend=c10d --rdzv-endpoint="$RDZV_ENDPOINT" --rdzv-id="${RDZV_ID:-largebatch}"
  --max-restarts="${MAX_RESTARTS:-0}"
)
LB_LOCAL_RANKS=$nproc run "${torchrun[@]}" "${args[@]}" -m largebatch.train "$@"
