"""Process-level state: MPI initialization, ringlet's communicator, rank, size, hosts."""

from __future__ import annotations

import atexit
import os
import sys
import threading
import warnings
import zlib
from dataclasses import dataclass
from typing import Any

from . import _core

_finalizer_registered = False
_user_comm: Any = None
_thread_level: str | None = None
_owns_mpi = False
_group: tuple[int, int, list[str]] | None = None
"""(rank, size, hosts) of ringlet's communicator, read once per init."""


def _family(description: str) -> str | None:
    """The ABI family of an MPI library from its description ("Open MPI v4.1.4, ...")."""
    if "Open MPI" in description:
        return "Open MPI"
    if any(name in description for name in ("MPICH", "MVAPICH", "Intel(R) MPI")):
        return "MPICH"
    return None


def _check_mpi4py_library() -> None:
    """mpi4py and ringlet must run on one MPI library: a communicator handle of one is garbage
    to the other."""
    mpi = sys.modules.get("mpi4py.MPI")
    if mpi is None:
        return
    theirs = mpi.Get_library_version()
    ours = _core.mpi_library()[0]
    if _family(theirs) and _family(ours) and _family(theirs) != _family(ours):
        raise _core.RingletError(
            f"mpi4py runs on {_family(theirs)} ({theirs.splitlines()[0]}) but ringlet on "
            f"{_family(ours)} ({ours.splitlines()[0]}): build mpi4py against ringlet's MPI, "
            "e.g. MPICC=/path/to/mpicc pip install --no-binary mpi4py --force-reinstall "
            "--no-cache-dir mpi4py"
        )


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
    _check_mpi4py_library()
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

    Raises ``RingletError`` if ringlet was built against another MPI than the one this process
    runs on, or was started by another MPI's launcher.
    """
    global _finalizer_registered, _user_comm, _thread_level, _owns_mpi, _group
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
    _user_comm, _group = comm, _core.group()
    _check_mpi4py_library()
    _warn_without_shared_memory()
    _abort_on_uncaught_exceptions()


_warned_about_shared_memory = False


def _warn_without_shared_memory() -> None:
    """Once per process: say so when the node's shared memory could not be had (not when it is
    off, or the ranks span nodes); the point-to-point algorithms take over."""
    global _warned_about_shared_memory
    available, reason, worth_warning = _core.shared_memory(0)
    if not available and worth_warning and not _warned_about_shared_memory:
        _warned_about_shared_memory = True
        warnings.warn(
            f"ringlet: no shared memory on this node ({reason}); using the point-to-point "
            "algorithms only",
            RuntimeWarning,
            stacklevel=3,
        )


def _abort_on_uncaught_exceptions() -> None:
    """An uncaught exception on one rank would leave the others waiting in their next
    collective forever (and MPI_Finalize at exit can wait for them too): print it, then end
    the whole job, as ``python -m mpi4py`` does. RINGLET_ABORT_ON_EXCEPTION=0 turns it off;
    interactive sessions (IPython, Jupyter) never reach sys.excepthook for cell errors."""
    if getattr(sys.excepthook, "_ringlet", False) or size() <= 1:
        return
    if os.environ.get("RINGLET_ABORT_ON_EXCEPTION", "1") == "0":
        return
    previous = sys.excepthook

    def hook(kind: type[BaseException], value: BaseException, traceback: Any) -> None:
        previous(kind, value, traceback)
        if _core.is_initialized() and size() > 1:
            sys.stderr.write(
                f"ringlet: rank {rank()} stopped on an uncaught {kind.__name__}; ending "
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
    global _user_comm, _group
    _core.shutdown()
    _user_comm, _group = None, None


def _current_group() -> tuple[int, int, list[str]]:
    global _group
    init()
    if _group is None or not _core.is_initialized():
        _group = _core.group()  # ringlet was set up from below this module (the core's own)
    return _group


def rank() -> int:
    """This process's rank in ringlet's communicator."""
    return _current_group()[0]


def size() -> int:
    """The number of ranks in ringlet's communicator."""
    return _current_group()[1]


def thread_level() -> str:
    """The MPI thread level granted: "single", "funneled", "serialized" or "multiple"."""
    init()
    assert _thread_level is not None
    return _thread_level


def owns_mpi() -> bool:
    """Whether ringlet initialized MPI (and so finalizes it at exit)."""
    init()
    return _owns_mpi


def mpi_library() -> str:
    """The MPI library ringlet runs on, as it describes itself (``MPI_Get_library_version``)."""
    return _core.mpi_library()[0]


def settings(*, segment_bytes: int | None = None, max_message_bytes: int | None = None) -> dict:
    """The settings that shape ringlet's traffic on its communicator, after applying any given:
    ``segment_bytes`` (the pipelined ring's segment, default 256 KiB) and ``max_message_bytes``
    (messages above it are split; default and maximum 2^31 - 1, MPI's count limit).

    Every rank must make the same change before its next collective: the settings are part of
    each collective's consistency check, so ranks that differ get ``MismatchError``. A change
    also discards the ``auto`` decision table (it is rebuilt at the next ``auto`` call).
    """
    init()
    for name, value in (("segment_bytes", segment_bytes), ("max_message_bytes", max_message_bytes)):
        if value is not None and (not isinstance(value, int) or value < 1):
            raise ValueError(f"{name} must be a positive int, got {value!r}")
    return _core.settings(segment_bytes, max_message_bytes)


def stats() -> dict[str, dict[str, float]]:
    """Per algorithm, this process's allreduces since start or ``reset_stats()``:
    ``{"ring": {"calls": 3, "bytes": 12582912, "seconds": 0.0041}, ...}``. Fused runs that were
    packed (compressed, or many tiny arrays) add ``"pack"``: the copies in and out, which the
    algorithm's own entry does not count."""
    return {
        name: {"calls": calls, "bytes": nbytes, "seconds": seconds}
        for name, calls, nbytes, seconds in _core.stats()
    }


def reset_stats() -> None:
    _core.reset_stats()


@dataclass(frozen=True)
class Topology:
    """Where the ranks run: ``hosts[r]`` is rank r's host (as MPI names it); this rank is
    ``local_rank`` of the ``local_size`` ranks on its host, which is host ``cross_rank`` of
    ``cross_size`` (hosts ordered by their lowest rank)."""

    hosts: tuple[str, ...]
    local_rank: int
    local_size: int
    cross_rank: int
    cross_size: int


def topology() -> Topology:
    """This rank's place among the hosts (known since ``init``; not collective)."""
    me, _, hosts = _current_group()
    local = [r for r, h in enumerate(hosts) if h == hosts[me]]
    order = list(dict.fromkeys(hosts))  # hosts by first appearance = by lowest rank
    return Topology(
        hosts=tuple(hosts),
        local_rank=local.index(me),
        local_size=len(local),
        cross_rank=order.index(hosts[me]),
        cross_size=len(order),
    )
