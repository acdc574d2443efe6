#!/usr/bin/env bash
# Shared by launch/torchrun.sh and launch/torchrun_multinode.sh (sourced, not run): the run
# wrapper that passes on the workers' documented exit code, the interpreter to run (also for
# launch/tpu_vm.sh), the check of the variables they read, and the node's GPU count.
# launch/slurm.sbatch keeps its own copy of worker_exit_code: SLURM runs a copy of the batch
# script from its spool directory, where this file is not next to it.

run() {  # run CMD...: run CMD and exit with the workers' code, or print it under LB_DRY_RUN=1
  if [[ ${LB_DRY_RUN:-0} == 1 ]]; then
    local line
    printf -v line '%q ' "$@"
    echo "${line% }"
    exit 0
  fi
  local rc=0 child="" pending="" stopping=""
  LARGEBATCH_EXIT_DIR=${LARGEBATCH_EXIT_DIR:-$(mktemp -d)}
  # the ranks write their code and line there; this script prints the line once (not each rank)
  LARGEBATCH_LINE_BY_LAUNCHER=1
  # the launcher (python3 -m largebatch.launch.torchrun) ends with this shell (PR_SET_PDEATHSIG):
  # a kill -KILL of the launch's group must not leave it and its ranks training unsupervised
  LARGEBATCH_LAUNCHER_PID=$$
  export LARGEBATCH_EXIT_DIR LARGEBATCH_LINE_BY_LAUNCHER LARGEBATCH_LAUNCHER_PID
  # A stop signal reaches this shell alone (docker stop and Kubernetes signal PID 1, tini
  # its child) or its whole group (SLURM, kill -- -PGID, Ctrl-C). Either way the launcher
  # must get it exactly once: torchrun passes the first one on to its workers and gives them
  # --shutdown-timeout (default 30 s) to save; its handler raises on every signal, so a
  # second one arriving during that wait would end it (torch's elastic/multiprocessing/api.py)
  # before the workers wrote their code (75: saved, resumable). So the
  # launcher runs in a process group of its own (set -m), this shell forwards TERM, INT and
  # HUP to it, and waits until it has ended. Without the trap the shell would die at once
  # (143/130); with a foreground command it would wait but never pass the signal on.
  trap '_forward TERM' TERM
  trap '_forward INT' INT
  trap '_forward HUP' HUP
  set -m
  "$@" &
  child=$!
  set +m
  if [[ -n $pending ]]; then _forward "$pending"; fi
  # wait returns 128+N when a trapped signal interrupts it; the launcher is still saving.
  # Once a stop signal was passed on, every local rank that has saved and written its code
  # ends the wait: torchrun's agent then still takes seconds to print its SignalException
  # traceback and exit, which is past docker stop's 10 s grace (exit 137 although every rank
  # had saved). The agent is ended then (its ranks are done) and the ranks' code is used.
  while kill -0 "$child" 2> /dev/null; do
    if [[ -z $stopping ]]; then
      wait "$child" 2> /dev/null || :  # 2>: not bash's "Killed" job notice (a SIGKILLed agent)
    elif ranks_reported "$LARGEBATCH_EXIT_DIR" "${LB_LOCAL_RANKS:-0}"; then
      kill -s KILL -- "-$child" 2> /dev/null || kill -s KILL "$child" 2> /dev/null || :
      break
    else
      sleep 0.2
    fi
  done
  # its own exit status (bash keeps it for a second wait); 2>: not bash's "Killed" job notice
  wait "$child" 2> /dev/null || rc=$?
  # The launcher died of a signal nobody sent through this shell (SIGKILL of torchrun's agent,
  # the OOM killer): its ranks end with it (PR_SET_PDEATHSIG: a stop, a checkpoint, exit 75) but
  # are still saving. Without this wait the job ended 137 with no line while the ranks went on
  # to print a summary that read like a finished run; now it ends with their code and line.
  if [[ -z $stopping ]] && (( rc > 128 && ${LB_LOCAL_RANKS:-0} > 0 )); then
    local waited=0
    until ranks_reported "$LARGEBATCH_EXIT_DIR" "$LB_LOCAL_RANKS" || (( waited >= 600 )); do
      sleep 0.1  # at most 60 s: a step, a checkpoint and torchrun's shutdown timeout (30 s)
      waited=$((waited + 1))
    done
  fi
  trap - TERM INT HUP
  rc=$(worker_exit_code "$LARGEBATCH_EXIT_DIR" "$rc")
  # the ranks left their one line to this script (LARGEBATCH_LINE_BY_LAUNCHER): print it once,
  # last (after torchrun's own report where TORCHRUN is plain torchrun), so the last line the
  # user sees says what went wrong and what to do
  worker_error_line "$LARGEBATCH_EXIT_DIR" "$rc" >&2
  rm -rf "$LARGEBATCH_EXIT_DIR"
  exit "$rc"
}

