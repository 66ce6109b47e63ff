"""Which algorithm ``algorithm="auto"`` runs, and why.

Each candidate's time is predicted with the alpha-beta-gamma (Hockney) model: alpha seconds per
message, beta seconds per byte moved between two ranks, gamma seconds per byte reduced (per
dtype), with a second alpha and beta for what crosses a node's link when the ranks span several
nodes. Each algorithm declares its own cost next to its code in the Rust core (messages, bytes
sent and bytes reduced on its busiest rank inside a node, and messages and bytes over the
busiest node's link, as functions of the ranks' layout and the message size; the formulas of
Thakur, Rabenseifner & Gropp, "Optimization of Collective Communication Operations in MPICH"),
so the selector knows every registered algorithm without a list of its own. The parameters are
measured by a short calibration (a few exchanges inside a node and between nodes), and the
model is then corrected by timing the candidates themselves at growing sizes, as long as they
fit a budget of ``CALIBRATION_BUDGET`` seconds: ``predicted = model x (measured / model)``,
interpolated in log-size between the calibrated sizes. The correction is what catches what the
model cannot see (cache effects, the MPI library's own tricks).

The calibration runs once per layout of ranks on nodes, MPI library and ringlet version, on the
first ``auto`` call (it is collective: every rank takes part), and is cached as JSON in
``$RINGLET_CACHE_DIR`` (default ``$XDG_CACHE_HOME/ringlet`` or ``~/.cache/ringlet``). Rank 0's
parameters are broadcast, so every rank makes the same choice. The choices are compiled into a
size table inside the Rust core, so a decision costs a binary search, not a Python call.

The table is then refined on the real calls (``RINGLET_EXPLORE=0`` turns it off, and so does
``RINGLET_CHECK=0``, without which nothing would catch ranks out of step): each size
range names a runner-up that the model predicts close to the winner; the core runs the winner,
tries the runner-up on the 8th call in the range, then the 16th, 32nd, ... (at most one call in
1024), and when the runner-up was at least 10% faster on the slowest rank (an allreduce of the
two timings' maxima, so every rank decides alike) the two trade places. :func:`refinements`
shows what it learned.

Overrides (read when the table is built, i.e. at the first ``auto`` call):

- ``algorithm=`` on the call;
- ``RINGLET_ALGORITHM=ring`` (any name below) for every ``auto`` call;
- ``RINGLET_AUTO_TABLE="recursive_doubling:32K,halving_doubling:8M,pipelined_ring"``: explicit
  thresholds (each algorithm up to and including its size, the last for everything larger);
- ``RINGLET_CALIBRATE=0``: no calibration, the model with built-in parameters only.
"""

from __future__ import annotations

import bisect
import hashlib
import json
import math
import os
import sys
import time
import warnings
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from . import _core
from ._collectives import broadcast_bytes, max_over_ranks
from ._dtypes import OPS, SUPPORTED_DTYPES, check_op
from ._runtime import call_after_init, init, size

ALGORITHMS = tuple(_core.algorithms("allreduce"))
"""Every algorithm ``allreduce(..., algorithm=...)`` accepts besides "auto", as the core
registers them."""

CACHE_FORMAT = 5  # bump when the calibration procedure changes
CALIBRATION_SIZES = (8, 64, 512, 4 << 10, 16 << 10, 64 << 10, 256 << 10, 1 << 20, 4 << 20,
                     16 << 20)
"""float32 message sizes (bytes) at which calibration times every candidate."""
LARGE_CALIBRATION_SIZE = 64 << 20
"""Also timed, for every candidate: beyond the last-level cache the winners change."""
CALIBRATION_BUDGET = 3.0
"""Seconds the timed runs of a calibration may take: the sizes stop where the next would not
fit (on a slow network, sooner; larger sizes keep the last measured correction)."""
ACROSS_PROBE_BYTES = 512 << 10
"""The exchange between nodes that measures their bandwidth: long enough to dwarf the latency,
short enough for a slow link (40 ms at 100 Mbit/s)."""
WHOLE_MESSAGES = 2**31 - 1
"""A limit that never cuts a message (MPI's count limit)."""
ACROSS_PIECES = (32 << 10, 16 << 10)
"""The pieces calibration tries for messages between nodes, against whole messages: below the
eager limits of Open MPI's TCP transport (64 KiB, its header included) and of libfabric's
tcp;ofi_rxm (16 KiB), so each piece goes without a rendezvous."""
PIECES_GAIN = 0.9
"""Pieces replace whole messages between nodes only when the exchange takes at most this
fraction of the time (a tie keeps whole messages: fewer of them, and zero-copy where the
network does it)."""
HALF_DUPLEX = 1.5
"""An exchange both ways at once that takes longer than this times one way: the connections
carry one direction at a time (the simulator's ``half_duplex``)."""

# Built-in parameters (a 2-core AMD EPYC VM, Open MPI 4.1): used with RINGLET_CALIBRATE=0
# and by explain() before any calibration exists.
DEFAULT_ALPHA = 1.5e-6
DEFAULT_BETA = 1 / 6e9
DEFAULT_GAMMA = 1 / 30e9
# Between nodes: a 10 Gbit/s Ethernet with TCP's latency.
DEFAULT_ALPHA_ACROSS = 30e-6
DEFAULT_BETA_ACROSS = 8 / 10e9


