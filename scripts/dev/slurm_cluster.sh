#!/usr/bin/env bash
# A Slurm cluster on this machine, for the tests of `--executor slurm` (tests/test_executor_slurm.py) and of
# multi-node jobs (tests/test_multinode.py): Debian's slurm-wlm and munge (installed with apt-get when absent),
# munged, slurmctld and slurmd run as root without systemd, one partition `debug` holding this node. With
# --nodes N, beside it, N emulated hosts node1..nodeN in a partition `multi`: each its own network namespace,
# hostname (unshare --uts), address on a bridge and slurmd; --link-rate limits each node's link both ways
# (tc tbf on the two ends of its veth pair).
#
#   bash scripts/dev/slurm_cluster.sh start [--nodes N] [--link-rate RATE]   # install if needed, start, wait idle
#   bash scripts/dev/slurm_cluster.sh stop              # stop everything start started, remove its slurm.conf
#   bash scripts/dev/slurm_cluster.sh remove-nodes      # only the emulated nodes: the one-node cluster stays
#   bash scripts/dev/slurm_cluster.sh kill-node NAME    # a node lost: SIGKILL to its slurmd and every process on it
#   bash scripts/dev/slurm_cluster.sh cut-link NAME     # its link down: nothing reaches it, nothing says so
#   bash scripts/dev/slurm_cluster.sh heal              # killed nodes and cut links back, the rates kept
#   bash scripts/dev/slurm_cluster.sh status            # sinfo, squeue, the links' rates
#
# `start --nodes N` again also heals, and sets the rate (none: unlimited).
# Needs root (it writes /etc/slurm/slurm.conf, which sbatch and sinfo read, and makes namespaces). The
# daemons' state, logs and pid files live in $SLURM_CLUSTER_DIR (default /tmp/cs336-slurm); an emulated
# node's slurmd sees its own DIR/nodes/NAME there (a bind mount in its mount namespace) and its own
# /etc/hosts (the controller and the nodes on the bridge). The controller is restarted only when the nodes
# change (its state is kept: jobs on the one-node cluster run on). A slurm.conf this script did not write is
# never replaced. No accounting store: `sacct` fails here, so a job's end state comes from `scontrol show
# job` (kept MinJobAge seconds) and the job's log, as the harness reads them.
set -euo pipefail
dir=${SLURM_CLUSTER_DIR:-/tmp/cs336-slurm}
conf=/etc/slurm/slurm.conf
mark="# written by cs336-bench scripts/dev/slurm_cluster.sh"
net=10.200.36  # the bridge is .1 (the controller), node I is .1I
bridge=cs336br
max_nodes=4

die() {
  echo "slurm_cluster.sh: error: $*" >&2
  exit 2
}

