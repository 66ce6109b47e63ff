"""init / shutdown / rank / size, and interplay with mpi4py communicators."""

from __future__ import annotations

import numpy as np
import pytest
from mpi4py import MPI

import ringlet

from mpi_fixtures import exact_input, python_progress_during, reference


def test_rank_and_size_match_mpi4py(rank, size):
    assert ringlet.rank() == rank and ringlet.size() == size
    assert ringlet.is_initialized()


def test_mpi4py_initialized_mpi_so_ringlet_does_not_own_it():
    # The test processes import mpi4py first: ringlet must neither re-init nor finalize MPI.
    assert ringlet.owns_mpi() is False
    assert ringlet.thread_level() in ("single", "funneled", "serialized", "multiple")
    assert ringlet.thread_level() == {
        MPI.THREAD_SINGLE: "single",
        MPI.THREAD_FUNNELED: "funneled",
        MPI.THREAD_SERIALIZED: "serialized",
        MPI.THREAD_MULTIPLE: "multiple",
    }[MPI.Query_thread()]


def test_init_twice_is_harmless(rank, size):
    ringlet.init()
    ringlet.init()
    assert ringlet.allreduce(np.ones(3, dtype=np.int32))[0] == size


def test_init_with_an_mpi4py_communicator_duplicates_it(comm, rank, size):
    try:
        ringlet.init(comm)
        ringlet.init(comm)  # the same communicator again: nothing to do
        assert ringlet.rank() == rank and ringlet.size() == size
        # ringlet's traffic runs on its own duplicate: a pending user message is untouched.
        if size > 1:
            request = comm.isend(("user", rank), dest=(rank + 1) % size, tag=0)
        total = ringlet.allreduce(np.full(10, rank, dtype=np.int64), "sum")
        assert (total == size * (size - 1) // 2).all()
        if size > 1:
            assert comm.recv(source=(rank - 1) % size, tag=0) == ("user", (rank - 1) % size)
            request.wait()
    finally:
        ringlet.shutdown()
        ringlet.init()


def test_init_with_a_split_communicator(comm, rank, size):
    color = rank % 2
    sub = comm.Split(color, key=rank)
    try:
        ringlet.init(sub)
        assert ringlet.size() == sub.Get_size() and ringlet.rank() == sub.Get_rank()
        members = [r for r in range(size) if r % 2 == color]
        inputs = {r: exact_input(17, r, (513,), "float32", "sum") for r in members}
        result = ringlet.allreduce(inputs[rank], "sum", algorithm="ring")
        assert result.tobytes() == reference([inputs[r] for r in members], "sum").tobytes()
    finally:
        ringlet.shutdown()
        sub.Free()
        ringlet.init()
    assert ringlet.size() == size


def test_shutdown_then_implicit_init(size):
    ringlet.shutdown()
    assert not ringlet.is_initialized()
    # Every API function initializes on demand.
    assert ringlet.allreduce(np.ones(2, dtype=np.float64))[0] == size
    assert ringlet.is_initialized()


def test_init_rejects_things_that_are_not_communicators():
    with pytest.raises(TypeError, match="mpi4py intra-communicator"):
        ringlet.init(comm="world")
    with pytest.raises(ValueError, match="COMM_NULL"):
        ringlet.init(comm=MPI.COMM_NULL)


def test_barrier_and_mpi_interleave_with_ringlet(comm, size):
    for i in range(20):
        ringlet.barrier()
        native = comm.allreduce(i, op=MPI.SUM)
        ours = ringlet.allreduce(np.array([i], dtype=np.int64))[0]
        assert native == ours == i * size


def test_the_gil_is_released_while_communicating(size):
    """Another Python thread keeps running during a long synchronous allreduce."""
    x = np.ones(16 << 20, dtype=np.float32)  # 64 MiB: tens of milliseconds on 2+ ranks
    ringlet.allreduce(x, out=x, algorithm="ring")  # warm: scratch and pages in place
    during, elapsed = python_progress_during(
        lambda: ringlet.allreduce(x, out=x, algorithm="ring"))
    assert np.all(x == size * size)
    if size > 1 and elapsed > 0.005:
        assert during > 0, f"no Python progress during a {elapsed * 1e3:.1f} ms allreduce"


def test_rank_and_size_answer_while_a_collective_waits_for_this_rank(comm, rank, size):
    """A collective in flight must not hold up a thread that only asks who it is: Horovod's
    API asks for the size before each submission, and here the collective cannot finish until
    rank 0 has asked (the last rank joins only when rank 0 says so, over mpi4py). Asking
    waited for the collective once, and that deadlocked."""
    import threading

    if size == 1:
        pytest.skip("needs a rank that the collective waits for")
    ringlet.allreduce(np.ones(1, np.float32))  # the cost model is in place; every rank here
    last, answers = size - 1, []
    if rank == last:
        comm.recv(source=0, tag=29)
    handle = ringlet.allreduce_async(np.ones(4, np.float32))
    if rank == 0:
        asking = threading.Thread(target=lambda: answers.append((ringlet.rank(), ringlet.size())))
        asking.start()
        asking.join(timeout=20)
        answered_in_time = not asking.is_alive()
        comm.send(None, dest=last, tag=29)  # lets the collective finish, either way
        asking.join()
        assert answered_in_time, "rank() and size() waited for the collective in flight"
        assert answers == [(0, size)]
    assert np.all(handle.wait() == size)


def test_topology_names_every_ranks_host(comm, rank, size):
    topology = ringlet.topology()
    assert list(topology.hosts) == comm.allgather(MPI.Get_processor_name())
    # Nodes as the MPI library groups them, numbered by their lowest rank.
    node_comm = comm.Split_type(MPI.COMM_TYPE_SHARED, key=rank)
    local = (node_comm.rank, node_comm.size)
    leaders = comm.allgather(node_comm.allreduce(rank, op=MPI.MIN))
    node_comm.Free()
    firsts = list(dict.fromkeys(leaders))
    assert list(topology.nodes) == [firsts.index(leader) for leader in leaders]
    assert (topology.local_rank, topology.local_size) == local
    assert (topology.cross_rank, topology.cross_size) == (firsts.index(leaders[rank]),
                                                          len(firsts))
    assert topology.ranks_per_node == tuple(leaders.count(f) for f in firsts)
    consecutive = all(leaders[r] <= leaders[r + 1] for r in range(size - 1))
    assert (topology.placement == "block") == consecutive
    # What it prints: every node and every algorithm.
    text = str(topology)
    assert f"{size} ranks on {len(firsts)} node(s), placement {topology.placement}" in text
    for algorithm in ringlet.ALGORITHMS:
        assert algorithm in topology.tiers and f"    {algorithm}" in text


def test_mpi4py_on_another_mpi_library_is_refused(monkeypatch, comm):
    """A communicator handle of one MPI library is garbage to another: init(comm) checks that
    mpi4py runs on ringlet's MPI before it converts the handle."""
    ours = ringlet.mpi_library()
    other = "MPICH Version: 4.0.2" if "Open MPI" in ours else "Open MPI v4.1.4, package: x"
    monkeypatch.setattr(MPI, "Get_library_version", lambda: other)
    sub = comm.Dup()
    try:
        with pytest.raises(ringlet.RingletError, match=r"mpi4py runs on .* but ringlet on"):
            ringlet.init(sub)
    finally:
        sub.Free()
    monkeypatch.undo()
    assert ringlet.allreduce(np.ones(2), "sum")[0] == comm.Get_size(), "ringlet still works"


@pytest.mark.parametrize("call", ["allreduce", "average_gradients"])
def test_a_threads_first_fast_call_names_it(size, call):
    """The fast paths leave a thread the Python layer has not named yet to the Python layer,
    which names it (the consistency check tells threads apart by their names' hash)."""
    import threading
    import zlib

    from ringlet._runtime import thread_state

    ringlet.allreduce(np.ones(1, np.float32))  # the cost model is in place: the fast path runs
    seen: list[tuple[bool, int | None, float]] = []

    def first_call() -> None:
        x = np.ones(4, np.float32)
        if call == "allreduce":
            ringlet.allreduce(x, "sum", out=x)
        else:
            ringlet.average_gradients([x], op="sum")
        seen.append((getattr(thread_state, "registered", False),
                     getattr(thread_state, "key", None), float(x[0])))

    thread = threading.Thread(target=first_call, name=f"first-{call}")
    thread.start()
    thread.join(timeout=60)
    assert not thread.is_alive(), "the thread's first call hung"
    assert seen == [(True, zlib.crc32(f"first-{call}".encode()), float(size))]
