"""Process sets: every collective restricted to a subset of the ranks gives the NumPy reference
over its members only, sets run side by side, and misuse (a non-member's call, a removed set,
ranks that disagree on a set) raises clearly on every rank involved and leaves all ranks in
step. The sets are the even and the odd ranks (at one rank, the odd set is empty and only the
even one exists), and a set of the last rank alone."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pytest

import ringlet
from ringlet import _core

from mpi_fixtures import exact_input, reference


def in_step() -> bool:
    return bool(ringlet.allreduce(np.ones(2), "sum")[0] == ringlet.size())


@pytest.fixture
def halves() -> Iterator[tuple[ringlet.ProcessSet, list[int]]]:
    """This rank's half (even or odd ranks) as a process set, and its ranks."""
    size, me = ringlet.size(), ringlet.rank()
    even = ringlet.add_process_set(range(0, size, 2))
    odd = ringlet.add_process_set(range(1, size, 2)) if size > 1 else None
    mine = even if me % 2 == 0 else odd
    assert mine is not None
    yield mine, list(range(me % 2, size, 2))
    for added in (even, odd):
        if added is not None:
            assert ringlet.remove_process_set(added)
    assert in_step()


def test_a_process_set_knows_its_ranks(halves: tuple[ringlet.ProcessSet, list[int]]) -> None:
    mine, ranks = halves
    assert mine.ranks == tuple(ranks)
    assert mine.size == len(ranks)
    assert mine.included
    assert mine.rank == ranks.index(ringlet.rank())
    assert mine.id > 0
    listed = {s.id: s.ranks for s in ringlet.process_sets()}
    assert listed[0] == tuple(range(ringlet.size()))
    assert listed[mine.id] == tuple(ranks)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "int64"])
@pytest.mark.parametrize("op", ["sum", "avg", "max"])
def test_allreduce_in_a_set_reduces_over_its_members_only(
    halves: tuple[ringlet.ProcessSet, list[int]], dtype: str, op: str
) -> None:
    mine, ranks = halves
    inputs = [exact_input(7, r, (1000,), dtype, op) for r in ranks]
    x = inputs[mine.rank].copy()
    expected = reference(inputs, op)
    np.testing.assert_array_equal(ringlet.allreduce(x, op, process_set=mine), expected)
    for algorithm in ringlet.algorithms("allreduce", dtype, op):
        result = ringlet.allreduce(x, op, algorithm=algorithm, process_set=mine)
        np.testing.assert_array_equal(result, expected, err_msg=algorithm)
    np.testing.assert_array_equal(x, inputs[mine.rank])  # the input is untouched


def test_async_and_grouped_allreduce_in_a_set(
    halves: tuple[ringlet.ProcessSet, list[int]]
) -> None:
    mine, ranks = halves
    inputs = [[exact_input(seed, r, (n,), "float32", "sum") for seed, n in ((1, 5), (2, 70000))]
              for r in ranks]
    expected = [reference([inputs[i][k] for i in range(len(ranks))], "avg") for k in range(2)]
    arrays = [a.copy() for a in inputs[mine.rank]]
    ringlet.average_gradients(arrays, process_set=mine)
    for got, want in zip(arrays, expected):
        np.testing.assert_array_equal(got, want)
    handle = ringlet.allreduce_async(inputs[mine.rank][1], "sum", process_set=mine)
    np.testing.assert_array_equal(
        handle.wait(), reference([inputs[i][1] for i in range(len(ranks))], "sum"))


def test_broadcast_in_a_set_names_its_root_by_global_rank(
    halves: tuple[ringlet.ProcessSet, list[int]]
) -> None:
    mine, ranks = halves
    root = ranks[-1]
    x = np.full((3, 4), float(ringlet.rank()))
    np.testing.assert_array_equal(ringlet.broadcast(x, root, process_set=mine),
                                  np.full((3, 4), float(root)))
    handle = ringlet.broadcast_async(x, root, process_set=mine)
    np.testing.assert_array_equal(handle.wait(), np.full((3, 4), float(root)))
    assert ringlet.broadcast_object({"from": ringlet.rank()}, root, process_set=mine) == {
        "from": root}
    outsider = (ranks[0] + 1) % ringlet.size()
    if outsider not in ranks:
        with pytest.raises(ValueError, match=f"root {outsider} is not in the process set"):
            ringlet.broadcast(x, outsider, process_set=mine)
        assert in_step()


