"""Horovod's TensorFlow collectives: allreduce, allgather, broadcast, reducescatter and
alltoall, eagerly and in graphs, differentiable with Horovod's gradient rules."""

from __future__ import annotations

from typing import Any

import numpy as np
import tensorflow as tf

import ringlet

from .._api import api
from .._ops import BUILT_IN_COMPRESSORS, OPS, Average, Compression, Sum, ringlet_op
from .._process_sets import global_process_set, ringlet_set, set_rank, set_size
from .._state import state
from ._graph import (
    InvalidArgumentError,
    ResultBuffers,
    aligned_copy,
    checked_member,
    dense_tensor,
    not_converted,
    run_op,
    with_gradient,
)

__all__ = ["allgather", "allreduce", "alltoall", "broadcast", "broadcast_",
           "broadcast_global_variables", "broadcast_variables", "check_op", "grouped_allgather",
           "grouped_allreduce", "grouped_reducescatter", "reducescatter"]


# ---- allreduce ------------------------------------------------------------------------------


@not_converted
def _reduce(tensors: list[tf.Tensor], op: Any, prescale: float, postscale: float,
            compression: Any, process_set: Any, name: Any) -> list[tf.Tensor]:
    """One fused allreduce of ``tensors`` (any dtypes), differentiable (the gradient of an
    allreduce is the allreduce of the gradient: same op, same factors)."""

    plain = prescale == 1.0 and postscale == 1.0 and compression in (None, Compression.none)
    results = ResultBuffers()

    def one_plain_tensor(arrays: Any) -> bool:
        # One tensor of a dtype the core reduces, nothing to scale or compress, matched by
        # order: the synchronous call, with no queue hand-off.
        return plain and len(arrays) == 1 and arrays[0].dtype.name in ringlet.SUPPORTED_DTYPES \
            and not state.matching_by_name()

    def compute(*arrays: np.ndarray) -> list[np.ndarray]:
        if one_plain_tensor(arrays):
            out = results.empty(0, arrays[0].shape, arrays[0].dtype)  # an aligned result
            ringlet.allreduce(arrays[0], ringlet_op(None, op), out=out,
                              process_set=ringlet_set(process_set))
            return [out]
        # Read where TensorFlow keeps them, reduced into this operation's own results.
        outputs = [results.empty(i, a.shape, a.dtype) for i, a in enumerate(arrays)]
        return api.grouped_allreduce_into(arrays, outputs, name=name, op=op,
                                          prescale_factor=prescale, postscale_factor=postscale,
                                          process_set=process_set, compression=compression)

    def compute_into(arrays: list[np.ndarray], outputs: list[np.ndarray]) -> None:
        # The compiled graph operation's: in place when TensorFlow let go of every input,
        # else from the inputs into the operation's kept results.
        if one_plain_tensor(arrays):
            ringlet.allreduce(arrays[0], ringlet_op(None, op), out=outputs[0],
                              process_set=ringlet_set(process_set))
            return
        settings = dict(name=name, op=op, prescale_factor=prescale, postscale_factor=postscale,
                        process_set=process_set, compression=compression)
        if outputs[0] is arrays[0]:
            reduced = api.grouped_allreduce_(arrays, **settings)
        else:
            reduced = api.grouped_allreduce_into(arrays, outputs, **settings)
        for output, result in zip(outputs, reduced):
            if result is not output:  # where the reduction could not write the result itself
                np.copyto(output, result)

    def forward(xs: list[tf.Tensor]) -> list[tf.Tensor]:
        return run_op(compute, xs, [x.dtype for x in xs], [x.shape for x in xs],
                      _op_label("Allreduce", name), compute_into)

    def backward(dys: list[tf.Tensor]) -> list[Any]:
        return _reduce(dys, op, prescale, postscale, Compression.none, process_set, None)

    return with_gradient(forward, backward, tensors)


