"""Going on without a rank that died, in the same job: MPI's fault tolerance (ULFM), which Open
MPI 5 builds in and turns on under ``mpirun --with-ft ulfm``.

When a rank dies, the core revokes ringlet's communicator, so that every survivor's collective
raises ``ProcessFailedError`` (the waits look every 50 ms, in shared memory too). The survivors
then shrink the communicator ringlet was made from (``MPI_Comm_shrink``: the survivors, the same
on all of them), set ringlet up again on it (its own duplicate, shared memory and the cost
model, for the new membership; process sets of the old one are gone), and ``elastic.run``
restores the last commit. The dead rank's shared-memory segment belongs to the old
communicator, which nothing uses again.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

import ringlet
from ringlet import _runtime

__all__ = ["FT_ENABLED", "Membership", "active", "is_process_failure", "on_new_membership"]

FT_ENABLED = os.environ.get("OMPI_MCA_mpi_ft_enable", "").lower() in {"1", "true", "yes"}
"""Whether the launcher turned Open MPI's fault tolerance on (``--with-ft ulfm`` sets this)."""


def active() -> bool:
    """Whether survivors shrink and go on in this process (else a lost rank ends the job, or
    the elastic driver restarts it). RINGLET_ELASTIC_MECHANISM chooses: "ulfm", "restart", or
    "auto" (the default): ULFM when MPI's fault tolerance is on."""
    mechanism = os.environ.get("RINGLET_ELASTIC_MECHANISM", "auto")
    if mechanism not in {"auto", "ulfm", "restart"}:
        raise ValueError(f"RINGLET_ELASTIC_MECHANISM={mechanism!r}: use auto, ulfm or restart")
    if mechanism == "ulfm" and not FT_ENABLED:
        raise RuntimeError(
            "RINGLET_ELASTIC_MECHANISM=ulfm, but MPI's fault tolerance is off: start the job "
            "with Open MPI 5's `mpirun --with-ft ulfm`, or set the mechanism to restart")
    return FT_ENABLED and mechanism != "restart"


_hooks: list[tuple[Callable[[], Any], Callable[[], Any]]] = []


def on_new_membership(leaving: Callable[[], Any], joined: Callable[[], Any]) -> None:
    """Have a layer above (``ringlet.hvd``) drop what it built on the old communicator
    (``leaving``) and build it again on the new one (``joined``), at each recovery."""
    _hooks.append((leaving, joined))


def is_process_failure(error: BaseException) -> bool:
    """Whether ``error`` means that a rank died: ringlet's ``ProcessFailedError``; an error a
    layer above made of it (its text is MPI's); or a framework's own error type carrying it
    as text, as TensorFlow's ``UnknownError`` does for an exception raised in a graph
    operation (Horovod's TensorFlow ``run`` reads the text the same way)."""
    if isinstance(error, ringlet.ProcessFailedError):
        return True
    text = str(error)
    if isinstance(error, ringlet.RingletError):
        return "PROC_FAILED" in text or "REVOKED" in text
    return f"{ringlet.ProcessFailedError.__name__}: " in text  # as a traceback names it


class Membership:
    """The communicator ringlet was made from (``init``'s, or MPI_COMM_WORLD), then each
    shrunk one."""

    def __init__(self) -> None:
        self._parent: Any = None
        self.recoveries = 0

    def _current(self) -> Any:
        from mpi4py import MPI

        if self._parent is None:
            self._parent = _runtime.parent_communicator() or MPI.COMM_WORLD
            # Shrinking and agreeing report failures as errors, not by aborting the job.
            self._parent.Set_errhandler(MPI.ERRORS_RETURN)
        return self._parent

    def recover(self) -> None:
        """Collective over the survivors: shrink, then set ringlet (and the layers above) up
        again on the ranks that are left."""
        for leaving, _ in _hooks:
            leaving()
        survivors = self._current().Shrink()
        survivors.Set_errhandler(_errors_return())
        ringlet.init(comm=survivors)
        self._parent = survivors
        self.recoveries += 1
        for _, joined in _hooks:
            joined()

    def agree(self) -> None:
        """Raise ``ProcessFailedError`` on every survivor alike if a rank has died; return on
        every rank alike if not (``MPI_Comm_agree``): so that no rank leaves ``run`` while the
        others recover without it."""
        from mpi4py import MPI

        try:
            self._current().Agree(1)
        except MPI.Exception as error:
            raise ringlet.ProcessFailedError(f"MPI_Comm_agree failed: {error}") from error


def _errors_return() -> Any:
    from mpi4py import MPI

    return MPI.ERRORS_RETURN
