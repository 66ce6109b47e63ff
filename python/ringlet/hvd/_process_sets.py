"""Horovod's process sets, and the ringlet process set each stands for."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import ringlet

from ._state import state

__all__ = ["ProcessSet", "global_process_set", "is_global", "member_ranks", "ringlet_set",
           "set_by_id", "set_rank", "set_size"]


class ProcessSet:
    """Horovod's process set: ranks (or an mpi4py communicator, at ``init``) that run
    collectives together. Pass it to ``init(process_sets=[...])`` or ``add_process_set``; once
    added, ``process_set_id`` is set, and collectives take it as ``process_set=``."""

    process_set_id: int | None = None
    ranks: list[int] | None = None
    mpi_comm: Any = None

    def __init__(self, ranks_or_comm: Any) -> None:
        if isinstance(ranks_or_comm, Iterable):
            ranks = sorted(ranks_or_comm)
            if any(not isinstance(r, int) for r in ranks):
                raise ValueError("ProcessSet should be initialized with a list of process ranks "
                                 "or an mpi4py Comm object")
            self.ranks = ranks
        else:
            from mpi4py import MPI

            if not isinstance(ranks_or_comm, MPI.Comm):
                raise ValueError("ProcessSet should be initialized with a list of process ranks "
                                 "or an mpi4py Comm object")
            self.mpi_comm = ranks_or_comm
        self._set: ringlet.ProcessSet | None = None

    def _invalidate(self) -> None:
        self.process_set_id, self._set = None, None

    def size(self) -> int | None:
        """Its size, or None before it is added."""
        return None if self.process_set_id is None or self.ranks is None else len(self.ranks)

    def rank(self) -> int | None:
        """This process's rank within it (None before it is added); ValueError if this
        process is not a member, as Horovod."""
        if self.process_set_id is None or self.ranks is None:
            return None
        if ringlet.rank() not in self.ranks:
            raise ValueError("Process is not part of provided process set.")
        return self.ranks.index(ringlet.rank())

    def included(self) -> bool | None:
        """Whether this process is a member (None before its ranks are known)."""
        return None if self.ranks is None else ringlet.rank() in self.ranks

    def __str__(self) -> str:
        return (f"ProcessSet(process_set_id={self.process_set_id}, ranks={self.ranks}, "
                f"mpi_comm={self.mpi_comm})")

    __repr__ = __str__


class _GlobalProcessSet(ProcessSet):
    """Every rank of ringlet's communicator (known once ringlet is initialized)."""

    process_set_id = 0

    @property  # type: ignore[override]
    def ranks(self) -> list[int]:
        return list(range(ringlet.size()))

    @ranks.setter
    def ranks(self, value: Any) -> None:
        pass  # always every rank

    def _invalidate(self) -> None:
        pass  # it stays


global_process_set = _GlobalProcessSet([])


def is_global(process_set: Any) -> bool:
    """Whether a Horovod ``process_set=`` argument names every rank."""
    return process_set is None or process_set is global_process_set or (
        isinstance(process_set, ProcessSet) and process_set.process_set_id == 0)


def ringlet_set(process_set: Any) -> ringlet.ProcessSet | None:
    """The ringlet process set a Horovod ``process_set=`` argument names (None: all ranks; with
    name matching, on the negotiation thread: its own communicator of all ranks)."""
    if is_global(process_set):
        if state.negotiator is not None and state.negotiator.is_negotiation_thread():
            return state.negotiator.comm
        return None
    if not isinstance(process_set, ProcessSet):
        raise ValueError(f"process_set must be an hvd.ProcessSet, got {process_set!r}")
    if process_set.process_set_id == 0:
        return None
    if process_set._set is None:
        raise ValueError(f"{process_set} has not been added (init(process_sets=...) or "
                         "add_process_set), or has been removed")
    return process_set._set


def member_ranks(process_set: Any) -> tuple[int, ...]:
    """The global ranks of ``process_set`` (ValueError if it is not added)."""
    chosen = ringlet_set(process_set)
    return tuple(range(ringlet.size())) if chosen is None else tuple(chosen.ranks)


def set_by_id(set_id: int) -> Any:
    """The Horovod process set with this id (0: the global one)."""
    return global_process_set if set_id == 0 else state.added[set_id]


def set_size(process_set: Any) -> int:
    chosen = ringlet_set(process_set)
    return ringlet.size() if chosen is None else chosen.size


def set_rank(process_set: Any) -> int:
    """This rank's index in ``process_set`` (its global rank for the global set)."""
    chosen = ringlet_set(process_set)
    return ringlet.rank() if chosen is None else int(chosen.rank or 0)


