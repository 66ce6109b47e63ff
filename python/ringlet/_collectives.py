"""The collectives besides allreduce: broadcast, reduce, allgather, reduce_scatter (and their
object forms), with the same guarantees as ``allreduce``: a consistency check before any data moves,
bit-identical results on every rank, clear errors on bad input, the GIL released."""

from __future__ import annotations

import operator
import pickle
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from . import _core
from ._arrays import (
    as_array,
    check_out,
    fill,
    native_copy,
    refused_together,
    same_memory,
    why_not_in_place,
)
from ._dtypes import check_op, dtype_name, movable_name
from ._membership import Place, ProcessSet, place
from ._runtime import rank, register_thread, size


def check_algorithm(algorithm: str, collective: str) -> str:
    """``algorithm`` if it is "auto" or one of ``collective``'s registered algorithms."""
    accepted = _core.algorithms(collective)
    if algorithm.__class__ is not str or (algorithm != "auto" and algorithm not in accepted):
        raise ValueError(
            f"unknown algorithm {algorithm!r}; accepted: 'auto', "
            f"{', '.join(map(repr, accepted))}"
        )
    return algorithm


def check_root(root: Any, where: Place) -> int:
    """``root`` (a rank of ringlet's communicator) as a rank of the set ``where``."""
    try:
        root = operator.index(root)
    except TypeError:
        raise TypeError(f"root must be a rank (an int), got {type(root).__name__}") from None
    if not 0 <= root < size():
        raise ValueError(f"root {root} is outside the {size()} ranks (0..{size() - 1})")
    return where.local_rank(root)


class Handle:
    """A collective in flight. ``done()`` polls; ``wait()`` blocks and returns the result.

    The operation holds its arrays until it completes, even if this handle is dropped; do not
    read or write them before ``wait()`` returns.
    """

    __slots__ = ("_finish", "_parts")

    def __init__(self, parts: Sequence[Any], finish: Callable[[], Any]) -> None:
        self._parts = list(parts)
        self._finish = finish

    def done(self) -> bool:
        return all(part.done() for part in self._parts)

    def wait(self) -> Any:
        for part in self._parts:
            part.wait()
        return self._finish()

    def timing(self) -> tuple[float, float] | None:
        """Once done: (seconds from submission until its first collective started, seconds
        from then until its last one finished); None before."""
        times = [t for t in (part.timing() for part in self._parts) if t is not None]
        if not times or len(times) != len(self._parts):
            return None
        queued = times[0][0]
        return queued, max(q + r for q, r in times) - queued


# ---------------------------------------------------------------------------------------------
# broadcast


def _prepare_broadcast(x: Any, root: Any, out: Any, algorithm: str,
                       where: Place) -> tuple[np.ndarray, str, int]:
    with refused_together("broadcast", process_set=where.id):
        x = as_array(x, "broadcast")
        movable_name(x.dtype)
        check_algorithm(algorithm, "broadcast")
        root = check_root(root, where)
        target = None if out is None else check_out(x, out, "broadcast")
    result = fill(x, target)
    return result, movable_name(result.dtype), root


def broadcast(
    x: np.ndarray, root: int = 0, *, out: np.ndarray | None = None, algorithm: str = "auto",
    process_set: ProcessSet | None = None,
) -> np.ndarray:
    """``root``'s ``x`` on every rank.

    Every rank passes an array of the same shape and dtype (any fixed-size dtype); the other
    ranks' values are not used. The result is a new array, or ``out`` (``out=x`` broadcasts in
    place). ``algorithm`` is "auto" or one of ``ringlet.algorithms("broadcast")``. With
    ``process_set``, among its members only; ``root`` is still a rank of ringlet's
    communicator, and must be a member.
    """
    where = place(process_set)
    result, name, root = _prepare_broadcast(x, root, out, algorithm, where)
    _core.broadcast(result, name, root, algorithm, where.id)
    return result


def broadcast_async(
    x: np.ndarray, root: int = 0, *, out: np.ndarray | None = None, algorithm: str = "auto",
    process_set: ProcessSet | None = None,
) -> Handle:
    """Start ``broadcast(x, root, out=out)`` in ringlet's background thread; ``wait()`` returns
    the result. Operations run in submission order."""
    where = place(process_set)
    result, name, root = _prepare_broadcast(x, root, out, algorithm, where)
    return Handle([_core.broadcast_async(result, name, root, algorithm, where.id)],
                  lambda: result)


