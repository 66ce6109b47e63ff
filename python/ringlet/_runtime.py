"""Process-level state: MPI initialization, ringlet's communicator, rank, size, hosts."""

from __future__ import annotations

import atexit
import functools
import os
import sys
import threading
import time
import warnings
import zlib
from dataclasses import dataclass, field
from typing import Any, Literal

from . import _core, _mpi_abi, calibration

_finalizer_registered = False
_user_comm: Any = None
_thread_level: str | None = None
_owns_mpi = False
_group: _core.Group | None = None
"""The rank, size and hosts of ringlet's communicator, read once per init."""


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
            f"{_family(ours)} ({ours.splitlines()[0]}): give both one library. With "
            "ringlet's and mpi4py's wheels, import ringlet first (mpi4py then uses the library "
            "ringlet loaded) or set RINGLET_LIBMPI and MPI4PY_LIBMPI to the same file; with "
            "mpi4py built from source, build it against ringlet's MPI (MPICC=/path/to/mpicc "
            "pip install --no-binary mpi4py --force-reinstall --no-cache-dir mpi4py)"
        )


def _refuse_a_wrong_library() -> None:
    """A wheel's core runs on the library the loader chose: refuse it before MPI_Init when the
    launcher belongs to another MPI (MPI would start every rank as a job of its own)."""
    if _mpi_abi.chosen is not None:
        problem = _mpi_abi.mismatch(_mpi_abi.chosen)
        if problem:
            raise _core.RingletError(problem)


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


# Per thread: whether it registered its key (allreduce's fast path reads it inline).
thread_state = threading.local()


def register_thread() -> None:
    """Key this Python thread's collectives by its name (once per thread): the consistency
    check then tells two threads' calls apart across ranks."""
    if not getattr(thread_state, "registered", False):
        _set_thread_key(zlib.crc32(threading.current_thread().name.encode()))


def _set_thread_key(key: int) -> None:
    _core.set_thread_key(key)
    thread_state.key = key
    thread_state.registered = True


class as_caller:  # lower case: called as a function; a class only to be cheap
    """Count this thread's collectives inside the block (``with ringlet.as_caller(name):``) as
    caller ``name``'s in the consistency check, instead of the thread's own (its name). For
    frameworks that run a program's collectives on pool threads whose names differ between
    ranks (TensorFlow's graph executor): each rank's collectives under one ``name`` still pair
    up in order. Blocks nest: the key in force before the block is restored after it."""

    __slots__ = ("_key", "_previous")

    def __init__(self, name: str) -> None:
        self._key = _caller_key(name)
        self._previous = 0

    def __enter__(self) -> None:
        register_thread()
        self._previous = thread_state.key
        _set_thread_key(self._key)

    def __exit__(self, *exc: object) -> None:
        _set_thread_key(self._previous)


@functools.lru_cache(maxsize=4096)
def _caller_key(name: str) -> int:
    return zlib.crc32(f"caller:{name}".encode())


def make_exclusive(reason: str | None) -> None:
    """From now on refuse (``RingletError``, saying ``reason``) every collective call made on a
    thread that is not let through (``let_through``); None ends it. For a layer that must
    issue every collective of the program itself: ``ringlet.hvd``'s name matching, whose
    negotiation a call of ringlet's own API would meet in a different order on different
    ranks. The refusal is local and sends nothing, so the ranks stay in step."""
    _core.set_exclusive(reason)


class let_through:  # lower case: called as a function; a class only to be cheap
    """Let this thread's collectives through inside the block (``with
    ringlet.let_through():``) while they are exclusive."""

    __slots__ = ("_previous",)

    def __enter__(self) -> None:
        self._previous = _core.let_through(True)

    def __exit__(self, *exc: object) -> None:
        _core.let_through(self._previous)


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
    _refuse_a_wrong_library()
    _skip_the_finalize_fence_under_ulfm()
    if not _finalizer_registered:
        atexit.register(_core.finalize)
        _finalizer_registered = True
    _owns_mpi, _thread_level = _core.init(handle)
    _user_comm, _group = comm, _core.group()
    _check_mpi4py_library()
    _warn_without_shared_memory()
    _abort_on_uncaught_exceptions()
    # Collective, the same on every rank: between nodes, whole messages or pieces, before any
    # call sends one.
    calibration.choose_message_pieces()


