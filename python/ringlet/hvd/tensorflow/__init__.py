"""Horovod's TensorFlow 2 API on ringlet: replace ``import horovod.tensorflow as hvd`` with
``import ringlet.hvd.tensorflow as hvd`` in a CPU training script.

Every collective takes ``tf.Tensor`` and ``tf.Variable`` (and ``tf.IndexedSlices`` for
allreduce), works eagerly and inside ``tf.function``, and is differentiable with Horovod's
gradient rules. Eagerly, a collective reads the tensor's memory in place and hands its result
to TensorFlow without a copy (DLPack). Inside a graph, each call is one stateful
``tf.numpy_function``: TensorFlow's automatic control dependencies run stateful operations in
program order, so every rank's collectives meet in the same order; its input is the tensor's
own memory and its output, aligned, becomes the result tensor without a copy. The reduction
itself runs in ringlet's core, in a fresh result buffer: one copy at most, as eagerly.
"""

from __future__ import annotations

import warnings
import weakref
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

try:
    import tensorflow as tf
except ImportError as exc:  # pragma: no cover - tensorflow is an optional extra
    raise ImportError(
        "ringlet.hvd.tensorflow needs TensorFlow: pip install 'ringlet[tensorflow]'"
    ) from exc

# Two checks TensorFlow has no public API for: whether a tape watches a tensor, whether a graph
# is compiled by XLA. Read once here, not on every call.
try:
    from tensorflow.python.eager import record as _tape_record
    from tensorflow.python.ops import control_flow_util as _control_flow_util
except ImportError:  # pragma: no cover - TensorFlow moved its internals: be safe
    _tape_record = _control_flow_util = None

import ringlet

from .. import *  # noqa: F403 - the process functions and constants, Horovod's names
from .. import __all__ as _hvd_all
from .. import _common
from .._common import (
    _BUILT_IN_COMPRESSORS,
    _OPS,
    Average,
    Backend,
    Compression,
    Sum,
    _op_name,
    _ringlet_set,
    _set_rank,
    _set_size,
    global_process_set,
    register_backend,
)
from .._common import Horovod as _Horovod

_api = _Horovod()


# ---- tensors as NumPy arrays and back -------------------------------------------------------


def _host(tensor: Any) -> np.ndarray:
    """An eager tensor's (or a variable's current value's) memory as a NumPy array, without
    a copy. Only read: TensorFlow's tensors are immutable."""
    if isinstance(tensor, tf.Variable):
        tensor = tensor.value()
    if not isinstance(tensor, tf.Tensor):
        tensor = tf.convert_to_tensor(tensor)
    _check_device(tensor)
    view = getattr(tensor, "_numpy", None)  # numpy() copies; _numpy() is the same memory
    return view() if view is not None else np.asarray(tensor)


def _to_tensor(array: np.ndarray) -> tf.Tensor:
    """``array`` as an eager tensor: its own memory when aligned for TensorFlow (DLPack),
    else a copy."""
    if (array.flags.c_contiguous and array.ctypes.data % 64 == 0 and array.size
            and array.dtype.name != "bfloat16" and array.dtype.kind in "fiub"):
        return tf.experimental.dlpack.from_dlpack(array.__dlpack__())
    return tf.convert_to_tensor(array)


def _check_device(tensor: Any) -> None:
    device = getattr(tensor, "device", "") or ""
    if "GPU" in device.upper():
        raise ValueError(f"ringlet reduces CPU tensors; this one is on {device}")


class TensorFlowBackend(Backend):
    """For Horovod's compressors (``Compression.fp16``) given TensorFlow tensors."""

    def array(self, tensor: Any) -> np.ndarray:
        return _host(tensor)

    def tensor(self, array: np.ndarray, like: Any) -> Any:
        return _to_tensor(array)

    def assign(self, tensor: Any, array: np.ndarray) -> None:
        tensor.assign(array)

    def dtype(self, tensor: Any) -> Any:
        return tensor.dtype

    def is_floating(self, tensor: Any) -> bool:
        return bool(tensor.dtype.is_floating)

    def cast(self, tensor: Any, dtype: Any) -> Any:
        return tf.cast(tensor, dtype)


register_backend(tf.Tensor, TensorFlowBackend())
register_backend(tf.Variable, TensorFlowBackend())


# ---- one collective, eagerly or as a graph operation ----------------------------------------


