"""Small groups: ``average_gradients`` of 2-16 small arrays against one allreduce of their total
size (issue 35: at most 1.5x), in one run, interleaved, quiet and under load.

    mpirun -n 2 python benchmarks/small_group_bench.py [--rounds 5] [--load 2] [--json FILE]

Per round, for each count of arrays (2, 4, 8, 16) and array size (64 B, 4 KiB of float32): a
block of ``--calls`` back-to-back ``average_gradients(arrays)`` and a block of as many
``allreduce(flat, "avg", out=flat)`` of the same bytes, the two in alternating order, a barrier
before each block; a block's time per call is the slowest rank's. With ``--load K``, each rank
also runs K busy processes (a pure-Python loop each) for the whole run, so that ringlet's
threads compete for the cores. Prints, per case, the medians over the rounds and their ratio,
with the range of the per-round ratios.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time

import numpy as np
from mpi4py import MPI

import ringlet

COUNTS = (2, 4, 8, 16)
ARRAY_BYTES = (64, 4096)


SPIN = "import time\nend = time.monotonic() + {seconds}\nwhile time.monotonic() < end: pass"


def block(comm: MPI.Comm, call, calls: int) -> float:
    comm.Barrier()
    start = time.perf_counter()
    for _ in range(calls):
        call()
    elapsed = (time.perf_counter() - start) / calls
    return comm.allreduce(elapsed, op=MPI.MAX)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--calls", type=int, default=400)
    parser.add_argument("--load", type=int, default=0, help="busy processes per rank")
    parser.add_argument("--json")
    args = parser.parse_args()
    comm = MPI.COMM_WORLD
    ringlet.init()
    # Bounded, so that no spinner outlives a run that dies.
    spinners = [subprocess.Popen([sys.executable, "-c", SPIN.format(seconds=3600)])
                for _ in range(args.load)]
    cases = [(count, nbytes) for count in COUNTS for nbytes in ARRAY_BYTES]
    times: dict[tuple[int, int], dict[str, list[float]]] = {
        case: {"group": [], "one": []} for case in cases}
    try:
        for round_ in range(args.rounds):
            for count, nbytes in cases:
                arrays = [np.full(nbytes // 4, ringlet.rank() + 1.0, np.float32)
                          for _ in range(count)]
                flat = np.full(count * nbytes // 4, ringlet.rank() + 1.0, np.float32)
                ways = {
                    "group": lambda arrays=arrays: ringlet.average_gradients(arrays),
                    "one": lambda flat=flat: ringlet.allreduce(flat, "avg", out=flat),
                }
                order = list(ways) if round_ % 2 == 0 else list(reversed(ways))
                for name in order:  # warm: calibration, caches
                    block(comm, ways[name], 20)
                for name in order:
                    times[count, nbytes][name].append(block(comm, ways[name], args.calls))
                # Averages of equal inputs stay where they were: the reduction was real.
                expected = (ringlet.size() + 1) / 2
                assert all(np.allclose(a, expected) for a in arrays), "wrong average"
    finally:
        for process in spinners:
            process.kill()
            process.wait()
    if comm.Get_rank() == 0:
        print(f"{comm.Get_size()} ranks, {args.rounds} rounds of {args.calls} calls, "
              f"load {args.load} busy processes per rank; medians (µs per call), slowest rank")
        print("| arrays x bytes | average_gradients | one allreduce of the total | ratio | "
              "per-round ratios |")
        print("|---|---|---|---|---|")
        rows = []
        for (count, nbytes), row in times.items():
            ratios = [g / o for g, o in zip(row["group"], row["one"])]
            group, one = statistics.median(row["group"]), statistics.median(row["one"])
            rows.append({"arrays": count, "bytes": nbytes, "group_us": group * 1e6,
                         "one_us": one * 1e6, "ratio": statistics.median(ratios),
                         "ratios": ratios})
            print(f"| {count} x {nbytes} | {group * 1e6:.1f} | {one * 1e6:.1f} | "
                  f"{statistics.median(ratios):.2f} | {min(ratios):.2f}-{max(ratios):.2f} |")
        if args.json:
            with open(args.json, "w") as out:
                json.dump({"ranks": comm.Get_size(), "rounds": args.rounds,
                           "load": args.load, "rows": rows}, out, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
