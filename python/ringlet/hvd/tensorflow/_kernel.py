"""The compiled graph operation for allreduce (``_kernel.cc``): built on first use against the
TensorFlow that runs it, cached, and loaded; ``None`` where it cannot be, and the graph then
uses ``tf.numpy_function`` (with one warning that says why).

``tf.numpy_function`` converts every input and result (docs/guide/tensorflow.md has what that
costs); this operation hands Python the tensors' memory and keeps its results from step to
step. ``RINGLET_TF_KERNEL=0`` turns it off.
"""

from __future__ import annotations

import ctypes
import fcntl
import hashlib
import itertools
import os
import subprocess
import tempfile
import threading
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import tensorflow as tf

__all__ = ["DTYPES", "allreduce_op", "register"]

SOURCE = Path(__file__).with_name("_kernel.cc")

DTYPES = frozenset({tf.float16, tf.bfloat16, tf.float32, tf.float64, tf.int8, tf.int16,
                    tf.int32, tf.int64, tf.uint8, tf.uint16, tf.uint32, tf.uint64, tf.bool})
"""The dtypes the operation takes (its ``T`` attribute's list)."""

Compute = Callable[[list[np.ndarray], list[np.ndarray]], None]
"""Reduce the arrays into the results (the same arrays when in place)."""

_DISPATCHER = ctypes.CFUNCTYPE(
    ctypes.c_int32, ctypes.c_int64, ctypes.c_int32, ctypes.POINTER(ctypes.c_void_p),
    ctypes.POINTER(ctypes.c_void_p), ctypes.POINTER(ctypes.c_int64),
    ctypes.POINTER(ctypes.c_int32), ctypes.c_void_p, ctypes.c_int32)

# TensorFlow's status codes (absl::StatusCode), as tf.numpy_function maps Python's exceptions.
_INVALID_ARGUMENT, _UNKNOWN = 3, 2

_callbacks: dict[int, tuple[Compute, list[np.dtype]]] = {}
"""Each traced operation's computation, by its ``callback`` attribute. Kept for the process's
life, as ``tf.numpy_function``'s are kept for their graph's: a few closures per trace."""
_next_callback = itertools.count(1)
_operation: Any = None
"""The operation as loaded in this process. TensorFlow registers an operation once per process,
and a second library that registers it again (another build) adds nothing: loaded once, kept."""
_use_operation: bool | None = None
"""Whether graphs use the operation: ``None`` until the first graph decides (built and loaded,
or the fallback)."""
_decision_lock = threading.Lock()


@tf.autograph.experimental.do_not_convert
def register(compute: Compute, dtypes: Sequence[tf.DType]) -> int:
    """The ``callback`` attribute under which the operation runs ``compute``."""
    callback = next(_next_callback)
    _callbacks[callback] = (compute, [np.dtype(d.as_numpy_dtype) for d in dtypes])
    return callback


@tf.autograph.experimental.do_not_convert  # called while tracing: AutoGraph leaves it alone
def allreduce_op() -> Callable[..., Any] | None:
    """The operation's Python wrapper (``inputs``, ``callback``, ``name``), or ``None``
    (turned off, or it could not be built here: then once a warning that says why)."""
    global _use_operation
    if _use_operation is None:
        with _decision_lock:
            if _use_operation is None:
                _use_operation = _build_and_load() if _turned_on() else False
    return _operation if _use_operation else None


def _turned_on() -> bool:
    return os.environ.get("RINGLET_TF_KERNEL", "1") != "0"


def _build_and_load() -> bool:
    """Whether the operation is loaded; if it cannot be, a warning that says why."""
    global _operation
    try:
        path = library_path()
        if not path.exists():
            _build(path)
        if _operation is None:
            module = tf.load_op_library(str(path))
            # The same library (dlopen returns the loaded one): install Python's side of the op.
            ctypes.CDLL(str(path)).ringlet_set_dispatcher(_dispatcher)
            _operation = module.ringlet_allreduce
    except Exception as error:  # any failure means the fallback
        warnings.warn(
            f"ringlet could not build its TensorFlow allreduce operation ({error}); graphs use "
            "tf.numpy_function instead, which costs more per tensor (RINGLET_TF_KERNEL=0 "
            "chooses this without trying)", RuntimeWarning, stacklevel=4)
        return False
    return True


