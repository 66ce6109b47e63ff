"""allreduce against a NumPy reference, every algorithm, dtype, op and shape, on N ranks."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from mpi4py import MPI

import ringlet

from mpi_fixtures import (
    ALL_DTYPES,
    NATIVE_MPI_DTYPES,
    exact_input,
    np_dtype,
    reference,
    same_on_every_rank,
)

ALGORITHMS = ("auto", *ringlet.ALGORITHMS)
OPS = ("sum", "avg", "min", "max", "prod")
SHAPES = ((), (0,), (1,), (7,), (3, 5), (1000,), (2, 3, 4, 5), (65537,))

GRID = [
    (algorithm, dtype, op)
    for algorithm, dtype, op in itertools.product(ALGORITHMS, ALL_DTYPES, OPS)
    if not (algorithm == "mpi" and dtype in ("float16", "bfloat16"))
]


@pytest.mark.parametrize(("algorithm", "dtype", "op"), GRID)
def test_matches_numpy_reference_on_every_rank(comm, rank, size, algorithm, dtype, op):
    for seed, shape in enumerate(SHAPES):
        inputs = [exact_input(seed, r, shape, dtype, op) for r in range(size)]
        x = inputs[rank].copy()
        result = ringlet.allreduce(x, op, algorithm=algorithm)
        expected = reference(inputs, op)
        assert result.dtype == x.dtype and result.shape == shape
        assert result.tobytes() == expected.tobytes(), (shape, result, expected)
        assert np.array_equal(x, inputs[rank]), "out-of-place must leave the input alone"
        assert same_on_every_rank(comm, result)


@pytest.mark.parametrize(("algorithm", "dtype"), sorted({(a, d) for a, d, _ in GRID}))
def test_in_place_reduces_the_array_itself(rank, size, algorithm, dtype):
    inputs = [exact_input(99, r, (37, 11), dtype, "sum") for r in range(size)]
    x = inputs[rank].copy()
    address = x.__array_interface__["data"][0]
    result = ringlet.allreduce(x, "sum", out=x, algorithm=algorithm)
    assert result is x and x.__array_interface__["data"][0] == address
    assert x.tobytes() == reference(inputs, "sum").tobytes()


@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_separate_out_array_receives_the_result(rank, size, algorithm):
    inputs = [exact_input(5, r, (300,), "float64", "max") for r in range(size)]
    x = inputs[rank].copy()
    out = np.empty_like(x)
    result = ringlet.allreduce(x, "max", out=out, algorithm=algorithm)
    assert result is out
    assert np.array_equal(out, reference(inputs, "max"))
    assert np.array_equal(x, inputs[rank])


@pytest.mark.parametrize("algorithm", ["auto", "shm", "ring", "mpi", "halving_doubling"])
@pytest.mark.parametrize("count", [3000, 700_000])  # shm: one-shot; two-shot over 3 segments
def test_out_of_place_reads_the_input_and_writes_every_byte_of_the_result(
        comm, rank, size, algorithm, count):
    inputs = [exact_input(21, r, (count,), "float32", "sum") for r in range(size)]
    x = inputs[rank].copy()
    x.flags.writeable = False  # only read: a framework's tensor
    out = np.full(count, np.nan, np.float32)
    result = ringlet.allreduce(x, "sum", out=out, algorithm=algorithm)
    assert result is out
    assert out.tobytes() == reference(inputs, "sum").tobytes()
    fresh = ringlet.allreduce(x, "avg", algorithm=algorithm)
    assert fresh is not x and fresh.tobytes() == reference(inputs, "avg").tobytes()
    assert np.array_equal(x, inputs[rank])
    assert same_on_every_rank(comm, fresh)


def test_an_out_that_overlaps_the_input_is_refused_on_every_rank(rank, size):
    buffer = np.arange(1001, dtype=np.float64)
    with pytest.raises(ValueError, match="overlaps"):
        ringlet.allreduce(buffer[:1000], "sum", out=buffer[1:])
    assert np.array_equal(buffer, np.arange(1001, dtype=np.float64))
    assert ringlet.allreduce(np.ones(3), "sum")[0] == size  # the ranks are still in step


@pytest.mark.parametrize(
    ("algorithm", "dtype"),
    [(a, d) for a, d in itertools.product(ALGORITHMS, ["float32", "bfloat16", "int64"])
     if (a, d) != ("mpi", "bfloat16")],
)
def test_non_contiguous_input_is_reduced_through_a_copy(rank, size, algorithm, dtype):
    inputs = [exact_input(11, r, (40, 30), dtype, "sum") for r in range(size)]
    views = [a[::3, 1::2].T for a in inputs]  # strided and transposed
    before = inputs[rank].copy()
    result = ringlet.allreduce(views[rank], "sum", algorithm=algorithm)
    assert result.flags.c_contiguous and result.shape == views[rank].shape
    assert result.tobytes() == reference([np.ascontiguousarray(v) for v in views], "sum").tobytes()
    assert np.array_equal(inputs[rank], before)


OWN_ALGORITHMS = [a for a in ringlet.ALGORITHMS if a != "mpi"]


@pytest.mark.parametrize("algorithm", OWN_ALGORITHMS)
@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
def test_inexact_sums_are_bit_identical_across_ranks_and_close_to_numpy(
    comm, rank, size, algorithm, dtype
):
    rng = np.random.default_rng([42, rank])
    x = rng.standard_normal(100_003).astype(np_dtype(dtype))
    inputs = comm.allgather(x)
    first = ringlet.allreduce(x, "sum", algorithm=algorithm)
    again = ringlet.allreduce(x, "sum", algorithm=algorithm)
    assert same_on_every_rank(comm, first)
    assert first.tobytes() == again.tobytes(), "the same input gives the same bits"
    truth = np.sum(np.stack([a.astype(np.float64) for a in inputs]), axis=0)
    # Each combine rounds once to the dtype: error grows with N ulps of the partial sums.
    tolerance = {"float32": 1e-5, "float16": 4e-3, "bfloat16": 3e-2}[dtype] * size
    assert np.allclose(first.astype(np.float64), truth, rtol=tolerance, atol=tolerance * 4)


@pytest.mark.parametrize("dtype", NATIVE_MPI_DTYPES)
@pytest.mark.parametrize("op", ["sum", "min", "max", "prod"])
def test_agrees_with_mpi4py_native_allreduce(comm, rank, size, dtype, op):
    inputs = [exact_input(7, r, (4099,), dtype, op) for r in range(size)]
    native = inputs[rank].copy()
    mpi_op = {"sum": MPI.SUM, "min": MPI.MIN, "max": MPI.MAX, "prod": MPI.PROD}[op]
    comm.Allreduce(MPI.IN_PLACE, native, op=mpi_op)
    for algorithm in ALGORITHMS:
        assert np.array_equal(ringlet.allreduce(inputs[rank], op, algorithm=algorithm), native)


def test_nan_and_inf_propagate_as_ieee(comm, rank, size):
    x = np.zeros(6, dtype=np.float32)
    if rank == size - 1:
        x[:] = [np.nan, np.inf, -np.inf, 1.0, np.nan, 0.0]
    for algorithm in ALGORITHMS:
        total = ringlet.allreduce(x, "sum", algorithm=algorithm)
        assert np.isnan(total[0]) and total[1] == np.inf and total[2] == -np.inf
        if algorithm == "mpi":
            continue  # MPI_MIN/MPI_MAX treat NaN as the MPI library does (order-dependent)
        # ringlet's own min/max propagate NaN from any rank, like numpy.minimum/maximum.
        assert np.isnan(ringlet.allreduce(x, "max", algorithm=algorithm)[4])
        assert np.isnan(ringlet.allreduce(x, "min", algorithm=algorithm)[0])


def test_integer_sum_wraps_on_overflow(size):
    x = np.full(5, np.iinfo(np.int32).max, dtype=np.int32)
    expected = (np.int64(np.iinfo(np.int32).max) * size + 2**31) % 2**32 - 2**31
    for algorithm in ALGORITHMS:
        assert (ringlet.allreduce(x, "sum", algorithm=algorithm) == expected).all()


@pytest.mark.parametrize("segment_bytes", [4, 1000, 4096])
def test_pipelined_ring_with_small_segments(rank, size, segment_bytes):
    default = ringlet.settings()["segment_bytes"]
    assert ringlet.settings(segment_bytes=segment_bytes)["segment_bytes"] == segment_bytes
    try:
        for dtype in ["float32", "float16", "int64"]:
            inputs = [exact_input(8, r, (2053,), dtype, "sum") for r in range(size)]
            result = ringlet.allreduce(inputs[rank], "sum", algorithm="pipelined_ring")
            assert result.tobytes() == reference(inputs, "sum").tobytes()
    finally:
        ringlet.settings(segment_bytes=default)


@pytest.mark.parametrize("algorithm", ringlet.ALGORITHMS)
def test_long_messages_are_split_at_the_limit(rank, size, algorithm):
    """The path of arrays over 2^31 elements, through a lowered message limit."""
    inputs = [exact_input(3, r, (10_007,), "float64", "sum") for r in range(size)]
    assert ringlet.settings(max_message_bytes=1000)["max_message_bytes"] == 1000
    try:
        result = ringlet.allreduce(inputs[rank], "sum", algorithm=algorithm)
    finally:
        ringlet.settings(max_message_bytes=2**31 - 1)
    assert result.tobytes() == reference(inputs, "sum").tobytes()


@pytest.mark.parametrize("bad", [0, -1, 2**31, 1.5, True, "whole", "32K"])
def test_across_message_bytes_accepts_a_positive_int_or_auto(bad):
    before = ringlet.settings()
    with pytest.raises(ValueError, match="across_message_bytes must be an int from 1 to "
                                         r"2\*\*31 - 1 or 'auto'"):
        ringlet.settings(across_message_bytes=bad)
    assert ringlet.settings() == before


def test_across_message_bytes_is_the_users_until_set_back_to_auto(rank, size):
    assert ringlet.settings()["across_message_bytes_auto"] is True
    chosen = ringlet.settings(across_message_bytes=4096)
    try:
        assert chosen["across_message_bytes"] == 4096
        assert chosen["across_message_bytes_auto"] is False
        # A calibration (collective) installs its own choice, which must not replace the user's.
        ringlet.calibrate()
        assert ringlet.settings()["across_message_bytes"] == 4096
        inputs = [exact_input(5, r, (3001,), "float32", "sum") for r in range(size)]
        result = ringlet.allreduce(inputs[rank], "sum")
        assert result.tobytes() == reference(inputs, "sum").tobytes()
    finally:
        back = ringlet.settings(across_message_bytes="auto")
    assert back["across_message_bytes_auto"] is True
    # On one node calibration keeps whole messages: there is nothing between nodes to cut.
    assert back["across_message_bytes"] == 2**31 - 1


def test_a_settings_change_waits_for_the_collectives_already_queued(rank, size):
    """Queued calls run with the settings they were called under, on every rank: here the ranks
    change the settings at different moments (the last one 50 ms late), while their background
    threads are at different calls of the queue; had the change applied at once, the calls
    still queued on the prompt ranks would carry other settings than the late rank's."""
    import time

    inputs = [exact_input(9, r, (1 << 16,), "float32", "sum") for r in range(size)]
    default = ringlet.settings()["segment_bytes"]
    handles = [ringlet.allreduce_async(inputs[rank], algorithm="pipelined_ring")
               for _ in range(12)]
    if rank == size - 1:
        time.sleep(0.05)
    try:
        ringlet.settings(segment_bytes=4096)
        results = [h.wait() for h in handles]
        after = ringlet.allreduce(inputs[rank], algorithm="pipelined_ring")
    finally:
        ringlet.settings(segment_bytes=default)
    for result in [*results, after]:
        assert result.tobytes() == reference(inputs, "sum").tobytes()
