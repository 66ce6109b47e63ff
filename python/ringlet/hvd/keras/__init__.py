"""Horovod's Keras API for Keras 3, on every Keras backend (JAX, PyTorch, TensorFlow):
replace ``import horovod.tensorflow.keras as hvd`` (or ``horovod.keras``) with
``import ringlet.hvd.keras as hvd``.

``DistributedOptimizer`` wraps any ``keras.optimizers.Optimizer``: its ``apply`` (which Keras 3's
trainers call on every backend) averages the gradients across ranks in ringlet's fused
collectives first, inside ``jax.jit`` on JAX (``ringlet.jax``), eagerly on PyTorch, and as a
graph op inside ``tf.function`` on TensorFlow (``ringlet.hvd.tensorflow``). The callbacks and
the collectives on values (``allreduce``, ``allgather``, ``broadcast``, ``reducescatter``) go
through NumPy, eagerly. The backend is Keras' (``KERAS_BACKEND``, set before Keras is imported).
"""

from __future__ import annotations

from typing import Any

import keras
import numpy as np

import ringlet

from .. import (
    add_process_set,
    ccl_built,
    cross_rank,
    cross_size,
    cuda_built,
    ddl_built,
    gloo_built,
    gloo_enabled,
    is_initialized,
    local_rank,
    local_size,
    mpi_built,
    mpi_enabled,
    mpi_threads_supported,
    nccl_built,
    rank,
    remove_process_set,
    rocm_built,
    shutdown,
    size,
    start_timeline,
    stop_timeline,
)
from .._api import api as _numpy_api
from .._api import start as _start
from .._ops import Average, Compression, Sum
from .._process_sets import ProcessSet, global_process_set
from . import _backends, callbacks
from ._convert import to_numpy
from ._optimizer import DistributedOptimizer, PartialDistributedOptimizer, wrapper_class
from .callbacks import (
    BroadcastGlobalVariablesCallback,
    LearningRateScheduleCallback,
    LearningRateWarmupCallback,
    MetricAverageCallback,
    broadcast_variables,
)


def init(comm: Any = None, process_sets: Any = None) -> None:
    """Horovod's ``init``. Operations are matched by name, as Horovod's coordinator matches
    them, except on the JAX backend, where ``DistributedOptimizer``'s allreduces run inside
    ``jax.jit`` as XLA's custom calls, which only their order can match: there they are matched
    by order unless RINGLET_HVD_MATCHING says otherwise."""
    _start(comm, process_sets, _backends.default_matching())


def _numpy(value: Any, what: str) -> np.ndarray:
    """``value`` (a backend tensor, a NumPy array, a Python number or list) as a C array."""
    try:
        return np.array(to_numpy(value), order="C")
    except Exception as exc:  # a traced value: jax.jit's tracers, tf.function's tensors
        raise TypeError(
            f"ringlet.hvd.keras.{what} runs eagerly, on concrete values; inside a compiled "
            f"function use ringlet.jax (JAX) or ringlet.hvd.tensorflow (TensorFlow) ({exc})"
        ) from exc


def allreduce(value: Any, name: Any = None, average: Any = None, prescale_factor: float = 1.0,
              postscale_factor: float = 1.0, op: Any = None,
              compression: Any = Compression.none,
              process_set: Any = global_process_set) -> Any:
    """The reduction (default: average) of a tensor-compatible value over all ranks, as a
    tensor of the Keras backend."""
    result = _numpy_api.allreduce(_numpy(value, "allreduce"), average=average, op=op,
                                  prescale_factor=prescale_factor,
                                  postscale_factor=postscale_factor, compression=compression,
                                  process_set=process_set)
    return keras.ops.convert_to_tensor(result)


def allgather(value: Any, name: Any = None, process_set: Any = global_process_set) -> Any:
    """Every rank's value concatenated along the first dimension (which may differ between
    ranks), as a tensor of the Keras backend."""
    return keras.ops.convert_to_tensor(
        _numpy_api.allgather(_numpy(value, "allgather"), process_set=process_set))


def broadcast(value: Any, root_rank: int, name: Any = None,
              process_set: Any = global_process_set) -> Any:
    """``root_rank``'s value on every rank, as a tensor of the Keras backend."""
    return keras.ops.convert_to_tensor(
        _numpy_api.broadcast(_numpy(value, "broadcast"), root_rank, process_set=process_set))


def reducescatter(value: Any, name: Any = None, op: Any = Average,
                  process_set: Any = global_process_set) -> Any:
    """The reduction (Average or Sum) of the value over all ranks, this rank's block of its
    first dimension (the first ``dim0 % size`` ranks get one row more)."""
    return keras.ops.convert_to_tensor(
        _numpy_api.reducescatter(_numpy(value, "reducescatter"), op=op,
                                 process_set=process_set))


def broadcast_global_variables(root_rank: int) -> None:
    """Horovod's TF1 call; as Horovod's under TensorFlow 2, it refuses: Keras 3 keeps no
    collection of global variables."""
    raise RuntimeError(
        "hvd.broadcast_global_variables() does not support Keras 3, which has no collection "
        "of global variables. Use hvd.BroadcastGlobalVariablesCallback(root_rank) in "
        "model.fit, or hvd.broadcast_variables(model.variables + optimizer.variables, "
        f"root_rank={root_rank}) once both are built."
    )


def _builtin_optimizers() -> list[type]:
    """Every optimizer class Keras exports in keras.optimizers."""
    found = []
    for name in dir(keras.optimizers):
        obj = getattr(keras.optimizers, name)
        if (isinstance(obj, type) and issubclass(obj, keras.optimizers.Optimizer)
                and obj is not keras.optimizers.Optimizer):
            found.append(obj)
    return found


def load_model(filepath: Any, custom_optimizers: Any = None, custom_objects: Any = None,
               compression: Any = Compression.none) -> Any:
    """``keras.models.load_model`` with the saved optimizer (any of keras.optimizers', or of
    ``custom_optimizers``) rebuilt as a ``DistributedOptimizer``, its state restored."""
    ringlet.init()
    objects: dict[str, Any] = {
        cls.__name__: wrapper_class(cls, compression) for cls in _builtin_optimizers()
    }
    for cls in custom_optimizers or ():
        objects[cls.__name__] = wrapper_class(cls, compression)
    if custom_objects is not None:
        objects.update(custom_objects)
    return keras.models.load_model(filepath, custom_objects=objects)


__all__ = [
    "Average",
    "BroadcastGlobalVariablesCallback",
    "Compression",
    "DistributedOptimizer",
    "LearningRateScheduleCallback",
    "LearningRateWarmupCallback",
    "MetricAverageCallback",
    "PartialDistributedOptimizer",
    "ProcessSet",
    "Sum",
    "add_process_set",
    "allgather",
    "allreduce",
    "broadcast",
    "broadcast_global_variables",
    "broadcast_variables",
    "callbacks",
    "ccl_built",
    "cross_rank",
    "cross_size",
    "cuda_built",
    "ddl_built",
    "elastic",
    "global_process_set",
    "gloo_built",
    "gloo_enabled",
    "init",
    "is_initialized",
    "load_model",
    "local_rank",
    "local_size",
    "mpi_built",
    "mpi_enabled",
    "mpi_threads_supported",
    "nccl_built",
    "rank",
    "reducescatter",
    "remove_process_set",
    "rocm_built",
    "shutdown",
    "size",
    "start_timeline",
    "stop_timeline",
]

from . import elastic  # noqa: E402 - hvd.elastic, as in horovod.keras (it uses the above)
