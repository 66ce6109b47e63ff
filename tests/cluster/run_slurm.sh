#!/usr/bin/env bash
# The Slurm tests: a real slurmctld and a slurmd per host on the emulated cluster
# (tools/emulated_slurm.sh), and tests/cluster/test_slurm.py run on host 0 against it.
#
#   tests/cluster/run_slurm.sh          the representative slice (make test)
#   tests/cluster/run_slurm.sh --all    every test (make test-cluster)
#
# Installs Slurm and munge with apt when missing. Without root, network namespaces, or Slurm and
# no way to install it, it says SKIPPED and why (and passes nothing); once Slurm is installed,
# daemons that do not start are a failure. The daemons and the cluster are
# torn down however the run ends.
set -euo pipefail
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cd "$REPO"
PYTHON=${PYTHON:-$REPO/.venv/bin/python}
CLUSTER=tools/emulated_cluster.sh
SLURM=tools/emulated_slurm.sh
# The slice: one job per way of starting ranks that make test must keep working (sbatch with
# srun, salloc + mpirun, and the engines of a notebook); --all adds the rest.
QUICK="test_sbatch_job_with_srun or test_salloc_then_mpirun_without_a_hostfile or test_jupyter_engines_from_slurm"
select=(-k "$QUICK")
[[ ${1:-} == --all ]] && select=()

skip() { echo "=== Slurm tests: SKIPPED ($*); nothing counted as passed"; exit 0; }
[[ $(id -u) -eq 0 ]] || skip "network namespaces and Slurm's daemons need root"
command -v tc >/dev/null || skip "no tc (iproute2)"
command -v nsenter >/dev/null || skip "no nsenter (util-linux)"
probe=rgl-probe$$
ip netns add "$probe" 2>/dev/null || skip "ip netns add fails here (no network namespaces)"
ip netns del "$probe"
bash "$SLURM" install || skip "Slurm and munge are not installed and could not be installed (above)"

trap 'bash "$SLURM" down >/dev/null 2>&1 || true; bash "$CLUSTER" down >/dev/null 2>&1 || true' EXIT
trap 'exit 130' INT TERM   # then the EXIT trap tears down
bash "$CLUSTER" up 4 1gbit
bash "$SLURM" up
eval "$(bash "$SLURM" env)"

REPORTS=build/test-reports/slurm
rm -rf "$REPORTS"
mkdir -p "$REPORTS"
status=0
# The tests' files under build/, not /tmp: each host has a /tmp of its own (as real nodes do),
# and jobs on every host write there, as on a cluster's shared file system.
output=$(timeout -k 10 1200 bash "$CLUSTER" on 0 "$PYTHON" -m pytest -v --color=no \
  -p no:cacheprovider --durations=0 --basetemp="$REPORTS/tmp" "${select[@]}" \
  tests/cluster/test_slurm.py 2>&1) || status=$?
echo "$output" > "$REPORTS/pytest.log"
echo "$output" | grep -E "(PASSED|FAILED|ERROR|SKIPPED)( |$)" || true
# Only "N passed" counts: a skip, a deselection of everything or an error is no pass.
summary=$(echo "$output" | tail -n 1)
if [[ $status -eq 0 && $summary =~ ^=*\ *([0-9]+)\ passed(,\ [0-9]+\ deselected)?\ in ]]; then
  echo "=== Slurm tests: ${BASH_REMATCH[1]} passed"
  exit 0
fi
echo "$output" | tail -n 80
echo "=== Slurm tests: FAILED (pytest exit $status; the whole log: $REPORTS/pytest.log)"
exit 1
