"""Which algorithm ``algorithm="auto"`` runs.

For now a fixed rule measured on a 2-core Open MPI 4.1 node (benchmarks/RESULTS.md): recursive
doubling while latency dominates, the ring once bandwidth does. ``RINGLET_ALGORITHM`` overrides
it for every call.
"""

from __future__ import annotations

import os

from ._dtypes import SIXTEEN_BIT_FLOATS

ALGORITHMS = ("ring", "pipelined_ring", "halving_doubling", "recursive_doubling", "mpi")
"""Every algorithm ``allreduce(..., algorithm=...)`` accepts, besides "auto"."""

SMALL_MESSAGE_BYTES = 32 * 1024
"""Up to this size recursive doubling (log2 N rounds) beats the ring (2(N-1) rounds)."""


def check_algorithm(algorithm: str) -> str:
    if algorithm.__class__ is not str or (algorithm != "auto" and algorithm not in ALGORITHMS):
        raise ValueError(
            f"unknown algorithm {algorithm!r}; accepted: 'auto', "
            f"{', '.join(map(repr, ALGORITHMS))}"
        )
    return algorithm


def choose(nbytes: int, size: int, dtype: str, op: str) -> str:
    """The algorithm for an allreduce of ``nbytes`` over ``size`` ranks."""
    forced = os.environ.get("RINGLET_ALGORITHM")
    if forced and forced != "auto":
        check_algorithm(forced)
        if forced == "mpi" and dtype in SIXTEEN_BIT_FLOATS:
            return "ring"  # MPI cannot reduce 16-bit floats; the override cannot apply here.
        return forced
    if nbytes <= SMALL_MESSAGE_BYTES:
        return "recursive_doubling"
    return "ring"
