"""Horovod's elastic API for Keras 3 (``hvd.elastic`` after ``import ringlet.hvd.keras as
hvd``), on every Keras backend: ``KerasState`` and the callbacks that commit and track the
batch and epoch during ``model.fit``, with ``horovod.keras.elastic``'s semantics."""

from __future__ import annotations

import pickle
from collections.abc import Callable
from typing import Any

import keras
import numpy as np

from ringlet.elastic import HostsUpdatedInterrupt, State, StateError, run

from .._ops import HorovodInternalError
from ..elastic import ObjectState
from ._convert import to_numpy
from .callbacks import broadcast_variables

__all__ = ["CommitStateCallback", "HorovodInternalError", "HostsUpdatedInterrupt",
           "KerasState", "ObjectState", "State", "StateError", "UpdateBatchStateCallback",
           "UpdateEpochStateCallback", "run"]


def _sync(model: Any) -> None:
    """The model's variables up to date (JAX keeps them in the trainer's state mid-epoch)."""
    sync = getattr(model, "jax_state_sync", None)
    if sync is not None:
        sync()


def _optimizer_variables(optimizer: Any) -> list[Any]:
    if optimizer is None:
        return []
    variables = optimizer.variables
    return list(variables() if callable(variables) else variables)


def _values(variables: list[Any]) -> list[np.ndarray]:
    return [np.array(to_numpy(v.value)) for v in variables]


class KerasState(ObjectState):
    """A built Keras model, its optimizer (``model.optimizer`` by default) and any other values
    as attributes: ``save`` copies the model's and optimizer's variables, ``restore`` assigns
    them back, ``sync`` broadcasts rank 0's. Horovod's ``KerasState``
    (``TensorFlowKerasState``)."""

    def __init__(self, model: Any, optimizer: Any = None, backend: Any = None,
                 **kwargs: Any) -> None:
        if not model.built:
            raise ValueError("Model must be built first. Run `model.build(input_shape)`.")
        self.model = model
        self.optimizer = optimizer if optimizer is not None else model.optimizer
        self._save_model()
        super().__init__(**kwargs)

    def _save_model(self) -> None:
        _sync(self.model)
        self._saved_model = _values(list(self.model.variables))
        self._saved_optimizer = _values(_optimizer_variables(self.optimizer))

    def _build_optimizer(self, count: int) -> None:
        """An optimizer makes its slots (momentum, ...) on its first step: make them now if
        the state to load or receive has more variables than it has."""
        optimizer = self.optimizer
        if (optimizer is not None and count > len(_optimizer_variables(optimizer))
                and not getattr(optimizer, "built", False)):
            optimizer.build(self.model.trainable_variables)

    def _load_model(self) -> None:
        for variable, value in zip(self.model.variables, self._saved_model, strict=True):
            variable.assign(value)
        self._build_optimizer(len(self._saved_optimizer))
        variables = _optimizer_variables(self.optimizer)
        if len(variables) == len(self._saved_optimizer):
            for variable, value in zip(variables, self._saved_optimizer, strict=True):
                variable.assign(value)

    def save(self) -> None:
        self._save_model()
        super().save()

    def restore(self) -> None:
        self._load_model()
        super().restore()

    def sync(self) -> None:
        _sync(self.model)
        self._build_optimizer(self._bcast_object(len(_optimizer_variables(self.optimizer))))
        broadcast_variables([*self.model.variables, *_optimizer_variables(self.optimizer)], 0)
        self._save_model()
        super().sync()

    def snapshot(self) -> bytes:
        return self.serializer()()

    def serializer(self) -> Callable[[], bytes]:
        # The saved arrays are fresh copies: serialized later, on the commit thread.
        model, optimizer = self._saved_model, self._saved_optimizer
        objects = pickle.dumps(self._saved_state, protocol=pickle.HIGHEST_PROTOCOL)
        return lambda: pickle.dumps({"model": model, "optimizer": optimizer,
                                     "objects": objects}, protocol=pickle.HIGHEST_PROTOCOL)

    def load_snapshot(self, payload: bytes) -> None:
        saved = pickle.loads(payload)
        self._saved_model, self._saved_optimizer = saved["model"], saved["optimizer"]
        self._saved_state = pickle.loads(saved["objects"])
        self.restore()


class CommitStateCallback(keras.callbacks.Callback):
    """Commit the state every ``batches_per_commit`` batches and at the end of each epoch."""

    def __init__(self, state: State, batches_per_commit: int = 1) -> None:
        super().__init__()
        self.state, self.batches_per_commit = state, batches_per_commit
        self.batches_remaining = batches_per_commit

    def on_train_begin(self, logs: Any = None) -> None:
        self.batches_remaining = self.batches_per_commit

    def on_batch_end(self, batch: int, logs: Any = None) -> None:
        self.batches_remaining -= 1
        if self.batches_remaining == 0:
            self.state.commit()
            self.batches_remaining = self.batches_per_commit

    def on_epoch_end(self, epoch: int, logs: Any = None) -> None:
        self.state.commit()


class UpdateBatchStateCallback(keras.callbacks.Callback):
    """Keep ``state.batch`` at the last batch done, and shorten the first epoch after a reset
    by the batches it had done (when ``fit`` was given ``steps_per_epoch``)."""

    def __init__(self, state: State) -> None:
        super().__init__()
        self.state, self.steps_per_epoch = state, None

    def on_train_begin(self, logs: Any = None) -> None:
        self.steps_per_epoch = None

    def on_epoch_begin(self, epoch: int, logs: Any = None) -> None:
        if self.params.get("steps"):
            if self.steps_per_epoch is None:
                self.steps_per_epoch = self.params.get("steps")
            self.params["steps"] = self.steps_per_epoch - self.state.batch

    def on_batch_end(self, batch: int, logs: Any = None) -> None:
        self.state.batch = batch

    def on_epoch_end(self, epoch: int, logs: Any = None) -> None:
        self.state.batch = 0


class UpdateEpochStateCallback(keras.callbacks.Callback):
    """Keep ``state.epoch`` counting across resets (the next epoch to run)."""

    def __init__(self, state: State) -> None:
        super().__init__()
        self.state = state
        self.initial_epoch = state.epoch

    def on_train_begin(self, logs: Any = None) -> None:
        self.initial_epoch = self.state.epoch

    def on_epoch_end(self, epoch: int, logs: Any = None) -> None:
        self.state.epoch = self.initial_epoch + epoch + 1
