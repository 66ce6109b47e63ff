"""The Horovod layer's state: one object, ``state``, made once here and used by every
framework's module (``ringlet.hvd``, ``.torch``, ``.tensorflow``, ``.keras``) through the one
``api`` of ``_api``."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from . import _negotiation

__all__ = ["HorovodState", "state"]


class HorovodState:
    """What ``ringlet.hvd`` keeps between calls, for every framework at once."""

    def __init__(self) -> None:
        self.negotiator: _negotiation.Negotiator | None = None
        """Name matching's negotiation (the default; RINGLET_HVD_MATCHING=name), once ``init``
        started it."""
        self.added: dict[int, Any] = {}
        """The process sets (``ProcessSet``) added since ``init``, by id."""
        self.in_flight: dict[tuple[str, str, tuple[int, ...]], Any] = {}
        """Named asynchronous operations that have not finished, by (collective, name, set's
        ranks)."""
        self.unnamed: dict[tuple[str, tuple[int, ...]], int] = {}
        """How many unnamed operations of each collective this rank has submitted on each
        process set (name matching)."""

    def matching_by_name(self) -> bool:
        """Whether ``ringlet.hvd`` matches operations by name now (after ``init``, unless
        RINGLET_HVD_MATCHING=order)."""
        return self.negotiator is not None

    def start_negotiation(self, run_fused: Callable[..., Any]) -> None:
        """Match operations by name from now on (a new negotiation)."""
        self.negotiator = _negotiation.Negotiator(run_fused)

    def stop_negotiation(self) -> None:
        """Stop name matching's negotiation, if it runs (operations that not every rank
        submitted raise on every rank)."""
        if self.negotiator is not None:
            self.negotiator.stop()
            self.negotiator = None

    def forget(self) -> None:
        """A fresh ``init``: process sets, names in flight and automatic names start again."""
        for stale in self.added.values():
            stale._invalidate()
        self.added.clear()
        self.in_flight.clear()
        self.unnamed.clear()


state = HorovodState()
"""The one state of the Horovod layer."""
