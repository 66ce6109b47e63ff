"""ringlet.hvd.torch's process sets, join, and the gradients and integer scaling of
reducescatter, against references computed here from every rank's (reproducible) input.
The sets are the even and the odd ranks, as in Horovod's own tests."""

from __future__ import annotations

import time
from collections.abc import Iterator

import numpy as np
import pytest
import torch

import ringlet
import ringlet.hvd.torch as hvd

pytestmark = pytest.mark.usefixtures("hvd_initialized")  # tests/hvd/conftest.py


def input_of(rank: int, shape: tuple[int, ...], seed: int = 0) -> torch.Tensor:
    generator = torch.Generator().manual_seed(1000 * seed + rank)
    return torch.randint(-50, 50, shape, generator=generator).double()


@pytest.fixture
def my_set() -> Iterator[tuple[hvd.ProcessSet, list[int]]]:
    size, rank = hvd.size(), hvd.rank()
    if size == 1:  # the only set is the global one, which exists already
        with pytest.raises(ValueError, match="Attempted to add a duplicate process set"):
            hvd.add_process_set([0])
        yield hvd.global_process_set, [0]
        return
    even = hvd.add_process_set(list(range(0, size, 2)))
    odd = hvd.add_process_set(list(range(1, size, 2)))
    yield (even if rank % 2 == 0 else odd), list(range(rank % 2, size, 2))
    assert hvd.remove_process_set(odd)
    assert hvd.remove_process_set(even)
    assert not hvd.remove_process_set(even)
    assert hvd.allreduce(torch.ones(1), op=hvd.Sum).item() == size  # all in step


def test_process_sets_are_horovods(my_set: tuple[hvd.ProcessSet, list[int]]) -> None:
    mine, ranks = my_set
    assert mine.ranks == ranks and mine.size() == len(ranks)
    assert mine.rank() == ranks.index(hvd.rank()) and mine.included()
    assert mine.process_set_id not in (None, 0) or hvd.size() == 1
    assert hvd.global_process_set.process_set_id == 0
    assert hvd.global_process_set.ranks == list(range(hvd.size()))
    with pytest.raises(ValueError, match="Attempted to add a duplicate process set"):
        hvd.add_process_set(list(ranks_of_all_even()))
    assert not hvd.remove_process_set(hvd.global_process_set)


def ranks_of_all_even() -> list[int]:
    return list(range(0, hvd.size(), 2))


def test_collectives_in_a_set_use_its_members_only(
    my_set: tuple[hvd.ProcessSet, list[int]]
) -> None:
    mine, ranks = my_set
    inputs = [input_of(r, (6, 3)) for r in ranks]
    x = inputs[mine.rank()]
    torch.testing.assert_close(hvd.allreduce(x, op=hvd.Sum, process_set=mine), sum(inputs))
    torch.testing.assert_close(hvd.allreduce(x, process_set=mine), sum(inputs) / len(ranks))
    grouped = hvd.grouped_allreduce([x, 2 * x], op=hvd.Sum, process_set=mine)
    torch.testing.assert_close(grouped[1], 2 * sum(inputs))
    torch.testing.assert_close(hvd.allgather(x, process_set=mine), torch.cat(inputs))
    root = ranks[-1]
    torch.testing.assert_close(hvd.broadcast(x, root, process_set=mine), inputs[-1])
    assert hvd.broadcast_object(hvd.rank(), root, process_set=mine) == root
    assert hvd.allgather_object(hvd.rank(), process_set=mine) == ranks
    rows = np.array_split(np.arange(6), len(ranks))[mine.rank()]
    torch.testing.assert_close(hvd.reducescatter(x, op=hvd.Sum, process_set=mine),
                               sum(inputs)[rows[0]:rows[-1] + 1] if len(rows) else x[:0])
    sent = torch.arange(len(ranks) * 2).double() + 100 * hvd.rank()
    received = hvd.alltoall(sent, process_set=mine)
    expected = torch.cat([torch.arange(2).double() + 2 * mine.rank() + 100 * r for r in ranks])
    torch.testing.assert_close(received, expected)
    hvd.barrier(process_set=mine)


