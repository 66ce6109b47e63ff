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
from ._allreduce import _allreduce_checked, _why_not_in_place
from ._dtypes import SIXTEEN_BIT_FLOATS, check_op, dtype_name
from ._runtime import init

DEFAULT_FUSION_THRESHOLD = 64 << 20
"""Bytes per fusion buffer unless ``fusion_threshold=`` or RINGLET_FUSION_THRESHOLD says."""

COMPRESSIONS = {None: None, "none": None, "fp16": "float16", "float16": "float16",
                "bf16": "bfloat16", "bfloat16": "bfloat16"}


def resolve_fusion_threshold(value: int | None = None) -> int:
    if value is None:
        value = int(os.environ.get("RINGLET_FUSION_THRESHOLD", DEFAULT_FUSION_THRESHOLD))
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
    if wire is None or dtype.startswith("int") or dtype in SIXTEEN_BIT_FLOATS:
        return dtype
    return wire


class Handle:
    """An allreduce in flight. ``done()`` polls; ``wait()`` blocks and returns the result.

    The operation holds its arrays until it completes, even if this handle is dropped; do not
    read or write them before ``wait()`` returns.
    """

    __slots__ = ("_core_handle", "_finish")

    def __init__(self, core_handle: Any, finish: Any = None) -> None:
        self._core_handle = core_handle
        self._finish = finish

    def done(self) -> bool:
        return self._core_handle.done()

    def wait(self) -> Any:
        result = self._core_handle.wait()
        return self._finish(result) if self._finish else result


def _ensure_auto_table(algorithm: str) -> None:
    """Queued work cannot call into Python: build the decision table first (collective)."""
    if algorithm == "auto" and _core.auto_choice("float32", "sum", 8) is None:
        selector.choose(8, _core.size(), "float32", "sum")


def _check_in_place(array: Any, what: str) -> str:
    if not isinstance(array, np.ndarray):
        raise TypeError(f"{what} takes numpy arrays, got {type(array).__name__}")
    name = dtype_name(array.dtype)
    reason = _why_not_in_place(array)
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
    """Queue an in-place allreduce of ``arrays`` (fused); ``wait()`` returns ``result``."""
    check_op(op)
    selector.check_algorithm(algorithm)
    names = [_check_in_place(a, "a grouped allreduce") for a in arrays]
    threshold = resolve_fusion_threshold(fusion_threshold)
    if algorithm == "mpi" and any(n in SIXTEEN_BIT_FLOATS for n in names):
        raise ValueError("algorithm 'mpi' cannot reduce 16-bit floats: MPI has no such type")
    init()
    _ensure_auto_table(algorithm)
    # One fused stream per dtype, in order of first appearance: deterministic on every rank.
    by_dtype: dict[str, list[np.ndarray]] = {}
    for name, array in zip(names, arrays):
        by_dtype.setdefault(name, []).append(array)
    handles = [
        _core.allreduce_group_async(
            group, name, wire_dtype(name, compression), op, algorithm,
            float(prescale), float(postscale), threshold, None,
        )
        for name, group in by_dtype.items()
    ]
    if len(handles) == 1:
        return Handle(handles[0], lambda _: result)
    return Handle(_Several(handles), lambda _: result)


class _Several:
    """Several core handles as one."""

    def __init__(self, handles: list[Any]) -> None:
        self.handles = handles

    def done(self) -> bool:
        return all(h.done() for h in self.handles)

    def wait(self) -> None:
        for h in self.handles:
            h.wait()


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
    # The checked path makes the copy (and all the argument checks) without reducing it.
    result = _allreduce_checked(x, op, out, algorithm, reduce=False)
    return allreduce_group_async(
        [result], op, algorithm=algorithm, compression=compression, prescale=prescale,
        postscale=postscale, fusion_threshold=0, result=result,
    )

