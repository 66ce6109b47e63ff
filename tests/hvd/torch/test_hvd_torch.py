"""ringlet.hvd.torch: tensors zero-copy, optimizer state, and DistributedOptimizer training that
matches one process on the combined batch."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch
from mpi4py import MPI

import ringlet.hvd.torch as hvd

pytestmark = pytest.mark.usefixtures("hvd_initialized")  # tests/hvd/conftest.py

torch.set_num_threads(1)


def test_tensor_allreduce_every_dtype(rank, size):
    for dtype in (torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int32,
                  torch.int64):
        x = (torch.arange(12) + rank).to(dtype).reshape(3, 4)
        result = hvd.allreduce(x, op=hvd.Sum)
        expected = sum((torch.arange(12) + r).to(torch.float64) for r in range(size))
        assert result.dtype == dtype and result.shape == (3, 4)
        assert torch.equal(result, expected.to(dtype).reshape(3, 4)), dtype


def test_in_place_works_on_the_tensors_memory_and_on_views(rank, size):
    x = torch.full((1000,), float(rank))
    pointer = x.data_ptr()
    assert hvd.allreduce_(x, op=hvd.Sum) is x and x.data_ptr() == pointer
    assert torch.all(x == sum(range(size)))
    base = torch.full((4, 6), float(rank))
    view = base.t()  # not contiguous: reduced through a copy, written back
    hvd.allreduce_(view, op=hvd.Max)
    assert torch.all(base == size - 1)
    with pytest.raises(ValueError, match="sparse"):
        hvd.allreduce(torch.eye(3).to_sparse())


def test_parameters_requiring_grad_and_async(rank, size):
    p = torch.nn.Parameter(torch.full((5,), float(rank)))
    handle = hvd.allreduce_async(p, op=hvd.Sum)
    result = hvd.synchronize(handle)
    assert torch.all(result == sum(range(size))) and not result.requires_grad
    assert torch.all(p == rank)


def test_broadcast_parameters_makes_models_identical(rank, size):
    torch.manual_seed(rank)
    model = torch.nn.Sequential(torch.nn.Linear(8, 4), torch.nn.BatchNorm1d(4))
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    torch.manual_seed(0)
    reference = torch.nn.Sequential(torch.nn.Linear(8, 4), torch.nn.BatchNorm1d(4))
    for (name, a), (_, b) in zip(model.state_dict().items(), reference.state_dict().items()):
        assert torch.equal(a, b), name
    torch.manual_seed(rank)
    other = torch.nn.Linear(3, 3)
    hvd.broadcast_parameters(other.named_parameters(), root_rank=size - 1)
    gathered = hvd.allgather_object(other.weight.detach().numpy().tobytes())
    assert len(set(gathered)) == 1


@pytest.mark.parametrize("make", [
    lambda ps: torch.optim.SGD(ps, lr=0.1, momentum=0.9),
    lambda ps: torch.optim.Adam(ps, lr=0.01),
], ids=["sgd_momentum", "adam"])
def test_broadcast_optimizer_state_round_trip(rank, size, make):
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 2)
    optimizer = make(model.parameters())
    for _ in range(rank + 1):  # every rank a different state (and Adam step count)
        optimizer.zero_grad()
        model(torch.randn(3, 4) * (rank + 1)).sum().backward()
        optimizer.step()
    optimizer.param_groups[0]["lr"] = 0.5 + rank
    hvd.broadcast_optimizer_state(optimizer, root_rank=0)
    state = optimizer.state_dict()
    blobs = hvd.allgather_object(
        [(k, {n: (v.numpy().tobytes() if torch.is_tensor(v) else v) for n, v in s.items()})
         for k, s in sorted(state["state"].items())]
    )
    assert all(b == blobs[0] for b in blobs)
    assert all(lr == 0.5 for lr in hvd.allgather_object(optimizer.param_groups[0]["lr"]))


def _model():
    torch.manual_seed(123)
    return torch.nn.Sequential(torch.nn.Linear(10, 16), torch.nn.Tanh(), torch.nn.Linear(16, 3))


def _data(steps: int, batch: int, size: int):
    generator = torch.Generator().manual_seed(7)
    x = torch.randn(steps, size * batch, 10, generator=generator)
    y = torch.randint(0, 3, (steps, size * batch), generator=generator)
    return x, y


@pytest.mark.parametrize("make", [
    lambda ps: torch.optim.SGD(ps, lr=0.1, momentum=0.9),
    lambda ps: torch.optim.Adam(ps, lr=0.01),
], ids=["sgd_momentum", "adam"])
@pytest.mark.parametrize("options", [{}, {"groups": 2}, {"compression": None},
                                     {"shared_gradients": True}])
def test_training_matches_one_process_on_the_combined_batch(rank, size, make, options):
    steps, batch = 5, 4
    x, y = _data(steps, batch, size)
    loss_fn = torch.nn.CrossEntropyLoss()

    single = _model()
    single_opt = make(single.parameters())
    for step in range(steps):  # one process, batch N*B
        single_opt.zero_grad()
        loss_fn(single(x[step]), y[step]).backward()
        single_opt.step()

    model = _model()
    optimizer = hvd.DistributedOptimizer(make(model.parameters()),
                                         named_parameters=model.named_parameters(), **options)
    mine = slice(rank * batch, (rank + 1) * batch)
    for step in range(steps):  # N ranks, batch B each, gradients averaged
        optimizer.zero_grad()
        loss_fn(model(x[step][mine]), y[step][mine]).backward()
        optimizer.step()

    for a, b in zip(model.parameters(), single.parameters()):
        assert torch.allclose(a, b, atol=1e-5, rtol=1e-4), (a - b).abs().max()


def test_backward_passes_per_step_accumulates_locally(rank, size):
    steps, batch = 3, 4
    x, y = _data(steps, 2 * batch, size)
    loss_fn = torch.nn.CrossEntropyLoss(reduction="sum")

    single = _model()
    single_opt = torch.optim.SGD(single.parameters(), lr=0.01)
    for step in range(steps):
        single_opt.zero_grad()
        (loss_fn(single(x[step]), y[step]) / size).backward()  # Average of per-rank sums
        single_opt.step()

    model = _model()
    optimizer = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.01),
                                         backward_passes_per_step=2)
    for step in range(steps):
        optimizer.zero_grad()
        for half in range(2):
            start = (2 * rank + half) * batch
            chunk = slice(start, start + batch)
            loss_fn(model(x[step][chunk]), y[step][chunk]).backward()
        optimizer.step()
    for a, b in zip(model.parameters(), single.parameters()):
        assert torch.allclose(a, b, atol=1e-5, rtol=1e-4)


def test_load_state_dict_forgets_the_gradients_in_flight_and_frees_their_names(rank, size):
    """As Horovod's: loading a state drops the buckets that backward launched (waiting for
    them, which frees their names), so that the next backward and step run as usual."""
    model = _model()
    optimizer = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1))
    saved = copy.deepcopy(optimizer.state_dict())
    model(torch.ones(2, 10)).sum().backward()  # launches every bucket under its name
    optimizer.load_state_dict(saved)
    optimizer.zero_grad()  # allowed now: nothing is in flight any more
    before = copy.deepcopy(model)
    model(torch.full((2, 10), float(rank + 1))).sum().backward()
    optimizer.step()  # the same bucket names again
    expected = [torch.zeros_like(p) for p in before.parameters()]
    for r in range(size):  # every rank's gradient at the same weights, averaged
        before.zero_grad()
        before(torch.full((2, 10), float(r + 1))).sum().backward()
        for e, p in zip(expected, before.parameters()):
            e += p.grad / size
    for p, e in zip(model.parameters(), expected):
        torch.testing.assert_close(p.grad, e)


def test_misuse_raises_as_horovod_does(size):
    model = _model()
    optimizer = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1))
    model(torch.randn(2, 10)).sum().backward()
    with pytest.raises(AssertionError, match=r"zero_grad\(\) was called after loss.backward"):
        optimizer.zero_grad()
    optimizer.step()
    model(torch.randn(2, 10)).sum().backward()
    with pytest.raises(AssertionError, match="more than backward_passes_per_step"):
        model(torch.randn(2, 10)).sum().backward()
    optimizer.synchronize()
    with optimizer.skip_synchronize():
        optimizer.step()
    with pytest.raises(ValueError, match="gradient_predivide_factor"):
        hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), op=hvd.Sum,
                                 gradient_predivide_factor=2.0)


def _local_gradients(model, x) -> list[np.ndarray]:
    """This rank's own gradients of model(x).sum(), from a copy (the optimizer's hooks may
    already be reducing the model's own gradients in place)."""
    reference = copy.deepcopy(model)
    reference.zero_grad(set_to_none=True)
    reference(x).sum().backward()
    return [p.grad.numpy().copy() for p in reference.parameters()]


