"""Horovod's API on ringlet: ``import ringlet.hvd as hvd``.

Every function of ``horovod.torch`` is here with the same name, argument order and semantics:
``hvd.init()``, ``hvd.allreduce(x)`` (averages by default), ``hvd.broadcast(x, root_rank=0)``,
``hvd.allgather(x)``, ... They take NumPy arrays, and PyTorch CPU tensors once
``ringlet.hvd.torch`` is imported (which adds ``DistributedOptimizer`` and
``broadcast_optimizer_state``).
"""

from __future__ import annotations

from ringlet.elastic import HostsUpdatedInterrupt

from ._api import api as _horovod
from ._ops import (
    Adasum,
    Average,
    Compression,
    Compressor,
    HorovodInternalError,
    Max,
    Min,
    Product,
    ReduceOp,
    Sum,
)
from ._process_sets import ProcessSet, global_process_set

init = _horovod.init
shutdown = _horovod.shutdown
is_initialized = _horovod.is_initialized
rank = _horovod.rank
size = _horovod.size
local_rank = _horovod.local_rank
local_size = _horovod.local_size
cross_rank = _horovod.cross_rank
cross_size = _horovod.cross_size
mpi_threads_supported = _horovod.mpi_threads_supported
mpi_enabled = _horovod.mpi_enabled
mpi_built = _horovod.mpi_built
gloo_enabled = _horovod.gloo_enabled
gloo_built = _horovod.gloo_built
nccl_built = _horovod.nccl_built
add_process_set = _horovod.add_process_set
remove_process_set = _horovod.remove_process_set
alltoall = _horovod.alltoall
alltoall_async = _horovod.alltoall_async
start_timeline = _horovod.start_timeline
stop_timeline = _horovod.stop_timeline
ddl_built = _horovod.ddl_built
ccl_built = _horovod.ccl_built
cuda_built = _horovod.cuda_built
rocm_built = _horovod.rocm_built
is_homogeneous = _horovod.is_homogeneous
allgather_async = _horovod.allgather_async
grouped_allgather = _horovod.grouped_allgather
grouped_allgather_async = _horovod.grouped_allgather_async
reducescatter_async = _horovod.reducescatter_async
grouped_reducescatter = _horovod.grouped_reducescatter
grouped_reducescatter_async = _horovod.grouped_reducescatter_async
allreduce = _horovod.allreduce
allreduce_ = _horovod.allreduce_
allreduce_async = _horovod.allreduce_async
allreduce_async_ = _horovod.allreduce_async_
grouped_allreduce = _horovod.grouped_allreduce
grouped_allreduce_ = _horovod.grouped_allreduce_
grouped_allreduce_async = _horovod.grouped_allreduce_async
grouped_allreduce_async_ = _horovod.grouped_allreduce_async_
synchronize = _horovod.synchronize
poll = _horovod.poll
allgather = _horovod.allgather
allgather_object = _horovod.allgather_object
reducescatter = _horovod.reducescatter
broadcast = _horovod.broadcast
broadcast_ = _horovod.broadcast_
broadcast_async = _horovod.broadcast_async
broadcast_async_ = _horovod.broadcast_async_
broadcast_object = _horovod.broadcast_object
broadcast_parameters = _horovod.broadcast_parameters
barrier = _horovod.barrier
join = _horovod.join

# hvd.elastic.run, State, ObjectState (not in __all__: each framework's module has its own).
from . import elastic  # noqa: E402, F401

__all__ = [
    "Adasum",
    "Average",
    "Compression",
    "Compressor",
    "HorovodInternalError",
    "HostsUpdatedInterrupt",
    "Max",
    "Min",
    "ProcessSet",
    "Product",
    "ReduceOp",
    "Sum",
    "add_process_set",
    "allgather",
    "allgather_async",
    "allgather_object",
    "allreduce",
    "allreduce_",
    "allreduce_async",
    "allreduce_async_",
    "alltoall",
    "alltoall_async",
    "barrier",
    "broadcast",
    "broadcast_",
    "broadcast_async",
    "broadcast_async_",
    "broadcast_object",
    "broadcast_parameters",
    "ccl_built",
    "cross_rank",
    "cross_size",
    "cuda_built",
    "ddl_built",
    "global_process_set",
    "gloo_built",
    "gloo_enabled",
    "grouped_allgather",
    "grouped_allgather_async",
    "grouped_allreduce",
    "grouped_allreduce_",
    "grouped_allreduce_async",
    "grouped_allreduce_async_",
    "grouped_reducescatter",
    "grouped_reducescatter_async",
    "init",
    "is_homogeneous",
    "is_initialized",
    "join",
    "local_rank",
    "local_size",
    "mpi_built",
    "mpi_enabled",
    "mpi_threads_supported",
    "nccl_built",
    "poll",
    "rank",
    "reducescatter",
    "reducescatter_async",
    "remove_process_set",
    "rocm_built",
    "shutdown",
    "size",
    "start_timeline",
    "stop_timeline",
    "synchronize",
]
