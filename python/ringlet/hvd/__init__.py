"""Horovod's API on ringlet: ``import ringlet.hvd as hvd``.

Every function of ``horovod.torch`` is here with the same name, argument order and semantics:
``hvd.init()``, ``hvd.allreduce(x)`` (averages by default), ``hvd.broadcast(x, root_rank=0)``,
``hvd.allgather(x)``, ... They take NumPy arrays, and PyTorch CPU tensors once
``ringlet.hvd.torch`` is imported (which adds ``DistributedOptimizer`` and
``broadcast_optimizer_state``).
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
    ProcessSet,
    Product,
    ReduceOp,
    Sum,
    global_process_set,
)

_api = Horovod()
init = _api.init
shutdown = _api.shutdown
is_initialized = _api.is_initialized
rank = _api.rank
size = _api.size
local_rank = _api.local_rank
local_size = _api.local_size
cross_rank = _api.cross_rank
cross_size = _api.cross_size
mpi_threads_supported = _api.mpi_threads_supported
mpi_enabled = _api.mpi_enabled
mpi_built = _api.mpi_built
gloo_enabled = _api.gloo_enabled
gloo_built = _api.gloo_built
nccl_built = _api.nccl_built
add_process_set = _api.add_process_set
remove_process_set = _api.remove_process_set
alltoall = _api.alltoall
alltoall_async = _api.alltoall_async
start_timeline = _api.start_timeline
stop_timeline = _api.stop_timeline
ddl_built = _api.ddl_built
ccl_built = _api.ccl_built
cuda_built = _api.cuda_built
rocm_built = _api.rocm_built
is_homogeneous = _api.is_homogeneous
allgather_async = _api.allgather_async
grouped_allgather = _api.grouped_allgather
grouped_allgather_async = _api.grouped_allgather_async
reducescatter_async = _api.reducescatter_async
grouped_reducescatter = _api.grouped_reducescatter
grouped_reducescatter_async = _api.grouped_reducescatter_async
allreduce = _api.allreduce
allreduce_ = _api.allreduce_
allreduce_async = _api.allreduce_async
allreduce_async_ = _api.allreduce_async_
grouped_allreduce = _api.grouped_allreduce
grouped_allreduce_ = _api.grouped_allreduce_
grouped_allreduce_async = _api.grouped_allreduce_async
grouped_allreduce_async_ = _api.grouped_allreduce_async_
synchronize = _api.synchronize
poll = _api.poll
allgather = _api.allgather
allgather_object = _api.allgather_object
reducescatter = _api.reducescatter
broadcast = _api.broadcast
broadcast_ = _api.broadcast_
broadcast_async = _api.broadcast_async
broadcast_async_ = _api.broadcast_async_
broadcast_object = _api.broadcast_object
broadcast_parameters = _api.broadcast_parameters
barrier = _api.barrier
join = _api.join

__all__ = [
    "Adasum",
    "Average",
    "Compression",
    "Compressor",
    "HorovodInternalError",
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
