"""broadcast, allgather, reduce_scatter and their object forms (under mpirun; reduce has its
own file): results against NumPy, bit-identical on every rank, inputs untouched, and clear
errors on bad input."""

from __future__ import annotations

import numpy as np
import pytest

import ringlet

from mpi_fixtures import (
    ALL_DTYPES,
    exact_input,
    np_dtype,
    python_progress_during,
    reference,
    same_on_every_rank,
)

MOVABLE = (*ALL_DTYPES, "bool", "uint8", "int16", "complex64", ">f8")


def movable_input(seed: int, rank: int, shape: tuple[int, ...], dtype: str) -> np.ndarray:
    rng = np.random.default_rng([seed, rank])
    values = rng.integers(-50, 50, size=shape)
    if dtype == "bool":
        return values > 0
    return values.astype(np_dtype(dtype) if dtype in ALL_DTYPES else np.dtype(dtype))


@pytest.mark.parametrize("algorithm", ["auto", "binomial", "scatter_allgather", "two_tier"])
@pytest.mark.parametrize("dtype", MOVABLE)
def test_broadcast_gives_every_rank_the_roots_array(comm, rank, size, dtype, algorithm):
    assert set(ringlet.algorithms("broadcast")) == {"binomial", "scatter_allgather", "two_tier"}
    for root in sorted({0, size // 2, size - 1}):
        x = movable_input(1, rank, (5, 3), dtype)
        before = x.copy()
        result = ringlet.broadcast(x, root, algorithm=algorithm)
        expected = movable_input(1, root, (5, 3), dtype)
        assert result.dtype == expected.dtype.newbyteorder("=") and result.shape == (5, 3)
        assert np.array_equal(result, expected)
        assert np.array_equal(x, before) and x.dtype == before.dtype, "the input is untouched"
        assert same_on_every_rank(comm, result)


def test_structured_dtypes_move_as_they_are(rank, size):
    record = np.dtype([("id", "<i4"), ("score", "<f8"), ("tag", "S3")])
    x = np.zeros(3, dtype=record)
    x["id"], x["score"], x["tag"] = rank, rank / 2, b"r%d" % rank
    root = size - 1
    result = ringlet.broadcast(x, root)
    assert result.dtype == record and list(result["id"]) == [root] * 3
    assert list(result["tag"]) == [b"r%d" % root] * 3
    gathered = ringlet.allgather(x)
    assert list(gathered["id"]) == [r for r in range(size) for _ in range(3)]


def test_long_broadcasts_and_allgathers_of_every_algorithm(rank, size):
    """A few MiB, where auto prefers the bandwidth-bound algorithms, and uneven block sizes."""
    x = np.arange(1 << 20, dtype=np.float32) + rank
    for algorithm in ("auto", "binomial", "scatter_allgather", "two_tier"):
        root = (size - 1) // 2
        assert np.array_equal(ringlet.broadcast(x, root, algorithm=algorithm),
                              np.arange(1 << 20, dtype=np.float32) + root), algorithm
    rows = np.full((1000 * (rank + 1) + 7, 3), rank, dtype=np.int16)
    expected = np.concatenate([np.full((1000 * (r + 1) + 7, 3), r, dtype=np.int16)
                               for r in range(size)])
    for algorithm in ("auto", "ring", "recursive_doubling", "two_tier"):
        assert np.array_equal(ringlet.allgather(rows, algorithm=algorithm), expected), algorithm


def test_broadcast_in_place_into_out_and_of_views(rank, size):
    root = size - 1
    x = np.full(7, float(rank))
    assert ringlet.broadcast(x, root, out=x) is x and np.all(x == root)
    out = np.empty(7)
    assert ringlet.broadcast(np.full(7, rank, dtype=np.float64), root, out=out) is out
    assert np.all(out == root)
    strided = np.arange(20, dtype=np.int32)[::2] + rank
    assert np.array_equal(ringlet.broadcast(strided, root), np.arange(20)[::2] + root)
    scalar = ringlet.broadcast(np.float32(rank), root)
    assert scalar.shape == () and scalar == root
    empty = ringlet.broadcast(np.zeros((0, 3)), root)
    assert empty.shape == (0, 3)


def test_broadcast_async_runs_in_order_and_returns_the_result(rank, size):
    x = np.full(1000, rank, dtype=np.int64)
    handle = ringlet.broadcast_async(x, size - 1)
    total = ringlet.allreduce_async(np.ones(10), "sum")
    assert np.all(handle.wait() == size - 1) and handle.done()
    assert np.all(total.wait() == size)


@pytest.mark.parametrize("algorithm", ["auto", "ring", "recursive_doubling", "two_tier"])
@pytest.mark.parametrize("dtype", MOVABLE)
def test_allgather_concatenates_in_rank_order(comm, rank, size, dtype, algorithm):
    assert set(ringlet.algorithms("allgather")) == {"ring", "recursive_doubling", "two_tier"}
    # Rank r contributes r + 1 rows (the first dimension may differ).
    x = movable_input(2, rank, (rank + 1, 2, 3), dtype)
    x.flags.writeable = False  # allgather only reads
    result = ringlet.allgather(x, algorithm=algorithm)
    expected = np.concatenate([movable_input(2, r, (r + 1, 2, 3), dtype) for r in range(size)])
    assert result.shape == expected.shape and np.array_equal(result, expected)
    assert same_on_every_rank(comm, result)


def test_allgather_of_scalars_empty_parts_and_views(rank, size):
    assert np.array_equal(ringlet.allgather(np.int64(rank)), np.arange(size))
    rows = 0 if rank % 2 else 2
    result = ringlet.allgather(np.full((rows, 4), rank, dtype=np.float32))
    expected = np.concatenate([np.full((0 if r % 2 else 2, 4), r) for r in range(size)])
    assert np.array_equal(result, expected)
    view = np.arange(40, dtype=np.float64).reshape(10, 4)[::3, 1:]
    assert np.array_equal(ringlet.allgather(view), np.concatenate([view] * size))


def test_object_collectives(rank, size):
    root = size - 1
    assert ringlet.broadcast_object({"rank": rank, "data": [rank] * 3}, root) == {
        "rank": root, "data": [root] * 3}
    assert ringlet.allgather_object(("r", rank, "x" * rank)) == [
        ("r", r, "x" * r) for r in range(size)]


@pytest.mark.parametrize("algorithm", ["auto", "ring", "recursive_halving", "priority_halving"])
@pytest.mark.parametrize("dtype", ALL_DTYPES)
@pytest.mark.parametrize("op", ["sum", "avg", "min", "max", "prod"])
def test_reduce_scatter_gives_each_rank_its_block_of_the_reduction(comm, rank, size, dtype, op,
                                                                   algorithm):
    assert set(ringlet.algorithms("reduce_scatter")) == {"ring", "recursive_halving",
                                                         "priority_halving"}
    rows = 2 * size + 1
    inputs = [exact_input(3, r, (rows, 3), dtype, op) for r in range(size)]
    before = inputs[rank].copy()
    mine = ringlet.reduce_scatter(inputs[rank], op, algorithm=algorithm)
    blocks = np.array_split(reference(inputs, op), size)
    assert mine.dtype == np_dtype(dtype)
    assert mine.tobytes() == blocks[rank].tobytes() and mine.shape == blocks[rank].shape
    assert np.array_equal(inputs[rank], before), "the input is untouched"
    everyone = comm.allgather(mine.tobytes())
    assert b"".join(everyone) == reference(inputs, op).tobytes()


def test_reduce_scatter_with_counts(rank, size):
    counts = [0] * size
    counts[-1] = 4  # everything to the last rank
    x = np.arange(8, dtype=np.int64).reshape(4, 2) * (rank + 1)
    mine = ringlet.reduce_scatter(x, "sum", counts=counts)
    factor = size * (size + 1) // 2
    if rank == size - 1:
        assert np.array_equal(mine, np.arange(8).reshape(4, 2) * factor)
    else:
        assert mine.shape == (0, 2)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "int64"])