def test_gradients_in_a_set(my_set: tuple[hvd.ProcessSet, list[int]]) -> None:
    mine, ranks = my_set
    x = input_of(hvd.rank(), (4, 2)).requires_grad_()
    hvd.allreduce(x, op=hvd.Sum, process_set=mine).sum().backward()
    torch.testing.assert_close(x.grad, torch.full((4, 2), float(len(ranks)), dtype=torch.double))
    x.grad = None
    gathered = hvd.allgather(x, process_set=mine)
    (gathered * torch.arange(gathered.shape[0]).double()[:, None]).sum().backward()
    me = mine.rank()
    torch.testing.assert_close(
        x.grad, torch.arange(4 * me, 4 * me + 4).double()[:, None].expand(4, 2))


def test_distributed_optimizer_in_a_set_averages_over_its_members(
    my_set: tuple[hvd.ProcessSet, list[int]]
) -> None:
    mine, ranks = my_set
    torch.manual_seed(0)
    model = torch.nn.Linear(3, 2)
    optimizer = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=1.0),
                                         named_parameters=model.named_parameters(),
                                         process_set=mine)
    start = [p.detach().clone() for p in model.parameters()]
    model(input_of(hvd.rank(), (5, 3)).float()).sum().backward()
    optimizer.step()
    # The gradient of sum(W x + b) is (sum of x rows, repeated) and the row count.
    mean_x = sum(input_of(r, (5, 3)).float().sum(0) for r in ranks) / len(ranks)
    weight, bias = model.parameters()
    torch.testing.assert_close(weight, start[0] - mean_x.expand(2, 3))
    torch.testing.assert_close(bias, start[1] - 5.0)


@pytest.mark.parametrize("op", ["sum", "average"])
def test_join_adds_zeros_to_the_others_allreduces(op: str) -> None:
    size, rank = hvd.size(), hvd.rank()
    hvd_op = hvd.Sum if op == "sum" else hvd.Average
    for first in range(size):
        if rank == first:
            last = hvd.join()
        else:
            a = hvd.allreduce_async(input_of(rank, (5,)), op=hvd_op)
            b = hvd.allreduce(input_of(rank, (17, 2), seed=1), op=hvd_op)
            others = [r for r in range(size) if r != first]
            expected_a = sum(input_of(r, (5,)) for r in others)
            expected_b = sum(input_of(r, (17, 2), seed=1) for r in others)
            if op == "average":
                expected_a, expected_b = expected_a / size, expected_b / size
            torch.testing.assert_close(hvd.synchronize(a), expected_a)
            torch.testing.assert_close(b, expected_b)
            last = hvd.join()
        assert hvd.allgather_object(last) == [last] * size
        assert size == 1 or last != first


def test_a_gather_while_a_rank_has_joined_raises_a_runtime_error_on_the_others() -> None:
    size, rank = hvd.size(), hvd.rank()
    if rank == 0:
        hvd.join()
    else:
        with pytest.raises(RuntimeError, match="rank 0 has joined"):
            hvd.allgather(torch.ones(3))
        hvd.join()
    assert hvd.allreduce(torch.ones(1), op=hvd.Sum).item() == size


@pytest.mark.parametrize("dtype", [torch.int32, torch.int64])
def test_reducescatter_scales_integers_in_float64(dtype: torch.dtype) -> None:
    size, rank = hvd.size(), hvd.rank()
    inputs = [input_of(r, (2 * size, 3)).to(dtype) for r in range(size)]
    rows = np.array_split(np.arange(2 * size), size)[rank]
    mine = slice(rows[0], rows[-1] + 1)
    for op in (hvd.Sum, hvd.Average):
        out = hvd.reducescatter(inputs[rank], op=op, prescale_factor=1.5, postscale_factor=0.5)
        scaled = sum(torch.trunc(i.double() * 1.5) for i in inputs)
        post = 0.5 / (size if op == hvd.Average else 1)
        assert out.dtype == dtype
        torch.testing.assert_close(out, torch.trunc(scaled * post).to(dtype)[mine])
        grouped = hvd.grouped_reducescatter([inputs[rank]], op=op, prescale_factor=1.5,
                                            postscale_factor=0.5)
        torch.testing.assert_close(grouped[0], out)