def _skip_the_finalize_fence_under_ulfm() -> None:
    """Under Open MPI's ULFM (``mpirun --with-ft ulfm`` exports ``OMPI_MCA_mpi_ft_enable``),
    ask MPI_Init, which ringlet may be about to call, to leave out MPI_Finalize's fence. It
    waits for every process of the job, the dead too, and PRRTE 3.0 sometimes never completes
    it: survivors of a death hung at the end (one run in ten on two loaded cores). ringlet's
    ranks have finished communicating by then; its finalize hears their departures first. A
    user's own setting stands, and MPI started before ringlet keeps what it read."""
    if os.environ.get("OMPI_MCA_mpi_ft_enable", "").lower() in ("1", "t", "true", "enabled",
                                                                "yes", "y"):
        os.environ.setdefault("OMPI_MCA_async_mpi_finalize", "1")


_warned_about_shared_memory = False


def _warn_without_shared_memory() -> None:
    """Once per process: say so when the node's shared memory could not be had (not when it is
    off, or the ranks span nodes); the point-to-point algorithms take over."""
    global _warned_about_shared_memory
    shared = _core.shared_memory(0)
    available, reason, worth_warning = shared.available, shared.reason, shared.worth_warning
    if not available and worth_warning and not _warned_about_shared_memory:
        _warned_about_shared_memory = True
        warnings.warn(
            f"ringlet: no shared memory on this node ({reason}); using the point-to-point "
            "algorithms only",
            RuntimeWarning,
            stacklevel=3,
        )


_ABORT_GRACE = 0.2
"""Seconds between printing why the job ends and MPI_Abort: the launcher forwards a rank's
output on its own time, and the abort can end the job first: MPICH 4.0's Hydra dropped the
message, and its own abort message, in 2 of 15 jobs without this pause, in none of 15 with it."""


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
        if _core.is_initialized() and size() > 1 and not _python_still_runs():
            sys.stderr.write(
                f"ringlet: rank {rank()} stopped on an uncaught {kind.__name__}; ending "
                "the job so that the other ranks do not wait for it forever "
                "(RINGLET_ABORT_ON_EXCEPTION=0 to disable)\n"
            )
            sys.stderr.flush()
            time.sleep(_ABORT_GRACE)
            _core.abort(1)

    hook._ringlet = True  # type: ignore[attr-defined]
    sys.excepthook = hook


def _python_still_runs() -> bool:
    """Whether Python code is running below the hook: then it was called to print an error that
    is handled (a library reporting its callback's exception, as JAX's callbacks may), not by
    the interpreter for an exception that ends the program, which it calls with no frame left."""
    try:
        sys._getframe(2)
    except ValueError:
        return False
    return True


def parent_communicator() -> Any:
    """The mpi4py communicator ringlet's was duplicated from (``init``'s ``comm``), or None
    for MPI_COMM_WORLD (or before ``init``)."""
    return _user_comm


def is_initialized() -> bool:
    """Whether ``ringlet.init()`` has run in this process (and ``shutdown()`` has not)."""
    return _core.is_initialized()


def shutdown() -> None:
    """Free ringlet's communicator, telling the other ranks that this one has left: a rank that
    waits for it in a collective, or calls one later, raises :class:`RingletError` naming it.
    MPI stays up (it cannot be restarted); init() works again (on every rank: it is collective).
    At the end of the program ringlet shuts down the same way."""
    global _user_comm, _group
    _core.shutdown()
    _user_comm, _group = None, None


