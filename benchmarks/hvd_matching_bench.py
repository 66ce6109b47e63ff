"""What name matching costs ringlet.hvd: order matching against RINGLET_HVD_MATCHING=name, in
one run, interleaved (the matching switched between blocks on every rank).

    mpirun -n 2 python benchmarks/hvd_matching_bench.py [--rounds 5] [--json FILE]

Per round and matching:
- latency: one small named allreduce (8 float32) after another, synchronized each time;
- throughput: a burst of named asynchronous allreduces (8 float32 each, 64 names, submitted
  in a different order on every other rank under name matching), then every synchronize: ops
  per second the negotiation sustains.
Prints medians over the rounds (each round's median latency; each round's ops per second).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import numpy as np

import ringlet
import ringlet.hvd as hvd
from ringlet.hvd._api import use_matching


def latency(calls: int) -> float:
    x = np.ones(8, np.float32)
    times = []
    for _ in range(calls):
        start = time.perf_counter()
        hvd.allreduce(x, name="latency", op=hvd.Sum)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def throughput(bursts: int, names: int, by_name: bool) -> float:
    x = np.ones(8, np.float32)
    order = list(range(names))
    if by_name and hvd.rank() % 2:
        order.reverse()  # only name matching can pair these
    hvd.barrier()
    start = time.perf_counter()
    for _ in range(bursts):
        handles = [hvd.allreduce_async(x, name=f"burst.{i}", op=hvd.Sum) for i in order]
        for handle in handles:
            hvd.synchronize(handle)
    return bursts * names / (time.perf_counter() - start)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--calls", type=int, default=300)
    parser.add_argument("--bursts", type=int, default=20)
    parser.add_argument("--names", type=int, default=64)
    parser.add_argument("--json")
    args = parser.parse_args()
    hvd.init()
    rows: dict[str, dict[str, list[float]]] = {m: {"latency": [], "ops": []}
                                               for m in ("order", "name")}
    for round_ in range(args.rounds):
        for matching in ("order", "name") if round_ % 2 == 0 else ("name", "order"):
            use_matching(matching)
            latency(20)  # warm: the first sight of a name, the caches
            rows[matching]["latency"].append(latency(args.calls))
            rows[matching]["ops"].append(throughput(args.bursts, args.names, matching == "name"))
            use_matching("order")
    use_matching("order")  # (hvd.init() started name matching: ringlet's own API follows)
    # The slowest rank's figures.
    result = {m: {"latency_us": max(ringlet.allgather_object(
        statistics.median(v["latency"]) * 1e6)), "ops_per_s": min(ringlet.allgather_object(
            statistics.median(v["ops"])))} for m, v in rows.items()}
    if hvd.rank() == 0:
        print(f"{hvd.size()} ranks, {args.rounds} rounds, medians, slowest rank")
        print("| matching | small named allreduce (us) | named ops per second (burst of "
              f"{args.names}) |")
        print("|---|---|---|")
        for matching, row in result.items():
            print(f"| {matching} | {row['latency_us']:.0f} | {row['ops_per_s']:.0f} |")
        if args.json:
            with open(args.json, "w") as out:
                json.dump({"ranks": hvd.size(), "rounds": args.rounds, **result}, out, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
