"""The shared-memory tier: the ``shm`` algorithm against NumPy on every path (one-shot,
two-shot over several chunks, private buffers, arrays that live in shared memory, and both
mixed), arrays from ``ringlet.empty`` and their lifetime, and misuse that must raise on every
rank and leave the ranks in step. Every test here runs on one node, where ranks share memory."""

from __future__ import annotations

import gc

import numpy as np
import pytest

import ringlet

from mpi_fixtures import ALL_DTYPES, exact_input, np_dtype, reference

OPS = ("sum", "avg", "prod", "min", "max")
# Elements: one-shot, just past the one-shot on 2 ranks, and several 1 MiB chunks of float32.
COUNTS = (1, 1000, 16_385, 600_001)


def inputs(seed: int, shape, dtype: str, op: str) -> tuple[np.ndarray, np.ndarray]:
    """(this rank's input, the NumPy reduction over every rank's input)."""
    size, me = ringlet.size(), ringlet.rank()
    everyone = [exact_input(seed, r, shape, dtype, op) for r in range(size)]
    return everyone[me], reference(everyone, op)


def in_step() -> bool:
    return bool(ringlet.allreduce(np.ones(2), "sum")[0] == ringlet.size())


def shared() -> bool:
    """Whether ringlet.empty gives shared memory here: on one node, from two ranks."""
    return ringlet.size() > 1


def test_ranks_on_one_node_share_memory() -> None:
    status = ringlet.shared_memory()
    if ringlet.size() == 1:
        assert not status.available and status.reason == "one rank: nothing to share"
    else:
        assert status.available and str(status) == "shared memory: available", status


@pytest.mark.parametrize("dtype", ALL_DTYPES)
@pytest.mark.parametrize("count", COUNTS)
def test_shm_matches_numpy_for_every_dtype_and_op(dtype: str, count: int) -> None:
    for op in OPS:
        mine, want = inputs(count, (count,), dtype, op)
        before = mine.copy()
        got = ringlet.allreduce(mine, op, algorithm="shm")
        np.testing.assert_array_equal(got, want)
        np.testing.assert_array_equal(mine, before)  # not in place: the input is untouched


@pytest.mark.parametrize("count", COUNTS)
def test_arrays_in_shared_memory_are_reduced_in_place(count: int) -> None:
    mine, want = inputs(7, (count,), "float32", "sum")
    array = ringlet.empty(count, np.float32)
    assert ringlet.is_shared(array) == shared()
    assert array.shape == (count,) and array.dtype == np.float32
    array[...] = mine
    assert ringlet.allreduce(array, out=array, algorithm="shm") is array
    np.testing.assert_array_equal(array, want)
    again = ringlet.zeros((count,), np.float32)
    again[...] = mine
    ringlet.allreduce(again, out=again)  # auto: whichever it picks, the same answer
    np.testing.assert_array_equal(again, want)


def test_shared_and_private_vectors_mix_and_views_at_an_offset_work() -> None:
    count = 700_003
    mine, want = inputs(11, (count,), "float64", "sum")
    if ringlet.rank() % 2 == 0:
        holder = ringlet.zeros(count + 5, np.float64)
        target = holder[5:]  # a view that starts inside the shared array
    else:
        ringlet.zeros(count + 5, np.float64)  # allocation is collective: every rank takes part
        target = np.zeros(count)
    target[...] = mine
    ringlet.allreduce(target, out=target, algorithm="shm")
    np.testing.assert_array_equal(target, want)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "int32", "int64"])
def test_empty_and_zeros_take_every_dtype_and_shape(dtype: str) -> None:
    array = ringlet.zeros((3, 4, 5), np_dtype(dtype))
    assert array.shape == (3, 4, 5) and array.dtype == np_dtype(dtype)
    assert ringlet.is_shared(array) == shared() and not array.any()
    mine, want = inputs(3, (3, 4, 5), dtype, "max")
    array[...] = mine
    ringlet.allreduce(array, "max", out=array, algorithm="shm")
    np.testing.assert_array_equal(array, want)
    assert ringlet.empty(0, np.float32).shape == (0,)