install_packages() {
  if command -v sbatch >/dev/null && [ -x /usr/sbin/slurmctld ] && [ -x /usr/sbin/slurmd ] && [ -x /usr/sbin/munged ] &&
    command -v tc >/dev/null && command -v nsenter >/dev/null; then
    return
  fi
  echo "installing slurm-wlm, munge and iproute2 (apt-get, about a minute)" >&2
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq >/dev/null
  apt-get install -y -qq slurm-wlm munge iproute2 util-linux >/dev/null
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

nodes_up() { # the emulated nodes that exist now, by their namespaces
  ip netns list 2>/dev/null | sed -n 's/^cs336-\(node[0-9]\).*/\1/p' | sort
}

# writes $conf for this node and the emulated nodes that exist; conf_changed=1 when its text changed
write_conf() {
  if [ -e "$conf" ] && ! grep -qF "$mark" "$conf"; then
    die "$conf exists and was not written by this script; not replacing it"
  fi
  local host cpus mem slots node nodes text
  host=$(hostname -s)
  cpus=$(nproc)
  mem=$(/usr/sbin/slurmd -C | head -1 | sed -n 's/.*RealMemory=\([0-9]*\).*/\1/p')
  # job slots: twice the cores, at least 4 (config_overrides: slurmd takes them as configured), so that a
  # test's job that only sleeps (one waiting for its time limit) does not hold back the others
  slots=$((2 * cpus > 4 ? 2 * cpus : 4))
  mkdir -p /etc/slurm "$dir/state" "$dir/spool"
  text="$mark
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
PartitionName=debug Nodes=$host Default=YES MaxTime=INFINITE State=UP"
  nodes=$(nodes_up | paste -sd, -)
  for node in $(nodes_up); do
    text+="
NodeName=$node NodeAddr=$net.1${node#node} CPUs=$slots RealMemory=$mem State=UNKNOWN"
  done
  if [ -n "$nodes" ]; then
    text+="
# the emulated hosts (start --nodes): jobs of several nodes name this partition
PartitionName=multi Nodes=$nodes MaxTime=INFINITE State=UP"
  fi
  conf_changed=0
  if [ "$(cat "$conf" 2>/dev/null)" != "$text" ]; then
    printf '%s\n' "$text" >"$conf"
    conf_changed=1
  fi
}

running() { # pid file
  [ -s "$1" ] && kill -0 "$(cat "$1")" 2>/dev/null
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

# the controller on the conf just written: restarted when the conf changed (it saves its jobs' state on the
# way out and reads it back; clients retry for about 10 s meanwhile), then every slurmd re-reads the conf
controller() {
  if running "$dir/slurmctld.pid" && [ "$conf_changed" = 1 ]; then
    stop_daemon slurmctld "$dir/slurmctld.pid"
  fi
  if ! running "$dir/slurmctld.pid"; then
    /usr/sbin/slurmctld
    for _ in $(seq 100); do
      scontrol ping 2>/dev/null | grep -q UP && break
      sleep 0.1
    done
    [ "$conf_changed" = 1 ] && scontrol reconfigure 2>/dev/null || true
  fi
}

wait_up() { # partition count states what: until `count` of its nodes are in one of `states` (a regex)
  local found up=0
  for _ in $(seq 60); do
    found=$(sinfo -h -N -p "$1" -o %T 2>/dev/null || true)
    up=$(grep -cE "^($3)\$" <<<"$found" || true)
    [ "$up" -ge "$2" ] && return
    sleep 0.5
  done
  die "$4 did not come up within 30 s (sinfo: ${found:-no answer}); see the logs in $dir"
}

link_rate() { # device namespace-or-empty rate-or-empty: tbf on the device's egress, or no qdisc
  local in=() burst
  [ -n "$2" ] && in=(-n "$2")
  tc "${in[@]}" qdisc del dev "$1" root 2>/dev/null || true
  [ -n "$3" ] || return 0
  # burst: what passes at once after an idle spell, 2 ms of the rate and at least 32 KiB (at 1 Gbit/s, 32 KiB
  # held a TCP stream to 770 Mbit/s and 256 KiB let it reach 950); a transfer of B bytes then takes
  # (B - burst) / rate, not B / rate
  burst=$(awk -v rate="$3" 'BEGIN { n = rate + 0; u = substr(rate, length(n "") + 1, 1);
    bits = n * (u == "g" ? 1e9 : u == "m" ? 1e6 : u == "k" ? 1e3 : 1); b = int(bits / 8 * 0.002);
    print (b < 32768 ? 32768 : b) }')
  tc "${in[@]}" qdisc add dev "$1" root tbf rate "$3" burst "$burst" latency 50ms ||
    die "tc refused the rate $3 (e.g. 200mbit, 1gbit)"
}

add_node() { # name: its namespace, the veth pair to the bridge, its address
  local ns=cs336-$1 address=$net.1${1#node}
  ip netns add "$ns"
  ip link add "$ns" type veth peer name eth0 netns "$ns"
  ip link set "$ns" master "$bridge" up
  ip -n "$ns" addr add "$address/24" dev eth0
  ip -n "$ns" link set lo up
  ip -n "$ns" link set eth0 up
  mkdir -p "$dir/nodes/$1/spool"
}

start_slurmd() { # name: its slurmd in its namespaces, if not running
  running "$dir/nodes/$1/slurmd.pid" && return
  nsenter --net="/run/netns/cs336-$1" unshare --uts --mount --propagation private sh -c "
    hostname $1
    mount --bind $dir/hosts /etc/hosts
    mount --bind $dir/nodes/$1 $dir
    exec /usr/sbin/slurmd"
}

start() {
  [ "$(id -u)" -eq 0 ] || die "run as root (it installs packages, writes $conf and starts daemons as root)"
  local count="" rate="" node
  while [ $# -gt 0 ]; do
    case "$1" in
    --nodes) count=${2:-} && shift 2 || die "--nodes needs a number" ;;
    --link-rate) rate=${2:-} && shift 2 || die "--link-rate needs a rate (e.g. 200mbit, 1gbit)" ;;
    *) die "unknown argument $1 (start [--nodes N] [--link-rate RATE])" ;;
    esac
  done
  [ -z "$count" ] || [[ "$count" =~ ^[1-9]$ && "$count" -le $max_nodes ]] || die "--nodes: from 1 to $max_nodes, got $count"
  [ -z "$rate" ] || [ -n "$count" ] || die "--link-rate is for the emulated nodes: give --nodes N too"
  [ -z "$rate" ] || [[ "$rate" =~ ^[0-9]+(\.[0-9]+)?[kmg]?bit$ ]] || die "--link-rate: a rate as tc writes it (200mbit, 1gbit), got $rate"
  mkdir -p "$dir"
  install_packages
  start_munge
  if [ -n "$count" ] && [ "$(nodes_up | wc -l)" != "$count" ]; then
    remove_namespaces
  fi
  if [ -n "$count" ] && [ -z "$(nodes_up)" ]; then
    ip link add "$bridge" type bridge
    ip addr add "$net.1/24" dev "$bridge"
    ip link set "$bridge" up
    printf '127.0.0.1 localhost\n%s.1 %s\n' "$net" "$(hostname -s)" >"$dir/hosts"
    for i in $(seq "$count"); do
      add_node "node$i"
      echo "$net.1$i node$i" >>"$dir/hosts"
    done
  fi
  write_conf
  controller
  running "$dir/slurmd.pid" || /usr/sbin/slurmd
  wait_up debug 1 "idle|mixed|allocated|completing" "the node $(hostname -s)"
  echo "slurm: partition debug on $(hostname -s) is up (logs in $dir)" >&2
  [ -n "$count" ] || return 0
  for node in $(nodes_up); do
    link_rate "cs336-$node" "" "$rate"
    link_rate eth0 "cs336-$node" "$rate"
  done
  heal
  echo "slurm: partition multi: $(nodes_up | paste -sd' ' -) on bridge $bridge ($net.0/24), links ${rate:-unlimited}" >&2
}

heal() { # every emulated node up: its link, its slurmd, no job left `completing` on it
  local node count
  count=$(nodes_up | wc -l)
  [ "$count" -gt 0 ] || die "no emulated nodes (start --nodes N)"
  for node in $(nodes_up); do
    ip link set "cs336-$node" up
    start_slurmd "$node"
  done
  for _ in $(seq 20); do
    [ "$(sinfo -h -N -p multi -o %T | grep -vc '\*$')" = "$count" ] && break # all registered
    sleep 0.5
  done
  # a job whose node was lost stays `completing` there until Slurm sends its end again (a minute): down and
  # resume end it at once
  for node in $(sinfo -h -N -p multi -t completing -o %N); do
    scontrol update nodename="$node" state=down reason="slurm_cluster.sh: back after a loss"
    scontrol update nodename="$node" state=resume
  done
  wait_up multi "$count" idle "the emulated nodes"
}

remove_namespaces() { # every process on an emulated node, its namespace, its link, the bridge
  local node
  for node in $(nodes_up); do
    ip netns pids "cs336-$node" | xargs -r kill -9
    ip netns del "cs336-$node"
  done
  ip link del "$bridge" 2>/dev/null || true
  rm -rf "$dir/nodes" "$dir/hosts"
}

remove_nodes() {
  remove_namespaces
  if running "$dir/slurmctld.pid"; then
    write_conf
    controller
  fi
}

stop() {
  remove_namespaces
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

node_arg() {
  [ -n "${1:-}" ] && nodes_up | grep -qx "$1" || die "no emulated node ${1:-(none given)}; these exist: $(nodes_up | paste -sd' ' -)"
}

case "${1:-}" in
start) shift && start "$@" ;;
stop) stop ;;
remove-nodes) remove_nodes && echo "slurm: emulated nodes removed; partition debug stays" >&2 ;;
heal) heal && echo "slurm: partition multi: every node up" >&2 ;;
kill-node) node_arg "${2:-}" && ip netns pids "cs336-$2" | xargs -r kill -9 ;;
cut-link) node_arg "${2:-}" && ip link set "cs336-$2" down ;;
status)
  sinfo
  squeue
  for node in $(nodes_up); do
    echo "$node: $(tc qdisc show dev "cs336-$node" | head -1)"
  done
  ;;
*) die "usage: slurm_cluster.sh start [--nodes N] [--link-rate RATE] | stop | remove-nodes | kill-node NAME | cut-link NAME | heal | status" ;;
esac
