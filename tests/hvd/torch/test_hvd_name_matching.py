"""ringlet.hvd's name matching (its default; RINGLET_HVD_MATCHING=name): operations matched
across ranks by name, as Horovod's coordinator matches them (python/ringlet/hvd/_negotiation.py).

Each test starts name matching afresh (a new negotiation, ``ringlet.hvd._api.use_matching``, as
``hvd.init()`` makes) and ends it, so that every test starts from the same state. Every result
is compared with NumPy's, computed from every rank's input, which each rank rebuilds."""

from __future__ import annotations

import re
import threading
import time
import zlib
from collections.abc import Iterator

import numpy as np
import pytest
import torch
from mpi4py import MPI

import ringlet
import ringlet.hvd as hvd
import ringlet.hvd.torch as hvd_torch
from ringlet.hvd._api import use_matching
from ringlet.hvd._fusion import dtype_named
from ringlet.hvd._negotiation import (
    _MOST_NAMES,
    _SIT_OUT,
    CYCLE_CALLER,
    Negotiator,
    lane_caller,
)
from ringlet.hvd._state import state


def input_of(rank: int, shape: tuple[int, ...], seed: int = 0,
             dtype: str = "float32") -> np.ndarray:
    return np.random.default_rng([seed, rank]).integers(-50, 50, shape).astype(dtype)


@pytest.fixture(autouse=True)
def name_matching() -> Iterator[None]:
    hvd.init()
    use_matching("name")
    assert state.matching_by_name()
    yield
    # Every rank level first: the first rank to stop negotiating stops it for all (Horovod's
    # shutdown), and would fail another rank's operation still waiting for its next cycle.
    hvd.barrier()
    use_matching("order")
    assert not state.matching_by_name()


def restart_matching(monkeypatch: pytest.MonkeyPatch, variable: str, value: str) -> None:
    """A new negotiation that reads ``variable`` = ``value``."""
    use_matching("order")
    monkeypatch.setenv(variable, value)
    use_matching("name")


def test_ringlets_own_collectives_are_refused_beside_it_and_the_ranks_stay_in_step(
        rank: int, size: int) -> None:
    """A collective of ringlet's own API while ringlet.hvd matches by name would meet the
    negotiation's in another order on another rank and hang; it is refused instead, on the
    calling rank alone (nothing is sent), its buffer untouched, and every collective after it
    runs right: ringlet.hvd's at once, ringlet's own once name matching has stopped."""
    x = np.full(4, rank + 1.0, np.float32)
    calls = [lambda: ringlet.allreduce(x, "sum", out=x), ringlet.barrier,
             lambda: ringlet.average_gradients([x]), lambda: ringlet.allgather_object(rank),
             lambda: ringlet.allreduce_async(x, "sum", out=x)]
    if rank == 0:  # one rank alone: the others go straight on
        calls.append(lambda: ringlet.broadcast(x, 0, out=x))
    for call in calls:
        with pytest.raises(ringlet.RingletError, match=r"refused: ringlet\.hvd matches "
                           r"operations by name .*\(RINGLET_HVD_MATCHING=order\)"):
            call()
        np.testing.assert_array_equal(x, np.full(4, rank + 1.0, np.float32))
    out = hvd.allreduce(x, name="after the refusals", op=hvd.Sum)
    np.testing.assert_array_equal(out, np.full(4, size * (size + 1) / 2, np.float32))
    hvd.barrier()
    use_matching("order")
    assert ringlet.allreduce(x, "sum")[0] == size * (size + 1) / 2
    use_matching("name")


def test_names_submitted_in_different_orders_meet(rank: int, size: int) -> None:
    names = [f"t{i}" for i in range(5)]
    shapes = {name: (3 + i, 2) for i, name in enumerate(names)}
    order = names if rank % 2 == 0 else names[::-1]  # every other rank the other way round
    handles = {n: hvd.allreduce_async(input_of(rank, shapes[n], names.index(n)), name=n,
                                      op=hvd.Sum) for n in order}
    for n in order:
        expected = sum(input_of(r, shapes[n], names.index(n)) for r in range(size))
        np.testing.assert_array_equal(hvd.synchronize(handles[n]), expected)


def test_results_are_bit_identical_to_order_matching(rank: int, size: int) -> None:
    x = np.random.default_rng([7, rank]).standard_normal(10_001).astype(np.float32)
    by_name = hvd.allreduce(x, name="same", op=hvd.Average)
    use_matching("order")
    by_order = hvd.allreduce(x, op=hvd.Average)
    use_matching("name")
    assert by_name.tobytes() == by_order.tobytes()


