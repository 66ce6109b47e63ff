"""Process-level state: MPI initialization, ringlet's communicator, rank and size."""

from __future__ import annotations

import atexit
import os
import sys
import threading
import zlib
from typing import Any

from . import _core

_finalizer_registered = False
_user_comm: Any = None
_thread_level: str | None = None
_owns_mpi = False
_topology: tuple[int, int, int, int] | None = None


def _mpi4py_comm_handle(comm: Any) -> int:
    try:
        from mpi4py import MPI
    except ImportError as exc:  # pragma: no cover - mpi4py is in the test extras
        raise TypeError(
            "init(comm=...) takes an mpi4py communicator, but mpi4py is not installed "
            "(pip install 'ringlet[mpi4py]')"
        ) from exc
    if isinstance(comm, MPI.Comm) and comm == MPI.COMM_NULL:
        raise ValueError("init(comm=...) was given MPI.COMM_NULL")
    if not isinstance(comm, MPI.Intracomm):
        raise TypeError(
            f"init(comm=...) takes an mpi4py intra-communicator (e.g. MPI.COMM_WORLD or "
            f"the result of Split), got {type(comm).__name__}"
        )
    return int(comm.py2f())


_thread_state = threading.local()


def register_thread() -> None:
    """Key this Python thread's collectives by its name (once per thread): the consistency
    check then tells two threads' calls apart across ranks."""
    if not getattr(_thread_state, "registered", False):
        _core.set_thread_key(zlib.crc32(threading.current_thread().name.encode()))
        _thread_state.registered = True


def init(comm: Any = None) -> None:
    """Initialize ringlet; every other function calls this implicitly.

    Initializes MPI (asking for MPI_THREAD_MULTIPLE) unless something else, such as mpi4py,
    already did, and duplicates ``comm`` (an mpi4py communicator; default MPI_COMM_WORLD) so that
    ringlet's messages never mix with the caller's. Collective over ``comm``. Calling it again
    with no communicator, or the same one, does nothing; MPI is finalized at exit only if ringlet
    initialized it.
    """
    global _finalizer_registered, _user_comm, _thread_level, _owns_mpi, _topology
    register_thread()
    if comm is None:
        if _core.is_initialized():
            return
        handle = None
    else:
        if _core.is_initialized() and comm is _user_comm:
            return
        handle = _mpi4py_comm_handle(comm)
    if not _finalizer_registered:
        atexit.register(_core.finalize)
        _finalizer_registered = True
    _owns_mpi, _thread_level = _core.init(handle)
    _user_comm, _topology = comm, None
    _abort_on_uncaught_exceptions()


def _abort_on_uncaught_exceptions() -> None:
    """An uncaught exception on one rank would leave the others waiting in their next
    collective forever (and MPI_Finalize at exit can wait for them too): print it, then end
    the whole job, as ``python -m mpi4py`` does. RINGLET_ABORT_ON_EXCEPTION=0 turns it off;
    interactive sessions (IPython, Jupyter) never reach sys.excepthook for cell errors."""
    if getattr(sys.excepthook, "_ringlet", False) or _core.size() <= 1:
        return
    if os.environ.get("RINGLET_ABORT_ON_EXCEPTION", "1") == "0":
        return
    previous = sys.excepthook

    def hook(kind: type[BaseException], value: BaseException, traceback: Any) -> None:
        previous(kind, value, traceback)
        if _core.is_initialized() and _core.size() > 1:
            sys.stderr.write(
                f"ringlet: rank {_core.rank()} stopped on an uncaught {kind.__name__}; ending "
                "the job so that the other ranks do not wait for it forever "
                "(RINGLET_ABORT_ON_EXCEPTION=0 to disable)\n"
            )
            sys.stderr.flush()
            _core.abort(1)

    hook._ringlet = True  # type: ignore[attr-defined]
    sys.excepthook = hook


def is_initialized() -> bool:
    return _core.is_initialized()


def shutdown() -> None:
    """Free ringlet's communicator. MPI stays up (it cannot be restarted); init() works again."""
    global _user_comm, _topology
    _core.shutdown()
    _user_comm, _topology = None, None


def rank() -> int:
    """This process's rank in ringlet's communicator."""
    init()
    return _core.rank()


def size() -> int:
    """The number of ranks in ringlet's communicator."""
    init()
    return _core.size()


def barrier() -> None:
    init()
    _core.barrier()


def thread_level() -> str:
    """The MPI thread level granted: "single", "funneled", "serialized" or "multiple"."""
    init()
    assert _thread_level is not None
    return _thread_level


def owns_mpi() -> bool:
    """Whether ringlet initialized MPI (and so finalizes it at exit)."""
    init()
    return _owns_mpi


def stats() -> dict[str, dict[str, float]]:
    """Per algorithm, this process's allreduces since start or ``reset_stats()``:
    ``{"ring": {"calls": 3, "bytes": 12582912, "seconds": 0.0041}, ...}``."""
    return {
        name: {"calls": calls, "bytes": nbytes, "seconds": seconds}
        for name, calls, nbytes, seconds in _core.stats()
    }


def reset_stats() -> None:
    _core.reset_stats()


def topology() -> tuple[int, int, int, int]:
    """(local_rank, local_size, cross_rank, cross_size): this rank among the ranks on its host,
    and its host among the hosts (ordered by their lowest rank). Collective the first time."""
    global _topology
    init()
    if _topology is None:
        import platform

        from .selector import _allgather_text

        _core.set_stats_enabled(False)
        try:
            hosts = _allgather_text(platform.node())
        finally:
            _core.set_stats_enabled(True)
        me = hosts[_core.rank()]
        local = [r for r, h in enumerate(hosts) if h == me]
        order = list(dict.fromkeys(hosts))  # hosts by first appearance = by lowest rank
        _topology = (local.index(_core.rank()), len(local), order.index(me), len(order))
    return _topology
