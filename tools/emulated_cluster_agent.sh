#!/usr/bin/env bash
# Open MPI's rsh agent for the emulated cluster (tools/emulated_cluster.sh): called as ssh would be,
# `agent [ssh options] HOST COMMAND...`, it runs COMMAND in the host's network namespace with
# the host's own hostname, instead of logging in anywhere.
set -euo pipefail
while [[ ${1:-} == -* ]]; do shift; done   # ssh options Open MPI may add (-x, ...)
address=${1:?host}
shift
case $address in
  10.77.0.*) index=$(( ${address##*.} - 10 )) ;;
  rgl-h*) index=${address#rgl-h} ;;
  *) echo "emulated_cluster_agent: $address is not a host of the emulated cluster" >&2; exit 1 ;;
esac
namespace=rgl-h$index
# As ssh does: the words form one command line for a shell on the "remote" host, which starts
# with a login's environment, not the caller's (mpirun's -x is how variables reach the ranks).
exec env -i HOME="${HOME:-/root}" USER="$(id -un)" LOGNAME="$(id -un)" SHELL=/bin/sh \
  PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
  ip netns exec "$namespace" unshare --uts -- sh -c 'hostname "$0" && eval "$1"' \
  "$namespace" "$*"