# worker_exit_code DIR RC: the documented code the workers of the last restart wrote to DIR
# (largebatch/launch/exit_code.py: 2 bad input, 3 non-finite, 74 checkpoint write, 75
# preempted), a rank's own failure preferred over 75/130 (the others were only stopped);
# RC (torchrun's code) when no worker wrote one (a crash, a kill) or all succeeded.
worker_exit_code() {
  local dir=$1 rc=$2 f code latest best=""
  if [[ $rc == 0 ]]; then
    echo 0
    return
  fi
  latest=$(latest_restart "$dir")
  for f in "$dir"/exit-"$latest"-*; do
    [[ -f $f ]] || continue
    read -r code < "$f" || continue
    [[ $code == 0 ]] && continue
    if [[ -z $best || $best == 75 || $best == 130 ]]; then best=$code; fi
  done
  echo "${best:-$rc}"
}

# worker_error_line DIR RC: the one error line (second line of an exit file of the last
# restart) of the lowest rank that exited with RC; nothing when none wrote one
worker_error_line() {
  local dir=$1 rc=$2 f n latest code line best_rank="" best_line=""
  [[ $rc == 0 ]] && return 0
  latest=$(latest_restart "$dir")
  for f in "$dir"/exit-"$latest"-*; do
    [[ -f $f ]] || continue
    { read -r code && read -r line; } < "$f" || continue
    [[ $code == "$rc" && -n $line ]] || continue
    n=${f##*-}
    if [[ -z $best_rank ]] || (( n < best_rank )); then best_rank=$n; best_line=$line; fi
  done
  if [[ -n $best_line ]]; then printf '%s\n' "$best_line"; fi
  return 0
}

# ranks_reported DIR N: N > 0 ranks of the last restart have written their exit code to DIR
ranks_reported() {
  local dir=$1 want=$2 f count=0
  (( want > 0 )) || return 1
  for f in "$dir"/exit-"$(latest_restart "$dir")"-*; do
    if [[ -s $f ]]; then count=$((count + 1)); fi
  done
  (( count >= want ))
}

# latest_restart DIR: the highest torchrun restart count among DIR's exit-<restart>-<rank>
# files (-1 when there are none)
latest_restart() {
  local f n latest=-1
  for f in "$1"/exit-*-*; do
    [[ -f $f ]] || continue
    n=${f##*/exit-}
    n=${n%%-*}
    if (( n > latest )); then latest=$n; fi
  done
  echo "$latest"
}

_forward() {  # _forward SIG: pass SIG on to run's launcher ($child), or keep it until it starts
  stopping=1
  if [[ -n ${child:-} ]]; then
    kill -s "$1" "$child" 2> /dev/null || :
  else
    pending=$1
  fi
}

under_tini_if_pid1() {  # under_tini_if_pid1 "$0" "$@": as a container's PID 1, start again under tini
  # PID 1 drops every signal it has no handler for and must reap orphans; tini does both
  # and passes docker stop's SIGTERM on to this script, which forwards it (run, above).
  if [[ $$ == 1 ]] && command -v tini > /dev/null 2>&1; then
    LB_DRY_RUN=${LB_DRY_RUN:-0} exec tini -- "$@"
  fi
}

# find_python NAME VENV HOW MODULE...: set python to the interpreter the script runs: $PYTHON
# when set, else the first of the active virtualenv's ($VIRTUAL_ENV), the checkout's own VENV
# and python3 on PATH (a container's) that finds every MODULE. Without one: one line on stderr,
# NAME's, naming HOW (the command that sets VENV up) and PYTHON=, and exit 2, never a
# ModuleNotFoundError traceback from every rank. A PYTHON that lacks a MODULE is refused, not
# passed over.
# Written in launch/lib.sh, copied into launch/slurm.sbatch (which SLURM runs from its spool
# folder, away from lib.sh); tests/test_launch_env.py holds the copies equal.
find_python() {
  local name=$1 venv=$2 how=$3 candidate missing
  shift 3
  # find_spec, not import: milliseconds, no torch start-up; prints what is missing
  local check='import importlib.util as u, sys
missing = [m for m in sys.argv[1:] if u.find_spec(m) is None]
print(", ".join(missing))
sys.exit(1 if missing else 0)'
  if [[ -n ${PYTHON:-} ]]; then
    if missing=$("$PYTHON" -c "$check" "$@" 2> /dev/null); then
      python=$PYTHON
      return 0
    fi
    if [[ -n $missing ]]; then missing="has no $missing"; else missing="does not run"; fi
    echo "$name: PYTHON=$PYTHON $missing: set PYTHON to an interpreter with largebatch, or unset it to use $venv ($how to set it up)" >&2
    exit 2
  fi
  for candidate in ${VIRTUAL_ENV:+"$VIRTUAL_ENV/bin/python"} "$venv/bin/python" "$(command -v python3 || :)"; do
    [[ -n $candidate && -x $candidate ]] || continue
    if "$candidate" -c "$check" "$@" > /dev/null 2>&1; then
      python=$candidate
      return 0
    fi
  done
  printf -v missing '%s, ' "$@"
  echo "$name: no Python environment with ${missing%, } found (${VIRTUAL_ENV:+VIRTUAL_ENV=$VIRTUAL_ENV, }$venv, python3 on PATH): $how to set up $venv, or set PYTHON=/path/to/python" >&2
  exit 2
}

# torchrun_command NAME VENV: set the array torchrun to $TORCHRUN's words, else to this
# environment's python (find_python) -m largebatch.launch.torchrun
torchrun_command() {
  if [[ -n ${TORCHRUN:-} ]]; then
    read -r -a torchrun <<< "$TORCHRUN"
  else
    find_python "$1" "$2" "run 'make env'" torch hydra largebatch
    # shellcheck disable=SC2034  # the caller's command line
    torchrun=("$python" -m largebatch.launch.torchrun)
  fi
}

# check_env NAME VAR...: refuse, before anything starts, a set VAR whose value the wrappers,
# torchrun or torch_xla cannot use (torchrun ended in a traceback, or in its usage text naming
# its own flag, or changed it silently: NPROC_PER_NODE=0 became 1 rank; torch_xla in KeyError
# or a broken process pool; LB_DRY_RUN=yes ran for real): one line on stderr, NAME's, naming
# the variable and what it accepts, and exit 2. More CPU ranks than twice a GPU-less node's
# cores get a warning line: each rank gets a sliver of a core, and a stop takes minutes; more
# than 8 per core are refused unless LB_OVERSUBSCRIBE=1 (99 ranks on 2 cores once brought the
# kernel's OOM killer onto another job). XLA:CPU devices (threads) get the warning above 8 per
# core. NODE_RANK must be below a fixed NNODES. The cores are the ones this process may run on
# (nproc without OMP_NUM_THREADS, which nproc would report instead).
# Written in launch/lib.sh, copied into launch/slurm.sbatch (with gpu_count); tests/test_launch_env.py
# holds the copies equal.
check_env() {
  local name=$1 var value what want cores
  local count='[1-9][0-9]{0,5}'  # 1 .. 999999: bash arithmetic stays exact
  shift
  for var in "$@"; do
    value=${!var:-}
    [[ -n $value ]] || continue
    what="" want=""
    case $var in
      NPROC_PER_NODE)
        if [[ ! $value =~ ^($count|gpu|cpu|auto)$ ]]; then
          what="is not a number of processes" want="1 or more, or to gpu, cpu or auto"
        elif [[ $value == gpu ]] && (( $(gpu_count) == 0 )); then
          what="finds no GPU on this node" want="a number of processes, or to cpu or auto"
        elif [[ $value =~ ^$count$ ]] && (( $(gpu_count) == 0 )); then
          cores=$(env -u OMP_NUM_THREADS -u OMP_THREAD_LIMIT nproc 2> /dev/null || getconf _NPROCESSORS_ONLN)
          if (( value > 8 * cores )) && [[ ${LB_OVERSUBSCRIBE:-0} != 1 ]]; then
            what="would start $value CPU ranks on $cores cores, more than 8 per core"
            want="$cores or fewer, or set LB_OVERSUBSCRIBE=1 to start them anyway"
          elif (( value > 2 * cores )); then
            echo "$name: warning: NPROC_PER_NODE=$value starts $value CPU ranks on $cores cores: each gets a sliver of a core and a stop takes minutes; $cores or fewer suit this node" >&2
          fi
        fi ;;
      MAX_RESTARTS)
        [[ $value =~ ^(0|$count)$ ]] || what="is not a number of restarts" want="0 (none) or more" ;;
      NNODES)
        if [[ ! $value =~ ^($count)(:($count))?$ ]]; then
          what="is not a number of nodes" want="N (1 or more), or to MIN:MAX for an elastic job (e.g. 2:4)"
        elif (( BASH_REMATCH[1] > ${BASH_REMATCH[3]:-BASH_REMATCH[1]} )); then
          what="has MIN above MAX" want="MIN:MAX with MIN <= MAX (e.g. 2:4)"
        fi ;;
      NODE_RANK)
        if [[ ! $value =~ ^(0|$count)$ ]]; then
          what="is not a node rank" want="0 or more (or unset it: c10d numbers the nodes)"
        elif [[ ${NNODES:-} =~ ^$count$ ]] && (( value >= NNODES )); then
          what="is not below NNODES=$NNODES" want="0-$((NNODES - 1)) (or unset it: c10d numbers the nodes)"
        fi ;;
      RDZV_ENDPOINT)
        if [[ ! $value =~ ^(\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9._-]+)(:($count))?$ ]] || (( ${BASH_REMATCH[3]:-1} > 65535 )); then
          what="is not host:port" want="a host every node can reach and a port 1-65535 (e.g. node0:29500)"
        fi ;;
      RDZV_PORT)
        [[ $value =~ ^$count$ ]] && (( value <= 65535 )) || what="is not a port" want="1-65535" ;;
      PJRT_DEVICE)  # torch_xla reads the part before any "_" (TPU_C_API)
        [[ ${value%%_*} =~ ^(TPU|CPU|CUDA|NEURON)$ ]] ||
          what="is not a PJRT runtime" want="TPU, CPU, CUDA or NEURON (upper case)" ;;
      CPU_NUM_DEVICES)
        if [[ ! $value =~ ^$count$ ]]; then
          what="is not a number of XLA:CPU devices" want="1 or more"
        elif [[ ${PJRT_DEVICE:-} == CPU* ]]; then  # read under PJRT_DEVICE=CPU only
          cores=$(env -u OMP_NUM_THREADS -u OMP_THREAD_LIMIT nproc 2> /dev/null || getconf _NPROCESSORS_ONLN)
          if (( value > 8 * cores )); then
            echo "$name: warning: CPU_NUM_DEVICES=$value starts $value XLA:CPU devices on $cores cores: each gets a sliver of a core, and XLA:CPU aborts a collective that not all of them reach within 10 s; $cores or fewer suit this node" >&2
          fi
        fi ;;
      LB_SRUN)
        [[ $value =~ ^(auto|0|1)$ ]] ||
          what="is not auto, 0 or 1" want="auto, 1 (always srun) or 0 (never: one node only)" ;;
      LB_DRY_RUN | LB_REQUEUE | LB_TPU_SETUP | LB_OVERSUBSCRIBE)
        [[ $value == [01] ]] || what="is not 0 or 1" want="1 (on) or 0 (off)" ;;
    esac
    if [[ -n $what ]]; then
      echo "$name: $var=$value $what: set it to $want" >&2
      exit 2
    fi
  done
}

gpu_count() {  # GPUs this node may use: CUDA_VISIBLE_DEVICES, else nvidia-smi, else 0
  # CUDA's rule: the devices listed up to the first entry that is not one (-1, an empty entry,
  # anything but an index or a GPU-/MIG- UUID), so "-1" and "" hide every GPU, "0,-1,1" shows one
  if [[ -n ${CUDA_VISIBLE_DEVICES+set} ]]; then
    local id ids visible=0
    IFS=, read -r -a ids <<< "$CUDA_VISIBLE_DEVICES"
    for id in "${ids[@]}"; do
      [[ $id =~ ^([0-9]+|(GPU|MIG)-[^[:space:]]+)$ ]] || break
      visible=$((visible + 1))
    done
    echo "$visible"
  elif command -v nvidia-smi > /dev/null 2>&1; then
    nvidia-smi -L 2> /dev/null | grep -c '^GPU' || true
  else
    echo 0
  fi
}
