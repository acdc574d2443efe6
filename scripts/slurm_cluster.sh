#!/usr/bin/env bash
# A one-node SLURM cluster on this machine, for tests/test_slurm.py and for trying
# launch/slurm.sbatch: munged, slurmctld and slurmd started directly (no systemd, so it works
# as root in a container) from tests/fixtures/slurm/slurm.conf, state under $LB_SLURM_DIR.
#
#   scripts/slurm_cluster.sh [--install] start   # prints the SLURM_CONF line to export
#   scripts/slurm_cluster.sh status              # 0 when the node is up (idle, mixed or allocated)
#   scripts/slurm_cluster.sh stop
#   export SLURM_CONF=$(scripts/slurm_cluster.sh conf)   # then sinfo, sbatch, squeue, scancel
#
# --install: apt-get install slurm-wlm munge first (Debian/Ubuntu; root). Without it nothing is
#   installed, and a missing daemon is an error that says so.
# Reads: LB_SLURM_DIR (default /var/tmp/largebatch-slurm), LB_SLURM_CPUS (default 16: the CPUs
#   the node declares, whatever the machine has, so that tests/test_slurm.py's jobs run side by
#   side; it needs 15 or more), LB_SLURM_WAIT_S (default 90: how long start waits for sinfo to
#   show the node).
# Three partitions: main (default), low and high; a high job preempts low jobs (REQUEUE,
# GraceTime=60), never main ones.
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
dir=${LB_SLURM_DIR:-/var/tmp/largebatch-slurm}
conf=$dir/slurm.conf
export SLURM_CONF=$conf

die() { echo "$0: $*" >&2; exit 1; }

install_packages() {
  [[ $(id -u) == 0 ]] || die "--install runs apt-get and needs root"
  DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends slurm-wlm munge
}

need() {
  local tool
  for tool in "$@"; do
    command -v "$tool" > /dev/null 2>&1 || [[ -x /usr/sbin/$tool ]] ||
      die "$tool is not installed (apt-get install slurm-wlm munge, or pass --install)"
  done
}

sbin() { if command -v "$1" > /dev/null 2>&1; then command -v "$1"; else echo "/usr/sbin/$1"; fi; }

node_state() { sinfo --noheader --nodes=localhost --format=%t 2> /dev/null | head -n 1; }

start_munge() {
  if munge -n < /dev/null 2> /dev/null | unmunge > /dev/null 2>&1; then
    return  # already running
  fi
  if [[ ! -s /etc/munge/munge.key ]]; then
    mkdir -p /etc/munge
    "$(sbin mungekey)" --create --keyfile=/etc/munge/munge.key
  fi
  local user=root
  id munge > /dev/null 2>&1 && user=munge
  mkdir -p /run/munge /var/lib/munge /var/log/munge
  chown "$user" /etc/munge/munge.key /run/munge /var/lib/munge /var/log/munge
  chmod 0400 /etc/munge/munge.key
  chmod 0755 /run/munge
  if [[ $user == root ]]; then
    "$(sbin munged)" --force
  else
    runuser -u munge -- "$(sbin munged)"
  fi
}

write_conf() {
  mkdir -p "$dir/state" "$dir/spool"
  sed -e "s|@DIR@|$dir|g" -e "s|@CPUS@|${LB_SLURM_CPUS:-16}|g" -e "s|@USER@|$(id -un)|g" \
    "$root/tests/fixtures/slurm/slurm.conf" > "$conf"
}

daemon_alive() { [[ -s $1 ]] && kill -0 "$(cat "$1")" 2> /dev/null; }

start() {
  need sinfo sbatch munged slurmctld slurmd
  start_munge
  write_conf
  # -c: a clean start (no jobs left from an earlier cluster); -N: this node's name in the conf
  daemon_alive "$dir/slurmctld.pid" || "$(sbin slurmctld)" -c -f "$conf"
  daemon_alive "$dir/slurmd.pid" || "$(sbin slurmd)" -N localhost -f "$conf"
  local waited=0 state
  until state=$(node_state) && [[ $state =~ ^(idle|mix|alloc) ]]; do
    if (( waited >= ${LB_SLURM_WAIT_S:-90} )); then
      die "node not up after ${waited}s (state: ${state:-none}); see $dir/slurmctld.log and $dir/slurmd.log"
    fi
    if [[ $state =~ ^(down|drain) ]]; then
      scontrol update nodename=localhost state=resume > /dev/null 2>&1 || true
    fi
    sleep 1
    waited=$((waited + 1))
  done
  echo "export SLURM_CONF=$conf  # node localhost is $state after ${waited}s"
}

stop() {
  local pidfile pid
  for pidfile in "$dir/slurmd.pid" "$dir/slurmctld.pid"; do
    if daemon_alive "$pidfile"; then
      pid=$(cat "$pidfile")
      kill "$pid"
      while kill -0 "$pid" 2> /dev/null; do sleep 0.2; done
    fi
  done
}

status() {
  local state
  state=$(node_state) || true
  echo "node localhost: ${state:-not answering} (SLURM_CONF=$conf)"
  [[ $state =~ ^(idle|mix|alloc) ]]
}

if [[ ${1:-} == --install ]]; then
  install_packages
  shift
fi
case ${1:-} in
  start) start ;;
  stop) stop ;;
  status) status ;;
  conf) echo "$conf" ;;
  *) die "usage: $0 [--install] start|stop|status|conf" ;;
esac