def test_async_allgather_and_reduce_scatter_equal_the_synchronous_ones(rank, size, dtype):
    """Queued behind a large allreduce, they run in submission order after it, and give what
    the synchronous ones give."""
    x = movable_input(4, rank, (rank + 1, 3), dtype)
    big = ringlet.allreduce_async(np.ones(1 << 22, dtype=np.float32))
    gathered = ringlet.allgather_async(x)
    inputs = [exact_input(5, r, (2 * size + 1, 2), dtype, "sum") for r in range(size)]
    block = ringlet.reduce_scatter_async(inputs[rank], "sum")
    counts = [0] * size
    counts[-1] = 2 * size + 1
    everything = ringlet.reduce_scatter_async(inputs[rank], "sum", counts=counts)
    assert np.array_equal(big.wait(), np.full(1 << 22, size, dtype=np.float32))
    expected = np.concatenate([movable_input(4, r, (r + 1, 3), dtype) for r in range(size)])
    assert np.array_equal(gathered.wait(), expected) and gathered.wait().dtype == x.dtype
    assert gathered.done() and gathered.timing() is not None
    mine = np.array_split(reference(inputs, "sum"), size)[rank]
    assert block.wait().tobytes() == mine.tobytes() and block.wait().shape == mine.shape
    got = everything.wait()
    assert got.shape == ((2 * size + 1, 2) if rank == size - 1 else (0, 2))
    if rank == size - 1:
        assert got.tobytes() == reference(inputs, "sum").tobytes()


