"""average_gradients, allreduce_async and compression against NumPy references."""

from __future__ import annotations

import numpy as np
import pytest

import ringlet

from conftest import ALL_DTYPES, exact_input, np_dtype, reference, same_on_every_rank

SHAPES = [(3,), (100, 7), (0,), (1,), (5000,), (2, 3, 4)]


@pytest.mark.parametrize("dtype", ALL_DTYPES)
def test_average_is_the_mean_over_ranks(rank, size, dtype):
    inputs = [[exact_input(i, r, shape, dtype, "avg") for i, shape in enumerate(SHAPES)]
              for r in range(size)]
    mine = [a.copy() for a in inputs[rank]]
    ringlet.average_gradients(mine)
    for i, array in enumerate(mine):
        expected = reference([inputs[r][i] for r in range(size)], "avg")
        assert array.tobytes() == expected.tobytes(), (dtype, SHAPES[i])


@pytest.mark.parametrize("op", ["sum", "avg", "max"])
def test_fused_and_unfused_give_identical_results(comm, rank, size, op):
    shapes = [(1,), (513,), (64, 3), (10,), (70_000,)]
    base = [exact_input(40 + i, rank, s, "float32", op) for i, s in enumerate(shapes)]
    fused = [a.copy() for a in base]
    unfused = [a.copy() for a in base]
    ringlet.average_gradients(fused, op=op)  # one 64 MiB buffer holds them all
    ringlet.average_gradients(unfused, op=op, fusion_threshold=0)  # one call each
    tiny = [a.copy() for a in base]
    ringlet.average_gradients(tiny, op=op, fusion_threshold=2048)  # several buffers
    for a, b, c in zip(fused, unfused, tiny):
        assert a.tobytes() == b.tobytes() == c.tobytes()
        assert same_on_every_rank(comm, a)


def test_fusion_runs_one_collective_per_buffer(size):
    arrays = [np.ones(256, dtype=np.float32) for _ in range(8)]  # 1 KiB each
    ringlet.reset_stats()
    ringlet.average_gradients(arrays, fusion_threshold=4096, algorithm="ring")
    assert ringlet.stats()["ring"]["calls"] == 2  # 4 KiB + 4 KiB
    ringlet.reset_stats()
    ringlet.average_gradients(arrays, fusion_threshold=0, algorithm="ring")
    assert ringlet.stats()["ring"]["calls"] == 8


def test_fusion_threshold_comes_from_the_environment(monkeypatch, size):
    monkeypatch.setenv("RINGLET_FUSION_THRESHOLD", "2048")
    arrays = [np.ones(256, dtype=np.float32) for _ in range(4)]
    ringlet.reset_stats()
    ringlet.average_gradients(arrays, algorithm="ring")
    assert ringlet.stats()["ring"]["calls"] == 2


def test_mixed_dtypes_in_one_call(rank, size):
    inputs = {d: [exact_input(7, r, (33,), d, "sum") for r in range(size)]
              for d in ("float64", "int32", "bfloat16", "float32")}
    mine = [inputs[d][rank].copy() for d in inputs]
    ringlet.average_gradients(mine, op="sum")
    for array, d in zip(mine, inputs):
        assert array.tobytes() == reference(inputs[d], "sum").tobytes()


def test_prescale_and_postscale(rank, size):
    x = np.full(1000, rank + 1.0, dtype=np.float64)
    ringlet.average_gradients([x], prescale=0.5, postscale=3.0)
    mean = sum(range(1, size + 1)) / size
    assert np.allclose(x, 3.0 * 0.5 * mean, rtol=1e-15)


