#!/usr/bin/env bash
# A real Slurm on the emulated cluster (tools/emulated_cluster.sh): slurmctld on host 0, a slurmd
# on every host, munge for their credentials.
#
#   tools/emulated_slurm.sh install   apt-get install Slurm and munge when missing (root, Debian)
#   tools/emulated_slurm.sh up        start munged, slurmctld and the slurmds (the cluster must be
#                                     up: `tools/emulated_cluster.sh up`); restarts them if running
#   tools/emulated_slurm.sh down      stop them and remove their state (emulated_cluster.sh down
#                                     calls this first)
#   tools/emulated_slurm.sh status    the daemons, sinfo
#   tools/emulated_slurm.sh env       the variable Slurm's commands need (eval "$(... env)")
#
# Slurm's commands (sbatch, salloc, srun, squeue) reach slurmctld over the bridge, so they run on
# a host, as on a login node: `SLURM_CONF=... tools/emulated_cluster.sh on 0 sbatch job.sbatch`.
#
# Everything lives in build/emulated-cluster/slurm: slurm.conf (Slurm's commands find it through
# SLURM_CONF, so nothing is written to /etc), munge's key and socket (munged runs in this
# machine's own network namespace: its socket is a file, which every namespace reaches), and each
# daemon's pid file, log and spool directory. Each slurmd runs in its host's network namespace
# with the host's name, /etc/hosts and a /tmp of its own (on_host below), so the jobs it starts
# see what a node's would. Plugins that need nothing from this VM: proctrack/linuxproc (a job's
# processes are found by parentage, no cgroups), task/none (no binding: the hosts share 2 cores),
# select/cons_tres with CR_CPU on nodes that declare 4 CPUs each (config_overrides: slurmd does
# not check them against this machine's), no accounting. MpiDefault is none: `srun --mpi=pmix`
# (Slurm's PMIx v4 plugin and Open MPI 4.1's ext3x component, both on Debian's libpmix2) is the
# one PMI they share, named where it is used.
set -euo pipefail

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
CLUSTER_STATE=$REPO/build/emulated-cluster
STATE=$CLUSTER_STATE/slurm
CONF=$STATE/slurm.conf
MUNGE_SOCKET=$STATE/munge/munge.socket
PREFIX=rgl-h
SUBNET=10.77.0
CPUS_PER_HOST=4
PACKAGES=(slurmctld slurmd slurm-client munge)

die() { echo "emulated_slurm: $*" >&2; exit 1; }

missing_packages() {
  local missing=()
  command -v slurmctld >/dev/null || missing+=(slurmctld)
  command -v slurmd >/dev/null || missing+=(slurmd)
  command -v sbatch >/dev/null || missing+=(slurm-client)
  command -v munged >/dev/null || missing+=(munge)
  echo "${missing[*]}"
}

install() {
  local missing
  missing=$(missing_packages)
  [[ -z $missing ]] && return 0
  [[ $(id -u) -eq 0 ]] && command -v apt-get >/dev/null \
    || die "Slurm is not installed; install ${PACKAGES[*]} (Debian/Ubuntu names)"
  read -r -a missing <<< "$missing"
  echo "emulated_slurm: installing ${missing[*]} with apt-get"
  apt-get update -qq
  # `up` starts daemons of its own, with their own configuration and munge socket: whatever apt
  # may start as services (with /etc's configuration) does not meet them.
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" \
    >/dev/null
}

pid_alive() { [[ -f $1 ]] && kill -0 "$(cat "$1")" 2>/dev/null; }

# SIGTERM, then SIGKILL after 5 s, for the daemon whose pid file is $1.
stop_daemon() {
  local pidfile=$1 pid i
  pid_alive "$pidfile" || return 0
  pid=$(cat "$pidfile")
  kill "$pid" 2>/dev/null || true
  for ((i = 0; i < 50; i++)); do kill -0 "$pid" 2>/dev/null || return 0; sleep 0.1; done
  kill -KILL "$pid" 2>/dev/null || true
}

