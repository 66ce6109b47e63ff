#!/usr/bin/env bash
# An emulated cluster on this machine, for ringlet's cluster tests and benchmarks.
#
#   tools/emulated_cluster.sh up [HOSTS] [RATE]   HOSTS network namespaces (default 4), each a "host"
#                                         whose link is shaped to RATE (default 1gbit) each way
#   tools/emulated_cluster.sh down                remove everything `up` made (also when half made),
#                                         and Slurm's daemons if tools/emulated_slurm.sh started them
#   tools/emulated_cluster.sh status              what exists
#   tools/emulated_cluster.sh mpirun ARGS...      Open MPI's mpirun across the hosts (hostfile given):
#                                         the first mpirun on PATH, 4.x or 5
#   tools/emulated_cluster.sh on INDEX CMD...     CMD on host INDEX (its namespace, its hostname)
#   tools/emulated_cluster.sh rate INDEX RATE     reshape host INDEX's link to RATE each way
#   tools/emulated_cluster.sh options             the mpirun options `mpirun` adds, one per line
#
# Each host is a network namespace rgl-hN with one veth (10.77.0.(10+N)/24) on a private bridge
# rglbr0. The bridge has no address in this machine's own namespace and nothing is routed or
# NATed: traffic stays between the namespaces made here. Each veth is shaped by a token bucket
# (tc tbf) in both directions: on the bridge side (into the host) and inside the namespace (out
# of it). Commands on a host run under `unshare --uts` with the hostname rgl-hN, so MPI sees
# one node per namespace: MPI_Get_processor_name differs, Open MPI starts one daemon per host
# (4.x's orted, 5's prted; through an rsh agent that enters the namespace instead of ssh, and
# gives the daemon a login's environment, as ssh would) and MPI_COMM_TYPE_SHARED
# groups the ranks of each host; between hosts Open MPI uses TCP over the bridge, within a
# host its shared-memory transport (4.x's vader, 5's sm). Each namespace's /etc/hosts (ip netns
# exec mounts /etc/netns/rgl-hN/hosts over it) names every host, as a cluster's DNS would.
#
# What it models: each host's network bandwidth (both directions, shared by the host's ranks),
# TCP between hosts, node locality as MPI and ringlet see it. What it does not: latency (the
# kernel here has no netem qdisc; tbf's `latency` only bounds its queue, so messages between
# hosts cost loopback-TCP latency, ~20-50 us, not a real network's), the hosts' own CPUs and
# memory (every host shares this machine's cores and memory bus, so CPU-heavy phases such as
# TCP processing contend across hosts; idle ranks yield, see mpirun_options), and a switch (the
# bridge is not a bottleneck).
# QUEUE=100ms (the default) is how long tbf lets packets wait before it drops them.
set -euo pipefail

PREFIX=rgl-h
BRIDGE=rglbr0
SUBNET=10.77.0
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
STATE=$REPO/build/emulated-cluster
HOSTFILE=$STATE/hostfile
AGENT=$REPO/tools/emulated_cluster_agent.sh

die() { echo "emulated_cluster: $*" >&2; exit 1; }

namespaces() { ip netns list 2>/dev/null | awk '{print $1}' | grep "^${PREFIX}[0-9]*$" || true; }

# Token-bucket parameters for RATE: a burst of about 1 ms of traffic, and at least 128 KiB
# (a veth hands TCP segments of up to 64 KiB to the qdisc; tbf drops packets above its burst).
burst_for() {
  local rate=$1 bits
  bits=$(python3 - "$rate" <<'EOF'
import re, sys
m = re.fullmatch(r"(\d+(?:\.\d+)?)([kmg]?)(bit|bps)", sys.argv[1].lower())
if not m:
    sys.exit(f"cannot read rate {sys.argv[1]!r}: use e.g. 1gbit, 100mbit")
scale = {"": 1, "k": 1e3, "m": 1e6, "g": 1e9}[m[2]] * (8 if m[3] == "bps" else 1)
print(int(float(m[1]) * scale))
EOF
) || exit 1
  echo $(( bits / 8 / 1000 > 131072 ? bits / 8 / 1000 : 131072 ))
}

