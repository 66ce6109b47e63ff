"""Disagreeing ranks, threads, many calls, and property-based sweeps (under mpirun)."""

from __future__ import annotations

import threading

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import ringlet
from ringlet import _core

from mpi_fixtures import ALL_DTYPES, exact_input, np_dtype, reference, same_on_every_rank


def test_mismatched_shapes_raise_on_every_rank_naming_who_passed_what(comm, rank, size):
    if size == 1:
        assert ringlet.allreduce(np.ones(3, dtype=np.float32))[0] == 1
        return
    x = np.ones(1000 - (rank == size - 1), dtype=np.float32)
    before = x.copy()
    with pytest.raises(ringlet.MismatchError) as info:
        ringlet.allreduce(x, out=x, algorithm="ring")
    message = str(info.value)
    last = f"rank {size - 1}" if size > 2 else "rank 1"
    assert "float32[1000]" in message and "float32[999]" in message and last in message
    assert np.array_equal(x, before), "no data moved"
    assert isinstance(info.value, ringlet.RingletError)
    # Everyone is in step again afterwards.
    assert ringlet.allreduce(np.ones(5))[0] == size


@pytest.mark.parametrize("field", ["dtype", "op", "algorithm"])
def test_mismatched_dtype_op_or_algorithm(rank, size, field):
    if size == 1:
        return
    odd = rank == 0
    dtype = np.float64 if (field == "dtype" and odd) else np.float32
    op = "max" if (field == "op" and odd) else "sum"
    algorithm = "recursive_doubling" if (field == "algorithm" and odd) else "ring"
    with pytest.raises(ringlet.MismatchError, match="ranks disagree"):
        ringlet.allreduce(np.ones(64, dtype=dtype), op, algorithm=algorithm)


def test_mismatch_in_a_fused_batch_and_in_broadcast(rank, size):
    if size == 1:
        return
    grads = [np.ones(10 + (rank == 0), dtype=np.float32)]
    with pytest.raises(ringlet.MismatchError):
        ringlet.average_gradients(grads)
    with pytest.raises(ringlet.MismatchError, match="broadcast"):
        ringlet.broadcast(np.zeros(4 + rank, dtype=np.uint8), 0)


def test_calls_from_several_threads_are_never_corrupted(comm, rank, size):
    """Two threads per rank reducing at once: each call either returns the right answer or
    raises MismatchError (the threads met their counterparts in a different order)."""
    outcomes: dict[int, list[str]] = {0: [], 1: []}

    def work(index: int) -> None:
        for i in range(20):
            x = np.full(257, float(index * 100 + i))
            try:
                y = ringlet.allreduce(x, "sum", algorithm="ring")
                outcomes[index].append("ok" if np.all(y == x[0] * size) else "WRONG")
            except ringlet.MismatchError:
                outcomes[index].append("mismatch")
                return  # out of step now; stop this thread

    threads = [threading.Thread(target=work, args=(i,)) for i in (0, 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not any(t.is_alive() for t in threads), "a thread hung"
    assert all(o != "WRONG" for results in outcomes.values() for o in results), outcomes
    # Realign every rank (a mismatch can leave ranks at different counts), then go on.
    _core.shutdown()
    ringlet.init()
    assert ringlet.allreduce(np.ones(3))[0] == size


def test_ringlet_and_mpi4py_collectives_interleave(comm, size):
    from mpi4py import MPI

    for i in range(50):
        ours = ringlet.allreduce(np.array([i], dtype=np.int64))[0]
        theirs = comm.allreduce(i, op=MPI.SUM)
        comm.Barrier()
        assert ours == theirs == i * size


def _resident_kib() -> int:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise AssertionError("no VmRSS")


def test_many_one_element_calls_do_not_leak(size):
    # A leak grows with the calls, not with the ranks: the full count where ranks have a core
    # each, fewer where they share (oversubscribed runs are slow, not leakier).
    calls = 100_000 if size <= 2 else 20_000
    x = np.ones(1, dtype=np.float32)
    for _ in range(calls // 10):  # warm up allocator and caches
        ringlet.allreduce(x)
    before = _resident_kib()
    for _ in range(calls):
        ringlet.allreduce(x, out=x, algorithm="ring")
        x[0] = 1.0
    for _ in range(calls // 10):
        ringlet.allreduce(x)  # out of place: a new array each time
    grown = _resident_kib() - before
    assert grown < 4096, f"resident memory grew by {grown} KiB over {calls} calls"


@settings(derandomize=True, database=None, deadline=None, max_examples=40)
@given(
    shape=st.lists(st.integers(0, 40), min_size=0, max_size=3).map(tuple),
    dtype=st.sampled_from(ALL_DTYPES),
    op=st.sampled_from(["sum", "avg", "min", "max", "prod"]),
    algorithm=st.sampled_from(["auto", *ringlet.ALGORITHMS]),
    seed=st.integers(0, 2**16),
)
def test_property_matches_numpy_for_any_shape_dtype_op_and_algorithm(
    comm, rank, size, shape, dtype, op, algorithm, seed
):
    # derandomize: every rank draws the same examples, so the collectives line up.
    if algorithm == "mpi" and dtype in ("float16", "bfloat16"):
        algorithm = "ring"
    inputs = [exact_input(seed, r, shape, dtype, op) for r in range(size)]
    result = ringlet.allreduce(inputs[rank], op, algorithm=algorithm)
    assert result.dtype == np_dtype(dtype) and result.shape == shape
    assert result.tobytes() == reference(inputs, op).tobytes()
    assert same_on_every_rank(comm, result)


def test_a_message_of_the_wrong_length_is_an_error_not_a_short_buffer(rank, size):
    """The transport checks every receive's byte count (MPI_Status): a test hook makes rank 0
    send rank 1 fewer, then more, bytes than it posted a receive for."""
    if size == 1:
        with pytest.raises(ValueError, match="at least 2 ranks"):
            _core._test_wrong_length_message(100, 200)
        return
    for sent, expected, message in [
        (100, 200, "expected a message of 200 bytes from rank 0, got 100"),
        (300, 200, "rank 0 sent a longer message than expected"),
    ]:
        if rank == 1:
            with pytest.raises(ringlet.RingletError, match=message):
                _core._test_wrong_length_message(sent, expected)
        else:
            _core._test_wrong_length_message(sent, expected)
        assert ringlet.allreduce(np.ones(2), "sum")[0] == size, "still in step"