def _run(compute: Callable[..., list[np.ndarray]], inputs: Sequence[Any],
         dtypes: Sequence[tf.DType], shapes: Sequence[Any], name: str) -> list[tf.Tensor]:
    """``compute`` (NumPy arrays in, NumPy arrays out) on ``inputs``: at once when eager, else
    as a stateful graph operation, which TensorFlow runs in program order."""
    inputs = [_dense(x) for x in inputs]
    if tf.executing_eagerly():
        try:
            results = compute(*(_host(x) for x in inputs))
        except ValueError as error:
            if isinstance(error, tf.errors.OpError):
                raise
            # What a graph's numpy_function makes of a ValueError, eagerly too.
            raise InvalidArgumentError(str(error)) from error
        return [_to_tensor(out) for out in results]

    if _in_xla_context():
        raise ValueError(
            f"ringlet's collectives cannot run inside an XLA-compiled function ({name} in "
            "tf.function(jit_compile=True), or a Keras model compiled with jit_compile=True on "
            "the TensorFlow backend): compile without XLA (jit_compile=False, Keras' default "
            "on a CPU-only machine)")

    def body(*arrays: np.ndarray) -> list[np.ndarray]:
        # TensorFlow's executor threads are named differently on each rank.
        with ringlet.as_caller("tensorflow graph"):
            return compute(*arrays)

    graph = tf.compat.v1.get_default_graph()
    # Inside tf.function, automatic control dependencies keep stateful operations in program
    # order. A TensorFlow 1 graph has none: there each collective waits for the one built
    # before it, so that every rank's session runs them in the order every rank built them.
    previous = None if getattr(graph, "building_function", False) else _last_in_graph.get(graph)
    with tf.control_dependencies([previous] if previous is not None else []):
        outputs = tf.numpy_function(body, inputs, list(dtypes), stateful=True, name=name)
    outputs = outputs if isinstance(outputs, (list, tuple)) else [outputs]
    if not getattr(graph, "building_function", False):
        _last_in_graph[graph] = outputs[0].op
    for output, shape in zip(outputs, shapes):
        output.set_shape(shape)
    return list(outputs)


_last_in_graph: weakref.WeakKeyDictionary[Any, Any] = weakref.WeakKeyDictionary()
"""The last collective built in each TensorFlow 1 graph."""


def _in_xla_context() -> bool:
    if _control_flow_util is None:  # pragma: no cover - then XLA's own error says it
        return False
    return bool(_control_flow_util.GraphOrParentsInXlaContext(tf.compat.v1.get_default_graph()))


def _dense(x: Any) -> tf.Tensor:
    if isinstance(x, tf.Variable):
        return x.read_value() if not tf.executing_eagerly() else x.value()
    tensor = tf.convert_to_tensor(x)
    _check_device(tensor)
    return tensor


def _with_gradient(forward: Callable[[list[tf.Tensor]], list[tf.Tensor]],
                   backward: Callable[[list[tf.Tensor]], list[Any]],
                   inputs: list[tf.Tensor]) -> list[tf.Tensor]:
    """``forward(inputs)``, differentiable through ``backward`` when the inputs are floats."""
    inputs = [_dense(x) for x in inputs]  # a variable's read is what a tape watches
    if not inputs or not all(x.dtype.is_floating for x in inputs) or not _may_record(inputs):
        return forward(inputs)

    @tf.custom_gradient
    def collective(*xs: tf.Tensor) -> Any:
        ys = forward(list(xs))

        def grad(*dys: Any) -> Any:
            dys = [tf.zeros_like(y) if d is None else tf.convert_to_tensor(d)
                   for y, d in zip(ys, dys)]
            return backward(dys)

        return ys, grad

    return list(collective(*inputs))


def _may_record(inputs: list[tf.Tensor]) -> bool:
    """Whether a gradient tape may need these inputs' gradients: always in a graph (traced
    once); eagerly only under a tape that watches them (wrapping the call for the tape costs
    more than the collective itself when none does)."""
    if not tf.executing_eagerly() or _tape_record is None:
        return True
    return bool(_tape_record.should_record_backprop(inputs))


def _aligned_copy(array: np.ndarray) -> np.ndarray:
    out = ringlet.aligned_empty(array.shape, array.dtype)
    np.copyto(out, array)
    return out


# ---- allreduce ------------------------------------------------------------------------------


