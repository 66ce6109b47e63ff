"""ringlet.reduce (or reduce_scatter): every algorithm and MPI's own, measured against the cost
model's prediction.

    mpirun -n N python benchmarks/reduce_bench.py [--collective reduce|reduce_scatter]
        [--sizes 8,1K,64K,1M,16M] [--dtype float32] [--rounds 30] [--time-budget 2] [--markdown]

Per size, the candidates (every algorithm that can run here, "auto", and "native": mpi4py's
``comm.Reduce``, or ``Reduce_scatter_block``) are timed round-robin in a new random order each
round (the same on every rank), each call after a barrier and timed alone; a round's time is
the slowest rank's,
and the table shows the median over the rounds. "model" is the selector's prediction for the
algorithm (its cost declaration priced with the calibrated alpha, beta and gamma), to which
"predicted" adds the fixed cost of a call, measured in the same run as the median time of a
reduce of an empty array (Python, the consistency check, the result array: what the Hockney
model leaves out); "predicted / measured" says how far that is off. Every result is checked on
the root.
"""

from __future__ import annotations

import argparse
import socket
import sys
from datetime import datetime

import numpy as np
from mpi4py import MPI  # before ringlet: mpi4py initializes MPI, ringlet then shares it

import ringlet

MPI_TYPES = {"float32": MPI.FLOAT, "float64": MPI.DOUBLE, "int32": MPI.INT32_T,
             "int64": MPI.INT64_T}


def parse_size(text: str) -> int:
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    text = text.strip().upper().removesuffix("B").removesuffix("I")
    if text and text[-1] in units:
        return int(float(text[:-1]) * units[text[-1]])
    return int(text)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--collective", default="reduce", choices=["reduce", "reduce_scatter"])
    parser.add_argument("--sizes", default="8,1K,64K,1M,16M",
                        help="message sizes in bytes, K/M/G suffixes (comma-separated)")
    parser.add_argument("--dtype", default="float32", choices=sorted(MPI_TYPES))
    parser.add_argument("--rounds", type=int, default=30, help="timed rounds per size, at most")
    parser.add_argument("--time-budget", type=float, default=2.0,
                        help="seconds per size (fewer rounds if they do not fit)")
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--markdown", action="store_true")
    return parser


def timed(comm: MPI.Comm, call) -> float:
    comm.Barrier()
    started = MPI.Wtime()
    call()
    return comm.allreduce(MPI.Wtime() - started, MPI.MAX)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    comm = MPI.COMM_WORLD
    ringlet.init()
    rank, size = comm.Get_rank(), comm.Get_size()
    ringlet.selector.prepare()  # collective: calibrates (or loads the cache) on every rank
    collective = args.collective
    names = [a for a in ringlet.algorithms(collective, args.dtype)
             if ringlet._core.algorithm_unavailable(collective, a) is None]
    first = names[0]
    rows = []
    rng = np.random.default_rng(7)
    empty = np.empty(0, dtype=args.dtype)

    def call_empty() -> None:
        if collective == "reduce":
            ringlet.reduce(empty, 0, algorithm=first)
        else:
            ringlet.reduce_scatter(empty, algorithm=first)

    for _ in range(args.warmup):
        call_empty()
    overhead = float(np.median([timed(comm, call_empty) for _ in range(max(args.rounds, 20))]))
    for nbytes in (parse_size(s) for s in args.sizes.split(",")):
        # reduce_scatter: a whole number of elements per rank, as Reduce_scatter_block needs.
        unit = size if collective == "reduce_scatter" else 1
        count = max(nbytes // np.dtype(args.dtype).itemsize // unit, 1) * unit
        x = np.full(count, rank + 1, dtype=args.dtype)
        total = size * (size + 1) // 2
        if collective == "reduce":
            recv = np.empty_like(x)
            # Into a preallocated array on the root, as "native" does.
            candidates = {name: (lambda name=name, x=x, recv=recv:
                                 ringlet.reduce(x, 0, algorithm=name, out=recv))
                          for name in [*names, "auto"]}
            candidates["native"] = lambda x=x, recv=recv: comm.Reduce(x, recv, MPI.SUM, root=0)
        else:
            recv = np.empty(count // size, dtype=args.dtype)

            def scatter(name: str, x: np.ndarray = x, recv: np.ndarray = recv) -> None:
                np.copyto(recv, ringlet.reduce_scatter(x, algorithm=name))

            candidates = {name: (lambda name=name: scatter(name)) for name in [*names, "auto"]}
            candidates["native"] = (lambda x=x, recv=recv:
                                    comm.Reduce_scatter_block(x, recv, MPI.SUM))
        for name, call in candidates.items():  # warm-up, and every result checked
            recv.fill(0)
            for _ in range(args.warmup):
                call()
            if (collective == "reduce_scatter" or rank == 0) and not np.all(recv == total):
                print(f"{name}: wrong result at {nbytes} B", file=sys.stderr)
                return 1
        seconds: dict[str, list[float]] = {name: [] for name in candidates}
        spent = 0.0
        for _ in range(args.rounds):
            order = list(candidates)
            rng.shuffle(order)  # the same seed everywhere: the same order on every rank
            for name in order:
                seconds[name].append(timed(comm, candidates[name]))
            spent += sum(seconds[name][-1] for name in order)
            if comm.bcast(spent > args.time_budget, root=0):
                break
        priced = ringlet._core.explain(count * x.itemsize, args.dtype, "sum",
                                       collective=collective).candidates
        models = {row.algorithm: row.model_seconds for row in priced}
        for name, times in seconds.items():
            measured = float(np.median(times))
            model = models.get(name, float("nan"))
            rows.append((count * x.itemsize, name, measured, model, len(times)))
    if rank == 0:
        report(rows, size, args, ringlet.calibration.installed(), overhead)
    return 0


def human(nbytes: int) -> str:
    for unit, scale in (("MiB", 1 << 20), ("KiB", 1 << 10)):
        if nbytes >= scale:
            return f"{nbytes / scale:g} {unit}"
    return f"{nbytes} B"


def report(rows, size: int, args, params, overhead: float) -> None:
    where = ", root 0" if args.collective == "reduce" else ""
    print(f"{args.collective}, N={size}, {args.dtype} sum{where}; {socket.gethostname()}, "
          f"{datetime.now():%Y-%m-%d %H:%M}; parameters: {params.source}; "
          f"fixed cost of a call {overhead * 1e6:.1f} us")
    header = ["size", "algorithm", "measured", "model", "predicted", "predicted / measured",
              "rounds"]
    lines = []
    for nbytes, name, measured, model, rounds in rows:
        known = model == model
        predicted = model + overhead
        lines.append([human(nbytes), name, f"{measured * 1e6:.1f} us",
                      f"{model * 1e6:.1f} us" if known else "-",
                      f"{predicted * 1e6:.1f} us" if known else "-",
                      f"{predicted / measured:.2f}" if known and measured > 0 else "-",
                      str(rounds)])
    if args.markdown:
        print("| " + " | ".join(header) + " |")
        print("|" + "---|" * len(header))
        for line in lines:
            print("| " + " | ".join(line) + " |")
    else:
        widths = [max(len(h), *(len(line[i]) for line in lines)) for i, h in enumerate(header)]
        print("  ".join(h.ljust(w) for h, w in zip(header, widths)))
        for line in lines:
            print("  ".join(v.ljust(w) for v, w in zip(line, widths)))


if __name__ == "__main__":
    sys.exit(main())