down() {
  local ns
  # Slurm's daemons first (tools/emulated_slurm.sh): a namespace's processes outlive its removal.
  [[ -d $STATE/slurm ]] && bash "$REPO/tools/emulated_slurm.sh" down
  for ns in $(namespaces); do
    # What a job left in a host (the daemon of a host cut off by a fault test, which Open MPI
    # could not reach to end it), as a scheduler ends a job's leftovers when a node returns:
    # only processes inside this cluster's namespaces.
    ip netns pids "$ns" 2>/dev/null | xargs -r kill -KILL 2>/dev/null || true
    ip netns del "$ns" 2>/dev/null || true   # takes the namespace's veth end, and so the pair
  done
  for link in $(ip -o link show 2>/dev/null | awk -F': ' '{print $2}' | sed 's/@.*//' \
      | grep -E "^(rglv[0-9]+|$BRIDGE)$" || true); do
    ip link del "$link" 2>/dev/null || true
  done
  rm -rf "$STATE"
  rm -rf /etc/netns/"$PREFIX"[0-9]*
  rmdir /etc/netns 2>/dev/null || true   # if up made it (nothing else is in it)
}

up() {
  local hosts=${1:-4} rate=${2:-1gbit} burst i j ns
  [[ $hosts =~ ^[0-9]+$ && $hosts -ge 1 && $hosts -le 16 ]] || die "HOSTS must be 1-16, not $hosts"
  [[ $(id -u) -eq 0 ]] || die "needs root (network namespaces)"
  burst=$(burst_for "$rate")
  down
  mkdir -p "$STATE"
  ip link add "$BRIDGE" type bridge
  ip link set "$BRIDGE" up
  : > "$HOSTFILE"
  for ((i = 0; i < hosts; i++)); do
    ns=$PREFIX$i
    ip netns add "$ns"
    ip link add "rglv$i" type veth peer name eth0 netns "$ns"
    ip link set "rglv$i" master "$BRIDGE" up
    ip -n "$ns" link set lo up
    ip -n "$ns" addr add "$SUBNET.$((10 + i))/24" dev eth0
    ip -n "$ns" link set eth0 up
    # Into the host (the bridge side sends) and out of it (the namespace side sends).
    tc qdisc add dev "rglv$i" root tbf rate "$rate" burst "$burst" latency "${QUEUE:-100ms}"
    ip netns exec "$ns" tc qdisc add dev eth0 root tbf rate "$rate" burst "$burst" latency "${QUEUE:-100ms}"
    echo "$SUBNET.$((10 + i)) slots=16" >> "$HOSTFILE"
  done
  for ((i = 0; i < hosts; i++)); do
    mkdir -p "/etc/netns/$PREFIX$i"
    { echo "127.0.0.1 localhost"
      for ((j = 0; j < hosts; j++)); do echo "$SUBNET.$((10 + j)) $PREFIX$j"; done
    } > "/etc/netns/$PREFIX$i/hosts"
  done
  echo "$hosts $rate" > "$STATE/shape"
  echo "emulated cluster: $hosts hosts (${PREFIX}0-${PREFIX}$((hosts - 1)), $SUBNET.10-$((9 + hosts))), links shaped to $rate each way; hostfile $HOSTFILE"
}

# Host INDEX's link to RATE both ways, as `up` shapes it (a fault test slows one host).
reshape() {
  local index=${1:?host index} rate=${2:?rate} burst
  [[ -f $HOSTFILE ]] || die "no cluster: run '$0 up' first"
  burst=$(burst_for "$rate")
  tc qdisc change dev "rglv$index" root tbf rate "$rate" burst "$burst" latency "${QUEUE:-100ms}"
  ip netns exec "$PREFIX$index" tc qdisc change dev eth0 root tbf rate "$rate" burst "$burst" \
    latency "${QUEUE:-100ms}"
}

status() {
  if [[ ! -f $STATE/shape ]]; then
    echo "no emulated cluster"
  else
    read -r hosts rate < "$STATE/shape"
    echo "emulated cluster: $hosts hosts at $rate"
  fi
  namespaces
  ip -br link show "$BRIDGE" 2>/dev/null || true
}