def test_allgather_alltoall_reduce_scatter_in_a_set(
    halves: tuple[ringlet.ProcessSet, list[int]]
) -> None:
    mine, ranks = halves
    me = ringlet.rank()
    rows = [np.full((r + 1, 2), r, dtype=np.int32) for r in ranks]
    np.testing.assert_array_equal(ringlet.allgather(rows[mine.rank], process_set=mine),
                                  np.concatenate(rows))
    assert ringlet.allgather_object(me, process_set=mine) == ranks

    sent = np.arange(mine.size * 3).reshape(mine.size, 3) + 100 * me
    received, counts = ringlet.alltoall(sent, process_set=mine)
    assert counts == [1] * mine.size
    np.testing.assert_array_equal(
        received, np.stack([np.arange(3) + 3 * mine.rank + 100 * r for r in ranks]))

    inputs = [exact_input(3, r, (2 * mine.size + 1, 5), "float64", "sum") for r in ranks]
    total = reference(inputs, "sum")
    blocks = np.array_split(total, mine.size)
    np.testing.assert_array_equal(
        ringlet.reduce_scatter(inputs[mine.rank], process_set=mine), blocks[mine.rank])
    ringlet.barrier(mine)


def test_sets_of_different_sizes_run_side_by_side() -> None:
    """The even ranks and a set of the last rank alone reduce at once, and the world after."""
    size, me = ringlet.size(), ringlet.rank()
    even = ringlet.add_process_set(range(0, size, 2))
    last = ringlet.add_process_set([size - 1])
    try:
        if me in even.ranks:
            total = ringlet.allreduce(np.full(3, me + 1), process_set=even)
            np.testing.assert_array_equal(total, np.full(3, sum(r + 1 for r in even.ranks)))
        if me == size - 1:
            alone = ringlet.allreduce(np.full(3, 7), process_set=last)
            np.testing.assert_array_equal(alone, np.full(3, 7))
        assert last.rank == (0 if me == size - 1 else None)
        assert last.included == (me == size - 1)
    finally:
        ringlet.remove_process_set(even)
        ringlet.remove_process_set(last)
    assert in_step()


def test_a_non_member_or_a_removed_set_is_refused_locally() -> None:
    size, me = ringlet.size(), ringlet.rank()
    last = ringlet.add_process_set([size - 1])
    if me != size - 1:
        with pytest.raises(ValueError, match=f"rank {me} is not in process set {last.id}"):
            ringlet.allreduce(np.ones(3), process_set=last)
    assert ringlet.remove_process_set(last)
    assert not ringlet.remove_process_set(last)
    with pytest.raises(ValueError, match=f"process set {last.id} does not exist"):
        ringlet.allreduce(np.ones(3), process_set=last)
    with pytest.raises(TypeError, match=r"process_set must be a ringlet\.ProcessSet"):
        ringlet.allreduce(np.ones(3), process_set=[0])  # type: ignore[arg-type]
    assert in_step()


def test_ranks_that_disagree_on_a_set_all_raise_and_add_nothing() -> None:
    size, me = ringlet.size(), ringlet.rank()
    before = ringlet.process_sets()
    wanted = [0] if me < size - 1 or size == 1 else [size - 1]
    if size > 1:
        with pytest.raises(ringlet.MismatchError, match=f"rank {size - 1} passed \\[{size - 1}\\]"):
            ringlet.add_process_set(wanted)
    bad = [0, size] if me == size - 1 else [0]
    refusal = f"rank {size - 1}: ValueError: .*must be in 0..{size - 1}"
    with pytest.raises(ValueError, match=refusal):
        ringlet.add_process_set(bad)
    with pytest.raises(ValueError, match="add_process_set was refused"):
        ringlet.add_process_set([])
    assert ringlet.process_sets() == before
    assert in_step()


