#!/usr/bin/env bash
# Make sure the system has what ringlet builds and runs with: an MPI library with its compiler
# wrapper and headers (mpicc, or $MPICC), a launcher (mpirun or mpiexec), and libclang (rsmpi
# generates its MPI bindings with bindgen). As root on Debian/Ubuntu it installs what is
# missing with apt; otherwise it says what to install.
#
#   tools/install_system_deps.sh            install what is missing
#   tools/install_system_deps.sh --mpich    also MPICH beside the default MPI (make test-mpich)
#   tools/install_system_deps.sh --check    print what is missing, install nothing
#                                           (exit 0: nothing, 1: packages missing, 2: broken)
#
# The detection uses shell builtins only (tests/tooling/test_install_system_deps.py runs it
# with a PATH of fake tools), and finds libclang exactly where bindgen's clang-sys looks for it:
# LIBCLANG_PATH alone if set, else `$LLVM_CONFIG_PATH --prefix` or `llvm-config --prefix`,
# LD_LIBRARY_PATH, LIBRARY_PATH and the system library directories,
# accepting libclang.so, libclang-N.so, libclang.so.N and libclang-N.so.N but never
# libclang-cpp (the C++ library, which comes with LLVM and does not serve bindgen).
# RINGLET_SYSROOT prefixes the system directories searched (for those tests).
set -euo pipefail
shopt -s nullglob

check_only=false
want_mpich=false
for argument in "$@"; do
    case "$argument" in
        --check) check_only=true ;;
        --mpich) want_mpich=true ;;
        *) echo "usage: $0 [--check] [--mpich]" >&2; exit 2 ;;
    esac
done
root="${RINGLET_SYSROOT:-}"

missing=()
problems=()
note() { echo "install_system_deps: $*" >&2; }

# --- libclang ------------------------------------------------------------------------------

is_libclang_name() {
    case "$1" in
        *-cpp.*) return 1 ;;  # libclang-cpp.so.14: clang-sys skips it, so must we
        libclang.so | libclang-*.so | libclang.so.* | libclang-*.so.*) return 0 ;;
        *) return 1 ;;
    esac
}

dir_has_libclang() {
    local file
    for file in "$1"/libclang*; do
        if [ -f "$file" ] && is_libclang_name "${file##*/}"; then
            found_libclang="$file"
            return 0
        fi
    done
    return 1
}

# Every directory of a colon-separated list (split with `read`, so that no entry is globbed).
search_path_list() {
    local directory directories
    IFS=: read -r -a directories <<<"$1"
    for directory in "${directories[@]}"; do
        [ -n "$directory" ] && dir_has_libclang "$directory" && return 0
    done
    return 1
}

find_libclang() {
    local directory pattern prefix llvm_config
    if [ -n "${LIBCLANG_PATH:-}" ]; then
        # bindgen searches only here when it is set: the file itself, or the directory.
        if [ -f "$LIBCLANG_PATH" ] && is_libclang_name "${LIBCLANG_PATH##*/}"; then
            found_libclang="$LIBCLANG_PATH"
            return 0
        fi
        [ -d "$LIBCLANG_PATH" ] && dir_has_libclang "$LIBCLANG_PATH" && return 0
        return 2
    fi
    # clang-sys runs $LLVM_CONFIG_PATH, else llvm-config, and uses the first line it prints.
    llvm_config="${LLVM_CONFIG_PATH:-llvm-config}"
    if command -v "$llvm_config" >/dev/null 2>&1 &&
        prefix="$("$llvm_config" --prefix 2>/dev/null)" && [ -n "$prefix" ]; then
        prefix="${prefix%%$'\n'*}"
        for directory in "$prefix/bin" "$prefix/lib" "$prefix/lib64"; do
            dir_has_libclang "$directory" && return 0
        done
    fi
    search_path_list "${LD_LIBRARY_PATH:-}" && return 0
    search_path_list "${LIBRARY_PATH:-}" && return 0
    # The patterns are quoted here and globbed below, under $RINGLET_SYSROOT (unquoted in the
    # list, bash would glob them against / first).
    for pattern in '/usr/local/llvm*/lib*' '/usr/local/lib*/*/*' '/usr/local/lib*/*' \
        '/usr/local/lib*' '/usr/lib*/*/*' '/usr/lib*/*' '/usr/lib*'; do
        for directory in "$root"$pattern; do
            [ -d "$directory" ] && dir_has_libclang "$directory" && return 0
        done
    done
    return 1
}

found_libclang=""
libclang_status=0
find_libclang || libclang_status=$?
case "$libclang_status" in
    0) ;;
    1) missing+=(libclang-dev) ;;
    *) problems+=("LIBCLANG_PATH=$LIBCLANG_PATH holds no libclang (libclang.so, libclang-<N>.so or libclang.so.<N>; libclang-cpp does not count): point it at the directory that does, or unset it") ;;
esac

# --- MPI -----------------------------------------------------------------------------------

# "openmpi", "mpich" or "" for an MPI compiler wrapper or launcher.
mpi_flavor() {
    local output
    output="$("$1" -showme:version 2>&1 || true)"
    case "$output" in *"Open MPI"*) echo openmpi; return ;; esac
    output="$("$1" --version 2>&1 || true) $("$1" -v 2>&1 || true)"
    case "$output" in
        *"Open MPI"* | *"OpenRTE"*) echo openmpi ;;
        *MPICH* | *HYDRA* | *Hydra*) echo mpich ;;
        *) echo "" ;;
    esac
}

