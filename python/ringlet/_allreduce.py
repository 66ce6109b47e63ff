"""``ringlet.allreduce``: the fast path in Rust, and here the checks that explain bad calls."""

from __future__ import annotations

from typing import Any

import numpy as np

from . import _core, selector
from ._dtypes import SIXTEEN_BIT_FLOATS, check_op, dtype_name
from ._runtime import _thread_state, init, register_thread


def _why_not_in_place(array: np.ndarray) -> str | None:
    if not array.flags.c_contiguous:
        return f"it is not C-contiguous (strides {array.strides} for shape {array.shape})"
    if not array.flags.writeable:
        return "it is read-only"
    if not array.flags.aligned:
        return "its data is not aligned to its element size"
    if not array.dtype.isnative:
        return f"its byte order ({array.dtype.str}) is not the machine's"
    return None


def _same_memory(a: np.ndarray, b: np.ndarray) -> bool:
    return (
        a.__array_interface__["data"][0] == b.__array_interface__["data"][0]
        and a.shape == b.shape
        and a.strides == b.strides
    )


def allreduce(
    x: np.ndarray, op: str = "sum", *, out: np.ndarray | None = None, algorithm: str = "auto"
) -> np.ndarray:
    """Reduce ``x`` element-wise across all ranks and return the result on every rank.

    ``op`` is "sum", "avg", "min", "max" or "prod" ("avg" is the sum divided by the number of
    ranks; integers truncate toward zero). ``x`` may have any shape and layout; with
    ``out=x`` the reduction happens in place with no copy (x must then be C-contiguous and
    writeable). ``algorithm`` is "auto" or one of ``ringlet.ALGORITHMS``: "ring",
    "pipelined_ring", "halving_doubling", "recursive_doubling" or "mpi" (the MPI library's own
    MPI_Allreduce, not for 16-bit floats).

    Every rank gets bit-identical results. The GIL is released while communicating.
    """
    if not getattr(_thread_state, "registered", False):
        register_thread()
    result = _core.allreduce_fast(x, op, out, algorithm)
    if result is not None:
        return result
    return _allreduce_checked(x, op, out, algorithm)


def _allreduce_checked(
    x: Any, op: str, out: Any, algorithm: str, *, reduce: bool = True
) -> np.ndarray:
    """Everything the fast path does not take: validation with clear errors, copies.
    With ``reduce=False``, only the checks and the copy (for the asynchronous variant)."""
    if not isinstance(x, (np.ndarray, np.generic)):
        raise TypeError(
            f"allreduce takes a numpy.ndarray, got {type(x).__name__}; "
            "convert it with numpy.asarray first"
        )
    x = np.asarray(x)
    name = dtype_name(x.dtype)
    check_op(op)
    selector.check_algorithm(algorithm)
    if algorithm == "mpi" and name in SIXTEEN_BIT_FLOATS:
        raise ValueError(
            f"algorithm 'mpi' cannot reduce {name}: MPI has no 16-bit float type; use 'auto', "
            "'ring', 'pipelined_ring', 'halving_doubling' or 'recursive_doubling'"
        )
    if out is None:
        native = x.dtype if x.dtype.isnative else x.dtype.newbyteorder("=")
        result = np.array(x, dtype=native, order="C", copy=True)
    else:
        result = _check_out(x, out)
    if not reduce:
        return result
    init()
    if algorithm == "auto":
        algorithm = selector.choose(result.nbytes, _core.size(), name, op)
    _core.allreduce(result, name, op, algorithm)
    return result


def _check_out(x: np.ndarray, out: Any) -> np.ndarray:
    """Validate ``out`` and fill it with ``x`` unless it is ``x``; nothing is written on error."""
    if not isinstance(out, np.ndarray):
        raise ValueError(f"out must be a numpy.ndarray, got {type(out).__name__}")
    if out.dtype != x.dtype or out.shape != x.shape:
        raise ValueError(
            f"out must have x's dtype and shape ({x.dtype}{list(x.shape)}), "
            f"got {out.dtype}{list(out.shape)}"
        )
    reason = _why_not_in_place(out)
    in_place = _same_memory(out, x)
    if reason is not None:
        target = "an in-place allreduce (out=x)" if in_place else "out"
        raise ValueError(
            f"{target} needs a C-contiguous, writeable, aligned array in native byte order, "
            f"but {reason}; call allreduce(x) without out= to reduce a copy"
        )
    if in_place:
        return out
    if np.shares_memory(out, x):
        raise ValueError("out overlaps x without being x; pass out=x or a separate array")
    np.copyto(out, x)
    return out
