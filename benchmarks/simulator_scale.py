"""Link loads and predicted times at scale, from the simulator (Jain, Lau & Kale's comparison:
a flat ring against two-tier, max and mean load on the hosts' links).

    python benchmarks/simulator_scale.py [--hosts 128] [--ranks-per-host 32] [--size 64M]
        [--inter 12.5GB/s,2us] [--intra 20GB/s,0.3us] [--algorithms ring,two_tier,...]

Prints a Markdown table: each algorithm and placement, its predicted time, the busiest and the
mean host-link load (bytes one way), messages, and how long the simulation took on one core.
"""

from __future__ import annotations

import argparse
import os
import platform
from datetime import datetime

from ringlet import simulate as sim

CASES = [
    # (algorithm, placement, rings in node-major order)
    ("ring", "block", True),
    ("ring", "round-robin", False),
    ("ring", "round-robin", True),
    ("pipelined_ring", "block", True),
    ("halving_doubling", "block", True),
    ("recursive_doubling", "block", True),
    ("two_tier", "block", True),
    ("two_tier", "round-robin", True),
]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hosts", type=int, default=128)
    parser.add_argument("--ranks-per-host", type=int, default=32)
    parser.add_argument("--size", default="64M")
    parser.add_argument("--inter", default="12.5GB/s,2us")
    parser.add_argument("--intra", default="20GB/s,0.3us")
    parser.add_argument("--algorithms", default=None,
                        help="comma-separated subset of the cases' algorithms")
    args = parser.parse_args()
    wanted = set(args.algorithms.split(",")) if args.algorithms else None
    ranks = args.hosts * args.ranks_per_host
    size = sim.parse_size(args.size)
    print(f"allreduce of {size >> 20} MiB on {args.hosts} hosts x {args.ranks_per_host} ranks "
          f"({ranks} ranks), host links {args.inter}, inside hosts {args.intra}; "
          f"{platform.node()}, {os.cpu_count()} cores, {datetime.now():%Y-%m-%d %H:%M}\n")
    print("| algorithm | placement | ring order | predicted | max link | mean link | "
          "messages | simulated in |")
    print("|---|---|---|---|---|---|---|---|")
    for algorithm, placement, node_major in CASES:
        if wanted is not None and algorithm not in wanted:
            continue
        result = sim.simulate("allreduce", algorithm, hosts=args.hosts,
                              ranks_per_host=args.ranks_per_host, size=args.size,
                              inter=args.inter, intra=args.intra, placement=placement,
                              node_major=node_major)
        order = "node-major" if node_major else "rank order"
        print(f"| {algorithm} | {placement} | {order} | {result.predicted_s * 1e3:.2f} ms | "
              f"{result.max_link_bytes / 2**20:.1f} MiB | {result.mean_link_bytes / 2**20:.1f} MiB"
              f" | {result.messages:,} | {result.simulated_in_s:.1f} s |", flush=True)


if __name__ == "__main__":
    main()
