"""OSU-style allreduce benchmark: every ringlet algorithm, "auto" and MPI's own, interleaved.

    mpirun -n 2 python benchmarks/allreduce_bench.py [--dtype float32] [--op sum]
        [--min-size 8] [--max-size 256M] [--factor 4] [--algorithms ring,auto,native]
        [--time-budget 4] [--min-iterations 10] [--max-iterations 10000] [--warmup 20]
        [--bw-size 16M] [--compare-float32] [--rotate] [--markdown] [--no-plot]
        [--out-dir benchmarks/out]

Method, after osu_allreduce:

* Message sizes go from --min-size to --max-size (both included), multiplying by --factor.
* The candidates are every registered algorithm that can reduce the dtype and op
  (``ringlet.algorithms("allreduce", dtype, op)``: "mpi" has no 16-bit floats),
  "auto", and "native": mpi4py's ``comm.Allreduce(MPI.IN_PLACE, ...)`` called directly. They are
  timed round-robin within each iteration (in a new random order each round, the same on every
  rank), so noise from a shared machine hits all of them alike.
* Every call is in place on a buffer preallocated per size and holding a fixed point of the op
  (0 for sum, 1 for the others), so values never grow and the buffer never needs a refill.
* A barrier precedes every call, outside the timed region; each call is timed alone with
  ``time.perf_counter``. An iteration's time is the maximum over the ranks; the table shows the
  median and the minimum over the iterations.
* Per size, warm-up rounds come first; then as many timed rounds as fit in --time-budget
  seconds, clamped to [--min-iterations, --max-iterations].
* The lower bound is 2(N-1)/N * m / B (Patarasuk & Yuan, Lemma 5), with B the point-to-point
  bandwidth measured in the same run with ``Sendrecv`` between ring neighbours, at each
  message size (a 16 MiB Sendrecv sits in cache; a 256 MiB one does not).
* The memory-traffic floor is what the ranks of one node must load and store at the least,
  over the memcpy bandwidth measured at that size: each rank loads its 1/N share of every
  rank's vector and the N-1 shares the others reduced, (2 - 1/N)m, and stores m, so with
  memcpy moving a byte (one load, one store) per 1/C seconds the floor is (3 - 1/N)/2 * m / C.
* "shm@shared" is the ``shm`` algorithm on arrays from ``ringlet.empty`` (in shared memory,
  reduced where they are), when the ranks share memory.
* ``--rotate`` cycles every candidate through several buffers that together exceed the
  last-level cache (twice its size, from sysfs; ``--rotate-bytes`` overrides), so that no call
  finds its buffer warm in cache from the call before; B and C are then measured rotated too.

Rank 0 prints the table (and Markdown with --markdown) and writes
``{out-dir}/allreduce_n{N}_{dtype}_{op}.csv`` and ``.png``.
"""

from __future__ import annotations

import argparse
import gc
import itertools
import socket
import sys
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

import bench_report  # benchmarks/bench_report.py, next to this script
import ml_dtypes
import numpy as np
from bench_report import FLOAT32_AUTO, SIZE_SUFFIXES, Meta, SizeResult, Timing, parse_size
from mpi4py import MPI  # before ringlet: mpi4py initializes MPI, ringlet then shares it

import ringlet

DTYPES = {
    "float32": np.dtype(np.float32),
    "float64": np.dtype(np.float64),
    "float16": np.dtype(np.float16),
    "bfloat16": np.dtype(ml_dtypes.bfloat16),
    "int32": np.dtype(np.int32),
    "int64": np.dtype(np.int64),
}
SIXTEEN_BIT = ("float16", "bfloat16")
NATIVE_DTYPES = ("float32", "float64", "int32", "int64")
MPI_OPS = {"sum": MPI.SUM, "prod": MPI.PROD, "min": MPI.MIN, "max": MPI.MAX}
WARMUP_SHARE = 0.25
"""At most this share of --time-budget goes to warm-up rounds (always at least one)."""
BANDWIDTH_REPEATS = 10
SHUFFLE_SEED = 20090801
"""Seeds the per-round candidate order; every rank must draw the same orders."""

DEFAULT_OUT_DIR = Path(__file__).resolve().parent / "out"


# ---------------------------------------------------------------------------------------------
# Command line