def test_an_op_waiting_for_a_rank_does_not_block_a_barrier_or_other_ops(rank: int,
                                                                        size: int) -> None:
    """Horovod's duplicate-name tests: rank 0 submits before a barrier, the others after."""
    t = input_of(rank, (17, 3))
    early = None
    if rank == 0:
        early = hvd.allreduce_async(t, name="late", op=hvd.Sum)
        with pytest.raises(ValueError, match="same name as another tensor"):
            hvd.allreduce_async(t, name="late")
    other = hvd.allreduce(t, name="meanwhile", op=hvd.Max)
    np.testing.assert_array_equal(other, np.max([input_of(r, (17, 3)) for r in range(size)], 0))
    hvd.barrier()
    if rank == 0:
        assert early is not None and (size == 1 or not hvd.poll(early))
    # The others submit "late" only once rank 0 has looked (a rank that leaves the barrier
    # first may submit before rank 0 looks, and rightly run it).
    hvd.barrier()
    if rank != 0:
        early = hvd.allreduce_async(t, name="late", op=hvd.Sum)
        with pytest.raises(ValueError, match="same name as another tensor"):
            hvd.allreduce_async(t, name="late")
    np.testing.assert_array_equal(hvd.synchronize(early),
                                  sum(input_of(r, (17, 3)) for r in range(size)))
    hvd.barrier()


def test_different_arguments_under_one_name_fail_on_every_rank(rank: int, size: int) -> None:
    if size == 1:
        pytest.skip("needs two ranks to disagree")
    # Horovod's first words, then the core's naming of ranks ("ranks 1-2 passed ...").
    later = "rank 1" if size == 2 else f"ranks 1-{size - 1}"
    with pytest.raises(ringlet.MismatchError, match=r"Mismatched allreduce tensor shapes .*"
                       rf"rank 0 passed float32\[3\] op=avg; {later} passed float32\[4\] op=avg$"):
        hvd.allreduce(np.ones(3 + min(rank, 1), np.float32), name="shapes")
    with pytest.raises(ringlet.MismatchError, match="Mismatched allreduce data types"):
        hvd.allreduce(np.ones(3, np.float32 if rank == 0 else np.float64), name="dtypes")
    with pytest.raises(ringlet.MismatchError, match="Mismatched broadcast root"):
        hvd.broadcast(np.ones(3, np.float32), root_rank=min(rank, 1), name="roots")
    # A name cached by an earlier run, now passed with other arguments by one rank.
    assert hvd.allreduce(np.ones(2, np.float32), name="cached", op=hvd.Sum)[0] == size
    with pytest.raises(ringlet.MismatchError, match="Mismatched allreduce tensor shapes"):
        hvd.allreduce(np.ones(2 + (rank == 1), np.float32), name="cached", op=hvd.Sum)
    # And the ranks are still in step afterwards.
    assert hvd.allreduce(np.ones(2, np.float32), name="cached", op=hvd.Sum)[0] == size


def test_compressed_allreduces_match_order_matching_bit_for_bit(rank: int, size: int) -> None:
    """fp16 and bf16 on the wire, submitted together (so fused by compressor), give what order
    matching gives; ranks that compress one name differently all raise."""
    x = np.random.default_rng([11, rank]).standard_normal(999).astype(np.float32)
    compressors = {"plain": hvd.Compression.none, "half": hvd.Compression.fp16,
                   "brain": hvd.Compression.bf16}
    handles = {name: hvd.allreduce_async(x, name=name, op=hvd.Average, compression=c)
               for name, c in compressors.items()}
    by_name = {name: hvd.synchronize(h) for name, h in handles.items()}
    use_matching("order")
    by_order = {name: hvd.allreduce(x, op=hvd.Average, compression=c)
                for name, c in compressors.items()}
    use_matching("name")
    for name in compressors:
        assert by_name[name].dtype == np.float32
        assert by_name[name].tobytes() == by_order[name].tobytes(), name
    assert by_name["half"].tobytes() != by_name["plain"].tobytes() or size == 1
    if size > 1:
        with pytest.raises(ringlet.MismatchError, match="Mismatched allreduce"):
            hvd.allreduce(x, name="squeezed", compression=compressors["half" if rank else "brain"])
    assert hvd.allreduce(np.ones(2, np.float32), name="after", op=hvd.Sum)[0] == size


def test_join_takes_part_in_allreduces_and_refuses_gathers(rank: int, size: int) -> None:
    for first in range(size):
        if rank == first:
            last = hvd.join()
        else:
            a = hvd.allreduce_async(input_of(rank, (5,)), name="a", op=hvd.Average)
            b = hvd.allreduce(input_of(rank, (3, 2), 1), name="b", op=hvd.Sum)
            others = [r for r in range(size) if r != first]
            np.testing.assert_allclose(hvd.synchronize(a),
                                       sum(input_of(r, (5,)) for r in others) / size)
            np.testing.assert_array_equal(b, sum(input_of(r, (3, 2), 1) for r in others))
            with pytest.raises(RuntimeError, match=f"rank {first} has joined"):
                hvd.allgather(input_of(rank, (2,)))
            last = hvd.join()
        assert hvd.allgather_object(last) == [last] * size
        assert size == 1 or last != first