# CMD as a daemon of host INDEX: in its network namespace, with its hostname and /etc/hosts, as
# `ip netns exec` gives them, but keeping this machine's /sys (ip netns exec mounts a new one,
# without the cgroup hierarchies that slurmd's cgroup plugin must find to start, even with
# proctrack/linuxproc), and with a /tmp of its own: Slurm's PMIx plugin makes
# /tmp/spmix_appdir_<uid>_<step> on every node of a step, which one shared /tmp refuses.
# A checkout under /tmp stays where it is: the folder of /tmp that holds it (with ../shared
# beside it) is bound into the host's own /tmp first, at the same path, and the host's /tmp
# brings that mount along (--rbind).
on_host() {
  local node=$PREFIX$1 keep=
  shift
  mkdir -p "$STATE/$node/tmp"
  chmod 1777 "$STATE/$node/tmp"
  if [[ $REPO == /tmp/* ]]; then
    keep=${REPO#/tmp/}
    keep=${keep%%/*}
    mkdir -p "$STATE/$node/tmp/$keep"
  fi
  nsenter --net="/run/netns/$node" unshare --mount --uts -- sh -c \
    'mount --bind "/etc/netns/$0/hosts" /etc/hosts &&
     { [ -z "$2" ] || mount --bind "/tmp/$2" "$1/$2"; } &&
     mount --rbind "$1" /tmp && hostname "$0" &&
     shift 2 && exec "$@"' "$node" "$STATE/$node/tmp" "$keep" "$@"
}

hosts_of_cluster() {
  [[ -f $CLUSTER_STATE/shape ]] || die "no emulated cluster: run tools/emulated_cluster.sh up first"
  read -r hosts _ < "$CLUSTER_STATE/shape"
  echo "$hosts"
}

write_conf() {
  local hosts=$1 i
  cat > "$CONF" <<EOF
# Written by tools/emulated_slurm.sh up; removed by its down.
ClusterName=ringlet
SlurmctldHost=${PREFIX}0($SUBNET.10)
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$MUNGE_SOCKET
StateSaveLocation=$STATE/slurmctld
SlurmctldPidFile=$STATE/slurmctld.pid
SlurmctldLogFile=$STATE/slurmctld.log
SlurmdSpoolDir=$STATE/%n/spool
SlurmdPidFile=$STATE/%n/slurmd.pid
SlurmdLogFile=$STATE/%n/slurmd.log
SlurmdParameters=config_overrides
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SwitchType=switch/none
MpiDefault=none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
SchedulerType=sched/builtin
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
ReturnToService=2
# A host whose link goes down is declared DOWN after SlurmdTimeout; a job step's tasks there are
# given KillWait to end after SIGTERM. Short, so that the tests see it happen.
SlurmdTimeout=30
KillWait=5
MinJobAge=10
InactiveLimit=0
EOF
  for ((i = 0; i < hosts; i++)); do
    echo "NodeName=$PREFIX$i NodeAddr=$SUBNET.$((10 + i)) CPUs=$CPUS_PER_HOST State=UNKNOWN" >> "$CONF"
  done
  echo "PartitionName=emulated Nodes=${PREFIX}[0-$((hosts - 1))] Default=YES MaxTime=INFINITE State=UP" \
    >> "$CONF"
}

start_munge() {
  mkdir -p "$STATE/munge"
  chmod 755 "$STATE/munge"   # munged wants every user able to reach its socket
  [[ -f $STATE/munge/munge.key ]] || mungekey --create --keyfile="$STATE/munge/munge.key" >/dev/null
  chmod 600 "$STATE/munge/munge.key"
  # --force: munged refuses a socket directory that is not its own /run/munge unless told.
  munged --force --socket="$MUNGE_SOCKET" --key-file="$STATE/munge/munge.key" \
    --pid-file="$STATE/munge/munged.pid" --log-file="$STATE/munge/munged.log" \
    --seed-file="$STATE/munge/munged.seed" 2>>"$STATE/munge/munged.log"
  munge --socket="$MUNGE_SOCKET" -n | unmunge --socket="$MUNGE_SOCKET" >/dev/null \
    || die "munged does not answer (see $STATE/munge/munged.log)"
}

# Every node answers sinfo as idle, or fail after 60 s with the logs' ends.
wait_until_idle() {
  local hosts=$1 i idle
  for ((i = 0; i < 600; i++)); do
    idle=$(SLURM_CONF=$CONF ip netns exec "${PREFIX}0" sinfo -h -N -t idle -o %N 2>/dev/null | sort -u | wc -l)
    [[ $idle -eq $hosts ]] && return 0
    sleep 0.1
  done
  SLURM_CONF=$CONF ip netns exec "${PREFIX}0" sinfo -N >&2 || true
  tail -n 5 "$STATE"/slurmctld.log "$STATE"/"$PREFIX"*/slurmd.log >&2 || true
  die "only $idle of $hosts slurmds are idle after 60 s"
}

up() {
  local hosts i node
  [[ $(id -u) -eq 0 ]] || die "needs root"
  [[ -z $(missing_packages) ]] || die "Slurm is not installed: run '$0 install' first"
  hosts=$(hosts_of_cluster)
  down
  mkdir -p "$STATE/slurmctld"
  write_conf "$hosts"
  start_munge
  export SLURM_CONF=$CONF
  on_host 0 slurmctld -i
  for ((i = 0; i < hosts; i++)); do
    mkdir -p "$STATE/$PREFIX$i/spool"
    on_host "$i" slurmd -N "$PREFIX$i"
  done
  wait_until_idle "$hosts"
  echo "emulated Slurm: slurmctld on ${PREFIX}0, a slurmd on each of $hosts hosts, partition" \
    "'emulated'; SLURM_CONF=$CONF"
}

down() {
  local pidfile
  for pidfile in "$STATE"/"$PREFIX"*/slurmd.pid; do
    [[ -e $pidfile ]] && stop_daemon "$pidfile"
  done
  stop_daemon "$STATE/slurmctld.pid"
  stop_daemon "$STATE/munge/munged.pid"
  rm -rf "$STATE"
}

status() {
  local pidfile
  [[ -f $CONF ]] || { echo "no emulated Slurm"; return 0; }
  for pidfile in "$STATE/munge/munged.pid" "$STATE/slurmctld.pid" "$STATE"/"$PREFIX"*/slurmd.pid; do
    if pid_alive "$pidfile"; then echo "running: ${pidfile#"$STATE"/} ($(cat "$pidfile"))"
    else echo "not running: ${pidfile#"$STATE"/}"; fi
  done
  SLURM_CONF=$CONF ip netns exec "${PREFIX}0" sinfo -N || true
}

case ${1:-} in
  install) install ;;
  up) up ;;
  down) down ;;
  status) status ;;
  env) echo "export SLURM_CONF=$CONF" ;;
  *) die "usage: $0 install | up | down | status | env" ;;
esac
