"""Horovod's API, written once over a backend that turns tensors into NumPy arrays and back.

``ringlet.hvd`` binds it to NumPy arrays, ``ringlet.hvd.torch`` to PyTorch CPU tensors. Names,
argument order and semantics follow ``horovod.torch``, process sets and join included; see the
README's migration table for the few differences (GPUs, Adasum, elastic, operations matched by
order rather than by name).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from enum import IntEnum
from typing import Any

import numpy as np

import ringlet

from . import _negotiation
from ._negotiation import Request, describe, tensor_signature


class ReduceOp(IntEnum):
    """Horovod's reduction operations (``hvd.Average``, ``hvd.Sum``, ``hvd.Min``, ...)."""

    Average = 0
    Sum = 1
    Adasum = 2
    Min = 3
    Max = 4
    Product = 5


Average, Sum, Adasum = ReduceOp.Average, ReduceOp.Sum, ReduceOp.Adasum
Min, Max, Product = ReduceOp.Min, ReduceOp.Max, ReduceOp.Product
_OP_NAMES = {Average: "avg", Sum: "sum", Min: "min", Max: "max", Product: "prod"}
_OPS = {name: op for op, name in _OP_NAMES.items()}
"""ringlet's op names back to Horovod's ops."""

HorovodInternalError = ringlet.RingletError
"""What Horovod raises when a collective fails; here it is ringlet's own error."""


class Compressor:
    """Horovod's compressor interface: ``compress(tensor) -> (tensor, ctx)`` and
    ``decompress(tensor, ctx)``. Given to a collective, the built-in ones compress inside
    ringlet's core instead (one cast while packing, float32 accumulation); their methods do
    what Horovod's do, for code that calls them itself."""

    wire_dtype: str | None = None

    @staticmethod
    def compress(tensor: Any) -> tuple[Any, Any]:
        return tensor, None

    @staticmethod
    def decompress(tensor: Any, ctx: Any) -> Any:
        return tensor


class NoneCompressor(Compressor):
    wire_dtype = None


class _CastCompressor(Compressor):
    """Floating-point tensors cast to ``wire_dtype`` and back; other tensors untouched."""

    @classmethod
    def compress(cls, tensor: Any) -> tuple[Any, Any]:
        backend = backend_for(tensor)
        original = backend.dtype(tensor)
        if backend.is_floating(tensor):
            return backend.cast(tensor, _WIRE_NAMES[cls.wire_dtype]), original
        return tensor, original

    @staticmethod
    def decompress(tensor: Any, ctx: Any) -> Any:
        backend = backend_for(tensor)
        if ctx is None or backend.dtype(tensor) == ctx:
            return tensor
        return backend.cast(tensor, ctx)


class FP16Compressor(_CastCompressor):
    """Send floating-point data as float16; reduced with float32 accumulation, cast back."""

    wire_dtype = "fp16"


class BF16Compressor(_CastCompressor):
    """Send floating-point data as bfloat16 (float32's range; what Horovod cannot do over MPI)."""

    wire_dtype = "bf16"


_WIRE_NAMES = {"fp16": "float16", "bf16": "bfloat16"}


class Compression:
    """Horovod's gradient compressors: ``none``, ``fp16`` and ``bf16`` (16-bit on the wire)."""

    none = NoneCompressor
    fp16 = FP16Compressor
    bf16 = BF16Compressor


_BUILT_IN_COMPRESSORS = (NoneCompressor, FP16Compressor, BF16Compressor)


def _wire_name(compressor: Any) -> str:
    """How a negotiation signature names a built-in compressor (None: no compression)."""
    return getattr(compressor, "wire_dtype", None) or "none"


_COMPRESSOR_BY_WIRE = {_wire_name(c): c for c in _BUILT_IN_COMPRESSORS}
"""A built-in compressor by the name a negotiation signature gives it."""


def _op_name(average: bool | None, op: Any, default: ReduceOp = Average) -> str:
    if average is not None and op is not None:
        raise ValueError("The op parameter supersedes average. Please provide only one of them.")
    if average is not None:
        op = Average if average else Sum
    op = default if op is None else op
    if op == Adasum:
        raise NotImplementedError("Adasum is not supported by ringlet; use Average or Sum")
    try:
        return _OP_NAMES[ReduceOp(op)]
    except (ValueError, KeyError):
        raise ValueError(f"unknown op {op!r}; accepted: Average, Sum, Min, Max, Product") from None


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

_added: dict[int, ProcessSet] = {}
"""The process sets added since ``init``, by id."""


_negotiator: _negotiation.Negotiator | None = None
"""Name matching's negotiation (RINGLET_HVD_MATCHING=name), once ``init`` has started it."""


def matching_by_name() -> bool:
    """Whether ``ringlet.hvd`` matches operations by name now (RINGLET_HVD_MATCHING=name,
    after ``init``)."""
    return _negotiator is not None


def use_matching(matching: str) -> None:
    """Match ``ringlet.hvd``'s operations by "name" or by "order" from now on, whatever
    RINGLET_HVD_MATCHING says (collective: every rank, between operations). For benchmarks
    that compare the two in one run."""
    global _negotiator
    if matching not in _negotiation.MATCHINGS:
        raise ValueError(f"matching is 'name' or 'order', got {matching!r}")
    if matching == "name" and _negotiator is None:
        _negotiator = _negotiation.Negotiator(_run_fused)
    elif matching == "order" and _negotiator is not None:
        _negotiator.stop()
        _negotiator = None


