"""Horovod's API, written once over a backend that turns tensors into NumPy arrays and back:
the one ``api`` object that ``ringlet.hvd``, ``ringlet.hvd.torch``, ``ringlet.hvd.tensorflow``
and ``ringlet.hvd.keras`` publish.

Names, argument order and semantics follow ``horovod.torch``, process sets and join included;
see the migration guide for the few differences (GPUs, Adasum, elastic).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import ringlet
import ringlet.elastic

from . import _negotiation
from ._collectives import Collectives
from ._fusion import run_fused
from ._handles import collectively, finished_handle, named, signature_settings
from ._process_sets import ProcessSet, global_process_set, ringlet_set
from ._state import state

__all__ = ["Horovod", "api", "start", "use_matching"]


def use_matching(matching: str) -> None:
    """Match ``ringlet.hvd``'s operations by "name" or by "order" from now on, whatever
    RINGLET_HVD_MATCHING says (collective: every rank, between operations). For benchmarks
    that compare the two in one run."""
    if matching not in _negotiation.MATCHINGS:
        raise ValueError(f"matching is 'name' or 'order', got {matching!r}")
    if matching == "name" and state.negotiator is None:
        state.start_negotiation(run_fused)
    elif matching == "order":
        state.stop_negotiation()


def add_set(process_set: ProcessSet, ranks: Sequence[int]) -> ProcessSet:
    """Add ``ranks`` as ``process_set`` (collective over all ranks)."""
    added = collectively("add_process_set", lambda: ringlet.add_process_set(ranks))
    process_set.ranks, process_set._set = list(added.ranks), added
    process_set.process_set_id = added.id
    state.added[added.id] = process_set
    return process_set


def sets_to_add(process_sets: list[ProcessSet]) -> list[tuple[int, ...]]:
    """The ranks of each set that ``init(process_sets=...)`` adds, in order, the same on every
    rank. A set given by an mpi4py communicator (each rank passing its own part, e.g. of a
    ``Split``) stands for every part: its ranks become this rank's part. Collective."""
    parts = [tuple(sorted(ps.mpi_comm.allgather(ringlet.rank()))) if ps.ranks is None else None
             for ps in process_sets]
    everyone = ringlet.allgather_object(parts)
    wanted: list[tuple[int, ...]] = []
    for i, ps in enumerate(process_sets):
        if ps.ranks is not None:
            wanted.append(tuple(ps.ranks))
        else:
            wanted.extend(sorted({theirs[i] for theirs in everyone}))
            ps.ranks = list(parts[i] or ())
    return wanted


def start(comm: Any, process_sets: Any, default_matching: str) -> None:
    """``init``, matching operations by ``default_matching`` where RINGLET_HVD_MATCHING is
    unset (a framework whose collectives only order can match passes "order")."""
    if isinstance(comm, (list, tuple)):
        raise ValueError(
            "init(comm=[ranks]) is not supported; pass an mpi4py communicator "
            "(e.g. MPI.COMM_WORLD.Split(...)), or add a process set of those ranks"
        )
    first_init = not ringlet.is_initialized()
    ringlet.init(comm)
    # Install auto's model now, while every rank is here: later, the first "auto" call
    # would, collectively, and a rank that has joined could not take part.
    ringlet.selector.prepare()
    if first_init:
        state.forget()
    if _negotiation.matching_from_environment(default_matching) == "name" and (
            state.negotiator is None or first_init or state.negotiator.failure is not None):
        state.start_negotiation(run_fused)
    if process_sets is None or process_sets == "dynamic":
        return
    sets = list(process_sets)

    def add() -> None:
        wanted = sets_to_add(sets)
        existing = [added.ranks for added in ringlet.process_sets()]
        repeated = [ranks for i, ranks in enumerate(wanted)
                    if ranks in existing + wanted[:i]]
        if repeated:
            raise ValueError(f"Attempted to add duplicate process sets: {repeated} (every "
                             "rank raises; none was added)")
        added = {ranks: ringlet.add_process_set(ranks) for ranks in wanted}
        for ps in sets:
            chosen = added[tuple(ps.ranks or ())]
            ps.process_set_id, ps._set = chosen.id, chosen
            state.added[chosen.id] = ps

    collectively("init", add)


class _Recovery:
    """What ``ringlet.hvd`` builds on ringlet's communicator, dropped when a rank has died
    and built again on the survivors' (``ringlet.elastic``'s ULFM recovery), as Horovod's
    ``shutdown()`` then ``init()`` at a reset: name matching's negotiation, process sets,
    names in flight."""

    matching_by_name = False

    @classmethod
    def leaving(cls) -> None:
        cls.matching_by_name = state.matching_by_name()
        state.stop_negotiation()
        state.forget()

    @classmethod
    def joined(cls) -> None:
        ringlet.selector.prepare()
        if cls.matching_by_name:
            state.start_negotiation(run_fused)


ringlet.elastic.on_new_membership(_Recovery.leaving, _Recovery.joined)