def _op_label(kind: str, name: Any) -> str:
    return f"Ringlet{kind}" if name is None else f"Ringlet{kind}_{name}".replace(":", "_")


def _compressed_reduce(tensors: list[Any], op: Any, prescale: float, postscale: float,
                       compression: Any, process_set: Any, name: Any) -> list[tf.Tensor]:
    """Built-in compressors work inside the core (cast while packing, float32 accumulation);
    a user's ``Compressor`` runs on the TensorFlow tensors around the reduction, as in
    Horovod."""
    if compression is None or compression in BUILT_IN_COMPRESSORS:
        return _reduce(tensors, op, prescale, postscale, compression, process_set, name)
    compressed = [compression.compress(t) for t in tensors]
    reduced = _reduce([c for c, _ in compressed], op, prescale, postscale, None, process_set,
                      name)
    return [compression.decompress(r, ctx) for r, (_, ctx) in zip(reduced, compressed)]


def check_op(average: Any, op: Any) -> Any:
    """Horovod's op (the deprecated ``average`` folded in), checked now: at the call or when
    traced, before anything runs."""
    return OPS[ringlet_op(average, op)]


def allreduce(tensor: Any, average: Any = None, device_dense: str = "", device_sparse: str = "",
              compression: Any = Compression.none, op: Any = None, prescale_factor: float = 1.0,
              postscale_factor: float = 1.0, name: Any = None,
              process_set: Any = global_process_set, ignore_name_scope: bool = False) -> Any:
    """The reduction (default: average) of ``tensor`` over the ranks of ``process_set``, as a
    new tensor; a ``tf.IndexedSlices`` is reduced as Horovod does, by allgathering its values
    and indices (Sum and Average only)."""
    op = check_op(average, op)
    checked_member(process_set)
    if isinstance(tensor, tf.IndexedSlices):
        if op not in (Sum, Average):
            raise NotImplementedError("Only Sum and Average ops are supported with "
                                      "tf.IndexedSlices")
        if prescale_factor != 1.0 or postscale_factor != 1.0:
            raise NotImplementedError("Pre/postscale_factor are not supported with "
                                      "tf.IndexedSlices")
        values = allgather(tensor.values, process_set=process_set)
        indices = allgather(tensor.indices, process_set=process_set)
        if op == Average:
            values = values / tf.cast(set_size(process_set), values.dtype)
        return tf.IndexedSlices(values, indices, dense_shape=tensor.dense_shape)
    return _compressed_reduce([tensor], op, prescale_factor, postscale_factor, compression,
                              process_set, name)[0]


def grouped_allreduce(tensors: Any, average: Any = None, device_dense: str = "",
                      device_sparse: str = "", compression: Any = Compression.none,
                      op: Any = None, prescale_factor: float = 1.0,
                      postscale_factor: float = 1.0, process_set: Any = global_process_set,
                      ignore_name_scope: bool = False, name: Any = None) -> list[Any]:
    """``allreduce`` of every tensor in one fused operation (ringlet's buckets); new
    tensors in the same order."""
    op = check_op(average, op)
    checked_member(process_set)
    tensors = list(tensors)
    if any(isinstance(t, tf.IndexedSlices) for t in tensors):
        return [allreduce(t, op=op, compression=compression, prescale_factor=prescale_factor,
                          postscale_factor=postscale_factor, process_set=process_set)
                for t in tensors]
    if not tensors:
        return []
    return _compressed_reduce(tensors, op, prescale_factor, postscale_factor, compression,
                              process_set, name)


# ---- gather, scatter, broadcast -------------------------------------------------------------


def _rows_shape(shape: tf.TensorShape) -> tf.TensorShape:
    """``shape`` with an unknown first dimension (it depends on the other ranks)."""
    return tf.TensorShape([None]).concatenate(shape[1:]) if shape.rank else shape


