"""Doorbells: a rank wakes the other ranks' waits (the core's ``runtime/doorbell.rs``)."""

from __future__ import annotations

from . import _core
from ._core import Doorbell
from ._membership import ProcessSet, place
from ._runtime import register_thread


def doorbell(process_set: ProcessSet | None = None) -> Doorbell:
    """A doorbell over the ranks of ``process_set`` (ringlet's communicator for None), for a
    background thread that should take no core and send nothing while idle, yet wake at once
    when any rank has work (``ringlet.hvd``'s negotiation).

    ``ring(value)`` wakes every other member's ``wait(timeout)``, which returns the largest
    value rung since its last wait, or None when another thread of its rank called
    ``interrupt()`` or after ``timeout`` seconds. Not a collective: rings travel on a
    communicator of their own and may be rung and waited for while a collective runs on
    another thread. Opening it is collective over the set's members, and needs
    MPI_THREAD_MULTIPLE (``RingletError`` otherwise); ``close()`` or ``ringlet.shutdown()``
    ends it."""
    register_thread()
    return _core.open_doorbell(place(process_set).id)