def test_process_sets_have_names_of_their_own(rank: int, size: int) -> None:
    if size < 2:
        pytest.skip("needs two process sets")
    evens = hvd.add_process_set(list(range(0, size, 2)))
    odds = hvd.add_process_set(list(range(1, size, 2)))
    try:
        mine = evens if rank % 2 == 0 else odds
        ranks = list(range(rank % 2, size, 2))
        # The same name in both sets, and one set's op submitted before a global one on some
        # ranks, after it on others.
        if rank % 2:
            ours = hvd.allreduce_async(input_of(rank, (4,)), name="x", op=hvd.Sum,
                                       process_set=mine)
        everyone = hvd.allreduce(input_of(rank, (4,)), name="x", op=hvd.Sum)
        if rank % 2 == 0:
            ours = hvd.allreduce_async(input_of(rank, (4,)), name="x", op=hvd.Sum,
                                       process_set=mine)
        np.testing.assert_array_equal(everyone, sum(input_of(r, (4,)) for r in range(size)))
        np.testing.assert_array_equal(hvd.synchronize(ours),
                                      sum(input_of(r, (4,)) for r in ranks))
    finally:
        assert hvd.remove_process_set(odds) and hvd.remove_process_set(evens)


def test_many_small_ops_are_fused_and_every_dtype_is_exact(rank: int, size: int) -> None:
    dtypes = ["float32", "float64", "float16", "bfloat16", "int32", "int64", "int8", "uint8"]
    before = state.negotiator.cycles if state.negotiator else 0
    handles = [(d, i, hvd.allreduce_async(input_of(rank, (i + 1,), i, d if d != "bfloat16"
                                                   else "float32").astype(
        dtype_named(d)), name=f"{d}.{i}", op=hvd.Sum))
        for d in dtypes for i in range(8)]
    for d, i, handle in handles:
        out = hvd.synchronize(handle)
        expected = sum(input_of(r, (i + 1,), i, "float64") for r in range(size))
        assert out.dtype == dtype_named(d)
        np.testing.assert_array_equal(out.astype(np.float64),
                                      expected.astype(out.dtype).astype(np.float64))
    assert state.negotiator is not None and state.negotiator.cycles - before < 64


def test_an_idle_negotiation_runs_no_cycle_until_a_rank_has_work(rank: int, size: int) -> None:
    """While nothing waits, no cycle runs on any rank; an operation of rank 0 alone (a process
    set of one) wakes the others' negotiation threads (the doorbell), though they have nothing
    to do and no caller of theirs runs a cycle."""
    negotiator = state.negotiator
    assert negotiator is not None
    assert negotiator._bell is not None, "this MPI granted no MPI_THREAD_MULTIPLE"
    alone = hvd.add_process_set([0]) if size > 1 else hvd.global_process_set
    try:
        assert hvd.allreduce(np.ones(3, np.float32), name="before", op=hvd.Sum)[0] == size
        time.sleep(0.1)  # the last cycles end
        before = negotiator.cycles
        time.sleep(0.5)
        assert negotiator.cycles == before, "cycles ran while nothing waited"
        if rank == 0:
            out = hvd.allreduce(np.full(3, 7.0, np.float32), name="alone", op=hvd.Sum,
                                process_set=alone)
            np.testing.assert_array_equal(out, np.full(3, 7.0, np.float32))
        else:
            deadline = time.monotonic() + 60
            while negotiator.cycles == before and time.monotonic() < deadline:
                time.sleep(0.01)  # this rank's thread takes part in rank 0's cycles
            assert negotiator.cycles > before, "rank 0's ring did not wake this rank"
    finally:
        hvd.barrier()
        assert size == 1 or hvd.remove_process_set(alone)


def test_the_ranks_are_idle_once_everything_that_waited_has_run(rank: int, size: int,
                                                                comm: MPI.Intracomm) -> None:
    """A cycle that runs every name some rank waits for leaves nothing: the ranks are idle at
    once (no timed cycle after a backward pass's last bucket), and stay so. New names too:
    once the last member has announced them. Each rank looks between two MPI barriers (not
    ringlet's: the negotiation does not see them), so that no rank has submitted the next step
    yet; every rank's findings are gathered before any assertion."""
    negotiator = state.negotiator
    assert negotiator is not None and negotiator._bell is not None
    idle = []
    for step in range(3):
        handles = [hvd.allreduce_async(input_of(rank, (4,), 4 * step + i), name=f"idle.{i}",
                                       op=hvd.Sum) for i in range(4)]
        for i, handle in enumerate(handles):
            np.testing.assert_array_equal(hvd.synchronize(handle), sum(
                input_of(r, (4,), 4 * step + i) for r in range(size)))
        comm.Barrier()
        idle.append(negotiator._idle)
        comm.Barrier()
    before = negotiator.cycles
    time.sleep(0.3)
    quiet = negotiator.cycles == before
    everyone = comm.allgather((idle, quiet))
    assert all(all(steps) for steps, _ in everyone), f"idle after each step: {everyone}"
    assert all(q for _, q in everyone), f"cycles ran after everything had run: {everyone}"


