"""Horovod's TensorFlow 2 API on ringlet: replace ``import horovod.tensorflow as hvd`` with
``import ringlet.hvd.tensorflow as hvd`` in a CPU training script.

Every collective takes ``tf.Tensor`` and ``tf.Variable`` (and ``tf.IndexedSlices`` for
allreduce), works eagerly and inside ``tf.function``, and is differentiable with Horovod's
gradient rules. Eagerly, a collective reads the tensor's memory in place and hands its result
to TensorFlow without a copy (DLPack). Inside a graph, each call is one stateful
``tf.numpy_function``: TensorFlow's automatic control dependencies run stateful operations in
program order, so every rank's collectives meet in the same order; its input is the tensor's
own memory and its output, aligned, becomes the result tensor without a copy. The reduction
itself runs in ringlet's core, in a fresh result buffer: one copy at most, as eagerly.
"""

from __future__ import annotations

try:
    import tensorflow as tf  # noqa: F401 - here, to say how to install it
except ImportError as exc:  # pragma: no cover - tensorflow is an optional extra
    raise ImportError(
        "ringlet.hvd.tensorflow needs TensorFlow: pip install 'ringlet[tensorflow]'"
    ) from exc

# Everything below is re-exported (``__all__``), as Horovod's horovod.tensorflow has it.
from .. import *  # noqa: F403 - the process functions and constants, Horovod's names
from .. import __all__ as _hvd_all
from .._ops import Adasum, Average, Compression, Max, Min, Product, Sum  # noqa: F401
from .._process_sets import global_process_set  # noqa: F401
from ._collectives import (  # noqa: F401
    allgather,
    allreduce,
    alltoall,
    broadcast,
    broadcast_,
    broadcast_global_variables,
    broadcast_variables,
    grouped_allgather,
    grouped_allreduce,
    grouped_reducescatter,
    reducescatter,
)
from ._gradients import (  # noqa: F401
    DistributedGradientTape,
    DistributedOptimizer,
    PartialDistributedGradientTape,
)
from ._graph import InvalidArgumentError, TensorFlowBackend  # noqa: F401
from ._process import (  # noqa: F401
    allgather_object,
    barrier,
    broadcast_object,
    broadcast_object_fn,
    join,
    local_rank_op,
    local_size_op,
    process_set_included_op,
    rank_op,
    size_op,
)

_OWN = [
    "Adasum", "Average", "Compression", "DistributedGradientTape", "DistributedOptimizer",
    "InvalidArgumentError", "Max", "Min", "PartialDistributedGradientTape", "Product", "Sum",
    "allgather",
    "allgather_object", "allreduce", "alltoall", "barrier", "broadcast", "broadcast_",
    "broadcast_global_variables", "broadcast_object", "broadcast_object_fn",
    "broadcast_variables", "global_process_set", "grouped_allgather", "grouped_allreduce",
    "grouped_reducescatter", "join", "local_rank_op", "local_size_op",
    "process_set_included_op", "rank_op", "reducescatter", "size_op", "elastic",
]
from . import elastic  # noqa: E402, F401 - hvd.elastic, as in horovod.tensorflow

__all__ = sorted(set(_hvd_all) | set(_OWN))
