"""A collective submitted to name matching, and how its arguments are compared and named."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

__all__ = ["Key", "Request", "describe", "tensor_signature"]

Key = tuple[str, str, tuple[int, ...]]
"""(collective, name, the process set's ranks)."""


_UNREMARKABLE = {("prescale", 1.0), ("postscale", 1.0), ("compression", "none"), ("set", 0)}
"""Settings an error need not mention."""


class Request:
    """One collective submitted on this rank, until it has run.

    ``signature`` is what every member must pass alike (Horovod's checks: dtype, shape, op,
    root, ...; a tuple of (dtype, shape) tensors and (name, value) settings); ``detail`` how
    an error names what this rank passed. ``start`` runs it (on the negotiation thread, once
    every member has submitted it) and returns a handle. Allreduces have none: the negotiator
    fuses them (``run_fused``), from their ``payload``."""

    def __init__(self, collective: str, name: str, signature: tuple[Any, ...],
                 members: tuple[int, ...], start: Callable[[], Any] | None = None,
                 detail: str | None = None) -> None:
        self.key: Key = (collective, name, members)
        self.signature = signature
        self._detail = detail
        self.start = start
        self.payload: Any = None
        """What the caller needs to run it fused (``ringlet.hvd._fusion``'s business)."""
        self._inline: threading.Event | None = None
        self.submitted = time.monotonic()
        self.stall_reported = False
        """Whether the stall inspector has reported it (once per request, as the core's)."""
        self.lone: Any = None
        """The handle of its lone run (``Negotiator.run_alone``) until that run is known to have
        paired up: None once it gave way, and the request was submitted."""
        self.work: Any = None
        self.error: BaseException | None = None
        self.value: Any = None
        self.ran = threading.Event()

    @property
    def detail(self) -> str:
        """How an error names what this rank passed (described when first asked: most
        requests never are)."""
        if self._detail is None:
            self._detail = describe(self.signature)
        return self._detail

    @property
    def inline(self) -> bool:
        """Run by the caller itself, in its turn: the negotiation waits for ``resumed``."""
        return self._inline is not None

    @inline.setter
    def inline(self, value: bool) -> None:
        self._inline = threading.Event() if value else None

    @property
    def resumed(self) -> threading.Event:
        """Set by an inline request's caller once it has run it."""
        if self._inline is None:
            raise AttributeError("only an inline request is resumed")
        return self._inline

    def finish(self, work: Any = None, error: BaseException | None = None,
               value: Any = None) -> None:
        self.work, self.error, self.value = work, error, value
        self.ran.set()


def describe(signature: tuple[Any, ...]) -> str:
    """A signature as an error names it: ``float32[17, 17] op=avg``."""
    parts = [f"{a}[{', '.join(map(str, b))}]" if isinstance(b, tuple) else f"{a}={b}"
             for a, b in signature if (a, b) not in _UNREMARKABLE and a != "fusable"]
    return " ".join(parts) if parts else "nothing"



def tensor_signature(arrays: Sequence[np.ndarray], leading: bool = True) -> tuple[Any, ...]:
    """Each array as (dtype, shape); without its first dimension when ``leading`` is False
    (allgather and alltoall: each rank has its own)."""
    return tuple((_dtype_name(a.dtype), a.shape if leading else ("*", *a.shape[1:]))
                 for a in arrays)


_DTYPE_NAMES: dict[np.dtype, str] = {}


def _dtype_name(dtype: np.dtype) -> str:
    """``str(dtype)``, remembered (NumPy computes it in Python, microseconds a time)."""
    name = _DTYPE_NAMES.get(dtype)
    if name is None:
        name = _DTYPE_NAMES[dtype] = str(dtype)
    return name