def _ringlet_set(process_set: Any) -> ringlet.ProcessSet | None:
    """The ringlet process set a Horovod ``process_set=`` argument names (None: all ranks; with
    name matching, on the negotiation thread: its own communicator of all ranks)."""
    if process_set is None or process_set is global_process_set or (
            isinstance(process_set, ProcessSet) and process_set.process_set_id == 0):
        if _negotiator is not None and _negotiator.is_negotiation_thread():
            return _negotiator.comm
        return None
    if not isinstance(process_set, ProcessSet):
        raise ValueError(f"process_set must be an hvd.ProcessSet, got {process_set!r}")
    if process_set.process_set_id == 0:
        return None
    if process_set._set is None:
        raise ValueError(f"{process_set} has not been added (init(process_sets=...) or "
                         "add_process_set), or has been removed")
    return process_set._set


def _members(process_set: Any) -> tuple[int, ...]:
    """The global ranks of ``process_set`` (ValueError if it is not added)."""
    chosen = _ringlet_set(process_set)
    return tuple(range(ringlet.size())) if chosen is None else tuple(chosen.ranks)


def _set_named(set_id: int) -> Any:
    """The Horovod process set with this id (0: the global one)."""
    return global_process_set if set_id == 0 else _added[set_id]


def _set_size(process_set: Any) -> int:
    chosen = _ringlet_set(process_set)
    return ringlet.size() if chosen is None else chosen.size


def _set_rank(process_set: Any) -> int:
    """This rank's index in ``process_set`` (its global rank for the global set)."""
    chosen = _ringlet_set(process_set)
    return ringlet.rank() if chosen is None else int(chosen.rank or 0)


def _collectively(what: str, run: Callable[[], Any], process_set: Any = None) -> Any:
    """``run()``, a collective over every rank (of ``process_set``) that is not one of
    Horovod's (adding a process set, ...). With name matching it runs on the negotiation
    thread, in its turn: ringlet runs one collective at a time in a process, so a collective
    of the caller's thread could otherwise meet the negotiation's in another order on another
    rank, and both would wait."""
    if _negotiator is None:
        return run()
    # It runs on this thread (ringlet's process sets are made on the thread that asks), when
    # the negotiation reaches it, which then waits until it has run.
    handle = _named(what, None, lambda: _done(None), process_set=process_set, inline=True)
    assert isinstance(handle, _Negotiated)
    try:
        handle.synchronize()
        return run()
    finally:
        handle.request.resumed.set()


def _add(process_set: ProcessSet, ranks: Sequence[int]) -> ProcessSet:
    """Add ``ranks`` as ``process_set`` (collective over all ranks)."""
    added = _collectively("add_process_set", lambda: ringlet.add_process_set(ranks))
    process_set.ranks, process_set._set = list(added.ranks), added
    process_set.process_set_id = added.id
    _added[added.id] = process_set
    return process_set


def _sets_to_add(process_sets: list[ProcessSet]) -> list[tuple[int, ...]]:
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


class Backend:
    """How a framework's tensors become NumPy arrays (zero-copy where possible) and back."""

    def array(self, tensor: Any) -> np.ndarray:
        """A NumPy view of ``tensor``'s memory (or a copy when no view exists)."""
        raise NotImplementedError

    def tensor(self, array: np.ndarray, like: Any) -> Any:
        """``array`` as the framework's tensor (sharing memory)."""
        raise NotImplementedError

    def assign(self, tensor: Any, array: np.ndarray) -> None:
        """Write ``array``'s values into ``tensor``."""
        raise NotImplementedError

    def dtype(self, tensor: Any) -> Any:
        """The framework's own dtype object of ``tensor``."""
        raise NotImplementedError

    def is_floating(self, tensor: Any) -> bool:
        raise NotImplementedError

    def cast(self, tensor: Any, dtype: Any) -> Any:
        """``tensor`` as ``dtype``: a name ("float16", "bfloat16") or a framework dtype."""
        raise NotImplementedError


class NumpyBackend(Backend):
    def array(self, tensor: Any) -> np.ndarray:
        if not isinstance(tensor, (np.ndarray, np.generic)):
            raise TypeError(f"expected a numpy.ndarray, got {type(tensor).__name__}")
        return np.asarray(tensor)

    def tensor(self, array: np.ndarray, like: Any) -> Any:
        return array

    def assign(self, tensor: Any, array: np.ndarray) -> None:
        if tensor is not array:
            np.copyto(tensor, array)

    def dtype(self, tensor: Any) -> Any:
        return np.asarray(tensor).dtype

    def is_floating(self, tensor: Any) -> bool:
        dtype = np.asarray(tensor).dtype
        return dtype.kind == "f" or dtype.name == "bfloat16"

    def cast(self, tensor: Any, dtype: Any) -> Any:
        if dtype == "bfloat16":
            import ml_dtypes

            dtype = ml_dtypes.bfloat16
        return np.asarray(tensor).astype(dtype)


class _HandleSet:
    """Horovod handles: opaque objects that ``synchronize`` and ``poll`` take."""

    def __init__(self, work: Any, finish: Callable[[], Any]) -> None:
        self.work, self.finish, self.result, self.finished = work, finish, None, False

    def poll(self) -> bool:
        return self.finished or self.work.done()

    def synchronize(self) -> Any:
        if not self.finished:
            self.work.wait()
            self.result, self.finished = self.finish(), True
        return self.result

    def timing(self) -> tuple[float, float] | None:
        """As ``ringlet.Handle.timing``, for the collectives behind this handle."""
        timing = getattr(self.work, "timing", None)
        return timing() if timing is not None else None

    # So that handles can wrap handles.
    done, wait = poll, synchronize


