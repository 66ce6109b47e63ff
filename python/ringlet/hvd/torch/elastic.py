"""Horovod's elastic API for PyTorch (``hvd.elastic``): ``run``, ``TorchState`` and
``ElasticSampler``, with ``horovod.torch.elastic``'s semantics (``docs/guide/elastic.md``)."""

from __future__ import annotations

import copy
import io
import math
import pickle
import random
from collections.abc import Callable
from typing import Any

import torch

from ringlet.elastic import HostsUpdatedInterrupt, State, StateError, run

from .._api import api
from .._ops import HorovodInternalError
from ..elastic import ObjectState
from ._optimizer import broadcast_optimizer_state

__all__ = ["ElasticSampler", "HorovodInternalError", "HostsUpdatedInterrupt", "ObjectState",
           "State", "StateError", "TorchState", "run"]


class ElasticSampler(torch.utils.data.Sampler):
    """A sampler that shards the samples not yet processed this epoch across the ranks of
    the job as it is now, so a job that changes size mid-epoch neither skips nor repeats
    samples. Call ``record_batch`` after each batch and ``set_epoch`` at the end of each
    epoch, and keep it in the ``TorchState``. Horovod's ``ElasticSampler``."""

    def __init__(self, dataset: Any, shuffle: bool = True, seed: int = 0) -> None:
        self.dataset, self.shuffle, self.seed = dataset, shuffle, seed
        self.epoch = 0
        self.processed_num = 0
        self.num_replicas = 0
        self.rank = 0
        self.remaining_indices: list[int] = []
        self.num_samples = 0
        self.total_size = 0
        self.reset()

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch
        self.processed_num = 0
        self.reset()

    def record_batch(self, batch_idx: int, batch_size: int) -> None:
        """Count a batch of ``batch_size`` on every rank as processed."""
        self.processed_num += batch_size * self.num_replicas

    def load_state_dict(self, state_dict: dict[str, int]) -> None:
        self.epoch = state_dict["epoch"]
        self.processed_num = state_dict["processed_num"]
        self.reset()

    def state_dict(self) -> dict[str, int]:
        return {"epoch": self.epoch, "processed_num": self.processed_num}

    def reset(self) -> None:
        self.num_replicas = api.size()
        self.rank = api.rank()
        indices = list(range(len(self.dataset)))
        if self.shuffle:
            random.Random(self.seed + self.epoch).shuffle(indices)
        self.remaining_indices = indices[self.processed_num:]
        self.num_samples = math.ceil(len(self.remaining_indices) / self.num_replicas)
        self.total_size = self.num_samples * self.num_replicas

    def __iter__(self) -> Any:
        indices = self.remaining_indices[:]
        indices += indices[: self.total_size - len(indices)]
        return iter(indices[self.rank:self.total_size:self.num_replicas])

    def __len__(self) -> int:
        return self.num_samples


class _Handler:
    """How TorchState saves, restores and synchronizes one kind of value."""

    def __init__(self, value: Any) -> None:
        self.value = value
        self.save()

    def set_value(self, value: Any) -> None:
        self.value = value
        self.save()

    def save(self) -> None:
        self.saved = copy.deepcopy(self.value.state_dict())

    def restore(self) -> None:
        self.value.load_state_dict(self.saved)

    def sync(self) -> None:
        raise NotImplementedError


class _ModelHandler(_Handler):
    def sync(self) -> None:
        api.broadcast_parameters(self.value.state_dict(), root_rank=0)


class _OptimizerHandler(_Handler):
    def sync(self) -> None:
        broadcast_optimizer_state(self.value, root_rank=0)


class _SamplerHandler(_Handler):
    def sync(self) -> None:
        self.value.load_state_dict(api.broadcast_object(self.value.state_dict(), 0))


_HANDLERS: list[tuple[type, type[_Handler]]] = [
    (torch.nn.Module, _ModelHandler),
    (torch.optim.Optimizer, _OptimizerHandler),
    (ElasticSampler, _SamplerHandler),
]


class TorchState(ObjectState):
    """A model, its optimizer, and any other values (keyword arguments, as ``ObjectState``):
    modules, optimizers and ``ElasticSampler``s are saved and restored by their
    ``state_dict()`` and synchronized from rank 0 (parameters, optimizer state); the rest as
    ``ObjectState``'s attributes. Horovod's ``TorchState``."""

    def __init__(self, model: torch.nn.Module | None = None,
                 optimizer: torch.optim.Optimizer | None = None, **kwargs: Any) -> None:
        kwargs.update(model=model, optimizer=optimizer)
        handlers: dict[str, _Handler] = {}
        for name, value in list(kwargs.items()):
            for kind, handler in _HANDLERS:
                if isinstance(value, kind):
                    handlers[name] = handler(value)
                    del kwargs[name]
                    break
        self._handlers = handlers
        for name, handler in handlers.items():
            setattr(self, name, handler.value)
        super().__init__(**kwargs)

    def __setattr__(self, name: str, value: Any) -> None:
        if name != "_handlers" and name in getattr(self, "_handlers", {}) and hasattr(self, name):
            self._handlers[name].set_value(value)
        super().__setattr__(name, value)

    def save(self) -> None:
        for handler in self._handlers.values():
            handler.save()
        super().save()

    def restore(self) -> None:
        for handler in self._handlers.values():
            handler.restore()
        super().restore()

    def sync(self) -> None:
        for handler in self._handlers.values():
            handler.sync()
        super().sync()

    def snapshot(self) -> bytes:
        return self.serializer()()

    def serializer(self) -> Callable[[], bytes]:
        # The handlers' saved state_dicts are fresh deep copies that nothing changes: they
        # are serialized later, on the commit thread. The other attributes are pickled now.
        saved = {n: h.saved for n, h in self._handlers.items()}
        objects = pickle.dumps(self._saved_state, protocol=pickle.HIGHEST_PROTOCOL)

        def serialize() -> bytes:
            buffer = io.BytesIO()
            torch.save({"handlers": saved, "objects": objects}, buffer)
            return buffer.getvalue()

        return serialize

    def load_snapshot(self, payload: bytes) -> None:
        saved = torch.load(io.BytesIO(payload), weights_only=False)
        for name, handler in self._handlers.items():
            handler.saved = saved["handlers"][name]
        self._saved_state = pickle.loads(saved["objects"])
        self.restore()