def check_algorithm(algorithm: str) -> str:
    if algorithm.__class__ is not str or (algorithm != "auto" and algorithm not in ALGORITHMS):
        raise ValueError(
            f"unknown algorithm {algorithm!r}; accepted: 'auto', "
            f"{', '.join(map(repr, ALGORITHMS))}"
        )
    return algorithm


def support(algorithm: str, dtype: str, op: str) -> tuple[str, str]:
    """("full" | "own_arithmetic" | "no", why) as the algorithm declares it."""
    return _core.algorithm_support("allreduce", algorithm, dtype, op)


def candidates(dtype: str, op: str = "sum", process_set: int = 0) -> tuple[str, ...]:
    """The algorithms ``auto`` may run for ``dtype`` and ``op``: those that reduce them with
    ringlet's own arithmetic (so not "mpi" for 16-bit floats, which MPI lacks, nor for min/max
    on floats, where MPI_MIN/MPI_MAX treat NaN otherwise; auto must not change an answer), and
    that can run on the communicator (so "shm" only where the ranks share memory)."""
    init()
    return tuple(
        a for a in ALGORITHMS
        if support(a, dtype, op)[0] == "full"
        and _core.algorithm_unavailable("allreduce", a, process_set) is None
    )


@dataclass
class Parameters:
    """What calibration measured, and the corrections it derived."""

    alpha: float = DEFAULT_ALPHA
    beta: float = DEFAULT_BETA
    # Between nodes (used only when the ranks span several).
    alpha_across: float = DEFAULT_ALPHA_ACROSS
    beta_across: float = DEFAULT_BETA_ACROSS
    gamma: dict[str, float] = field(default_factory=dict)
    # Between nodes: the longest message sent whole (longer ones go in pieces), and how much
    # longer two ranks take to exchange both ways at once than one way with it (1: the
    # connections are full duplex, 2: one direction at a time).
    across_message_bytes: int = WHOLE_MESSAGES
    exchange_slowdown: float = 1.0
    # algorithm -> [(bytes, measured / model)], from float32 timings, sorted by bytes.
    corrections: dict[str, list[tuple[int, float]]] = field(default_factory=dict)
    key: dict[str, Any] = field(default_factory=dict)
    created: str = ""
    calibration_seconds: float = 0.0
    source: str = "built-in defaults"

    def gamma_of(self, dtype: str) -> float:
        return self.gamma.get(dtype, DEFAULT_GAMMA)

    def to_json(self) -> str:
        data = asdict(self)
        data.pop("source")
        data["format"] = CACHE_FORMAT
        return json.dumps(data, sort_keys=True)

    @classmethod
    def from_json(cls, text: str, source: str) -> Parameters:
        """Parse and check a cached calibration; ValueError if anything is off."""
        data = json.loads(text)
        if not isinstance(data, dict) or data.pop("format", None) != CACHE_FORMAT:
            raise ValueError("not a ringlet calibration of this format")
        params = cls(**data, source=source)
        numbers = [params.alpha, params.beta, params.alpha_across, params.beta_across,
                   params.exchange_slowdown, *params.gamma.values()]
        if not all(isinstance(v, (int, float)) and math.isfinite(v) and v > 0 for v in numbers):
            raise ValueError("parameters must be positive numbers")
        limit = params.across_message_bytes
        if isinstance(limit, bool) or not isinstance(limit, int) or \
                not 1 <= limit <= WHOLE_MESSAGES:
            raise ValueError(f"across_message_bytes must be 1 to {WHOLE_MESSAGES}")
        params.corrections = {
            name: sorted((int(b), float(r)) for b, r in points)
            for name, points in params.corrections.items()
        }
        ratios = [r for points in params.corrections.values() for _, r in points]
        if not all(math.isfinite(r) and r > 0 for r in ratios):
            raise ValueError("corrections must be positive numbers")
        return params


def layout(size: int, process_set: int = 0) -> list[int]:
    """Each rank's node for a model of ``size`` ranks: the process set's own layout when it has
    that many ranks, else (a what-if for another rank count) all of them on one node."""
    nodes = _core.nodes(process_set) if _core.is_initialized() else []
    return nodes if len(nodes) == size else [0] * size


def model_seconds(algorithm: str, nbytes: int, size: int, dtype: str, params: Parameters,
                  nodes: list[int] | None = None, collective: str = "allreduce") -> float:
    """The Hockney-model time of one ``collective`` (an allreduce by default) of ``nbytes`` on
    ``size`` ranks placed on ``nodes`` (default: :func:`layout`), from the algorithm's own cost
    declaration: alpha and beta inside a node for what stays inside, ``alpha_across`` and
    ``beta_across`` for what crosses the busiest node's link."""
    if size <= 1:
        return 0.0
    nodes = layout(size) if nodes is None else nodes
    messages, sent, reduced, messages_across, sent_across = _core.algorithm_cost(
        collective, algorithm, nodes, int(nbytes))
    return (params.alpha * messages + params.beta * sent + params.gamma_of(dtype) * reduced
            + params.alpha_across * messages_across + params.beta_across * sent_across)


