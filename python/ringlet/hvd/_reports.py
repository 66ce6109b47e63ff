"""What name matching says, in the core's words: the stall warning's setting and messages
(src/runtime/stall.rs, RINGLET_STALL_WARNING), how ranks are named, and the mismatch and join
errors (src/runtime/consistency.rs), after Horovod's first words where scripts and Horovod's
tests match them ("Mismatched allreduce tensor shapes")."""

from __future__ import annotations

import json
import math
import os
import warnings
from collections.abc import Sequence
from typing import Any

__all__ = ["STALL_VARIABLE", "join_refusal", "mismatch", "missing_report", "rank_list",
           "stall_warning_from_environment", "waiting_report"]


STALL_VARIABLE = "RINGLET_STALL_WARNING"
"""The core's stall warning (runtime/process.rs), which name matching shares."""
_STALL_DEFAULT = 60.0
_RETIRED_STALL_VARIABLE = "RINGLET_HVD_STALL_SECONDS"


def stall_warning_from_environment() -> float | None:
    """``RINGLET_STALL_WARNING`` read as the core reads it: seconds (60 when unset), 0 or less
    for no warning, anything else not a number is an error. ``RINGLET_HVD_STALL_SECONDS``,
    name matching's own variable before, is ignored with a warning that says so."""
    if os.environ.get(_RETIRED_STALL_VARIABLE) is not None:
        warnings.warn(f"{_RETIRED_STALL_VARIABLE} is no longer read: name matching warns of a "
                      f"stall after {STALL_VARIABLE} seconds, as the core does", FutureWarning,
                      stacklevel=2)
    text = os.environ.get(STALL_VARIABLE)
    if text is None:
        return _STALL_DEFAULT
    try:
        value = float(text.strip())
    except ValueError:
        value = math.nan
    if not math.isfinite(value):
        raise ValueError(f"{STALL_VARIABLE}={json.dumps(text)} is not a number of seconds")
    return value if value > 0 else None


def seconds_text(value: float) -> str:
    """Seconds as the core prints them (Rust's f64 Display: 60, 0.5)."""
    text = repr(float(value))
    return text[:-2] if text.endswith(".0") else text


def rank_list(ranks: Sequence[int]) -> str:
    """"rank 3", "ranks 0-2,5": the core's way of naming ranks (runtime/consistency.rs)."""
    spans: list[list[int]] = []
    for r in ranks:
        if spans and spans[-1][1] + 1 == r:
            spans[-1][1] = r
        else:
            spans.append([r, r])
    text = ",".join(str(a) if a == b else f"{a}-{b}" for a, b in spans)
    return f"{'rank' if len(ranks) == 1 else 'ranks'} {text}"



def waiting_report(rank: int, waited: float, label: str, peer: int, limit: float) -> str:
    """What a waiting rank says (the core's first stall message)."""
    return (f"ringlet: rank {rank} has waited {waited:.0f} s in {label} for rank {peer}, which "
            f"has not joined it (or is itself waiting); {STALL_VARIABLE}={seconds_text(limit)}")


def missing_report(label: str, waited: float, missing: Sequence[int]) -> str:
    """What rank 0 says of the ranks missing (the core's second stall message)."""
    return (f"ringlet: {label} has waited {waited:.0f} s: rank(s) "
            f"{', '.join(map(str, missing))} have not joined it (every other rank reports "
            "waiting)")


def join_refusal(absent: Sequence[int], what: str) -> str:
    """Why ``what`` cannot run while ``absent`` have joined (the core's words)."""
    has = "has" if len(absent) == 1 else "have"
    return (f"{rank_list(absent)} {has} joined: until every rank has, the others can only make "
            f"sum and avg allreduces; {what} cannot run")


def mismatch(collective: str, name: str,
             passed: dict[int, tuple[tuple[Any, ...], str]]) -> str:
    """Horovod's error for a name passed with different arguments ("Mismatched allreduce
    tensor shapes", "... data types", ...), naming what each rank passed."""
    signatures = [value[0] for value in passed.values()]
    if len({len(_dtypes_of(s)) for s in signatures}) > 1:
        what = "numbers of tensors"
    elif len({_dtypes_of(s) for s in signatures}) > 1:
        what = "data types"
    elif len({tuple(t for t in s if isinstance(t[1], tuple)) for s in signatures}) > 1:
        what = "tensor shapes"
    else:
        differ = {a for s in signatures for a, b in s if not isinstance(b, tuple)
                  and len({dict(t for t in x if not isinstance(t[1], tuple)).get(a)
                           for x in signatures}) > 1}
        what = " and ".join(sorted(differ)) or "arguments"
    groups: dict[str, list[int]] = {}
    for rank, value in passed.items():
        groups.setdefault(value[1], []).append(rank)
    return (f"Mismatched {collective} {what} for the operation named {name!r}: "
            + "; ".join(f"{rank_list(ranks)} passed {detail}" for detail, ranks in groups.items()))


def _dtypes_of(signature: tuple[Any, ...]) -> tuple[str, ...]:
    return tuple(dtype for dtype, shape in signature if isinstance(shape, tuple))

