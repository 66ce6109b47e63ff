"""average_gradients, allreduce_async and compression against NumPy references."""

from __future__ import annotations

import json

import numpy as np
import pytest

import ringlet
from ringlet import _core, _gradients

from mpi_fixtures import ALL_DTYPES, exact_input, np_dtype, reference, same_on_every_rank

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


@pytest.mark.parametrize("value", ["lots", "", "1e6"])
def test_a_fusion_threshold_that_is_not_a_number_is_refused_and_changes_nothing(
        monkeypatch, rank, size, value):
    monkeypatch.setenv("RINGLET_FUSION_THRESHOLD", value)
    arrays = [np.full(4, rank + 1.0, np.float32) for _ in range(2)]
    with pytest.raises(ValueError, match=f"RINGLET_FUSION_THRESHOLD='{value}' is not a number"):
        ringlet.average_gradients(arrays)
    assert all(np.array_equal(a, np.full(4, rank + 1.0, np.float32)) for a in arrays)
    monkeypatch.setenv("RINGLET_FUSION_THRESHOLD", " 64 ")  # surrounding blanks are fine
    ringlet.average_gradients(arrays)
    assert all(np.array_equal(a, np.full(4, (size + 1) / 2, np.float32)) for a in arrays)


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


def test_average_gradients_runs_after_what_is_queued(rank, size):
    """average_gradients runs on the caller's thread, but in the queue's order: after the
    collectives queued before it, on every rank (otherwise ranks would pair different calls)."""
    big = np.full(4 << 20, rank + 1.0, dtype=np.float32)
    handle = ringlet.allreduce_group_async([big], "sum")
    small = [np.full(n, rank + 2.0, dtype=np.float32) for n in (3, 16, 1000)]
    ringlet.average_gradients(small)
    assert handle.done(), "average_gradients returned before the collective queued before it"
    handle.wait()
    assert np.all(big == size * (size + 1) / 2)
    for array in small:
        assert np.allclose(array, sum(r + 2.0 for r in range(size)) / size)


def test_async_in_place_and_python_keeps_running(rank, size):
    # A 32 MiB allreduce is long enough to see the caller run on, unless the machine is so busy
    # that this thread is not scheduled until it has finished: a few attempts, and one must show
    # it (a blocking allreduce_async would show it in none).
    polls_per_attempt = []
    for _ in range(5):
        x = np.ones(8 << 20, dtype=np.float32)
        handle = ringlet.allreduce_async(x, "sum", out=x)
        polls = 0
        while not handle.done():
            polls += 1
        assert handle.wait() is x and np.all(x == size)
        polls_per_attempt.append(polls)
        # Every rank decides together whether to try again (a rank alone would be out of step).
        everyone_saw_it = ringlet.allreduce(np.array([polls > 0], np.int32), "min")[0]
        if size == 1 or everyone_saw_it:
            break
    if size > 1:
        assert everyone_saw_it, (
            f"the caller never ran while the allreduce was in flight: {polls_per_attempt}")


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


# ---- bucket plans ---------------------------------------------------------------------------


def test_plan_buckets_cuts_consecutive_buckets_at_the_threshold(size):
    plan = ringlet.plan_buckets([4, 4, 4, 9, 0, 1, 3], fusion_threshold=8)
    assert plan.buckets == [[0, 1], [2], [3], [4, 5, 6]]
    assert plan.limit == 8 and "fusion_threshold" in plan.reason
    assert ringlet.plan_buckets([], fusion_threshold=8).buckets == []


def test_plan_buckets_reads_the_environment(monkeypatch, size):
    monkeypatch.setenv("RINGLET_FUSION_THRESHOLD", "10")
    plan = ringlet.plan_buckets([6, 6, 6])
    assert plan.buckets == [[0], [1], [2]] and "RINGLET_FUSION_THRESHOLD" in plan.reason