def _reduce(tensors: list[tf.Tensor], op: Any, prescale: float, postscale: float,
            compression: Any, process_set: Any, name: Any) -> list[tf.Tensor]:
    """One fused allreduce of ``tensors`` (any dtypes), differentiable (the gradient of an
    allreduce is the allreduce of the gradient: same op, same factors)."""

    plain = prescale == 1.0 and postscale == 1.0 and compression in (None, Compression.none)

    def compute(*arrays: np.ndarray) -> list[np.ndarray]:
        if plain and len(arrays) == 1 and arrays[0].dtype.name in ringlet.SUPPORTED_DTYPES \
                and not _common.matching_by_name():
            # One tensor: the synchronous call, into an aligned result (no queue hand-off).
            out = ringlet.aligned_empty(arrays[0].shape, arrays[0].dtype)
            ringlet.allreduce(arrays[0], _op_name(None, op), out=out,
                              process_set=_ringlet_set(process_set))
            return [out]
        work = [_aligned_copy(a) for a in arrays]
        _api.grouped_allreduce_(work, name=name, op=op, prescale_factor=prescale,
                                postscale_factor=postscale, process_set=process_set,
                                compression=compression)
        return work

    def forward(xs: list[tf.Tensor]) -> list[tf.Tensor]:
        return _run(compute, xs, [x.dtype for x in xs], [x.shape for x in xs],
                    _op_label("Allreduce", name))

    def backward(dys: list[tf.Tensor]) -> list[Any]:
        return _reduce(dys, op, prescale, postscale, Compression.none, process_set, None)

    return _with_gradient(forward, backward, tensors)


def _op_label(kind: str, name: Any) -> str:
    return f"Ringlet{kind}" if name is None else f"Ringlet{kind}_{name}".replace(":", "_")


def _compressed_reduce(tensors: list[Any], op: Any, prescale: float, postscale: float,
                       compression: Any, process_set: Any, name: Any) -> list[tf.Tensor]:
    """Built-in compressors work inside the core (cast while packing, float32 accumulation);
    a user's ``Compressor`` runs on the TensorFlow tensors around the reduction, as in
    Horovod."""
    if compression is None or compression in _BUILT_IN_COMPRESSORS:
        return _reduce(tensors, op, prescale, postscale, compression, process_set, name)
    compressed = [compression.compress(t) for t in tensors]
    reduced = _reduce([c for c, _ in compressed], op, prescale, postscale, None, process_set,
                      name)
    return [compression.decompress(r, ctx) for r, (_, ctx) in zip(reduced, compressed)]


def _check_op(average: Any, op: Any) -> Any:
    """Horovod's op (the deprecated ``average`` folded in), checked now: at the call or when
    traced, before anything runs."""
    return _OPS[_op_name(average, op)]


def allreduce(tensor: Any, average: Any = None, device_dense: str = "", device_sparse: str = "",
              compression: Any = Compression.none, op: Any = None, prescale_factor: float = 1.0,
              postscale_factor: float = 1.0, name: Any = None,
              process_set: Any = global_process_set, ignore_name_scope: bool = False) -> Any:
    """The reduction (default: average) of ``tensor`` over the ranks of ``process_set``, as a
    new tensor; a ``tf.IndexedSlices`` is reduced as Horovod does, by allgathering its values
    and indices (Sum and Average only)."""
    op = _check_op(average, op)
    _member(process_set)
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
            values = values / tf.cast(_set_size(process_set), values.dtype)
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
    op = _check_op(average, op)
    _member(process_set)
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


def _gather(tensors: list[tf.Tensor], process_set: Any, name: Any) -> list[tf.Tensor]:
    """Horovod's allgather, differentiable: the gradient is this rank's rows of the
    gradient averaged over the ranks."""

    def compute(*arrays: np.ndarray) -> list[np.ndarray]:
        return [np.asarray(_api.allgather(
            np.ascontiguousarray(a), None if name is None else f"{name}.{i}",
            process_set=process_set)) for i, a in enumerate(arrays)]

    def forward(xs: list[tf.Tensor]) -> list[tf.Tensor]:
        for x in xs:
            if x.shape.rank == 0:
                raise ValueError("allgather needs a tensor with at least one dimension "
                                 "(it concatenates the first); got a scalar")
        return _run(compute, xs, [x.dtype for x in xs], [_rows_shape(x.shape) for x in xs],
                    _op_label("Allgather", name))

    def backward(dys: list[tf.Tensor]) -> list[Any]:
        reduced = [_reduce([d], Average, 1.0, 1.0, None, process_set, None)[0] for d in dys]
        rows = tf.stack([tf.shape(x, out_type=tf.int32)[0] for x in tensors])
        every = tf.reshape(_gather([rows], process_set, None)[0], [-1, len(tensors)])
        me = _set_rank(process_set)
        size = _set_size(process_set)
        return [tf.split(r, every[:, i], num=size, axis=0)[me] if size > 1 else r
                for i, r in enumerate(reduced)]

    return _with_gradient(forward, backward, [_dense(t) for t in tensors])


