"""Many arrays in few collectives: gradient averaging, asynchronous allreduce, compression.

The work happens in the Rust core's background thread: it packs arrays into fusion buffers,
compresses them for the wire if asked, runs one allreduce per buffer in submission order, and
unpacks. Python gets a handle and goes on (the GIL is not held meanwhile).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

import numpy as np

from . import _core, selector
from ._allreduce import prepare
from ._arrays import refused_together, why_not_in_place
from ._collectives import Handle
from ._dtypes import FLOAT_DTYPES, SIXTEEN_BIT_FLOATS, check_op, dtype_name
from ._runtime import init, size

DEFAULT_FUSION_THRESHOLD = 64 << 20
"""Bytes per fusion buffer unless ``fusion_threshold=`` or RINGLET_FUSION_THRESHOLD says."""

COMPRESSIONS = {None: None, "none": None, "fp16": "float16", "float16": "float16",
                "bf16": "bfloat16", "bfloat16": "bfloat16"}


def fusion_threshold_bytes(value: int | None = None) -> int:
    """The fusion buffer size in bytes: ``value`` if given, else RINGLET_FUSION_THRESHOLD,
    else 64 MiB."""
    if value is None:
        text = os.environ.get("RINGLET_FUSION_THRESHOLD", str(DEFAULT_FUSION_THRESHOLD))
        try:
            value = int(text)
        except ValueError:
            raise ValueError(
                f"RINGLET_FUSION_THRESHOLD={text!r} is not a number of bytes"
            ) from None
    if value < 0:
        raise ValueError(f"fusion_threshold must be >= 0 bytes, got {value}")
    return int(value)


def wire_dtype(dtype: str, compression: Any) -> str:
    """The dtype on the wire: 16-bit compression applies to floating-point data only (integers
    travel as they are, as with Horovod's Compression.fp16)."""
    key = getattr(compression, "wire_dtype", compression)
    if key not in COMPRESSIONS:
        raise ValueError(
            f"unknown compression {compression!r}; accepted: None, 'fp16', 'bf16' "
            "(or ringlet.hvd.Compression.none/fp16/bf16)"
        )
    wire = COMPRESSIONS[key]
    if wire is None or dtype not in FLOAT_DTYPES or dtype in SIXTEEN_BIT_FLOATS:
        return dtype
    return wire


def _ensure_auto_table(algorithm: str) -> None:
    """Queued work cannot call into Python: build the decision table first (collective)."""
    if algorithm == "auto" and _core.auto_choice("float32", "sum", 8) is None:
        selector.choose(8, size(), "float32", "sum")


def _check_in_place(array: Any, what: str) -> str:
    if not isinstance(array, np.ndarray):
        raise TypeError(f"{what} takes numpy arrays, got {type(array).__name__}")
    name = dtype_name(array.dtype)
    reason = why_not_in_place(array)
    if reason is not None:
        raise ValueError(f"{what} works in place and needs C-contiguous, writeable, aligned "
                         f"arrays in native byte order, but one is not: {reason}")
    return name


def allreduce_group_async(
    arrays: Sequence[np.ndarray],
    op: str = "sum",
    *,
    algorithm: str = "auto",
    compression: Any = None,
    prescale: float = 1.0,
    postscale: float = 1.0,
    fusion_threshold: int | None = None,
    result: Any = None,
) -> Handle:
    """Queue an in-place allreduce of ``arrays`` (fused, one stream per dtype); ``wait()``
    returns ``result``."""
    with refused_together("allreduce"):
        check_op(op)
        selector.check_algorithm(algorithm)
        names = [_check_in_place(a, "a grouped allreduce") for a in arrays]
        threshold = fusion_threshold_bytes(fusion_threshold)
        wires = {name: wire_dtype(name, compression) for name in names}
        for wire in wires.values():
            _core.check_algorithm("allreduce", algorithm, wire, op)
        prescale, postscale = float(prescale), float(postscale)
    init()
    _ensure_auto_table(algorithm)
    # One fused stream per dtype, in order of first appearance: deterministic on every rank.
    by_dtype: dict[str, list[np.ndarray]] = {}
    for name, array in zip(names, arrays):
        by_dtype.setdefault(name, []).append(array)
    handles = [
        _core.allreduce_group_async(
            group, name, wires[name], op, algorithm, prescale, postscale, threshold,
            selector.pack_below(wires[name], size()),
        )
        for name, group in by_dtype.items()
    ]
    return Handle(handles, lambda: result)


def average_gradients(
    arrays: Sequence[np.ndarray],
    *,
    op: str = "avg",
    compression: Any = None,
    prescale: float = 1.0,
    postscale: float = 1.0,
    fusion_threshold: int | None = None,
    algorithm: str = "auto",
) -> None:
    """Average (or ``op``) each array across ranks, in place.

    Small arrays are packed into fusion buffers of at most ``fusion_threshold`` bytes (default
    64 MiB, or RINGLET_FUSION_THRESHOLD), one collective per buffer, in the arrays' order.
    ``compression="fp16"`` or ``"bf16"`` sends floating-point data as 16 bits (reduced with
    float32 accumulation, cast back). ``prescale`` multiplies before the reduction and
    ``postscale`` after it, as in Horovod.
    """
    allreduce_group_async(
        arrays, op, algorithm=algorithm, compression=compression, prescale=prescale,
        postscale=postscale, fusion_threshold=fusion_threshold,
    ).wait()


def allreduce_async(
    x: np.ndarray,
    op: str = "sum",
    *,
    out: np.ndarray | None = None,
    algorithm: str = "auto",
    compression: Any = None,
    prescale: float = 1.0,
    postscale: float = 1.0,
) -> Handle:
    """Start ``allreduce(x, op, out=out, algorithm=algorithm)`` in the background.

    Returns a handle: ``done()`` polls, ``wait()`` returns the reduced array. Operations run in
    submission order (so every rank must submit them in the same order).
    """
    # The same checks and copy as the synchronous call, then one queued group of one.
    result, _ = prepare(x, op, out, algorithm)
    return allreduce_group_async(
        [result], op, algorithm=algorithm, compression=compression, prescale=prescale,
        postscale=postscale, fusion_threshold=0, result=result,
    )