def test_bad_shapes_and_dtypes_are_refused_on_the_calling_rank() -> None:
    with pytest.raises(ValueError, match="shape must be non-negative integers"):
        ringlet.empty((2, -1))
    with pytest.raises(TypeError, match="float32"):
        ringlet.empty(4, np.complex64)
    assert in_step()


# Slow (40 s): allocates and drops shared arrays until the memory is reused.
@pytest.mark.slow
def test_arrays_that_every_rank_dropped_are_freed_and_the_memory_reused() -> None:
    # Oversubscribed runs allocate slowly (each allocation is collective): fewer rounds there.
    for round_ in range(40 if ringlet.size() <= 4 else 12):
        array = ringlet.zeros(1 << 20, np.float32)  # 4 MiB per rank, 160 MiB over the loop
        array[:] = round_
        ringlet.allreduce(array, out=array, algorithm="shm")
        assert array[0] == round_ * ringlet.size()
        del array
        gc.collect()
    assert in_step()


def test_a_shared_array_outlives_shutdown_and_still_reduces_after_init() -> None:
    array = ringlet.zeros(300_000, np.float32)
    array[:] = ringlet.rank() + 1
    ringlet.shutdown()
    array += 1  # still mapped, still ours
    ringlet.init()
    assert ringlet.is_shared(array) == shared()
    ringlet.allreduce(array, out=array, algorithm="shm")  # a new communicator: staged
    assert float(array[0]) == sum(r + 2 for r in range(ringlet.size()))
    assert in_step()


def test_a_mismatch_on_the_shared_memory_path_raises_on_every_rank_and_keeps_step() -> None:
    if ringlet.size() == 1:  # nobody to disagree with: the call simply runs
        np.testing.assert_array_equal(ringlet.allreduce(np.ones(3), algorithm="shm"), np.ones(3))
        return
    count = 100 if ringlet.rank() == 0 else 101
    buf = np.ones(count, np.float32)
    with pytest.raises(ringlet.MismatchError, match=r"float32\[100\].*float32\[101\]"):
        ringlet.allreduce(buf, out=buf, algorithm="shm")
    assert (buf == 1).all()  # unchanged on every rank
    assert in_step()
    # A rank in another collective altogether is caught the same way.
    with pytest.raises(ringlet.MismatchError, match="barrier"):
        if ringlet.rank() == 0:
            ringlet.barrier()
        else:
            ringlet.allreduce(np.ones(8), algorithm="shm")
    assert in_step()


def test_gradient_averaging_runs_on_shared_memory_without_user_changes() -> None:
    grads = [np.full(n, float(ringlet.rank()), np.float32) for n in (5, 3000, 40_000, 7)]
    ringlet.reset_stats()
    ringlet.average_gradients(grads, fusion_threshold=1 << 20, algorithm="shm")
    mean = np.float32(sum(range(ringlet.size())) / ringlet.size())
    for g in grads:
        np.testing.assert_allclose(g, mean, rtol=1e-6)
    used = ringlet.stats()
    assert "pack" not in used  # the schedule gathers the arrays itself
    assert set(used) == {"shm"}


def test_a_joined_rank_takes_part_in_shm_allreduces_whose_check_rides_on_the_data() -> None:
    """The one-shot path checks the call at its data meeting; a joined rank meets it there with
    a join, and the call is replayed with the joined rank adding zeros."""
    size, me = ringlet.size(), ringlet.rank()
    assert in_step()  # auto's table exists on every rank (join builds it otherwise)
    last_joiner = size - 1
    if me == 0 and size > 1:
        ringlet.join()
    else:
        others = sum(r + 1 for r in range(1, size)) if size > 1 else 1
        for count in (3, 1000):
            got = ringlet.allreduce(np.full(count, me + 1, np.float32), "sum", algorithm="shm")
            np.testing.assert_array_equal(got, np.full(count, others, np.float32))
        assert ringlet.join() == last_joiner
    assert in_step()