def positive_float(text: str) -> float:
    value = float(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be positive: {text!r}")
    return value


class RootParser(argparse.ArgumentParser):
    """An ArgumentParser that prints help and errors on rank 0 only (every rank still exits)."""

    def _print_message(self, message: str, file=None) -> None:
        if MPI.COMM_WORLD.Get_rank() == 0:
            super()._print_message(message, file)


def build_parser() -> argparse.ArgumentParser:
    parser = RootParser(
        description=__doc__.splitlines()[0],
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    add = parser.add_argument
    add("--dtype", choices=list(DTYPES), default="float32")
    add("--op", choices=list(ringlet.OPS), default="sum")
    add(
        "--algorithms",
        default="all",
        help="comma-separated subset of the candidates, e.g. ring,auto,native; 'all' is every "
        "ringlet algorithm that applies, auto, and native where MPI has the dtype and op",
    )
    add("--min-size", type=parse_size, default=8, help="smallest message, bytes (K/M/G)")
    add("--max-size", type=parse_size, default=256 << 20, help="largest message, bytes")
    add("--factor", type=int, choices=(2, 4), default=4, help="size multiplier")
    add("--min-iterations", type=int, default=10, help="timed rounds per size, at least")
    add("--max-iterations", type=int, default=10000, help="timed rounds per size, at most")
    add(
        "--warmup",
        type=int,
        default=20,
        help="warm-up rounds per size, at most (fewer for large sizes, at least one)",
    )
    add(
        "--time-budget",
        type=positive_float,
        default=4.0,
        help="seconds of timed rounds per size (before the iteration clamp)",
    )
    add(
        "--bw-size",
        type=parse_size,
        default=16 << 20,
        help="message size of the Sendrecv bandwidth measurement",
    )
    add(
        "--compare-float32",
        action="store_true",
        help="16-bit dtypes: also time auto on float32 arrays of equal element count",
    )
    add("--rotate", action="store_true",
        help="cycle through buffers that together exceed the last-level cache")
    add("--rotate-bytes", type=parse_size, default=None,
        help="bytes of buffers to cycle through with --rotate (default: twice the LLC)")
    add("--out-dir", type=Path, default=DEFAULT_OUT_DIR, help="where the CSV and PNG go")
    add("--markdown", action="store_true", help="also print the tables as Markdown")
    add("--no-plot", action="store_true", help="skip the PNG")
    return parser


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.min_size > args.max_size:
        parser.error("--min-size is larger than --max-size")
    if not 1 <= args.min_iterations <= args.max_iterations:
        parser.error("need 1 <= --min-iterations <= --max-iterations")
    if args.warmup < 1:
        parser.error("--warmup must be at least 1")
    if args.compare_float32 and args.dtype not in SIXTEEN_BIT:
        parser.error("--compare-float32 applies to float16 and bfloat16 only")
    if args.rotate_bytes is None:
        args.rotate_bytes = 2 * last_level_cache_bytes()
    available = available_candidates(args.dtype, args.op)
    args.candidates = chosen_candidates(parser, args.algorithms, available, args.dtype)
    if args.compare_float32:
        if "auto" not in args.candidates:
            parser.error("--compare-float32 compares 'auto' runs: keep 'auto' in --algorithms")
        args.candidates.append(FLOAT32_AUTO)
    return args


SHM_SHARED = "shm@shared"
"""The shm algorithm on arrays that live in shared memory (ringlet.empty)."""


def last_level_cache_bytes() -> int:
    """The largest CPU cache this machine reports (sysfs), or 32 MiB if it reports none."""
    sizes = []
    for path in Path("/sys/devices/system/cpu/cpu0/cache").glob("index*/size"):
        text = path.read_text().strip().upper()
        scale = SIZE_SUFFIXES.get(text[-1:], 1)
        sizes.append(int(text.rstrip("KMG")) * scale)
    return max(sizes, default=32 << 20)


def available_candidates(dtype: str, op: str) -> list[str]:
    """ringlet's algorithms (read at run time), "shm" on shared arrays where the ranks share
    memory, "auto", and "native" where MPI can do it."""
    names = list(ringlet.algorithms("allreduce", dtype=dtype, op=op))
    if "shm" in names and ringlet.shared_memory().available:
        names.append(SHM_SHARED)
    names.append("auto")
    if dtype in NATIVE_DTYPES and op in MPI_OPS:
        names.append("native")
    return names


def chosen_candidates(
    parser: argparse.ArgumentParser, requested: str, available: list[str], dtype: str
) -> list[str]:
    if requested == "all":
        return available
    wanted = [name.strip() for name in requested.split(",") if name.strip()]
    unknown = [name for name in wanted if name not in available]
    if unknown:
        parser.error(
            f"--algorithms: {', '.join(unknown)} not available for {dtype} "
            f"(candidates here: {', '.join(available)})"
        )
    return [name for name in available if name in wanted]


def message_counts(min_size: int, max_size: int, factor: int, itemsize: int) -> list[int]:
    """Element counts for sizes min, min*factor, ... up to max (max itself always included)."""
    sizes = []
    size = min_size
    while size <= max_size:
        sizes.append(size)
        size *= factor
    if sizes[-1] != max_size:
        sizes.append(max_size)
    return sorted({max(1, s // itemsize) for s in sizes})


# ---------------------------------------------------------------------------------------------
# Candidates


@dataclass
class Candidate:
    name: str
    buffers: list[np.ndarray]
    """The buffers its calls cycle through (one without --rotate)."""
    run: Callable[[], object]
    picked: str = ""
    """For "auto" candidates: which algorithm the selector says it runs ("" if unknown)."""


def fill_value(op: str) -> int:
    """A fixed point of the op on equal inputs: the buffer keeps it call after call."""
    return 0 if op == "sum" else 1


def auto_choice(nbytes: int, n_ranks: int, dtype: str, op: str) -> str:
    """The algorithm ``algorithm="auto"`` runs, if ringlet's selector can tell ("" if not).

    Every rank calls this, in the same order: the selector's first call may be collective (it
    loads or runs ringlet's calibration).
    """
    choice = getattr(getattr(ringlet, "selector", None), "choice", None)
    if choice is None:
        return ""
    try:
        return str(choice(nbytes, dtype, op))
    except Exception:
        return ""


def new_buffer(count: int, dtype: str, op: str) -> np.ndarray:
    return np.full(count, fill_value(op), dtype=DTYPES[dtype])


def cycling(
    call: Callable[[np.ndarray], object], buffers: list[np.ndarray]
) -> Callable[[], object]:
    """A call on the next buffer each time."""
    turn = itertools.cycle(buffers)
    return lambda: call(next(turn))


def make_candidate(name: str, buffers: list[np.ndarray], op: str, comm: MPI.Comm) -> Candidate:
    """Calls of ``name`` in place on ``buffers`` (auto@float32 and shm@shared get their own)."""
    if name == "native":
        mpi_op = MPI_OPS[op]
        run = cycling(lambda b: comm.Allreduce(MPI.IN_PLACE, b, mpi_op), buffers)
        return Candidate(name, buffers, run)
    algorithm = name
    if name == FLOAT32_AUTO:
        buffers = [new_buffer(buffers[0].size, "float32", op) for _ in buffers]
        algorithm = "auto"
    if name == SHM_SHARED:
        buffers = [shared_buffer(b.size, b.dtype, op) for b in buffers]
        algorithm = "shm"
    run = cycling(lambda b: ringlet.allreduce(b, op, out=b, algorithm=algorithm), buffers)
    picked = ""
    if algorithm == "auto":
        picked = auto_choice(buffers[0].nbytes, comm.Get_size(), buffers[0].dtype.name, op)
    return Candidate(name, buffers, run, picked)


def shared_buffer(count: int, dtype: np.dtype, op: str) -> np.ndarray:
    array = ringlet.empty(count, dtype)
    array[...] = fill_value(op)
    return array


def rotation(nbytes: int, args) -> int:
    """How many buffers of ``nbytes`` a candidate cycles through."""
    if not args.rotate:
        return 1
    return max(2, min(-(-args.rotate_bytes // max(nbytes, 1)), 4096))


def make_candidates(names: list[str], count: int, args, comm: MPI.Comm) -> list[Candidate]:
    """The candidates of one size, all on the same buffers (but auto@float32, shm@shared)."""
    k = rotation(count * DTYPES[args.dtype].itemsize, args)
    shared = [new_buffer(count, args.dtype, args.op) for _ in range(k)]
    return [make_candidate(name, shared, args.op, comm) for name in names]


# ---------------------------------------------------------------------------------------------
# Timing


@contextmanager
def gc_paused() -> Iterator[None]:
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def round_orders(rounds: int, k: int, seed: int) -> np.ndarray:
    """A fresh random order of the k candidates for every round, the same on every rank.

    Shuffling (rather than rotating) the order means no candidate always runs right after the
    same other one, whose cache or skew left-overs would then bias it.
    """
    rng = np.random.default_rng(seed)
    return np.array([rng.permutation(k) for _ in range(rounds)])


def time_rounds(comm: MPI.Comm, candidates: list[Candidate], rounds: int) -> np.ndarray:
    """This rank's seconds per call, shape (rounds, candidates), each round in a random order."""
    seconds = np.empty((rounds, len(candidates)))
    orders = round_orders(rounds, len(candidates), SHUFFLE_SEED).tolist()
    runs = [c.run for c in candidates]
    barrier, clock = comm.Barrier, time.perf_counter
    with gc_paused():
        for r, order in enumerate(orders):
            for index in order:
                run = runs[index]
                barrier()
                start = clock()
                run()
                seconds[r, index] = clock() - start
    return seconds


def slowest_rank(comm: MPI.Comm, seconds: np.ndarray) -> np.ndarray:
    """Element-wise max over the ranks: the time each collective call took."""
    comm.Allreduce(MPI.IN_PLACE, seconds, op=MPI.MAX)
    return seconds


def wall_seconds_per_round(comm: MPI.Comm, candidates: list[Candidate], rounds: int) -> float:
    """Run ``rounds`` untimed rounds; the slowest rank's wall time per round, barriers included."""
    start = time.perf_counter()
    time_rounds(comm, candidates, rounds)
    return comm.allreduce((time.perf_counter() - start) / rounds, op=MPI.MAX)


def clamp(value: float, low: int, high: int) -> int:
    return int(min(max(value, low), high))


def measure(comm: MPI.Comm, candidates: list[Candidate], args) -> np.ndarray:
    """Warm up, then time as many rounds as the budget allows: seconds (rounds, candidates)."""
    first = wall_seconds_per_round(comm, candidates, 1)  # first touch, internal buffers
    warmup = clamp(WARMUP_SHARE * args.time_budget / first, 1, args.warmup)
    per_round = wall_seconds_per_round(comm, candidates, warmup)
    rounds = clamp(args.time_budget / per_round, args.min_iterations, args.max_iterations)
    return slowest_rank(comm, time_rounds(comm, candidates, rounds))


def buffers_intact(comm: MPI.Comm, candidates: list[Candidate], op: str) -> bool:
    """Whether every buffer on every rank still holds the fill value (a cheap result check)."""
    buffers = {id(b): b for c in candidates for b in c.buffers}.values()
    intact = all(bool(np.all(b == b.dtype.type(fill_value(op)))) for b in buffers)
    return comm.allreduce(intact, op=MPI.LAND)


def benchmark_size(comm: MPI.Comm, count: int, args) -> SizeResult:
    candidates = make_candidates(args.candidates, count, args, comm)
    seconds = measure(comm, candidates, args)
    if not buffers_intact(comm, candidates, args.op) and comm.Get_rank() == 0:
        print(
            f"warning: wrong allreduce results at {count} elements: some candidate broke "
            f"the buffer",
            file=sys.stderr,
        )
    medians, minima = np.median(seconds, axis=0), seconds.min(axis=0)
    timings = [
        Timing(
            c.name,
            c.buffers[0].dtype.name,
            c.buffers[0].size,
            c.buffers[0].nbytes,
            float(median),
            float(minimum),
            c.picked,
        )
        for c, median, minimum in zip(candidates, medians, minima)
    ]
    nbytes = count * DTYPES[args.dtype].itemsize
    rotated = rotation(nbytes, args)
    return SizeResult(
        nbytes, len(seconds), timings,
        p2p_bandwidth=p2p_bandwidth(comm, nbytes, rotated),
        copy_bandwidth=copy_bandwidth(comm, nbytes, rotated),
    )


def p2p_bandwidth(comm: MPI.Comm, nbytes: int, rotated: int = 1) -> float:
    """Bytes/s per direction of Sendrecv to the right neighbour and from the left one, cycling
    through ``rotated`` pairs of buffers."""
    rank, n = comm.Get_rank(), comm.Get_size()
    right, left = (rank + 1) % n, (rank - 1) % n
    if n == 1:
        return float("inf")
    # Filled, so that no page is touched first inside a timed call.
    pairs = [(np.full(nbytes, 1, dtype=np.uint8), np.full(nbytes, 2, dtype=np.uint8))
             for _ in range(min(rotated, 64))]
    seconds = np.empty(BANDWIDTH_REPEATS)
    for send, receive in pairs[:2]:  # warm-up
        comm.Sendrecv(send, right, 0, receive, left, 0)
    for index in range(BANDWIDTH_REPEATS):
        send, receive = pairs[index % len(pairs)]
        comm.Barrier()
        start = time.perf_counter()
        comm.Sendrecv(send, right, 0, receive, left, 0)
        seconds[index] = time.perf_counter() - start
    return nbytes / float(np.median(slowest_rank(comm, seconds)))


def copy_bandwidth(comm: MPI.Comm, nbytes: int, rotated: int = 1) -> float:
    """Bytes/s that memcpy copies on each rank while every rank copies (the slowest rank)."""
    pairs = [(np.full(nbytes, 1, dtype=np.uint8), np.full(nbytes, 2, dtype=np.uint8))
             for _ in range(min(rotated, 64))]
    seconds = np.empty(BANDWIDTH_REPEATS)
    for index in range(BANDWIDTH_REPEATS):
        source, target = pairs[index % len(pairs)]
        comm.Barrier()
        start = time.perf_counter()
        np.copyto(target, source)
        seconds[index] = time.perf_counter() - start
    return nbytes / float(np.median(slowest_rank(comm, seconds)))


# ---------------------------------------------------------------------------------------------
# Main


def progress(counts: list[int], itemsize: int, enabled: bool) -> Iterable[int]:
    """The counts, with a tqdm bar on stderr (rank 0) showing the message size being timed."""
    try:
        from tqdm import tqdm
    except ImportError:  # the bar is a nicety
        return counts
    bar = tqdm(counts, desc="allreduce", unit="size", file=sys.stderr, disable=not enabled)

    def labelled() -> Iterator[int]:
        for count in bar:
            bar.set_postfix_str(bench_report.size_label(count * itemsize) + "B")
            yield count

    return labelled()


def run_metadata(comm: MPI.Comm, args, bandwidth: float) -> Meta:
    return Meta(
        n_ranks=comm.Get_size(),
        dtype=args.dtype,
        op=args.op,
        date=datetime.now().astimezone().isoformat(timespec="seconds"),
        hostname=socket.gethostname(),
        mpi_library=MPI.Get_library_version().strip("\x00 \n").splitlines()[0].strip(),
        p2p_bandwidth=bandwidth,
        p2p_bytes=args.bw_size,
        algorithms=tuple(ringlet.ALGORITHMS),
    )


def report(results: list[SizeResult], meta: Meta, args) -> None:
    rows = bench_report.derive_rows(results, meta)
    print(bench_report.text_table(rows, meta))
    if args.markdown:
        print()
        print(bench_report.markdown(rows, meta))
    args.out_dir.mkdir(parents=True, exist_ok=True)
    stem = args.out_dir / f"allreduce_n{meta.n_ranks}_{meta.dtype}_{meta.op}"
    bench_report.write_csv(rows, stem.with_suffix(".csv"))
    written = [stem.with_suffix(".csv")]
    if not args.no_plot:
        bench_report.write_plot(rows, meta, stem.with_suffix(".png"))
        written.append(stem.with_suffix(".png"))
    print(f"wrote {', '.join(map(str, written))}", file=sys.stderr)


def main(argv: list[str] | None = None) -> int:
    comm = MPI.COMM_WORLD
    args = parse_args(argv)
    ringlet.init()
    rank = comm.Get_rank()
    started = time.perf_counter()
    bandwidth = p2p_bandwidth(comm, args.bw_size)
    meta = run_metadata(comm, args, bandwidth)
    itemsize = DTYPES[args.dtype].itemsize
    counts = message_counts(args.min_size, args.max_size, args.factor, itemsize)
    results = [benchmark_size(comm, count, args) for count in progress(counts, itemsize, rank == 0)]
    if rank == 0:
        report(results, meta, args)
        print(f"total {time.perf_counter() - started:.1f} s", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
