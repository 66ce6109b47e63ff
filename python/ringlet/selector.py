"""Which algorithm ``algorithm="auto"`` runs, and why.

Every decision is made in the Rust core (``src/auto``) from one alpha-beta-gamma (Hockney)
model: alpha seconds per message, beta per byte moved between two ranks, gamma per byte
combined (per dtype), with a second alpha and beta for what crosses a node's link. Each
algorithm declares its cost next to its code (messages, bytes sent and bytes combined on its
busiest rank inside a node, and what crosses the busiest node's link; the formulas of Thakur,
Rabenseifner & Gropp, "Optimization of Collective Communication Operations in MPICH"), so the
core knows every registered algorithm without a list of its own. ``ringlet.calibration``
measures the parameters on the first ``auto`` call and installs them; the core then compiles a
size table per communicator, dtype and op, so a decision is a binary search.

The table is refined on the real calls (``RINGLET_EXPLORE=0`` turns it off, and so does
``RINGLET_CHECK=0``, without which nothing would catch ranks out of step): each size range
names a runner-up that the model predicts close to the winner; the core runs the winner, tries
the runner-up on the 8th call in the range, then the 16th, 32nd, ... (at most one call in
1024), and when the runner-up was at least 10% faster on the slowest rank (an allreduce of the
two timings' maxima, so every rank decides alike) the two trade places. :func:`refinements`
shows what it learned.

Overrides (read when a communicator's table is built, at its first ``auto`` call):

- ``algorithm=`` on the call;
- ``RINGLET_ALGORITHM=ring`` (any registered name) for every ``auto`` call;
- ``RINGLET_AUTO_TABLE="recursive_doubling:32K,halving_doubling:8M,pipelined_ring"``: explicit
  thresholds (each algorithm up to and including its size, the last for everything larger);
- ``RINGLET_CALIBRATE=0``: no calibration, the model with built-in parameters only.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from . import _core, calibration
from ._dtypes import SUPPORTED_DTYPES, check_op, dtype_name
from ._membership import ProcessSet, place
from ._runtime import init

__all__ = [
    "ALGORITHMS",
    "Candidate",
    "Explanation",
    "calibrate",
    "choice",
    "explain",
    "prepare",
    "refinements",
]

ALGORITHMS = tuple(_core.algorithms("allreduce"))
"""Every algorithm ``allreduce(..., algorithm=...)`` accepts besides "auto", as the core
registers them."""

SIMULATE_UP_TO = 512
"""explain() simulates each candidate on the job's own placement up to this many ranks (a flat
ring's messages grow as the square of the ranks)."""

REASONS = {
    "one rank": "one rank: every algorithm is a no-op",
    "table": "the decision table's, as refined on real calls",
    "environment": "set by the environment",
    "model": "lowest predicted time; auto has not run in this process yet",
}
"""What a choice rests on, as the core reports it, in words."""


def prepare() -> None:
    """Load or run the calibration and install it, so that ``auto`` can decide in the core.
    Collective: call it on every rank at the same point (``init``, adding a process set, and
    the first ``auto`` call do)."""
    init()
    calibration.ensure_installed()


def choice(nbytes: int, dtype: str = "float32", op: str = "sum", *,
           process_set: ProcessSet | None = None) -> str:
    """The algorithm ``auto`` runs now for an allreduce of ``nbytes`` of ``dtype`` under
    ``op``. On ringlet's communicator it installs the model first if it is not (collective
    then, as the first ``auto`` call is); a process set's members find it installed when the
    set was added."""
    where = place(process_set)
    if where.id == 0:
        prepare()
    return _core.explain(int(nbytes), dtype, op, process_set=where.id).choice


def calibrate() -> calibration.Calibration:
    """Measure again on the machine ringlet runs on (collective), save the result and install
    it. Returns the :class:`ringlet.calibration.Calibration` (``.model()`` has its numbers)."""
    init()
    return calibration.recalibrate()


