"""A rank that shuts ringlet down is seen by the others (issue 25): a rank that waits for it in
a collective raises RingletError within 5 s, naming it and how far it got, and so does every
later call on that communicator; a rank that is only slow is never taken for one that left.
Each test starts and ends with a fresh communicator on every rank (init is collective), so the
suite goes on in step, even after a failure on one rank. At one rank there is nobody to leave:
the tests then check that shutting down and starting again works."""

from __future__ import annotations

import re
import time

import numpy as np
import pytest

import ringlet

LEFT = re.compile(
    r"rank (\d+) has shut down ringlet \(ringlet\.shutdown\(\) or the end of its program\) "
    r"after (\d+) collectives? while this rank (waits in|starts) (\w+) #(\d+)")


# A rank raises while it waits in the call, or as it starts it if an earlier wait already
# brought the notice.
WAITING = ("waits in", "starts")


def fresh_communicator() -> None:
    ringlet.shutdown()
    ringlet.init()


def departure(error: BaseException) -> tuple[int, int, str, str, int]:
    """(departed rank, its collectives, waits in/starts, collective, this rank's number)."""
    found = LEFT.match(str(error))
    assert found, f"not a departure: {error}"
    return int(found[1]), int(found[2]), found[3], found[4], int(found[5])


@pytest.fixture(autouse=True)
def restart_on_every_rank():
    """Every rank ends each test alike, whatever the test did or failed on it: shutdown(), then
    init() (collective) and an allreduce on the new communicator. A rank whose test failed
    midway shuts down early, which the others see as a departure (so they fail too instead of
    waiting for it), and all meet again here."""
    yield
    ringlet.shutdown()
    ringlet.init()
    x = np.arange(5, dtype=np.float64)
    np.testing.assert_array_equal(ringlet.allreduce(x, "sum"), x * ringlet.size())


@pytest.mark.parametrize("leaver_is", ["last", "first"])
def test_a_rank_that_shuts_down_makes_the_others_raise_within_5_s(leaver_is: str) -> None:
    size, me = ringlet.size(), ringlet.rank()
    leaver = size - 1 if leaver_is == "last" else 0
    fresh_communicator()
    x = np.arange(1000, dtype=np.float32)
    for _ in range(2):
        np.testing.assert_array_equal(ringlet.allreduce(x, "sum"), x * size)
    if me == leaver:
        ringlet.shutdown()
    else:
        started = time.monotonic()
        with pytest.raises(ringlet.RingletError) as waiting:
            ringlet.allreduce(x, "sum")
        seconds = time.monotonic() - started
        rank, made, doing, what, number = departure(waiting.value)
        # It made every collective before this one, and this rank waits in the next (or had
        # heard of the departure, in the previous call's wait, before it started this one).
        assert (rank, what) == (leaver, "allreduce") and doing in WAITING, str(waiting.value)
        assert made == number and made >= 2, str(waiting.value)
        assert seconds < 5, seconds
        # Any later call raises at once, whatever it is.
        with pytest.raises(ringlet.RingletError) as later:
            ringlet.broadcast(x, root=me)
        assert departure(later.value)[:4] == (leaver, made, "starts", "broadcast")
        ringlet.shutdown()


def test_a_rank_that_leaves_while_the_others_have_joined_makes_them_raise() -> None:
    size, me = ringlet.size(), ringlet.rank()
    leaver = size - 1
    fresh_communicator()
    if me == leaver:
        # One more allreduce, which the joined ranks take part in with zeros; then it leaves.
        np.testing.assert_array_equal(ringlet.allreduce(np.ones(3), "sum"), np.ones(3))
        ringlet.shutdown()
    else:
        started = time.monotonic()
        with pytest.raises(ringlet.RingletError) as joined:
            ringlet.join()
        assert time.monotonic() - started < 5
        rank, _, doing, what, _ = departure(joined.value)
        assert (rank, what) == (leaver, "join") and doing in WAITING, str(joined.value)
        ringlet.shutdown()


def test_a_slow_rank_is_not_taken_for_one_that_left() -> None:
    size, me = ringlet.size(), ringlet.rank()
    x = np.full(10_000, me + 1, dtype=np.float64)
    want = np.full(10_000, size * (size + 1) / 2)
    if me == size - 1:
        time.sleep(6)  # longer than a departure takes to be seen
    np.testing.assert_array_equal(ringlet.allreduce(x, "sum"), want)
    np.testing.assert_array_equal(ringlet.allreduce(x, "sum"), want)


def test_a_member_that_leaves_makes_the_others_in_its_process_set_raise() -> None:
    size, me = ringlet.size(), ringlet.rank()
    fresh_communicator()
    members = sorted({0, size - 1})
    both_ends = ringlet.add_process_set(members)
    x = np.ones(100, dtype=np.float32)
    if me in members:
        np.testing.assert_array_equal(ringlet.allreduce(x, "sum", process_set=both_ends),
                                      x * len(members))
    if me == size - 1 or me not in members:
        ringlet.shutdown()
    else:
        with pytest.raises(ringlet.RingletError) as waiting:
            ringlet.allreduce(x, "sum", process_set=both_ends)
        rank, _, doing, what, _ = departure(waiting.value)
        # Named as ringlet's communicator numbers it, not as the set does.
        assert (rank, what) == (size - 1, "allreduce") and doing in WAITING, str(waiting.value)
        ringlet.shutdown()
