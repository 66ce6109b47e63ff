"""Many arrays in few collectives: gradient averaging, asynchronous allreduce, compression.

The Rust core packs arrays into fusion buffers, compresses them for the wire if asked, runs one
allreduce per buffer, and unpacks: on the caller's thread (``average_gradients``), or queued to
its background thread in submission order (the ``_async`` calls: Python gets a handle and goes
on; the GIL is not held meanwhile).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from . import _core, calibration
from ._allreduce import allreduce, prepare
from ._arrays import refused_together, why_not_in_place, why_not_readable
from ._collectives import Handle, broadcast_object, check_algorithm
from ._dtypes import FLOAT_DTYPES, SIXTEEN_BIT_FLOATS, check_op, dtype_name
from ._membership import ProcessSet, place
from ._runtime import register_thread, topology

DEFAULT_FUSION_THRESHOLD = _core.default_fusion_threshold()
"""Bytes per fusion buffer unless ``fusion_threshold=`` or RINGLET_FUSION_THRESHOLD says."""

COMPRESSIONS = {None: None, "none": None, "fp16": "float16", "float16": "float16",
                "bf16": "bfloat16", "bfloat16": "bfloat16"}


def fusion_threshold_bytes(value: int | None = None) -> int:
    """The fusion buffer size in bytes: ``value`` if given, else RINGLET_FUSION_THRESHOLD,
    else 64 MiB (the core's rule, which its fast path reads too)."""
    return _core.fusion_threshold_bytes(None if value is None else int(value))


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


def bucket_bytes(dtype: str, size: int, *, hosts: int, cores_per_rank: int, threads: int,
                 process_set: int = 0, parameters: str | None = None) -> Buckets:
    """How large ``DistributedOptimizer``'s buckets are: the first bucket's allreduce runs
    while backward computes the rest, so smaller buckets hide more, but each costs a launch,
    the call's check and its algorithm's latency terms. Overlap pays only if the transfer does
    not need the cores backward runs on: between hosts it is the network's time (a waiting
    thread sleeps, see ``_core.wait_policy``); on one host it is copies and reductions made
    by these cores, so without a spare core (``cores_per_rank`` <= ``threads``) overlapping
    only shares them, and one bucket, reduced once backward is done, is fastest
    (benchmarks/RESULTS.md, "Training steps"). Otherwise the bucket is the smallest whose
    fixed costs are ``BUCKET_OVERHEAD`` of its time, with the times the core predicts on
    ``process_set`` (on ``size`` ranks of one node if it has another size: a what-if), within
    [1 MiB, 64 MiB]; ``parameters`` (JSON) price instead of the installed ones. Local: every
    rank computes the same from the same parameters."""
    if size <= 1:
        return Buckets(ONE_BUCKET, "one rank: nothing to communicate")
    if hosts == 1 and cores_per_rank <= threads:
        return Buckets(ONE_BUCKET, (
            f"one host, {cores_per_rank} core(s) per rank for {threads} compute thread(s): the "
            "transfers are copies these cores make, so overlapping them with backward only "
            "shares the cores; one bucket, reduced when backward is done"))
    nodes = None if size == _core.group(process_set).size else [0] * size

    def predicted(nbytes: int, dtype: str) -> tuple[str, dict[str, float]]:
        explained = _core.explain(nbytes, dtype, "sum", parameters=parameters, nodes=nodes,
                                  process_set=process_set)
        return explained.choice, {
            row.algorithm: row.predicted_seconds for row in explained.candidates
        }

    large, at_largest = predicted(MAX_BUCKET, dtype)
    check, of_check = predicted(32, "int64")
    _, at_smallest = predicted(8, dtype)
    fixed = LAUNCH_SECONDS + of_check[check] + at_smallest[large]
    per_byte = max((at_largest[large] - at_smallest[large]) / MAX_BUCKET, 1e-15)
    limit = fixed * (1 - BUCKET_OVERHEAD) / (BUCKET_OVERHEAD * per_byte)
    limit = int(min(max(limit, MIN_BUCKET), MAX_BUCKET))
    where = f"{hosts} hosts" if hosts > 1 else "a spare core per rank"
    return Buckets(limit, (
        f"{where}: a bucket's fixed cost (~{fixed * 1e6:.0f} us: launch, check, {large}'s "
        f"latency) is {BUCKET_OVERHEAD:.0%} of its time at {limit / (1 << 20):.4g} MiB"))


@dataclass(frozen=True)
class BucketPlan:
    """Which arrays travel together: ``buckets[k]`` lists the indices of bucket k's arrays, in
    the order they were given; ``limit`` is the bytes per bucket the plan was cut at and
    ``reason`` says where that came from."""

    buckets: list[list[int]]
    limit: int
    reason: str


def plan_buckets(
    nbytes: Sequence[int],
    *,
    dtype: str = "float32",
    fusion_threshold: int | None = None,
    compute_threads: int = 1,
    process_set: ProcessSet | None = None,
) -> BucketPlan:
    """Cut arrays of ``nbytes`` each, listed in the order they become ready (for gradients:
    the reverse of the parameters' order), into consecutive buckets, each reduced by one
    fused allreduce as soon as its last array is ready.

    The size comes from ``fusion_threshold`` if given, else RINGLET_FUSION_THRESHOLD if set,
    else the cost model (:func:`bucket_bytes`: small buckets where the transfer can
    overlap the computation, one bucket where it would only share the cores with it);
    ``compute_threads`` is how many threads each rank computes with. Collective: rank 0 plans
    and every rank gets its plan, so the ranks agree even if their settings differ; ranks that
    give different ``nbytes`` all raise ``ValueError``. With ``process_set``, collective over
    its members, its first rank planning.
    """
    sizes = [int(n) for n in nbytes]
    if any(n < 0 for n in sizes):
        raise ValueError("array sizes must be >= 0 bytes")
    where = place(process_set)
    if where.id == 0:
        calibration.ensure_installed()
    if fusion_threshold is not None or "RINGLET_FUSION_THRESHOLD" in os.environ:
        limit = max(fusion_threshold_bytes(fusion_threshold), 1)
        reason = ("fusion_threshold" if fusion_threshold is not None
                  else "RINGLET_FUSION_THRESHOLD") + f" = {limit} bytes"
    else:
        here = topology()
        try:
            affinity = len(os.sched_getaffinity(0))
        except AttributeError:  # not Linux
            affinity = os.cpu_count() or 1
        cores_per_rank = min(affinity, (os.cpu_count() or 1) // here.local_size)
        choice = bucket_bytes(
            dtype, where.size, hosts=here.cross_size, cores_per_rank=cores_per_rank,
            threads=max(int(compute_threads), 1), process_set=where.id)
        limit, reason = choice.limit, choice.reason
    buckets: list[list[int]] = []
    filled = 0
    for index, n in enumerate(sizes):
        if not buckets or (buckets[-1] and filled + n > limit):
            buckets.append([])
            filled = 0
        buckets[-1].append(index)
        filled += n
    plan = BucketPlan(buckets, limit, reason)
    first = 0 if where.ranks is None else where.ranks[0]
    chosen, first_sizes = broadcast_object((plan, sizes), first, process_set=process_set)
    if _any_rank(first_sizes != sizes, process_set):
        raise ValueError(
            "the ranks plan buckets for different arrays (rank 0 has "
            f"{len(first_sizes)} arrays of {sum(first_sizes)} bytes, this rank {len(sizes)} of "
            f"{sum(sizes)}, or another rank differs): every rank must pass the same model")
    return chosen


def _any_rank(flag: bool, process_set: ProcessSet | None = None) -> bool:
    """True on every rank if ``flag`` is true on any (collective)."""
    flags = np.array([int(flag)], dtype=np.int32)
    return bool(allreduce(flags, "max", process_set=process_set)[0])


def wire_dtype(dtype: str, compression: Any) -> str:
    """The dtype on the wire: 16-bit compression applies to floating-point data only (integers
    travel as they are, as with Horovod's Compression.fp16)."""
    key = getattr(compression, "wire_dtype", compression)
    if key not in COMPRESSIONS:
        raise ValueError(
            f"unknown compression {compression!r}; accepted: None, 'fp16', 'bf16' "
            "(or ringlet.hvd.Compression.none/fp16/bf16)"
        )
    wire = COMPRESSIONS[key]
    if wire is None or dtype not in FLOAT_DTYPES or dtype in SIXTEEN_BIT_FLOATS:
        return dtype
    return wire


def _check_in_place(array: Any, what: str) -> str:
    if not isinstance(array, np.ndarray):
        raise TypeError(f"{what} takes numpy arrays, got {type(array).__name__}")
    name = dtype_name(array.dtype)
    reason = why_not_in_place(array)
    if reason is not None:
        raise ValueError(f"{what} works in place and needs C-contiguous, writeable, aligned "
                         f"arrays in native byte order, but one is not: {reason}")
    return name


def _check_results(arrays: Sequence[np.ndarray], out: Sequence[np.ndarray]) -> list[str]:
    """The dtype names of ``arrays`` reduced into ``out``: one result per array, of its shape
    and dtype, writeable; an array only read (an entry that is the array itself: in place)."""
    if len(out) != len(arrays):
        raise ValueError(f"out has {len(out)} arrays for {len(arrays)} arrays to reduce; it "
                         "needs one result per array")
    names = []
    for i, (array, result) in enumerate(zip(arrays, out)):
        if result is array:
            names.append(_check_in_place(array, "a grouped allreduce"))
            continue
        if not isinstance(array, np.ndarray):
            raise TypeError(f"a grouped allreduce takes numpy arrays, got {type(array).__name__}")
        name = _check_in_place(result, "a grouped allreduce's out")
        if result.shape != array.shape or result.dtype != array.dtype:
            raise ValueError(f"out[{i}] is a {result.shape} {result.dtype} array, but the array "
                             f"it receives is {array.shape} {array.dtype}: a result must have "
                             "its array's shape and dtype")
        reason = why_not_readable(array)
        if reason is not None:
            raise ValueError("an out-of-place grouped allreduce reads C-contiguous, aligned "
                             "arrays in native byte order (read-only ones too), but array "
                             f"{i} is not: {reason}")
        if np.may_share_memory(array, result):
            raise ValueError(f"out[{i}] overlaps an array to reduce in memory; it must be the "
                             "array itself (in place) or a separate buffer")
        names.append(name)
    if len(set(names)) > 1:
        # Each dtype is its own collective, which checks its own arrays: across them, here.
        _check_apart(arrays, out)
    return names


def _check_apart(arrays: Sequence[np.ndarray], out: Sequence[np.ndarray]) -> None:
    """No result shares bytes with another result or with another entry's array (each is
    C-contiguous: one byte range; an array and its own result were compared already)."""
    spans = sorted([(r.__array_interface__["data"][0], r.nbytes, "out", i)
                    for i, r in enumerate(out) if r.nbytes] +
                   [(a.__array_interface__["data"][0], a.nbytes, "array", i)
                    for i, (a, r) in enumerate(zip(arrays, out)) if a.nbytes and a is not r])
    # Sweeping by start: what the furthest-reaching result, and span of any kind, cover.
    out_reach, any_reach = (0, None), (0, None)
    for start, nbytes, kind, i in spans:
        other = any_reach if kind == "out" else out_reach
        if start < other[0]:
            raise ValueError(f"{kind}[{i}] overlaps {other[1]} in memory: every result must be "
                             "a separate buffer, apart from every array")
        end = (start + nbytes, f"{kind}[{i}]")
        any_reach = max(any_reach, end, key=lambda reach: reach[0])
        if kind == "out":
            out_reach = max(out_reach, end, key=lambda reach: reach[0])


def _group_calls(
    arrays: Sequence[np.ndarray], op: str, algorithm: str, compression: Any, prescale: float,
    postscale: float, fusion_threshold: int | None, process_set: ProcessSet | None,
    out: Sequence[np.ndarray] | None = None,
) -> list[tuple[Any, ...]]:
    """Every check of a grouped allreduce's arguments (shared with the other ranks before an
    error propagates), then the core's arguments for each dtype's fused stream (the process
    set's id, then the results, last), in order of first appearance: the same on every
    rank."""
    where = place(process_set)
    with refused_together("allreduce", process_set=where.id):
        check_op(op)
        check_algorithm(algorithm, "allreduce")
        if out is None:
            names = [_check_in_place(a, "a grouped allreduce") for a in arrays]
        else:
            out = list(out)
            names = _check_results(arrays, out)
        threshold = fusion_threshold_bytes(fusion_threshold)
        wires = {name: wire_dtype(name, compression) for name in names}
        for wire in wires.values():
            _core.check_algorithm("allreduce", algorithm, wire, op)
        prescale, postscale = float(prescale), float(postscale)
    if algorithm == "auto" and where.id == 0:
        # The core decides, with the model's parameters, which the first call installs
        # (collective; a process set's were installed when it was added).
        calibration.ensure_installed()
    by_dtype: dict[str, list[np.ndarray]] = {}
    results: dict[str, list[np.ndarray]] = {}
    for i, (name, array) in enumerate(zip(names, arrays)):
        by_dtype.setdefault(name, []).append(array)
        if out is not None:
            results.setdefault(name, []).append(out[i])
    return [(group, name, wires[name], op, algorithm, prescale, postscale, threshold, None,
             where.id, results.get(name)) for name, group in by_dtype.items()]


def allreduce_group(
    arrays: Sequence[np.ndarray],
    op: str = "sum",
    *,
    algorithm: str = "auto",
    compression: Any = None,
    prescale: float = 1.0,
    postscale: float = 1.0,
    fusion_threshold: int | None = None,
    process_set: ProcessSet | None = None,
    out: Sequence[np.ndarray] | None = None,
) -> None:
    """``allreduce_group_async(...).wait()`` without the hand-off: the collectives run on this
    thread (after whatever is queued), which waits for them with the GIL released."""
    for call in _group_calls(arrays, op, algorithm, compression, prescale, postscale,
                             fusion_threshold, process_set, out):
        _core.allreduce_group(*call)


def allreduce_group_async(
    arrays: Sequence[np.ndarray],
    op: str = "sum",
    *,
    algorithm: str = "auto",
    compression: Any = None,
    prescale: float = 1.0,
    postscale: float = 1.0,
    fusion_threshold: int | None = None,
    result: Any = None,
    process_set: ProcessSet | None = None,
    out: Sequence[np.ndarray] | None = None,
) -> Handle:
    """Queue an allreduce of ``arrays`` (fused, one stream per dtype) over all ranks or
    ``process_set``'s, in place or into ``out`` (as ``average_gradients``); ``wait()`` returns
    ``result``."""
    handles = [_core.allreduce_group_async(*call)
               for call in _group_calls(arrays, op, algorithm, compression, prescale,
                                        postscale, fusion_threshold, process_set, out)]
    return Handle(handles, lambda: result)


def average_gradients(
    arrays: Sequence[np.ndarray],
    *,
    op: str = "avg",
    compression: Any = None,
    prescale: float = 1.0,
    postscale: float = 1.0,
    fusion_threshold: int | None = None,
    algorithm: str = "auto",
    process_set: ProcessSet | None = None,
    out: Sequence[np.ndarray] | None = None,
) -> None:
    """Average (or ``op``) each array across ranks (or ``process_set``'s), in place, or into
    ``out``: one writeable C-contiguous array per array, of its shape and dtype, the arrays
    then only read (an entry may be the array itself, reduced in place).

    Small arrays are packed into fusion buffers of at most ``fusion_threshold`` bytes (default
    64 MiB, or RINGLET_FUSION_THRESHOLD), one collective per buffer, in the arrays' order.
    ``compression="fp16"`` or ``"bf16"`` sends floating-point data as 16 bits (reduced with
    float32 accumulation, cast back). ``prescale`` multiplies before the reduction and
    ``postscale`` after it, as in Horovod. The collectives run on this thread, which waits for
    them with the GIL released.
    """
    if compression is None and algorithm == "auto" and prescale == 1.0 and postscale == 1.0:
        if process_set is None and fusion_threshold is None and out is None:
            # A training loop's call, straight to the core: no second frame.
            if _core.allreduce_group_fast(arrays, op, None):
                return
        elif _fast_group(arrays, op, fusion_threshold, process_set, out):
            return
    allreduce_group(
        arrays, op, algorithm=algorithm, compression=compression, prescale=prescale,
        postscale=postscale, fusion_threshold=fusion_threshold, process_set=process_set,
        out=out,
    )


def _fast_group(arrays: Sequence[np.ndarray], op: str, fusion_threshold: int | None,
                process_set: ProcessSet | None, out: Sequence[np.ndarray] | None) -> bool:
    """The common case of a grouped allreduce, checked and run in the core; False when it is
    not that case (the caller's checks then explain what is wrong, on every rank, and name a
    thread that calls for the first time)."""
    if fusion_threshold is not None and not (type(fusion_threshold) is int
                                             and 0 <= fusion_threshold < 1 << 62):
        return False
    if process_set is None:
        if out is None:
            return _core.allreduce_group_fast(arrays, op, fusion_threshold)
        return _core.allreduce_group_fast(arrays, op, fusion_threshold, 0, out)
    if type(process_set) is not ProcessSet:
        return False
    return _core.allreduce_group_fast(arrays, op, fusion_threshold, process_set.id, out)


def allreduce_async(
    x: np.ndarray,
    op: str = "sum",
    *,
    out: np.ndarray | None = None,
    algorithm: str = "auto",
    compression: Any = None,
    prescale: float = 1.0,
    postscale: float = 1.0,
    process_set: ProcessSet | None = None,
) -> Handle:
    """Start ``allreduce(x, op, out=out, algorithm=algorithm)`` in the background.

    Returns a handle: ``done()`` polls, ``wait()`` returns the reduced array. Operations run in
    submission order (so every rank must submit them in the same order).
    """
    # The same checks and copy as the synchronous call, then one queued group of one.
    result, _ = prepare(x, op, out, algorithm, place(process_set).id)
    return allreduce_group_async(
        [result], op, algorithm=algorithm, compression=compression, prescale=prescale,
        postscale=postscale, fusion_threshold=0, result=result, process_set=process_set,
    )


def join(process_set: ProcessSet | None = None) -> int:
    """Say this rank has no more collectives to make (its data ran out first), and wait for
    the others (of ``process_set``) to say so too; returns the rank that joined last, the same
    on every rank.

    Meanwhile this rank takes part in the others' "sum" and "avg" allreduces, sync or async,
    fused or compressed, adding zeros ("avg" still divides by every rank, as Horovod's
    ``join`` does). Any other collective the others make raises ``MismatchError`` on them,
    saying who has joined; the ranks must not change ``ringlet.settings()`` meanwhile. Needs
    the consistency check (the default; not RINGLET_CHECK=0).
    """
    register_thread()
    where = place(process_set)
    # The others' first "auto" call installs the model's parameters, collectively (calibration
    # included): install them here too, at the same point in the sequence of calls.
    if where.id == 0:
        calibration.ensure_installed()
    last = _core.join(where.id)
    return last if where.ranks is None else where.ranks[last]
