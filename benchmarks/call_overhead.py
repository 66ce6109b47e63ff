"""Per-call cost of a tiny in-place allreduce (2 float32), against mpi4py's own Allreduce.

    mpirun -n 2 python benchmarks/call_overhead.py

For each algorithm: 7 timed loops of 5000 calls after a warm-up; prints the median loop's time
per call in microseconds (rank 0). Run builds alternately to compare them.
"""

from __future__ import annotations

import time

import numpy as np
from mpi4py import MPI

import ringlet

CALLS, LOOPS = 5000, 7


def per_call_us(call) -> float:
    for _ in range(500):
        call()
    times = []
    for _ in range(LOOPS):
        MPI.COMM_WORLD.Barrier()
        start = time.perf_counter()
        for _ in range(CALLS):
            call()
        times.append((time.perf_counter() - start) / CALLS * 1e6)
    return sorted(times)[LOOPS // 2]


def main() -> None:
    x = np.ones(2, dtype=np.float32)
    results = {
        name: per_call_us(lambda name=name: ringlet.allreduce(x, out=x, algorithm=name))
        for name in ("recursive_doubling", "mpi", "auto")
    }
    results["mpi4py"] = per_call_us(lambda: MPI.COMM_WORLD.Allreduce(MPI.IN_PLACE, x))
    if MPI.COMM_WORLD.Get_rank() == 0:
        print(" ".join(f"{name}={us:.2f}us" for name, us in results.items()))


if __name__ == "__main__":
    main()
