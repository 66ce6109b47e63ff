"""Horovod's reduction operations and compressors."""

from __future__ import annotations

from enum import IntEnum
from typing import Any

import ringlet

from ._backend import backend_for

__all__ = [
    "BUILT_IN_COMPRESSORS", "COMPRESSOR_BY_WIRE", "OPS", "OP_NAMES", "WIRE_NAMES", "Adasum",
    "Average", "BF16Compressor", "Compression", "Compressor", "FP16Compressor",
    "HorovodInternalError", "Max", "Min", "NoneCompressor", "Product", "ReduceOp", "Sum",
    "ringlet_op", "wire_name",
]


class ReduceOp(IntEnum):
    """Horovod's reduction operations (``hvd.Average``, ``hvd.Sum``, ``hvd.Min``, ...)."""

    Average = 0
    Sum = 1
    Adasum = 2
    Min = 3
    Max = 4
    Product = 5


Average, Sum, Adasum = ReduceOp.Average, ReduceOp.Sum, ReduceOp.Adasum
Min, Max, Product = ReduceOp.Min, ReduceOp.Max, ReduceOp.Product
OP_NAMES = {Average: "avg", Sum: "sum", Min: "min", Max: "max", Product: "prod"}
OPS = {name: op for op, name in OP_NAMES.items()}
"""ringlet's op names back to Horovod's ops."""

HorovodInternalError = ringlet.RingletError
"""What Horovod raises when a collective fails; here it is ringlet's own error."""


class Compressor:
    """Horovod's compressor interface: ``compress(tensor) -> (tensor, ctx)`` and
    ``decompress(tensor, ctx)``. Given to a collective, the built-in ones compress inside
    ringlet's core instead (one cast while packing, float32 accumulation); their methods do
    what Horovod's do, for code that calls them itself."""

    wire_dtype: str | None = None

    @staticmethod
    def compress(tensor: Any) -> tuple[Any, Any]:
        return tensor, None

    @staticmethod
    def decompress(tensor: Any, ctx: Any) -> Any:
        return tensor


class NoneCompressor(Compressor):
    wire_dtype = None


class _CastCompressor(Compressor):
    """Floating-point tensors cast to ``wire_dtype`` and back; other tensors untouched."""

    @classmethod
    def compress(cls, tensor: Any) -> tuple[Any, Any]:
        backend = backend_for(tensor)
        original = backend.dtype(tensor)
        if backend.is_floating(tensor):
            return backend.cast(tensor, WIRE_NAMES[cls.wire_dtype]), original
        return tensor, original

    @staticmethod
    def decompress(tensor: Any, ctx: Any) -> Any:
        backend = backend_for(tensor)
        if ctx is None or backend.dtype(tensor) == ctx:
            return tensor
        return backend.cast(tensor, ctx)


class FP16Compressor(_CastCompressor):
    """Send floating-point data as float16; reduced with float32 accumulation, cast back."""

    wire_dtype = "fp16"


class BF16Compressor(_CastCompressor):
    """Send floating-point data as bfloat16 (float32's range; what Horovod cannot do over MPI)."""

    wire_dtype = "bf16"


WIRE_NAMES = {"fp16": "float16", "bf16": "bfloat16"}


class Compression:
    """Horovod's gradient compressors: ``none``, ``fp16`` and ``bf16`` (16-bit on the wire)."""

    none = NoneCompressor
    fp16 = FP16Compressor
    bf16 = BF16Compressor


BUILT_IN_COMPRESSORS = (NoneCompressor, FP16Compressor, BF16Compressor)


def wire_name(compressor: Any) -> str:
    """How a negotiation signature names a built-in compressor (None: no compression)."""
    return getattr(compressor, "wire_dtype", None) or "none"


COMPRESSOR_BY_WIRE = {wire_name(c): c for c in BUILT_IN_COMPRESSORS}
"""A built-in compressor by the name a negotiation signature gives it."""


def ringlet_op(average: bool | None, op: Any, default: ReduceOp = Average) -> str:
    if average is not None and op is not None:
        raise ValueError("The op parameter supersedes average. Please provide only one of them.")
    if average is not None:
        op = Average if average else Sum
    op = default if op is None else op
    if op == Adasum:
        raise NotImplementedError("Adasum is not supported by ringlet; use Average or Sum")
    try:
        return OP_NAMES[ReduceOp(op)]
    except (ValueError, KeyError):
        raise ValueError(f"unknown op {op!r}; accepted: Average, Sum, Min, Max, Product") from None