def test_async_gathers_refuse_bad_calls_in_step(rank, size):
    """A bad call on one rank raises there and MismatchError on the others, at submission or
    at wait(), and the ranks stay in step."""
    odd = rank == size - 1
    counts = [1] * (size + 1) if odd else [1] * size
    x = np.ones((size, 2), dtype=np.float32) if not odd else np.ones((size + 1, 2), np.float32)
    if size == 1:
        with pytest.raises(ValueError):
            ringlet.reduce_scatter_async(x, "sum", counts=counts).wait()
    else:
        error = ValueError if odd else ringlet.MismatchError
        with pytest.raises(error):
            ringlet.reduce_scatter_async(x, "sum", counts=counts).wait()
    assert ringlet.allreduce(np.ones(1), "sum")[0] == size


def test_collectives_release_the_gil(size):
    """Another Python thread keeps running during long broadcasts, allgathers, alltoalls and
    reduce-scatters."""
    x = np.ones(16 << 20, dtype=np.float32)
    ringlet.broadcast(x, 0, out=x)  # warm up

    def work() -> None:
        ringlet.broadcast(x, 0, out=x)
        ringlet.allgather(x[: 4 << 20])
        ringlet.alltoall(x[: x.size // size * size].reshape(size, -1))
        ringlet.reduce_scatter(x.reshape(-1, 64))

    during, elapsed = python_progress_during(work)
    if size > 1 and elapsed > 0.005:
        assert during > 0, f"no Python progress during {elapsed * 1e3:.1f} ms of collectives"


def test_bad_input_is_refused_clearly_and_nothing_changes(rank, size):
    x = np.arange(4.0)
    with pytest.raises(TypeError, match=r"broadcast takes a numpy.ndarray"):
        ringlet.broadcast([1.0, 2.0])  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"holds Python objects"):
        ringlet.broadcast(np.array([object()]))
    with pytest.raises(ValueError, match=rf"root {size} is outside the {size} ranks"):
        ringlet.broadcast(x, size)
    with pytest.raises(ValueError, match=r"root -1 is outside"):
        ringlet.broadcast(x, -1)
    with pytest.raises(TypeError, match=r"root must be a rank"):
        ringlet.broadcast(x, 0.5)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"unknown algorithm 'tree'; accepted: 'auto', 'binomial'"):
        ringlet.broadcast(x, algorithm="tree")
    out = np.zeros(5)
    with pytest.raises(ValueError, match=r"out must have x's dtype and shape"):
        ringlet.broadcast(x, out=out)
    assert np.all(out == 0) and np.array_equal(x, np.arange(4.0))
    with pytest.raises(TypeError, match=r"ringlet cannot reduce dtype bool"):
        ringlet.reduce_scatter(np.zeros(size, dtype=bool))
    with pytest.raises(ValueError, match=r"unknown op"):
        ringlet.reduce_scatter(np.zeros(size), "mean")
    with pytest.raises(ValueError, match=r"at least one dimension"):
        ringlet.reduce_scatter(np.float64(1.0))
    with pytest.raises(ValueError, match=r"counts must give the rows of each of the"):
        ringlet.reduce_scatter(np.zeros((size, 2)), counts=[size + 1] + [0] * (size - 1))
    with pytest.raises(ValueError, match=r"must not be negative"):
        ringlet.reduce_scatter(np.zeros((size, 2)), counts=[-1] + [1] * size)
    with pytest.raises(TypeError, match=r"allgather takes a numpy.ndarray"):
        ringlet.allgather("text")  # type: ignore[arg-type]
    # After all of that, the ranks are still in step.
    assert ringlet.allreduce(np.ones(3), "sum")[0] == size


