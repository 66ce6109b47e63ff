#!/usr/bin/env bash
# The cluster tests: test_cluster.py on every rank of an emulated cluster
# (tools/emulated_cluster.sh), once per layout of ranks on hosts.
#
#   tests/cluster/run.sh          the representative layouts (make test)
#   tests/cluster/run.sh --all    every layout (make test-cluster)
#   tests/cluster/run.sh --layout NAME   that layout only ("uneven 2+1+3")
#   ... --no-faults                        without test_faults.py (Open MPI 4.x's messages only)
#   ... --ulfm                             the faults under Open MPI 5 with ULFM instead
#                                          (test_ulfm_cluster.py; $PYTHON from .venv-ompi5)
#
# The MPI is the first mpirun on PATH (Open MPI 4.x, or 5 from a venv: make test-openmpi5), the
# Python $PYTHON (default .venv's).
# Needs root and network namespaces; without them it says SKIPPED and why (and passes nothing).
# The cluster is torn down however the run ends.
set -euo pipefail
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cd "$REPO"
PYTHON=${PYTHON:-$REPO/.venv/bin/python}
CLUSTER=tools/emulated_cluster.sh
REPORTS=build/test-reports/cluster
H=10.77.0

# name | mpirun arguments (the hosts are 10.77.0.10 ... .13)
# make test's share: ranks interleaved across hosts, and hosts of unequal sizes.
QUICK=(
  "4 hosts x 2, round-robin|-n 8 --map-by node"
  "uneven 2+1+3|-n 6 --host $H.10:2,$H.11:1,$H.12:3"
)
MORE=(
  "2 hosts x 1|-n 2 --host $H.10:1,$H.11:1"
  "4 hosts x 2, block|-n 8 --map-by ppr:2:node"
  "2 hosts x 2, block|-n 4 --host $H.10:2,$H.11:2"
  "3 hosts x 3, round-robin|-n 9 --host $H.10:3,$H.11:3,$H.12:3 --map-by node"
  "uneven 3+1|-n 4 --host $H.10:3,$H.11:1"
  "uneven 3+2, round-robin|-n 5 --host $H.10:3,$H.11:2 --map-by node"
)
layouts=("${QUICK[@]}")
all=0 faults=1 ulfm=0
while [[ $# -gt 0 ]]; do
  case $1 in
    --all) all=1; layouts+=("${MORE[@]}"); shift ;;
    --layout)
      chosen=()
      for layout in "${QUICK[@]}" "${MORE[@]}"; do
        [[ ${layout%%|*} == "${2:-}" ]] && chosen=("$layout")
      done
      [[ ${#chosen[@]} -eq 1 ]] || { echo "run.sh: no layout '${2:-}'; the layouts are:" >&2
        printf '  %s\n' "${QUICK[@]%%|*}" "${MORE[@]%%|*}" >&2; exit 2; }
      layouts=("${chosen[@]}")
      shift 2 ;;
    --no-faults) faults=0; shift ;;
    --ulfm) ulfm=1; shift ;;
    *) echo "usage: $0 [--all | --layout NAME] [--no-faults | --ulfm]" >&2; exit 2 ;;
  esac
done

skip() { echo "=== cluster tests: SKIPPED ($*); nothing counted as passed"; exit 0; }
[[ $(id -u) -eq 0 ]] || skip "network namespaces need root"
command -v tc >/dev/null || skip "no tc (iproute2)"
probe=rgl-probe$$
ip netns add "$probe" 2>/dev/null || skip "ip netns add fails here (no network namespaces)"
ip netns del "$probe"

trap '"$CLUSTER" down >/dev/null 2>&1 || true' EXIT
trap 'exit 130' INT TERM   # then the EXIT trap tears down
"$CLUSTER" up 4 1gbit