class InvalidArgumentError(ValueError, tf.errors.InvalidArgumentError):
    """A bad argument: both the ``ValueError`` ringlet raises and the
    ``tf.errors.InvalidArgumentError`` Horovod's TensorFlow operations raise."""

    def __init__(self, message: str) -> None:
        ValueError.__init__(self, message)
        tf.errors.InvalidArgumentError.__init__(self, None, None, message)

    def __reduce__(self) -> Any:
        return (type(self), (self.message,))


def _member(process_set: Any) -> Any:
    """The ringlet set behind ``process_set``, checked now (at the call, or when traced): a
    rank outside it gets Horovod's InvalidArgumentError, before anything runs."""
    chosen = _ringlet_set(process_set)
    if chosen is not None and ringlet.rank() not in chosen.ranks:
        raise InvalidArgumentError(
            f"rank {ringlet.rank()} is not in process set {chosen.id} (ranks "
            f"{list(chosen.ranks)}); only its members may call its collectives")
    return chosen


def allgather(tensor: Any, name: Any = None, ignore_name_scope: bool = False,
              process_set: Any = global_process_set) -> Any:
    """Every rank's ``tensor`` concatenated along the first dimension, in rank order (the
    first dimension may differ between ranks, the others and the dtype may not)."""
    _member(process_set)
    return _gather([tensor], process_set, name)[0]


def grouped_allgather(tensors: Any, name: Any = None, ignore_name_scope: bool = False,
                      process_set: Any = global_process_set) -> list[Any]:
    """``allgather`` of each tensor, in one graph operation."""
    _member(process_set)
    tensors = list(tensors)
    return _gather(tensors, process_set, name) if tensors else []


def broadcast(tensor: Any, root_rank: int, name: Any = None, ignore_name_scope: bool = False,
              process_set: Any = global_process_set) -> Any:
    """``root_rank``'s ``tensor`` on every rank, as a new tensor; differentiable (the gradient
    goes to the root: the average over ranks of the gradient there, zeros elsewhere)."""
    _member(process_set)
    root = _check_root(root_rank, process_set)

    def compute(array: np.ndarray) -> list[np.ndarray]:
        return [_api.broadcast_(_aligned_copy(array), root, name, process_set=process_set)]

    def forward(xs: list[tf.Tensor]) -> list[tf.Tensor]:
        return _run(compute, xs, [xs[0].dtype], [xs[0].shape], _op_label("Broadcast", name))

    def backward(dys: list[tf.Tensor]) -> list[Any]:
        reduced = _reduce(dys, Average, 1.0, 1.0, None, process_set, None)[0]
        if ringlet.rank() == root:
            return [reduced]
        # The zeros wait for the reduction: in a graph they would not run it otherwise, and
        # the root's reduction would wait for this rank forever.
        with tf.control_dependencies([reduced]):
            return [tf.zeros_like(reduced)]

    return _with_gradient(forward, backward, [_dense(tensor)])[0]


def _check_root(root_rank: Any, process_set: Any) -> int:
    """Horovod's root: a global rank, which must belong to the process set."""
    chosen = _ringlet_set(process_set)
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


