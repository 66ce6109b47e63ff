"""TensorFlow tensors as NumPy arrays and back, and one collective run eagerly or as a
stateful graph operation (which TensorFlow runs in program order)."""

from __future__ import annotations

import sys
import threading
import weakref
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import tensorflow as tf

import ringlet

# Two checks TensorFlow has no public API for: whether a tape watches a tensor, whether a graph
# is compiled by XLA. Read once here, not on every call.
try:
    from tensorflow.python.eager import record as _tape_record
    from tensorflow.python.ops import control_flow_util as _control_flow_util
except ImportError:  # pragma: no cover - TensorFlow moved its internals: be safe
    _tape_record = _control_flow_util = None


from .._backend import Backend, register_backend
from .._process_sets import ringlet_set
from . import _kernel

__all__ = ["InvalidArgumentError", "ResultBuffers", "TensorFlowBackend", "aligned_copy",
           "check_device", "checked_member", "dense_tensor", "host_array", "not_converted",
           "run_op", "to_tensor", "with_gradient"]

not_converted = tf.autograph.experimental.do_not_convert
"""For each function that defines what a graph operation runs: called from a function that
AutoGraph converts, it would be converted too, and so would the operation's Python body,
which then pays AutoGraph's helpers on every run (about 15 ms for an allreduce)."""


def host_array(tensor: Any) -> np.ndarray:
    """An eager tensor's (or a variable's current value's) memory as a NumPy array, without
    a copy. Only read: TensorFlow's tensors are immutable."""
    if isinstance(tensor, tf.Variable):
        tensor = tensor.value()
    if not isinstance(tensor, tf.Tensor):
        tensor = tf.convert_to_tensor(tensor)
    check_device(tensor)
    view = getattr(tensor, "_numpy", None)  # numpy() copies; _numpy() is the same memory
    return view() if view is not None else np.asarray(tensor)


def to_tensor(array: np.ndarray) -> tf.Tensor:
    """``array`` as an eager tensor: its own memory when aligned for TensorFlow (DLPack),
    else a copy."""
    if (array.flags.c_contiguous and array.ctypes.data % 64 == 0 and array.size
            and array.dtype.name != "bfloat16" and array.dtype.kind in "fiub"):
        return tf.experimental.dlpack.from_dlpack(array.__dlpack__())
    return tf.convert_to_tensor(array)


def check_device(tensor: Any) -> None:
    device = getattr(tensor, "device", "") or ""
    if "GPU" in device.upper():
        raise ValueError(f"ringlet reduces CPU tensors; this one is on {device}")


class TensorFlowBackend(Backend):
    """For Horovod's compressors (``Compression.fp16``) given TensorFlow tensors."""

    def array(self, tensor: Any) -> np.ndarray:
        return host_array(tensor)

    def tensor(self, array: np.ndarray, like: Any) -> Any:
        return to_tensor(array)

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


@not_converted
def run_op(compute: Callable[..., list[np.ndarray]], inputs: Sequence[Any],
           dtypes: Sequence[tf.DType], shapes: Sequence[Any], name: str,
           compute_into: _kernel.Compute | None = None) -> list[tf.Tensor]:
    """``compute`` (NumPy arrays in, NumPy arrays out) on ``inputs``: at once when eager, else
    as a stateful graph operation, which TensorFlow runs in program order. With
    ``compute_into`` (arrays and results of their shapes, the same arrays when in place), a
    graph runs it in ringlet's compiled operation where it can (``_kernel``)."""
    inputs = [dense_tensor(x) for x in inputs]
    if tf.executing_eagerly():
        try:
            results = compute(*(host_array(x) for x in inputs))
        except ValueError as error:
            if isinstance(error, tf.errors.OpError):
                raise
            # What a graph's numpy_function makes of a ValueError, eagerly too.
            raise InvalidArgumentError(str(error)) from error
        return [to_tensor(out) for out in results]

    if _in_xla_context():
        raise ValueError(
            f"ringlet's collectives cannot run inside an XLA-compiled function ({name} in "
            "tf.function(jit_compile=True), or a Keras model compiled with jit_compile=True on "
            "the TensorFlow backend): compile without XLA (jit_compile=False, Keras' default "
            "on a CPU-only machine)")

    # TensorFlow's executor threads are named differently on each rank: one caller for all.
    def body(*arrays: np.ndarray) -> list[np.ndarray]:
        with ringlet.as_caller("tensorflow graph"):
            return compute(*arrays)

    def body_into(arrays: list[np.ndarray], results: list[np.ndarray]) -> None:
        with ringlet.as_caller("tensorflow graph"):
            compute_into(arrays, results)

    compiled = None
    if compute_into is not None and inputs and all(d in _kernel.DTYPES for d in dtypes):
        compiled = _kernel.allreduce_op()
    graph = tf.compat.v1.get_default_graph()
    # Inside tf.function, automatic control dependencies keep stateful operations in program
    # order. A TensorFlow 1 graph has none: there each collective waits for the one built
    # before it, so that every rank's session runs them in the order every rank built them.
    previous = None if getattr(graph, "building_function", False) else _last_in_graph.get(graph)
    with tf.control_dependencies([previous] if previous is not None else []):
        if compiled is not None:
            outputs = compiled(inputs, callback=_kernel.register(body_into, dtypes), name=name)
        else:
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


