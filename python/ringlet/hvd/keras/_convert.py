"""Keras values as NumPy arrays, on every backend. A leaf: it imports nothing of
ringlet's, so the state and callback modules can use it without reaching the
backend adapters (which import ringlet.hvd.tensorflow, which imports them back)."""

from __future__ import annotations

from typing import Any

import keras


def to_numpy(value: Any) -> Any:
    """``keras.ops.convert_to_numpy(value)``. On TensorFlow a variable's value is a
    ``tf.Variable``, whose ``__array__`` takes no ``copy`` keyword, so NumPy 2 warns
    (DeprecationWarning) at every conversion; its own ``numpy()`` converts without one."""
    if keras.backend.backend() == "tensorflow" and hasattr(value, "numpy"):
        return value.numpy()
    return keras.ops.convert_to_numpy(value)
