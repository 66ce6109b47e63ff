"""One fused allreduce of a list of gradients, for the Keras backend in use.

JAX: ``ringlet.jax.tree_allreduce`` (an XLA custom call inside ``jax.jit``, where Keras' JAX
trainer runs the step; one fused collective per dtype). PyTorch: ``ringlet.hvd``'s in-place
grouped allreduce on the gradients' own memory (Keras' torch trainer runs eagerly).
TensorFlow: ``ringlet.hvd.tensorflow.grouped_allreduce`` (a graph op inside ``tf.function``).
"""

from __future__ import annotations

from typing import Any

import keras

from .._negotiation import DEFAULT_MATCHING
from .._ops import WIRE_NAMES, Compression
from .._process_sets import ringlet_set
from .._state import state

FLOAT_DTYPES = ("float16", "bfloat16", "float32", "float64")


def backend() -> str:
    return keras.backend.backend()


def grouped_allreduce(tensors: list[Any], op: str, prescale: float, postscale: float,
                      compression: Any, process_set: Any, sparse_as_dense: bool = False
                      ) -> list[Any]:
    """``tensors`` reduced with ``op`` ("avg" or "sum") over ``process_set``, scaled by
    ``prescale`` before and ``postscale`` after, sent as ``compression`` says
    (``sparse_as_dense``: TensorFlow's sparse gradients densified first)."""
    if not tensors:
        return []
    name = backend()
    if name == "jax":
        return _jax(tensors, op, prescale, postscale, compression, process_set)
    if name == "torch":
        return _torch(tensors, op, prescale, postscale, compression, process_set)
    if name == "tensorflow":
        return _tensorflow(tensors, op, prescale, postscale, compression, process_set,
                           sparse_as_dense)
    raise NotImplementedError(
        f"ringlet.hvd.keras supports the jax, torch and tensorflow Keras backends, not {name!r}"
    )


def default_matching() -> str:
    """How ``init`` matches operations where RINGLET_HVD_MATCHING is unset: by order on JAX
    (the collectives run inside ``jax.jit``, as XLA's custom calls), else by name."""
    return "order" if backend() == "jax" else DEFAULT_MATCHING


def wire_dtype(compression: Any) -> str | None:
    """The 16-bit float dtype a built-in compressor sends, None for none; custom compressors
    are refused (their compress/decompress would run on traced values of any backend)."""
    wire = getattr(compression, "wire_dtype", None)
    if compression in (None, Compression.none, Compression.fp16, Compression.bf16):
        return None if wire is None else WIRE_NAMES[wire]
    raise NotImplementedError(
        f"ringlet.hvd.keras.DistributedOptimizer takes compression=Compression.none, .fp16 or "
        f".bf16, not {compression!r}"
    )


def _jax(tensors: list[Any], op: str, prescale: float, postscale: float, compression: Any,
         process_set: Any) -> list[Any]:
    import jax.numpy as jnp

    import ringlet.jax as rj

    if state.matching_by_name():
        # Inside jax.jit the collectives are XLA's custom calls, matched by order; the
        # negotiation's own collectives would meet them in another order on another rank.
        raise RuntimeError(
            "ringlet.hvd.keras on the JAX backend runs its allreduces inside jax.jit, matched "
            "by order; it cannot run under name matching (RINGLET_HVD_MATCHING=name, or "
            "ringlet.hvd.init()'s default): initialize with ringlet.hvd.keras.init() alone, which "
            "matches by order on JAX, or set RINGLET_HVD_MATCHING=order, or use the torch or "
            "tensorflow backend")
    wire = wire_dtype(compression)
    dtypes = [t.dtype for t in tensors]
    work = list(tensors)
    if prescale != 1.0:
        work = [t * jnp.asarray(prescale, t.dtype) for t in work]
    if wire is not None:
        work = [t.astype(wire) if t.dtype.name in FLOAT_DTYPES else t for t in work]
    reduced = rj.tree_allreduce(work, op, process_set=ringlet_set(process_set))
    reduced = [r.astype(d) for r, d in zip(reduced, dtypes)]
    if postscale != 1.0:
        reduced = [r * jnp.asarray(postscale, r.dtype) for r in reduced]
    return reduced


def _torch(tensors: list[Any], op: str, prescale: float, postscale: float, compression: Any,
           process_set: Any) -> list[Any]:
    import ringlet.hvd.torch as hvd_torch  # registers torch tensors with ringlet.hvd's API

    from .._ops import Average, Sum

    wire_dtype(compression)
    # In place, on the gradients' memory (Keras' torch trainer hands over fresh .grad tensors);
    # the core casts to the wire dtype while packing.
    work = [t if t.is_contiguous() else t.contiguous() for t in tensors]
    return hvd_torch.grouped_allreduce_(
        work, op=Average if op == "avg" else Sum, prescale_factor=prescale,
        postscale_factor=postscale, compression=compression, process_set=process_set)


def _tensorflow(tensors: list[Any], op: str, prescale: float, postscale: float,
                compression: Any, process_set: Any, sparse_as_dense: bool) -> list[Any]:
    import tensorflow as tf
    from tensorflow.python.ops import control_flow_util

    if control_flow_util.GraphOrParentsInXlaContext(tf.compat.v1.get_default_graph()):
        raise ValueError(
            "ringlet.hvd.keras.DistributedOptimizer cannot run in an XLA-compiled step "
            "(model.compile(..., jit_compile=True) on the TensorFlow backend): XLA cannot "
            "compile ringlet's collective, which runs on the host. Compile with "
            "jit_compile=False, or leave jit_compile='auto' (on a CPU-only machine Keras then "
            "does not use XLA)."
        )
    wire_dtype(compression)
    try:
        import ringlet.hvd.tensorflow as hvd_tf
    except ImportError as missing:
        raise NotImplementedError(
            "ringlet.hvd.keras on the TensorFlow backend needs ringlet.hvd.tensorflow"
        ) from missing
    from .._ops import Average, Sum

    if sparse_as_dense:
        tensors = [tf.convert_to_tensor(t) if isinstance(t, tf.IndexedSlices) else t
                   for t in tensors]
    return list(hvd_tf.grouped_allreduce(
        list(tensors), op=Average if op == "avg" else Sum, prescale_factor=prescale,
        postscale_factor=postscale, compression=compression, process_set=process_set))