class _Negotiated(_HandleSet):
    """The handle of an operation matched by name: it finishes once the negotiation has run it
    (every member submitted it) and its collective has finished."""

    def __init__(self, negotiator: _negotiation.Negotiator, request: Request) -> None:
        super().__init__(None, lambda: None)
        self.negotiator, self.request = negotiator, request

    def poll(self) -> bool:
        request = self.request
        return self.finished or (request.ran.is_set() and (
            request.work is None or request.work.poll()))

    def synchronize(self) -> Any:
        if not self.finished:
            value = self.negotiator.wait(self.request)
            work = self.request.work
            self.result = work.synchronize() if work is not None else value
            self.finished = True
        return self.result

    def timing(self) -> tuple[float, float] | None:
        work = self.request.work
        return work.timing() if work is not None else None

    done, wait = poll, synchronize


_in_flight: dict[tuple[str, str, tuple[int, ...]], _HandleSet] = {}
"""Named asynchronous operations that have not finished, by (collective, name, set's ranks)."""
_unnamed: dict[tuple[str, tuple[int, ...]], int] = {}
"""How many unnamed operations of each collective this rank has submitted on each process set
(name matching)."""


def _named(collective: str, name: Any, start: Callable[[], _HandleSet],
           signature: tuple[Any, ...] = (), process_set: Any = None,
           payload: Any = None, detail: str | None = None, inline: bool = False) -> _HandleSet:
    """``start()`` the operation, unless one of the same collective and ``name`` is still in
    flight on this rank: then ValueError (Horovod's words) before anything is sent.

    With name matching, the operation is submitted to the negotiation instead, under its name
    (unnamed: Horovod's "<collective>.noname.<n>"): ``signature`` is what every rank must pass
    alike (``detail``: what this rank passed, as an error names it); an allreduce's
    ``payload`` lets it be fused with others (``start`` is then unused); an ``inline`` one is
    run by the caller when its turn comes (``_collectively``).
    """
    if name is None and _negotiator is None:
        return start()
    members = _members(process_set)
    # Names are per process set, as Horovod's (a controller per set).
    key = None if name is None else (collective, str(name), members)
    earlier = _in_flight.get(key) if key is not None else None
    if earlier is not None and not earlier.poll():
        raise ValueError(
            f"Requested to {collective} a tensor with the same name as another tensor that is "
            "currently being processed.  If you want to request another tensor, use a "
            "different tensor name.")
    if _negotiator is None:
        handle = start()
    else:
        if ringlet.rank() not in members:
            raise ValueError(f"rank {ringlet.rank()} is not in {process_set}: only its members "
                             f"may call {collective} on it")
        if name is None:
            count = _unnamed[collective, members] = _unnamed.get((collective, members), 0) + 1
            name = f"{collective}.noname.{count}"
        request = Request(collective, str(name), signature, members,
                          None if payload is not None else start, detail)
        request.payload, request.inline = payload, inline
        _negotiator.submit(request)
        handle = _Negotiated(_negotiator, request)
    if key is not None:
        _in_flight[key] = handle
    return handle


def _settings(process_set: Any, **settings: Any) -> tuple[tuple[str, Any], ...]:
    """A signature's settings, with the process set's id."""
    set_id = getattr(process_set, "process_set_id", None) or 0
    return (*settings.items(), ("set", set_id))


def _dtype_named(name: str) -> np.dtype:
    try:
        return np.dtype(name)
    except TypeError:
        import ml_dtypes

        return np.dtype(getattr(ml_dtypes, name))


def _run_fused(requests: list[Request | None],
               signatures: list[tuple[Any, ...]]) -> list[_HandleSet]:
    """Allreduces matched by name, fused into one collective (ringlet's grouped allreduce) on
    the negotiation thread: this rank's tensors, or zeros where it has joined."""
    settings = dict(item for item in signatures[0] if not isinstance(item[1], tuple))
    process_set = _set_named(settings["set"])
    compression = _COMPRESSOR_BY_WIRE[settings["compression"]]
    originals: list[np.ndarray] = []
    in_place: list[bool] = []
    spans = []
    for request, signature in zip(requests, signatures):
        start = len(originals)
        if request is None:
            zeros = [np.zeros(shape, _dtype_named(dtype)) for dtype, shape in signature
                     if isinstance(shape, tuple)]
            originals += zeros
            in_place += [True] * len(zeros)
        else:
            _, _, arrays, place, _ = request.payload
            originals += arrays
            in_place += [place] * len(arrays)
        spans.append((start, len(originals)))
    handle, finish = _reduce_arrays(originals, in_place, settings["op"], compression,
                                    settings["prescale"], settings["postscale"], process_set)
    results: list[list[np.ndarray]] = []

    def all_results() -> list[np.ndarray]:
        if not results:
            results.append(finish())
        return results[0]

    handles = []
    for request, (start, end) in zip(requests, spans):
        if request is None:
            handles.append(_HandleSet(handle, lambda: None))
            continue
        backend, tensors, _, place, single = request.payload

        def one(backend: Backend = backend, tensors: list[Any] = tensors, place: bool = place,
                single: bool = single, start: int = start, end: int = end) -> Any:
            out = _finished(backend, tensors, all_results()[start:end], place)
            return out[0] if single else out

        handles.append(_HandleSet(handle, one))
    return handles