@not_converted
def _gather(tensors: list[tf.Tensor], process_set: Any, name: Any) -> list[tf.Tensor]:
    """Horovod's allgather, differentiable: the gradient is this rank's rows of the
    gradient averaged over the ranks."""

    def compute(*arrays: np.ndarray) -> list[np.ndarray]:
        return [np.asarray(api.allgather(
            np.ascontiguousarray(a), None if name is None else f"{name}.{i}",
            process_set=process_set)) for i, a in enumerate(arrays)]

    def forward(xs: list[tf.Tensor]) -> list[tf.Tensor]:
        for x in xs:
            if x.shape.rank == 0:
                raise ValueError("allgather needs a tensor with at least one dimension "
                                 "(it concatenates the first); got a scalar")
        return run_op(compute, xs, [x.dtype for x in xs], [_rows_shape(x.shape) for x in xs],
                      _op_label("Allgather", name))

    def backward(dys: list[tf.Tensor]) -> list[Any]:
        reduced = [_reduce([d], Average, 1.0, 1.0, None, process_set, None)[0] for d in dys]
        rows = tf.stack([tf.shape(x, out_type=tf.int32)[0] for x in tensors])
        every = tf.reshape(_gather([rows], process_set, None)[0], [-1, len(tensors)])
        me = set_rank(process_set)
        size = set_size(process_set)
        return [tf.split(r, every[:, i], num=size, axis=0)[me] if size > 1 else r
                for i, r in enumerate(reduced)]

    return with_gradient(forward, backward, [dense_tensor(t) for t in tensors])


def allgather(tensor: Any, name: Any = None, ignore_name_scope: bool = False,
              process_set: Any = global_process_set) -> Any:
    """Every rank's ``tensor`` concatenated along the first dimension, in rank order (the
    first dimension may differ between ranks, the others and the dtype may not)."""
    checked_member(process_set)
    return _gather([tensor], process_set, name)[0]


def grouped_allgather(tensors: Any, name: Any = None, ignore_name_scope: bool = False,
                      process_set: Any = global_process_set) -> list[Any]:
    """``allgather`` of each tensor, in one graph operation."""
    checked_member(process_set)
    tensors = list(tensors)
    return _gather(tensors, process_set, name) if tensors else []


@not_converted
def broadcast(tensor: Any, root_rank: int, name: Any = None, ignore_name_scope: bool = False,
              process_set: Any = global_process_set) -> Any:
    """``root_rank``'s ``tensor`` on every rank, as a new tensor; differentiable (the gradient
    goes to the root: the average over ranks of the gradient there, zeros elsewhere)."""
    checked_member(process_set)
    root = _check_root(root_rank, process_set)

    def compute(array: np.ndarray) -> list[np.ndarray]:
        return [api.broadcast_(aligned_copy(array), root, name, process_set=process_set)]

    def forward(xs: list[tf.Tensor]) -> list[tf.Tensor]:
        return run_op(compute, xs, [xs[0].dtype], [xs[0].shape], _op_label("Broadcast", name))

    def backward(dys: list[tf.Tensor]) -> list[Any]:
        reduced = _reduce(dys, Average, 1.0, 1.0, None, process_set, None)[0]
        if ringlet.rank() == root:
            return [reduced]
        # The zeros wait for the reduction: in a graph they would not run it otherwise, and
        # the root's reduction would wait for this rank forever.
        with tf.control_dependencies([reduced]):
            return [tf.zeros_like(reduced)]

    return with_gradient(forward, backward, [dense_tensor(tensor)])[0]


def _check_root(root_rank: Any, process_set: Any) -> int:
    """Horovod's root: a global rank, which must belong to the process set."""
    chosen = ringlet_set(process_set)
    ranks = list(range(ringlet.size())) if chosen is None else list(chosen.ranks)
    if isinstance(root_rank, bool) or not isinstance(root_rank, (int, np.integer)) or (
            int(root_rank) not in ranks):
        raise ValueError(f"root_rank must be a rank of the process set {ranks}; got "
                         f"{root_rank!r}")
    return int(root_rank)