# ---- alltoall -----------------------------------------------------------------------------------


def _splits(sender: int, size: int) -> list[int]:
    """Rows ``sender`` sends each rank: 0 to 3, different per pair."""
    return [(sender * 5 + q * 3) % 4 for q in range(size)]


@pytest.mark.parametrize("dtype", MOVABLE)
def test_alltoall_sends_each_rank_its_rows(comm, rank, size, dtype):
    inputs = [movable_input(70, r, (sum(_splits(r, size)), 3), dtype) for r in range(size)]
    before = inputs[rank].copy()
    received, counts = ringlet.alltoall(inputs[rank], _splits(rank, size))
    assert counts == [_splits(r, size)[rank] for r in range(size)]
    expected = []
    for r in range(size):
        start = sum(_splits(r, size)[:rank])
        expected.append(inputs[r][start:start + _splits(r, size)[rank]])
    expected = np.concatenate(expected)
    assert received.dtype == expected.dtype and received.shape == expected.shape
    assert received.tobytes() == expected.tobytes()
    assert inputs[rank].tobytes() == before.tobytes()


def test_alltoall_splits_equally_by_default_and_refuses_bad_splits_in_step(rank, size):
    x = np.arange(2 * size * 2).reshape(2 * size, 2) + 100 * rank
    received, counts = ringlet.alltoall(x)
    assert counts == [2] * size
    assert np.array_equal(received, np.concatenate(
        [np.arange(2 * size * 2).reshape(2 * size, 2)[2 * rank:2 * rank + 2] + 100 * r
         for r in range(size)]))
    bad = [1] * size if rank == 0 else [2] * size  # rank 0's do not add up to 2N rows
    if size == 1:
        bad = [3]
    with pytest.raises((ValueError, ringlet.MismatchError)) as caught:
        ringlet.alltoall(x, bad)
    if rank == 0 or size == 1:
        assert caught.type is ValueError and "adding up to" in str(caught.value)
    else:
        assert caught.type is ringlet.MismatchError and "refused" in str(caught.value)
    if size > 1:
        with pytest.raises(ValueError, match="divides the first dimension"):
            ringlet.alltoall(np.zeros(2 * size + 1))
    assert ringlet.allreduce(np.ones(3), "sum").tolist() == [size] * 3  # still in step
    assert "pairwise" in ringlet.algorithms("alltoall")
