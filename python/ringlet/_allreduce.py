"""``ringlet.allreduce``: the fast path in Rust, and here the checks that explain bad calls."""

from __future__ import annotations

from typing import Any

import numpy as np

from . import _core, calibration
from ._arrays import as_array, check_out, fill, refused_together
from ._collectives import check_algorithm
from ._dtypes import check_op, dtype_name
from ._membership import ProcessSet, place


def allreduce(
    x: np.ndarray, op: str = "sum", *, out: np.ndarray | None = None, algorithm: str = "auto",
    process_set: ProcessSet | None = None,
) -> np.ndarray:
    """Reduce ``x`` element-wise across all ranks and return the result on every rank.

    ``op`` is "sum", "avg", "min", "max" or "prod" ("avg" is the sum divided by the number of
    ranks; integers truncate toward zero). ``x`` may have any shape and layout; with
    ``out=x`` the reduction happens in place with no copy (x must then be C-contiguous and
    writeable). Otherwise the result goes to ``out`` or a new array, and a C-contiguous ``x``
    is only read, where it is: no copy of it precedes the collective. ``algorithm`` is "auto"
    or one of ``ringlet.ALGORITHMS`` (for example "ring", "halving_doubling", or "mpi", the MPI
    library's own MPI_Allreduce, which has no 16-bit floats). With ``process_set`` (from
    ``ringlet.add_process_set``), only its members take part and "avg" divides by its size.

    Every rank gets bit-identical results. The GIL is released while communicating.
    """
    # The core takes the call unless it needs the checks below (which also name a thread the
    # first time it calls: see ringlet._runtime.register_thread).
    if process_set is None or type(process_set) is ProcessSet:
        set_id = 0 if process_set is None else process_set.id
        result = _core.allreduce_fast(x, op, out, algorithm, set_id)
        if result is not None:
            return result
    return _allreduce_checked(x, op, out, algorithm, process_set)


def prepare(x: Any, op: str, out: Any, algorithm: str,
            process_set: int = 0) -> tuple[np.ndarray, str]:
    """Every check of an allreduce's arguments, then the array to reduce in (a copy of ``x``,
    or ``out`` holding ``x``) and the dtype's name. Argument errors are shared with the other
    ranks of ``process_set`` (by id) before they propagate (see ``refused_together``)."""
    with refused_together("allreduce", process_set=process_set):
        x = as_array(x, "allreduce")
        name = dtype_name(x.dtype)
        check_op(op)
        check_algorithm(algorithm, "allreduce")
        _core.check_algorithm("allreduce", algorithm, name, op)
        target = None if out is None else check_out(x, out, "allreduce")
    return fill(x, target), name


def _allreduce_checked(x: Any, op: str, out: Any, algorithm: str,
                       process_set: ProcessSet | None) -> np.ndarray:
    """Everything the fast path does not take: validation with clear errors, copies, and
    process sets."""
    where = place(process_set)
    result, name = prepare(x, op, out, algorithm, where.id)
    if algorithm == "auto" and where.id == 0:
        # The core decides, with the model's parameters, which the first call installs
        # (collective; a process set's were installed when it was added).
        calibration.ensure_installed()
    _core.allreduce(result, name, op, algorithm, where.id)
    return result