dev_package() { [ "$1" = mpich ] && echo libmpich-dev || echo libopenmpi-dev; }
bin_package() { [ "$1" = mpich ] && echo mpich || echo openmpi-bin; }

compiler=""
if [ -n "${MPICC:-}" ]; then
    compiler="$(command -v "$MPICC" 2>/dev/null || true)"
    [ -n "$compiler" ] || problems+=("MPICC=$MPICC is not an executable: point it at your MPI's mpicc, or unset it")
else
    compiler="$(command -v mpicc 2>/dev/null || true)"
fi
launcher="$(command -v mpirun 2>/dev/null || command -v mpiexec 2>/dev/null || true)"

if [ -n "${MPI_PKG_CONFIG:-}" ]; then
    # build-probe-mpi then takes the MPI from pkg-config alone, no compiler wrapper needed.
    case "$MPI_PKG_CONFIG" in
        */*) [ -f "$MPI_PKG_CONFIG" ] ||
            problems+=("MPI_PKG_CONFIG=$MPI_PKG_CONFIG is not a file: point it at your MPI's .pc file, or unset it") ;;
    esac
    [ -n "$launcher" ] ||
        problems+=("MPI_PKG_CONFIG is set but there is no mpirun or mpiexec on PATH: put your MPI's launcher on PATH")
elif [ -z "${MPICC:-}" ] || [ -n "$compiler" ]; then
    if [ -z "$compiler" ] && [ -z "$launcher" ]; then
        missing+=(libopenmpi-dev openmpi-bin)
    elif [ -z "$compiler" ]; then
        flavor="$(mpi_flavor "$launcher")"
        missing+=("$(dev_package "$flavor")")
    elif [ -z "$launcher" ]; then
        flavor="$(mpi_flavor "$compiler")"
        if [ -n "$flavor" ]; then
            missing+=("$(bin_package "$flavor")")
        else
            problems+=("$compiler is an MPI compiler wrapper of unknown origin and there is no mpirun or mpiexec on PATH: put your MPI's launcher on PATH")
        fi
    else
        compiler_flavor="$(mpi_flavor "$compiler")"
        launcher_flavor="$(mpi_flavor "$launcher")"
        if [ -n "$compiler_flavor" ] && [ -n "$launcher_flavor" ] &&
            [ "$compiler_flavor" != "$launcher_flavor" ]; then
            note "warning: $compiler is $compiler_flavor but $launcher is $launcher_flavor;" \
                "ringlet runs only under the launcher of the MPI it was built with"
        fi
    fi
fi

if $want_mpich; then
    command -v mpicc.mpich >/dev/null 2>&1 || missing+=(libmpich-dev)
    command -v mpirun.mpich >/dev/null 2>&1 || missing+=(mpich)
fi

# --- report or install ---------------------------------------------------------------------

if [ ${#problems[@]} -gt 0 ]; then
    for problem in "${problems[@]}"; do note "$problem"; done
    exit 2
fi
if $check_only; then
    echo "${missing[*]}"
    [ ${#missing[@]} -eq 0 ] && exit 0 || exit 1
fi
[ ${#missing[@]} -eq 0 ] && exit 0

# apt-get, waiting while another apt-get holds its locks (a second checkout's set-up, an
# unattended upgrade) instead of failing: DPkg::Lock::Timeout covers dpkg's lock only, not the
# package lists' lock that `apt-get update` takes. Its output only on failure.
apt_get() {
    local attempt output
    for ((attempt = 1; attempt <= 120; attempt++)); do
        if output="$(apt-get -o DPkg::Lock::Timeout=600 "$@" 2>&1)"; then
            return 0
        fi
        if [[ $output != *"Could not get lock"* ]]; then
            echo "$output" >&2
            return 1
        fi
        [ "$attempt" = 1 ] && echo "apt-get: another apt-get holds its lock; waiting (up to 10 minutes)"
        sleep 5
    done
    echo "$output" >&2
    return 1
}

if [ "$EUID" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    echo "Installing ${missing[*]} with apt-get"
    # Installing MPICH must not change which MPI `mpicc`/`mpirun` mean (Debian's alternatives).
    default_mpi="$(update-alternatives --query mpi 2>/dev/null | sed -n 's/^Value: //p' || true)"
    default_mpirun="$(update-alternatives --query mpirun 2>/dev/null | sed -n 's/^Value: //p' || true)"
    apt_get update -qq
    DEBIAN_FRONTEND=noninteractive apt_get install -y -qq "${missing[@]}"
    restore_alternative() {
        local now
        now="$(update-alternatives --query "$1" 2>/dev/null | sed -n 's/^Value: //p' || true)"
        if [ -n "$2" ] && [ "$now" != "$2" ]; then
            update-alternatives --set "$1" "$2" >/dev/null
        fi
    }
    restore_alternative mpi "$default_mpi"
    restore_alternative mpirun "$default_mpirun"
else
    # printf, not cat: this part runs with the PATH of the detection too.
    printf '%s\n' >&2 \
        "ringlet needs these system packages: ${missing[*]} (Debian/Ubuntu names)." \
        "Install them, e.g.  sudo apt-get install ${missing[*]}" \
        "or, on a cluster, load the MPI module so that mpicc and mpirun are on PATH" \
        "(and set LIBCLANG_PATH if libclang lives elsewhere), then run make again."
    exit 1
fi