def _assert_averaged(model, local: list[np.ndarray]) -> None:
    every = MPI.COMM_WORLD.allgather(local)
    for i, p in enumerate(model.parameters()):
        expected = np.mean([grads[i] for grads in every], axis=0)
        np.testing.assert_allclose(p.grad.numpy(), expected, rtol=1e-6, atol=1e-7)


@pytest.fixture
def by_order():
    """Order matching for the test, and the default again after it. The test may then call
    ringlet's own collectives from its thread (under name matching they could meet a cycle of
    the negotiation thread in another order on another rank), and ringlet.stats() counts only
    its own collectives, not the cycles'."""
    from ringlet.hvd._api import use_matching
    from ringlet.hvd._state import state

    by_name = state.matching_by_name()
    use_matching("order")
    yield
    hvd.barrier()
    use_matching("name" if by_name else "order")


def test_shared_gradients_live_in_shared_memory_and_are_reduced_there(rank, size, by_order):
    import ringlet

    model = torch.nn.Sequential(torch.nn.Linear(10, 8), torch.nn.ReLU(), torch.nn.Linear(8, 3))
    optimizer = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                         shared_gradients=True, groups=1)
    shared = ringlet.shared_memory().available
    assert shared == (size > 1), ringlet.shared_memory()
    storage = [p.grad for p in model.parameters()]
    (flat,) = optimizer._shared_arrays  # one bucket, one buffer; every .grad a view of it
    assert ringlet.is_shared(flat) == shared and flat.size == sum(g.numel() for g in storage)
    start, end = flat.ctypes.data, flat.ctypes.data + flat.nbytes
    for p in model.parameters():
        assert start <= p.grad.data_ptr() < end and not p.grad.any()
    x = torch.arange(20, dtype=torch.float32).reshape(2, 10) / 10 * (rank + 1)
    for _ in range(3):
        optimizer.zero_grad()
        assert all(p.grad is g and not g.any() for p, g in zip(model.parameters(), storage))
        local = _local_gradients(model, x)
        ringlet.reset_stats()
        model(x).sum().backward()
        optimizer.synchronize()
        _assert_averaged(model, local)
        if shared:  # one reduction of the whole bucket, in place: nothing packed
            assert "pack" not in ringlet.stats() and sum(
                u["calls"] for u in ringlet.stats().values()) == 1, ringlet.stats()
        with optimizer.skip_synchronize():
            optimizer.step()
    # A replaced gradient takes its bucket off the shared path; it is still averaged.
    optimizer.zero_grad()
    local = _local_gradients(model, x)
    model[0].bias.grad = torch.zeros_like(model[0].bias)  # before backward accumulates into it
    model(x).sum().backward()
    optimizer.synchronize()
    _assert_averaged(model, local)
    assert not (start <= model[0].bias.grad.data_ptr() < end)


