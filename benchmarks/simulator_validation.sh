#!/usr/bin/env bash
# make validate-simulator: the simulator's predictions against measurements, with its
# parameters from ringlet's calibration: on one node (2 ranks), then on the emulated cluster
# (4 hosts, 1 Gbit/s links, 2 ranks per host) with block and round-robin placement. The
# cluster is torn down however the run ends. Extra arguments go to the validation script.
# RUNS=3 repeats the whole (each run calibrates afresh); the end prints every run's ratios
# that the JSON file holds (JSON=...; rows are appended, so remove it to start over).
set -euo pipefail
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$REPO"
PYTHON=${PYTHON:-$REPO/.venv/bin/python}
HOSTS=${HOSTS:-4}
RATE=${RATE:-1gbit}
JSON=${JSON:-build/simulator-validation.jsonl}
mkdir -p "$(dirname "$JSON")"
RUNS=${RUNS:-1}
trap 'tools/emulated_cluster.sh down >/dev/null 2>&1 || true' EXIT
trap 'exit 130' INT TERM   # then the EXIT trap tears down
for ((run = 1; run <= RUNS; run++)); do
  timeout -k 10 900 mpirun -n 2 "$PYTHON" benchmarks/simulator_validation.py --label one-node \
    --json "$JSON" "$@"
  tools/emulated_cluster.sh up "$HOSTS" "$RATE"
  for placement in "block:--map-by ppr:2:node" "round-robin:--map-by node"; do
    read -r -a mapping <<< "${placement#*:}"
    timeout -k 10 1800 tools/emulated_cluster.sh mpirun -n $((2 * HOSTS)) "${mapping[@]}" \
      "$PYTHON" benchmarks/simulator_validation.py --label "${placement%%:*}" --json "$JSON" "$@"
  done
  tools/emulated_cluster.sh down >/dev/null
done
echo "rows appended to $JSON; every run it holds:"
"$PYTHON" benchmarks/simulator_validation.py --summary "$JSON"
