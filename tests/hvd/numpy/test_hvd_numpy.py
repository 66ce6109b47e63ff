"""ringlet.hvd (NumPy) against Horovod's documented semantics."""

from __future__ import annotations

import platform

import numpy as np
import pytest
from mpi4py import MPI

import ringlet
import ringlet.hvd as hvd

from mpi_fixtures import exact_input, reference

pytestmark = pytest.mark.usefixtures("hvd_initialized")  # tests/hvd/conftest.py


def test_process_queries_match_mpi(comm, rank, size):
    hvd.init()
    assert hvd.is_initialized() and (hvd.rank(), hvd.size()) == (rank, size)
    hosts = comm.allgather(platform.node())
    mine = [r for r, h in enumerate(hosts) if h == hosts[rank]]
    assert (hvd.local_rank(), hvd.local_size()) == (mine.index(rank), len(mine))
    assert hvd.cross_size() == len(set(hosts)) and 0 <= hvd.cross_rank() < hvd.cross_size()
    assert hvd.mpi_threads_supported() == (MPI.Query_thread() == MPI.THREAD_MULTIPLE)
    assert hvd.mpi_enabled() and hvd.mpi_built() and not hvd.gloo_enabled()


@pytest.mark.parametrize(("op", "name"), [(hvd.Average, "avg"), (hvd.Sum, "sum"),
                                          (hvd.Min, "min"), (hvd.Max, "max"),
                                          (hvd.Product, "prod")])
@pytest.mark.parametrize("dtype", ["float32", "float64", "int32", "int64", "bfloat16"])
def test_allreduce_ops(rank, size, op, name, dtype):
    inputs = [exact_input(5, r, (31, 2), dtype, name) for r in range(size)]
    result = hvd.allreduce(inputs[rank], op=op)
    assert result.tobytes() == reference(inputs, name).tobytes()
    assert result is not inputs[rank]


