"""auto's refinement on real calls: the core tries each size range's runner-up now and then and
keeps whichever was faster on the slowest rank. Every rank must make the same choice at every
call (the consistency check compares the algorithm each rank runs: a rank out of step would
raise MismatchError), after mismatched calls and joins too. Which algorithm wins is timing and
is not asserted; the bookkeeping and the results are."""

from __future__ import annotations

import numpy as np
import pytest

import ringlet
from ringlet import _core, calibration, selector

from mpi_fixtures import exact_input, reference


@pytest.fixture(params=["ring", "shm"])
def table_with_alternative(request, monkeypatch):
    """float32 sum: the ring, or shm (whose check rides on its first meeting) where the ranks
    share memory, with halving-doubling as the runner-up (the environment's table, which names
    it); the model's table afterwards."""
    winner = request.param
    if _core.algorithm_unavailable("allreduce", winner, 0) is not None:
        winner = "ring"
    monkeypatch.delenv("RINGLET_ALGORITHM", raising=False)
    monkeypatch.setenv("RINGLET_AUTO_TABLE", f"{winner}/halving_doubling")
    rebuild_tables()
    yield
    monkeypatch.undo()
    rebuild_tables()


def rebuild_tables() -> None:
    """Every rank's tables are rebuilt at the next auto call, which installs the parameters
    again and reads the environment."""
    calibration.uninstall()


def played() -> dict[str, int]:
    rows = [r for r in selector.refinements() if (r["dtype"], r["op"]) == ("float32", "sum")]
    assert len(rows) <= 1
    return rows[0] if rows else {"calls": 0, "tries": 0, "switches": 0}


def test_tries_come_at_doubling_call_numbers_alike_on_every_rank(table_with_alternative, comm,
                                                                 size):
    ringlet.reset_stats()
    for call in range(1, 41):
        x = exact_input(call, comm.rank, (1000,), "float32", "sum")
        want = reference([exact_input(call, r, (1000,), "float32", "sum") for r in range(size)],
                         "sum")
        np.testing.assert_array_equal(ringlet.allreduce(x), want)
    row = played()
    if size == 1:
        assert row["calls"] == 0  # one rank: auto runs nothing, so nothing is learned
        return
    # Tried at the 8th, 16th and 32nd call: 3 tries, each run by the alternative of the moment.
    assert (row["calls"], row["tries"]) == (40, 3)
    assert comm.allgather(row) == [row] * size
    counted = {name: v["calls"] for name, v in ringlet.stats().items()}
    winner = next(name for name in counted if name != "halving_doubling")
    assert sum(counted.values()) == 40 and set(counted) == {winner, "halving_doubling"}
    if row["switches"] == 0:
        assert counted == {winner: 37, "halving_doubling": 3}


def test_a_mismatched_call_starts_the_count_over_on_every_rank(table_with_alternative, comm,
                                                                size):
    if size == 1:  # no mismatch on one rank; a refused call counts no more than another
        with pytest.raises(ValueError):
            ringlet.allreduce(np.ones(3, np.float32), algorithm="no-such-algorithm")
        assert played()["calls"] == 0
        return
    for _ in range(5):
        ringlet.allreduce(np.ones(100, np.float32))
    # float32 on rank 0, float64 elsewhere: counted where it was picked, rank 0 alone would
    # be one float32 call ahead, and would try the alternative at a call the others do not.
    # It counts nowhere, and the failed check starts every rank's count over.
    with pytest.raises(ringlet.MismatchError):
        ringlet.allreduce(np.ones(100, np.float32 if comm.rank == 0 else np.float64))
    # In step: the next 35 calls choose alike everywhere (a difference would raise
    # MismatchError), trying the alternative at their 8th, 16th and 32nd.
    for _ in range(35):
        np.testing.assert_array_equal(ringlet.allreduce(np.ones(100, np.float32)),
                                      np.full(100, size, np.float32))
    row = played()
    assert (row["calls"], row["tries"]) == (35, 3)
    assert comm.allgather(row) == [row] * size


def test_ranks_that_joined_at_different_calls_are_in_step_afterwards(table_with_alternative,
                                                                      comm, size):
    if comm.rank == 0:
        ringlet.join()
    else:
        for _ in range(11):
            np.testing.assert_array_equal(ringlet.allreduce(np.ones(64, np.float32)),
                                          np.full(64, size - 1, np.float32))
        ringlet.join()
    assert played()["calls"] == 0  # every rank starts over, together
    for _ in range(20):
        np.testing.assert_array_equal(ringlet.allreduce(np.ones(64, np.float32)),
                                      np.full(64, size, np.float32))
    row = played()
    assert row["calls"] == (20 if size > 1 else 0)
    assert comm.allgather(row) == [row] * size


def test_ranks_on_the_slow_path_count_alike(table_with_alternative, comm, size):
    """``out=`` another array on rank 0 takes the checked path, the others the fast one: both
    count the same calls, so they try the alternative at the same calls (or the check would
    raise MismatchError)."""
    for call in range(1, 41):
        x = np.full(100, comm.rank + call, np.float32)
        want = np.full(100, sum(r + call for r in range(size)), np.float32)
        if comm.rank == 0:
            out = np.empty_like(x)
            ringlet.allreduce(x, out=out)
            np.testing.assert_array_equal(out, want)
        else:
            np.testing.assert_array_equal(ringlet.allreduce(x), want)
    row = played()
    assert row["calls"] == (40 if size > 1 else 0)
    assert comm.allgather(row) == [row] * size