def broadcast_(variables: Any, root_rank: int, name: Any = None,
               process_set: Any = global_process_set) -> Any:
    """Broadcast ``variables`` (a variable or a list) from ``root_rank`` in place; returns
    them (eagerly) or their assigned values (in a graph), as Horovod's does."""
    single = isinstance(variables, tf.Variable)
    variables = [variables] if single else list(variables)
    for v in variables:
        if not isinstance(v, tf.Variable):
            raise TypeError(f"broadcast_ assigns to tf.Variable objects; got {type(v).__name__}")
    assigned = _assign_broadcast(variables, root_rank, process_set)
    return assigned[0] if single else assigned


@not_converted
def _assign_broadcast(variables: list[tf.Variable], root_rank: int,
                      process_set: Any) -> list[Any]:
    """Every variable's value on ``root_rank`` assigned on every rank, one operation for all."""
    checked_member(process_set)
    root = _check_root(root_rank, process_set)
    if not variables:
        return []

    def compute(*arrays: np.ndarray) -> list[np.ndarray]:
        return [api.broadcast_(aligned_copy(a), root, process_set=process_set)
                for a in arrays]

    values = run_op(compute, variables, [v.dtype for v in variables], [v.shape for v in variables],
                    "RingletBroadcastVariables")
    assigned = [v.assign(value) for v, value in zip(variables, values)]
    return variables if tf.executing_eagerly() else assigned


def broadcast_variables(variables: Any, root_rank: int, process_set: Any = global_process_set,
                        inplace: bool = False) -> Any:
    """Assign ``root_rank``'s values to ``variables`` on every rank (one fused operation);
    returns the assignment operation in a graph, None eagerly."""
    assigned = _assign_broadcast(list(variables), root_rank, process_set)
    return None if tf.executing_eagerly() else tf.group(*assigned)


def broadcast_global_variables(root_rank: int) -> Any:
    """TensorFlow 1's global variables: not in TensorFlow 2 (use ``broadcast_variables``)."""
    if tf.executing_eagerly():
        raise RuntimeError(
            "hvd.broadcast_global_variables() does not support eager execution. Please use "
            "`hvd.broadcast_variables(<model/optimizer variables>)` instead.")
    return broadcast_variables(tf.compat.v1.global_variables(), root_rank)


def _scatter_rows(rows: int, process_set: Any) -> int:
    size, me = set_size(process_set), set_rank(process_set)
    return rows // size + (1 if me < rows % size else 0)


def reducescatter(tensor: Any, device_dense: str = "", compression: Any = Compression.none,
                  op: Any = Average, name: Any = None, process_set: Any = global_process_set,
                  ignore_name_scope: bool = False, prescale_factor: float = 1.0,
                  postscale_factor: float = 1.0) -> Any:
    """Reduce ``tensor`` over the ranks and return this rank's rows of the result (the first
    ``dim0 % size`` ranks get one row more); differentiable (the gradient is every rank's
    gradient gathered, scaled as Horovod scales it)."""
    return grouped_reducescatter([tensor], device_dense, compression, op, name, process_set,
                                 ignore_name_scope, prescale_factor, postscale_factor)[0]