def _assign_broadcast(variables: list[tf.Variable], root_rank: int,
                      process_set: Any) -> list[Any]:
    """Every variable's value on ``root_rank`` assigned on every rank, one operation for all."""
    _member(process_set)
    root = _check_root(root_rank, process_set)
    if not variables:
        return []

    def compute(*arrays: np.ndarray) -> list[np.ndarray]:
        return [_api.broadcast_(_aligned_copy(a), root, process_set=process_set)
                for a in arrays]

    values = _run(compute, variables, [v.dtype for v in variables], [v.shape for v in variables],
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
    size, me = _set_size(process_set), _set_rank(process_set)
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


def grouped_reducescatter(tensors: Any, device_dense: str = "",
                          compression: Any = Compression.none, op: Any = Average,
                          name: Any = None, process_set: Any = global_process_set,
                          ignore_name_scope: bool = False, prescale_factor: float = 1.0,
                          postscale_factor: float = 1.0) -> list[Any]:
    """``reducescatter`` of each tensor, in one graph operation."""
    op = _check_op(None, op)
    if op not in (Sum, Average):
        raise ValueError("reducescatter supports Sum and Average")
    _member(process_set)
    tensors = [_dense(t) for t in tensors]
    if not tensors:
        return []
    compressed = [compression.compress(t) for t in tensors]

    def compute(*arrays: np.ndarray) -> list[np.ndarray]:
        return [np.asarray(_api.reducescatter(np.ascontiguousarray(a), op=op,
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
        return _run(compute, xs, [x.dtype for x in xs], shapes,
                    _op_label("Reducescatter", name))

    def backward(dys: list[tf.Tensor]) -> list[Any]:
        factor = (_set_size(process_set) if op == Sum else 1) * prescale_factor * \
            postscale_factor
        scaled = [d * tf.cast(factor, d.dtype) if factor != 1 else d for d in dys]
        return _gather(scaled, process_set, None)

    reduced = _with_gradient(forward, backward, [c for c, _ in compressed])
    return [compression.decompress(r, ctx) for r, (_, ctx) in zip(reduced, compressed)]


def alltoall(tensor: Any, splits: Any = None, name: Any = None, ignore_name_scope: bool = False,
             process_set: Any = global_process_set) -> Any:
    """Send ``splits[q]`` rows of ``tensor`` to rank q (equal parts without ``splits``);
    returns the rows received, in rank order, and, when ``splits`` is given, the rows
    received from each rank (int32), as Horovod's does. Differentiable: the gradient is sent
    back along the rows it came from."""
    _member(process_set)
    tensor = _dense(tensor)
    size = _set_size(process_set)
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
        splits_tensor = tf.reshape(tf.cast(_dense(splits), tf.int32), [-1])
    if splits_tensor is None:
        splits_tensor = tf.fill([size], tf.shape(tensor)[0] // size)
    output, received = _exchange(tensor, splits_tensor, process_set, name)
    return output if splits is None else (output, received)


def _exchange(tensor: tf.Tensor, splits: tf.Tensor, process_set: Any,
              name: Any) -> tuple[tf.Tensor, tf.Tensor]:
    def compute(array: np.ndarray, counts: np.ndarray) -> list[np.ndarray]:
        received, rows = _api.alltoall(np.ascontiguousarray(array), counts.tolist(),
                                       process_set=process_set)
        return [np.asarray(received), np.asarray(rows, dtype=np.int32)]

    shapes = [_rows_shape(tensor.shape), tf.TensorShape([_set_size(process_set)])]
    if not tensor.dtype.is_floating:
        output, received = _run(compute, [tensor, splits], [tensor.dtype, tf.int32], shapes,
                                _op_label("Alltoall", name))
        return output, received

    @tf.custom_gradient
    def differentiable(x: tf.Tensor) -> Any:
        output, received = _run(compute, [x, splits], [x.dtype, tf.int32], shapes,
                                _op_label("Alltoall", name))

        def grad(dy: Any, _received: Any = None) -> Any:
            dy = tf.zeros_like(output) if dy is None else dy
            return _exchange(dy, received, process_set, None)[0]

        return (output, received), grad

    output, received = differentiable(tensor)
    return output, received


# ---- process --------------------------------------------------------------------------------


def _int_op(value: Callable[[], int], name: str) -> tf.Tensor:
    return tf.constant(value(), dtype=tf.int32, name=name)


def size_op(process_set_id: int = 0, name: Any = None) -> tf.Tensor:
    """The number of ranks (of the process set with this id) as an int32 tensor."""
    return _int_op(lambda: _sized(process_set_id)[0], name or "size")


def rank_op(name: Any = None) -> tf.Tensor:
    """This rank, as an int32 tensor."""
    return _int_op(ringlet.rank, name or "rank")


def local_size_op(name: Any = None) -> tf.Tensor:
    """The number of ranks on this host, as an int32 tensor."""
    return _int_op(local_size, name or "local_size")  # noqa: F405


def local_rank_op(name: Any = None) -> tf.Tensor:
    """This rank's index on its host, as an int32 tensor."""
    return _int_op(local_rank, name or "local_rank")  # noqa: F405


def process_set_included_op(process_set_id: int = 0, name: Any = None) -> tf.Tensor:
    """1 if this rank belongs to the process set with this id, else 0 (int32)."""
    return _int_op(lambda: _sized(process_set_id)[1], name or "process_set_included")


def _sized(process_set_id: int) -> tuple[int, int]:
    """(size, included) of the process set with this id."""
    if process_set_id == 0:
        return ringlet.size(), 1
    for added in ringlet.process_sets():
        if added.id == process_set_id:
            return len(added.ranks), int(ringlet.rank() in added.ranks)
    raise ValueError(f"no process set has id {process_set_id}")


def barrier(process_set: Any = global_process_set) -> Any:
    """Wait until every rank (of ``process_set``) has called it; in a graph, an operation."""
    _member(process_set)

    def compute() -> list[np.ndarray]:
        _api.barrier(process_set)
        return [np.zeros((), np.int32)]

    if tf.executing_eagerly():
        _api.barrier(process_set)
        return None
    return _run(compute, [], [tf.int32], [tf.TensorShape([])], "RingletBarrier")[0]


def join() -> Any:
    """Until every rank has joined, add zeros to the others' Sum and Average allreduces;
    returns the rank that joined last (an int32 tensor, as Horovod's)."""

    def compute() -> list[np.ndarray]:
        return [np.array(_api.join(), dtype=np.int32)]

    return _run(compute, [], [tf.int32], [tf.TensorShape([])], "RingletJoin")[0]


def broadcast_object(obj: Any, root_rank: int = 0, session: Any = None, name: Any = None,
                     process_set: Any = global_process_set) -> Any:
    """``root_rank``'s picklable ``obj`` on every rank (eagerly)."""
    return _api.broadcast_object(obj, root_rank, process_set=process_set)


def broadcast_object_fn(root_rank: int = 0, session: Any = None, name: Any = None,
                        process_set: Any = global_process_set) -> Callable[[Any], Any]:
    """A function that broadcasts its argument from ``root_rank``."""
    return lambda obj: broadcast_object(obj, root_rank, session, name, process_set)


def allgather_object(obj: Any, session: Any = None, name: Any = None,
                     process_set: Any = global_process_set) -> list[Any]:
    """Every rank's picklable ``obj``, as a list indexed by rank (eagerly)."""
    return _api.allgather_object(obj, process_set=process_set)


# ---- gradients ------------------------------------------------------------------------------


def _reduce_gradients(grads: list[Any], sources: list[Any], compression: Any,
                      sparse_as_dense: bool, op: Any, predivide: float, groups: Any,
                      process_set: Any) -> list[Any]:
    """The gradients reduced over the ranks: dense ones fused, one call per group (default:
    all of them), sparse ones by allgather; None stays None."""
    if sparse_as_dense:
        grads = [tf.convert_to_tensor(g) if isinstance(g, tf.IndexedSlices) else g
                 for g in grads]
    chosen = _ringlet_set(process_set)
    if chosen is not None and (ringlet.rank() not in chosen.ranks or len(chosen.ranks) == 1):
        return list(grads)  # Horovod's _allreduce_cond: nothing to reduce with
    prescale, postscale = (1.0 / predivide, predivide) if op == Average else (1.0, 1.0)
    reduced: list[Any] = list(grads)
    dense = [i for i, g in enumerate(grads)
             if g is not None and not isinstance(g, tf.IndexedSlices)]
    for i, g in enumerate(grads):
        if isinstance(g, tf.IndexedSlices):
            reduced[i] = allreduce(g, op=op, process_set=process_set)
    for group in _gradient_groups(dense, sources, groups):
        out = grouped_allreduce([grads[i] for i in group], op=op, compression=compression,
                                prescale_factor=prescale, postscale_factor=postscale,
                                process_set=process_set)
        for i, r in zip(group, out):
            reduced[i] = r
    return reduced


def _gradient_groups(dense: list[int], sources: list[Any], groups: Any) -> list[list[int]]:
    if groups is None:
        return [dense] if dense else []
    if isinstance(groups, int):
        if groups <= 0:
            return [dense] if dense else []
        return [part.tolist() for part in np.array_split(np.array(dense, dtype=int), groups)
                if part.size]
    named = {id(v): n for n, group in enumerate(groups) for v in group}
    chosen: dict[int, list[int]] = {}
    alone: list[list[int]] = []
    for i in dense:
        n = named.get(id(sources[i]))
        if n is None:
            alone.append([i])
        else:
            chosen.setdefault(n, []).append(i)
    return [chosen[n] for n in sorted(chosen)] + alone


def _check_gradient_options(op: Any, gradient_predivide_factor: float, num_groups: int,
                            groups: Any) -> Any:
    op = _check_op(None, op)
    if gradient_predivide_factor != 1.0 and op != Average:
        raise ValueError("gradient_predivide_factor not supported with op != Average")
    if num_groups != 0:
        warnings.warn("Parameter `num_groups` has been replaced by `groups` and will be "
                      "removed in v0.23.0.", DeprecationWarning, stacklevel=3)
        if groups is None:
            groups = num_groups
    if groups is not None and not (isinstance(groups, list) or (
            isinstance(groups, int) and groups > 0)):
        raise ValueError("groups should be a non-negative integer or a list of list of "
                         "tf.Variable.")
    return groups


def _key(source: Any) -> Any:
    """A hashable identity of a variable (TensorFlow's, or Keras 3's, which has no ref())."""
    ref = getattr(source, "ref", None)
    return ref() if ref is not None else id(source)


class _DistributedGradientTape:
    """The methods a wrapped tape gets (its class stays the original tape's)."""

    def _setup(self, compression: Any, sparse_as_dense: bool, op: Any, predivide: float,
               groups: Any, process_set: Any, scale_local_gradients: bool) -> None:
        self._ringlet = (compression, sparse_as_dense, op, predivide, groups, process_set)
        self.process_set = process_set
        self.scale_local_gradients = scale_local_gradients
        self._local_sources: set[Any] = set()

    def register_local_source(self, source: Any) -> None:
        """Leave this source's gradient unreduced (scaled by 1/size if
        ``scale_local_gradients``)."""
        self._local_sources.add(_key(source))

    def gradient(self, target: Any, sources: Any, output_gradients: Any = None,
                 use_generic_names: bool = False) -> Any:
        gradients = super(self.__class__, self).gradient(target, sources, output_gradients)
        flat_sources = tf.nest.flatten(sources)
        flat = tf.nest.flatten(gradients, expand_composites=False)
        compression, sparse_as_dense, op, predivide, groups, process_set = self._ringlet
        shared = [i for i, s in enumerate(flat_sources) if _key(s) not in self._local_sources]
        reduced = _reduce_gradients([flat[i] for i in shared], [flat_sources[i] for i in shared],
                                    compression, sparse_as_dense, op, predivide, groups,
                                    process_set)
        result = list(flat)
        for i, r in zip(shared, reduced):
            result[i] = r
        if self.scale_local_gradients and self._local_sources:
            size = float(_set_size(process_set))
            for i, s in enumerate(flat_sources):
                g = result[i]
                if _key(s) in self._local_sources and g is not None:
                    result[i] = (tf.IndexedSlices(g.values / size, g.indices, g.dense_shape)
                                 if isinstance(g, tf.IndexedSlices) else g / size)
        return tf.nest.pack_sequence_as(sources, result)

    def get_local_and_global_gradients(self, target: Any, sources: Any,
                                       output_gradients: Any = None,
                                       use_generic_names: bool = False) -> Any:
        gradients = self.gradient(target, sources, output_gradients)
        local, shared = [], []
        for s, g in zip(sources, gradients):
            (local if _key(s) in self._local_sources else shared).append((s, g))
        return local, shared


def DistributedGradientTape(gradtape: tf.GradientTape, device_dense: str = "",
                            device_sparse: str = "", compression: Any = Compression.none,
                            sparse_as_dense: bool = False, op: Any = Average,
                            gradient_predivide_factor: float = 1.0, num_groups: int = 0,
                            groups: Any = None, process_set: Any = global_process_set,
                            scale_local_gradients: bool = True) -> tf.GradientTape:
    """``gradtape`` whose ``gradient()`` returns the gradients averaged (``op``) over the
    ranks: every dense gradient in one fused reduction (or one per group of ``groups``)."""
    groups = _check_gradient_options(op, gradient_predivide_factor, num_groups, groups)
    _ringlet_set(process_set)
    methods = {k: v for k, v in vars(_DistributedGradientTape).items()
               if not k.startswith("__")}
    cls = type(gradtape.__class__.__name__, (gradtape.__class__,), methods)
    tape = cls.__new__(cls)
    tape.__dict__.update(gradtape.__dict__)  # the same recording tape, now reducing
    tape._setup(compression, sparse_as_dense, _check_op(None, op), gradient_predivide_factor,
                groups, process_set, scale_local_gradients)
    return tape


def PartialDistributedGradientTape(gradtape: tf.GradientTape, device_dense: str = "",
                                   device_sparse: str = "", compression: Any = Compression.none,
                                   sparse_as_dense: bool = False, op: Any = Average,
                                   gradient_predivide_factor: float = 1.0, num_groups: int = 0,
                                   groups: Any = None, process_set: Any = global_process_set,
                                   local_layers: Any = None,
                                   scale_local_gradients: bool = True) -> tf.GradientTape:
    """``DistributedGradientTape`` whose ``local_layers``' variables keep their local
    gradients."""
    tape = DistributedGradientTape(gradtape, device_dense, device_sparse, compression,
                                   sparse_as_dense, op, gradient_predivide_factor, num_groups,
                                   groups, process_set, scale_local_gradients)
    layers = [] if local_layers is None else (
        local_layers if isinstance(local_layers, (list, tuple)) else [local_layers])
    for layer in layers:
        for var in layer.trainable_weights:
            tape.register_local_source(var)
    return tape


class _DistributedOptimizer(tf.compat.v1.train.Optimizer):
    """A TensorFlow 1 optimizer whose ``compute_gradients`` reduces the gradients."""

    def __init__(self, optimizer: Any, name: Any, use_locking: bool, compression: Any,
                 sparse_as_dense: bool, op: Any, predivide: float, groups: Any,
                 process_set: Any) -> None:
        super().__init__(name=name or f"Distributed{type(optimizer).__name__}",
                         use_locking=use_locking)
        self._optimizer = optimizer
        self._ringlet = (compression, sparse_as_dense, op, predivide, groups, process_set)

    def compute_gradients(self, *args: Any, **kwargs: Any) -> Any:
        pairs = self._optimizer.compute_gradients(*args, **kwargs)
        grads, variables = zip(*pairs) if pairs else ((), ())
        reduced = _reduce_gradients(list(grads), list(variables), *self._ringlet)
        return list(zip(reduced, variables))

    def apply_gradients(self, *args: Any, **kwargs: Any) -> Any:
        return self._optimizer.apply_gradients(*args, **kwargs)

    def get_slot(self, *args: Any, **kwargs: Any) -> Any:
        return self._optimizer.get_slot(*args, **kwargs)

    def get_slot_names(self, *args: Any, **kwargs: Any) -> Any:
        return self._optimizer.get_slot_names(*args, **kwargs)

    def variables(self, *args: Any, **kwargs: Any) -> Any:
        return self._optimizer.variables(*args, **kwargs)


def DistributedOptimizer(optimizer: Any, name: Any = None, use_locking: bool = False,
                         device_dense: str = "", device_sparse: str = "",
                         compression: Any = Compression.none, sparse_as_dense: bool = False,
                         backward_passes_per_step: int = 1, op: Any = Average,
                         gradient_predivide_factor: float = 1.0,
                         average_aggregated_gradients: bool = False, num_groups: int = 0,
                         groups: Any = None, process_set: Any = global_process_set,
                         scale_local_gradients: bool = True) -> Any:
    """Wrap a TensorFlow 1 optimizer (``tf.compat.v1.train.Optimizer``) so that its
    gradients are reduced over the ranks. A Keras optimizer is ``ringlet.hvd.keras``'s to wrap
    (``ringlet.hvd.tensorflow.keras.DistributedOptimizer``): a TypeError says so."""
    groups = _check_gradient_options(op, gradient_predivide_factor, num_groups, groups)
    _ringlet_set(process_set)
    if not isinstance(optimizer, tf.compat.v1.train.Optimizer):
        raise TypeError(
            f"hvd.DistributedOptimizer here wraps TensorFlow 1 optimizers "
            f"(tf.compat.v1.train.Optimizer); got {type(optimizer).__module__}."
            f"{type(optimizer).__name__}. For a Keras optimizer use "
            "ringlet.hvd.tensorflow.keras.DistributedOptimizer (or ringlet.hvd.keras's), or "
            "hvd.DistributedGradientTape in a custom training step")
    if backward_passes_per_step != 1:
        raise NotImplementedError("backward_passes_per_step > 1 is supported for Keras "
                                  "optimizers (ringlet.hvd.keras), not TensorFlow 1's")
    return _DistributedOptimizer(optimizer, name, use_locking, compression, sparse_as_dense,
                                 _check_op(None, op), gradient_predivide_factor, groups,
                                 process_set)


_OWN = [
    "Adasum", "Average", "Compression", "DistributedGradientTape", "DistributedOptimizer",
    "InvalidArgumentError", "Max", "Min", "PartialDistributedGradientTape", "Product", "Sum",
    "allgather",
    "allgather_object", "allreduce", "alltoall", "barrier", "broadcast", "broadcast_",
    "broadcast_global_variables", "broadcast_object", "broadcast_object_fn",
    "broadcast_variables", "global_process_set", "grouped_allgather", "grouped_allreduce",
    "grouped_reducescatter", "join", "local_rank_op", "local_size_op",
    "process_set_included_op", "rank_op", "reducescatter", "size_op",
]
__all__ = sorted(set(_hvd_all) | set(_OWN))
