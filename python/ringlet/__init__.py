"""ringlet: bandwidth-optimal collectives over MPI, with a Rust core, for data-parallel training.

>>> import numpy as np, ringlet
>>> grads = np.ones(1 << 20, dtype=np.float32)
>>> ringlet.allreduce(grads, op="avg", out=grads)   # in place, on every rank

Run under ``mpirun -n N python script.py`` (or ``srun``). See the README for the full API.
"""

from __future__ import annotations

from ._mpi_abi import NoMpiError, load_core, running_as_main

# Before anything imports the core: a wheel's core needs its MPI library loaded first.
try:
    load_core()
except NoMpiError as no_mpi:
    if running_as_main("ringlet.info", "ringlet.run", "ringletrun"):
        # `python -m ringlet.info` (or ringletrun) with no MPI: say what was tried, without a
        # traceback through this package's import.
        raise SystemExit(f"ringlet cannot load: {no_mpi}") from None
    raise

from . import calibration, selector
from ._allreduce import allreduce
from ._arrays import aligned_empty
from ._collectives import (
    Handle,
    allgather,
    allgather_async,
    allgather_object,
    alltoall,
    barrier,
    broadcast,
    broadcast_async,
    broadcast_object,
    reduce,
    reduce_scatter,
    reduce_scatter_async,
)
from ._core import MismatchError, ProcessFailedError, RingletError
from ._doorbell import Doorbell, doorbell
from ._dtypes import OPS, SUPPORTED_DTYPES
from ._gradients import (
    DEFAULT_FUSION_THRESHOLD,
    BucketPlan,
    allreduce_async,
    allreduce_group_async,
    average_gradients,
    fusion_threshold_bytes,
    join,
    plan_buckets,
)
from ._membership import ProcessSet
from ._process_sets import add_process_set, process_sets, remove_process_set
from ._runtime import (
    Topology,
    as_caller,
    init,
    is_initialized,
    let_through,
    make_exclusive,
    mpi_library,
    owns_mpi,
    rank,
    reset_stats,
    settings,
    shutdown,
    size,
    stats,
    thread_level,
    topology,
)
from ._shared import SharedMemory, empty, is_shared, shared_memory, zeros
from ._version import __version__ as __version__
from .selector import ALGORITHMS, calibrate, explain

__all__ = [
    "ALGORITHMS",
    "DEFAULT_FUSION_THRESHOLD",
    "OPS",
    "SUPPORTED_DTYPES",
    "BucketPlan",
    "Doorbell",
    "Handle",
    "MismatchError",
    "ProcessFailedError",
    "ProcessSet",
    "RingletError",
    "SharedMemory",
    "Topology",
    "add_process_set",
    "algorithms",
    "aligned_empty",
    "allgather",
    "allgather_async",
    "allgather_object",
    "allreduce",
    "allreduce_async",
    "allreduce_group_async",
    "alltoall",
    "as_caller",
    "average_gradients",
    "barrier",
    "broadcast",
    "broadcast_async",
    "broadcast_object",
    "calibrate",
    "calibration",
    "doorbell",
    "empty",
    "explain",
    "fusion_threshold_bytes",
    "init",
    "is_initialized",
    "is_shared",
    "join",
    "let_through",
    "make_exclusive",
    "mpi_library",
    "owns_mpi",
    "plan_buckets",
    "process_sets",
    "rank",
    "reduce",
    "reduce_scatter",
    "reduce_scatter_async",
    "remove_process_set",
    "reset_stats",
    "selector",
    "settings",
    "shared_memory",
    "shutdown",
    "size",
    "stats",
    "thread_level",
    "topology",
    "zeros",
]


def algorithms(
    collective: str = "allreduce", dtype: str | None = None, op: str = "sum"
) -> tuple[str, ...]:
    """The algorithms ``collective`` ("allreduce", "broadcast", "reduce", "allgather",
    "alltoall" or "reduce_scatter") accepts besides "auto", in the order the core registers
    them; with ``dtype``, only those that can reduce it with ``op`` (for example, "mpi" cannot
    reduce 16-bit floats)."""
    from . import _core

    names = _core.algorithms(collective)
    if dtype is None or collective not in ("allreduce", "reduce", "reduce_scatter"):
        return tuple(names)
    return tuple(
        name for name in names
        if _core.algorithm_support(collective, name, dtype, op)[0] != "no"
    )
