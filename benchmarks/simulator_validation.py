"""The simulator against measurements: predicted and measured allreduce times on the ranks this
job runs on, with the network model's parameters from ringlet's own calibration.

    mpirun -n 2 python benchmarks/simulator_validation.py                 # one node
    tools/emulated_cluster.sh mpirun -n 8 --map-by ppr:2:node \\
        .venv/bin/python benchmarks/simulator_validation.py --label block   # emulated cluster
    make validate-simulator   # both placements on the emulated cluster, and one node

Per size, each algorithm is timed in interleaved rounds (barrier, then the call, the slowest
rank's time), medians. The simulator then plays the same algorithm on the same placement
(``ringlet.topology()``'s nodes) with: inside a node, bandwidth 1/beta and latency alpha;
between nodes, 1/beta_across and alpha_across; combining, gamma for float32 - the parameters
``ringlet.calibrate`` measured on this machine (cached per topology) - and each node's memory
bandwidth at that message size, measured here as every rank of a node copying that many bytes
at once (cache-resident at 1 MiB, memory-bound at 64 MiB), and whether a connection between
nodes is half duplex: calibration's exchange between two nodes both ways at once against one
way, with the pieces it chose for messages between nodes (``Parameters.exchange_slowdown``).
``--inter`` replaces the calibrated link between nodes (bandwidth,latency, e.g. the rate a long
transfer reaches). The calibration runs afresh at the start (``--cached`` takes the cached one
instead): on a shared machine the speed of memory and of the MPI library drifts over hours, and
a model must be judged on parameters from the machine it predicts.
Rank 0 prints a Markdown table with predicted / measured.

    python benchmarks/simulator_validation.py --summary build/simulator-validation.jsonl

prints, without MPI, each row's ratio in every run the file holds and how many are within 25%.
"""

from __future__ import annotations

import argparse
import json
import socket
import statistics
from datetime import datetime
from pathlib import Path

import numpy as np
from mpi4py import MPI

import ringlet
from ringlet import simulate as sim

COMM = MPI.COMM_WORLD


def node_memory_bandwidth(nbytes: int, repeats: int = 9) -> float:
    """Bytes of memory traffic per second a node sustains with all its ranks copying ``nbytes``
    at once (a copy moves three bytes of traffic per byte, as the simulator counts: the source
    read, the target read for ownership and written), the best of ``repeats``; the slowest
    node's.
    Measured at each message size, as the working set decides whether the copies run from
    cache or from memory. Collective."""
    source, target = np.ones(nbytes, np.uint8), np.empty(nbytes, np.uint8)
    np.copyto(target, source)  # touch the pages first
    node = COMM.Split_type(MPI.COMM_TYPE_SHARED)
    best = float("inf")
    for _ in range(repeats):
        node.Barrier()
        start = MPI.Wtime()
        np.copyto(target, source)
        best = min(best, node.allreduce(MPI.Wtime() - start, op=MPI.MAX))
    per_node = node.size * sim.COPY_TRAFFIC * nbytes / best
    node.Free()
    return float(COMM.allreduce(per_node, op=MPI.MIN))


def _pieces(limit: int) -> str:
    return "whole" if limit >= max(ringlet._core.message_limit_options()) else f"{limit >> 10} KiB"


WITHIN = 0.25
"""The issue's target: predicted within 25% of measured."""


def summary(path: Path) -> str:
    """Every row's predicted / measured in each run of ``path`` (a run: one job's rows), as a
    Markdown table, and how many ratios are within ``WITHIN``."""
    records = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    runs = sorted({(r.get("run", ""), r["placement"]) for r in records})
    placements = list(dict.fromkeys(r["placement"] for r in records))
    count = max(sum(1 for _, p in runs if p == placement) for placement in placements)
    ratios: dict[tuple[str, int, str], list[float]] = {}
    for record in sorted(records, key=lambda r: r.get("run", "")):
        row = (record["placement"], record["size"], record["algorithm"])
        ratios.setdefault(row, []).append(record["predicted_s"] / record["measured_s"])
    lines = ["| placement | size | algorithm | " + " | ".join(f"run {i + 1}" for i in range(count))
             + " |", "|---|---|---|" + "---|" * count]
    inside = total = 0
    for (placement, size, algorithm), values in ratios.items():
        cells = []
        for value in values:
            ok = abs(value - 1) <= WITHIN
            inside, total = inside + ok, total + 1
            cells.append(f"{value:.2f}" if ok else f"**{value:.2f}**")
        cells += [""] * (count - len(cells))
        lines.append(f"| {placement} | {_size(size)} | {algorithm} | {' | '.join(cells)} |")
    lines.append(f"\n{inside} of {total} within {WITHIN:.0%} (bold: outside)")
    return "\n".join(lines)


NATIVE = "MPI_Allreduce"


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:.2f} ms" if seconds < 0.01 else f"{seconds * 1e3:.1f} ms"


