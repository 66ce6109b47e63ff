#!/usr/bin/env bash
# Make sure the system has what ringlet builds and runs with: an MPI library with its compiler
# wrapper and headers (mpicc), mpirun, and libclang (rsmpi generates its MPI bindings with
# bindgen). As root on Debian/Ubuntu it installs what is missing; otherwise it says what to do.
set -euo pipefail

missing=()
command -v mpicc >/dev/null 2>&1 || missing+=(libopenmpi-dev)
command -v mpirun >/dev/null 2>&1 || missing+=(openmpi-bin)
if [ -z "${LIBCLANG_PATH:-}" ] &&
   ! compgen -G "/usr/lib/llvm-*/lib/libclang*.so*" >/dev/null &&
   ! compgen -G "/usr/lib/*-linux-gnu/libclang*.so*" >/dev/null; then
    missing+=(libclang-dev)
fi
[ ${#missing[@]} -eq 0 ] && exit 0

if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    echo "Installing ${missing[*]} with apt-get"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
else
    cat >&2 <<MSG
ringlet needs these system packages: ${missing[*]} (Debian/Ubuntu names).
Install them, e.g.  sudo apt-get install ${missing[*]}
or, on a cluster, load the MPI module so that mpicc and mpirun are on PATH
(and set LIBCLANG_PATH if libclang lives elsewhere), then run make again.
MSG
    exit 1
fi
