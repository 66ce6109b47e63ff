#!/usr/bin/env bash
# make bench-cluster: the emulated cluster (4 hosts, 1 Gbit/s links each way, 2 ranks per
# host) with block and round-robin placement; benchmarks/emulated_cluster_bench.py on each.
# The cluster is torn down however the run ends. Extra arguments go to the benchmark.
# HOSTS, RATE and PER_HOST (ranks per host, default 2) change the layout; with PER_HOST=1 the
# two placements are the same, and it runs once.
set -euo pipefail
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$REPO"
PYTHON=${PYTHON:-$REPO/.venv/bin/python}
HOSTS=${HOSTS:-4}
PER_HOST=${PER_HOST:-2}
RATE=${RATE:-1gbit}
JSON=${JSON:-build/emulated-cluster-bench.jsonl}
rate_bits=$(python3 -c "import sys, re; m = re.fullmatch(r'(\d+(?:\.\d+)?)([kmg]?)(bit|bps)', \
sys.argv[1].lower()); print(float(m[1]) * {'': 1, 'k': 1e3, 'm': 1e6, 'g': 1e9}[m[2]] \
* (8 if m[3] == 'bps' else 1))" "$RATE")

trap 'tools/emulated_cluster.sh down >/dev/null 2>&1 || true' EXIT
trap 'exit 130' INT TERM   # then the EXIT trap tears down
tools/emulated_cluster.sh up "$HOSTS" "$RATE"
mkdir -p "$(dirname "$JSON")" build/cluster-tools
# What one link really carries: 8 MiB one way between two hosts, three times.
mpicc -O2 -o build/cluster-tools/hostcheck tests/cluster/hostcheck.c
timeout -k 10 120 tools/emulated_cluster.sh mpirun -n 2 --map-by node build/cluster-tools/hostcheck
placements=("block:--map-by ppr:$PER_HOST:node" "round-robin:--map-by node")
[[ $PER_HOST == 1 ]] && placements=("one-per-host:--map-by node")
for placement in "${placements[@]}"; do
  read -r -a mapping <<< "${placement#*:}"
  timeout -k 10 900 tools/emulated_cluster.sh mpirun -n $((PER_HOST * HOSTS)) "${mapping[@]}" \
    "$PYTHON" benchmarks/emulated_cluster_bench.py --label "${placement%%:*}" \
    --rate-bits "$rate_bits" --json "$JSON" "$@"
done
echo "results appended to $JSON"
