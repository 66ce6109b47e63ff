"""ringlet.reduce (under mpirun): every algorithm against NumPy at every root, dtype and op,
the result on the root only, inputs untouched, ``out``, process sets, and bad calls refused on
every rank in step."""

from __future__ import annotations

import numpy as np
import pytest

import ringlet

from mpi_fixtures import ALL_DTYPES, exact_input, np_dtype, reference

OPS = ("sum", "avg", "min", "max", "prod")


def roots(size: int) -> list[int]:
    return sorted({0, size // 2, size - 1})


@pytest.mark.parametrize("dtype", ALL_DTYPES)
@pytest.mark.parametrize("op", OPS)
def test_every_algorithm_delivers_the_reduction_to_the_root_only(rank, size, dtype, op):
    algorithms = ("auto", *ringlet.algorithms("reduce", dtype, op))
    assert {"binomial", "k_chain", "reduce_scatter_gather"} <= set(algorithms)
    inputs = [exact_input(5, r, (3, 2 * size + 1), dtype, op) for r in range(size)]
    expected = reference(inputs, op)
    for algorithm in algorithms:
        for root in roots(size):
            before = inputs[rank].copy()
            result = ringlet.reduce(inputs[rank], root, op, algorithm=algorithm)
            assert np.array_equal(inputs[rank], before), f"{algorithm}: the input changed"
            if rank != root:
                assert result is None, algorithm
                continue
            assert result is not None and result.dtype == np_dtype(dtype), algorithm
            assert result.shape == expected.shape
            assert result.tobytes() == expected.tobytes(), f"{algorithm} root={root}"


@pytest.mark.parametrize("nbytes", [0, 4, 4096, 1 << 20])
def test_sizes_from_empty_to_a_mebibyte(rank, size, nbytes):
    count = nbytes // 4
    x = (np.arange(count, dtype=np.float32) % 97) * (rank + 1)
    expected = (np.arange(count, dtype=np.float32) % 97) * (size * (size + 1) // 2)
    for algorithm in ("auto", "binomial", "k_chain", "reduce_scatter_gather", "mpi"):
        result = ringlet.reduce(x, size - 1, algorithm=algorithm)
        if rank == size - 1:
            assert result is not None and np.array_equal(result, expected), algorithm
        else:
            assert result is None


def test_out_on_the_root_and_in_place(rank, size):
    x = np.full((4, 3), rank + 1, dtype=np.int64)
    total = size * (size + 1) // 2
    out = np.zeros_like(x)
    result = ringlet.reduce(x, 0, out=out)
    if rank == 0:
        assert result is out and np.all(out == total)
    else:
        assert result is None and np.all(out == 0), "the other ranks ignore out"
    # out=x: the root's input becomes the result.
    result = ringlet.reduce(x, 0, "max", out=x)
    if rank == 0:
        assert result is x and np.all(x == size)
    else:
        assert np.all(x == rank + 1)


def test_out_that_the_core_cannot_write_directly(rank, size):
    x = np.arange(12, dtype=np.int32).reshape(3, 4) * (rank + 1)
    total = size * (size + 1) // 2
    # A strided out (the root reduces into a new array and copies), and a view of all of x
    # (in place).
    strided = np.zeros((3, 8), dtype=np.int32)[:, ::2]
    result = ringlet.reduce(x, 0, out=strided)
    if rank == 0:
        assert result is strided
        assert np.array_equal(strided, np.arange(12).reshape(3, 4) * total)
    mine = x.copy()
    result = ringlet.reduce(mine, 0, out=mine[...])
    if rank == 0:
        assert np.array_equal(mine, np.arange(12).reshape(3, 4) * total)
    else:
        assert result is None and np.array_equal(mine, x)
    with pytest.raises((ValueError, ringlet.MismatchError), match=r"overlaps|refused"):
        ringlet.reduce(mine, 0, out=mine[::-1])
    assert ringlet.allreduce(np.ones(1), "sum")[0] == size


def test_scalars_and_empty_arrays_keep_their_shape(rank, size):
    result = ringlet.reduce(np.float32(rank + 1), size - 1)
    if rank == size - 1:
        assert result is not None and result.shape == () and result == size * (size + 1) / 2
    empty = ringlet.reduce(np.zeros((0, 3), dtype=np.int64), 0)
    if rank == 0:
        assert empty is not None and empty.shape == (0, 3)


def test_non_contiguous_and_foreign_byte_order_inputs(rank, size):
    base = np.arange(24, dtype=">f8").reshape(4, 6) + rank
    view = base[:, ::2]
    result = ringlet.reduce(view, 0)
    if rank == 0:
        expected = sum(np.arange(24, dtype=np.float64).reshape(4, 6)[:, ::2] + r
                       for r in range(size))
        assert result is not None and np.array_equal(result, expected)
        assert result.shape == (4, 3)


def test_over_a_process_set(rank, size):
    evens = ringlet.add_process_set(range(0, size, 2))
    try:
        if rank % 2 == 0:
            root = max(range(0, size, 2))  # a rank of ringlet's communicator
            result = ringlet.reduce(np.array([rank], dtype=np.int32), root, process_set=evens)
            if rank == root:
                assert result is not None and result.tolist() == [sum(range(0, size, 2))]
            else:
                assert result is None
    finally:
        assert ringlet.remove_process_set(evens)
    assert ringlet.allreduce(np.ones(2), "sum")[0] == size


def test_bad_calls_are_refused_on_every_rank_and_leave_them_in_step(rank, size):
    x = np.arange(6, dtype=np.float32)
    with pytest.raises(ValueError, match=rf"root {size} is outside the {size} ranks"):
        ringlet.reduce(x, size)
    with pytest.raises(ValueError, match=r"unknown algorithm 'chain'; accepted: 'auto', "
                                         r"'binomial', 'k_chain'"):
        ringlet.reduce(x, algorithm="chain")
    with pytest.raises(ValueError, match=r"unknown op"):
        ringlet.reduce(x, 0, "mean")
    with pytest.raises(TypeError, match=r"ringlet cannot reduce dtype bool"):
        ringlet.reduce(np.zeros(3, dtype=bool))
    with pytest.raises(ValueError, match=r"cannot reduce float16"):
        ringlet.reduce(x.astype(np.float16), algorithm="mpi")
    # A bad out on the root only: it raises ValueError, the others MismatchError.
    bad_out = np.zeros(5, dtype=np.float32)
    with pytest.raises((ValueError, ringlet.MismatchError)) as caught:
        ringlet.reduce(x, 0, out=bad_out)
    if rank == 0:
        assert caught.type is ValueError and "out must have x's dtype and shape" in str(
            caught.value)
        assert np.all(bad_out == 0)
    else:
        assert caught.type is ringlet.MismatchError and "refused" in str(caught.value)
    # Different shapes on different ranks: MismatchError everywhere, before any data moves.
    if size > 1:
        mine = np.ones(3 + (rank == 1), dtype=np.float32)
        with pytest.raises(ringlet.MismatchError, match="reduce"):
            ringlet.reduce(mine, 0)
        assert np.all(mine == 1)
    assert np.array_equal(x, np.arange(6, dtype=np.float32))
    assert ringlet.allreduce(np.ones(3), "sum").tolist() == [size] * 3  # still in step