@dataclass
class Candidate:
    algorithm: str
    model_us: float
    correction: float
    predicted_us: float
    # The simulator's time with the same parameters, on the same placement (None where the
    # algorithm needs MPI or shared memory, which the simulator does not model).
    simulated_us: float | None = None


@dataclass
class Explanation:
    nbytes: int
    dtype: str
    op: str
    size: int
    choice: str
    reason: str
    candidates: list[Candidate]
    parameters: str

    def __str__(self) -> str:
        lines = [
            f"allreduce of {_human(self.nbytes)} {self.dtype} ({self.op}) on {self.size} ranks",
            f"  {'algorithm':<20}{'model us':>12}{'measured/model':>16}{'predicted us':>14}"
            f"{'simulated us':>14}",
        ]
        for c in self.candidates:
            mark = "  <- chosen" if c.algorithm == self.choice else ""
            simulated = "-" if c.simulated_us is None else f"{c.simulated_us:.1f}"
            lines.append(
                f"  {c.algorithm:<20}{c.model_us:>12.1f}{c.correction:>16.2f}"
                f"{c.predicted_us:>14.1f}{simulated:>14}{mark}"
            )
        lines.append(f"  choice: {self.choice} ({self.reason})")
        lines.append(f"  parameters: {self.parameters}")
        return "\n".join(lines)


def _human(nbytes: int) -> str:
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if nbytes >= scale:
            return f"{nbytes / scale:.4g} {unit}"
    return f"{nbytes} B"


def explain(x_or_nbytes: Any, op: str = "sum", dtype: str | None = None, *,
            process_set: ProcessSet | None = None) -> Explanation:
    """Print and return each candidate's predicted time for an allreduce and the choice.

    ``x_or_nbytes`` is an array (its size and dtype are used) or a byte count (``dtype``
    defaults to float32). Not collective. The parameters are the ones installed in this
    process (``auto`` has run, or ``calibrate``); else the cached calibration for this
    communicator, if any (read now); else the built-in ones. Which of the three is said in the
    output. The times, the choice and the simulator's figures all come from the core in one
    call.
    """
    init()
    if isinstance(x_or_nbytes, (int, np.integer)):
        nbytes, name = int(x_or_nbytes), dtype or "float32"
        if name not in SUPPORTED_DTYPES:
            raise TypeError(f"unsupported dtype {name!r}; supported: {', '.join(SUPPORTED_DTYPES)}")
    else:
        array = np.asarray(x_or_nbytes)
        nbytes, name = array.nbytes, dtype_name(array.dtype)
    check_op(op)
    where = place(process_set)
    used = calibration.installed()
    if used is None:
        used = calibration.cached()
    explained = _core.explain(
        nbytes, name, op,
        parameters=None if used is calibration.installed() else used.parameters,
        process_set=where.id, simulate_up_to=SIMULATE_UP_TO)
    candidates = [
        Candidate(row.algorithm, row.model_seconds * 1e6, row.correction,
                  row.predicted_seconds * 1e6,
                  None if row.simulated_seconds is None else row.simulated_seconds * 1e6)
        for row in explained.candidates
    ]
    explanation = Explanation(nbytes, name, op, where.size, explained.choice,
                              REASONS[explained.basis], candidates, used.source)
    print(explanation)
    return explanation


def refinements(process_set: ProcessSet | None = None) -> list[dict[str, Any]]:
    """What ``auto`` learned on real calls since the communicator's table was built: per size
    range it has played, the algorithm it runs now, its calls, how often it tried the range's
    runner-up, and how often the two traded places (a runner-up takes over when it was faster
    by 10% on the slowest rank). Local; every rank holds the same."""
    rows = []
    where = place(process_set)
    for row in _core.auto_refinements(where.id):
        rows.append({"dtype": row.dtype, "op": row.op, "up_to_bytes": row.upper_bytes,
                     "algorithm": row.algorithm, "calls": row.calls, "tries": row.tries,
                     "switches": row.switches})
    return rows