def test_a_bad_call_inside_a_set_leaves_its_members_in_step(
    halves: tuple[ringlet.ProcessSet, list[int]]
) -> None:
    """The set's last member passes a bad op: it raises ValueError, the other members
    MismatchError naming it, and the set works for the next call."""
    mine, ranks = halves
    x = np.ones(4, dtype=np.float32)
    if ringlet.rank() == ranks[-1]:
        with pytest.raises(ValueError, match="unknown op"):
            ringlet.allreduce(x, "median", process_set=mine)
    else:
        with pytest.raises(ringlet.MismatchError, match=f"rank {mine.size - 1} passed"):
            ringlet.allreduce(x, "sum", process_set=mine)
    np.testing.assert_array_equal(ringlet.allreduce(x, process_set=mine),
                                  np.full(4, mine.size, dtype=np.float32))


def test_auto_in_a_set_runs_the_models_choice_at_the_sets_size(
    halves: tuple[ringlet.ProcessSet, list[int]]
) -> None:
    mine, _ = halves
    x = np.ones(300_000, dtype=np.float32)
    ringlet.allreduce(np.ones(1, np.float32), process_set=mine)  # the set's table, built
    explained = _core.explain(x.nbytes, "float32", "sum", process_set=mine.id)
    expected, basis = explained.choice, explained.basis
    assert basis == ("one rank" if mine.size == 1 else "table")
    ringlet.reset_stats()
    np.testing.assert_array_equal(ringlet.allreduce(x, process_set=mine), x * mine.size)
    assert set(ringlet.stats()) == {expected}


def test_plan_buckets_in_a_set_agrees_among_its_members(
    halves: tuple[ringlet.ProcessSet, list[int]]
) -> None:
    mine, _ = halves
    plan = ringlet.plan_buckets([4 << 20, 4 << 20, 100], fusion_threshold=5 << 20,
                                process_set=mine)
    assert plan.buckets == [[0], [1, 2]]
    assert ringlet.allgather_object(plan.buckets, process_set=mine) == [plan.buckets] * mine.size
    if mine.size > 1:
        sizes = [8, 8] if mine.rank == mine.size - 1 else [8]
        with pytest.raises(ValueError, match="the ranks plan buckets for different arrays"):
            ringlet.plan_buckets(sizes, process_set=mine)


def test_auto_in_a_set_keeps_working_after_a_change_of_settings(size: int) -> None:
    """A change of settings rebuilds auto's tables but keeps the model's parameters: a process
    set could not install them again on its own (that is collective over every rank)."""
    everyone = ringlet.add_process_set(list(range(size)))
    before = ringlet.settings()["segment_bytes"]
    try:
        ringlet.settings(segment_bytes=before // 2)
        assert _core.installed_parameters() is not None
        x = np.ones(100_000, dtype=np.float32)
        np.testing.assert_array_equal(ringlet.allreduce(x, process_set=everyone), x * size)
        expected = _core.explain(x.nbytes, "float32", "sum", process_set=everyone.id).choice
        ringlet.reset_stats()
        ringlet.allreduce(x, process_set=everyone)
        assert set(ringlet.stats()) == {expected}
    finally:
        ringlet.settings(segment_bytes=before)
        ringlet.remove_process_set(everyone)


def test_selector_choice_and_refinements_read_a_sets_own_table(size: int) -> None:
    """docs/guide/algorithms.md: ``selector.choice`` says what auto runs now, and
    ``refinements(process_set)`` what a set's table has played; neither starts a collective on
    a set."""
    everyone = ringlet.add_process_set(list(range(size)))
    try:
        x = np.ones(50_000, dtype=np.float32)
        chosen = ringlet.selector.choice(x.nbytes, process_set=everyone)
        assert chosen == _core.explain(x.nbytes, "float32", "sum", process_set=everyone.id).choice
        ringlet.reset_stats()
        for _ in range(3):
            ringlet.allreduce(x, process_set=everyone)
        assert set(ringlet.stats()) == {chosen}
        played = [r for r in ringlet.selector.refinements(everyone)
                  if (r["dtype"], r["op"]) == ("float32", "sum")]
        assert [r["calls"] for r in played] == ([3] if size > 1 else [])
    finally:
        ringlet.remove_process_set(everyone)