def test_unused_parameters_are_reduced_as_zeros(rank, size):
    model = torch.nn.ModuleDict({"used": torch.nn.Linear(3, 1), "unused": torch.nn.Linear(3, 1)})
    before = copy.deepcopy(model["unused"].state_dict())
    optimizer = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1))
    optimizer.zero_grad()
    model["used"](torch.ones(2, 3)).sum().backward()
    optimizer.step()  # must not hang waiting for the unused parameters' hooks
    for name, value in model["unused"].state_dict().items():
        assert torch.equal(value, before[name])
    assert np.isfinite(model["used"].weight.detach().numpy()).all()


def _train(optimizer, model, steps: int, rank: int, size: int) -> None:
    x, y = _data(steps, 4, size)
    mine = slice(rank * 4, (rank + 1) * 4)
    for step in range(steps):
        optimizer.zero_grad()
        torch.nn.CrossEntropyLoss()(model(x[step][mine]), y[step][mine]).backward()
        optimizer.step()


def test_buckets_are_the_plan_unless_a_threshold_overrides(monkeypatch, rank, size, by_order):
    import ringlet

    monkeypatch.delenv("RINGLET_FUSION_THRESHOLD", raising=False)
    model = _model()
    params = list(model.parameters())
    optimizer = hvd.DistributedOptimizer(torch.optim.SGD(params, lr=0.1),
                                         named_parameters=model.named_parameters())
    ready = params[::-1]  # backward produces the last layer's gradients first
    plan = ringlet.plan_buckets([p.numel() * 4 for p in ready])
    assert [[id(p) for p in b] for b in optimizer._buckets] == \
        [[id(ready[i]) for i in b] for b in plan.buckets]
    _train(optimizer, model, 3, rank, size)

    monkeypatch.setenv("RINGLET_FUSION_THRESHOLD", str(16 * 4))  # a bias, or one row
    small = _model()
    split = hvd.DistributedOptimizer(torch.optim.SGD(small.parameters(), lr=0.1),
                                     named_parameters=small.named_parameters())
    assert len(split._buckets) == 4  # every parameter is larger than half the threshold
    _train(split, small, 3, rank, size)
    for a, b in zip(model.parameters(), small.parameters()):
        assert torch.allclose(a, b, atol=1e-6), (a - b).abs().max()


