"""One rank's view of a job that Slurm started (tests/cluster/test_slurm.py runs it on
every rank, under sbatch, salloc + mpirun, srun and ringletrun): where ringlet says the ranks
run, whether allreduce is exact, whether a mismatch raises MismatchError. Each rank writes
what it found to $PROBE_DIR/rank<r>.json; the test compares that with Slurm's placement.

Inputs are small integers, so the sums are exact in every algorithm and NumPy's sum is the
answer.

`slurm_probe.py --loop SECONDS`: allreduce after allreduce for that long instead (the test of a
node cut off mid-job); each rank writes rank<r>.looping once it is under way."""

from __future__ import annotations

import json
import os
import socket
import sys
import time
from pathlib import Path

import numpy as np

import ringlet


def main() -> None:
    ringlet.init()
    rank, size = ringlet.rank(), ringlet.size()
    topology = ringlet.topology()
    count = 100_003  # odd: uneven shares in every algorithm
    inputs = [(np.arange(count, dtype=np.float64) % 97) * (r + 1) for r in range(size)]
    expected = np.sum(np.stack(inputs), axis=0)
    exact = {}
    for algorithm in ("auto", "ring", "two_tier", "halving_doubling"):
        result = ringlet.allreduce(inputs[rank], algorithm=algorithm)
        exact[algorithm] = bool(np.array_equal(result, expected))
    try:
        ringlet.allreduce(np.ones(3 + rank, np.float32))  # every rank a different length
        mismatch = "no error"
    except ringlet.MismatchError as error:
        mismatch = f"MismatchError: {error}"
    except Exception as error:  # the test reports what came instead
        mismatch = f"{type(error).__name__}: {error}"
    # The mismatch left every rank in step: the next collective is right.
    after = bool(np.array_equal(ringlet.allreduce(inputs[rank]), expected))
    report = {
        "rank": rank,
        "size": size,
        "hostname": socket.gethostname(),
        "slurm_node": os.environ.get("SLURMD_NODENAME"),
        "job_nodes": os.environ.get("SLURM_JOB_NODELIST"),
        "hosts": list(topology.hosts),
        "nodes": list(topology.nodes),
        "local_size": topology.local_size,
        "cross_size": topology.cross_size,
        "placement": topology.placement,
        "exact": exact,
        "mismatch": mismatch,
        "exact_after_mismatch": after,
        "ringlet": ringlet.__file__,
        "pid": os.getpid(),
    }
    Path(os.environ["PROBE_DIR"], f"rank{rank}.json").write_text(json.dumps(report))
    ringlet.shutdown()


def loop(seconds: float) -> None:
    ringlet.init()
    x = np.ones(1 << 16, np.float32)
    started = time.monotonic()
    calls = 0
    while time.monotonic() - started < seconds:
        ringlet.allreduce(x)
        calls += 1
        if calls == 20:
            Path(os.environ["PROBE_DIR"], f"rank{ringlet.rank()}.looping").touch()
    ringlet.shutdown()


if __name__ == "__main__":
    if sys.argv[1:2] == ["--loop"]:
        loop(float(sys.argv[2]))
    else:
        main()