@pytest.mark.parametrize("op", ["sum", "average"])
def test_reducescatter_gradients_follow_horovods_rule(op: str) -> None:
    size = hvd.size()
    hvd_op = hvd.Sum if op == "sum" else hvd.Average
    x = torch.ones(2 * size, 3, dtype=torch.double, requires_grad=True)
    out = hvd.reducescatter(x, op=hvd_op, prescale_factor=2.0)
    out.backward(torch.ones_like(out))
    factor = 2.0 * (size if op == "sum" else 1)
    torch.testing.assert_close(x.grad, torch.full_like(x, factor))
    y = torch.ones(size, 2, dtype=torch.double, requires_grad=True)
    outs = hvd.grouped_reducescatter([x, y], op=hvd_op)
    sum(o.sum() for o in outs).backward()
    torch.testing.assert_close(y.grad, torch.full_like(y, size if op == "sum" else 1.0))


def test_grouped_allgather_gradients() -> None:
    size, rank = hvd.size(), hvd.rank()
    a = torch.ones(rank + 1, 2, dtype=torch.double, requires_grad=True)
    b = torch.ones(2, dtype=torch.double, requires_grad=True)
    ga, gb = hvd.grouped_allgather([a, b])
    assert ga.shape[0] == size * (size + 1) // 2 and gb.shape[0] == 2 * size
    weights = torch.arange(ga.shape[0]).double()
    ((ga * weights[:, None]).sum() + gb.sum()).backward()
    start = rank * (rank + 1) // 2
    torch.testing.assert_close(a.grad, weights[start:start + rank + 1, None].expand(rank + 1, 2))
    torch.testing.assert_close(b.grad, torch.ones(2, dtype=torch.double))



def test_a_name_still_in_flight_is_refused_locally_before_anything_is_sent() -> None:
    """Horovod's duplicate-name rule. Rank 0's first allreduce stays in flight until the last
    rank submits its own, which it does only when rank 0 says so (over MPI_COMM_WORLD, outside
    ringlet), so rank 0's second of the same name must be refused; a name whose operation has
    finished may be used again. (Timing it with a sleep raced on a loaded machine: rank 0,
    late, found the first already done, and its extra op left the ranks out of step.)"""
    from mpi4py import MPI

    size, rank = hvd.size(), hvd.rank()
    assert size == MPI.COMM_WORLD.size  # hvd's ranks are the world's here
    last, x = size - 1, torch.ones(5)
    hvd.allreduce(x)  # a first call installs the cost model, which needs every rank
    if rank == last and size > 1:
        MPI.COMM_WORLD.recv(source=0, tag=28)
    first = hvd.allreduce_async(x, name="dup", op=hvd.Sum)
    if rank == 0 and size > 1:
        try:
            with pytest.raises(ValueError, match="same name as another tensor that is currently"):
                hvd.allreduce_async(x, name="dup", op=hvd.Sum)
            with pytest.raises(ValueError, match="same name"):
                hvd.allreduce_async_(x.clone(), name="dup", op=hvd.Sum)
        finally:
            MPI.COMM_WORLD.send(None, dest=last, tag=28)
    torch.testing.assert_close(hvd.synchronize(first), torch.full((5,), float(size)))
    again = hvd.allreduce_async(x, name="dup", op=hvd.Sum)  # finished: the name is free
    other = hvd.broadcast_async(x, 0, name="dup")  # another collective, another namespace
    torch.testing.assert_close(hvd.synchronize(again), torch.full((5,), float(size)))
    torch.testing.assert_close(hvd.synchronize(other), x)


def test_a_name_is_taken_until_its_handle_is_synchronized_not_until_it_finishes() -> None:
    """Whether a name is refused does not depend on how fast its operation ran: it is free
    again once its handle is synchronized (every rank refuses alike, so they stay in step)."""
    x, size = torch.ones(3), hvd.size()
    first = hvd.allreduce_async(x, name="held", op=hvd.Sum)
    while not hvd.poll(first):  # finished on this rank, not yet synchronized
        time.sleep(0.001)
    with pytest.raises(ValueError, match="same name as another tensor that is currently"):
        hvd.allreduce_async(x, name="held", op=hvd.Sum)
    torch.testing.assert_close(hvd.synchronize(first), torch.full((3,), float(size)))
    torch.testing.assert_close(hvd.allreduce(x, name="held", op=hvd.Sum),
                               torch.full((3,), float(size)))