def _reduce_arrays(originals: list[np.ndarray], in_place: list[bool], op_name: str,
                   compression: Any, prescale: float, postscale: float,
                   process_set: Any) -> tuple[Any, Callable[[], list[np.ndarray]]]:
    """Start allreducing ``originals`` (each in place where asked and possible); returns the
    handle and a function that, once it has finished, gives the results in the originals'
    dtypes."""
    chosen = _ringlet_set(process_set)
    # Integer types the core does not reduce travel widened (a copy), wrapping back as
    # Horovod's own sums of them wrap.
    arrays = [a.astype(_WIDER[a.dtype]) if a.dtype in _WIDER else a for a in originals]
    scaled = float(prescale) != 1.0 or float(postscale) != 1.0
    integers = [scaled and a.dtype.kind in "iu" for a in arrays]
    # Reduce the tensor's own memory when it can be; otherwise a contiguous copy. Scaled
    # integers are scaled as Horovod scales them: in float64, truncated back, before the
    # sum (prescale) and after it (postscale, with avg's 1/N), always on a copy, so that
    # the tensor is unchanged if the collective fails.
    work = [_prescaled_integers(a, prescale) if integer
            else a if place and _reducible_in_place(a)
            else np.array(a, order="C", copy=True)
            for a, integer, place in zip(arrays, integers, in_place)]
    floats = [w for w, integer in zip(work, integers) if not integer]
    whole = [w for w, integer in zip(work, integers) if integer]
    parts = [ringlet.allreduce_group_async(
        floats, op_name, compression=compression, prescale=prescale, postscale=postscale,
        process_set=chosen)]
    if whole:
        parts.append(ringlet.allreduce_group_async(
            whole, "sum" if op_name == "avg" else op_name, process_set=chosen))
    handle = ringlet.Handle(parts, lambda: None)
    post = float(postscale) / (_set_size(process_set) if op_name == "avg" else 1)

    def finish() -> list[np.ndarray]:
        for w, integer in zip(work, integers):
            if integer:
                np.copyto(w, np.trunc(w.astype(np.float64) * post), casting="unsafe")
        return [w.astype(o.dtype) if w.dtype != o.dtype else w for w, o in zip(work, originals)]

    return handle, finish


def _finished(backend: Backend, tensors: Sequence[Any], results: list[np.ndarray],
              in_place: bool) -> list[Any]:
    """An allreduce's results as the caller's tensors: written into them (in place), or new."""
    if in_place:
        for tensor, result in zip(tensors, results):
            backend.assign(tensor, result)
        return list(tensors)
    return [backend.tensor(r, t) for r, t in zip(results, tensors)]


def _done(result: Any) -> _HandleSet:
    """A handle for work that has already run."""
    handle = _HandleSet(None, lambda: result)
    handle.result, handle.finished = result, True
    return handle


_NUMPY = NumpyBackend()
_backends: dict[type, Backend] = {}


def register_backend(tensor_type: type, backend: Backend) -> None:
    """Teach the API another framework's tensors (``ringlet.hvd.torch`` registers torch's)."""
    _backends[tensor_type] = backend


def backend_for(tensor: Any) -> Backend:
    for tensor_type, backend in _backends.items():
        if isinstance(tensor, tensor_type):
            return backend
    return _NUMPY


