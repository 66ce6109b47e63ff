"""The promise of docs/guide/failures.md, for every collective: when ranks disagree on a call
(shape, dtype, op, algorithm, root, counts, order), every rank raises MismatchError naming who
passed what, no data changes, and the ranks stay in step. The last rank is the odd one out; the
suite runs this at 2, 3, 4, 5 and 8 ranks."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

import ringlet
import ringlet.hvd as hvd


def in_step(size: int) -> bool:
    return bool(ringlet.allreduce(np.ones(3), "sum")[0] == size)


def expect_mismatch(size: int, call: Callable[[], Any], *named: str) -> None:
    with pytest.raises(ringlet.MismatchError) as info:
        call()
    message = str(info.value)
    assert isinstance(info.value, RuntimeError)
    for part in named:
        assert part in message, message
    assert f"rank {size - 1} passed" in message, message
    assert in_step(size), "the ranks are out of step after the mismatch"


def odd(rank: int, size: int) -> bool:
    return rank == size - 1


CASES: dict[str, Callable[[bool], tuple[Callable[[], Any], np.ndarray | None, tuple[str, ...]]]]
CASES = {}


def case(name: str):
    def register(build):
        CASES[name] = build
        return build
    return register


@case("allreduce shape")
def _(o):
    x = np.ones((4, 2, 3) if o else (4, 6), dtype=np.float32)
    return (lambda: ringlet.allreduce(x, out=x)), x, ("float32[4, 6]", "float32[4, 2, 3]")


@case("allreduce count")
def _(o):
    x = np.ones(999 if o else 1000, dtype=np.float32)
    return (lambda: ringlet.allreduce(x, out=x)), x, ("float32[1000]", "float32[999]")


@case("allreduce dtype")
def _(o):
    x = np.ones(8, dtype=np.float64 if o else np.float32)
    return (lambda: ringlet.allreduce(x, out=x)), x, ("float32[8]", "float64[8]")


@case("allreduce op")
def _(o):
    x = np.ones(8, dtype=np.float32)
    return (lambda: ringlet.allreduce(x, "max" if o else "sum", out=x)), x, (" sum", " max")


@case("allreduce algorithm")
def _(o):
    x = np.ones(8, dtype=np.float32)
    algorithm = "recursive_doubling" if o else "ring"
    return (lambda: ringlet.allreduce(x, out=x, algorithm=algorithm)), x, (
        "(ring)", "(recursive_doubling)")


@case("fused group shapes")
def _(o):
    grads = [np.ones(10, dtype=np.float32), np.ones(4 if o else 5, dtype=np.float32)]
    return (lambda: ringlet.average_gradients(grads)), grads[0], ("[10], [5]", "[10], [4]")


@case("fused group compression")
def _(o):
    grads = [np.ones(10, dtype=np.float32)]
    compression = "bf16" if o else None
    return (lambda: ringlet.average_gradients(grads, compression=compression)), grads[0], (
        "float32 array", "bfloat16 array")


@case("broadcast shape")
def _(o):
    x = np.zeros(5 if o else 4, dtype=np.uint8)
    return (lambda: ringlet.broadcast(x, 0, out=x)), None, ("uint8[4]", "uint8[5]")


@case("broadcast dtype")
def _(o):
    x = np.zeros(4, dtype=np.int8 if o else np.uint8)
    return (lambda: ringlet.broadcast(x, 0, out=x)), None, ("uint8[4]", "int8[4]")


@case("broadcast root")
def _(o):
    x = np.zeros(4)
    return (lambda: ringlet.broadcast(x, 1 if o else 0, out=x)), None, (
        "from root 0", "from root 1")


@case("allgather trailing dimensions")
def _(o):
    x = np.ones((2, 4 if o else 3))
    return (lambda: ringlet.allgather(x)), x, ("float64[2, 3]", "float64[2, 4]")


@case("allgather dtype")
def _(o):
    x = np.ones((2, 3), dtype=np.int32 if o else np.float32)
    return (lambda: ringlet.allgather(x)), x, ("float32[2, 3]", "int32[2, 3]")


@case("alltoall row shape")
def _(o):
    x = np.ones((ringlet.size(), 4 if o else 3))
    return (lambda: ringlet.alltoall(x)), x, (", 3]", ", 4]")


@case("alltoall dtype")
def _(o):
    x = np.ones((ringlet.size(), 3), dtype=np.int32 if o else np.float32)
    return (lambda: ringlet.alltoall(x)), x, ("float32[", "int32[")


@case("reduce_scatter shape")
def _(o):
    x = np.ones((6, 3 if o else 2))
    return (lambda: ringlet.reduce_scatter(x)), x, ("float64[6, 2]", "float64[6, 3]")


@case("reduce_scatter op")
def _(o):
    x = np.ones((6, 2))
    return (lambda: ringlet.reduce_scatter(x, "max" if o else "sum")), x, (" sum", " max")


@case("order")
def _(o):
    x = np.ones(4)
    call = (lambda: ringlet.broadcast(x, 0, out=x)) if o else (lambda: ringlet.allreduce(x))
    return call, x, ("allreduce #", "broadcast #")


@case("barrier against a collective")
def _(o):
    return (ringlet.barrier if o else (lambda: ringlet.allreduce(np.ones(4)))), None, (
        "barrier #",)


@pytest.mark.parametrize("name", sorted(CASES))
def test_every_disagreement_is_a_mismatch_on_every_rank(rank, size, name):
    if size == 1:
        CASES[name](False)[0]()  # alone, nobody disagrees
        return
    call, data, named = CASES[name](odd(rank, size))
    before = None if data is None else data.copy()
    expect_mismatch(size, call, *named)
    if data is not None:
        assert np.array_equal(data, before), "data changed although the call was refused"


def test_reduce_scatter_counts_that_differ(rank, size):
    if size == 1:
        return
    counts = [2] * size
    if odd(rank, size):
        counts[0], counts[-1] = 3, 1
    expect_mismatch(size, lambda: ringlet.reduce_scatter(np.ones((2 * size, 2)), counts=counts),
                    "into rows")


def test_limits_between_nodes_that_differ(rank, size):
    """The pieces between nodes must be cut alike on both ends: a rank with its own limit
    makes every call a mismatch (naming it), never a garbled exchange."""
    if size == 1:
        return
    x = np.arange(10, dtype=np.float64)
    try:
        if odd(rank, size):
            ringlet.settings(across_message_bytes=1024)
        with pytest.raises(ringlet.MismatchError, match="across_message_bytes=1024"):
            ringlet.allreduce(x, out=x)
    finally:
        ringlet.settings(across_message_bytes="auto")
    assert np.array_equal(x, np.arange(10)), "data changed although the call was refused"
    assert in_step(size)


def test_the_refusing_rank_raises_its_own_error(rank, size):
    """A bad call on one rank: that rank gets its own ValueError, the others MismatchError."""
    x = np.ones(4, dtype=np.float16)
    algorithm = "mpi" if rank == 0 else "ring"  # MPI has no float16
    if size == 1:
        with pytest.raises(ValueError, match="MPI has no 16-bit float type"):
            ringlet.allreduce(x, algorithm=algorithm)
        return
    expected = ValueError if rank == 0 else ringlet.MismatchError
    with pytest.raises(expected) as info:
        ringlet.allreduce(x, algorithm=algorithm)
    if rank != 0:
        assert "rank 0 passed allreduce" in str(info.value)
        assert "MPI has no 16-bit float type" in str(info.value)
    assert in_step(size)
    # An async call refused on one rank: the same, in queue order.
    compression = "zip" if rank == 0 else None
    with pytest.raises(expected):
        ringlet.allreduce_group_async([np.ones(3)], compression=compression).wait()
    assert in_step(size)


def test_horovod_api_disagreements_are_runtime_errors(rank, size):
    """Horovod raises a RuntimeError subclass for cross-rank disagreements: so do ringlet.hvd's
    collectives (MismatchError)."""
    if size == 1:
        return
    o = odd(rank, size)
    calls = [
        lambda: hvd.allreduce(np.ones(3 + o)),
        lambda: hvd.grouped_allreduce([np.ones(2), np.ones(3 + o)]),
        lambda: hvd.allgather(np.ones((1, 2 + o))),
        lambda: hvd.broadcast(np.ones(2 + o), root_rank=0),
        lambda: hvd.reducescatter(np.ones((size, 1 + o))),
        lambda: hvd.broadcast(np.ones(2, dtype=np.float32 if o else np.float64), root_rank=0),
    ]
    for call in calls:
        with pytest.raises(RuntimeError) as info:
            call()
        assert isinstance(info.value, ringlet.MismatchError), info.value
        assert in_step(size)
