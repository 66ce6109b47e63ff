"""Allreduce across the hosts of the emulated cluster (make bench-cluster runs it under
tools/emulated_cluster.sh mpirun, once per placement).

First the first `auto` call on an empty calibration cache, calibration included (what a user's
first training step waits for). Then every candidate in turn, interleaved, each repetition
timed on the slowest rank after a barrier: ringlet's ring (node-major order), halving-doubling,
two_tier and auto, and the MPI library's own MPI_Allreduce through mpi4py ("native"). Last, in
a block of its own (changing the setting discards auto's table), the ring in rank order: the
flat ring that ignores hosts; and in another, ring, halving-doubling and two_tier with whole
messages between hosts (what ringlet sent before calibration chose pieces between nodes, see
``ringlet.settings``). Medians, against the host-link bound 2(H-1)/H * m / B with B the links'
shaped rate.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np
from mpi4py import MPI

COMM = MPI.COMM_WORLD


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--bytes", type=int, default=16 << 20, help="float32 message size")
    parser.add_argument("--reps", type=int, default=7)
    parser.add_argument("--rate-bits", type=float, default=1e9, help="each host link's rate")
    parser.add_argument("--label", default="", help="the placement, for the report")
    parser.add_argument("--json", type=Path, help="append the result here (rank 0)")
    parser.add_argument("--max-seconds", type=float, default=240,
                        help="stop repeating once this much time has passed")
    return parser.parse_args()


def slowest(seconds: float) -> float:
    return COMM.allreduce(seconds, op=MPI.MAX)


def main() -> None:
    args = parse_args()
    # An empty calibration cache, the same directory on every rank.
    cache = COMM.bcast(tempfile.mkdtemp(prefix="ringlet-cluster-bench-") if COMM.rank == 0
                       else None, root=0)
    os.environ["RINGLET_CACHE_DIR"] = cache
    import ringlet

    ringlet.init()
    topology = ringlet.topology()
    hosts = topology.cross_size
    buf = np.ones(args.bytes // 4, dtype=np.float32)

    COMM.Barrier()
    start = time.perf_counter()
    ringlet.allreduce(buf, out=buf)  # auto: calibrates first
    first_auto = slowest(time.perf_counter() - start)

    def ringlet_call(algorithm: str):
        return lambda: ringlet.allreduce(buf, out=buf, algorithm=algorithm)

    def rounds(calls: dict, count: int, max_seconds: float = float("inf")) -> dict:
        """Each call once per round, interleaved, each timed on the slowest rank after a
        barrier; stops after ``count`` rounds or once ``max_seconds`` have passed."""
        samples: dict[str, list[float]] = {name: [] for name in calls}
        began = time.perf_counter()
        for _ in range(count):
            for name, call in calls.items():
                buf.fill(1)
                COMM.Barrier()
                start = time.perf_counter()
                call()
                samples[name].append(slowest(time.perf_counter() - start))
            if slowest(time.perf_counter() - began) > max_seconds:
                break
        return samples

    times = rounds({
        "ring": ringlet_call("ring"),
        "halving_doubling": ringlet_call("halving_doubling"),
        "two_tier": ringlet_call("two_tier"),
        "auto": ringlet_call("auto"),
        "native": lambda: COMM.Allreduce(MPI.IN_PLACE, buf, op=MPI.SUM),
    }, args.reps, args.max_seconds)
    done = len(times["ring"])
    # Blocks of their own: changing a setting discards auto's table.
    ringlet.settings(node_major_rings=False)
    times.update(rounds({"ring, rank order (flat)": ringlet_call("ring")}, done))
    ringlet.settings(node_major_rings=True)
    pieces = ringlet.settings()["across_message_bytes"]
    ringlet.settings(across_message_bytes=2**31 - 1)
    times.update(rounds({f"{name}, whole messages between hosts": ringlet_call(name)
                         for name in ("ring", "halving_doubling", "two_tier")}, done))
    ringlet.settings(across_message_bytes="auto")
    auto_choice = ringlet.selector.choice(args.bytes)
    refinements = ringlet.selector.refinements()
    installed = ringlet.calibration.installed()
    calibration = installed.calibration_seconds if installed else float("nan")

    if COMM.rank != 0:
        return
    bound = 2 * (hosts - 1) / hosts * args.bytes / (args.rate_bits / 8)
    medians = {name: statistics.median(samples) for name, samples in times.items()}
    native = medians["native"]
    label = args.label or topology.placement
    print(f"\n{ringlet.size()} ranks on {hosts} hosts ({label}; placement seen: "
          f"{topology.placement}, ranks per host {list(topology.ranks_per_node)}), "
          f"float32 {args.bytes >> 20} MiB, links {args.rate_bits / 1e9:g} Gbit/s, "
          f"{len(times['ring'])} repetitions, medians of the slowest rank")
    print(f"host-link bound 2(H-1)/H*m/B = {bound * 1e3:.0f} ms; first auto call, calibration "
          f"included: {first_auto:.2f} s (calibration {calibration:.2f} s); auto runs "
          f"{auto_choice}; messages between hosts in pieces of "
          f"{'whole' if pieces >= 2**31 - 1 else f'{pieces >> 10} KiB'}")
    print("| algorithm | median ms | x bound | x native |")
    print("|---|---|---|---|")
    for name, median in medians.items():
        print(f"| {name} | {median * 1e3:.0f} | {median / bound:.2f} | {median / native:.2f} |")
    if refinements:
        print(f"auto's refinement: {refinements}")
    if installed:
        # What auto's choice rests on: the calibrated parameters and each candidate's price.
        model = installed.model()
        print("calibration: " + ", ".join(
            f"{key} {model[key]:.3g}" for key in
            ("alpha", "beta", "alpha_across", "beta_across", "exchange_slowdown")
            if key in model) + f", corrections {model.get('corrections')}")
    ringlet.selector.explain(args.bytes)
    if args.json:
        record = {
            "date": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "machine": socket.gethostname(),
            "label": label, "placement": topology.placement, "hosts": hosts,
            "ranks": ringlet.size(), "bytes": args.bytes, "rate_bits": args.rate_bits,
            "bound_s": bound, "first_auto_s": first_auto, "calibration_s": calibration,
            "auto_runs": auto_choice, "across_message_bytes": pieces, "medians_s": medians,
            "parameters": installed.model() if installed else None,
            "samples_s": times,
        }
        with args.json.open("a") as out:
            out.write(json.dumps(record) + "\n")


if __name__ == "__main__":
    main()