@not_converted
def grouped_reducescatter(tensors: Any, device_dense: str = "",
                          compression: Any = Compression.none, op: Any = Average,
                          name: Any = None, process_set: Any = global_process_set,
                          ignore_name_scope: bool = False, prescale_factor: float = 1.0,
                          postscale_factor: float = 1.0) -> list[Any]:
    """``reducescatter`` of each tensor, in one graph operation."""
    op = check_op(None, op)
    if op not in (Sum, Average):
        raise ValueError("reducescatter supports Sum and Average")
    checked_member(process_set)
    tensors = [dense_tensor(t) for t in tensors]
    if not tensors:
        return []
    compressed = [compression.compress(t) for t in tensors]

    def compute(*arrays: np.ndarray) -> list[np.ndarray]:
        return [np.asarray(api.reducescatter(np.ascontiguousarray(a), op=op,
                                             process_set=process_set,
                                             prescale_factor=prescale_factor,
                                             postscale_factor=postscale_factor))
                for a in arrays]

    def forward(xs: list[tf.Tensor]) -> list[tf.Tensor]:
        for x in xs:
            if x.shape.rank == 0:
                raise ValueError("reducescatter needs a tensor with at least one dimension "
                                 "(it scatters the first); got a scalar")
        shapes = [tf.TensorShape([_scatter_rows(x.shape[0], process_set)]).concatenate(
            x.shape[1:]) if x.shape[0] is not None else _rows_shape(x.shape) for x in xs]
        return run_op(compute, xs, [x.dtype for x in xs], shapes,
                      _op_label("Reducescatter", name))

    def backward(dys: list[tf.Tensor]) -> list[Any]:
        factor = (set_size(process_set) if op == Sum else 1) * prescale_factor * \
            postscale_factor
        scaled = [d * tf.cast(factor, d.dtype) if factor != 1 else d for d in dys]
        return _gather(scaled, process_set, None)

    reduced = with_gradient(forward, backward, [c for c, _ in compressed])
    return [compression.decompress(r, ctx) for r, (_, ctx) in zip(reduced, compressed)]


def alltoall(tensor: Any, splits: Any = None, name: Any = None, ignore_name_scope: bool = False,
             process_set: Any = global_process_set) -> Any:
    """Send ``splits[q]`` rows of ``tensor`` to rank q (equal parts without ``splits``);
    returns the rows received, in rank order, and, when ``splits`` is given, the rows
    received from each rank (int32), as Horovod's does. Differentiable: the gradient is sent
    back along the rows it came from."""
    checked_member(process_set)
    tensor = dense_tensor(tensor)
    size = set_size(process_set)
    if splits is None:
        if tensor.shape.rank == 0 or tensor.shape[0] is None:
            splits_tensor = None
        elif tensor.shape[0] % size:
            raise InvalidArgumentError(
                f"alltoall without splits needs the first dimension ({tensor.shape[0]}) "
                f"divisible by the number of ranks ({size})")
        else:
            splits_tensor = tf.fill([size], tensor.shape[0] // size)
    else:
        splits_tensor = tf.reshape(tf.cast(dense_tensor(splits), tf.int32), [-1])
    if splits_tensor is None:
        splits_tensor = tf.fill([size], tf.shape(tensor)[0] // size)
    output, received = _exchange(tensor, splits_tensor, process_set, name)
    return output if splits is None else (output, received)


@not_converted
def _exchange(tensor: tf.Tensor, splits: tf.Tensor, process_set: Any,
              name: Any) -> tuple[tf.Tensor, tf.Tensor]:
    def compute(array: np.ndarray, counts: np.ndarray) -> list[np.ndarray]:
        received, rows = api.alltoall(np.ascontiguousarray(array), counts.tolist(),
                                      process_set=process_set)
        return [np.asarray(received), np.asarray(rows, dtype=np.int32)]

    shapes = [_rows_shape(tensor.shape), tf.TensorShape([set_size(process_set)])]
    if not tensor.dtype.is_floating:
        output, received = run_op(compute, [tensor, splits], [tensor.dtype, tf.int32], shapes,
                                  _op_label("Alltoall", name))
        return output, received

    @tf.custom_gradient
    def differentiable(x: tf.Tensor) -> Any:
        output, received = run_op(compute, [x, splits], [x.dtype, tf.int32], shapes,
                                  _op_label("Alltoall", name))

        def grad(dy: Any, _received: Any = None) -> Any:
            dy = tf.zeros_like(output) if dy is None else dy
            return _exchange(dy, received, process_set, None)[0]

        return (output, received), grad

    output, received = differentiable(tensor)
    return output, received