def test_timeline_records_every_step_and_writes_a_chrome_trace(monkeypatch, tmp_path, rank,
                                                               size):
    import atexit
    import json

    monkeypatch.delenv("RINGLET_TIMELINE", raising=False)
    plain = _model()
    assert hvd.DistributedOptimizer(torch.optim.SGD(plain.parameters(), lr=0.1)).timeline is None

    monkeypatch.setenv("RINGLET_TIMELINE", str(tmp_path / "trace.json"))
    monkeypatch.setenv("RINGLET_FUSION_THRESHOLD", str(16 * 4))
    model = _model()
    optimizer = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                         named_parameters=model.named_parameters())
    timeline = optimizer.timeline
    atexit.unregister(timeline.report)  # reported here, not when pytest exits
    _train(optimizer, model, 4, rank, size)

    assert len(timeline.steps) == 4
    for step in timeline.steps:
        parts = step["compute"] + step["exposed"] + step["update"]
        assert 0 < parts <= step["step"] + 1e-6, step
        assert 0 < step["collectives"] and 0 <= step["overlapped"] <= step["collectives"]
    summary = timeline.summary()
    assert set(summary) == {"step", "compute", "exposed", "update", "collectives",
                            "overlapped", "pack"}
    assert "median of 4 steps" in timeline.table()
    path = timeline.write_trace()
    assert path == str(tmp_path / (f"trace.{rank}.json" if size > 1 else "trace.json"))
    with open(path) as f:
        events = json.load(f)["traceEvents"]
    names = [e["name"] for e in events if e["ph"] == "X"]
    assert names.count("compute") == names.count("synchronize") == names.count("update") == 4
    buckets = [n for n in names if n.startswith("allreduce bucket")]
    assert len(buckets) == 4 * len(optimizer._buckets)
    assert all(e["dur"] >= 0 and e["pid"] == rank for e in events if e["ph"] == "X")


def test_parameter_names_are_checked_as_horovod_checks_them(size):
    model = _model()
    params = list(model.parameters())
    optimizer = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1))
    assert [optimizer._parameter_names[p] for p in params] == \
        [f"allreduce.noname.{i}" for i in range(len(params))]
    named = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                     named_parameters=model.named_parameters())
    assert {named._parameter_names[p] for p in params} == \
        {"0.weight", "0.bias", "2.weight", "2.bias"}
    with pytest.raises(ValueError, match=r"must be unique\. Found duplicates: w"):
        hvd.DistributedOptimizer(torch.optim.SGD(params, lr=0.1),
                                 named_parameters=[("w", p) for p in params])
    with pytest.raises(ValueError, match="one or more model parameters were not named"):
        hvd.DistributedOptimizer(torch.optim.SGD(params, lr=0.1),
                                 named_parameters=list(model.named_parameters())[:2])
    with pytest.raises(ValueError, match="should be a sequence of tuples"):
        hvd.DistributedOptimizer(torch.optim.SGD(params, lr=0.1),
                                 named_parameters=[["w", params[0]]])


def test_step_after_a_manual_synchronize_warns_in_horovods_words(size):
    model = _model()
    optimizer = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1))
    model(torch.randn(2, 10)).sum().backward()
    optimizer.synchronize()
    with pytest.warns(UserWarning, match=r"optimizer.step\(\) called without "
                      r"optimizer.skip_synchronize\(\) context after optimizer.synchronize\(\)"):
        optimizer.step()


