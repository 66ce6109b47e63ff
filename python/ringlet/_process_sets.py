"""Adding and removing process sets (see ``_membership`` for what they are and how a call
finds its communicator)."""

from __future__ import annotations

import operator
from collections.abc import Iterable
from typing import Any

from . import _core, calibration
from ._collectives import allgather_object
from ._core import MismatchError
from ._membership import ProcessSet
from ._runtime import init, register_thread, size


def _check_ranks(ranks: Any) -> tuple[int, ...]:
    if isinstance(ranks, (str, bytes)) or not isinstance(ranks, Iterable):
        raise TypeError(f"a process set takes a sequence of ranks, got {type(ranks).__name__}")
    try:
        chosen = sorted(operator.index(r) for r in ranks)
    except TypeError:
        raise TypeError(f"a process set's ranks must be ints, got {list(ranks)!r}") from None
    if not chosen:
        raise ValueError("a process set needs at least one rank")
    if len(set(chosen)) != len(chosen):
        raise ValueError(f"a process set's ranks must be distinct, got {chosen}")
    if chosen[0] < 0 or chosen[-1] >= size():
        raise ValueError(f"a process set's ranks must be in 0..{size() - 1}, got {chosen}")
    return tuple(chosen)


def add_process_set(ranks: Iterable[int]) -> ProcessSet:
    """A new process set of ``ranks`` (ranks of ringlet's communicator, in any order), with a
    communicator of its own.

    Collective over ringlet's communicator: every rank calls it with the same ranks, members
    or not, and every rank gets the same ``ProcessSet`` back. Ranks that pass different ranks,
    or bad ones, all raise (``MismatchError`` or the bad rank's ``ValueError``/``TypeError``
    text); no set is added then.
    """
    register_thread()
    init()
    try:
        chosen: tuple[int, ...] | str = _check_ranks(ranks)
    except (TypeError, ValueError) as exc:
        chosen = f"{type(exc).__name__}: {exc}"
    everyone = allgather_object(chosen)
    refusals = [(r, c) for r, c in enumerate(everyone) if isinstance(c, str)]
    if refusals:
        raise ValueError("add_process_set was refused: " + "; ".join(
            f"rank {r}: {why}" for r, why in refusals))
    if any(c != everyone[0] for c in everyone):
        raise MismatchError("ranks disagree on the process set to add: " + ", ".join(
            f"rank {r} passed {list(c)}" for r, c in enumerate(everyone)))
    # Install the model's parameters now, while every rank is here: a set's "auto" uses them.
    calibration.ensure_installed()
    assert not isinstance(chosen, str)
    return ProcessSet(_core.add_process_set(list(chosen)), chosen)


def remove_process_set(process_set: ProcessSet) -> bool:
    """Free ``process_set``'s communicator on this rank (local; call it on every member);
    False if it does not exist (or is ringlet's whole communicator, which stays)."""
    if not isinstance(process_set, ProcessSet):
        raise TypeError(f"remove_process_set takes a ringlet.ProcessSet, got "
                        f"{type(process_set).__name__}")
    return process_set.id != 0 and _core.remove_process_set(process_set.id)


def process_sets() -> list[ProcessSet]:
    """Every process set that exists, ringlet's whole communicator (id 0) first."""
    init()
    return [ProcessSet(row.id, tuple(row.ranks)) for row in _core.process_sets()]
