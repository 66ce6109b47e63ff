"""Which NumPy dtypes and ops ringlet reduces (as the core declares them), and the checks that
say so clearly."""

from __future__ import annotations

import numpy as np

from . import _core

_CORE_DTYPES = _core.dtypes()

SUPPORTED_DTYPES = tuple(d.name for d in _CORE_DTYPES)
"""NumPy dtype names; bfloat16 is ``ml_dtypes.bfloat16``."""

OPS = tuple(_core.ops())
FLOAT_DTYPES = tuple(d.name for d in _CORE_DTYPES if d.is_float)
ELEMENT_BYTES = {d.name: d.itemsize for d in _CORE_DTYPES}
SIXTEEN_BIT_FLOATS = tuple(d.name for d in _CORE_DTYPES if d.is_float and d.itemsize == 2)

_KNOWN: dict[np.dtype, str] = {}
"""Native-byte-order dtypes already accepted, by dtype: the per-call lookup is one dict get."""

_OPS = frozenset(OPS)


def dtype_name(dtype: np.dtype) -> str:
    """The supported name of ``dtype``, or a TypeError that lists what is supported."""
    known = _KNOWN.get(dtype)
    if known is not None:
        return known
    name = dtype.name
    # ml_dtypes' bfloat16 has kind "V"; every other supported dtype is a plain number type.
    if name not in SUPPORTED_DTYPES or dtype.fields is not None:
        raise TypeError(
            f"ringlet cannot reduce dtype {dtype!s}; supported dtypes: "
            f"{', '.join(SUPPORTED_DTYPES)} (bfloat16 from ml_dtypes)"
        )
    if dtype.isnative:
        _KNOWN[dtype] = name
        _core.register_dtype(dtype, name)  # the Rust fast path now takes this dtype directly
    return name


_MOVABLE: dict[np.dtype, str] = {}
"""Names of dtypes already moved (``dtype.name`` costs microseconds per call)."""


def movable_name(dtype: np.dtype) -> str:
    """How the ranks name ``dtype`` when they only move its bytes (broadcast, allgather): any
    fixed-size dtype but objects. Byte order and fields are part of the name."""
    known = _MOVABLE.get(dtype)
    if known is not None:
        return known
    if dtype.hasobject:
        raise TypeError(
            f"ringlet cannot move dtype {dtype!s}: it holds Python objects (pointers); "
            "use broadcast_object / allgather_object for those"
        )
    name = dtype.name if dtype.isnative and dtype.fields is None else str(dtype)
    _MOVABLE[dtype] = name
    return name


def check_op(op: str) -> str:
    if op.__class__ is not str or op not in _OPS:
        raise ValueError(f"unknown op {op!r}; accepted: {', '.join(map(repr, OPS))}")
    return op


for _name in ("float32", "float64", "float16", "int32", "int64"):
    dtype_name(np.dtype(_name))