def test_a_rank_waiting_for_others_waits_for_them_in_the_next_cycle(rank: int,
                                                                   size: int) -> None:
    """Rank 0's request waits for the others: rank 0 enters the next cycle at once and waits
    there (chases), where the others' submissions meet it; they, with nothing waiting, do
    not."""
    negotiator = state.negotiator
    assert negotiator is not None
    chased = False
    if rank == 0:
        handle = hvd.allreduce_async(input_of(rank, (3,)), name="late", op=hvd.Sum)
        deadline = time.monotonic() + 0.3
        while not chased and time.monotonic() < deadline:
            chased = negotiator._chasing
            time.sleep(0.001)
    else:
        time.sleep(0.35)
        assert not negotiator._chasing
        handle = hvd.allreduce_async(input_of(rank, (3,)), name="late", op=hvd.Sum)
    np.testing.assert_array_equal(hvd.synchronize(handle),
                                  sum(input_of(r, (3,)) for r in range(size)))
    assert chased == (rank == 0 and size > 1)


def test_ranks_that_wait_for_each_other_do_not_cycle_without_pause(rank: int,
                                                                   size: int) -> None:
    """Each rank first submits a name no other rank has yet: every rank waits for another, so
    chasing would cycle back to back; they fall back to timed cycles (one per
    RINGLET_HVD_CYCLE_TIME, 1 ms) until the others' names come."""
    negotiator = state.negotiator
    assert negotiator is not None
    names = [f"cross.{r}" for r in range(size)]
    mine = names[rank:] + names[:rank]
    handles = {mine[0]: hvd.allreduce_async(input_of(rank, (2,)), name=mine[0], op=hvd.Sum)}
    time.sleep(0.05)  # the first cycles find every rank waiting for another
    before = negotiator.cycles
    time.sleep(0.3)
    cycles = negotiator.cycles - before
    handles.update({name: hvd.allreduce_async(input_of(rank, (2,)), name=name, op=hvd.Sum)
                    for name in mine[1:]})
    for handle in handles.values():
        np.testing.assert_array_equal(hvd.synchronize(handle),
                                      sum(input_of(r, (2,)) for r in range(size)))
    # Timed: about 300 in 0.3 s (fewer under load); back to back, thousands.
    assert cycles < 1000, cycles


def _idle_with_cached(names: list[str], shape: tuple[int, ...]) -> Negotiator:
    """Run each name once (cached from now on), then two barriers: in the second's cycle every
    rank waits for that one cached name alone, so every rank is idle after it. Every rank
    looks in an MPI allgather (not ringlet's: the negotiation does not see it), before any
    rank submits again: a rank that went on first would make the others' negotiation busy
    with its next call, and fail them alone."""
    negotiator = state.negotiator
    assert negotiator is not None and negotiator._bell is not None
    for name in names:
        hvd.allreduce(np.zeros(shape, np.float32), name=name, op=hvd.Sum)
    hvd.barrier()
    hvd.barrier()
    idle = MPI.COMM_WORLD.allgather(negotiator._idle)
    assert all(idle), f"idle on each rank after the barriers: {idle}"
    return negotiator


def test_a_lone_named_allreduce_runs_without_a_cycle(rank: int, size: int) -> None:
    """While the ranks are idle, a synchronous allreduce of a cached name is its own cycle
    (``Negotiator.run_alone``), right on every rank."""
    negotiator = _idle_with_cached(["lone"], (5, 3))
    before, cycles = negotiator.ran_alone, negotiator.cycles
    for step in range(20):
        out = hvd.allreduce(input_of(rank, (5, 3), step), name="lone", op=hvd.Sum)
        np.testing.assert_array_equal(out, sum(input_of(r, (5, 3), step) for r in range(size)))
    # The thread's 1-s look at the doorbell may take a call's turn now and then.
    assert negotiator.ran_alone - before >= 15, (negotiator.ran_alone - before)
    assert negotiator.cycles - cycles <= 20 + 2 * 5


def test_lone_allreduces_of_two_names_never_pair_up(rank: int, size: int) -> None:
    """Two threads per rank each run a cached name alone, "a" first on even ranks and "b"
    first on odd ones: the lone calls of "a" and "b" meet, the check refuses to pair them
    (their slots differ), and both names then run in a cycle, each with its own data."""
    _idle_with_cached(["a", "b"], (4,))
    errors: list[BaseException] = []

    def call(name: str, step: int, delay: float) -> None:
        try:
            time.sleep(delay)
            seed = 1000 * step + (name == "b")
            out = hvd.allreduce(input_of(rank, (4,), seed), name=name, op=hvd.Sum)
            np.testing.assert_array_equal(out, sum(input_of(r, (4,), seed)
                                                   for r in range(size)))
        except BaseException as exc:  # reported by the test's thread
            errors.append(exc)

    first, second = ("a", "b") if rank % 2 == 0 else ("b", "a")
    for step in range(10):
        threads = [threading.Thread(target=call, args=(first, step, 0.0)),
                   threading.Thread(target=call, args=(second, step, 0.02))]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=60)
        assert not errors, errors
        assert not any(thread.is_alive() for thread in threads), "a call hangs"