def _current_group() -> _core.Group:
    global _group
    init()
    if _group is None or not _core.is_initialized():
        _group = _core.group()  # ringlet was set up from below this module (the core's own)
    return _group


def rank() -> int:
    """This process's rank in ringlet's communicator."""
    return _current_group().rank


def size() -> int:
    """The number of ranks in ringlet's communicator."""
    return _current_group().size


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


def settings(*, segment_bytes: int | None = None, max_message_bytes: int | None = None,
             node_major_rings: bool | None = None,
             across_message_bytes: int | Literal["auto"] | None = None) -> dict:
    """The settings that shape ringlet's traffic on its communicator, after applying any given:
    ``segment_bytes`` (the pipelined ring's segment, default 256 KiB), ``max_message_bytes``
    (messages above it are split; default and maximum 2^31 - 1, MPI's count limit),
    ``across_message_bytes`` (messages between ranks on different nodes above it are split;
    default ``"auto"``: what calibration measured fastest, see below) and ``node_major_rings``
    (default True: across nodes the rings visit each node's ranks in a row, whatever the
    placement; False keeps rank order, to measure what that gains).

    Between nodes, calibration times two ranks exchanging both ways at once with whole
    messages and with pieces below the MPI library's eager limit, and keeps pieces where they
    are faster: over Open MPI's TCP transport a rank's rendezvous reply can wait behind its own
    outgoing transfer, so whole messages exchanged both ways take twice as long (see
    ``benchmarks/RESULTS.md``). The returned dict says the limit in force
    (``across_message_bytes``) and whether it is calibration's (``across_message_bytes_auto``),
    and whether each collective is checked with the other ranks first (``consistency_check``:
    ``RINGLET_CHECK``, read at ``init``).

    Every rank must make the same change before its next collective: the settings are part of
    each collective's consistency check, so ranks that differ get ``MismatchError``. A change
    also rebuilds ``auto``'s decision tables at their next call; the calibration stays
    (``ringlet.calibrate()`` measures again).
    """
    init()
    calibrated = across_message_bytes == "auto"
    across = None if calibrated else across_message_bytes
    limits = (("segment_bytes", segment_bytes), ("max_message_bytes", max_message_bytes),
              ("across_message_bytes", across))
    for name, value in limits:
        if value is not None and (isinstance(value, bool) or not isinstance(value, int)
                                  or not 1 <= value <= 2**31 - 1):
            accepted = " or 'auto'" if name == "across_message_bytes" else ""
            raise ValueError(f"{name} must be an int from 1 to 2**31 - 1{accepted}, got {value!r}")
    if node_major_rings is not None and not isinstance(node_major_rings, bool):
        raise ValueError(f"node_major_rings must be True or False, got {node_major_rings!r}")
    return _core.settings(segment_bytes, max_message_bytes, node_major_rings, across,
                          across_message_bytes_auto=calibrated)


def stats() -> dict[str, dict[str, float]]:
    """Per algorithm, this process's allreduces since start or ``reset_stats()``:
    ``{"ring": {"calls": 3, "bytes": 12582912, "seconds": 0.0041}, ...}``. Fused runs that were
    packed (compressed, or many tiny arrays) add ``"pack"``: the copies in and out, which the
    algorithm's own entry does not count."""
    return {
        row.algorithm: {"calls": row.calls, "bytes": row.bytes, "seconds": row.seconds}
        for row in _core.stats()
    }


def reset_stats() -> None:
    """Start ``stats()`` over from zero (this process only)."""
    _core.reset_stats()