def dense_tensor(x: Any) -> tf.Tensor:
    if isinstance(x, tf.Variable):
        return x.read_value() if not tf.executing_eagerly() else x.value()
    tensor = tf.convert_to_tensor(x)
    check_device(tensor)
    return tensor


def with_gradient(forward: Callable[[list[tf.Tensor]], list[tf.Tensor]],
                  backward: Callable[[list[tf.Tensor]], list[Any]],
                  inputs: list[tf.Tensor]) -> list[tf.Tensor]:
    """``forward(inputs)``, differentiable through ``backward`` when the inputs are floats."""
    inputs = [dense_tensor(x) for x in inputs]  # a variable's read is what a tape watches
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


class ResultBuffers:
    """The aligned arrays one graph operation returns, reused once TensorFlow has let go of
    them, so that a training step does not page-fault fresh memory for its results.

    TensorFlow keeps an aligned NumPy result as its tensor's memory and holds a reference to
    the array until the tensor is freed: an array only this object refers to is free.
    """

    KEPT = 2
    """Arrays kept per output: the one TensorFlow still holds from the last step, and one to
    write (more are made as needed, but not kept)."""

    def __init__(self) -> None:
        self._kept: list[list[np.ndarray]] = []
        self._lock = threading.Lock()

    def empty(self, index: int, shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
        """An aligned array for output ``index``: a kept one nobody else holds, else new."""
        with self._lock:
            while len(self._kept) <= index:
                self._kept.append([])
            kept = self._kept[index]
            for i in range(len(kept)):
                # References: the list's and getrefcount's argument (no loop variable: it
                # would add one, and enumerate's reused tuple another).
                if sys.getrefcount(kept[i]) == 2:
                    if kept[i].shape != shape or kept[i].dtype != dtype:
                        kept[i] = ringlet.aligned_empty(shape, dtype)
                    return kept[i]
            array = ringlet.aligned_empty(shape, dtype)
            if len(kept) < self.KEPT:
                kept.append(array)
            return array


def aligned_copy(array: np.ndarray) -> np.ndarray:
    out = ringlet.aligned_empty(array.shape, array.dtype)
    np.copyto(out, array)
    return out


class InvalidArgumentError(ValueError, tf.errors.InvalidArgumentError):
    """A bad argument: both the ``ValueError`` ringlet raises and the
    ``tf.errors.InvalidArgumentError`` Horovod's TensorFlow operations raise."""

    def __init__(self, message: str) -> None:
        ValueError.__init__(self, message)
        tf.errors.InvalidArgumentError.__init__(self, None, None, message)

    def __reduce__(self) -> Any:
        return (type(self), (self.message,))


def checked_member(process_set: Any) -> Any:
    """The ringlet set behind ``process_set``, checked now (at the call, or when traced): a
    rank outside it gets Horovod's InvalidArgumentError, before anything runs."""
    chosen = ringlet_set(process_set)
    if chosen is not None and ringlet.rank() not in chosen.ranks:
        raise InvalidArgumentError(
            f"rank {ringlet.rank()} is not in process set {chosen.id} (ranks "
            f"{list(chosen.ranks)}); only its members may call its collectives")
    return chosen