class Horovod(Collectives):
    """The API; ``ringlet.hvd`` publishes its methods as functions. Each call picks the
    backend from the tensor it is given (NumPy arrays, or torch tensors once
    ``ringlet.hvd.torch`` is imported)."""

    # ---- process ------------------------------------------------------------------------
    @staticmethod
    def init(comm: Any = None, process_sets: Any = None) -> None:
        """Initialize (MPI too, unless mpi4py did); ``comm`` is an mpi4py communicator (or a
        list of ranks of MPI_COMM_WORLD); ``process_sets`` a list of ``ProcessSet`` to add
        (collective), or "dynamic" (sets may always be added later here)."""
        start(comm, process_sets, _negotiation.DEFAULT_MATCHING)

    @staticmethod
    def shutdown() -> None:
        """Shut ringlet down (name matching's negotiation first: operations that not every
        rank submitted raise on every rank)."""
        state.stop_negotiation()
        ringlet.shutdown()

    is_initialized = staticmethod(ringlet.is_initialized)
    rank = staticmethod(ringlet.rank)
    size = staticmethod(ringlet.size)

    @staticmethod
    def local_rank() -> int:
        """This rank's index among the ranks on its host (from ``ringlet.topology()``)."""
        return ringlet.topology().local_rank

    @staticmethod
    def local_size() -> int:
        """How many ranks run on this rank's host."""
        return ringlet.topology().local_size

    @staticmethod
    def cross_rank() -> int:
        """This rank's index among the ranks with the same local rank, one per host."""
        return ringlet.topology().cross_rank

    @staticmethod
    def cross_size() -> int:
        """How many hosts have a rank with this rank's local rank."""
        return ringlet.topology().cross_size

    @staticmethod
    def mpi_threads_supported() -> bool:
        """Whether MPI runs at MPI_THREAD_MULTIPLE."""
        return ringlet.thread_level() == "multiple"

    @staticmethod
    def mpi_enabled() -> bool:
        """True: ringlet runs on MPI."""
        return True

    @staticmethod
    def mpi_built() -> bool:
        """True: ringlet is built on MPI."""
        return True

    @staticmethod
    def gloo_enabled() -> bool:
        """False: ringlet has no Gloo backend."""
        return False

    @staticmethod
    def gloo_built() -> bool:
        """False: ringlet has no Gloo backend."""
        return False

    @staticmethod
    def nccl_built() -> bool:
        """False: ringlet reduces CPU tensors only."""
        return False

    # ringlet is built on MPI alone, for CPU tensors: honest answers for the other backends.
    @staticmethod
    def ddl_built() -> bool:
        """False: ringlet has no DDL backend."""
        return False

    @staticmethod
    def ccl_built() -> bool:
        """False: ringlet has no oneCCL backend."""
        return False

    @staticmethod
    def cuda_built() -> bool:
        """False: ringlet reduces CPU tensors only."""
        return False

    @staticmethod
    def rocm_built() -> bool:
        """False: ringlet reduces CPU tensors only."""
        return False

    @staticmethod
    def is_homogeneous() -> bool:
        """Whether every host runs the same number of ranks."""
        return len(set(ringlet.topology().ranks_per_node)) == 1

    @staticmethod
    def barrier(process_set: Any = global_process_set) -> None:
        """Wait until every rank (of ``process_set``) has called it."""
        if state.negotiator is None:
            ringlet.barrier(ringlet_set(process_set))
            return
        # Matched by name: the negotiation runs it once every member has submitted it, which
        # is all a barrier needs.
        set_id = getattr(process_set, "process_set_id", None) or 0
        named("barrier", f"barrier.{set_id}", lambda: finished_handle(None),
              signature_settings(process_set), process_set, waited_for=True).synchronize()

    @staticmethod
    def join(device: int = -1) -> int:
        """Until every rank has joined, add zeros to the others' allreduces (Sum and Average;
        Average divides by all ranks); returns the rank that joined last."""
        if state.negotiator is None:
            return ringlet.join()
        last = state.negotiator.join()
        # Every rank is here, and nothing is waiting: the automatic names start again, the
        # same on every rank even if some submitted unnamed operations the others did not
        # (a gather that failed while a rank had joined).
        state.unnamed.clear()
        return last

    # ---- process sets -------------------------------------------------------------------
    @staticmethod
    def add_process_set(process_set: Any) -> ProcessSet:
        """Add a process set (collective over all ranks, each passing the same ranks) and
        return it; ValueError if one of the same ranks exists."""
        if not isinstance(process_set, ProcessSet):
            process_set = ProcessSet(process_set)
        if process_set.ranks is None:
            raise NotImplementedError(
                "Dynamically adding process sets defined by an MPI communicator is not "
                "implemented. Please build the process set via a list of ranks.")
        if tuple(process_set.ranks) in [added.ranks for added in ringlet.process_sets()]:
            raise ValueError(f"Attempted to add a duplicate process set: {process_set}")
        return add_set(process_set, process_set.ranks)

    @staticmethod
    def remove_process_set(process_set: ProcessSet) -> bool:
        """Remove an added process set (call it on every rank); False for the global set or
        one that is not added."""
        set_id = process_set.process_set_id
        if set_id in (None, 0) or state.added.get(set_id) is not process_set:
            return False
        removed = process_set._set
        process_set._invalidate()
        del state.added[set_id]
        return removed is not None and ringlet.remove_process_set(removed)

    @staticmethod
    def start_timeline(file_path: str, mark_cycles: bool = False) -> None:
        """Not supported: raises NotImplementedError, which says to use RINGLET_TIMELINE."""
        raise NotImplementedError(
            "Horovod's timeline is not supported; set RINGLET_TIMELINE=1 (a per-step summary) "
            "or RINGLET_TIMELINE=trace.json (a Chrome trace) for DistributedOptimizer")

    @staticmethod
    def stop_timeline() -> None:
        """Not supported: raises NotImplementedError, as ``start_timeline``."""
        Horovod.start_timeline("")


api = Horovod()
"""The one API object: every framework's module publishes (or calls) its methods."""
