"""ringlet.join: a rank whose data ran out first adds zeros to the others' sum and avg
allreduces (sync, async, fused, compressed) until every rank has joined; the others' other
collectives raise MismatchError naming it; every rank learns the same last rank, and the ranks
are in step afterwards. Each rank in turn joins first."""

from __future__ import annotations

import numpy as np
import pytest

import ringlet


def in_step() -> bool:
    return bool(ringlet.allreduce(np.ones(2), "sum")[0] == ringlet.size())


@pytest.mark.parametrize("dtype", ["float32", "float64", "int32", "bfloat16"])
def test_a_joined_rank_adds_zeros_until_every_rank_joins(dtype: str) -> None:
    size, me = ringlet.size(), ringlet.rank()
    np_type = np.dtype(dtype) if dtype != "bfloat16" else np.dtype(__import__("ml_dtypes").bfloat16)
    for first in range(size):
        if me == first:
            last = ringlet.join()
        else:
            value = me + 1
            others = sum(r + 1 for r in range(size) if r != first)
            total = ringlet.allreduce(np.full(1000, value, dtype=np_type), "sum")
            np.testing.assert_array_equal(total, np.full(1000, others, dtype=np_type))
            grads = [np.full(n, value, dtype=np_type) for n in (3, 70_000, 5)]
            ringlet.average_gradients(grads, fusion_threshold=1 << 10)
            mean = np.asarray(others, dtype=np.float64) / size
            want = (np.trunc(mean) if np_type.kind == "i" else mean).astype(np_type)
            for g in grads:
                np.testing.assert_array_equal(g, np.full(g.shape, want))
            handle = ringlet.allreduce_async(np.full(7, value, dtype=np_type), "sum")
            np.testing.assert_array_equal(handle.wait(), np.full(7, others, dtype=np_type))
            last = ringlet.join()
        assert ringlet.allgather_object(last) == [last] * size
        assert size == 1 or last != first
        assert in_step()


def test_compressed_averaging_with_a_joined_rank() -> None:
    size, me = ringlet.size(), ringlet.rank()
    if me == 0:
        ringlet.join()
    else:
        grads = [np.full(1000, float(me), dtype=np.float32)]
        ringlet.average_gradients(grads, compression="bf16", prescale=2.0, postscale=0.25)
        expected = 2.0 * sum(range(1, size)) / size * 0.25
        np.testing.assert_allclose(grads[0], expected, rtol=1 / 128)
        ringlet.join()
    assert in_step()


def test_other_collectives_while_a_rank_has_joined_raise_on_the_others() -> None:
    size, me = ringlet.size(), ringlet.rank()
    if size == 1:
        assert ringlet.join() == 0
        return
    if me == 0:
        assert ringlet.join() == size - 1
    else:
        x = np.ones(4, dtype=np.float32)
        for call in (lambda: ringlet.allgather(x), lambda: ringlet.broadcast(x, 1),
                     lambda: ringlet.allreduce(x, "max"), lambda: ringlet.barrier()):
            with pytest.raises(ringlet.MismatchError, match="rank 0 has joined"):
                call()
        assert ringlet.join() == size - 1
    assert in_step()


def test_join_in_a_process_set_leaves_the_other_ranks_alone() -> None:
    size, me = ringlet.size(), ringlet.rank()
    evens = ringlet.add_process_set(range(0, size, 2))
    try:
        if me in evens.ranks:
            if me == 0:
                last = ringlet.join(evens)
            else:
                total = ringlet.allreduce(np.full(3, me), process_set=evens)
                np.testing.assert_array_equal(total, np.full(3, sum(evens.ranks)))
                last = ringlet.join(evens)
            assert last == evens.ranks[-1]
    finally:
        ringlet.remove_process_set(evens)
    assert in_step()
