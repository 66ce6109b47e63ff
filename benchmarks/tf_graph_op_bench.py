"""TensorFlow's graph allreduce as ringlet's compiled operation against ``tf.numpy_function``,
in one job, interleaved, beside ringlet's in-place NumPy allreduce of the same arrays (issue
36: the graph at most 1.1x the NumPy call).

    mpirun -n 2 python benchmarks/tf_graph_op_bench.py [--rounds 3] [--calls 20]
        [--gradient-mib 36,0.05] [--json FILE]

For each gradient set (tf_bench.py's 20 shapes scaled to each ``--gradient-mib``), four
``tf.function``s of ``hvd.grouped_allreduce`` (average), built once with each operation (the
compiled one, and ``tf.numpy_function`` as where it cannot be built): on the tensors as
captured constants (only read: results written elsewhere), and on tensors the function
computes (``t * 2``: nobody else's, so the compiled operation reduces them in place; the
multiplication is in the time). And ``hvd.grouped_allreduce_`` of aligned NumPy arrays in place.
A round calls each candidate ``--calls`` times, the candidates alternating, a barrier before
each call; a call's time is the slowest rank's. Every result is checked. Prints the medians over
the rounds, with the range of the per-round medians, and the ratios to NumPy.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import tensorflow as tf
from mpi4py import MPI
from tf_bench import gradient_shapes  # beside this script, on its path

import ringlet
import ringlet.hvd.tensorflow as hvd
from ringlet.hvd.tensorflow import _kernel

CANDIDATES = ("op captured", "numpy_function captured", "op computed",
              "numpy_function computed", "numpy in place")


def graph_function(tensors: list, compiled: bool, computed: bool):
    @tf.function
    def reduce():
        inputs = [t * 2.0 for t in tensors] if computed else tensors
        return hvd.grouped_allreduce(inputs, op=hvd.Average)

    real = _kernel.allreduce_op
    if not compiled:  # traced as where the operation cannot be built
        _kernel.allreduce_op = lambda: None
    try:
        graph = reduce.get_concrete_function().graph
    finally:
        _kernel.allreduce_op = real
    wanted = "RingletAllreduce" if compiled else "PyFunc"
    if wanted not in {node.type for node in graph.get_operations()}:
        raise SystemExit(f"tf_graph_op_bench: the function has no {wanted} operation")
    return reduce


def measure(comm: MPI.Comm, mib: float, rounds: int, calls: int) -> dict:
    rank, size = comm.Get_rank(), comm.Get_size()
    shapes = gradient_shapes(mib)
    tensors = [tf.constant(np.full(s, rank + 1.0, np.float32)) for s in shapes]
    arrays = [ringlet.aligned_empty(s, np.float32) for s in shapes]
    for array in arrays:
        array.fill(rank + 1.0)
    mean = (size + 1) / 2

    def numpy_in_place():  # the mean stays the mean from the first call on
        return hvd.grouped_allreduce_(arrays, op=hvd.Average)

    functions = {
        "op captured": (graph_function(tensors, True, False), mean),
        "numpy_function captured": (graph_function(tensors, False, False), mean),
        "op computed": (graph_function(tensors, True, True), 2 * mean),
        "numpy_function computed": (graph_function(tensors, False, True), 2 * mean),
        "numpy in place": (numpy_in_place, mean),
    }
    per_round: dict[str, list[float]] = {name: [] for name in CANDIDATES}
    correct = True
    for _ in range(2):  # warm-up: traces, builds, first-touch of the kept results
        for function, _want in functions.values():
            function()
    for _ in range(rounds):
        samples: dict[str, list[float]] = {name: [] for name in CANDIDATES}
        for _ in range(calls):
            for name, (function, want) in functions.items():
                comm.Barrier()
                start = time.perf_counter()
                out = function()
                elapsed = comm.allreduce(time.perf_counter() - start, op=MPI.MAX)
                samples[name].append(elapsed)
                first = out[0].numpy() if hasattr(out[0], "numpy") else out[0]
                correct &= bool(np.all(first == want))
                del out, first
        for name in CANDIDATES:
            per_round[name].append(statistics.median(samples[name]))
    correct = comm.allreduce(correct, op=MPI.LAND)
    return {"mib": mib, "bytes": 4 * sum(int(np.prod(s)) for s in shapes),
            "tensors": len(shapes), "correct": correct,
            "rounds_ms": {n: [1e3 * t for t in per_round[n]] for n in CANDIDATES}}


def report(result: dict) -> None:
    rows = result["rounds_ms"]
    base = rows["numpy in place"]
    print(f"\n{result['tensors']} float32 tensors, {result['bytes'] / (1 << 20):.2f} MiB, "
          f"ms per call (slowest rank), median of {len(base)} round medians (range); "
          f"results right: {'yes' if result['correct'] else 'NO'}\n")
    print("| candidate | ms | range | / numpy in place (range per round) |")
    print("|---|---|---|---|")
    for name, values in rows.items():
        ratios = [v / b for v, b in zip(values, base)]
        print(f"| {name} | {statistics.median(values):.2f} | {min(values):.2f}-{max(values):.2f}"
              f" | {statistics.median(ratios):.2f} ({min(ratios):.2f}-{max(ratios):.2f}) |")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--calls", type=int, default=20)
    parser.add_argument("--gradient-mib", default="36,0.05",
                        help="comma-separated sizes of the gradient set, in MiB")
    parser.add_argument("--json", metavar="FILE")
    args = parser.parse_args(argv)
    hvd.init()
    comm = MPI.COMM_WORLD
    if _kernel.allreduce_op() is None:
        raise SystemExit("tf_graph_op_bench: ringlet's TensorFlow operation could not be built")
    results = [measure(comm, float(mib), args.rounds, args.calls)
               for mib in args.gradient_mib.split(",")]
    if comm.Get_rank() == 0:
        print(f"# tf_graph_op_bench: {comm.Get_size()} ranks, TensorFlow {tf.__version__}, "
              f"{time.strftime('%Y-%m-%dT%H:%M:%S%z')}")
        for result in results:
            report(result)
        if args.json:
            Path(args.json).write_text(json.dumps({"ranks": comm.Get_size(),
                                                   "results": results}, indent=1))
    return 0 if all(r["correct"] for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