class Horovod:
    """The API; ``ringlet.hvd`` publishes its methods as functions. Each call picks the
    backend from the tensor it is given (NumPy arrays, or torch tensors once
    ``ringlet.hvd.torch`` is imported)."""

    # ---- process ------------------------------------------------------------------------
    @staticmethod
    def init(comm: Any = None, process_sets: Any = None) -> None:
        """Initialize (MPI too, unless mpi4py did); ``comm`` is an mpi4py communicator (or a
        list of ranks of MPI_COMM_WORLD); ``process_sets`` a list of ``ProcessSet`` to add
        (collective), or "dynamic" (sets may always be added later here)."""
        if isinstance(comm, (list, tuple)):
            raise ValueError(
                "init(comm=[ranks]) is not supported; pass an mpi4py communicator "
                "(e.g. MPI.COMM_WORLD.Split(...)), or add a process set of those ranks"
            )
        global _negotiator
        first_init = not ringlet.is_initialized()
        ringlet.init(comm)
        # Install auto's model now, while every rank is here: later, the first "auto" call
        # would, collectively, and a rank that has joined could not take part.
        ringlet.selector.prepare()
        if first_init:
            for stale in _added.values():
                stale._invalidate()
            _added.clear()
            _in_flight.clear()
            _unnamed.clear()
        if _negotiation.matching_from_environment() == "name" and (
                _negotiator is None or first_init or _negotiator.failure is not None):
            _negotiator = _negotiation.Negotiator(_run_fused)
        if process_sets is None or process_sets == "dynamic":
            return
        sets = list(process_sets)

        def add() -> None:
            wanted = _sets_to_add(sets)
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
                _added[chosen.id] = ps

        _collectively("init", add)

    @staticmethod
    def shutdown() -> None:
        """Shut ringlet down (name matching's negotiation first: operations that not every
        rank submitted raise on every rank)."""
        global _negotiator
        if _negotiator is not None:
            _negotiator.stop()
            _negotiator = None
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
        if _negotiator is None:
            ringlet.barrier(_ringlet_set(process_set))
            return
        # Matched by name: the negotiation runs it once every member has submitted it, which
        # is all a barrier needs.
        set_id = getattr(process_set, "process_set_id", None) or 0
        _named("barrier", f"barrier.{set_id}", lambda: _done(None), _settings(process_set),
               process_set).synchronize()

    @staticmethod
    def join(device: int = -1) -> int:
        """Until every rank has joined, add zeros to the others' allreduces (Sum and Average;
        Average divides by all ranks); returns the rank that joined last."""
        if _negotiator is None:
            return ringlet.join()
        last = _negotiator.join()
        # Every rank is here, and nothing is waiting: the automatic names start again, the
        # same on every rank even if some submitted unnamed operations the others did not
        # (a gather that failed while a rank had joined).
        _unnamed.clear()
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
        return _add(process_set, process_set.ranks)

    @staticmethod
    def remove_process_set(process_set: ProcessSet) -> bool:
        """Remove an added process set (call it on every rank); False for the global set or
        one that is not added."""
        set_id = process_set.process_set_id
        if set_id in (None, 0) or _added.get(set_id) is not process_set:
            return False
        removed = process_set._set
        process_set._invalidate()
        del _added[set_id]
        return removed is not None and ringlet.remove_process_set(removed)

    def alltoall(self, tensor: Any, splits: Any = None, name: Any = None,
                 process_set: Any = None) -> Any:
        """Send ``splits[q]`` rows of ``tensor`` to rank q (equal parts without ``splits``);
        returns the rows received, in rank order, and, when ``splits`` is given, the rows
        received from each rank (int32), as Horovod does."""
        backend = backend_for(tensor)
        array = backend.array(tensor)
        counts = _alltoall_counts(backend, array, splits, _set_size(process_set))

        def run() -> Any:
            received, rows = ringlet.alltoall(array, counts, process_set=_ringlet_set(
                process_set))
            output = backend.tensor(received, tensor)
            if splits is None:
                return output
            return output, backend.tensor(np.array(rows, dtype=np.int32), tensor)

        if _negotiator is None:
            return run()
        signature = tensor_signature([array], leading=False) + _settings(process_set)
        return _named("alltoall", name, lambda: _done(run()), signature,
                      process_set).synchronize()

    def alltoall_async(self, tensor: Any, splits: Any = None, name: Any = None,
                       process_set: Any = None) -> Any:
        """``alltoall`` behind a handle (run at the call); ``synchronize`` returns the output
        and the received splits, as Horovod's does."""
        ranks = _set_size(process_set)
        array = backend_for(tensor).array(tensor)
        _alltoall_counts(backend_for(tensor), array, splits, ranks)
        rows = array.shape[0]
        result = self.alltoall(tensor, splits if splits is not None else [rows // ranks] * ranks,
                               name, process_set)
        return _done(result)

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

    # ---- allreduce ----------------------------------------------------------------------
    def _grouped_async(self, tensors: Sequence[Any], in_place: bool, average: Any, op: Any,
                       compression: Any, prescale: float, postscale: float,
                       process_set: Any) -> _HandleSet:
        op_name = _op_name(average, op)
        backend = backend_for(tensors[0]) if tensors else _NUMPY
        originals = [backend.array(t) for t in tensors]
        if compression is not None and compression not in _BUILT_IN_COMPRESSORS:
            # A user's Compressor: run its compress/decompress around the reduction.
            return self._custom_compressed(backend, tensors, originals, in_place, op_name,
                                           compression, prescale, postscale, process_set)
        handle, finish = _reduce_arrays(originals, [in_place] * len(originals), op_name,
                                        compression, prescale, postscale, process_set)
        return _HandleSet(handle, lambda: _finished(backend, tensors, finish(), in_place))

    @staticmethod
    def _custom_compressed(backend, tensors, originals, in_place, op_name, compression,
                           prescale, postscale, process_set) -> _HandleSet:
        chosen = _ringlet_set(process_set)
        work = [np.array(a, order="C", copy=True) for a in originals]
        compressed = [compression.compress(backend.tensor(w, t)) for w, t in zip(work, tensors)]
        wire = [np.array(backend.array(c), order="C", copy=True) for c, _ in compressed]
        handle = ringlet.allreduce_group_async(wire, op_name, prescale=prescale,
                                               postscale=postscale, process_set=chosen)

        def finish() -> Any:
            out = [compression.decompress(backend.tensor(w, c), ctx)
                   for w, (c, ctx) in zip(wire, compressed)]
            if in_place:
                for tensor, result in zip(tensors, out):
                    backend.assign(tensor, backend.array(result))
                return list(tensors)
            return out

        return _HandleSet(handle, finish)

    def _allreduce(self, tensors: Sequence[Any], in_place: bool, single: bool, name: Any,
                   average: Any, op: Any, compression: Any, prescale: float, postscale: float,
                   process_set: Any) -> _HandleSet:
        """Every allreduce entry point: matched by order (run now) or by name (submitted)."""
        tensors = list(tensors)

        def start() -> _HandleSet:
            handle = self._grouped_async(tensors, in_place, average, op, compression, prescale,
                                         postscale, process_set)
            return _HandleSet(handle, lambda: handle.synchronize()[0]) if single else handle

        if _negotiator is None:
            return _named("allreduce", name, start)
        op_name = _op_name(average, op)
        _ringlet_set(process_set)
        backend = backend_for(tensors[0]) if tensors else _NUMPY
        arrays = [backend.array(t) for t in tensors]
        custom = compression is not None and compression not in _BUILT_IN_COMPRESSORS
        if custom:
            wire = getattr(compression, "__name__", "?")
        else:
            wire = _wire_name(compression)
        signature = tensor_signature(arrays) + _settings(
            process_set, op=op_name,
            prescale=float(prescale), postscale=float(postscale), compression=wire,
            fusable=not custom)
        return _named("allreduce", name, start, signature, process_set,
                      None if custom else (backend, tensors, arrays, in_place, single))

    def allreduce_async(self, tensor: Any, average: Any = None, name: Any = None, op: Any = None,
                        prescale_factor: float = 1.0, postscale_factor: float = 1.0,
                        process_set: Any = None, compression: Any = None) -> _HandleSet:
        """Start an allreduce of ``tensor`` into a new tensor; ``synchronize`` returns it."""
        return self._allreduce([tensor], False, True, name, average, op, compression,
                               prescale_factor, postscale_factor, process_set)

    def allreduce_async_(self, tensor: Any, average: Any = None, name: Any = None, op: Any = None,
                         prescale_factor: float = 1.0, postscale_factor: float = 1.0,
                         process_set: Any = None, compression: Any = None) -> _HandleSet:
        """Start an in-place allreduce of ``tensor``; ``synchronize`` returns the tensor."""
        return self._allreduce([tensor], True, True, name, average, op, compression,
                               prescale_factor, postscale_factor, process_set)

    def allreduce(self, tensor: Any, average: Any = None, name: Any = None,
                  compression: Any = Compression.none, op: Any = None,
                  prescale_factor: float = 1.0, postscale_factor: float = 1.0,
                  process_set: Any = None) -> Any:
        """The reduction (default: average) of ``tensor`` over all ranks, as a new tensor."""
        return self.allreduce_async(tensor, average, name, op, prescale_factor,
                                    postscale_factor, process_set, compression).synchronize()

    def allreduce_(self, tensor: Any, average: Any = None, name: Any = None, op: Any = None,
                   prescale_factor: float = 1.0, postscale_factor: float = 1.0,
                   process_set: Any = None, compression: Any = None) -> Any:
        """Allreduce ``tensor`` in place and return it."""
        return self.allreduce_async_(tensor, average, name, op, prescale_factor,
                                     postscale_factor, process_set, compression).synchronize()

    def grouped_allreduce_async(self, tensors: Sequence[Any], average: Any = None,
                                name: Any = None, op: Any = None, prescale_factor: float = 1.0,
                                postscale_factor: float = 1.0, process_set: Any = None,
                                compression: Any = None) -> _HandleSet:
        """Start allreducing several tensors in one fused operation; returns a handle
        whose ``synchronize()`` gives new tensors."""
        return self._allreduce(tensors, False, False, name, average, op, compression,
                               prescale_factor, postscale_factor, process_set)

    def grouped_allreduce_async_(self, tensors: Sequence[Any], average: Any = None,
                                 name: Any = None, op: Any = None, prescale_factor: float = 1.0,
                                 postscale_factor: float = 1.0, process_set: Any = None,
                                 compression: Any = None) -> _HandleSet:
        """Start allreducing several tensors in place, in one fused operation; returns a
        handle."""
        return self._allreduce(tensors, True, False, name, average, op, compression,
                               prescale_factor, postscale_factor, process_set)

    def grouped_allreduce(self, tensors: Sequence[Any], average: Any = None, name: Any = None,
                          compression: Any = Compression.none, op: Any = None,
                          prescale_factor: float = 1.0, postscale_factor: float = 1.0,
                          process_set: Any = None) -> list[Any]:
        """Allreduce several tensors in one fused operation; returns new tensors."""
        return self.grouped_allreduce_async(tensors, average, name, op, prescale_factor,
                                            postscale_factor, process_set,
                                            compression).synchronize()

    def grouped_allreduce_(self, tensors: Sequence[Any], average: Any = None, name: Any = None,
                           op: Any = None, prescale_factor: float = 1.0,
                           postscale_factor: float = 1.0, process_set: Any = None,
                           compression: Any = None) -> list[Any]:
        """Allreduce several tensors in place, in one fused operation; returns them."""
        return self.grouped_allreduce_async_(tensors, average, name, op, prescale_factor,
                                             postscale_factor, process_set,
                                             compression).synchronize()

    @staticmethod
    def synchronize(handle: _HandleSet) -> Any:
        """Wait for an asynchronous operation and return its output."""
        if not isinstance(handle, _HandleSet):
            raise ValueError(f"synchronize() takes a handle from an *_async call, got {handle!r}")
        return handle.synchronize()

    @staticmethod
    def poll(handle: _HandleSet) -> bool:
        """Whether an asynchronous operation has finished (synchronize() will not block)."""
        if not isinstance(handle, _HandleSet):
            raise ValueError(f"poll() takes a handle from an *_async call, got {handle!r}")
        return handle.poll()

    # ---- gather and scatter -------------------------------------------------------------
    def allgather(self, tensor: Any, name: Any = None, process_set: Any = None) -> Any:
        """Concatenate every rank's ``tensor`` along the first dimension (which may differ
        between ranks; the other dimensions and the dtype must not)."""
        if _negotiator is not None:
            return self.allgather_async(tensor, name, process_set).synchronize()
        chosen = _ringlet_set(process_set)
        backend = backend_for(tensor)
        return backend.tensor(ringlet.allgather(backend.array(tensor), process_set=chosen),
                              tensor)

    def _allgather_handle(self, tensor: Any, process_set: Any) -> _HandleSet:
        chosen = _ringlet_set(process_set)
        backend = backend_for(tensor)
        handle = ringlet.allgather_async(backend.array(tensor), process_set=chosen)
        return _HandleSet(handle, lambda: backend.tensor(handle.wait(), tensor))

    def allgather_async(self, tensor: Any, name: Any = None, process_set: Any = None) -> Any:
        """``allgather`` in ringlet's background thread; ``synchronize`` returns the result."""
        array = backend_for(tensor).array(tensor)
        return _named("allgather", name, lambda: self._allgather_handle(tensor, process_set),
                      tensor_signature([array], leading=False) + _settings(process_set),
                      process_set, detail=describe(tensor_signature([array])))

    def grouped_allgather(self, tensors: Sequence[Any], name: Any = None,
                          process_set: Any = None) -> list[Any]:
        """``allgather`` of each tensor, in order."""
        return self.grouped_allgather_async(tensors, name, process_set).synchronize()

    def grouped_allgather_async(self, tensors: Sequence[Any], name: Any = None,
                                process_set: Any = None) -> Any:
        """Start allgathering several tensors; returns a handle whose ``synchronize()``
        gives the gathered tensors."""
        def start() -> _HandleSet:
            handles = [self._allgather_handle(t, process_set) for t in tensors]
            return _HandleSet(ringlet.Handle(handles, lambda: None),
                              lambda: [h.synchronize() for h in handles])

        arrays = [backend_for(t).array(t) for t in tensors]
        return _named("allgather", name, start,
                      tensor_signature(arrays, leading=False) + _settings(process_set),
                      process_set, detail=describe(tensor_signature(arrays)))

    def allgather_object(self, obj: Any, name: Any = None, process_set: Any = None) -> list[Any]:
        """Every rank's picklable ``obj``, as a list indexed by rank."""
        if _negotiator is None:
            return ringlet.allgather_object(obj, process_set=_ringlet_set(process_set))
        return _named("allgather_object", name, lambda: _done(ringlet.allgather_object(
            obj, process_set=_ringlet_set(process_set))), _settings(process_set),
            process_set).synchronize()

    def _reducescatter_handle(self, tensor: Any, op: Any, process_set: Any,
                              prescale_factor: float, postscale_factor: float) -> _HandleSet:
        chosen = _ringlet_set(process_set)
        op_name = _op_name(None, op)
        if op_name not in ("sum", "avg"):
            raise ValueError("reducescatter supports Sum and Average")
        backend = backend_for(tensor)
        array = backend.array(tensor)
        pre, post = float(prescale_factor), float(postscale_factor)
        if array.dtype.kind in "iu" and (pre != 1.0 or post != 1.0):
            # As Horovod: integers scaled in float64 and truncated, before and after the sum
            # (avg's division folded into the postscale).
            handle = ringlet.reduce_scatter_async(_prescaled_integers(array, pre), "sum",
                                                  process_set=chosen)
            post /= _set_size(process_set) if op_name == "avg" else 1

            def finish() -> Any:
                mine = handle.wait()
                return backend.tensor(
                    np.trunc(mine.astype(np.float64) * post).astype(array.dtype), tensor)

            return _HandleSet(handle, finish)
        work = np.array(array, order="C", copy=True)
        if pre != 1.0:
            work = _scaled(work, pre)
        handle = ringlet.reduce_scatter_async(work, op_name, process_set=chosen)

        def scaled() -> Any:
            mine = handle.wait()
            return backend.tensor(_scaled(mine, post) if post != 1.0 else mine, tensor)

        return _HandleSet(handle, scaled)

    def reducescatter(self, tensor: Any, name: Any = None, op: Any = Average,
                      process_set: Any = None, prescale_factor: float = 1.0,
                      postscale_factor: float = 1.0) -> Any:
        """Reduce ``tensor`` over all ranks and return this rank's slice of the first dimension
        (the first ``dim0 % size`` ranks get one row more)."""
        if _negotiator is not None:
            return self.reducescatter_async(tensor, name, op, process_set, prescale_factor,
                                            postscale_factor).synchronize()
        return self._reducescatter_handle(tensor, op, process_set, prescale_factor,
                                          postscale_factor).synchronize()

    def reducescatter_async(self, tensor: Any, name: Any = None, op: Any = Average,
                            process_set: Any = None, prescale_factor: float = 1.0,
                            postscale_factor: float = 1.0) -> Any:
        """``reducescatter`` in ringlet's background thread; ``synchronize`` returns it."""
        return _named("reducescatter", name, lambda: self._reducescatter_handle(
            tensor, op, process_set, prescale_factor, postscale_factor),
            self._reducescatter_signature([tensor], op, process_set, prescale_factor,
                                          postscale_factor), process_set)

    @staticmethod
    def _reducescatter_signature(tensors: Sequence[Any], op: Any, process_set: Any,
                                 prescale: float, postscale: float) -> tuple[Any, ...]:
        """What every member must pass alike (checking the op here, on the caller's thread)."""
        op_name = _op_name(None, op)
        if op_name not in ("sum", "avg"):
            raise ValueError("reducescatter supports Sum and Average")
        arrays = [backend_for(t).array(t) for t in tensors]
        return tensor_signature(arrays) + _settings(
            process_set, op=op_name, prescale=float(prescale), postscale=float(postscale))

    def grouped_reducescatter(self, tensors: Sequence[Any], name: Any = None, op: Any = Average,
                              process_set: Any = None, prescale_factor: float = 1.0,
                              postscale_factor: float = 1.0) -> list[Any]:
        """``reducescatter`` of each tensor, in order."""
        return self.grouped_reducescatter_async(tensors, name, op, process_set,
                                                prescale_factor, postscale_factor).synchronize()

    def grouped_reducescatter_async(self, tensors: Sequence[Any], name: Any = None,
                                    op: Any = Average, process_set: Any = None,
                                    prescale_factor: float = 1.0,
                                    postscale_factor: float = 1.0) -> Any:
        """Start reduce-scattering several tensors; returns a handle whose
        ``synchronize()`` gives this rank's parts."""
        def start() -> _HandleSet:
            handles = [self._reducescatter_handle(t, op, process_set, prescale_factor,
                                                  postscale_factor) for t in tensors]
            return _HandleSet(ringlet.Handle(handles, lambda: None),
                              lambda: [h.synchronize() for h in handles])

        return _named("reducescatter", name, start, self._reducescatter_signature(
            tensors, op, process_set, prescale_factor, postscale_factor), process_set)

    # ---- broadcast ----------------------------------------------------------------------
    def broadcast_async_(self, tensor: Any, root_rank: int, name: Any = None,
                         process_set: Any = None) -> _HandleSet:
        """Start broadcasting ``tensor`` from ``root_rank`` into itself on every rank;
        returns a handle."""
        _ringlet_set(process_set)
        backend = backend_for(tensor)
        array = backend.array(tensor)
        work = array if _reducible_in_place(array) else np.array(array, order="C", copy=True)

        def finish() -> Any:
            backend.assign(tensor, work)
            return tensor

        return _named("broadcast", name, lambda: _HandleSet(
            ringlet.broadcast_async(work, root_rank, out=work,
                                    process_set=_ringlet_set(process_set)), finish),
            self._broadcast_signature(array, root_rank, process_set), process_set)

    def broadcast_async(self, tensor: Any, root_rank: int, name: Any = None,
                        process_set: Any = None) -> _HandleSet:
        """Start broadcasting ``tensor`` from ``root_rank``; returns a handle whose
        ``synchronize()`` gives a new tensor on every rank."""
        _ringlet_set(process_set)
        backend = backend_for(tensor)

        def start() -> _HandleSet:
            handle = ringlet.broadcast_async(backend.array(tensor), root_rank,
                                             process_set=_ringlet_set(process_set))
            return _HandleSet(handle, lambda: backend.tensor(handle.wait(), tensor))

        return _named("broadcast", name, start, self._broadcast_signature(
            backend.array(tensor), root_rank, process_set), process_set)

    @staticmethod
    def _broadcast_signature(array: np.ndarray, root_rank: int,
                             process_set: Any) -> tuple[Any, ...]:
        return tensor_signature([array]) + _settings(process_set, root=root_rank)

    def broadcast(self, tensor: Any, root_rank: int, name: Any = None,
                  process_set: Any = None) -> Any:
        """``root_rank``'s ``tensor`` on every rank, as a new tensor."""
        return self.broadcast_async(tensor, root_rank, name, process_set).synchronize()

    def broadcast_(self, tensor: Any, root_rank: int, name: Any = None,
                   process_set: Any = None) -> Any:
        """Overwrite ``tensor`` with ``root_rank``'s, in place; returns it."""
        return self.broadcast_async_(tensor, root_rank, name, process_set).synchronize()

    @staticmethod
    def broadcast_object(obj: Any, root_rank: int = 0, name: Any = None,
                         process_set: Any = None) -> Any:
        """``root_rank``'s picklable ``obj`` on every rank."""
        if _negotiator is None:
            return ringlet.broadcast_object(obj, root_rank,
                                            process_set=_ringlet_set(process_set))
        return _named("broadcast_object", name, lambda: _done(ringlet.broadcast_object(
            obj, root_rank, process_set=_ringlet_set(process_set))),
            _settings(process_set, root=root_rank), process_set).synchronize()

    def broadcast_parameters(self, params: Any, root_rank: int) -> None:
        """Broadcast a ``state_dict()`` (dict) or ``named_parameters()`` (pairs) in place."""
        if isinstance(params, dict):
            items: Iterable[tuple[Any, Any]] = sorted(params.items(), key=lambda kv: str(kv[0]))
        elif isinstance(params, Iterable):
            items = list(params)
        else:
            raise ValueError(f"invalid params of type {type(params).__name__}")
        handles = [self.broadcast_async_(p, root_rank) for _, p in items if p is not None]
        for handle in handles:
            handle.synchronize()


_WIDER = {np.dtype(narrow): np.dtype(wide) for narrow, wide in (
    (np.int8, np.int32), (np.uint8, np.int32), (np.int16, np.int32), (np.uint16, np.int32),
    (np.uint32, np.int64))}
"""Integer types reduced in a wider one the core reduces (exactly: the ranks' values fit)."""


def _alltoall_counts(backend: Backend, array: np.ndarray, splits: Any,
                     ranks: int) -> list[int] | None:
    """``splits`` as a list of row counts, checked: one per rank, whole numbers, none
    negative, adding up to the tensor's rows (ValueError otherwise, before anything is sent)."""
    if splits is None:
        rows = array.shape[0] if array.ndim else 1
        if rows % ranks:
            raise ValueError(f"alltoall without splits needs a first dimension divisible by "
                             f"the {ranks} ranks, got {rows}")
        return None
    values = np.asarray(splits if isinstance(splits, (list, tuple)) else backend.array(splits))
    if values.size and values.dtype.kind not in "iu" and not (
            isinstance(splits, (list, tuple)) and all(isinstance(v, int) for v in splits)):
        raise ValueError(f"alltoall's splits must be integers (int32), got {values.dtype}")
    counts = [int(v) for v in values.reshape(-1)]
    rows = array.shape[0] if array.ndim else 1
    if len(counts) != ranks or any(c < 0 for c in counts) or sum(counts) != rows:
        raise ValueError(f"alltoall's splits must be {ranks} non-negative row counts adding up "
                         f"to the tensor's {rows} rows, got {counts}")
    return counts


def _prescaled_integers(array: np.ndarray, prescale: float) -> np.ndarray:
    """``array`` times ``prescale`` in float64, truncated toward zero (a new C array)."""
    scaled = np.trunc(array.astype(np.float64) * float(prescale))
    return np.ascontiguousarray(scaled.astype(array.dtype))


def _scaled(array: np.ndarray, factor: float) -> np.ndarray:
    """``array`` times ``factor`` as Horovod scales floats: in the array's own precision, and
    16-bit floats in float32 (rounding ``factor`` to 16 bits first would be coarser)."""
    if array.dtype.itemsize == 2:
        return (array.astype(np.float32) * np.float32(factor)).astype(array.dtype)
    return array * array.dtype.type(factor)


def _reducible_in_place(array: np.ndarray) -> bool:
    return bool(array.flags.carray and array.dtype.isnative)