def test_a_lone_allreduce_meets_another_ranks_cycle(rank: int, size: int) -> None:
    """Rank 0 runs "x" alone; every other rank first submits "y" asynchronously (a cycle:
    its lone call of "x" must give way) and only then calls "x"; rank 0 then calls "y". Both
    names run right, on every rank, and no rank waits forever."""
    _idle_with_cached(["x", "y"], (6,))
    for step in range(5):
        def data(name: str, of: int, step: int = step) -> np.ndarray:
            return input_of(of, (6,), 100 * step + (name == "y"))

        expected = {n: sum(data(n, r) for r in range(size)) for n in ("x", "y")}
        if rank == 0:
            x = hvd.allreduce(data("x", rank), name="x", op=hvd.Sum)
            y = hvd.allreduce(data("y", rank), name="y", op=hvd.Sum)
        else:
            time.sleep(0.02)  # rank 0 waits alone by now
            handle = hvd.allreduce_async(data("y", rank), name="y", op=hvd.Sum)
            x = hvd.allreduce(data("x", rank), name="x", op=hvd.Sum)
            y = hvd.synchronize(handle)
        np.testing.assert_array_equal(x, expected["x"])
        np.testing.assert_array_equal(y, expected["y"])


def test_an_asynchronous_allreduce_of_a_cached_name_starts_without_a_cycle(
        rank: int, size: int) -> None:
    """While the ranks are idle, an asynchronous allreduce of a cached name (a training step's
    bucket) starts at once on every rank, as one matched by order does: it pairs up with the
    other ranks' without a cycle, in place and right."""
    negotiator = _idle_with_cached(["bucket"], (64, 33))
    before, cycles = negotiator.ran_alone, negotiator.cycles
    for step in range(20):
        data = input_of(rank, (64, 33), step)
        handle = hvd.grouped_allreduce_async_([data], name="bucket", op=hvd.Sum)
        while not hvd.poll(handle):
            time.sleep(0.0005)
        assert hvd.synchronize(handle)[0] is data
        np.testing.assert_array_equal(data, sum(input_of(r, (64, 33), step)
                                                for r in range(size)))
    # The thread's 1-s look at the doorbell may take a call's turn now and then.
    assert negotiator.ran_alone - before >= 15, (negotiator.ran_alone - before)
    assert negotiator.cycles - cycles <= 2 * 5


def test_an_asynchronous_lone_allreduce_gives_way_to_another_ranks_cycle(
        rank: int, size: int, comm: MPI.Intracomm) -> None:
    """Rank 0 starts "x" alone, then "y" (a second lone run may not start while the first is
    unsettled: the others' vector, sent again, must meet rank 0's cycle), and only then do the
    others submit a new name (a cycle, whose vector meets rank 0's lone run of "x"), then "x"
    and "y". Rank 0's "x" gives way and runs in a cycle; every name is right on every rank. A
    name whose lone run gave way sits out its next calls, so each step has its own "x"."""
    if size == 1:
        pytest.skip("needs another rank's cycle")
    _idle_with_cached([f"x.{step}" for step in range(4)] + ["y"], (6,))
    gave_way = 0
    for step in range(4):
        def data(name: str, of: int, step: int = step) -> np.ndarray:
            return input_of(of, (6,), 100 * step + ord(name[0]))

        names = [f"x.{step}", "y", f"fresh.{step}"]
        if rank == 0:
            handles = {n: hvd.allreduce_async(data(n, rank), name=n, op=hvd.Sum)
                       for n in names[:2]}
            lone = handles[names[0]].request.lone is not None
            assert not handles["y"].request.lone, "two lone runs at once"
            comm.Barrier()  # the others submit only once rank 0's lone run is under way
            handles[names[2]] = hvd.allreduce_async(data(names[2], rank), name=names[2],
                                                    op=hvd.Sum)
        else:
            lone = False
            comm.Barrier()
            handles = {n: hvd.allreduce_async(data(n, rank), name=n, op=hvd.Sum)
                       for n in reversed(names)}
        for name, handle in handles.items():
            while not hvd.poll(handle):
                time.sleep(0.0005)
            np.testing.assert_array_equal(hvd.synchronize(handle),
                                          sum(data(name, r) for r in range(size)))
        # The lone run (which its thread's look at the doorbell may forestall now and then)
        # gave way: its request ran in a cycle.
        gave_way += lone and handles[names[0]].request.lone is None
        hvd.barrier()
        hvd.barrier()  # idle again: the next step's "x" may run alone
    assert comm.allgather(gave_way)[0] >= 3, "rank 0's lone x did not give way"