@pytest.mark.parametrize("dtype", [torch.int32, torch.int64])
def test_integers_are_scaled_in_float64_as_horovod_scales_them(rank, size, dtype):
    torch.manual_seed(1234)  # the same tensor on every rank, as in Horovod's test
    tensor = torch.FloatTensor(17, 17).random_(-100, 100).to(dtype)
    factor = 0.73
    before = tensor.clone()
    summed = hvd.allreduce(tensor, op=hvd.Sum, prescale_factor=factor)
    expected = (torch.tensor(factor, dtype=torch.float64) * tensor).to(dtype) * size
    assert summed.dtype == dtype and torch.equal(summed, expected)
    summed = hvd.allreduce(tensor, op=hvd.Sum, postscale_factor=factor)
    expected = ((tensor * size) * torch.tensor(factor, dtype=torch.float64)).to(dtype)
    assert torch.equal(summed, expected)
    averaged = hvd.allreduce(tensor + rank, op=hvd.Average, postscale_factor=2.5)
    total = sum(tensor.to(torch.float64) + r for r in range(size))
    assert torch.equal(averaged, (total * (2.5 / size)).to(dtype))
    assert torch.equal(tensor, before)
    # In place, and together with a float tensor in one grouped call.
    ints, floats = tensor.clone(), torch.full((5,), float(rank))
    hvd.grouped_allreduce_([ints, floats], op=hvd.Sum, prescale_factor=0.5)
    assert torch.equal(ints, (tensor.to(torch.float64) * 0.5).to(dtype) * size)
    assert torch.equal(floats, torch.full((5,), 0.5 * sum(range(size))))


@pytest.mark.parametrize("compression,wire", [(hvd.Compression.fp16, torch.float16),
                                              (hvd.Compression.bf16, torch.bfloat16)])
def test_compressors_return_the_compressed_dtype_and_restore_it(compression, wire):
    for dtype in (torch.float32, torch.float64):
        tensor = torch.ones(5, 5, 5, dtype=dtype)
        compressed, ctx = compression.compress(tensor)
        assert compressed.dtype == wire
        restored = compression.decompress(compressed, ctx)
        assert restored.dtype == dtype and torch.equal(restored, tensor)
    for dtype in (torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64):
        tensor = torch.ones(5, 5, 5, dtype=dtype)
        compressed, ctx = compression.compress(tensor)
        assert compressed.dtype == dtype
        assert compression.decompress(compressed, ctx).dtype == dtype
    none, ctx = hvd.Compression.none.compress(torch.ones(3))
    assert none.dtype == torch.float32 and hvd.Compression.none.decompress(none, ctx) is none


# ---- autograd: each rule against the gradient of the same computation in one process ----------


def _weights(rank: int, shape: tuple[int, ...]) -> torch.Tensor:
    return torch.arange(float(torch.Size(shape).numel())).reshape(shape) * 0.25 + rank


def _inputs(size: int, rows=lambda r: 3) -> list[torch.Tensor]:
    return [torch.linspace(-1, 1, rows(r) * 4).reshape(rows(r), 4) + r for r in range(size)]


@pytest.mark.parametrize("op", [hvd.Sum, hvd.Average])
def test_allreduce_gradient_is_the_allreduce_of_the_gradient(rank, size, op):
    xs = _inputs(size)
    x = xs[rank].clone().requires_grad_()
    y = hvd.allreduce(x, op=op, prescale_factor=0.5, postscale_factor=4.0)
    assert y.requires_grad and y.grad_fn is not None
    (y * _weights(rank, (3, 4))).sum().backward()
    # One process: every rank's loss on the reduction of every rank's input, summed.
    leaves = [t.clone().requires_grad_() for t in xs]
    reduced = sum(t * 0.5 for t in leaves) * (4.0 / (size if op == hvd.Average else 1))
    sum((reduced * _weights(r, (3, 4))).sum() for r in range(size)).backward()
    assert torch.allclose(x.grad, leaves[rank].grad), (x.grad, leaves[rank].grad)


def test_grouped_allreduce_gradients(rank, size):
    xs = _inputs(size)
    a, b = xs[rank].clone().requires_grad_(), (xs[rank][0] * 2).clone().requires_grad_()
    ya, yb = hvd.grouped_allreduce([a, b], op=hvd.Sum)
    ((ya * _weights(rank, (3, 4))).sum() + (yb * (rank + 1)).sum()).backward()
    total = sum(_weights(r, (3, 4)) for r in range(size))
    assert torch.allclose(a.grad, total)
    assert torch.allclose(b.grad, torch.full((4,), float(sum(range(1, size + 1)))))


def test_allgather_gradient_is_this_ranks_rows_of_the_averaged_gradient(rank, size):
    xs = _inputs(size, rows=lambda r: r + 1)  # a different first dimension per rank
    x = xs[rank].clone().requires_grad_()
    gathered = hvd.allgather(x)
    rows = sum(r + 1 for r in range(size))
    (gathered * _weights(rank, (rows, 4))).sum().backward()
    leaves = [t.clone().requires_grad_() for t in xs]
    everything = torch.cat(leaves)
    (sum((everything * _weights(r, (rows, 4))).sum() for r in range(size)) / size).backward()
    assert torch.allclose(x.grad, leaves[rank].grad)