failed=0
total=0
for layout in "${layouts[@]}"; do
  name=${layout%%|*}
  read -r -a args <<< "${layout#*|}"
  dir=$REPORTS/${name//[^a-z0-9]/_}
  rm -rf "$dir"
  mkdir -p "$dir"
  echo "=== cluster, $name: mpirun ${args[*]}"
  status=0
  # CALLER_ONLY is not forwarded: as over ssh, only ranks on host 0 (mpirun's own) may see it.
  CALLER_ONLY=1 RINGLET_TEST_REPORTS=$dir RINGLET_CACHE_DIR=$dir/cache timeout -k 10 300 \
    "$CLUSTER" mpirun "${args[@]}" "$PYTHON" tests/mpi_pytest.py -q --color=no \
    tests/cluster/test_cluster.py || status=$?
  # Every rank's JUnit report counts: a rank that failed, or ran nothing, fails the layout.
  if ! counted=$("$PYTHON" - "$dir" "${args[1]}" <<'EOF'
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

directory, ranks = Path(sys.argv[1]), int(sys.argv[2])
passed = failed = 0
for rank in range(ranks):
    report = directory / f"rank{rank}.xml"
    if not report.exists():
        sys.exit(f"rank {rank} wrote no report")
    suite = ET.parse(report).getroot()
    suite = suite if suite.tag == "testsuite" else suite.find("testsuite")
    tests, skipped = int(suite.get("tests")), int(suite.get("skipped"))
    bad = int(suite.get("failures")) + int(suite.get("errors"))
    if tests == 0 or skipped:
        sys.exit(f"rank {rank} ran {tests} tests, skipped {skipped}")
    passed += tests - bad
    failed += bad
print(passed, failed)
sys.exit(1 if failed else 0)
EOF
  ); then
    echo "=== cluster, $name: FAILED (mpirun exit $status; ${counted:-no reports})"
    for log in "$dir"/rank*.log; do [[ -s $log ]] && tail -n 30 "$log"; done
    failed=1
    continue
  fi
  read -r passed _ <<< "$counted"
  total=$((total + passed))
  echo "=== cluster, $name: $passed passed, 0 failed (all ranks)"
  [[ $status -eq 0 ]] || { echo "=== cluster, $name: mpirun exit $status"; failed=1; }
done
# ringlet.jupyter.start(hosts=...): the notebook and ipyparallel's controller on host 0, the MPI
# engines on the other hosts.
echo "=== cluster, Jupyter engines across hosts"
jupyter_status=0
jupyter_out=$(timeout -k 10 300 "$CLUSTER" on 0 "$PYTHON" -m pytest -q --color=no \
  -p no:cacheprovider tests/cluster/test_jupyter_hosts.py 2>&1) || jupyter_status=$?
echo "$jupyter_out" | tail -n 40
# Its summary line: only "N passed" counts (a skip or a deselection would not be a pass).
if [[ $jupyter_status -eq 0 ]] && summary=$(echo "$jupyter_out" | tail -n 1) \
    && [[ $summary =~ ^=*\ *([0-9]+)\ passed\ in ]]; then
  total=$((total + BASH_REMATCH[1]))
else
  echo "=== cluster, Jupyter engines across hosts: FAILED (pytest exit $jupyter_status)"
  failed=1
fi
# make bench-cluster's benchmark, briefly: it runs, and reports every candidate against the bound.
echo "=== cluster, the benchmark briefly (4 hosts x 2, block, 1 MiB)"
bench_out=$(timeout -k 10 300 "$CLUSTER" mpirun -n 8 --map-by ppr:2:node "$PYTHON" \
  benchmarks/emulated_cluster_bench.py --bytes 1048576 --reps 2 2>&1) || true
echo "$bench_out" | grep -E "^(\||host-link|8 ranks)" || true
for row in "| ring |" "| halving_doubling |" "| two_tier |" "| auto |" "| native |" \
    "| ring, rank order (flat) |" "| halving_doubling, whole messages between hosts |" \
    "host-link bound 2(H-1)/H*m/B = 13 ms" "placement seen: block" \
    "messages between hosts in pieces of"; do
  if ! grep -qF -- "$row" <<< "$bench_out"; then
    echo "=== cluster, the benchmark: FAILED (no '$row' in its report)"
    echo "$bench_out" | tail -n 20
    failed=1
  fi
done
[[ $failed -eq 0 ]] && total=$((total + 1))
# Faults across hosts (test_faults.py, plain pytest on this machine): a host cut off mid-loop, a
# rank killed on another host and a damaged calibration cache (make test); --all adds a host
# slowed tenfold. test_elastic_cluster.py: a host killed under ringletrun's elastic driver
# (--all adds a link cut, and Horovod's elastic benchmark with a host killed).
if [[ $faults -eq 1 ]]; then
  echo "=== cluster, faults across hosts"
  fault_selection=(-k "cut_off or killed or cache or host_killed_mid_training")
  [[ $all -eq 1 ]] && fault_selection=()
  fault_files=(tests/cluster/test_faults.py tests/cluster/test_elastic_cluster.py)
  [[ $ulfm -eq 1 ]] && fault_files=(tests/cluster/test_ulfm_cluster.py) && fault_selection=()
  faults_status=0
  faults_out=$(timeout -k 10 700 "$PYTHON" -m pytest -q -rA --color=no -p no:cacheprovider \
    "${fault_files[@]}" "${fault_selection[@]}" 2>&1) || faults_status=$?
  echo "$faults_out" | grep -E "^(mpirun ended|left running|[0-9]+ stall)|passed|failed|error" \
    || true
  # Only "N passed" (and the deselected, under -k) counts: a skip would not be a pass.
  if [[ $faults_status -eq 0 ]] && summary=$(echo "$faults_out" | tail -n 1) \
      && [[ $summary =~ ^=*\ *([0-9]+)\ passed(,\ [0-9]+\ deselected)?(,\ [0-9]+\ warnings?)?\ in ]]; then
    total=$((total + BASH_REMATCH[1]))
  else
    echo "$faults_out" | tail -n 60
    echo "=== cluster, faults across hosts: FAILED (pytest exit $faults_status)"
    failed=1
  fi
fi

echo "=== cluster tests: $total passed over ${#layouts[@]} layouts, Jupyter across hosts, the benchmark$([[ $faults -eq 1 ]] && echo ' and the faults')$([[ $failed -eq 0 ]] || echo ', SOME FAILED')"
exit "$failed"