def library_path() -> Path:
    """Where this TensorFlow's build of the operation is cached: keyed by the source and
    everything it is compiled against."""
    key = hashlib.sha256()
    key.update(SOURCE.read_bytes())
    for part in (tf.__version__, *tf.sysconfig.get_compile_flags(),
                 *tf.sysconfig.get_link_flags()):
        key.update(part.encode() + b"\0")
    # The user's cache (XDG), not RINGLET_CACHE_DIR: a build depends on the software alone, and
    # test runs that keep their calibrations apart need not build it again.
    base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    directory = base / "ringlet" / "tf-kernel" / key.hexdigest()[:20]
    return directory / "ringlet_allreduce.so"


def _build(path: Path) -> None:
    """Compile the operation into ``path``, once per machine: under a lock that other
    processes (this job's other ranks) wait on, into a temporary file renamed at the end."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path.parent / "build.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if path.exists():
            return
        compiler = os.environ.get("CXX", "c++")
        with tempfile.NamedTemporaryFile(dir=path.parent, suffix=".so", delete=False) as out:
            partial = Path(out.name)
        command = [compiler, "-shared", "-fPIC", "-O2", "-Wno-deprecated-declarations",
                   str(SOURCE), "-o", str(partial), *tf.sysconfig.get_compile_flags(),
                   *tf.sysconfig.get_link_flags()]
        try:
            done = subprocess.run(command, capture_output=True, text=True, check=False)
        except OSError as error:
            partial.unlink(missing_ok=True)
            raise RuntimeError(f"no C++ compiler ({compiler}: {error.strerror}; set CXX, or "
                               "install g++)") from error
        if done.returncode != 0:
            partial.unlink(missing_ok=True)
            tail = "\n".join(done.stderr.strip().splitlines()[-5:])
            raise RuntimeError(f"{compiler} failed: {tail}")
        os.replace(partial, path)


def _status(error: BaseException) -> tuple[int, str]:
    """TensorFlow's code for ``error``, as ``tf.numpy_function`` chooses it."""
    if isinstance(error, tf.errors.OpError):
        return int(error.error_code), error.message
    if isinstance(error, (ValueError, TypeError)):
        return _INVALID_ARGUMENT, str(error)
    return _UNKNOWN, f"{type(error).__name__}: {error}"


class _Memory:
    """Memory TensorFlow owns, described for NumPy (``np.asarray`` of it is a view: 1 us,
    against 7 us through a ctypes array)."""

    __slots__ = ("__array_interface__",)

    def __init__(self, address: int, shape: tuple[int, ...], typestr: str,
                 writeable: bool) -> None:
        self.__array_interface__ = {"data": (address, not writeable), "shape": shape,
                                    "typestr": typestr, "version": 3}


def _array(address: int, shape: tuple[int, ...], dtype: np.dtype, writeable: bool) -> np.ndarray:
    if not address:  # an empty tensor may have no memory
        return np.empty(shape, dtype)
    array = np.asarray(_Memory(address, shape, dtype.str, writeable))
    return array if array.dtype == dtype else array.view(dtype)  # bfloat16's typestr is "<V2"


@_DISPATCHER
def _dispatcher(callback: int, count: int, inputs: Any, outputs: Any, dims: Any, ranks: Any,
                message: int, message_size: int) -> int:
    """Called by the operation on TensorFlow's thread (ctypes takes the GIL): never lets an
    exception out, which ctypes would print and turn into success."""
    try:
        compute, dtypes = _callbacks[callback]
        ranks = ranks[:count]  # slices of the C arrays: one call each, not one per element
        dims = dims[:sum(ranks)] if any(ranks) else []
        arrays, results = [], []
        offset = 0
        for source, result, rank, dtype in zip(inputs[:count], outputs[:count], ranks, dtypes):
            shape = tuple(dims[offset:offset + rank])
            offset += rank
            in_place = source == result
            arrays.append(_array(source or 0, shape, dtype, in_place))
            results.append(arrays[-1] if in_place else _array(result or 0, shape, dtype, True))
        compute(arrays, results)
        return 0
    except BaseException as error:  # every error becomes the status
        code, text = _status(error)
        encoded = text.encode("utf-8", "replace")[:max(message_size - 1, 0)]
        ctypes.memmove(message, encoded + b"\0", len(encoded) + 1)
        return code
