"""Horovod's collectives (allreduce, allgather, reducescatter, broadcast, alltoall), for
every framework's tensors through its backend."""

from __future__ import annotations

import time
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np

import ringlet
from ringlet import elastic

from ._backend import NUMPY, Backend, backend_for
from ._fusion import deliver, prescaled_integers, reduce_arrays, reducible_in_place, scale_floats
from ._handles import HandleSet, finished_handle, named, signature_settings
from ._ops import BUILT_IN_COMPRESSORS, Average, Compression, ringlet_op, wire_name
from ._process_sets import is_global, ringlet_set, set_size
from ._requests import describe, tensor_signature
from ._state import state

__all__ = ["Collectives"]


class Collectives:
    """Horovod's collectives; ``Horovod`` adds the process functions."""

    def alltoall(self, tensor: Any, splits: Any = None, name: Any = None,
                 process_set: Any = None) -> Any:
        """Send ``splits[q]`` rows of ``tensor`` to rank q (equal parts without ``splits``);
        returns the rows received, in rank order, and, when ``splits`` is given, the rows
        received from each rank (int32), as Horovod does."""
        backend = backend_for(tensor)
        array = backend.array(tensor)
        counts = _alltoall_counts(backend, array, splits, set_size(process_set))

        def run() -> Any:
            received, rows = ringlet.alltoall(array, counts, process_set=ringlet_set(
                process_set))
            output = backend.tensor(received, tensor)
            if splits is None:
                return output
            return output, backend.tensor(np.array(rows, dtype=np.int32), tensor)

        if state.negotiator is None:
            return run()
        signature = tensor_signature([array], leading=False) + signature_settings(process_set)
        return named("alltoall", name, lambda: finished_handle(run()), signature,
                     process_set).synchronize()

    def alltoall_async(self, tensor: Any, splits: Any = None, name: Any = None,
                       process_set: Any = None) -> Any:
        """``alltoall`` behind a handle (run at the call); ``synchronize`` returns the output
        and the received splits, as Horovod's does."""
        ranks = set_size(process_set)
        array = backend_for(tensor).array(tensor)
        _alltoall_counts(backend_for(tensor), array, splits, ranks)
        rows = array.shape[0]
        result = self.alltoall(tensor, splits if splits is not None else [rows // ranks] * ranks,
                               name, process_set)
        return finished_handle(result)

    # ---- allreduce ----------------------------------------------------------------------
    def _grouped_async(self, tensors: Sequence[Any], in_place: bool, average: Any, op: Any,
                       compression: Any, prescale: float, postscale: float,
                       process_set: Any, now: bool = False,
                       outputs: Sequence[np.ndarray] | None = None) -> HandleSet:
        """Queue the allreduce of ``tensors``, or run it ``now`` (a synchronous call: no
        hand-off to the core's thread and back)."""
        op_name = ringlet_op(average, op)
        backend = backend_for(tensors[0]) if tensors else NUMPY
        originals = [backend.array(t) for t in tensors]
        if compression is not None and compression not in BUILT_IN_COMPRESSORS:
            # A user's Compressor: run its compress/decompress around the reduction.
            return self._custom_compressed(backend, tensors, originals, in_place, op_name,
                                           compression, prescale, postscale, process_set)
        handle, finish = reduce_arrays(originals, [in_place] * len(originals), op_name,
                                       compression, prescale, postscale, process_set,
                                       submitted=time.monotonic() if now else None,
                                       outputs=outputs)
        return HandleSet(handle, lambda: deliver(backend, tensors, finish(), in_place))

    @staticmethod
    def _custom_compressed(backend, tensors, originals, in_place, op_name, compression,
                           prescale, postscale, process_set) -> HandleSet:
        chosen = ringlet_set(process_set)
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

        return HandleSet(handle, finish)

    def _allreduce(self, tensors: Sequence[Any], in_place: bool, single: bool, name: Any,
                   average: Any, op: Any, compression: Any, prescale: float, postscale: float,
                   process_set: Any, now: bool = False,
                   outputs: Sequence[np.ndarray] | None = None) -> HandleSet:
        """Every allreduce entry point: matched by order (started at once; run on this thread
        for a synchronous call, ``now``) or by name (submitted); not in place, into
        ``outputs`` where given."""
        if elastic.UNDER_DRIVER:
            elastic.refuse_outside_run("hvd.allreduce")
        tensors = list(tensors)

        def start() -> HandleSet:
            handle = self._grouped_async(tensors, in_place, average, op, compression, prescale,
                                         postscale, process_set, now, outputs)
            return HandleSet(handle, lambda: handle.synchronize()[0]) if single else handle

        if state.negotiator is None:
            return named("allreduce", name, start)
        op_name = ringlet_op(average, op)
        ringlet_set(process_set)
        backend = backend_for(tensors[0]) if tensors else NUMPY
        arrays = [backend.array(t) for t in tensors]
        custom = compression is not None and compression not in BUILT_IN_COMPRESSORS
        if custom:
            wire = getattr(compression, "__name__", "?")
        else:
            wire = wire_name(compression)
        signature = tensor_signature(arrays) + signature_settings(
            process_set, op=op_name,
            prescale=float(prescale), postscale=float(postscale), compression=wire,
            fusable=not custom)
        # A name every rank has run before may start at once while every rank is idle
        # (``Negotiator.run_alone``), if it is one collective: one dtype (each has its own),
        # not scaled integers (scaled apart).
        alone = (name is not None and not custom and is_global(process_set)
                 and len({a.dtype for a in arrays}) == 1 and not (
                     (prescale != 1.0 or postscale != 1.0) and arrays[0].dtype.kind in "iu"))
        if alone and now:  # no request to build unless it has to be submitted
            negotiator = state.negotiator
            key = ("allreduce", str(name), negotiator.everyone)
            if key not in state.in_flight:
                ran = negotiator.run_alone(key, signature, start)
                if ran is not None:
                    return ran
        return named("allreduce", name, start, signature, process_set,
                     None if custom else (backend, tensors, arrays, in_place, single, outputs),
                     waited_for=now, alone=alone and not now)

    def allreduce_async(self, tensor: Any, average: Any = None, name: Any = None, op: Any = None,
                        prescale_factor: float = 1.0, postscale_factor: float = 1.0,
                        process_set: Any = None, compression: Any = None) -> HandleSet:
        """Start an allreduce of ``tensor`` into a new tensor; ``synchronize`` returns it."""
        return self._allreduce([tensor], False, True, name, average, op, compression,
                               prescale_factor, postscale_factor, process_set)

    def allreduce_async_(self, tensor: Any, average: Any = None, name: Any = None, op: Any = None,
                         prescale_factor: float = 1.0, postscale_factor: float = 1.0,
                         process_set: Any = None, compression: Any = None) -> HandleSet:
        """Start an in-place allreduce of ``tensor``; ``synchronize`` returns the tensor."""
        return self._allreduce([tensor], True, True, name, average, op, compression,
                               prescale_factor, postscale_factor, process_set)

    def allreduce(self, tensor: Any, average: Any = None, name: Any = None,
                  compression: Any = Compression.none, op: Any = None,
                  prescale_factor: float = 1.0, postscale_factor: float = 1.0,
                  process_set: Any = None) -> Any:
        """The reduction (default: average) of ``tensor`` over all ranks, as a new tensor."""
        return self._allreduce([tensor], False, True, name, average, op, compression,
                               prescale_factor, postscale_factor, process_set,
                               now=True).synchronize()

    def allreduce_(self, tensor: Any, average: Any = None, name: Any = None, op: Any = None,
                   prescale_factor: float = 1.0, postscale_factor: float = 1.0,
                   process_set: Any = None, compression: Any = None) -> Any:
        """Allreduce ``tensor`` in place and return it."""
        return self._allreduce([tensor], True, True, name, average, op, compression,
                               prescale_factor, postscale_factor, process_set,
                               now=True).synchronize()

    def grouped_allreduce_async(self, tensors: Sequence[Any], average: Any = None,
                                name: Any = None, op: Any = None, prescale_factor: float = 1.0,
                                postscale_factor: float = 1.0, process_set: Any = None,
                                compression: Any = None) -> HandleSet:
        """Start allreducing several tensors in one fused operation; returns a handle
        whose ``synchronize()`` gives new tensors."""
        return self._allreduce(tensors, False, False, name, average, op, compression,
                               prescale_factor, postscale_factor, process_set)

    def grouped_allreduce_async_(self, tensors: Sequence[Any], average: Any = None,
                                 name: Any = None, op: Any = None, prescale_factor: float = 1.0,
                                 postscale_factor: float = 1.0, process_set: Any = None,
                                 compression: Any = None) -> HandleSet:
        """Start allreducing several tensors in place, in one fused operation; returns a
        handle."""
        return self._allreduce(tensors, True, False, name, average, op, compression,
                               prescale_factor, postscale_factor, process_set)

    def grouped_allreduce(self, tensors: Sequence[Any], average: Any = None, name: Any = None,
                          compression: Any = Compression.none, op: Any = None,
                          prescale_factor: float = 1.0, postscale_factor: float = 1.0,
                          process_set: Any = None) -> list[Any]:
        """Allreduce several tensors in one fused operation; returns new tensors."""
        return self._allreduce(tensors, False, False, name, average, op, compression,
                               prescale_factor, postscale_factor, process_set,
                               now=True).synchronize()

    def grouped_allreduce_(self, tensors: Sequence[Any], average: Any = None, name: Any = None,
                           op: Any = None, prescale_factor: float = 1.0,
                           postscale_factor: float = 1.0, process_set: Any = None,
                           compression: Any = None) -> list[Any]:
        """Allreduce several tensors in place, in one fused operation; returns them."""
        return self._allreduce(tensors, True, False, name, average, op, compression,
                               prescale_factor, postscale_factor, process_set,
                               now=True).synchronize()

    def grouped_allreduce_into(self, arrays: Sequence[np.ndarray], outputs: Sequence[np.ndarray],
                               name: Any = None, op: Any = None, prescale_factor: float = 1.0,
                               postscale_factor: float = 1.0, process_set: Any = None,
                               compression: Any = None) -> list[np.ndarray]:
        """``grouped_allreduce`` of NumPy ``arrays`` (only read) into ``outputs`` (one aligned,
        writeable C-contiguous array per array, of its shape and dtype) where the reduction
        allows it, as a framework's operation that owns its result buffers needs (ringlet's
        own, not Horovod's); returns the results, which are ``outputs`` where they could
        be."""
        return self._allreduce(arrays, False, False, name, None, op, compression,
                               prescale_factor, postscale_factor, process_set, now=True,
                               outputs=outputs).synchronize()

    @staticmethod
    def synchronize(handle: HandleSet) -> Any:
        """Wait for an asynchronous operation and return its output."""
        if not isinstance(handle, HandleSet):
            raise ValueError(f"synchronize() takes a handle from an *_async call, got {handle!r}")
        return handle.synchronize()

    @staticmethod
    def poll(handle: HandleSet) -> bool:
        """Whether an asynchronous operation has finished (synchronize() will not block)."""
        if not isinstance(handle, HandleSet):
            raise ValueError(f"poll() takes a handle from an *_async call, got {handle!r}")
        return handle.poll()

    # ---- gather and scatter -------------------------------------------------------------
    def allgather(self, tensor: Any, name: Any = None, process_set: Any = None) -> Any:
        """Concatenate every rank's ``tensor`` along the first dimension (which may differ
        between ranks; the other dimensions and the dtype must not)."""
        if state.negotiator is not None:
            return self.allgather_async(tensor, name, process_set).synchronize()
        chosen = ringlet_set(process_set)
        backend = backend_for(tensor)
        return backend.tensor(ringlet.allgather(backend.array(tensor), process_set=chosen),
                              tensor)

    def _allgather_handle(self, tensor: Any, process_set: Any) -> HandleSet:
        chosen = ringlet_set(process_set)
        backend = backend_for(tensor)
        handle = ringlet.allgather_async(backend.array(tensor), process_set=chosen)
        return HandleSet(handle, lambda: backend.tensor(handle.wait(), tensor))

    def allgather_async(self, tensor: Any, name: Any = None, process_set: Any = None) -> Any:
        """``allgather`` in ringlet's background thread; ``synchronize`` returns the result."""
        array = backend_for(tensor).array(tensor)
        return named("allgather", name, lambda: self._allgather_handle(tensor, process_set),
                     tensor_signature([array], leading=False) + signature_settings(process_set),
                     process_set, detail=describe(tensor_signature([array])))

    def grouped_allgather(self, tensors: Sequence[Any], name: Any = None,
                          process_set: Any = None) -> list[Any]:
        """``allgather`` of each tensor, in order."""
        return self.grouped_allgather_async(tensors, name, process_set).synchronize()

    def grouped_allgather_async(self, tensors: Sequence[Any], name: Any = None,
                                process_set: Any = None) -> Any:
        """Start allgathering several tensors; returns a handle whose ``synchronize()``
        gives the gathered tensors."""
        def start() -> HandleSet:
            handles = [self._allgather_handle(t, process_set) for t in tensors]
            return HandleSet(ringlet.Handle(handles, lambda: None),
                             lambda: [h.synchronize() for h in handles])

        arrays = [backend_for(t).array(t) for t in tensors]
        return named("allgather", name, start,
                     tensor_signature(arrays, leading=False) + signature_settings(process_set),
                     process_set, detail=describe(tensor_signature(arrays)))

    def allgather_object(self, obj: Any, name: Any = None, process_set: Any = None) -> list[Any]:
        """Every rank's picklable ``obj``, as a list indexed by rank."""
        if state.negotiator is None:
            return ringlet.allgather_object(obj, process_set=ringlet_set(process_set))
        return named("allgather_object", name, lambda: finished_handle(ringlet.allgather_object(
            obj, process_set=ringlet_set(process_set))), signature_settings(process_set),
            process_set).synchronize()

    def _reducescatter_handle(self, tensor: Any, op: Any, process_set: Any,
                              prescale_factor: float, postscale_factor: float) -> HandleSet:
        chosen = ringlet_set(process_set)
        op_name = ringlet_op(None, op)
        if op_name not in ("sum", "avg"):
            raise ValueError("reducescatter supports Sum and Average")
        backend = backend_for(tensor)
        array = backend.array(tensor)
        pre, post = float(prescale_factor), float(postscale_factor)
        if array.dtype.kind in "iu" and (pre != 1.0 or post != 1.0):
            # As Horovod: integers scaled in float64 and truncated, before and after the sum
            # (avg's division folded into the postscale).
            handle = ringlet.reduce_scatter_async(prescaled_integers(array, pre), "sum",
                                                  process_set=chosen)
            post /= set_size(process_set) if op_name == "avg" else 1

            def finish() -> Any:
                mine = handle.wait()
                return backend.tensor(
                    np.trunc(mine.astype(np.float64) * post).astype(array.dtype), tensor)

            return HandleSet(handle, finish)
        work = np.array(array, order="C", copy=True)
        if pre != 1.0:
            work = scale_floats(work, pre)
        handle = ringlet.reduce_scatter_async(work, op_name, process_set=chosen)

        def scaled() -> Any:
            mine = handle.wait()
            return backend.tensor(scale_floats(mine, post) if post != 1.0 else mine, tensor)

        return HandleSet(handle, scaled)

    def reducescatter(self, tensor: Any, name: Any = None, op: Any = Average,
                      process_set: Any = None, prescale_factor: float = 1.0,
                      postscale_factor: float = 1.0) -> Any:
        """Reduce ``tensor`` over all ranks and return this rank's slice of the first dimension
        (the first ``dim0 % size`` ranks get one row more)."""
        if state.negotiator is not None:
            return self.reducescatter_async(tensor, name, op, process_set, prescale_factor,
                                            postscale_factor).synchronize()
        return self._reducescatter_handle(tensor, op, process_set, prescale_factor,
                                          postscale_factor).synchronize()

    def reducescatter_async(self, tensor: Any, name: Any = None, op: Any = Average,
                            process_set: Any = None, prescale_factor: float = 1.0,
                            postscale_factor: float = 1.0) -> Any:
        """``reducescatter`` in ringlet's background thread; ``synchronize`` returns it."""
        return named("reducescatter", name, lambda: self._reducescatter_handle(
            tensor, op, process_set, prescale_factor, postscale_factor),
            self._reducescatter_signature([tensor], op, process_set, prescale_factor,
                                          postscale_factor), process_set)

    @staticmethod
    def _reducescatter_signature(tensors: Sequence[Any], op: Any, process_set: Any,
                                 prescale: float, postscale: float) -> tuple[Any, ...]:
        """What every member must pass alike (checking the op here, on the caller's thread)."""
        op_name = ringlet_op(None, op)
        if op_name not in ("sum", "avg"):
            raise ValueError("reducescatter supports Sum and Average")
        arrays = [backend_for(t).array(t) for t in tensors]
        return tensor_signature(arrays) + signature_settings(
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
        def start() -> HandleSet:
            handles = [self._reducescatter_handle(t, op, process_set, prescale_factor,
                                                  postscale_factor) for t in tensors]
            return HandleSet(ringlet.Handle(handles, lambda: None),
                             lambda: [h.synchronize() for h in handles])

        return named("reducescatter", name, start, self._reducescatter_signature(
            tensors, op, process_set, prescale_factor, postscale_factor), process_set)

    # ---- broadcast ----------------------------------------------------------------------
    def broadcast_async_(self, tensor: Any, root_rank: int, name: Any = None,
                         process_set: Any = None) -> HandleSet:
        """Start broadcasting ``tensor`` from ``root_rank`` into itself on every rank;
        returns a handle."""
        ringlet_set(process_set)
        backend = backend_for(tensor)
        array = backend.array(tensor)
        work = array if reducible_in_place(array) else np.array(array, order="C", copy=True)

        def finish() -> Any:
            backend.assign(tensor, work)
            return tensor

        return named("broadcast", name, lambda: HandleSet(
            ringlet.broadcast_async(work, root_rank, out=work,
                                    process_set=ringlet_set(process_set)), finish),
            self._broadcast_signature(array, root_rank, process_set), process_set)

    def broadcast_async(self, tensor: Any, root_rank: int, name: Any = None,
                        process_set: Any = None) -> HandleSet:
        """Start broadcasting ``tensor`` from ``root_rank``; returns a handle whose
        ``synchronize()`` gives a new tensor on every rank."""
        ringlet_set(process_set)
        backend = backend_for(tensor)

        def start() -> HandleSet:
            handle = ringlet.broadcast_async(backend.array(tensor), root_rank,
                                             process_set=ringlet_set(process_set))
            return HandleSet(handle, lambda: backend.tensor(handle.wait(), tensor))

        return named("broadcast", name, start, self._broadcast_signature(
            backend.array(tensor), root_rank, process_set), process_set)

    @staticmethod
    def _broadcast_signature(array: np.ndarray, root_rank: int,
                             process_set: Any) -> tuple[Any, ...]:
        return tensor_signature([array]) + signature_settings(process_set, root=root_rank)

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
        if state.negotiator is None:
            return ringlet.broadcast_object(obj, root_rank,
                                            process_set=ringlet_set(process_set))
        return named("broadcast_object", name, lambda: finished_handle(ringlet.broadcast_object(
            obj, root_rank, process_set=ringlet_set(process_set))),
            signature_settings(process_set, root=root_rank), process_set).synchronize()

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