def correction(algorithm: str, nbytes: int, params: Parameters) -> float:
    """measured / model at ``nbytes``, interpolated in log-size (1.0 without measurements)."""
    points = params.corrections.get(algorithm)
    if not points:
        return 1.0
    sizes = [p[0] for p in points]
    i = bisect.bisect_left(sizes, nbytes)
    if i == 0:
        return points[0][1]
    if i == len(points):
        return points[-1][1]
    (s0, r0), (s1, r1) = points[i - 1], points[i]
    t = (math.log(max(nbytes, 1)) - math.log(s0)) / (math.log(s1) - math.log(s0))
    return math.exp((1 - t) * math.log(r0) + t * math.log(r1))


def predict(algorithm: str, nbytes: int, size: int, dtype: str, params: Parameters,
            nodes: list[int] | None = None) -> float:
    model = model_seconds(algorithm, nbytes, size, dtype, params, nodes)
    return model * correction(algorithm, nbytes, params)


def best(nbytes: int, size: int, dtype: str, params: Parameters, op: str = "sum",
         process_set: int = 0) -> str:
    options = candidates(dtype, op, process_set)
    nodes = layout(size, process_set)
    return min(options, key=lambda a: (predict(a, nbytes, size, dtype, params, nodes),
                                       options.index(a)))


def pack_below(dtype: str, size: int) -> int:
    """Bytes per array below which a fused run of arrays is copied into one buffer instead of
    being reduced where the arrays live. In place, each array a block crosses costs a message
    (about alpha); in a ring of N ranks a run of k arrays adds about 2(N-1)/N * k messages.
    Packing costs a copy in and a copy out of the run's m bytes (about gamma per byte each,
    the speed of touching memory that the calibration measures). So packing pays when the mean
    array is below (N-1)/N * alpha / gamma bytes. Local: uses this process's calibration if
    there is one, else the built-in parameters."""
    if size <= 1:
        return 0
    params = _params if _params is not None else Parameters()
    return int((size - 1) / size * params.alpha / params.gamma_of(dtype))


# ---------------------------------------------------------------------------------------------
# Buckets: how many bytes of gradients DistributedOptimizer sends in one fused allreduce.

BUCKET_OVERHEAD = 0.1
"""A bucket is sized so that its fixed costs are at most this fraction of its time."""
LAUNCH_SECONDS = 30e-6
"""A bucket's launch from a gradient hook (tensor views, the queue): tens of microseconds."""
MIN_BUCKET, MAX_BUCKET = 1 << 20, 64 << 20
ONE_BUCKET = 1 << 62


@dataclass(frozen=True)
class Buckets:
    """Bytes per bucket (``ONE_BUCKET``: everything in one) and why."""

    limit: int
    reason: str


def bucket_bytes(dtype: str, size: int, *, hosts: int, cores_per_rank: int,
                 threads: int) -> Buckets:
    """How large ``DistributedOptimizer``'s buckets are: the first bucket's allreduce runs
    while backward computes the rest, so smaller buckets hide more, but each costs a launch,
    the call's check and its algorithm's latency terms. Overlap pays only if the transfer does
    not need the cores backward runs on: between hosts it is the network's time (a waiting
    thread sleeps, see ``_core.wait_policy``); on one host it is copies and reductions made
    by these cores, so without a spare core (``cores_per_rank`` <= ``threads``) overlapping
    only shares them, and one bucket, reduced once backward is done, is fastest
    (benchmarks/RESULTS.md, "Training steps"). Otherwise the bucket is the smallest whose
    fixed costs are ``BUCKET_OVERHEAD`` of its time under the calibrated model, within
    [1 MiB, 64 MiB]. Local: every rank computes the same from the broadcast parameters."""
    if size <= 1:
        return Buckets(ONE_BUCKET, "one rank: nothing to communicate")
    if hosts == 1 and cores_per_rank <= threads:
        return Buckets(ONE_BUCKET, (
            f"one host, {cores_per_rank} core(s) per rank for {threads} compute thread(s): the "
            "transfers are copies these cores make, so overlapping them with backward only "
            "shares the cores; one bucket, reduced when backward is done"))
    params = _params if _params is not None else Parameters()
    large = best(MAX_BUCKET, size, dtype, params)
    check = predict(best(32, size, "int64", params), 32, size, "int64", params)
    fixed = LAUNCH_SECONDS + check + predict(large, 8, size, dtype, params)
    per_byte = max((predict(large, MAX_BUCKET, size, dtype, params)
                    - predict(large, 8, size, dtype, params)) / MAX_BUCKET, 1e-15)
    limit = fixed * (1 - BUCKET_OVERHEAD) / (BUCKET_OVERHEAD * per_byte)
    limit = int(min(max(limit, MIN_BUCKET), MAX_BUCKET))
    where = f"{hosts} hosts" if hosts > 1 else "a spare core per rank"
    return Buckets(limit, (
        f"{where}: a bucket's fixed cost (~{fixed * 1e6:.0f} us: launch, check, {large}'s "
        f"latency) is {BUCKET_OVERHEAD:.0%} of its time at {_human(limit)}"))


# ---------------------------------------------------------------------------------------------
# The decision table: built once per communicator, installed in the Rust core.

EXPLORE_WITHIN = 1.5
"""A range's runner-up is tried on real calls when the model predicts it within this factor of
the winner (see :func:`alternatives`)."""