def test_a_group_of_two_dtypes_never_runs_alone(rank: int, size: int,
                                                comm: MPI.Intracomm) -> None:
    """A grouped allreduce of two dtypes is two collectives: alone, the second would meet the
    vector another rank's cycle sends again after the first gave way. So it is submitted as
    usual, and runs right beside another rank's cycle."""
    shapes = [(5,), (3,)]
    dtypes = ["float32", "int64"]

    def group(of: int, step: int) -> list[np.ndarray]:
        return [input_of(of, shape, 10 * step + i, dtype)
                for i, (shape, dtype) in enumerate(zip(shapes, dtypes))]

    negotiator = _idle_with_cached([], (1,))
    mine = group(rank, 0)
    hvd.grouped_allreduce(mine, name="mixed", op=hvd.Sum)  # cached from now on
    hvd.barrier()
    hvd.barrier()
    for step in range(1, 4):
        if rank == 0:
            handle = hvd.grouped_allreduce_async(group(rank, step), name="mixed", op=hvd.Sum)
            assert handle.request.lone is None, "a group of two dtypes ran alone"
            comm.Barrier()
            fresh = hvd.allreduce_async(input_of(rank, (2,), step), name=f"fresh.{step}",
                                        op=hvd.Sum)
        else:
            comm.Barrier()
            fresh = hvd.allreduce_async(input_of(rank, (2,), step), name=f"fresh.{step}",
                                        op=hvd.Sum)
            handle = hvd.grouped_allreduce_async(group(rank, step), name="mixed", op=hvd.Sum)
        for out, dtype, want in zip(hvd.synchronize(handle), dtypes,
                                    map(sum, zip(*(group(r, step) for r in range(size))))):
            assert out.dtype == np.dtype(dtype)
            np.testing.assert_array_equal(out, want)
        np.testing.assert_array_equal(hvd.synchronize(fresh),
                                      sum(input_of(r, (2,), step) for r in range(size)))
        hvd.barrier()
        hvd.barrier()
    assert negotiator.failure is None


def test_a_name_whose_lone_run_gave_way_sits_out_its_next_calls(rank: int, size: int) -> None:
    """In a burst submitted in different orders on different ranks, every first call's lone
    run would meet another name's and give way: a name that gave way is submitted as usual for
    its next calls, then tries alone again."""
    _idle_with_cached(["a", "b"], (4,))
    first = "a" if rank % 2 == 0 else "b"
    tried = []
    for step in range(2 * _SIT_OUT + 4):
        handle = hvd.allreduce_async(input_of(rank, (4,), step), name=first, op=hvd.Sum)
        tried.append(handle.request.lone is not None)
        other = hvd.allreduce_async(input_of(rank, (4,), step), name="b" if first == "a"
                                    else "a", op=hvd.Sum)
        for h in (handle, other):
            np.testing.assert_array_equal(hvd.synchronize(h),
                                          sum(input_of(r, (4,), step) for r in range(size)))
        hvd.barrier()
        hvd.barrier()
    # Each try gave way, so at least _SIT_OUT calls sat out before the next one (a call made
    # while the ranks are not idle, now and then under oversubscription, counts for nothing).
    # One rank alone never gives way: it tries every time.
    tries = [step for step, alone in enumerate(tried) if alone]
    gaps = [b - a for a, b in zip(tries, tries[1:])]
    assert len(tries) >= 2 and all(gap > _SIT_OUT or size == 1 for gap in gaps), tried


def test_asynchronous_lone_allreduces_submitted_in_other_orders_never_pair_up(
        rank: int, size: int) -> None:
    """Even ranks start "a" alone, odd ranks "b": the lone runs meet, the check refuses to
    pair them, both give way, and both names run in a cycle with their own data."""
    _idle_with_cached(["a", "b"], (4,))
    first, second = ("a", "b") if rank % 2 == 0 else ("b", "a")
    for step in range(5):
        seeds = {"a": 1000 * step, "b": 1000 * step + 1}
        handles = {n: hvd.allreduce_async(input_of(rank, (4,), seeds[n]), name=n, op=hvd.Sum)
                   for n in (first, second)}
        for name in ("a", "b"):
            np.testing.assert_array_equal(
                hvd.synchronize(handles[name]),
                sum(input_of(r, (4,), seeds[name]) for r in range(size)))
        hvd.barrier()
        hvd.barrier()


