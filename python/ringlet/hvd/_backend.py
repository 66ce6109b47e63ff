"""How each framework's tensors become NumPy arrays and back, and which backend a
tensor has."""

from __future__ import annotations

from typing import Any

import numpy as np

__all__ = ["NUMPY", "Backend", "NumpyBackend", "backend_for", "register_backend"]


class Backend:
    """How a framework's tensors become NumPy arrays (zero-copy where possible) and back."""

    def array(self, tensor: Any) -> np.ndarray:
        """A NumPy view of ``tensor``'s memory (or a copy when no view exists)."""
        raise NotImplementedError

    def tensor(self, array: np.ndarray, like: Any) -> Any:
        """``array`` as the framework's tensor (sharing memory)."""
        raise NotImplementedError

    def assign(self, tensor: Any, array: np.ndarray) -> None:
        """Write ``array``'s values into ``tensor``."""
        raise NotImplementedError

    def dtype(self, tensor: Any) -> Any:
        """The framework's own dtype object of ``tensor``."""
        raise NotImplementedError

    def is_floating(self, tensor: Any) -> bool:
        raise NotImplementedError

    def cast(self, tensor: Any, dtype: Any) -> Any:
        """``tensor`` as ``dtype``: a name ("float16", "bfloat16") or a framework dtype."""
        raise NotImplementedError


class NumpyBackend(Backend):
    def array(self, tensor: Any) -> np.ndarray:
        if not isinstance(tensor, (np.ndarray, np.generic)):
            raise TypeError(f"expected a numpy.ndarray, got {type(tensor).__name__}")
        return np.asarray(tensor)

    def tensor(self, array: np.ndarray, like: Any) -> Any:
        return array

    def assign(self, tensor: Any, array: np.ndarray) -> None:
        if tensor is not array:
            np.copyto(tensor, array)

    def dtype(self, tensor: Any) -> Any:
        return np.asarray(tensor).dtype

    def is_floating(self, tensor: Any) -> bool:
        dtype = np.asarray(tensor).dtype
        return dtype.kind == "f" or dtype.name == "bfloat16"

    def cast(self, tensor: Any, dtype: Any) -> Any:
        if dtype == "bfloat16":
            import ml_dtypes

            dtype = ml_dtypes.bfloat16
        return np.asarray(tensor).astype(dtype)


NUMPY = NumpyBackend()
_backends: dict[type, Backend] = {}


def register_backend(tensor_type: type, backend: Backend) -> None:
    """Teach the API another framework's tensors (``ringlet.hvd.torch`` registers torch's)."""
    _backends[tensor_type] = backend


def backend_for(tensor: Any) -> Backend:
    for tensor_type, backend in _backends.items():
        if isinstance(tensor, tensor_type):
            return backend
    return NUMPY

