"""ringlet: bandwidth-optimal allreduce over MPI, with a Rust core, for data-parallel training.

>>> import numpy as np, ringlet
>>> grads = np.ones(1 << 20, dtype=np.float32)
>>> ringlet.allreduce(grads, op="avg", out=grads)   # in place, on every rank

Run under ``mpirun -n N python script.py`` (or ``srun``). See the README for the full API.
"""

from . import selector
from ._allreduce import allreduce
from ._core import MismatchError, RingletError
from ._dtypes import OPS, SUPPORTED_DTYPES
from ._gradients import Handle, allreduce_async, allreduce_group_async, average_gradients
from ._runtime import (
    barrier,
    init,
    is_initialized,
    owns_mpi,
    rank,
    reset_stats,
    shutdown,
    size,
    stats,
    thread_level,
)
from .selector import ALGORITHMS, calibrate, explain

__all__ = [
    "ALGORITHMS",
    "OPS",
    "SUPPORTED_DTYPES",
    "Handle",
    "MismatchError",
    "RingletError",
    "allreduce",
    "allreduce_async",
    "allreduce_group_async",
    "average_gradients",
    "barrier",
    "calibrate",
    "explain",
    "init",
    "is_initialized",
    "owns_mpi",
    "rank",
    "reset_stats",
    "selector",
    "shutdown",
    "size",
    "stats",
    "thread_level",
]

__version__ = "0.1.0"