def _size(nbytes: int) -> str:
    return f"{nbytes >> 20} MiB" if nbytes >= 1 << 20 else f"{nbytes >> 10} KiB"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="1M,4M,16M,64M")
    parser.add_argument("--algorithms", default="ring,halving_doubling,two_tier")
    parser.add_argument("--reps", type=int, default=7)
    parser.add_argument("--label", default="", help="the placement, for the report")
    parser.add_argument("--json", type=Path, help="append the rows here (rank 0)")
    parser.add_argument("--inter", help="the link between nodes instead of the calibrated one")
    parser.add_argument("--cached", action="store_true",
                        help="the cached calibration, if any, instead of calibrating afresh")
    parser.add_argument("--summary", type=Path,
                        help="print the ratios of every run in this JSON file and stop")
    args = parser.parse_args()
    if args.summary:
        print(summary(args.summary))
        return
    ringlet.init()
    run = COMM.bcast(datetime.now().isoformat(timespec="seconds"), root=0)
    # Collective: calibrates now (or, with --cached, loads this topology's cache if any).
    params = ringlet.calibration.parameters(recalibrate=not args.cached)
    labels = ringlet._core.nodes(0)
    names = args.algorithms.split(",")
    # The core's network for these parameters: half duplex when exchanging both ways takes
    # clearly longer than one way (Open MPI's TCP with whole messages; calibration measured it
    # with the pieces it chose).
    network = ringlet._core.simulated_network(params.parameters, "float32")
    intra, inter, gamma = network.intra, network.inter, network.gamma
    half_duplex = network.half_duplex
    if args.inter:
        inter = sim.parse_link(args.inter)
    rows = []
    for size in (sim.parse_size(s) for s in args.sizes.split(",")):
        memory = node_memory_bandwidth(size)
        x = np.zeros(size // 4, dtype=np.float32)
        for name in names:  # warm-up (and any lazy set-up)
            ringlet.allreduce(x, out=x, algorithm=name)
        # MPI's own allreduce, interleaved as a reference: what the machine gives any allreduce
        # now (on a shared VM whole jobs run several times slower at times, MPI's too).
        calls = {name: (lambda x=x, name=name: ringlet.allreduce(x, out=x, algorithm=name))
                 for name in names}
        calls[NATIVE] = lambda x=x: COMM.Allreduce(MPI.IN_PLACE, x, op=MPI.SUM)
        times: dict[str, list[float]] = {name: [] for name in calls}
        for _ in range(args.reps):
            for name, call in calls.items():
                COMM.Barrier()
                start = MPI.Wtime()
                call()
                times[name].append(COMM.allreduce(MPI.Wtime() - start, op=MPI.MAX))
        if COMM.rank == 0:
            for name in names:
                seconds = ringlet._core.simulate(
                    "allreduce", name, labels, size, intra, inter, gamma, 0.0, True, memory,
                    half_duplex=half_duplex).seconds
                measured = statistics.median(times[name])
                rows.append({"run": run, "placement": args.label, "size": size,
                             "algorithm": name,
                             "measured_s": measured, "predicted_s": seconds,
                             "native_s": statistics.median(times[NATIVE]),
                             "memory_bytes_per_s": memory})
    if COMM.rank != 0:
        return
    hosts = len(set(labels))
    model = params.model()
    print(f"simulator validation, {COMM.size} ranks on {hosts} host(s) {args.label}; "
          f"{socket.gethostname()}, {datetime.now():%Y-%m-%d %H:%M}; parameters: "
          f"{params.source}: alpha {model['alpha'] * 1e6:.1f} us, "
          f"B {1 / model['beta'] / 1e9:.2f} GB/s, "
          f"across: alpha {model['alpha_across'] * 1e6:.1f} us, "
          f"B {inter[0] / 1e6:.0f} MB/s{' (given)' if args.inter else ''}, "
          f"gamma {gamma * 1e9:.3f} ns/B; between nodes, messages in pieces of "
          f"{_pieces(model['across_message_bytes'])}, exchanging both ways takes "
          f"{model['exchange_slowdown']:.2f}x one way ({'half' if half_duplex else 'full'} "
          "duplex)\n")
    print("| placement | size | node memory | algorithm | measured | predicted "
          "| predicted / measured | MPI_Allreduce |")
    print("|---|---|---|---|---|---|---|---|")
    for row in rows:
        size = _size(row["size"])
        print(f"| {row['placement'] or '-'} | {size} | "
              f"{row['memory_bytes_per_s'] / 1e9:.1f} GB/s | {row['algorithm']} | "
              f"{_ms(row['measured_s'])} | {_ms(row['predicted_s'])} | "
              f"{row['predicted_s'] / row['measured_s']:.2f} | {_ms(row['native_s'])} |")
    if args.json:
        with args.json.open("a") as out:
            for row in rows:
                out.write(json.dumps(row) + "\n")


if __name__ == "__main__":
    main()
