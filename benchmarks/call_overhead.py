"""Per-call cost of a small in-place allreduce, against mpi4py's own Allreduce, interleaved.

    mpirun -n 2 python benchmarks/call_overhead.py [--sizes 8,32,128] [--per-call]

Loops (the default): for each candidate, 7 timed loops of 5000 calls after a warm-up, the
candidates taking turns loop by loop; prints the median loop's time per call in microseconds
(rank 0) and its ratio to mpi4py's. ``--per-call`` times every call alone after a barrier, the
candidates in a fresh random order each round (as ``allreduce_bench.py`` does), and prints the
median over 40000 rounds of the slowest rank's time. Only the public API is used, so one copy
of this script compares two builds: run it with each on ``PYTHONPATH``, alternately.
"""

from __future__ import annotations

import argparse
import random
import time
from collections.abc import Callable

import numpy as np
from mpi4py import MPI

import ringlet

CALLS, LOOPS = 5000, 7
ROUNDS, WARMUP_ROUNDS = 40000, 5000
CANDIDATES = ("recursive_doubling", "mpi", "auto")


def candidates(nbytes: int) -> dict[str, Callable[[], object]]:
    """One call per candidate, each on a buffer of its own, mpi4py's last."""
    calls: dict[str, Callable[[], object]] = {}
    for name in CANDIDATES:
        x = np.ones(max(nbytes // 4, 1), dtype=np.float32)
        calls[name] = lambda x=x, name=name: ringlet.allreduce(x, out=x, algorithm=name)
    native = np.ones(max(nbytes // 4, 1), dtype=np.float32)
    calls["mpi4py"] = lambda: MPI.COMM_WORLD.Allreduce(MPI.IN_PLACE, native)
    return calls


def loops_us(calls: dict[str, Callable[[], object]]) -> dict[str, float]:
    """Median over LOOPS of each candidate's mean time per call in a loop of CALLS."""
    times: dict[str, list[float]] = {name: [] for name in calls}
    for call in calls.values():
        for _ in range(500):
            call()
    for _ in range(LOOPS):
        for name, call in calls.items():
            MPI.COMM_WORLD.Barrier()
            start = time.perf_counter()
            for _ in range(CALLS):
                call()
            times[name].append((time.perf_counter() - start) / CALLS * 1e6)
    return {name: float(np.median(t)) for name, t in times.items()}


def per_call_us(calls: dict[str, Callable[[], object]]) -> dict[str, float]:
    """Median over ROUNDS of the slowest rank's time for one call made right after a barrier."""
    names, runs = list(calls), list(calls.values())
    order = list(range(len(runs)))
    shuffle = random.Random(7).shuffle  # the same order on every rank
    barrier, clock = MPI.COMM_WORLD.Barrier, time.perf_counter

    def rounds(count: int) -> np.ndarray:
        seconds = np.empty((count, len(runs)))
        for r in range(count):
            shuffle(order)
            for i in order:
                barrier()
                start = clock()
                runs[i]()
                seconds[r, i] = clock() - start
        return seconds

    rounds(WARMUP_ROUNDS)
    seconds = rounds(ROUNDS)
    MPI.COMM_WORLD.Allreduce(MPI.IN_PLACE, seconds, op=MPI.MAX)
    return dict(zip(names, (np.median(seconds, axis=0) * 1e6).tolist()))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="8", help="comma-separated message sizes in bytes")
    parser.add_argument("--per-call", action="store_true",
                        help="time single calls after a barrier instead of loops")
    args = parser.parse_args()
    for nbytes in (int(s) for s in args.sizes.split(",")):
        calls = candidates(nbytes)
        results = per_call_us(calls) if args.per_call else loops_us(calls)
        if MPI.COMM_WORLD.Get_rank() == 0:
            native = results["mpi4py"]
            print(f"{nbytes}B " + " ".join(
                f"{name}={us:.2f}us(x{us / native:.3f})" for name, us in results.items()),
                flush=True)


if __name__ == "__main__":
    main()
