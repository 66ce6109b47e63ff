"""Horovod's Keras callbacks for Keras 3, on every backend: variables move through NumPy
(``keras.ops.convert_to_numpy``, ringlet's collectives, ``variable.assign``).

On the JAX backend Keras keeps the training state outside the model's variables during an
epoch; a callback that reads or writes variables between batches first writes that state back
(``model.jax_state_sync()``), and Keras then reads the variables again for the next step.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import keras
import numpy as np

import ringlet

from .._api import api as _numpy_api
from .._ops import Average
from .._process_sets import ringlet_set
from ._convert import to_numpy


def _sync(model: Any) -> None:
    """The model's variables up to date (JAX keeps them in the trainer's state mid-epoch)."""
    sync = getattr(model, "jax_state_sync", None)
    if sync is not None:
        sync()


def broadcast_variables(variables: Iterable[Any], root_rank: int, process_set: Any = None
                        ) -> None:
    """Overwrite each Keras variable with ``root_rank``'s value, on every rank (collective).
    Every rank must pass variables of the same shapes and dtypes in the same order."""
    variables = list(variables)
    chosen = ringlet_set(process_set)
    if chosen is not None and ringlet.rank() not in chosen.ranks:
        return
    arrays = [np.array(to_numpy(v.value), order="C") for v in variables]
    # Through ringlet.hvd's API (named, in place), so that name matching covers them too.
    handles = [_numpy_api.broadcast_async_(a, root_rank, process_set=process_set)
               for a in arrays]
    for handle in handles:
        handle.synchronize()
    if ringlet.rank() == root_rank:
        return  # its values are the broadcast ones
    for v, a in zip(variables, arrays):
        v.assign(a)


class BroadcastGlobalVariablesCallback(keras.callbacks.Callback):
    """Broadcast the model's and the optimizer's variables from ``root_rank`` to every other
    rank when training starts, so that every rank starts from the same weights (random, or
    restored on the root).

    The broadcast happens in ``on_train_begin``, before the first step (building the optimizer
    if the trainer has not yet: TensorFlow's builds it in the first step). Horovod's comes
    after the first step, as TF2's optimizers made their variables in it.
    """

    def __init__(self, root_rank: int, device: str = "", local_variables: Any = None) -> None:
        super().__init__()
        self.root_rank = root_rank
        self.device = device
        self.broadcast_done = False
        if local_variables is None:
            local_variables = []
        elif isinstance(local_variables, keras.Variable):
            local_variables = [local_variables]
        elif not all(isinstance(v, keras.Variable) for v in local_variables):
            raise ValueError("All local variables must be of keras.Variable type.")
        self._local_vars = {id(v) for v in local_variables}

    def register_local_var(self, var: Any) -> None:
        """A variable that is not broadcast (it stays as each worker has it)."""
        self._local_vars.add(id(var))

    def _broadcast(self) -> None:
        if self.broadcast_done:
            return
        model = self.model
        _sync(model)
        variables = [v for v in model.variables if id(v) not in self._local_vars]
        optimizer = getattr(model, "optimizer", None)
        if optimizer is not None:
            if not optimizer.built:  # TensorFlow's trainer builds it in the first step
                optimizer.build(model.trainable_variables)
            variables += [v for v in optimizer.variables if id(v) not in self._local_vars]
        broadcast_variables(variables, self.root_rank)
        self.broadcast_done = True

    def on_train_begin(self, logs: Any = None) -> None:
        self._broadcast()

    def on_batch_end(self, batch: int, logs: Any = None) -> None:
        self._broadcast()  # if training began without on_train_begin (a custom loop)


class MetricAverageCallback(keras.callbacks.Callback):
    """Average every metric of the epoch's logs over the ranks at the end of each epoch, in
    place, for the callbacks after it (ReduceLROnPlateau, TensorBoard, checkpoints): put it
    before them. Every rank must log the same metrics."""

    def __init__(self, device: str = "") -> None:
        super().__init__()
        self.device = device

    def _average_metrics_in_place(self, logs: Any) -> None:
        if not logs:
            return
        names = sorted(logs)  # the same order on every rank
        values = np.array([float(np.asarray(logs[name])) for name in names], dtype=np.float64)
        averaged = _numpy_api.allreduce(values, op=Average)
        for name, value in zip(names, averaged):
            logs[name] = float(value)

    def on_epoch_end(self, epoch: int, logs: Any = None) -> None:
        self._average_metrics_in_place(logs)


def _get_lr(optimizer: Any) -> float:
    return float(keras.ops.convert_to_numpy(optimizer.learning_rate))


class LearningRateScheduleCallback(keras.callbacks.Callback):
    """Set the learning rate to ``initial_lr * multiplier(epoch)`` from ``start_epoch`` until
    ``end_epoch`` (exclusive): at each epoch's start with ``staircase``, else at each batch's
    start with the fractional epoch ``epoch + batch / steps_per_epoch``. ``multiplier`` is a
    function of the epoch or a constant c (then ``c ** (epoch - start_epoch)``).

    ``momentum_correction`` (optimizers with a ``momentum``: SGD, RMSprop): when the learning
    rate changes from lr to lr', the momentum buffers are scaled by lr'/lr for the next step,
    which is Horovod's correction (momentum times lr'/lr for one step) for plain momentum.
    The optimizer's learning rate must be a float (a variable), not a schedule.
    """

    def __init__(self, initial_lr: float, multiplier: float | Callable[[float], float],
                 start_epoch: int = 0, end_epoch: int | None = None, staircase: bool = True,
                 momentum_correction: bool = True, steps_per_epoch: int | None = None) -> None:
        super().__init__()
        self.start_epoch = start_epoch
        self.end_epoch = end_epoch
        self.staircase = staircase
        self.momentum_correction = momentum_correction
        self.initial_lr = initial_lr
        self.steps_per_epoch = steps_per_epoch
        self.current_epoch: int | None = None
        if not callable(multiplier):
            constant = multiplier
            self.multiplier: Callable[[float], float] = (
                lambda epoch: constant ** (epoch - start_epoch))
        else:
            self.multiplier = multiplier
        if self.initial_lr is None:
            raise ValueError("Parameter `initial_lr` is required")

    def _autodetect_steps_per_epoch(self) -> int:
        if self.params.get("steps"):
            return int(self.params["steps"])
        raise ValueError("Could not autodetect the number of steps per epoch. Please specify "
                         f"the steps_per_epoch parameter to the {type(self).__name__}().")

    def _momentum_buffers(self, optimizer: Any) -> list[Any]:
        if (not self.momentum_correction or not optimizer.built  # no buffers yet: zeros
                or not float(getattr(optimizer, "momentum", 0) or 0)):
            return []
        buffers = getattr(optimizer, "momentums", None) or getattr(optimizer, "_momentums", None)
        if not buffers:
            raise NotImplementedError(
                f"momentum_correction: ringlet does not know where {type(optimizer).__name__} "
                "keeps its momentum; pass momentum_correction=False"
            )
        return [b for b in buffers if b is not None]

    def _adjust_learning_rate(self, epoch: float) -> None:
        optimizer = self.model.optimizer
        _sync(self.model)
        old_lr = _get_lr(optimizer)
        new_lr = self.initial_lr * self.multiplier(epoch)
        optimizer.learning_rate = new_lr
        if old_lr != new_lr and old_lr != 0:
            for buffer in self._momentum_buffers(optimizer):
                buffer.assign(buffer.value * (new_lr / old_lr))

    def on_train_begin(self, logs: Any = None) -> None:
        if isinstance(self.model.optimizer._learning_rate,
                      keras.optimizers.schedules.LearningRateSchedule):
            raise ValueError(f"{type(self).__name__} sets the optimizer's learning rate, which "
                             "is a LearningRateSchedule here; give the optimizer a float")
        if self.initial_lr is None:
            self.initial_lr = _get_lr(self.model.optimizer)
        if not self.staircase and not self.steps_per_epoch:
            self.steps_per_epoch = self._autodetect_steps_per_epoch()

    def on_epoch_begin(self, epoch: int, logs: Any = None) -> None:
        self.current_epoch = epoch

    def on_batch_begin(self, batch: int, logs: Any = None) -> None:
        epoch = self.current_epoch
        assert epoch is not None
        if epoch < self.start_epoch or (self.end_epoch is not None and epoch >= self.end_epoch):
            return  # outside of the adjustment scope
        if self.staircase and batch == 0:
            self._adjust_learning_rate(epoch)
        elif not self.staircase:
            assert self.steps_per_epoch
            self._adjust_learning_rate(epoch + float(batch) / self.steps_per_epoch)

    def on_epoch_end(self, epoch: int, logs: Any = None) -> None:
        if logs is not None:
            _sync(self.model)
            logs["lr"] = _get_lr(self.model.optimizer)


class LearningRateWarmupCallback(LearningRateScheduleCallback):
    """Gradual learning rate warmup over ``warmup_epochs`` ("Accurate, Large Minibatch SGD:
    Training ImageNet in 1 Hour"): from ``initial_lr / size()`` to ``initial_lr``, adjusted at
    every batch::

        lr'(epoch) = lr / size * (epoch * (size - 1) / warmup + 1)
    """

    def __init__(self, initial_lr: float, warmup_epochs: int = 5,
                 momentum_correction: bool = True, steps_per_epoch: int | None = None,
                 verbose: int = 0) -> None:
        def multiplier(epoch: float) -> float:
            # Round numbers at each epoch's end, as Horovod's.
            assert self.steps_per_epoch
            epoch += 1.0 / self.steps_per_epoch
            size = ringlet.size()
            return 1.0 / size * (epoch * (size - 1) / warmup_epochs + 1)

        super().__init__(initial_lr, multiplier, start_epoch=0, end_epoch=warmup_epochs,
                         staircase=False, momentum_correction=momentum_correction,
                         steps_per_epoch=steps_per_epoch)
        self.verbose = verbose

    def on_epoch_end(self, epoch: int, logs: Any = None) -> None:
        super().on_epoch_end(epoch, logs)
        if epoch == self.end_epoch - 1 and self.verbose > 0 and ringlet.rank() == 0:
            new_lr = _get_lr(self.model.optimizer)
            print(f"\nEpoch {epoch + 1}: finished gradual learning rate warmup to {new_lr:g}.")


__all__ = [
    "BroadcastGlobalVariablesCallback",
    "LearningRateScheduleCallback",
    "LearningRateWarmupCallback",
    "MetricAverageCallback",
]