@dataclass(frozen=True)
class Topology:
    """Where the ranks run. A node is what the MPI library calls one
    (``MPI_COMM_TYPE_SHARED``: the ranks that can share memory), numbered by its lowest rank;
    ``hosts[r]`` is rank r's host name (as MPI names it) and ``nodes[r]`` its node. This rank
    is ``local_rank`` of the ``local_size`` ranks on its node, which is node ``cross_rank`` of
    ``cross_size``. ``placement`` says how the launcher laid the ranks out: "block" (each
    node's ranks consecutive), "round-robin" (rank r on node r mod H, as many on each) or
    "irregular". ``tiers`` says, per allreduce algorithm, what crosses the nodes' links.

    ``print(ringlet.topology())`` shows all of it."""

    hosts: tuple[str, ...]
    nodes: tuple[int, ...]
    local_rank: int
    local_size: int
    cross_rank: int
    cross_size: int
    placement: str
    tiers: dict[str, str] = field(default_factory=dict, compare=False)

    @property
    def ranks_per_node(self) -> tuple[int, ...]:
        """Ranks on each node, in node order."""
        return tuple(self.nodes.count(n) for n in range(self.cross_size))

    def __str__(self) -> str:
        lines = [
            f"{len(self.nodes)} ranks on {self.cross_size} node(s), placement {self.placement}:"
        ]
        for node in range(self.cross_size):
            ranks = [r for r, n in enumerate(self.nodes) if n == node]
            lines.append(f"  node {node} ({self.hosts[ranks[0]]}): ranks {_ranges(ranks)}")
        lines.append(f"  this rank: local {self.local_rank} of {self.local_size} on node "
                     f"{self.cross_rank}")
        lines.append("  allreduce algorithms, between nodes:")
        width = max((len(a) for a in self.tiers), default=0)
        lines.extend(f"    {a:<{width}}  {what}" for a, what in self.tiers.items())
        return "\n".join(lines)


def _ranges(ranks: list[int]) -> str:
    """[0, 1, 2, 5] -> "0-2, 5"."""
    spans: list[list[int]] = []
    for r in ranks:
        if spans and spans[-1][1] == r - 1:
            spans[-1][1] = r
        else:
            spans.append([r, r])
    return ", ".join(f"{a}-{b}" if b > a else f"{a}" for a, b in spans)


def _placement(nodes: list[int]) -> str:
    count = len(set(nodes))
    members = [[r for r, n in enumerate(nodes) if n == node] for node in range(count)]
    if all(m == list(range(m[0], m[0] + len(m))) for m in members):
        return "block"
    if len({len(m) for m in members}) == 1 and all(n == r % count for r, n in enumerate(nodes)):
        return "round-robin"
    return "irregular"


def _tier(algorithm: str, nodes: list[int], process_set: int) -> str:
    """What `algorithm` sends over each node's link, from its cost model, in multiples of the
    message size m (at 64 MiB, where the bytes dominate)."""
    why = _core.algorithm_unavailable("allreduce", algorithm, process_set)
    if why is not None:
        return f"unavailable: {why}"
    if len(set(nodes)) <= 1:
        return "one node: nothing crosses"
    m = 64 << 20
    cost = _core.algorithm_cost("allreduce", algorithm, nodes, m)
    messages, sent = cost.across_messages, cost.across_bytes
    hosts = len(set(nodes))
    bound = 2 * (hosts - 1) / hosts
    return (f"{sent / m:.2f} m per link in {messages:.0f} messages "
            f"(the bound is {bound:.2f} m)")


def topology(process_set: int = 0) -> Topology:
    """Where the ranks of ringlet's communicator (or of ``process_set``, an id) run: known
    since ``init``; not collective."""
    init()
    group = _core.group(process_set)
    me, hosts = group.rank, group.hosts
    nodes = _core.nodes(process_set)
    local = [r for r, n in enumerate(nodes) if n == nodes[me]]
    return Topology(
        hosts=tuple(hosts),
        nodes=tuple(nodes),
        local_rank=local.index(me),
        local_size=len(local),
        cross_rank=nodes[me],
        cross_size=len(set(nodes)),
        placement=_placement(nodes),
        tiers={a: _tier(a, nodes, process_set) for a in _core.algorithms("allreduce")},
    )