def broadcast_bytes(data: bytes, root: int = 0, process_set: ProcessSet | None = None) -> bytes:
    """``root``'s ``data`` on every rank (the others pass anything): its length, then it."""
    length = np.array([len(data) if rank() == root else 0], dtype=np.int64)
    length = broadcast(length, root, out=length, process_set=process_set)
    payload = np.zeros(int(length[0]), dtype=np.uint8)
    if rank() == root:
        payload[:] = np.frombuffer(data, dtype=np.uint8)
    return broadcast(payload, root, out=payload, process_set=process_set).tobytes()


def broadcast_object(obj: Any, root: int = 0, *, process_set: ProcessSet | None = None) -> Any:
    """``root``'s picklable ``obj`` on every rank (the others' ``obj`` is ignored)."""
    where = place(process_set)
    with refused_together("broadcast", errors=(Exception,), process_set=where.id):
        check_root(root, where)
        data = pickle.dumps(obj) if rank() == root else b""
    return pickle.loads(broadcast_bytes(data, root, process_set))


# ---------------------------------------------------------------------------------------------
# allgather


def allgather(x: np.ndarray, *, algorithm: str = "auto",
              process_set: ProcessSet | None = None) -> np.ndarray:
    """Every rank's ``x``, concatenated along the first axis in rank order.

    The first dimension may differ between ranks; the other dimensions and the dtype must be
    the same everywhere (else ``MismatchError`` on every rank). A 0-d array counts as one row.
    With ``process_set``, its members' arrays, in the order of its ranks.
    """
    where = place(process_set)
    rows, name = _prepare_allgather(x, algorithm, where)
    raw, counts = _core.allgather(rows, name, algorithm, where.id)
    return _gathered(raw, counts, rows)


def allgather_async(x: np.ndarray, *, algorithm: str = "auto",
                    process_set: ProcessSet | None = None) -> Handle:
    """Start ``allgather(x)`` in ringlet's background thread; ``wait()`` returns the result.
    Operations run in submission order; ``x`` must not change before ``wait()`` returns."""
    where = place(process_set)
    rows, name = _prepare_allgather(x, algorithm, where)
    handle = _core.allgather_async(rows, name, algorithm, where.id)
    return Handle([handle], _once(lambda: _gathered(*handle.result(), rows)))


def _prepare_allgather(x: Any, algorithm: str, where: Place) -> tuple[np.ndarray, str]:
    with refused_together("allgather", process_set=where.id):
        x = as_array(x, "allgather")
        name = movable_name(x.dtype)
        check_algorithm(algorithm, "allgather")
        rows = np.ascontiguousarray(x.reshape(1) if x.ndim == 0 else x)
        if not rows.dtype.isnative:
            rows = native_copy(rows)
    return rows, name


def _gathered(raw: np.ndarray, counts: list[int], rows: np.ndarray) -> np.ndarray:
    return raw.view(rows.dtype).reshape((sum(counts), *rows.shape[1:]))


def _once(finish: Callable[[], Any]) -> Callable[[], Any]:
    """``finish``, computed on the first call and remembered (a handle may be waited on more
    than once, and the core hands its result over once)."""
    memo: list[Any] = []

    def cached() -> Any:
        if not memo:
            memo.append(finish())
        return memo[0]

    return cached


def allgather_object(obj: Any, *, process_set: ProcessSet | None = None) -> list[Any]:
    """Every rank's picklable ``obj``, as a list indexed by rank (within ``process_set``)."""
    where = place(process_set)
    with refused_together("allgather", errors=(Exception,), process_set=where.id):
        data = np.frombuffer(pickle.dumps(obj), dtype=np.uint8)
    sizes = allgather(np.array([len(data)], dtype=np.int64), process_set=process_set)
    gathered = allgather(data, process_set=process_set).tobytes()
    offsets = np.concatenate([[0], np.cumsum(sizes)])
    return [pickle.loads(gathered[offsets[r]:offsets[r + 1]]) for r in range(len(sizes))]


