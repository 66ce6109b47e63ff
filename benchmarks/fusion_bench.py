"""Gradient averaging against the allreduce it is built on: a model's gradients averaged as one
fused call, as one flat allreduce of the same bytes, and as one allreduce per array.

    mpirun -n 2 python benchmarks/fusion_bench.py [--rounds 30] [--compression bf16]

The arrays are the weights and biases of a 5-layer MLP (1024-2048-2048-1024-512-10: 10 arrays,
8.9M float32, 34 MiB). The three ways run round-robin in each round (the same order on every
rank), a barrier before each, timed alone; a round's time is the slowest rank's. Prints the
median and minimum of each and the ratio of the fused call to the flat allreduce.
"""

from __future__ import annotations

import argparse
import time

import numpy as np
from mpi4py import MPI

import ringlet

LAYERS = (1024, 2048, 2048, 1024, 512, 10)


def gradients() -> list[np.ndarray]:
    rng = np.random.default_rng(ringlet.rank())
    arrays = []
    for fan_in, fan_out in zip(LAYERS, LAYERS[1:]):
        arrays.append(rng.standard_normal((fan_out, fan_in), dtype=np.float32))
        arrays.append(rng.standard_normal(fan_out, dtype=np.float32))
    return arrays


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--compression", default=None, help="fp16 or bf16 for the fused call")
    parser.add_argument("--algorithm", default="auto", help="for every call (default: auto)")
    args = parser.parse_args()
    comm = MPI.COMM_WORLD
    grads = gradients()
    flat = np.concatenate([g.reshape(-1) for g in grads])
    ways = {
        "average_gradients (fused)": lambda: ringlet.average_gradients(
            grads, compression=args.compression, algorithm=args.algorithm),
        "one flat allreduce": lambda: ringlet.allreduce(
            flat, "avg", out=flat, algorithm=args.algorithm),
        "one allreduce per array": lambda: [
            ringlet.allreduce(g, "avg", out=g, algorithm=args.algorithm) for g in grads],
    }
    for way in ways.values():  # warm up: calibration, scratch, page faults
        way()
        way()
    ringlet.reset_stats()
    times = {name: [] for name in ways}
    for _ in range(args.rounds):
        for name, way in ways.items():
            comm.Barrier()
            start = time.perf_counter()
            way()
            elapsed = time.perf_counter() - start
            times[name].append(comm.allreduce(elapsed, op=MPI.MAX))
    if comm.Get_rank() == 0:
        nbytes = flat.nbytes
        print(f"# N={comm.Get_size()}, {len(grads)} arrays, {nbytes / 2**20:.1f} MiB float32, "
              f"{args.rounds} rounds, compression={args.compression}")
        flat_median = float(np.median(times["one flat allreduce"]))
        for name, samples in times.items():
            median = float(np.median(samples))
            print(f"{name:<28} median {median * 1e3:8.2f} ms   min {min(samples) * 1e3:8.2f} ms"
                  f"   x flat {median / flat_median:5.2f}")
        used = ", ".join(f"{name} {u['calls']}" for name, u in ringlet.stats().items())
        print(f"# algorithms run (calls): {used}")


if __name__ == "__main__":
    main()
