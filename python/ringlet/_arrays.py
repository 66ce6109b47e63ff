"""Checks every collective makes of its arguments, and how a rank that refuses a call keeps
the other ranks from waiting for it."""

from __future__ import annotations

import math
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np

from . import _core
from ._runtime import init, register_thread


@contextmanager
def refused_together(
    collective: str, errors: tuple[type[Exception], ...] = (TypeError, ValueError),
    process_set: int = 0,
) -> Iterator[None]:
    """Argument checks run inside. If one fails (one of ``errors``), this rank still
    takes part in the call's consistency check (in ``process_set``, by id), marked as
    refused, before the error propagates: the other ranks then raise ``MismatchError`` naming
    this rank's reason instead of waiting for it, and every rank stays in step for the next
    call."""
    register_thread()
    try:
        yield
    except errors as exc:
        try:
            init()
            _core.refuse(collective, f"{type(exc).__name__}: {exc}", process_set)
        except _core.RingletError:
            pass  # ringlet itself is unusable; the argument error is still the one to report
        raise


def as_array(x: Any, what: str) -> np.ndarray:
    if not isinstance(x, (np.ndarray, np.generic)):
        raise TypeError(
            f"{what} takes a numpy.ndarray, got {type(x).__name__}; "
            "convert it with numpy.asarray first"
        )
    return np.asarray(x)


def why_not_readable(array: np.ndarray) -> str | None:
    """Why the core cannot read ``array`` where it is (None: it can)."""
    if not array.flags.c_contiguous:
        return f"it is not C-contiguous (strides {array.strides} for shape {array.shape})"
    if not array.flags.aligned:
        return "its data is not aligned to its element size"
    if not array.dtype.isnative:
        return f"its byte order ({array.dtype.str}) is not the machine's"
    return None


def why_not_in_place(array: np.ndarray) -> str | None:
    """Why the core cannot reduce ``array`` where it is (None: it can)."""
    if array.flags.c_contiguous and not array.flags.writeable:
        return "it is read-only"
    return why_not_readable(array)


def same_memory(a: np.ndarray, b: np.ndarray) -> bool:
    """Whether ``a`` and ``b`` are views of exactly the same elements (the cheap tests first:
    ``__array_interface__`` builds a dict per call)."""
    if a is b:
        return True
    return (
        a.shape == b.shape
        and a.strides == b.strides
        and np.may_share_memory(a, b)
        and a.__array_interface__["data"][0] == b.__array_interface__["data"][0]
    )


def native_copy(x: np.ndarray) -> np.ndarray:
    """A C-contiguous copy of ``x`` in the machine's byte order."""
    native = x.dtype if x.dtype.isnative else x.dtype.newbyteorder("=")
    return np.array(x, dtype=native, order="C", copy=True)


def check_out(x: np.ndarray, out: Any, what: str) -> np.ndarray:
    """Validate ``out`` for ``x``: ``out`` itself if it is ``x`` (in place), else the array to
    fill with a copy of ``x`` once every other check has passed (nothing is written here)."""
    if not isinstance(out, np.ndarray):
        raise ValueError(f"out must be a numpy.ndarray, got {type(out).__name__}")
    if out.dtype != x.dtype or out.shape != x.shape:
        raise ValueError(
            f"out must have x's dtype and shape ({x.dtype}{list(x.shape)}), "
            f"got {out.dtype}{list(out.shape)}"
        )
    reason = why_not_in_place(out)
    in_place = same_memory(out, x)
    if reason is not None:
        target = f"an in-place {what} (out=x)" if in_place else "out"
        raise ValueError(
            f"{target} needs a C-contiguous, writeable, aligned array in native byte order, "
            f"but {reason}; call {what}(x) without out= to work on a copy"
        )
    if not in_place and np.shares_memory(out, x):
        raise ValueError("out overlaps x without being x; pass out=x or a separate array")
    return out


def fill(x: np.ndarray, out: np.ndarray | None) -> np.ndarray:
    """The array a collective works in: a copy of ``x``, or ``out`` (checked) holding ``x``."""
    if out is None:
        return native_copy(x)
    if not same_memory(out, x):
        np.copyto(out, x)
    return out


FRAMEWORK_ALIGNMENT = 64
"""The alignment at which JAX and TensorFlow take over host memory without a copy."""


def aligned_empty(shape: int | tuple[int, ...], dtype: Any = np.float32, *,
                  alignment: int = FRAMEWORK_ALIGNMENT) -> np.ndarray:
    """A fresh C-contiguous array whose data starts at a multiple of ``alignment`` bytes: a
    result that JAX (``jax.device_put``) and TensorFlow (``tf.numpy_function``'s outputs,
    DLPack) then use in place instead of copying."""
    shape = (shape,) if isinstance(shape, int) else tuple(shape)
    dtype = np.dtype(dtype)
    nbytes = math.prod(shape) * dtype.itemsize
    raw = np.empty(nbytes + alignment, dtype=np.uint8)
    start = -raw.ctypes.data % alignment
    return raw[start:start + nbytes].view(dtype).reshape(shape)