def test_init_adds_sets_given_by_ranks_or_by_the_parts_of_a_communicator() -> None:
    """As Horovod's test_process_sets_multi_comm: a Split communicator stands for each of its
    parts, and duplicates raise on every rank, adding nothing."""
    from mpi4py import MPI

    size, rank = hvd.size(), hvd.rank()
    halves = MPI.COMM_WORLD.Split(color=rank % 2, key=rank)
    hvd.init()  # (with name matching, its negotiation's communicator is a set of its own)
    before = len(ringlet.process_sets())
    if size > 1:
        with pytest.raises(ValueError, match="duplicate process sets"):
            hvd.init(process_sets=[hvd.ProcessSet(halves), hvd.ProcessSet(range(0, size, 2))])
        assert len(ringlet.process_sets()) == before
    by_comm = hvd.ProcessSet(halves)
    wanted = [by_comm] if size < 3 else [by_comm, hvd.ProcessSet([0])]
    if size == 1:
        with pytest.raises(ValueError, match="duplicate process sets"):
            hvd.init(process_sets=wanted)
        return
    hvd.init(process_sets=wanted)
    try:
        assert by_comm.ranks == list(range(rank % 2, size, 2))
        assert [s.ranks for s in ringlet.process_sets()][before:before + 2] == [
            tuple(range(0, size, 2)), tuple(range(1, size, 2))]
        total = hvd.allreduce(torch.ones(2), op=hvd.Sum, process_set=by_comm)
        torch.testing.assert_close(total, torch.full((2,), float(len(by_comm.ranks))))
    finally:
        assert all(hvd.remove_process_set(ps) for ps in wanted)
        for leftover in ringlet.process_sets()[before:]:  # the part this rank is not in, ...
            ringlet.remove_process_set(leftover)
    halves.Free()


def test_outside_its_process_set_the_optimizer_is_the_wrapped_one() -> None:
    """As Horovod's: a rank outside the set reduces nothing; the members average."""
    size, rank = hvd.size(), hvd.rank()
    first = hvd.add_process_set([0]) if size > 1 else hvd.global_process_set
    try:
        model = torch.nn.Linear(2, 1, bias=False)
        torch.nn.init.zeros_(model.weight)
        optimizer = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=1.0),
                                             process_set=first)
        model(torch.full((1, 2), float(rank + 1))).sum().backward()
        optimizer.step()  # rank 0 alone in its set: its own gradient, as everyone else's
        torch.testing.assert_close(model.weight, torch.full((1, 2), -float(rank + 1)))
    finally:
        if size > 1:
            assert hvd.remove_process_set(first)


def test_sparse_as_dense_gives_sparse_gradients_back_for_the_update() -> None:
    size, rank = hvd.size(), hvd.rank()
    torch.manual_seed(0)
    embedding = torch.nn.Embedding(6, 2, sparse=True)
    start = embedding.weight.detach().clone()
    optimizer = hvd.DistributedOptimizer(torch.optim.SparseAdam(embedding.parameters(), lr=0.1),
                                         sparse_as_dense=True)
    embedding(torch.tensor([rank % 6])).sum().backward()
    optimizer.step()  # SparseAdam refuses dense gradients
    assert embedding.weight.grad.is_sparse
    touched = {r % 6 for r in range(size)}
    for row in range(6):
        assert torch.equal(embedding.weight[row], start[row]) == (row not in touched)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
def test_reducescatter_scales_floats_as_horovod(dtype: torch.dtype) -> None:
    """In the tensor's precision, 16-bit floats in float32 (Horovod's CPU rule)."""
    size, rank = hvd.size(), hvd.rank()
    x = input_of(0, (2 * size, 3)).to(dtype)
    factor = 0.3183
    out = hvd.reducescatter(x, op=hvd.Sum, prescale_factor=factor)
    math = torch.float32 if dtype != torch.float32 else dtype
    multiplied = (torch.tensor(factor, dtype=math) * x.to(math)).to(dtype)
    expected = multiplied[2 * rank:2 * rank + 2] * size  # the sum, rounded once to dtype
    assert out.dtype == dtype
    torch.testing.assert_close(out, expected, rtol=0, atol=0)
