#!/usr/bin/env bash
# A one-node Slurm cluster on this machine, for the tests of `--executor slurm` (tests/test_executor_slurm.py):
# Debian's slurm-wlm and munge (installed with apt-get when absent), munged, slurmctld and slurmd run as
# root without systemd, one partition `debug` holding this node.
#
#   bash scripts/dev/slurm_cluster.sh start    # install if needed, start, wait until the node is idle
#   bash scripts/dev/slurm_cluster.sh stop     # stop what start started (by pid file), remove its slurm.conf
#   bash scripts/dev/slurm_cluster.sh status   # sinfo and squeue
#
# Needs root (it writes /etc/slurm/slurm.conf, which sbatch and sinfo read). The daemons' state, logs and
# pid files live in $SLURM_CLUSTER_DIR (default /tmp/cs336-slurm). A slurm.conf this script did not
# write is never replaced. No accounting store: `sacct` fails here, so a job's end state comes from
# `scontrol show job` (kept MinJobAge seconds) and the job's log, as the harness reads them.
set -euo pipefail
dir=${SLURM_CLUSTER_DIR:-/tmp/cs336-slurm}
conf=/etc/slurm/slurm.conf
mark="# written by cs336-bench scripts/dev/slurm_cluster.sh"

die() {
  echo "slurm_cluster.sh: error: $*" >&2
  exit 2
}

install_packages() {
  if command -v sbatch >/dev/null && [ -x /usr/sbin/slurmctld ] && [ -x /usr/sbin/slurmd ] && [ -x /usr/sbin/munged ]; then
    return
  fi
  echo "installing slurm-wlm and munge (apt-get, about a minute)" >&2
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq >/dev/null
  apt-get install -y -qq slurm-wlm munge >/dev/null
}

start_munge() {
  if munge -n 2>/dev/null | unmunge >/dev/null 2>&1; then
    return  # a munged already answers (ours from an earlier start, or the machine's own)
  fi
  if [ ! -s /etc/munge/munge.key ]; then
    dd if=/dev/urandom bs=1 count=1024 of=/etc/munge/munge.key status=none
  fi
  chown munge:munge /etc/munge/munge.key
  chmod 400 /etc/munge/munge.key
  mkdir -p /run/munge /var/log/munge /var/lib/munge
  chown munge:munge /run/munge /var/log/munge /var/lib/munge
  runuser -u munge -- /usr/sbin/munged
  touch "$dir/munged.ours"
  for _ in $(seq 50); do
    munge -n 2>/dev/null | unmunge >/dev/null 2>&1 && return
    sleep 0.1
  done
  die "munged started but does not answer (munge -n | unmunge)"
}

write_conf() {
  if [ -e "$conf" ] && ! grep -qF "$mark" "$conf"; then
    die "$conf exists and was not written by this script; not replacing it"
  fi
  local host cpus mem slots
  host=$(hostname -s)
  cpus=$(nproc)
  mem=$(/usr/sbin/slurmd -C | head -1 | sed -n 's/.*RealMemory=\([0-9]*\).*/\1/p')
  # job slots: twice the cores, at least 4 (config_overrides: slurmd takes them as configured), so that a
  # test's job that only sleeps (one waiting for its time limit) does not hold back the others
  slots=$((2 * cpus > 4 ? 2 * cpus : 4))
  mkdir -p /etc/slurm "$dir/state" "$dir/spool"
  cat >"$conf" <<EOF
$mark
ClusterName=ci
SlurmctldHost=$host
SlurmUser=root
SlurmdUser=root
StateSaveLocation=$dir/state
SlurmdSpoolDir=$dir/spool
SlurmctldPidFile=$dir/slurmctld.pid
SlurmdPidFile=$dir/slurmd.pid
SlurmctldLogFile=$dir/slurmctld.log
SlurmdLogFile=$dir/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
ReturnToService=2
# a cancelled or timed-out job gets SIGKILL this many seconds after SIGTERM (default 30)
KillWait=5
# ended jobs stay visible to scontrol this long (the default)
MinJobAge=300
SlurmdParameters=config_overrides
NodeName=$host CPUs=$slots RealMemory=$mem State=UNKNOWN
PartitionName=debug Nodes=$host Default=YES MaxTime=INFINITE State=UP
EOF
}

running() { # pid file
  [ -s "$1" ] && kill -0 "$(cat "$1")" 2>/dev/null
}

start() {
  [ "$(id -u)" -eq 0 ] || die "run as root (it installs packages, writes $conf and starts daemons as root)"
  mkdir -p "$dir"
  install_packages
  start_munge
  write_conf
  running "$dir/slurmctld.pid" || /usr/sbin/slurmctld
  running "$dir/slurmd.pid" || /usr/sbin/slurmd
  for _ in $(seq 60); do
    state=$(sinfo -h -o %T 2>/dev/null | head -1 || true)
    if [ "$state" = idle ] || [ "$state" = mixed ] || [ "$state" = allocated ]; then
      echo "slurm: partition debug on $(hostname -s) is $state (logs in $dir)" >&2
      return
    fi
    sleep 0.5
  done
  die "the node did not come up within 30 s (sinfo: ${state:-no answer}); see $dir/slurmctld.log and $dir/slurmd.log"
}

stop_daemon() { # name pid-file
  local pid
  running "$2" || return 0
  pid=$(cat "$2")
  kill "$pid"
  for _ in $(seq 100); do
    kill -0 "$pid" 2>/dev/null || return 0
    sleep 0.1
  done
  kill -9 "$pid" 2>/dev/null || true
  echo "slurm_cluster.sh: $1 (pid $pid) did not stop within 10 s: killed" >&2
}

stop() {
  stop_daemon slurmd "$dir/slurmd.pid"
  stop_daemon slurmctld "$dir/slurmctld.pid"
  if [ -e "$dir/munged.ours" ]; then
    stop_daemon munged /run/munge/munged.pid
    rm -f "$dir/munged.ours"
  fi
  if [ -e "$conf" ] && grep -qF "$mark" "$conf"; then
    rm -f "$conf"
  fi
  echo "slurm: stopped" >&2
}

case "${1:-}" in
start) start ;;
stop) stop ;;
status)
  sinfo
  squeue
  ;;
*) die "usage: slurm_cluster.sh start|stop|status" ;;
esac