def test_average_is_the_default_and_truncates_integers(rank, size):
    x = np.array([rank * 10 + 1, -(rank * 10 + 1)], dtype=np.int64)
    total = sum(r * 10 + 1 for r in range(size))
    assert hvd.allreduce(x).tolist() == [total // size, -(total // size)]  # toward zero
    f = np.array([rank], dtype=np.float64)
    assert hvd.allreduce(f)[0] == pytest.approx((size - 1) / 2)
    assert hvd.allreduce(f, average=False)[0] == sum(range(size))
    with pytest.raises(ValueError, match="supersedes average"):
        hvd.allreduce(f, average=True, op=hvd.Sum)
    with pytest.raises(NotImplementedError, match="Adasum"):
        hvd.allreduce(f, op=hvd.Adasum)


@pytest.mark.parametrize("count", [3, 1000, 70_001])  # copied, and read where it is
def test_a_new_result_leaves_a_read_only_tensor_and_shares_no_memory_with_it(
        rank, size, count):
    inputs = [exact_input(5, r, (count,), "float32", "sum") for r in range(size)]
    mine = inputs[rank].copy()
    mine.flags.writeable = False
    fused = [mine, exact_input(6, rank, (count,), "int64", "sum")]
    results = [hvd.allreduce(mine, op=hvd.Sum, name="one"),
               hvd.grouped_allreduce(fused, op=hvd.Sum, name="two")[0],
               hvd.synchronize(hvd.allreduce_async(mine, op=hvd.Sum, name="three"))]
    for result in results:
        assert result.tobytes() == reference(inputs, "sum").tobytes()
        assert not np.shares_memory(result, mine)
    assert np.array_equal(mine, inputs[rank])


def test_in_place_async_grouped_and_scaled(rank, size):
    x = np.full(10, rank + 1.0)
    assert hvd.allreduce_(x, op=hvd.Sum) is x and np.all(x == size * (size + 1) / 2)
    y = np.full(10, float(rank))
    handle = hvd.allreduce_async(y, op=hvd.Max)
    assert isinstance(hvd.poll(handle), bool)
    assert np.all(hvd.synchronize(handle) == size - 1) and np.all(y == rank)
    z = np.full(4, 2.0)
    handle = hvd.allreduce_async_(z, op=hvd.Sum, prescale_factor=0.5, postscale_factor=3.0)
    assert hvd.synchronize(handle) is z and np.all(z == 3.0 * size)
    group = [np.full(3, 1.0), np.full(5, 2, dtype=np.int32)]
    out = hvd.grouped_allreduce(group, op=hvd.Sum)
    assert np.all(out[0] == size) and np.all(out[1] == 2 * size) and np.all(group[0] == 1)
    assert hvd.grouped_allreduce_(group, op=hvd.Sum)[0] is group[0]
    handle = hvd.grouped_allreduce_async([np.ones(2)], op=hvd.Sum)
    assert np.all(hvd.synchronize(handle)[0] == size)
    with pytest.raises(ValueError, match="handle"):
        hvd.synchronize(42)


@pytest.mark.parametrize("compression", [hvd.Compression.fp16, hvd.Compression.bf16])
def test_compressed_allreduce(rank, size, compression):
    x = np.full(100, 0.25 * (rank + 1), dtype=np.float32)
    result = hvd.allreduce(x, op=hvd.Sum, compression=compression)
    assert result.dtype == np.float32 and np.allclose(result, 0.25 * size * (size + 1) / 2)


def test_custom_compressor_runs_around_the_reduction(size):
    class Halve(hvd.Compressor):
        @staticmethod
        def compress(tensor):
            return tensor.astype(np.float64) / 2, "ctx"

        @staticmethod
        def decompress(tensor, ctx):
            assert ctx == "ctx"
            return (tensor * 2).astype(np.float32)

    result = hvd.allreduce(np.ones(3, dtype=np.float32), op=hvd.Sum, compression=Halve)
    assert result.dtype == np.float32 and np.all(result == size)


def test_allgather_with_a_different_first_dimension_on_each_rank(rank, size):
    mine = np.full((rank + 1, 3), rank, dtype=np.int32)
    gathered = hvd.allgather(mine)
    expected = np.concatenate([np.full((r + 1, 3), r, dtype=np.int32) for r in range(size)])
    assert np.array_equal(gathered, expected)
    empty = hvd.allgather(np.zeros((0 if rank % 2 else 2, 2)))
    assert empty.shape == (2 * ((size + 1) // 2), 2)


def test_allgather_mismatched_trailing_dims_fail_on_every_rank(rank, size):
    if size == 1:
        assert hvd.allgather(np.ones((2, 3))).shape == (2, 3)
        return
    # A cross-rank disagreement: MismatchError (a RuntimeError, as Horovod raises) on every
    # rank, naming what each rank passed.
    with pytest.raises(RuntimeError, match=r"float64\[2, 3\].*float64\[2, 4\]") as info:
        hvd.allgather(np.ones((2, 3 + (rank == size - 1))))
    assert isinstance(info.value, ringlet.MismatchError)
    with pytest.raises(ringlet.MismatchError, match=r"float32\[2, 3\].*float64\[2, 3\]"):
        hvd.allgather(np.ones((2, 3), dtype=np.float64 if rank == size - 1 else np.float32))
    assert hvd.allgather(np.full((rank, 2), rank)).shape == (size * (size - 1) // 2, 2)


def test_allgather_object_and_broadcast_object(rank, size):
    assert hvd.allgather_object({"rank": rank, "list": [rank] * rank}) == [
        {"rank": r, "list": [r] * r} for r in range(size)
    ]
    root = size - 1
    assert hvd.broadcast_object(("from", rank), root_rank=root) == ("from", root)


def test_broadcast_from_a_non_zero_root(rank, size):
    root = 1 if size > 1 else 0
    x = np.arange(12, dtype=np.float64).reshape(3, 4) + rank
    out = hvd.broadcast(x, root_rank=root)
    assert np.array_equal(out, np.arange(12).reshape(3, 4) + root)
    assert np.array_equal(x, np.arange(12).reshape(3, 4) + rank), "broadcast copies"
    assert hvd.broadcast_(x, root) is x and np.array_equal(x, out)
    strided = np.zeros((4, 4))[:, ::2]
    strided[:] = rank
    assert np.all(hvd.broadcast_(strided, root) == root), "non-contiguous in place"
    handle = hvd.broadcast_async(np.array([rank]), root)
    assert hvd.synchronize(handle)[0] == root
    with pytest.raises(ValueError, match=rf"root {size} is outside the {size} ranks"):
        hvd.broadcast(x, root_rank=size)


def test_broadcast_parameters_dict_and_pairs(rank, size):
    params = {"w": np.full(5, float(rank)), "b": np.full(2, rank, dtype=np.int64)}
    hvd.broadcast_parameters(params, root_rank=0)
    assert np.all(params["w"] == 0) and np.all(params["b"] == 0)
    pairs = [("a", np.full(3, float(rank)))]
    hvd.broadcast_parameters(pairs, root_rank=size - 1)
    assert np.all(pairs[0][1] == size - 1)


@pytest.mark.parametrize("rows", [1, 5, 8, 13])
def test_reducescatter_splits_the_first_dimension(rank, size, rows):
    inputs = [exact_input(rows, r, (rows, 3), "float32", "sum") for r in range(size)]
    total = reference(inputs, "sum")
    counts = [rows // size + (r < rows % size) for r in range(size)]
    start = sum(counts[:rank])
    mine = hvd.reducescatter(inputs[rank], op=hvd.Sum)
    assert np.array_equal(mine, total[start:start + counts[rank]])
    avg = hvd.reducescatter(inputs[rank])  # Average by default
    assert np.allclose(avg, total[start:start + counts[rank]] / size)
    with pytest.raises(ValueError, match="Sum and Average"):
        hvd.reducescatter(inputs[rank], op=hvd.Max)


def test_barrier_and_join(size):
    hvd.barrier()
    assert 0 <= hvd.join() < size


def test_init_rejects_what_it_does_not_support():
    with pytest.raises(ValueError, match="mpi4py communicator"):
        hvd.init(comm=[0, 1])
    with pytest.raises(ValueError, match=r"process_set must be an hvd\.ProcessSet"):
        hvd.allreduce(np.ones(2), process_set=type("PS", (), {"process_set_id": 3})())
    with pytest.raises(ValueError, match="has not been added"):
        hvd.allreduce(np.ones(2), process_set=hvd.ProcessSet([0]))


def test_compressors_cast_numpy_arrays_too():
    import ml_dtypes

    x = np.arange(6, dtype=np.float64)
    for compression, wire in ((hvd.Compression.fp16, np.float16),
                              (hvd.Compression.bf16, ml_dtypes.bfloat16)):
        compressed, ctx = compression.compress(x)
        assert compressed.dtype == np.dtype(wire)
        restored = compression.decompress(compressed, ctx)
        assert restored.dtype == np.float64 and np.array_equal(restored, x)
    ints, ctx = hvd.Compression.fp16.compress(np.arange(3))
    assert ints.dtype == np.arange(3).dtype


def test_build_information_is_honest():
    assert hvd.mpi_built() and hvd.mpi_enabled()
    for built in (hvd.gloo_built, hvd.gloo_enabled, hvd.nccl_built, hvd.ddl_built,
                  hvd.ccl_built, hvd.cuda_built, hvd.rocm_built):
        assert built() is False
    hosts = ringlet.topology().hosts
    assert hvd.is_homogeneous() == (len({hosts.count(h) for h in hosts}) == 1)


def test_the_async_and_grouped_gathers_and_scatters_match_the_synchronous_ones(rank, size):
    rows = rank + 1  # a different first dimension on every rank
    x = np.full((rows, 3), float(rank))
    handle = hvd.allgather_async(x)
    gathered = hvd.synchronize(handle)
    assert hvd.poll(handle)
    assert gathered.shape == (sum(range(1, size + 1)), 3)
    assert np.array_equal(gathered, hvd.allgather(x))
    both = hvd.synchronize(hvd.grouped_allgather_async([x, x[:, :1]]))
    assert np.array_equal(both[0], gathered) and np.array_equal(both[1], gathered[:, :1])
    assert all(np.array_equal(a, b)
               for a, b in zip(hvd.grouped_allgather([x, x[:, :1]]), both))
    y = np.arange(4 * size, dtype=np.float64).reshape(2 * size, 2) * (rank + 1)
    mine = hvd.synchronize(hvd.reducescatter_async(y, op=hvd.Sum))
    assert np.array_equal(mine, hvd.reducescatter(y, op=hvd.Sum))
    total = np.arange(4 * size, dtype=np.float64).reshape(2 * size, 2) * sum(
        range(1, size + 1))
    assert np.array_equal(mine, total[2 * rank:2 * rank + 2])
    pair = hvd.synchronize(hvd.grouped_reducescatter_async([y, y], op=hvd.Sum))
    assert all(np.array_equal(p, mine) for p in pair)
    assert all(np.array_equal(p, mine) for p in hvd.grouped_reducescatter([y, y], op=hvd.Sum))
