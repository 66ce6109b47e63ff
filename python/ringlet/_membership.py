"""Process sets: subsets of ringlet's ranks that run collectives among themselves, each on its
own MPI communicator (split from ringlet's), as Horovod's process sets and torch.distributed's
groups do. Adding one is collective over all ranks (``ringlet.add_process_set``); its
collectives involve its members only."""

from __future__ import annotations

from dataclasses import dataclass

from . import _core
from ._runtime import init, rank, size


@dataclass(frozen=True)
class ProcessSet:
    """Ranks of ringlet's communicator (``ranks``, increasing) that run collectives together:
    pass it as ``process_set=`` to any collective, on its members only. Within it, results
    are in the order of ``ranks``, and roots are still named by their rank in ringlet's
    communicator (``ringlet.rank()``), as in Horovod. ``id`` 0 is ringlet's whole
    communicator."""

    id: int
    ranks: tuple[int, ...]

    @property
    def size(self) -> int:
        return len(self.ranks)

    @property
    def included(self) -> bool:
        """Whether this process is a member."""
        return rank() in self.ranks

    @property
    def rank(self) -> int | None:
        """This process's rank within the set (its index in ``ranks``), or None."""
        me = rank()
        return self.ranks.index(me) if me in self.ranks else None


@dataclass(frozen=True)
class Place:
    """Where a call runs: the set's id in the core, this rank within it, and its size."""

    id: int
    rank: int
    size: int
    ranks: tuple[int, ...] | None
    """The set's ranks (None for ringlet's whole communicator)."""

    def local_rank(self, global_rank: int) -> int:
        """``global_rank`` (a rank of ringlet's communicator) within this set."""
        if self.ranks is None:
            return global_rank
        if global_rank not in self.ranks:
            raise ValueError(
                f"root {global_rank} is not in the process set (ranks {list(self.ranks)})")
        return self.ranks.index(global_rank)



def place(process_set: ProcessSet | None) -> Place:
    """The set a collective runs on: ringlet's communicator for None (or id 0), else
    ``process_set``, which this rank must belong to and which must still exist."""
    init()
    if process_set is None:
        return Place(0, rank(), size(), None)
    if not isinstance(process_set, ProcessSet):
        raise TypeError(
            f"process_set must be a ringlet.ProcessSet (from ringlet.add_process_set) or None, "
            f"got {type(process_set).__name__}")
    if process_set.id == 0:
        return Place(0, rank(), size(), None)
    # The core knows which sets exist and this rank's place in them; its error says which
    # rule was broken (not a member, or removed).
    group = _core.group(process_set.id)
    set_rank, set_size = group.rank, group.size
    return Place(process_set.id, set_rank, set_size, process_set.ranks)
