"""Allreduces run as ringlet's grouped allreduce: the arrays prepared (widened, scaled,
in place where they can be), the results handed back as the caller's tensors; and the
allreduces that name matching fuses."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from itertools import repeat
from typing import Any

import numpy as np

import ringlet

from ._backend import Backend
from ._handles import HandleSet
from ._ops import COMPRESSOR_BY_WIRE
from ._process_sets import ringlet_set, set_by_id, set_size
from ._requests import Request

__all__ = ["WIDER", "Ran", "deliver", "dtype_named", "prescaled_integers",
           "readable_where_it_is", "reduce_arrays", "reducible_in_place", "run_fused",
           "scale_floats"]


def dtype_named(name: str) -> np.dtype:
    try:
        return np.dtype(name)
    except TypeError:
        import ml_dtypes

        return np.dtype(getattr(ml_dtypes, name))


QUEUED_FROM = 1 << 16
"""Bytes from which a fused allreduce is queued to the core's thread rather than run on the
thread of the negotiation's cycle: its callers then wait for the core's completion directly,
not for that thread to return from it and hand the result on (0.25 ms a step in make
bench-train's MLP); a small one costs less than that hand-off."""


def run_fused(requests: list[Request | None],
              signatures: list[tuple[Any, ...]]) -> list[HandleSet]:
    """Allreduces matched by name, fused into one collective (ringlet's grouped allreduce) run
    by the thread that runs the negotiation's cycle: this rank's tensors, or zeros where it has
    joined. Below ``QUEUED_FROM`` bytes it runs now, not queued to the core's thread: the
    cycle's next collective would wait for it anyway, and the hand-off costs more than a small
    collective."""
    settings = dict(item for item in signatures[0] if not isinstance(item[1], tuple))
    process_set = set_by_id(settings["set"])
    compression = COMPRESSOR_BY_WIRE[settings["compression"]]
    originals: list[np.ndarray] = []
    in_place: list[bool] = []
    outputs: list[np.ndarray | None] = []
    spans = []
    for request, signature in zip(requests, signatures):
        start = len(originals)
        if request is None:
            zeros = [np.zeros(shape, dtype_named(dtype)) for dtype, shape in signature
                     if isinstance(shape, tuple)]
            originals += zeros
            in_place += [True] * len(zeros)
            outputs += [None] * len(zeros)
        else:
            _, _, arrays, place, _, into = request.payload
            originals += arrays
            in_place += [place] * len(arrays)
            outputs += into if into is not None else [None] * len(arrays)
        spans.append((start, len(originals)))
    submitted = min((r.submitted for r in requests if r is not None), default=time.monotonic())
    queued = sum(a.nbytes for a in originals) >= QUEUED_FROM
    handle, finish = reduce_arrays(originals, in_place, settings["op"], compression,
                                   settings["prescale"], settings["postscale"], process_set,
                                   submitted=None if queued else submitted, outputs=outputs)
    results: list[list[np.ndarray]] = []

    def all_results() -> list[np.ndarray]:
        if not results:
            results.append(finish())
        return results[0]

    handles = []
    for request, (start, end) in zip(requests, spans):
        if request is None:
            handles.append(HandleSet(handle, lambda: None))
            continue
        backend, tensors, _, place, single, _ = request.payload

        def one(backend: Backend = backend, tensors: list[Any] = tensors, place: bool = place,
                single: bool = single, start: int = start, end: int = end) -> Any:
            out = deliver(backend, tensors, all_results()[start:end], place)
            return out[0] if single else out

        handles.append(HandleSet(handle, one))
    return handles


def reduce_arrays(originals: list[np.ndarray], in_place: list[bool], op_name: str,
                  compression: Any, prescale: float, postscale: float, process_set: Any,
                  submitted: float | None = None,
                  outputs: Sequence[np.ndarray | None] | None = None,
                  ) -> tuple[Any, Callable[[], list[np.ndarray]]]:
    """Start allreducing ``originals``: each in place where asked and possible, else from
    where it is into ``outputs[i]`` if given, else into a new array; returns the
    handle and a function that, once it has finished, gives the results in the originals'
    dtypes. Queued to the core's thread, or, given when the operation was ``submitted``
    (``time.monotonic()``), run on this thread before it returns."""
    chosen = ringlet_set(process_set)
    # Integer types the core does not reduce travel widened (a copy), wrapping back as
    # Horovod's own sums of them wrap.
    arrays = [a.astype(WIDER[a.dtype]) if a.dtype in WIDER else a for a in originals]
    scaled = float(prescale) != 1.0 or float(postscale) != 1.0
    integers = [scaled and a.dtype.kind in "iu" for a in arrays]
    # Reduce the tensor's own memory when it can be, or read it where it is into a result
    # apart; otherwise a contiguous copy, in place. Scaled integers are scaled as Horovod
    # scales them: in float64, truncated back, before the sum (prescale) and after it
    # (postscale, with avg's 1/N), always on a copy, so that the tensor is unchanged if the
    # collective fails.
    sources: list[np.ndarray] = []
    results: list[np.ndarray] = []
    apart = False
    given = outputs if outputs is not None else repeat(None)
    for a, original, integer, place, out in zip(arrays, originals, integers, in_place, given):
        if integer:
            source = result = prescaled_integers(a, prescale)
        elif a is not original or (place and reducible_in_place(a)):
            source = result = a  # a widened copy is this call's own
        elif (out is not None or a.nbytes >= OUT_OF_PLACE_FROM) and readable_where_it_is(a):
            source, result, apart = a, out if out is not None else np.empty_like(a), True
        else:
            source = result = np.array(a, order="C", copy=True)
        sources.append(source)
        results.append(result)
    floats = [w for w, integer in zip(sources, integers) if not integer]
    whole = [w for w, integer in zip(sources, integers) if integer]
    # The core's own name for it (None: not compressed, which its fast path takes).
    wire = getattr(compression, "wire_dtype", compression)
    options: dict[str, Any] = {"compression": wire, "prescale": prescale,
                               "postscale": postscale}
    if apart:
        options["out"] = [r for r, integer in zip(results, integers) if not integer]
    calls = [(floats, op_name, options)]
    if whole:
        calls.append((whole, "sum" if op_name == "avg" else op_name, {}))
    handle: Any
    if submitted is None:
        handle = ringlet.Handle([ringlet.allreduce_group_async(
            arrays, op, process_set=chosen, **options) for arrays, op, options in calls],
            lambda: None)
    else:
        started = time.monotonic()
        for arrays, op, options in calls:
            ringlet.average_gradients(arrays, op=op, process_set=chosen, **options)
        handle = Ran(started - submitted, time.monotonic() - started)
    post = float(postscale) / (set_size(process_set) if op_name == "avg" else 1)

    def finish() -> list[np.ndarray]:
        for r, integer in zip(results, integers):
            if integer:
                np.copyto(r, np.trunc(r.astype(np.float64) * post), casting="unsafe")
        return [r.astype(o.dtype) if r.dtype != o.dtype else r
                for r, o in zip(results, originals)]

    return handle, finish


OUT_OF_PLACE_FROM = 1 << 12
"""Bytes from which a new result is reduced from the tensor where it is: below, a copy reduced
in place costs less than the out-of-place call's bookkeeping (about a microsecond)."""


def readable_where_it_is(array: np.ndarray) -> bool:
    """Whether the core can read ``array`` where it is (an out-of-place input)."""
    flags = array.flags
    return bool(flags.c_contiguous and flags.aligned and array.dtype.isnative)


class Ran:
    """The handle of collectives that have run on the caller's thread: done, with their
    ``timing`` (seconds from submission until they started, seconds they ran), as a queued
    collective's handle gives it."""

    __slots__ = ("_timing",)

    def __init__(self, waited: float, ran: float) -> None:
        self._timing = (max(waited, 0.0), ran)

    def done(self) -> bool:
        return True

    def wait(self) -> None:
        return None

    def timing(self) -> tuple[float, float]:
        return self._timing


def deliver(backend: Backend, tensors: Sequence[Any], results: list[np.ndarray],
            in_place: bool) -> list[Any]:
    """An allreduce's results as the caller's tensors: written into them (in place), or new."""
    if in_place:
        for tensor, result in zip(tensors, results):
            backend.assign(tensor, result)
        return list(tensors)
    return [backend.tensor(r, t) for r, t in zip(results, tensors)]



WIDER = {np.dtype(narrow): np.dtype(wide) for narrow, wide in (
    (np.int8, np.int32), (np.uint8, np.int32), (np.int16, np.int32), (np.uint16, np.int32),
    (np.uint32, np.int64))}
"""Integer types reduced in a wider one the core reduces (exactly: the ranks' values fit)."""



def prescaled_integers(array: np.ndarray, prescale: float) -> np.ndarray:
    """``array`` times ``prescale`` in float64, truncated toward zero (a new C array)."""
    scaled = np.trunc(array.astype(np.float64) * float(prescale))
    return np.ascontiguousarray(scaled.astype(array.dtype))


def scale_floats(array: np.ndarray, factor: float) -> np.ndarray:
    """``array`` times ``factor`` as Horovod scales floats: in the array's own precision, and
    16-bit floats in float32 (rounding ``factor`` to 16 bits first would be coarser)."""
    if array.dtype.itemsize == 2:
        return (array.astype(np.float32) * np.float32(factor)).astype(array.dtype)
    return array * array.dtype.type(factor)


def reducible_in_place(array: np.ndarray) -> bool:
    return bool(array.flags.carray and array.dtype.isnative)
