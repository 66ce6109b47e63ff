"""ringlet.hvd.torch.elastic's state objects under mpirun, against Horovod's semantics
(horovod/torch/elastic): TorchState's save, restore and sync, the snapshot a restart resumes
from, ElasticSampler's shards, and commit and check_host_updates raising together on every
rank. The driver's side is tested in tests/elastic."""

from __future__ import annotations

import threading

import pytest
import torch

import ringlet.hvd.torch as hvd


class FakeLink:
    """What the driver would have told rank 0."""

    def __init__(self, updates: int = 0) -> None:
        self.hosts_updates, self.removed_only, self.sent = updates, False, []

    def commit(self, serialize, wait: bool = False) -> None:
        self.sent.append(serialize())


@pytest.fixture(autouse=True)
def _init() -> None:
    hvd.init()


def model_of(rank: int) -> torch.nn.Module:
    torch.manual_seed(rank)
    return torch.nn.Linear(3, 2)


def test_restore_goes_back_to_the_last_commit_and_sync_spreads_rank_0s() -> None:
    model = model_of(hvd.rank())
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    state = hvd.elastic.TorchState(model, optimizer, epoch=hvd.rank())
    state.sync()
    zero = model_of(0)
    assert torch.equal(model.weight, zero.weight) and state.epoch == 0
    state.epoch = 5
    state.save()
    committed = model.weight.detach().clone()
    with torch.no_grad():
        model.weight.add_(1.0)
    state.epoch = 7
    state.restore()
    assert torch.equal(model.weight, committed) and state.epoch == 5


def test_a_snapshot_restores_model_optimizer_and_attributes() -> None:
    model = model_of(0)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    model(torch.ones(1, 3)).sum().backward()
    optimizer.step()
    state = hvd.elastic.TorchState(model, optimizer, batch=3)
    payload = state.snapshot()
    other = model_of(1)
    other_optimizer = torch.optim.SGD(other.parameters(), lr=0.5, momentum=0.9)
    fresh = hvd.elastic.TorchState(other, other_optimizer, batch=0)
    fresh.load_snapshot(payload)
    assert torch.equal(other.weight, model.weight) and fresh.batch == 3
    assert other_optimizer.state_dict()["param_groups"][0]["lr"] == 0.1
    momentum = other_optimizer.state_dict()["state"][0]["momentum_buffer"]
    assert torch.equal(momentum, optimizer.state_dict()["state"][0]["momentum_buffer"])


def test_elastic_sampler_shards_what_is_left_of_the_epoch() -> None:
    sampler = hvd.elastic.ElasticSampler(list(range(10)), shuffle=True, seed=3)
    everyone = hvd.allgather_object(list(sampler))
    seen = [i for part in everyone for i in part]
    assert sorted(set(seen)) == list(range(10)) and len(sampler) == -(-10 // hvd.size())
    sampler.record_batch(0, 2)
    assert sampler.state_dict() == {"epoch": 0, "processed_num": 2 * hvd.size()}
    sampler.load_state_dict(sampler.state_dict())
    left = [i for part in hvd.allgather_object(list(sampler)) for i in part]
    assert sorted(set(left)) == sorted(sampler.remaining_indices)
    assert len(sampler.remaining_indices) == 10 - 2 * hvd.size()
    sampler.set_epoch(1)
    assert sampler.processed_num == 0 and len(sampler.remaining_indices) == 10


def test_reset_callbacks_run_in_order_and_refuse_what_cannot_be_called() -> None:
    state = hvd.elastic.ObjectState(value=1)
    calls = []
    state.register_reset_callbacks([lambda: calls.append("a"), lambda: calls.append("b")])
    state.on_reset()
    assert calls == ["a", "b"]
    with pytest.raises(TypeError, match="must be callable"):
        state.register_reset_callbacks([42])


def test_host_updates_raise_on_every_rank_at_the_same_commit() -> None:
    state = hvd.elastic.ObjectState(step=0)
    state.commit()  # nothing reported: goes on
    if hvd.rank() == 0:
        state._link = FakeLink(updates=1)
    with pytest.raises(hvd.HostsUpdatedInterrupt) as raised:
        state.commit()
    assert raised.value.skip_sync is False
    state.check_host_updates()  # seen: no second interrupt
    if hvd.rank() == 0:
        assert len(state._link.sent) == 1


def test_a_state_that_cannot_be_serialized_is_refused_on_every_rank() -> None:
    state = hvd.elastic.ObjectState(lock=threading.Lock(), step=1)
    if hvd.rank() == 0:
        state._link = FakeLink()
    with pytest.raises(hvd.elastic.StateError, match="cannot commit ObjectState"):
        state.commit()
    state.lock, state.step = None, 2
    state.commit()  # the ranks are still in step
    assert state.step == 2