_params: Parameters | None = None
_table: dict[tuple[str, str], list[tuple[int, str]]] = {}
_table_size = 0
TABLE_LIMIT = 1 << 62


def _parse_bytes(text: str) -> int:
    text = text.strip().upper().removesuffix("B")
    scale = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(text[-1:], 1)
    return int(float(text[:-1] if scale > 1 else text) * scale)


def _table_from_env(spec: str, dtype: str, op: str) -> list[tuple[int, str]]:
    """``"recursive_doubling:32K,halving_doubling:8M,pipelined_ring"`` as ranges."""
    ranges = []
    for part in spec.split(","):
        name, _, limit = part.strip().partition(":")
        check_algorithm(name)
        if name not in candidates(dtype, op):
            name = "ring"  # "mpi" cannot take this dtype or op; the ring does
        ranges.append((_parse_bytes(limit) if limit else TABLE_LIMIT, name))
    if not ranges or ranges[-1][0] != TABLE_LIMIT:
        ranges.append((TABLE_LIMIT, ranges[-1][1] if ranges else "ring"))
    return ranges


def _table_from_model(dtype: str, op: str, size: int, params: Parameters) -> list[tuple[int, str]]:
    """The winner at sizes 2^(k/2), merged into ranges; a switch happens halfway (in log)."""
    grid = sorted({max(1, round(2 ** (k / 2))) for k in range(0, 2 * 40 + 1)})
    ranges: list[tuple[int, str]] = []
    previous_size, previous = grid[0], best(grid[0], size, dtype, params, op)
    for nbytes in grid[1:]:
        winner = best(nbytes, size, dtype, params, op)
        if winner != previous:
            ranges.append((int(math.sqrt(previous_size * nbytes)), previous))
            previous = winner
        previous_size = nbytes
    ranges.append((TABLE_LIMIT, previous))
    return ranges


def build_table(size: int, params: Parameters) -> dict[tuple[str, str], list[tuple[int, str]]]:
    """Per (dtype, op): the size ranges and the algorithm ``auto`` runs in each."""
    forced = os.environ.get("RINGLET_ALGORITHM", "auto")
    spec = os.environ.get("RINGLET_AUTO_TABLE")
    if forced != "auto":
        check_algorithm(forced)
        spec = forced
    table = {}
    by_candidates: dict[tuple[str, tuple[str, ...]], list[tuple[int, str]]] = {}
    for dtype in SUPPORTED_DTYPES:
        for op in OPS:
            if size <= 1:
                table[dtype, op] = [(TABLE_LIMIT, "ring")]  # a no-op on one rank
            elif spec:
                table[dtype, op] = _table_from_env(spec, dtype, op)
            else:
                # The model does not depend on the op, only on which algorithms may run.
                key = (dtype, candidates(dtype, op))
                if key not in by_candidates:
                    by_candidates[key] = _table_from_model(dtype, op, size, params)
                table[dtype, op] = by_candidates[key]
    return table


def alternatives(table: dict[tuple[str, str], list[tuple[int, str]]], size: int,
                 params: Parameters) -> dict[tuple[str, str], list[str]]:
    """Per range of ``table``, the candidate ``auto`` tries now and then on real calls: the
    runner-up at the range's middle (in log-size) if the model predicts it within
    ``EXPLORE_WITHIN`` of the winner, else "" (nothing close enough to try). None where the
    environment sets the table: it is the user's."""
    forced = "RINGLET_ALGORITHM" in os.environ or "RINGLET_AUTO_TABLE" in os.environ
    result = {}
    for (dtype, op), ranges in table.items():
        options = candidates(dtype, op) if size > 1 and not forced else ()
        row, low = [], 1
        for limit, winner in ranges:
            middle = int(math.sqrt(low * min(limit, LARGE_CALIBRATION_SIZE * 4)))
            best_time = predict(winner, middle, size, dtype, params)
            ranked = sorted((predict(a, middle, size, dtype, params), a)
                            for a in options if a != winner)
            close = ranked and ranked[0][0] <= EXPLORE_WITHIN * best_time
            row.append(ranked[0][1] if close else "")
            low = limit + 1
        result[dtype, op] = row
    return result


def _install(size: int, params: Parameters) -> None:
    global _params, _table, _table_size
    _params, _table, _table_size = params, build_table(size, params), size
    # The collectives that choose in the core (reduce, ...) price their algorithms with these.
    _core.set_model(params.alpha, params.beta, params.alpha_across, params.beta_across,
                    DEFAULT_GAMMA, sorted(params.gamma.items()))
    tries = alternatives(_table, size, params)
    _core.set_auto_table([
        (dtype, op, limit, name, tries[dtype, op][i])
        for (dtype, op), ranges in _table.items()
        for i, (limit, name) in enumerate(ranges)
    ])


def refinements(process_set: int = 0) -> list[dict[str, Any]]:
    """What ``auto`` learned on real calls since the table was built: per size range it has
    played, the algorithm it runs now, its calls, how often it tried the range's alternative,
    and how often the two traded places (an alternative takes over when it was faster by 10%
    on the slowest rank). Local; every rank holds the same."""
    rows = []
    for dtype, op, index, now, calls, tries, switches in _core.auto_refinements(process_set):
        ranges = _table.get((dtype, op), [])
        upper = ranges[index][0] if index < len(ranges) else TABLE_LIMIT
        rows.append({"dtype": dtype, "op": op, "up_to_bytes": upper, "algorithm": now,
                     "calls": calls, "tries": tries, "switches": switches})
    return rows


