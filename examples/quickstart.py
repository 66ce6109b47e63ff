"""ringlet quickstart: an allreduce of each dtype with each algorithm, checked and timed.

    mpirun -n 2 python examples/quickstart.py [--elements 1048576] [--repeat 10]

Every rank checks its result against a NumPy reduction of all ranks' inputs (each rank can
rebuild the others' inputs from their rank number), so a wrong byte anywhere fails the run.
Rank 0 prints a table of median times.
"""

from __future__ import annotations

import argparse
import time

import ml_dtypes
import numpy as np

import ringlet

DTYPES = {
    "float32": np.float32,
    "float64": np.float64,
    "float16": np.float16,
    "bfloat16": ml_dtypes.bfloat16,
    "int32": np.int32,
    "int64": np.int64,
}


def input_of(rank: int, elements: int, dtype) -> np.ndarray:
    # Small integers: sums over a few ranks are exact even in bfloat16.
    return ((np.arange(elements) * 7 + rank * 3) % 11 - 5).astype(dtype)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--elements", type=int, default=1 << 20)
    parser.add_argument("--repeat", type=int, default=10)
    args = parser.parse_args()

    rank, size = ringlet.rank(), ringlet.size()
    if rank == 0:
        print(f"ringlet on {size} ranks, thread level {ringlet.thread_level()}, "
              f"{args.elements} elements per allreduce, median of {args.repeat}")
        print(f"{'dtype':>9} {'algorithm':>19} {'median ms':>10} {'GB/s busbw':>11}  check")
    failures = 0
    for name, dtype in DTYPES.items():
        x = input_of(rank, args.elements, dtype)
        expected = np.sum([input_of(r, args.elements, dtype) for r in range(size)], axis=0,
                          dtype=dtype)
        # Every algorithm that can reduce this dtype ("mpi" cannot reduce 16-bit floats: MPI
        # has none, which is one reason ringlet exists).
        for algorithm in ringlet.algorithms("allreduce", dtype=name):
            times = []
            for _ in range(args.repeat):
                buf = x.copy()
                ringlet.barrier()
                start = time.perf_counter()
                ringlet.allreduce(buf, "sum", out=buf, algorithm=algorithm)
                times.append(time.perf_counter() - start)
            ok = buf.tobytes() == expected.tobytes()
            all_ok = ringlet.allreduce(np.array([int(ok)], dtype=np.int32), "min")[0] == 1
            failures += not all_ok
            median = float(np.median(times))
            busbw = 2 * (size - 1) / size * x.nbytes / median / 1e9 if size > 1 else 0.0
            if rank == 0:
                print(f"{name:>9} {algorithm:>19} {median * 1e3:10.3f} {busbw:11.2f}  "
                      f"{'ok' if all_ok else 'WRONG'}")
    if rank == 0:
        print("all results correct on every rank" if not failures else f"{failures} WRONG")
    return 1 if failures else 0


if __name__ == "__main__":
    raise SystemExit(main())
