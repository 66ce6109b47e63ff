"""Horovod's API on NumPy arrays: ``import ringlet.hvd as hvd``.

Every function of ``horovod.torch`` that makes sense without a framework is here with the same
name, argument order and semantics: ``hvd.init()``, ``hvd.allreduce(x)`` (averages by
default), ``hvd.broadcast(x, root_rank=0)``, ``hvd.allgather(x)`` and so on. For PyTorch, use
``import ringlet.hvd.torch as hvd``.
"""

from __future__ import annotations

from ._common import (
    Adasum,
    Average,
    Compression,
    Compressor,
    Horovod,
    HorovodInternalError,
    Max,
    Min,
    NumpyBackend,
    Product,
    ReduceOp,
    Sum,
    export,
)

_api = Horovod(NumpyBackend())
export(_api, globals())

__all__ = [  # noqa: RUF022 - grouped as in Horovod's docs
    "Average", "Sum", "Adasum", "Min", "Max", "Product", "ReduceOp",
    "Compression", "Compressor", "HorovodInternalError",
    "init", "shutdown", "is_initialized", "rank", "size", "local_rank", "local_size",
    "cross_rank", "cross_size", "mpi_threads_supported", "mpi_enabled", "mpi_built",
    "gloo_enabled", "gloo_built", "nccl_built",
    "allreduce", "allreduce_", "allreduce_async", "allreduce_async_",
    "grouped_allreduce", "grouped_allreduce_", "grouped_allreduce_async",
    "grouped_allreduce_async_", "synchronize", "poll",
    "allgather", "allgather_object", "reducescatter",
    "broadcast", "broadcast_", "broadcast_async", "broadcast_async_", "broadcast_object",
    "broadcast_parameters", "barrier", "join",
]