def _lookup(nbytes: int, dtype: str, op: str) -> str:
    ranges = _table[dtype, op]
    return ranges[bisect.bisect_left([limit for limit, _ in ranges], nbytes)][1]


def choose(nbytes: int, size: int, dtype: str, op: str) -> str:
    """The algorithm ``auto`` runs for this call. The first call per communicator is collective
    (it loads or runs the calibration)."""
    check_op(op)
    if _core.auto_choice(dtype, op, nbytes) is None or size != _table_size:
        _install(size, parameters())
    return _lookup(nbytes, dtype, op)


def choose_in_set(nbytes: int, size: int, dtype: str, op: str, process_set: int = 0) -> str:
    """The algorithm ``auto`` runs in a process set of ``size`` ranks: the model's best with
    the parameters of ringlet's communicator, which its ranks agreed on when the set was added
    (``ringlet.add_process_set`` installs them), so that every member chooses alike. Local."""
    check_op(op)
    if _params is None:
        raise _core.RingletError("internal: no parameters installed before a process set call")
    return best(nbytes, size, dtype, _params, op, process_set)


# ---------------------------------------------------------------------------------------------
# Calibration: measure, cache, broadcast.


def cache_dir() -> Path:
    if os.environ.get("RINGLET_CACHE_DIR"):
        return Path(os.environ["RINGLET_CACHE_DIR"])
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "ringlet"


def calibration_key() -> dict[str, Any]:
    """What a calibration depends on (local: the hosts are known since ``init``)."""
    from ._version import __version__

    _, size, hosts = _core.group()
    return {
        "hosts": sorted(set(hosts)),
        "ranks_per_host": sorted(hosts.count(h) for h in set(hosts)),
        "nodes": _core.nodes(0),
        "size": size,
        "mpi": _core.mpi_library()[0].splitlines()[0],
        "ringlet": __version__,
        "kernels": _core.kernel_level(),
        "core_build": _core_build(),
        "format": CACHE_FORMAT,
        "settings": _user_settings(),
        "algorithms": list(ALGORITHMS),
        "shared_memory": bool(_core.shared_memory(0)[0]),
    }


def _user_settings() -> dict[str, Any]:
    """The settings the user chose: calibration's own limit between nodes is its result, not
    part of what it depends on."""
    settings = _core.settings()
    if settings.pop("across_message_bytes_auto"):
        del settings["across_message_bytes"]
    return settings


def _core_build() -> str:
    """Size and time of the compiled core: a rebuilt core is calibrated afresh."""
    stat = Path(_core.__file__).stat()
    return f"{stat.st_size}-{int(stat.st_mtime)}"


def cache_path(key: dict[str, Any]) -> Path:
    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]
    return cache_dir() / f"calibration-{digest}.json"


def _load(path: Path, key: dict[str, Any]) -> Parameters | None:
    try:
        text = path.read_text()
    except OSError:
        return None
    try:
        params = Parameters.from_json(text, source=str(path))
    except (ValueError, TypeError, KeyError) as exc:
        warnings.warn(
            f"ringlet: ignoring unreadable calibration cache {path} ({exc}); recalibrating",
            RuntimeWarning,
            stacklevel=3,
        )
        return None
    return params if params.key == key else None


def _broadcast_text(text: str) -> str:
    return broadcast_bytes(text.encode(), 0).decode()


def _shared_cache(key: dict[str, Any], path: Path) -> Parameters | None:
    """Rank 0's cached calibration for ``key``, the same on every rank, or None. Collective."""
    text = ""
    if _core.group()[0] == 0:
        cached = _load(path, key)
        text = cached.to_json() if cached else ""
    text = _broadcast_text(text)
    return Parameters.from_json(text, source=str(path)) if text else None