def test_plan_buckets_follows_the_model_when_nothing_overrides(monkeypatch, size):
    import os

    monkeypatch.delenv("RINGLET_FUSION_THRESHOLD", raising=False)
    sizes = [3 << 20, 5 << 20, 100, 2 << 20, 7 << 20]
    plan = ringlet.plan_buckets(sizes, compute_threads=1)
    here = ringlet.topology()
    cores = min(len(os.sched_getaffinity(0)), (os.cpu_count() or 1) // here.local_size)
    expected = _gradients.bucket_bytes("float32", size, hosts=here.cross_size,
                                       cores_per_rank=cores, threads=1)
    # Rank 0's model decides for every rank.
    assert (plan.limit, plan.reason) == ringlet.broadcast_object(
        (expected.limit, expected.reason), 0)
    flat = [i for bucket in plan.buckets for i in bucket]
    assert flat == list(range(len(sizes)))  # consecutive, every array once
    for bucket in plan.buckets[:-1]:
        assert sum(sizes[i] for i in bucket) <= plan.limit or len(bucket) == 1


def test_rank_zeros_plan_wins_and_disagreeing_arrays_raise_everywhere(rank, size):
    plan = ringlet.plan_buckets([8, 8, 8, 8], fusion_threshold=8 if rank == 0 else 1 << 20)
    assert plan.buckets == [[0], [1], [2], [3]]
    if size > 1:
        with pytest.raises(ValueError, match="plan buckets for different arrays"):
            ringlet.plan_buckets([8] * (2 + (rank == size - 1)), fusion_threshold=8)
    # The ranks are still in step.
    x = np.full(3, rank, dtype=np.int64)
    assert ringlet.allreduce(x, "sum").tolist() == [sum(range(size))] * 3


def test_bucket_model_decisions():
    bucket_bytes = _gradients.bucket_bytes

    def priced(beta: float) -> str:
        return _core.check_parameters(json.dumps(
            {"alpha": 5e-6, "beta": beta, "gamma": {"float32": 1 / 20e9}}))

    prices = priced(1 / 5e9)
    shared = bucket_bytes("float32", 2, hosts=1, cores_per_rank=1, threads=1, parameters=prices)
    assert shared.limit == _gradients.ONE_BUCKET and "shares the cores" in shared.reason
    assert bucket_bytes("float32", 1, hosts=1, cores_per_rank=8, threads=1,
                        parameters=prices).limit == _gradients.ONE_BUCKET
    spare = bucket_bytes("float32", 2, hosts=1, cores_per_rank=4, threads=1, parameters=prices)
    across = bucket_bytes("float32", 8, hosts=4, cores_per_rank=1, threads=1, parameters=prices)
    for choice in (spare, across):
        assert _gradients.MIN_BUCKET <= choice.limit <= _gradients.MAX_BUCKET, choice
    # A slower network per byte makes the fixed costs relatively smaller: smaller buckets.
    slower = bucket_bytes("float32", 2, hosts=2, cores_per_rank=1, threads=1,
                          parameters=priced(1 / 1e9))
    faster = bucket_bytes("float32", 2, hosts=2, cores_per_rank=1, threads=1,
                          parameters=priced(1 / 20e9))
    assert slower.limit < faster.limit


# ---- waiting ---------------------------------------------------------------------------------


def test_results_are_the_same_whatever_the_wait_policy(rank, size):
    from ringlet import _core

    default = _core.wait_policy()
    inputs = [exact_input(77, r, (50_000,), "float32", "sum") for r in range(size)]
    try:
        assert _core.wait_policy(spin_us=0, max_sleep_us=100) == (0, 100)
        summed = inputs[rank].copy()
        ringlet.allreduce(summed, "sum", out=summed, algorithm="ring")
        averaged = [inputs[rank][:10].copy(), inputs[rank].copy()]
        ringlet.average_gradients(averaged)
    finally:
        _core.wait_policy(*default)
    assert _core.wait_policy() == default
    assert summed.tobytes() == reference(inputs, "sum").tobytes()
    assert averaged[0].tobytes() == reference([x[:10] for x in inputs], "avg").tobytes()
    assert averaged[1].tobytes() == reference(inputs, "avg").tobytes()


def test_the_default_wait_spins_then_yields(monkeypatch):
    import os

    from ringlet import _core

    if "RINGLET_WAIT_SPIN_US" in os.environ or "RINGLET_WAIT_SLEEP_US" in os.environ:
        pytest.skip("the environment sets the wait policy")  # not counted: CI does not set it
    assert _core.wait_policy() == (1000, 0)


def test_handles_tell_when_they_ran_and_packing_is_counted(rank, size):
    n = 1 << 20  # far above the cost model's pack_below: reduced in place
    arrays = [np.ones(n, dtype=np.float32) for _ in range(3)]
    ringlet.reset_stats()
    handle = ringlet.allreduce_group_async(arrays, "avg")
    handle.wait()
    queued, ran = handle.timing()
    assert 0 <= queued < 60 and 0 < ran < 60
    assert "pack" not in ringlet.stats()  # reduced in place
    ringlet.average_gradients(arrays, compression="bf16")
    pack = ringlet.stats()["pack"]
    assert pack["calls"] == 1 and pack["bytes"] == 3 * n * 2 and pack["seconds"] > 0


# ---- every algorithm over arrays in place -----------------------------------------------------


@pytest.mark.parametrize("dtype", ALL_DTYPES)
@pytest.mark.parametrize("op", ["sum", "max"])
@pytest.mark.parametrize("shapes", [
    [(16,), (0,), (3,), (16,), (1,)],  # small arrays: folded together in scratch, copied out
    [(300,), (0,), (257,), (600,)],  # larger ones: each folded where it is
], ids=["small-arrays", "larger-arrays"])
def test_shared_memory_one_shot_reduces_a_group_either_way(comm, rank, size, dtype, op, shapes):
    # Both well within the one-shot's limit at 2 and 3 ranks; an empty array among them.
    inputs = [[exact_input(70 + i, r, s, dtype, op) for i, s in enumerate(shapes)]
              for r in range(size)]
    mine = [a.copy() for a in inputs[rank]]
    ringlet.average_gradients(mine, op=op, algorithm="shm")
    for i, array in enumerate(mine):
        expected = reference([inputs[r][i] for r in range(size)], op)
        assert array.tobytes() == expected.tobytes(), (dtype, op, shapes[i])
        assert same_on_every_rank(comm, array)


@pytest.mark.parametrize("algorithm,dtype", [
    (algorithm, dtype) for algorithm in ringlet.algorithms()
    for dtype in ("float32", "bfloat16", "int64")
    if algorithm in ringlet.algorithms(dtype=dtype)  # mpi cannot reduce 16-bit floats
])
def test_every_algorithm_reduces_a_group_in_place_across_array_boundaries(
        comm, rank, size, algorithm, dtype):
    # Sizes chosen so that blocks of every algorithm start and end inside arrays, with an
    # empty array among them; all far above pack_below, so reduced where they live.
    shapes = [(40_003,), (0,), (129, 257), (1,), (70_001,), (5, 0), (33_333,)]
    inputs = [[exact_input(90 + i, r, s, dtype, "sum") for i, s in enumerate(shapes)]
              for r in range(size)]
    mine = [a.copy() for a in inputs[rank]]
    pointers = [a.__array_interface__["data"][0] for a in mine]
    ringlet.average_gradients(mine, op="sum", algorithm=algorithm)
    for i, array in enumerate(mine):
        expected = reference([inputs[r][i] for r in range(size)], "sum")
        assert array.tobytes() == expected.tobytes(), (algorithm, shapes[i])
        assert same_on_every_rank(comm, array)
    assert [a.__array_interface__["data"][0] for a in mine] == pointers  # in place
    if dtype != "int64":
        # avg's division and the factors folded in: exact with powers of two.
        scaled = [a.copy() for a in inputs[rank]]
        ringlet.average_gradients(scaled, algorithm=algorithm, prescale=0.5, postscale=4.0)
        for i, array in enumerate(scaled):
            total = reference([inputs[r][i] for r in range(size)], "sum").astype(np.float64)
            expected = (total * 0.5 / size * 4.0).astype(np_dtype(dtype))
            if size & (size - 1) == 0:  # dividing by a power of two is exact
                assert array.tobytes() == expected.tobytes(), (algorithm, shapes[i])
            else:
                assert np.allclose(array.astype(np.float64), expected.astype(np.float64),
                                   rtol=1e-2 if dtype == "bfloat16" else 1e-6)
            assert same_on_every_rank(comm, array)


@pytest.mark.parametrize("algorithm", ["auto", *ringlet.algorithms(dtype="float32")])
@pytest.mark.parametrize("shapes", [
    [(16,), (0,), (3,), (16,), (1,)],  # shm's one-shot: folded together in scratch
    [(300,), (0,), (257,), (600,)],  # shm's one-shot: each folded where it is
    [(40_003,), (0,), (129, 257), (1,), (300_001,)],  # two-shot over segments; blocks astride
], ids=["tiny", "small", "large"])
def test_a_group_reduced_into_out_reads_its_arrays_and_writes_every_result(
        comm, rank, size, algorithm, shapes):
    inputs = [[exact_input(110 + i, r, s, "float32", "sum") for i, s in enumerate(shapes)]
              for r in range(size)]
    mine = [a.copy() for a in inputs[rank]]
    for array in mine:
        array.flags.writeable = False  # only read: a framework's tensors
    out = [np.full(s, np.nan, np.float32) for s in shapes]
    ringlet.average_gradients(mine, op="sum", algorithm=algorithm, out=out)
    for i, result in enumerate(out):
        expected = reference([inputs[r][i] for r in range(size)], "sum")
        assert result.tobytes() == expected.tobytes(), (algorithm, shapes[i])
        assert np.array_equal(mine[i], inputs[rank][i])
    # Scaled (folded into the combines, or a sweep) and queued: the same results.
    out = [np.full(s, np.nan, np.float32) for s in shapes]
    ringlet.allreduce_group_async(mine, "avg", algorithm=algorithm, prescale=0.5,
                                  postscale=4.0, out=out).wait()
    for i, result in enumerate(out):
        total = reference([inputs[r][i] for r in range(size)], "sum").astype(np.float64)
        assert np.allclose(result, total * 2.0 / size, rtol=1e-6), (algorithm, shapes[i])
        assert same_on_every_rank(comm, result)


def test_a_group_into_out_mixes_dtypes_in_place_entries_and_compression(comm, rank, size):
    dtypes = ["float64", "int32", "bfloat16", "float32", "int64"]
    inputs = {d: [exact_input(7, r, (33,), d, "sum") for r in range(size)] for d in dtypes}
    mine = [inputs[d][rank].copy() for d in dtypes]
    # Every other entry is the array itself: that one in place, the rest into new arrays.
    out = [a if i % 2 else np.zeros_like(a) for i, a in enumerate(mine)]
    ringlet.average_gradients(mine, op="sum", out=out)
    for i, (result, d) in enumerate(zip(out, dtypes)):
        assert result.tobytes() == reference(inputs[d], "sum").tobytes(), d
        if i % 2 == 0:
            assert np.array_equal(mine[i], inputs[d][rank]), d
    x = np.random.default_rng([5, rank]).uniform(-1, 1, 5000).astype(np.float32)
    kept = x.copy()
    packed, into = x.copy(), np.empty_like(x)
    ringlet.average_gradients([packed], compression="bf16")
    ringlet.average_gradients([x], compression="bf16", out=[into])
    assert into.tobytes() == packed.tobytes() and np.array_equal(x, kept)
    assert same_on_every_rank(comm, into)


def test_a_bad_out_is_refused_on_every_rank_and_leaves_everything_unchanged(rank, size):
    base = np.arange(12, dtype=np.float32) + rank
    arrays = [base[:10], np.ones(4, np.float32)]
    buffer = np.zeros(20, np.float32)
    bad = {
        "one result per array": [np.zeros(10, np.float32)],
        "shape and dtype": [np.zeros(10, np.float64), np.zeros(4, np.float32)],
        "overlaps": [base[2:], np.zeros(4, np.float32)],
        "read-only": [np.zeros(10, np.float32), np.zeros(4, np.float32)],
    }
    bad["read-only"][1].flags.writeable = False
    # Another rank's mistake too: rank 0 passes the bad call, the others a good one.
    for reason, out in bad.items():
        with pytest.raises((ValueError, ringlet.MismatchError)) as raised:
            ringlet.average_gradients(arrays, out=out if rank == 0 else
                                      [np.zeros(10, np.float32), np.zeros(4, np.float32)])
        if rank == 0:
            assert reason in str(raised.value), (reason, raised.value)
        assert np.array_equal(base, np.arange(12, dtype=np.float32) + rank)
    # The results overlapping each other, on every rank: refused in the core.
    with pytest.raises(ValueError, match="overlap"):
        ringlet.average_gradients(arrays, out=[buffer[:10], buffer[6:10]])
    assert not buffer.any()
    # Across dtypes (one collective each): a float result over the int array to reduce.
    ints = np.arange(8, dtype=np.int32) + rank
    with pytest.raises(ValueError, match="overlaps"):
        ringlet.average_gradients([np.ones(8, np.float32), ints],
                                  out=[ints.view(np.float32), np.zeros(8, np.int32)])
    assert np.array_equal(ints, np.arange(8, dtype=np.int32) + rank)
    assert ringlet.allreduce(np.ones(3), "sum")[0] == size  # the ranks are still in step
