"""Arrays in the node's shared memory: ``ringlet.empty`` and ``ringlet.zeros``.

When every rank of ringlet's communicator runs on one node, ringlet maps a segment that all of
them share (``MPI_Win_allocate_shared``) and can reduce through it with the ``shm`` algorithm.
An array that itself lives in shared memory is reduced where it is: the other ranks read it in
place, so nothing is copied in. Elsewhere (several nodes, one rank, ``RINGLET_SHM=0``, or no
room in ``/dev/shm``) these functions return ordinary NumPy arrays, and everything else works
the same.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from . import _core
from ._dtypes import dtype_name
from ._membership import ProcessSet, place
from ._runtime import init, register_thread


@dataclass(frozen=True)
class SharedMemory:
    """Whether the ranks share memory (and the ``shm`` algorithm can run), and if not, why."""

    available: bool
    reason: str

    def __str__(self) -> str:
        return "shared memory: " + ("available" if self.available else f"none ({self.reason})")


def shared_memory(process_set: ProcessSet | None = None) -> SharedMemory:
    """Whether ringlet's communicator (or ``process_set``) has the node's shared memory. Not
    collective: the answer was agreed at ``init``."""
    status = _core.shared_memory(place(process_set).id)
    available, reason = status.available, status.reason
    return SharedMemory(available, reason)


def _shape_of(shape: Any) -> tuple[int, ...]:
    dims = (shape,) if isinstance(shape, (int, np.integer)) else tuple(shape)
    if not all(isinstance(d, (int, np.integer)) and d >= 0 for d in dims):
        raise ValueError(f"shape must be non-negative integers, got {shape!r}")
    return tuple(int(d) for d in dims)


def empty(
    shape: int | tuple[int, ...], dtype: Any = np.float32, *,
    process_set: ProcessSet | None = None,
) -> np.ndarray:
    """A C-contiguous array of ``shape`` and ``dtype`` in the node's shared memory, so that an
    allreduce on it reads it in place on the other ranks. Collective: every rank (of
    ``process_set``) calls it with the same shape and dtype, in the same order as its other
    collectives. Its contents are zeros (shared memory starts zeroed), but do not rely on it:
    use ``zeros`` for that. Without shared memory it is ``numpy.empty``.

    The memory stays valid as long as the array (or a view of it) lives, also after
    ``ringlet.shutdown()``; memory that every rank has dropped is freed at a later allocation.
    """
    init()
    register_thread()
    dims = _shape_of(shape)
    np_dtype = np.dtype(dtype)
    dtype_name(np_dtype)  # only the dtypes ringlet reduces
    where = place(process_set)
    nbytes = math.prod(dims) * np_dtype.itemsize
    if not _core.shared_memory(where.id).available:
        return np.zeros(dims, dtype=np_dtype)
    buffer = _core.shared_empty(nbytes, where.id)
    return np.asarray(buffer).view(np_dtype).reshape(dims)


def zeros(
    shape: int | tuple[int, ...], dtype: Any = np.float32, *,
    process_set: ProcessSet | None = None,
) -> np.ndarray:
    """``empty``, filled with zeros."""
    array = empty(shape, dtype, process_set=process_set)
    array[...] = 0
    return array


def is_shared(array: np.ndarray) -> bool:
    """Whether ``array`` (or the array it views) lives in ringlet's shared memory."""
    base = array
    while isinstance(base, np.ndarray) and base.base is not None:
        base = base.base
    return isinstance(base, _core.SharedBuffer)