def _time_candidates(nbytes: int, algorithms: tuple[str, ...], repeats: int,
                     allowance: float = math.inf) -> np.ndarray:
    """Seconds (the slowest rank's, per run) of each algorithm on float32 zeros, one row per
    algorithm and one column per round: the same numbers on every rank. Stops after the round
    that passes ``allowance`` seconds (the slowest rank's clock decides, so all stop together),
    but not before 3 rounds."""
    buf = np.zeros(max(1, nbytes // 4), dtype=np.float32)
    samples = np.zeros((len(algorithms), repeats))
    started = time.perf_counter()
    rounds = 0
    while rounds < repeats:
        for j, name in enumerate(algorithms):  # interleaved, so noise hits all alike
            _core.barrier()
            start = time.perf_counter()
            _core.allreduce(buf, "float32", "sum", name)
            samples[j, rounds] = time.perf_counter() - start
        rounds += 1
        if rounds >= 3 and math.isfinite(allowance) and \
                max_over_ranks(np.array([time.perf_counter() - started]))[0] > allowance:
            break
    return max_over_ranks(samples[:, :rounds])


def _pair_seconds(tier: str, nbytes: int, repeats: int, distances: tuple[int, ...] = (1,)
                  ) -> float:
    """The slowest pair's median exchange of ``nbytes`` on ``tier``; for the "pairs" tiers,
    summed over the pairings of nodes at ``distances``, as halving-doubling's steps follow one
    another (a sum also evens out the noise of one pairing). Collective."""
    times = [_core.measure_sendrecv(nbytes, repeats, tier, d) for d in distances]
    return float(max_over_ranks(np.array(times)).sum())


def _pairings(nodes: int) -> tuple[int, ...]:
    """The distances at which nodes pair up as halving-doubling's steps do (node n with node
    n XOR d, d a power of two below the number of nodes)."""
    return tuple(1 << k for k in range(max(nodes - 1, 1).bit_length()))


class _Progress:
    """One line on rank 0 once calibration has taken more than a second, and one at the end."""

    def __init__(self, what: str) -> None:
        self.started = time.perf_counter()
        self.what = what
        self.shown = _core.group()[0] != 0  # only rank 0 speaks

    def elapsed(self) -> float:
        return time.perf_counter() - self.started

    def tick(self) -> None:
        if not self.shown and self.elapsed() > 1.0:
            self.shown = True
            print(f"ringlet: calibrating the allreduce model for {self.what} (once; cached in "
                  f"{cache_dir()}) ...", file=sys.stderr, flush=True)

    def done(self) -> None:
        if self.shown and _core.group()[0] == 0:
            print(f"ringlet: calibrated in {self.elapsed():.1f} s", file=sys.stderr, flush=True)


def _measure(key: dict[str, Any], reuse_pieces: bool = True) -> Parameters:
    """Run the calibration. Collective; at most about ``CALIBRATION_BUDGET`` seconds on any
    network: latency and bandwidth per tier from a few exchanges, then the candidates timed at
    growing sizes while the time spent and the next size's expected time fit the budget. The
    pieces between nodes that ``init`` measured in this process are kept unless
    ``reuse_pieces`` is false."""
    ranks = size()
    nodes = _core.nodes(0)
    several = len(set(nodes)) > 1
    progress = _Progress(f"{ranks} ranks on {len(set(nodes))} node(s)")
    params = Parameters(key=key, created=time.strftime("%Y-%m-%dT%H:%M:%S"))
    if not several or max(nodes.count(n) for n in set(nodes)) > 1:
        tier = "within" if several else "any"
        small = _pair_seconds(tier, 8, 200)
        large = _pair_seconds(tier, 1 << 20, 20)
        params.alpha = max(small, 1e-9)
        params.beta = max((large - small) / (1 << 20), 1e-13)
    if several:
        if reuse_pieces and _pieces_measured.get(_digest(key)):
            params.across_message_bytes, params.exchange_slowdown = \
                _pieces_measured[_digest(key)]
        else:
            _choose_pieces_across(params)
            _pieces_measured[_digest(key)] = (params.across_message_bytes,
                                              params.exchange_slowdown)
        probe = ACROSS_PROBE_BYTES
        small = _pair_seconds("across", 8, 50)
        large = _pair_seconds("across", probe, 5)
        params.alpha_across = max(small, 1e-9)
        params.beta_across = max((large - small) / probe, 1e-13)
    probe = 256 << 10
    gamma_samples = [_core.measure_combine(d, probe, 20) / probe for d in SUPPORTED_DTYPES]
    gammas = max_over_ranks(np.array(gamma_samples))
    params.gamma = {d: max(float(g), 1e-13) for d, g in zip(SUPPORTED_DTYPES, gammas)}
    progress.tick()

    measured: dict[str, list[tuple[int, float]]] = {name: [] for name in ALGORITHMS}
    timed = candidates("float32", "sum")
    spent = 0.0  # seconds the sizes so far took, the same on every rank (slowest rank's)
    sweep_started = time.perf_counter()
    sizes = (*CALIBRATION_SIZES, LARGE_CALIBRATION_SIZE)
    for index, nbytes in enumerate(sizes):
        models = {name: model_seconds(name, nbytes, ranks, "float32", params, nodes)
                  for name in timed}
        # Each size gets an equal share of what is left of the budget, so that a slow network
        # still sees every size it can afford. One round of every candidate is predicted with
        # each one's latest measured/model ratio: every rank computes the same from the same
        # numbers, so all time the same sizes, as often. Fewer repetitions where the share is
        # tight; none below 3, where the minimum means little (and larger sizes cost more).
        allowance = (CALIBRATION_BUDGET - spent) / (len(sizes) - index)
        per_round = sum(models[name] * (measured[name][-1][1] if measured[name] else 1)
                        for name in timed)
        wanted = 40 if nbytes < (1 << 20) else 5
        repeats = min(wanted, int(allowance / max(per_round, 1e-9)))
        if repeats < 3:
            break
        samples = _time_candidates(nbytes, timed, repeats, allowance)
        # Wall-clock, barriers included, on the slowest rank's clock: the same on every rank.
        spent = float(max_over_ranks(np.array([time.perf_counter() - sweep_started]))[0])
        for j, name in enumerate(timed):
            # The minimum: on a shared machine noise only adds time.
            ratio = max(float(samples[j].min()), 1e-9) / max(models[name], 1e-12)
            measured[name].append((nbytes, ratio))
        progress.tick()
    params.corrections = measured
    params.calibration_seconds = progress.elapsed()
    progress.done()
    return params


_pieces_measured: dict[str, tuple[int, float]] = {}
"""Per calibration key: the pieces between nodes measured in this process, and the exchange's
slowdown with them (``init`` measures them; the calibration that follows keeps them)."""


def _digest(key: dict[str, Any]) -> str:
    return cache_path(key).stem


def _use_pieces(limit: int) -> None:
    """Put calibration's pieces between nodes in force (not over the user's own limit). Every
    rank must call it alike: the limit is part of every call's fingerprint."""
    settings = _core.settings()
    if settings["across_message_bytes_auto"] and settings["across_message_bytes"] != limit:
        _core.settings(calibrated_across_bytes=limit)


def choose_pieces_at_init() -> None:
    """On a communicator that spans nodes, the pieces between nodes from the cached calibration
    if there is one, else measured now (a few exchanges of ``ACROSS_PROBE_BYTES`` between pairs
    of nodes: about 0.5 s on 4 hosts at 1 Gbit/s), so that every call, whatever its algorithm,
    sends what calibration would. Collective; nothing (and no message) on one node, with one
    rank, or with ``RINGLET_CALIBRATE=0``."""
    nodes = _core.nodes(0)
    if len(set(nodes)) <= 1 or os.environ.get("RINGLET_CALIBRATE", "1") == "0":
        return
    _core.set_stats_enabled(False)  # the selector's own traffic is not the user's
    try:
        key = calibration_key()
        cached = _shared_cache(key, cache_path(key))
        if cached is not None:
            _use_pieces(cached.across_message_bytes)
            return
        params = Parameters()
        _choose_pieces_across(params)
        _pieces_measured[_digest(key)] = (params.across_message_bytes, params.exchange_slowdown)
    finally:
        _core.set_stats_enabled(True)


call_after_init(choose_pieces_at_init)


def pick_limit(seconds: dict[int, float]) -> int:
    """Of the limits timed (``seconds``, the first being the one to keep unless another wins),
    the fastest if it takes at most ``PIECES_GAIN`` of the first's time, else the first."""
    first = next(iter(seconds))
    fastest = min(seconds, key=lambda limit: seconds[limit])
    return fastest if seconds[fastest] < PIECES_GAIN * seconds[first] else first


def _choose_pieces_across(params: Parameters) -> None:
    """Time pairs of ranks on two nodes exchanging ``ACROSS_PROBE_BYTES`` both ways at once with
    whole messages and with each of ``ACROSS_PIECES`` (or only with the user's limit, if set),
    keep the fastest (whole messages unless pieces gain ``PIECES_GAIN``) and install it; note
    how much longer than one way the exchange takes with it. Every pairing of nodes that
    halving-doubling uses takes part (whether a connection runs both ways at once with whole
    messages is a matter of chance, connection by connection), each pairing's slowest pair
    counts, and their sum decides, the same on every rank. Collective."""
    settings = _core.settings()
    auto = settings["across_message_bytes_auto"]
    options = (WHOLE_MESSAGES, *ACROSS_PIECES) if auto else (settings["across_message_bytes"],)
    pairings = _pairings(len(set(_core.nodes(0))))
    one_way = _pair_seconds("pairs_one_way", ACROSS_PROBE_BYTES, 5, pairings)
    both_ways = {}
    for limit in options:
        if auto:
            _core.settings(calibrated_across_bytes=limit)
        both_ways[limit] = _pair_seconds("pairs", ACROSS_PROBE_BYTES, 5, pairings)
    chosen = pick_limit(both_ways)
    if auto:
        _core.settings(calibrated_across_bytes=chosen)
    params.across_message_bytes = chosen
    params.exchange_slowdown = max(both_ways[chosen], 1e-9) / max(one_way, 1e-9)


def parameters(recalibrate: bool = False) -> Parameters:
    """This communicator's parameters: cached, or measured now (collective)."""
    _core.set_stats_enabled(False)  # the selector's own traffic is not the user's
    try:
        return _parameters(recalibrate)
    finally:
        _core.set_stats_enabled(True)


def _parameters(recalibrate: bool) -> Parameters:
    if size() <= 1:
        return Parameters(source="one rank: nothing to choose")
    if os.environ.get("RINGLET_CALIBRATE", "1") == "0":
        return Parameters(source="built-in defaults (RINGLET_CALIBRATE=0)")
    key = calibration_key()
    path = cache_path(key)
    params = None if recalibrate else _shared_cache(key, path)
    if params is None:
        params = _calibrate_and_save(key, path, recalibrate)
    # What these parameters were measured with, in force on every rank (a cache read elsewhere
    # may have been measured by another job).
    _use_pieces(params.across_message_bytes)
    return params


def _calibrate_and_save(key: dict[str, Any], path: Path, recalibrate: bool) -> Parameters:
    """Measure (collective), broadcast rank 0's parameters, and have rank 0 save them."""
    first = _core.group()[0] == 0
    params = _measure(key, reuse_pieces=not recalibrate)
    text = _broadcast_text(params.to_json() if first else "")
    params = Parameters.from_json(text, source=f"calibrated now, saved to {path}")
    if first:
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_suffix(f".tmp{os.getpid()}")
            tmp.write_text(text)
            tmp.replace(path)  # atomic: another job never reads half a file
        except OSError as exc:
            warnings.warn(f"ringlet: cannot save calibration to {path}: {exc}", stacklevel=3)
    return params


def calibrate() -> Parameters:
    """Measure this machine again (collective), save the result and rebuild the table."""
    init()
    params = parameters(recalibrate=True)
    _install(size(), params)
    return params


# ---------------------------------------------------------------------------------------------
# explain


@dataclass
class Candidate:
    algorithm: str
    model_us: float
    correction: float
    predicted_us: float
    # The simulator's time with the same parameters, on the same placement (None where the
    # algorithm needs MPI or shared memory, which the simulator does not model).
    simulated_us: float | None = None


SIMULATE_UP_TO = 512
"""explain() simulates each candidate on the job's own placement up to this many ranks (a flat
ring's messages grow as the square of the ranks)."""


def simulated_seconds(algorithm: str, nbytes: int, dtype: str, params: Parameters,
                      nodes: list[int]) -> float | None:
    """The simulator's time for one allreduce of ``nbytes`` with ``algorithm`` on ranks placed
    on ``nodes``, with the calibrated alpha and beta inside and between nodes and gamma, or
    None if the simulator cannot run it (it needs MPI or shared memory)."""
    try:
        seconds, *_ = _core.simulate(
            "allreduce", algorithm, nodes, int(nbytes), (1 / params.beta, params.alpha),
            (1 / params.beta_across, params.alpha_across), params.gamma_of(dtype),
            half_duplex=params.exchange_slowdown > HALF_DUPLEX)
    except ValueError:
        return None
    return float(seconds)


@dataclass
class Explanation:
    nbytes: int
    dtype: str
    op: str
    size: int
    choice: str
    reason: str
    candidates: list[Candidate]
    parameters: str

    def __str__(self) -> str:
        lines = [
            f"allreduce of {_human(self.nbytes)} {self.dtype} ({self.op}) on {self.size} ranks",
            f"  {'algorithm':<20}{'model us':>12}{'measured/model':>16}{'predicted us':>14}"
            f"{'simulated us':>14}",
        ]
        for c in self.candidates:
            mark = "  <- chosen" if c.algorithm == self.choice else ""
            simulated = "-" if c.simulated_us is None else f"{c.simulated_us:.1f}"
            lines.append(
                f"  {c.algorithm:<20}{c.model_us:>12.1f}{c.correction:>16.2f}"
                f"{c.predicted_us:>14.1f}{simulated:>14}{mark}"
            )
        lines.append(f"  choice: {self.choice} ({self.reason})")
        lines.append(f"  parameters: {self.parameters}")
        return "\n".join(lines)


def _human(nbytes: int) -> str:
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if nbytes >= scale:
            return f"{nbytes / scale:.4g} {unit}"
    return f"{nbytes} B"


def explain(x_or_nbytes: Any, op: str = "sum", dtype: str | None = None) -> Explanation:
    """Print and return each candidate's predicted time for an allreduce and the choice.

    ``x_or_nbytes`` is an array (its size and dtype are used) or a byte count (``dtype``
    defaults to float32). Not collective. The parameters are this process's calibration if it
    has one; else the cached calibration for this communicator, if any (read now); else the
    built-in defaults. Which of the three is said in the output.
    """
    from ._dtypes import dtype_name

    init()
    if isinstance(x_or_nbytes, (int, np.integer)):
        nbytes, name = int(x_or_nbytes), dtype or "float32"
        if name not in SUPPORTED_DTYPES:
            raise TypeError(f"unsupported dtype {name!r}; supported: {', '.join(SUPPORTED_DTYPES)}")
    else:
        array = np.asarray(x_or_nbytes)
        nbytes, name = array.nbytes, dtype_name(array.dtype)
    check_op(op)
    ranks = size()
    calibrated = _params is not None and _table_size == ranks
    params = _params if calibrated else _cached_parameters()
    nodes = layout(ranks)

    def simulated(algorithm: str) -> float | None:
        if ranks <= 1 or ranks > SIMULATE_UP_TO:
            return None
        seconds = simulated_seconds(algorithm, nbytes, name, params, nodes)
        return None if seconds is None else seconds * 1e6

    rows = [
        Candidate(
            a,
            model_seconds(a, nbytes, ranks, name, params) * 1e6,
            correction(a, nbytes, params),
            predict(a, nbytes, ranks, name, params) * 1e6,
            simulated(a),
        )
        for a in candidates(name, op)
    ]
    if calibrated and _table:
        choice = _lookup(nbytes, name, op)
        overridden = "RINGLET_ALGORITHM" in os.environ or "RINGLET_AUTO_TABLE" in os.environ
        reason = "set by the environment" if overridden else "lowest predicted time"
    else:
        choice = best(nbytes, ranks, name, params, op)
        reason = "lowest predicted time; auto has not run in this process yet"
    if ranks <= 1:
        reason = "one rank: every algorithm is a no-op"
    explanation = Explanation(nbytes, name, op, ranks, choice, reason, rows, params.source)
    print(explanation)
    return explanation


def _cached_parameters() -> Parameters:
    """This communicator's cached calibration, or the built-in defaults. Local."""
    if size() <= 1:
        return Parameters(source="one rank: nothing to choose")
    key = calibration_key()
    path = cache_path(key)
    cached = _load(path, key)
    if cached is None:
        return Parameters(source=f"built-in defaults (no cached calibration at {path})")
    return cached