# What Open MPI needs to run across the hosts: the hostfile, the rsh agent, TCP on the bridge.
# The hosts share this machine's cores, so idle ranks yield them (mpi_yield_when_idle, what Open
# MPI does by itself when it knows a node is oversubscribed): it cannot know here, since each
# host's slots are its own, and ranks that busy-poll made every step between hosts wait for the
# scheduler (a 1 MiB ring on 4 hosts x 2 ranks: 95 ms polling, 15 ms yielding). For the same
# reason ranks are not bound unless asked (--bind-to): each host would bind its ranks to this
# machine's first cores (4.1 put 2 hosts x 1 rank both on core 0; 5 refuses 3 ranks on a host).
# TCP keepalive on the launcher's own connections (mpirun to each host's daemon), as ringletrun
# gives it across hosts (KEEPALIVE_OPTIONS in python/ringlet/_launchers.py): mpirun learns that
# a host has become unreachable 10-15 s after it did, and ends the job, naming it (and the
# host's daemon, if it is idle, ends itself and its ranks); the ranks' RINGLET_TIMEOUT must be
# longer than this detection (docs/guide/failures.md).
# Written as Open MPI 4.x takes them; ringlet's launcher table (python/ringlet/_launchers.py)
# spells them for the mpirun on PATH, 4.x (ORTE) or 5 (PRRTE: --prtemca, plm_ssh_agent, sm).
mpirun_options() {
  python3 "$REPO/python/ringlet/_launchers.py" spell "$(launcher)" \
    --hostfile "$HOSTFILE" --mca mpi_yield_when_idle 1 \
    --mca plm_rsh_agent "$AGENT" --mca plm_rsh_no_tree_spawn 1 \
    --mca btl tcp,vader,self --mca btl_tcp_if_include "$SUBNET.0/24" \
    --mca oob_tcp_if_include "$SUBNET.0/24" --mca pml ob1 \
    --mca hwloc_base_binding_policy none \
    && python3 "$REPO/python/ringlet/_launchers.py" keepalive "$(launcher)"
}

# The mpirun that `mpirun` runs: the first on PATH (a venv's, for PyPI's Open MPI 5).
launcher() { command -v mpirun || die "no mpirun on PATH"; }

on_host() {
  local index=${1:?host index}
  shift
  [[ -f $HOSTFILE ]] || die "no cluster: run '$0 up' first"
  [[ $index =~ ^[0-9]+$ ]] && ip netns list | grep -q "^$PREFIX$index\b" \
    || die "no host $index in the emulated cluster"
  exec ip netns exec "$PREFIX$index" unshare --uts -- sh -c 'hostname "$0" && exec "$@"' \
    "$PREFIX$index" "$@"
}

run_mpirun() {
  [[ -f $HOSTFILE ]] || die "no cluster: run '$0 up' first"
  local forward=() name options
  # Every rank (started by an orted in its host) gets the caller's environment that matters.
  for name in PATH PYTHONPATH VIRTUAL_ENV LD_LIBRARY_PATH HOME $(compgen -e | grep -E '^(RINGLET_|OMP_|PYTEST)' || true); do
    [[ -n ${!name:-} ]] && forward+=(-x "$name")
  done
  options=$(mpirun_options) || die "cannot spell the mpirun options for $(launcher)"
  mapfile -t options <<< "$options"
  on_host 0 mpirun "${options[@]}" --wdir "$PWD" "${forward[@]}" "$@"
}

case ${1:-} in
  up) shift; up "$@" ;;
  down) down; echo "emulated cluster: removed" ;;
  status) status ;;
  mpirun) shift; run_mpirun "$@" ;;
  on) shift; on_host "$@" ;;
  options) mpirun_options ;;
  rate) shift; reshape "$@" ;;
  *) die "usage: $0 up [HOSTS] [RATE] | down | status | mpirun ARGS... | on INDEX CMD... | rate INDEX RATE | options" ;;
esac