@pytest.mark.parametrize(
    ("compression", "unit", "spacing"),
    [("fp16", 2.0**-11, 2.0**-24), ("bf16", 2.0**-8, 2.0**-133)],
)
@pytest.mark.parametrize("op", ["sum", "avg"])
def test_compression_error_stays_within_its_bound(
    comm, rank, size, compression, unit, spacing, op
):
    rng = np.random.default_rng([3, rank])
    x = rng.uniform(-1, 1, 50_000).astype(np.float32)
    everyone = comm.allgather(x)
    exact = np.sum([a.astype(np.float64) for a in everyone], axis=0)
    magnitude = np.sum([np.abs(a.astype(np.float64)) for a in everyone], axis=0)
    if op == "avg":
        exact, magnitude = exact / size, magnitude / size
    ringlet.average_gradients([x], op=op, compression=compression)
    assert x.dtype == np.float32 and same_on_every_rank(comm, x)
    # One rounding casting each input, one per combine (N-1), one casting back: relative to
    # the sum of magnitudes, at most (N + 1) units in the last place of the 16-bit format,
    # plus half a subnormal spacing per rounding near zero.
    bound = (size + 1) * (unit * magnitude + spacing / 2)
    assert np.all(np.abs(x - exact) <= bound), np.max(np.abs(x - exact) / bound)
    if size > 1:
        assert not np.array_equal(x, exact.astype(np.float32)), "it really went through 16 bits"


def test_compression_leaves_integers_exact(rank, size):
    inputs = [exact_input(2, r, (100,), "int64", "sum") for r in range(size)]
    x = inputs[rank].copy()
    ringlet.average_gradients([x], op="sum", compression="fp16")
    assert np.array_equal(x, reference(inputs, "sum"))


def test_async_operations_complete_in_submission_order(rank, size):
    arrays = [np.full(n, rank + i, dtype=np.float64) for i, n in enumerate([1 << 20, 10, 5000, 1])]
    handles = [ringlet.allreduce_async(a, "sum") for a in arrays]
    last = handles[-1].wait()
    assert all(h.done() for h in handles), "everything before the last is done when it is"
    results = [h.wait() for h in reversed(handles)][::-1]
    results[-1] = last
    for i, (result, array) in enumerate(zip(results, arrays)):
        assert np.all(result == sum(r + i for r in range(size)))
        assert np.all(array == rank + i), "out of place: the input is unchanged"


def test_async_in_place_and_python_keeps_running(rank, size):
    x = np.ones(8 << 20, dtype=np.float32)  # 32 MiB: long enough to see the caller run on
    handle = ringlet.allreduce_async(x, "sum", out=x)
    polls = 0
    while not handle.done():
        polls += 1
    assert handle.wait() is x and np.all(x == size)
    if size > 1:
        assert polls > 0, "the caller ran while the allreduce was in flight"


def test_handle_keeps_its_data_alive_when_dropped(rank, size):
    import gc
    import weakref

    x = np.full(1 << 20, 2.0, dtype=np.float64)
    watcher = weakref.ref(x)
    handle = ringlet.allreduce_async(x, "sum", out=x)
    del x
    gc.collect()
    assert watcher() is not None, "the queued job holds the array"
    del handle
    ringlet.barrier()  # runs after the queued allreduce: it has finished by now
    gc.collect()
    y = ringlet.allreduce(np.ones(3), "sum")
    assert np.all(y == size)


def test_bad_arguments_are_clear_errors():
    good = np.ones(4, dtype=np.float32)
    with pytest.raises(ValueError, match=r"in place and needs C-contiguous"):
        ringlet.average_gradients([good, np.ones(8)[::2]])
    with pytest.raises(TypeError, match=r"supported dtypes"):
        ringlet.average_gradients([np.ones(3, dtype=np.complex64)])
    with pytest.raises(ValueError, match=r"overlap"):
        ringlet.average_gradients([good, good])
    with pytest.raises(ValueError, match=r"unknown compression"):
        ringlet.average_gradients([good], compression="zip")
    with pytest.raises(ValueError, match=r"cannot be scaled"):
        ringlet.average_gradients([np.ones(3, dtype=np.int32)], prescale=2.0)
    with pytest.raises(ValueError, match=r"fusion_threshold must be"):
        ringlet.average_gradients([good], fusion_threshold=-1)
    assert np.all(good == 1)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_sixteen_bit_gradients_average_with_float32_accumulation(rank, size, dtype):
    inputs = [exact_input(9, r, (4099,), dtype, "avg") for r in range(size)]
    x = inputs[rank].copy()
    ringlet.average_gradients([x])
    assert x.dtype == np_dtype(dtype)
    assert x.tobytes() == reference(inputs, "avg").tobytes()
