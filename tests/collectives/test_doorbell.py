"""ringlet.doorbell: a rank's ring wakes every other member's wait with the largest value rung;
a wait ends at its timeout or when another thread of its rank interrupts it; rings pass while a
collective runs on another thread and never disturb it; a set's doorbell reaches its members
only; a closed doorbell refuses; and the ranks are in step afterwards (runtime/doorbell.rs)."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest

import ringlet


def in_step() -> bool:
    return bool(ringlet.allreduce(np.ones(2), "sum")[0] == ringlet.size())


def heard_until(bell: ringlet.Doorbell, last: int, pause: float = 0.001) -> list[int]:
    """What the waits return until ``last`` (rings may arrive one wait apart)."""
    heard: list[int] = []
    while not heard or heard[-1] != last:
        value = bell.wait(60.0, longest_pause=pause)
        assert value is not None, f"a wait ended without the ring {last} (heard {heard})"
        heard.append(value)
    return heard


def test_a_ring_wakes_every_other_member_with_the_largest_value() -> None:
    size, me = ringlet.size(), ringlet.rank()
    bell = ringlet.doorbell()
    try:
        for ringer in range(size):
            rung = [100 * ringer + 1, 100 * ringer + 7, 100 * ringer + 3]
            if me == ringer:
                for value in rung:
                    bell.ring(value)
            ringlet.barrier()
            if me != ringer:
                heard = heard_until(bell, max(rung), pause=0.05 if ringer % 2 else 0.001)
                assert set(heard) <= set(rung) and heard == sorted(heard), heard
            # Every ring was taken (and a rank never hears its own): the next wait hears none.
            assert bell.wait(0.05) is None
            ringlet.barrier()
    finally:
        bell.close()
    assert in_step()


def test_a_process_set_s_doorbell_wakes_its_members_only() -> None:
    size, me = ringlet.size(), ringlet.rank()
    members = tuple(range(0, size, 2))
    subset = ringlet.add_process_set(members)
    world = ringlet.doorbell()
    bell = ringlet.doorbell(subset) if me in members else None
    try:
        if bell is not None and me == 0:
            bell.ring(5)
        ringlet.barrier()
        if bell is not None and me != 0:
            assert heard_until(bell, 5) == [5]
        assert world.wait(0.05) is None, "a set's ring reached ringlet's own doorbell"
        ringlet.barrier()
        if me not in members:
            with pytest.raises(ValueError, match="not in process set"):
                ringlet.doorbell(subset)
    finally:
        world.close()
        if bell is not None:
            bell.close()
        ringlet.remove_process_set(subset)
    assert in_step()


def test_a_wait_ends_at_its_timeout_or_when_interrupted() -> None:
    bell = ringlet.doorbell()
    try:
        started = time.monotonic()
        assert bell.wait(0.1) is None
        assert time.monotonic() - started >= 0.1

        timer = threading.Timer(0.2, bell.interrupt)
        timer.start()
        started = time.monotonic()
        assert bell.wait(120.0) is None
        assert time.monotonic() - started < 60, "the interrupt did not end the wait"
        timer.join()

        bell.interrupt()  # before the wait: it ends the next one at once
        started = time.monotonic()
        assert bell.wait(120.0) is None
        assert time.monotonic() - started < 60

        started = time.monotonic()  # with long pauses between polls: still the timeout
        assert bell.wait(0.1, longest_pause=0.05) is None
        assert time.monotonic() - started >= 0.1

        for bad in (-1.0, float("nan"), float("inf")):
            with pytest.raises(ValueError, match="timeout"):
                bell.wait(bad)
            with pytest.raises(ValueError, match="longest_pause"):
                bell.wait(1.0, longest_pause=bad)
    finally:
        bell.close()
    assert in_step()


def test_rings_pass_while_a_collective_runs_on_another_thread() -> None:
    size, me = ringlet.size(), ringlet.rank()
    bell = ringlet.doorbell()
    heard: list[int | None] = []
    listener = threading.Thread(target=lambda: heard.append(
        heard_until(bell, 2)[-1] if me != 0 else bell.wait(0.05)))
    try:
        listener.start()
        data = np.full(1 << 21, float(me + 1), dtype=np.float32)
        handle = ringlet.allreduce_async(data, "sum")
        if me == 0:
            bell.ring(2)  # while the allreduce is queued or running
        result = handle.wait()
        listener.join(120)
        assert not listener.is_alive()
        np.testing.assert_array_equal(result, np.full(1 << 21, size * (size + 1) / 2,
                                                      dtype=np.float32))
        assert heard == ([None] if me == 0 else [2])
    finally:
        bell.close()
    assert in_step()


def test_a_closed_doorbell_refuses() -> None:
    bell = ringlet.doorbell()
    bell.close()
    bell.close()  # closing twice is harmless
    with pytest.raises(ringlet.RingletError, match="doorbell is closed"):
        bell.ring(1)
    with pytest.raises(ringlet.RingletError, match="doorbell is closed"):
        bell.wait(1.0)
    with pytest.raises(TypeError, match="ProcessSet"):
        ringlet.doorbell(3)  # type: ignore[arg-type]
    assert in_step()


def test_shutdown_closes_every_doorbell_and_a_wait_under_way_ends() -> None:
    bell, waiting = ringlet.doorbell(), ringlet.doorbell()
    outcome: list[BaseException | int | None] = []

    def wait() -> None:
        try:
            outcome.append(waiting.wait(120.0))
        except ringlet.RingletError as exc:
            outcome.append(exc)

    listener = threading.Thread(target=wait)
    listener.start()
    ringlet.barrier()
    ringlet.shutdown()
    try:
        listener.join(60)
        assert not listener.is_alive(), "shutdown did not end the wait"
        assert len(outcome) == 1 and isinstance(outcome[0], ringlet.RingletError), outcome
        assert "doorbell is closed" in str(outcome[0])
        with pytest.raises(ringlet.RingletError, match="doorbell is closed"):
            bell.ring(1)
    finally:
        ringlet.init()
    assert in_step()