def test_without_the_consistency_check_every_allreduce_runs_in_a_cycle(
        rank: int, size: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """RINGLET_CHECK=0: nothing would tell a lone call from another rank's cycle, so none
    skips the cycle."""
    settings = ringlet.settings()
    monkeypatch.setattr(ringlet, "settings", lambda: {**settings, "consistency_check": False})
    use_matching("order")
    use_matching("name")
    negotiator = _idle_with_cached(["lone"], (2,))
    for step in range(5):
        out = hvd.allreduce(input_of(rank, (2,), step), name="lone", op=hvd.Sum)
        np.testing.assert_array_equal(out, sum(input_of(r, (2,), step) for r in range(size)))
    assert negotiator.ran_alone == 0


def test_the_lone_calls_of_different_slots_have_different_keys() -> None:
    """The consistency check keys a caller by the CRC-32 of its name (ringlet.as_caller): the
    largest cache's slots must not share one, or two names could pair up."""
    keys = {zlib.crc32(f"caller:{lane_caller(slot)}".encode()) for slot in range(_MOST_NAMES)}
    assert len(keys) == _MOST_NAMES
    assert zlib.crc32(f"caller:{CYCLE_CALLER}".encode()) not in keys


def test_a_cache_past_the_largest_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(ValueError, match="RINGLET_HVD_CACHE_CAPACITY=1000001 is more than "
                                         "1000000 names"):
        restart_matching(monkeypatch, "RINGLET_HVD_CACHE_CAPACITY", str(_MOST_NAMES + 1))
    monkeypatch.delenv("RINGLET_HVD_CACHE_CAPACITY")
    use_matching("name")


def test_a_small_cache_evicts_and_names_still_meet(rank: int, size: int,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    restart_matching(monkeypatch, "RINGLET_HVD_CACHE_CAPACITY", "3")
    for round_ in range(3):
        names = [f"n{i}" for i in range(6)]
        order = names if (rank + round_) % 2 == 0 else names[::-1]
        handles = {n: hvd.allreduce_async(np.full(2, names.index(n) + round_, np.float32),
                                          name=n, op=hvd.Sum) for n in order}
        for n in order:
            assert hvd.synchronize(handles[n])[0] == size * (names.index(n) + round_)
    assert state.negotiator is not None and len(state.negotiator._cache) <= 3


def test_a_name_evicted_in_the_cycle_it_runs_does_not_run_again(rank: int, size: int,
                                                                monkeypatch: pytest.MonkeyPatch
                                                                ) -> None:
    """A cache of one name. "b" is cached and "a" is not, both submitted before one cycle:
    "b" runs by its bit, "a" from the table, and caching "a" evicts "b". Had "b" been announced
    again as a name still waiting, it would run a second time, meeting the last rank's next
    "b" (submitted late) with zeros from the other ranks (seen in CI: a rank got its own value
    back)."""
    restart_matching(monkeypatch, "RINGLET_HVD_CACHE_CAPACITY", "1")
    for name in ("a", "b"):  # each runs once; "b" evicts "a"
        assert hvd.allreduce(np.ones(2, np.float32), name=name, op=hvd.Sum)[0] == size
    negotiator = state.negotiator
    assert negotiator is not None
    with negotiator._cycling:  # no cycle of this rank's until both are submitted
        handles = [hvd.allreduce_async(np.ones(2, np.float32), name=name, op=hvd.Sum)
                   for name in ("b", "a")]
    assert [hvd.synchronize(h)[0] for h in handles] == [size, size]
    if rank == size - 1:
        time.sleep(0.5)  # several cycles, in which a leftover "b" would run
    late = hvd.allreduce_async(np.full(2, rank + 1, np.float32), name="b", op=hvd.Sum)
    assert hvd.synchronize(late)[0] == size * (size + 1) // 2
    # (Other ranks may already have announced the fixture's barrier.)
    assert not [r for r in negotiator._unannounced if r.key[1] in ("a", "b")]
    assert not [key for key in negotiator._table if key[1] in ("a", "b")]


def _stall_of_rank_0(rank: int) -> None:
    """Rank 0 submits "stalled"; the others submit it only after 1 s."""
    handle = hvd.allreduce_async(np.ones(3, np.float32), name="stalled") if rank == 0 else None
    hvd.barrier()
    time.sleep(1.0)
    hvd.barrier()
    if rank != 0:
        handle = hvd.allreduce_async(np.ones(3, np.float32), name="stalled")
    assert handle is not None and hvd.synchronize(handle)[0] == 1.0


def test_a_stall_is_reported_in_the_core_format_after_the_core_variable(
        rank: int, size: int, monkeypatch: pytest.MonkeyPatch,
        capfd: pytest.CaptureFixture[str]) -> None:
    """RINGLET_STALL_WARNING, the core's variable, and the core's two messages
    (src/runtime/stall.rs; tests/failures/test_failures.py checks the core's own): the waiting
    rank says what it waits in and for whom, rank 0 names the ranks missing."""
    if size == 1:
        pytest.skip("needs a rank to be missing")
    monkeypatch.delenv("RINGLET_HVD_STALL_SECONDS", raising=False)
    restart_matching(monkeypatch, "RINGLET_STALL_WARNING", "0.3")
    capfd.readouterr()
    _stall_of_rank_0(rank)
    err = capfd.readouterr().err
    if rank == 0:
        missing = ", ".join(map(str, range(1, size)))
        assert re.search(r"^ringlet: rank 0 has waited \d+ s in allreduce 'stalled' for rank 1, "
                         r"which has not joined it \(or is itself waiting\); "
                         r"RINGLET_STALL_WARNING=0\.3$", err, re.M), err
        assert re.search(rf"^ringlet: allreduce 'stalled' has waited \d+ s: rank\(s\) {missing} "
                         r"have not joined it \(every other rank reports waiting\)$", err,
                         re.M), err
        assert err.count("ringlet:") == 2, err  # once per stall, as the core's
    else:
        assert "ringlet:" not in err, err  # they were not waiting


def test_the_retired_variable_warns_and_no_longer_sets_the_delay(
        rank: int, size: int, monkeypatch: pytest.MonkeyPatch,
        capfd: pytest.CaptureFixture[str]) -> None:
    if size == 1:
        pytest.skip("needs a rank to be missing")
    monkeypatch.delenv("RINGLET_STALL_WARNING", raising=False)  # the core's default: 60 s
    with pytest.warns(FutureWarning, match="RINGLET_HVD_STALL_SECONDS is no longer read"):
        restart_matching(monkeypatch, "RINGLET_HVD_STALL_SECONDS", "0.3")
    capfd.readouterr()
    _stall_of_rank_0(rank)
    assert "has waited" not in capfd.readouterr().err


def test_the_stall_warning_is_read_as_the_core_reads_it(monkeypatch: pytest.MonkeyPatch) -> None:
    from ringlet.hvd._reports import stall_warning_from_environment

    monkeypatch.delenv("RINGLET_HVD_STALL_SECONDS", raising=False)
    monkeypatch.delenv("RINGLET_STALL_WARNING", raising=False)
    assert stall_warning_from_environment() == 60.0
    for text, seconds in (("2.5", 2.5), (" 7 ", 7.0), ("0", None), ("-1", None)):
        monkeypatch.setenv("RINGLET_STALL_WARNING", text)
        assert stall_warning_from_environment() == seconds, text
    for text in ("soon", "", "inf", "nan"):
        monkeypatch.setenv("RINGLET_STALL_WARNING", text)
        with pytest.raises(ValueError, match="is not a number of seconds"):
            stall_warning_from_environment()


def test_shutdown_with_an_op_pending_fails_it_on_every_rank(rank: int, size: int) -> None:
    if size == 1:
        pytest.skip("needs a rank that never submits")
    handle = hvd.allreduce_async(np.ones(3, np.float32), name="never") if rank == 0 else None
    hvd.barrier()
    use_matching("order")  # what hvd.shutdown() does first
    use_matching("name")
    if handle is not None:
        with pytest.raises(ringlet.RingletError, match="shut down"):
            hvd.synchronize(handle)


def test_the_setting_is_checked(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RINGLET_HVD_MATCHING", "names")
    with pytest.raises(ValueError, match="RINGLET_HVD_MATCHING='names'; accepted: order or name"):
        hvd.init()
    monkeypatch.setenv("RINGLET_HVD_MATCHING", "name")
    hvd.init()
    assert state.matching_by_name()
    with pytest.raises(ValueError, match="matching is 'name' or 'order'"):
        use_matching("names")


def test_name_matching_is_the_default_and_order_one_setting_away(
        monkeypatch: pytest.MonkeyPatch) -> None:
    use_matching("order")
    monkeypatch.delenv("RINGLET_HVD_MATCHING", raising=False)
    hvd.init()
    assert state.matching_by_name()
    use_matching("order")
    monkeypatch.setenv("RINGLET_HVD_MATCHING", "order")
    hvd.init()
    assert not state.matching_by_name()
    monkeypatch.setenv("RINGLET_HVD_MATCHING", "name")
    hvd.init()
    assert state.matching_by_name()


# Slow (40 s): many training steps under both matchings; the other tests here cover the
# negotiation itself.
@pytest.mark.slow
def test_distributed_optimizer_steps_as_with_order_matching(rank: int, size: int) -> None:
    """The torch optimizer's buckets are named: the same weights as order matching's."""
    def train() -> list[torch.Tensor]:
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(6, 5), torch.nn.Tanh(), torch.nn.Linear(5, 2))
        optimizer = hvd_torch.DistributedOptimizer(
            torch.optim.SGD(model.parameters(), lr=0.1),
            named_parameters=model.named_parameters())
        for step in range(3):
            data = torch.from_numpy(input_of(rank, (4, 6), step)) / 50
            optimizer.zero_grad()
            model(data).square().sum().backward()
            optimizer.step()
        return [p.detach().clone() for p in model.parameters()]

    by_name = train()
    use_matching("order")
    by_order = train()
    use_matching("name")
    assert all(torch.equal(a, b) for a, b in zip(by_name, by_order))
    alone = train_without_averaging()  # (one rank's average is its own gradient)
    assert all(torch.equal(a, b) for a, b in zip(by_name, alone)) == (size == 1)


def train_without_averaging() -> list[torch.Tensor]:
    """The same model trained on this rank's data alone (what averaging must change)."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(6, 5), torch.nn.Tanh(), torch.nn.Linear(5, 2))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for step in range(3):
        data = torch.from_numpy(input_of(hvd.rank(), (4, 6), step)) / 50
        optimizer.zero_grad()
        model(data).square().sum().backward()
        optimizer.step()
    return [p.detach().clone() for p in model.parameters()]