# ---------------------------------------------------------------------------------------------
# alltoall


def alltoall(x: np.ndarray, splits: Sequence[int] | None = None, *, algorithm: str = "auto",
             process_set: ProcessSet | None = None) -> tuple[np.ndarray, list[int]]:
    """Send ``splits[q]`` rows of ``x`` (consecutive, in rank order) to each rank q; returns
    the rows every rank sent this one, concatenated in rank order, and how many came from
    each rank.

    ``splits`` defaults to equal parts (``x.shape[0]`` must then divide by the number of
    ranks). The row shape and the dtype must be the same everywhere (else ``MismatchError``
    on every rank); the splits may differ between ranks. With ``process_set``, among its
    members, indexed by their rank within it.
    """
    where = place(process_set)
    with refused_together("alltoall", process_set=where.id):
        x = as_array(x, "alltoall")
        name = movable_name(x.dtype)
        check_algorithm(algorithm, "alltoall")
        if x.ndim == 0:
            raise ValueError("alltoall needs an array of at least one dimension (it splits the "
                             "first)")
        ranks = where.size
        if splits is None:
            if x.shape[0] % ranks:
                raise ValueError(f"alltoall without splits divides the first dimension "
                                 f"({x.shape[0]}) equally among {ranks} ranks; pass splits=")
            splits = [x.shape[0] // ranks] * ranks
        splits = [operator.index(s) for s in splits]
        if len(splits) != ranks or any(s < 0 for s in splits) or sum(splits) != x.shape[0]:
            raise ValueError(f"alltoall splits must be {ranks} counts >= 0 adding up to "
                             f"x.shape[0] = {x.shape[0]}, got {splits}")
        rows = np.ascontiguousarray(x)
        if not rows.dtype.isnative:
            rows = native_copy(rows)
    raw, counts = _core.alltoall(rows, name, splits, algorithm, where.id)
    return raw.view(rows.dtype).reshape((sum(counts), *rows.shape[1:])), list(counts)


# ---------------------------------------------------------------------------------------------
# reduce_scatter


def split_rows(rows: int, ranks: int) -> list[int]:
    """Rows per rank as ``numpy.array_split`` splits them: the first ``rows % ranks`` ranks
    get one more."""
    return [rows // ranks + (r < rows % ranks) for r in range(ranks)]


def reduce_scatter(
    x: np.ndarray, op: str = "sum", *, counts: Sequence[int] | None = None,
    algorithm: str = "auto", process_set: ProcessSet | None = None,
) -> np.ndarray:
    """The reduction of ``x`` over all ranks, of which this rank gets its block of rows.

    Every rank passes ``x`` of the same shape and dtype. Rank r's block is rows
    ``sum(counts[:r]) .. sum(counts[:r+1])`` of axis 0: by default split as
    ``numpy.array_split`` would split them, or ``counts`` (rows per rank, adding up to
    ``x.shape[0]``). ``op`` as in ``allreduce``; the result is a new array. With
    ``process_set``, over its members, in the order of its ranks.
    """
    where = place(process_set)
    array, name, counts = _prepare_reduce_scatter(x, op, counts, algorithm, where)
    raw = _core.reduce_scatter(array, name, op, counts, algorithm, where.id)
    return raw.view(array.dtype).reshape((counts[where.rank], *array.shape[1:]))


def reduce_scatter_async(
    x: np.ndarray, op: str = "sum", *, counts: Sequence[int] | None = None,
    algorithm: str = "auto", process_set: ProcessSet | None = None,
) -> Handle:
    """Start ``reduce_scatter(x, op, counts=counts)`` in ringlet's background thread;
    ``wait()`` returns this rank's block. ``x`` must not change before ``wait()`` returns."""
    where = place(process_set)
    array, name, counts = _prepare_reduce_scatter(x, op, counts, algorithm, where)
    handle = _core.reduce_scatter_async(array, name, op, counts, algorithm, where.id)
    rows = counts  # the core checks them when the job runs; read only once it has

    def block() -> np.ndarray:
        return handle.result()[0].view(array.dtype).reshape((rows[where.rank], *array.shape[1:]))

    return Handle([handle], _once(block))


def _prepare_reduce_scatter(x: Any, op: str, counts: Sequence[int] | None, algorithm: str,
                            where: Place) -> tuple[np.ndarray, str, list[int]]:
    with refused_together("reduce_scatter", process_set=where.id):
        x = as_array(x, "reduce_scatter")
        name = dtype_name(x.dtype)
        check_op(op)
        check_algorithm(algorithm, "reduce_scatter")
        _core.check_algorithm("reduce_scatter", algorithm, name, op)
        if x.ndim == 0:
            raise ValueError("reduce_scatter needs an array of at least one dimension")
        ranks = where.size
        if counts is None:
            counts = split_rows(x.shape[0], ranks)
        counts = [operator.index(c) for c in counts]
        if any(c < 0 for c in counts):
            raise ValueError(f"counts must not be negative, got {counts}")
        array = np.ascontiguousarray(x)
        if not array.dtype.isnative:
            array = native_copy(array)
    return array, name, counts


# ---------------------------------------------------------------------------------------------
# reduce


def reduce(
    x: np.ndarray, root: int = 0, op: str = "sum", *, out: np.ndarray | None = None,
    algorithm: str = "auto", process_set: ProcessSet | None = None,
) -> np.ndarray | None:
    """The element-wise reduction of ``x`` over all ranks, on ``root``; None on the others.

    Every rank passes ``x`` of the same shape and dtype; ``x`` is not changed. ``op`` as in
    ``allreduce``. On ``root`` the result is a new array, or ``out`` (x's dtype and shape,
    writeable; ``out=x`` is fine); the other ranks ignore ``out``. ``algorithm`` is "auto" (the
    cost model's cheapest for this size and placement) or one of
    ``ringlet.algorithms("reduce")``: "binomial" (short messages), "k_chain" (⌈√(N-1)⌉ chains
    feeding the root), "reduce_scatter_gather" (Rabenseifner's, long messages) or "mpi"
    (MPI_Reduce). With ``process_set``, over its members; ``root`` is still a rank of
    ringlet's communicator, and must be a member.
    """
    where = place(process_set)
    with refused_together("reduce", process_set=where.id):
        x = as_array(x, "reduce")
        name = dtype_name(x.dtype)
        check_op(op)
        check_algorithm(algorithm, "reduce")
        _core.check_algorithm("reduce", algorithm, name, op)
        local_root = check_root(root, where)
        at_root = where.rank == local_root
        if out is not None and at_root:
            _check_reduce_out(x, out)
        array = np.ascontiguousarray(x).reshape(x.shape)  # 0-d stays 0-d
        if not array.dtype.isnative:
            array = native_copy(array)
    if not at_root:
        _core.reduce(array, name, op, local_root, algorithm, None, where.id)
        return None
    # The root reduces straight into its result: out itself when the core can write it (x too,
    # in place), else a new array.
    direct = out is not None and why_not_in_place(out) is None and out.dtype.isnative
    target = out if direct else np.empty(array.shape, array.dtype)
    # out=x (or a view of all of x) is the core's in-place case; anything else that overlaps x
    # was refused above.
    in_place = target is array or (direct and np.may_share_memory(target, array))
    _core.reduce(array, name, op, local_root, algorithm, array if in_place else target,
                 where.id)
    if out is None or direct:
        return target
    np.copyto(out, target)
    return out


def _check_reduce_out(x: np.ndarray, out: Any) -> None:
    if not isinstance(out, np.ndarray):
        raise ValueError(f"out must be a numpy.ndarray, got {type(out).__name__}")
    if out.dtype != x.dtype or out.shape != x.shape:
        raise ValueError(
            f"out must have x's dtype and shape ({x.dtype}{list(x.shape)}), "
            f"got {out.dtype}{list(out.shape)}"
        )
    if not out.flags.writeable:
        raise ValueError("out must be writeable")
    if out is not x and np.may_share_memory(out, x) and not same_memory(out, x) \
            and np.shares_memory(out, x):
        raise ValueError("out overlaps x without being x; pass out=x or a separate array")


# ---------------------------------------------------------------------------------------------
# barrier


def barrier(process_set: ProcessSet | None = None) -> None:
    """Wait until every rank (of ``process_set``, if given) has called it (a collective,
    checked like the others)."""
    register_thread()
    _core.barrier(place(process_set).id)