@pytest.mark.parametrize("root", [0, -1])
def test_broadcast_gradient_goes_to_the_root(rank, size, root):
    root = root % size
    xs = _inputs(size)
    x = xs[rank].clone().requires_grad_()
    y = hvd.broadcast(x, root_rank=root)
    assert torch.equal(y.detach(), xs[root])
    (y * _weights(rank, (3, 4))).sum().backward()
    leaves = [t.clone().requires_grad_() for t in xs]
    (sum((leaves[root] * _weights(r, (3, 4))).sum() for r in range(size)) / size).backward()
    expected = leaves[rank].grad if leaves[rank].grad is not None else torch.zeros(3, 4)
    assert torch.allclose(x.grad, expected)


def test_collectives_without_grad_stay_plain(rank, size):
    x = torch.ones(3, requires_grad=True)
    with torch.no_grad():
        assert hvd.allreduce(x).grad_fn is None
    assert hvd.allreduce(torch.ones(3)).grad_fn is None


class _ModelNoGrad(torch.nn.Module):
    """Horovod's test model: an integer parameter without grad beside a float one."""

    def __init__(self) -> None:
        super().__init__()
        self.a = torch.nn.Parameter(torch.tensor([1, 3], dtype=torch.int32), requires_grad=False)
        self.b = torch.nn.Parameter(torch.rand(4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.index_select(self.b, 0, self.a.long()) * x


def test_optimizer_state_broadcast_with_parameters_without_gradients(rank, size):
    torch.manual_seed(rank)  # different weights on every rank
    model = _ModelNoGrad()
    optimizer = hvd.DistributedOptimizer(
        torch.optim.SGD(model.parameters(), lr=0.001, weight_decay=1e-6, momentum=0.9,
                        nesterov=True), named_parameters=model.named_parameters())
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(optimizer, root_rank=0)
    assert optimizer.param_groups[0]["params"][0].grad is None
    grad = optimizer.param_groups[0]["params"][1].grad
    assert torch.equal(grad, hvd.broadcast(grad, root_rank=0))
    buffers = hvd.allgather_object(optimizer.state_dict()["state"][1]["momentum_buffer"])
    assert all(torch.equal(b, buffers[0]) for b in buffers)
    # The ranks are still in step, and training goes on.
    model(torch.ones(2)).sum().backward()
    optimizer.step()
    weights = hvd.allgather_object(model.b.detach())
    assert all(torch.equal(w, weights[0]) for w in weights)


@pytest.mark.parametrize("make", [
    lambda ps: torch.optim.Adam(ps, lr=0.01, amsgrad=True),
    lambda ps: torch.optim.RMSprop(ps, lr=0.01, momentum=0.5, centered=True),
    lambda ps: torch.optim.Adagrad(ps, lr=0.01),
    lambda ps: torch.optim.SGD(ps, lr=0.01),
], ids=["adam", "rmsprop", "adagrad", "sgd_stateless"])
def test_fresh_optimizer_state_is_made_then_broadcast(rank, size, make):
    model = _model()
    optimizer = make(model.parameters())
    optimizer.param_groups[0]["lr"] = 0.01 * (rank + 1)  # a scalar option that differs
    hvd.broadcast_optimizer_state(optimizer, root_rank=0)
    state = optimizer.state_dict()
    assert state["param_groups"][0]["lr"] == 0.01
    everyone = hvd.allgather_object(state)
    for other in everyone:
        assert other["state"].keys() == state["state"].keys()
        for key, values in state["state"].items():
            for name, value in values.items():
                assert torch.equal(torch.as_tensor(other["state"][key][name]),
                                   torch.as_tensor(value)), (key, name)
    with pytest.raises(ValueError, match="LBFGS"):
        hvd.broadcast_optimizer_state(torch.optim.LBFGS(model.parameters()), 0)


# ---- SyncBatchNorm ------------------------------------------------------------------------------


@pytest.mark.parametrize("shape", [(4, 3), (4, 3, 5), (2, 3, 4, 4)])
def test_sync_batch_norm_matches_batch_norm_on_the_combined_batch(rank, size, shape):
    torch.manual_seed(0)
    xs = [torch.randn(shape) * (r + 1) + r for r in range(size)]
    weights = [torch.randn(shape) for _ in range(size)]
    norm = {2: torch.nn.BatchNorm1d, 3: torch.nn.BatchNorm1d, 4: torch.nn.BatchNorm2d}
    reference = norm[len(shape)](3, momentum=0.3)
    synced = hvd.SyncBatchNorm(3, momentum=0.3)
    with torch.no_grad():
        for module in (reference, synced):
            module.weight.copy_(torch.tensor([1.0, 2.0, 0.5]))
            module.bias.copy_(torch.tensor([0.0, -1.0, 3.0]))
    x = xs[rank].clone().requires_grad_()
    y = synced(x)
    (y * weights[rank]).sum().backward()
    leaves = torch.cat(xs).requires_grad_()
    out = reference(leaves)
    (out * torch.cat(weights)).sum().backward()
    rows = slice(rank * shape[0], (rank + 1) * shape[0])
    assert torch.allclose(y, out[rows], atol=1e-5)
    assert torch.allclose(x.grad, leaves.grad[rows], atol=1e-4)
    for local, full in ((synced.weight.grad, reference.weight.grad),
                        (synced.bias.grad, reference.bias.grad)):
        assert torch.allclose(hvd.allreduce(local, op=hvd.Sum), full, atol=1e-3)
    assert torch.allclose(synced.running_mean, reference.running_mean, atol=1e-5)
    assert torch.allclose(synced.running_var, reference.running_var, atol=1e-4)
    synced.eval()
    reference.eval()
    assert torch.allclose(synced(xs[rank]), reference(xs[rank]), atol=1e-5)


def test_training_with_sync_batch_norm_equals_one_process_on_the_combined_batch(rank, size):
    steps, batch = 4, 3

    def model(norm):
        torch.manual_seed(5)
        return torch.nn.Sequential(torch.nn.Linear(6, 8), norm(8), torch.nn.ReLU(),
                                   torch.nn.Linear(8, 2))

    generator = torch.Generator().manual_seed(11)
    x = torch.randn(steps, size * batch, 6, generator=generator)
    y = torch.randn(steps, size * batch, 2, generator=generator)
    single = model(torch.nn.BatchNorm1d)
    single_opt = torch.optim.SGD(single.parameters(), lr=0.1, momentum=0.9)
    for step in range(steps):
        single_opt.zero_grad()
        torch.nn.functional.mse_loss(single(x[step]), y[step]).backward()
        single_opt.step()
    ours = model(hvd.SyncBatchNorm)
    optimizer = hvd.DistributedOptimizer(torch.optim.SGD(ours.parameters(), lr=0.1, momentum=0.9),
                                         named_parameters=ours.named_parameters())
    mine = slice(rank * batch, (rank + 1) * batch)
    for step in range(steps):
        optimizer.zero_grad()
        torch.nn.functional.mse_loss(ours(x[step][mine]), y[step][mine]).backward()
        optimizer.step()
    for a, b in zip(ours.state_dict().values(), single.state_dict().values()):
        assert torch.allclose(a.float(), b.float(), atol=1e-5), (a, b)


# ---- what is not supported says so ------------------------------------------------------------


def test_unsupported_features_raise_what_the_migration_table_says(size):
    with pytest.raises(NotImplementedError, match="RINGLET_TIMELINE"):
        hvd.start_timeline("/tmp/timeline.json")
    with pytest.raises(NotImplementedError, match="RINGLET_TIMELINE"):
        hvd.stop_timeline()
    with pytest.raises(ValueError, match="ringlet reduces CPU tensors; this one is on meta"):
        hvd.allreduce(torch.ones(3, device="meta"))
    with pytest.raises(ValueError, match=r"process_set must be an hvd\.ProcessSet"):
        hvd.allreduce(torch.ones(3), process_set=type("Set", (), {"process_set_id": 1})())
    with pytest.raises(NotImplementedError, match="defined by an MPI communicator"):
        hvd.add_process_set(hvd.ProcessSet(MPI.COMM_WORLD))
    with pytest.raises(NotImplementedError, match="Adasum"):
        hvd.allreduce(torch.ones(3), op=hvd.Adasum)
    # Elastic training is supported now: hvd.elastic is Horovod's (tests/elastic).
    assert callable(hvd.elastic.run) and issubclass(hvd.elastic.TorchState, hvd.elastic.State)


def test_sparse_gradients_train_like_dense_ones(rank, size):
    def train(sparse_as_dense: bool) -> torch.Tensor:
        torch.manual_seed(3)
        embedding = torch.nn.Embedding(10, 4, sparse=True)
        optimizer = hvd.DistributedOptimizer(torch.optim.SGD(embedding.parameters(), lr=1.0),
                                             sparse_as_dense=sparse_as_dense)
        embedding(torch.tensor([rank % 10, 7])).sum().backward()
        optimizer.step()
        return embedding.weight.detach()

    torch.manual_seed(3)
    expected = torch.nn.Embedding(10, 4).weight.detach().clone()
    for r in range(size):
        expected[r % 10] -= 1.0 / size
    expected[7] -= 1.0
    # Densified and allreduced, or gathered sparse (Horovod's sparse_allreduce_async): the same.
    assert torch.allclose(train(sparse_as_dense=True), expected)
    assert torch.allclose(train(sparse_as_dense=False), expected)


def test_sparse_allreduce_async_gathers_indices_and_values(rank, size):
    dense = torch.zeros(6, 3)
    dense[rank % 6] = rank + 1.0
    dense[5, 1] = 2.0
    for op, divide in ((hvd.Sum, 1), (hvd.Average, size)):
        handle = hvd.sparse_allreduce_async(dense.to_sparse(), name="s", op=op)
        expected = torch.zeros(6, 3)
        for r in range(size):
            expected[r % 6] += r + 1.0
        expected[5, 1] += 2.0 * size
        result = handle()
        assert result.is_sparse
        torch.testing.assert_close(result.to_dense(), expected / divide)
    with pytest.raises(ValueError, match="sparse COO tensor"):
        hvd.sparse_allreduce_async(dense, name="d", op=hvd.Sum)
    with pytest.raises(ValueError, match="densify them for the other collectives"):
        hvd.allreduce(dense.to_sparse())


def test_alltoall_with_and_without_splits_and_its_gradient(rank, size):
    splits = [(rank + q) % 3 + 1 for q in range(size)]
    rows = sum(splits)
    x = torch.arange(rows * 2, dtype=torch.float32).reshape(rows, 2) + 100 * rank
    output, received = hvd.alltoall(x, splits=torch.tensor(splits, dtype=torch.int32))
    assert received.dtype == torch.int32
    assert received.tolist() == [(r + rank) % 3 + 1 for r in range(size)]
    assert output.shape == (sum(received.tolist()), 2)
    handle = hvd.alltoall_async(x, splits=splits)
    assert hvd.poll(handle)
    again, again_received = hvd.synchronize(handle)
    assert torch.equal(again, output) and torch.equal(again_received, received)
    equal = hvd.alltoall(torch.full((2 * size,), float(rank)))
    assert equal.tolist() == [float(r) for r in range(size) for _ in range(2)]
    # The gradient goes back to the rows it came from: d/dx of sum(w * alltoall(x)) is w,
    # sent back, on every rank.
    leaf = x.clone().requires_grad_()
    out, _ = hvd.alltoall(leaf, splits=splits)
    weights = torch.arange(out.numel(), dtype=torch.float32).reshape(out.shape) + rank
    (out * weights).sum().backward()
    back, _ = hvd.alltoall(weights, splits=received)
    assert torch.equal(leaf.grad, back)


@pytest.mark.parametrize("dtype", [torch.int8, torch.uint8, torch.int16, torch.uint16,
                                   torch.uint32])
@pytest.mark.parametrize("op", ["sum", "min", "max"])
def test_narrow_integers_are_reduced_widened_and_wrap_as_horovods_sums(rank, size, dtype, op):
    """The core reduces 32- and 64-bit integers; the narrower ones (and uint32) travel
    widened and come back in their own dtype, a sum wrapping as it does in that dtype."""
    values = [np.array([100 + 50 * q, 3, 250 - q], dtype=np.int64) for q in range(size)]
    mine = torch.from_numpy(values[rank]).to(dtype)
    got = hvd.allreduce(mine, op={"sum": hvd.Sum, "min": hvd.Min, "max": hvd.Max}[op])
    stacked = np.stack([torch.from_numpy(v).to(dtype).numpy() for v in values])
    expected = {"sum": lambda: np.sum(stacked, axis=0, dtype=stacked.dtype),
                "min": lambda: stacked.min(axis=0), "max": lambda: stacked.max(axis=0)}[op]()
    assert got.dtype == dtype
    np.testing.assert_array_equal(got.numpy(), expected)
    np.testing.assert_array_equal(mine.numpy(), stacked[rank])  # the input is unchanged
