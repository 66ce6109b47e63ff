"""What ringlet.jupyter runs on each engine, under mpirun (no ipyparallel needed): the benchmark
measures every candidate as make bench does, in place and on the slowest rank's clock."""

from __future__ import annotations

import numpy as np
import pytest

import ringlet
from ringlet.jupyter import _benchmark_on_engine


def test_the_benchmark_calls_ringlet_in_place_like_mpi(monkeypatch):
    real_allreduce = ringlet.allreduce
    seen = []

    def spy(x, *args, out=None, **kwargs):
        seen.append(out is not None and np.shares_memory(out, x) and not x.any())
        return real_allreduce(x, *args, out=out, **kwargs)

    monkeypatch.setattr(ringlet, "allreduce", spy)
    _benchmark_on_engine(4096, "float32", 2, ["ring", "auto"])
    # Warm-up and 2 repeats of each: a new result array per call would time the allocator, and
    # a buffer that grows would not stay at the sum's fixed point.
    assert seen == [True] * 6


@pytest.mark.parametrize("nbytes", [8, 65536])
def test_the_benchmark_reports_the_slowest_rank_the_same_on_every_rank(comm, nbytes):
    medians = _benchmark_on_engine(nbytes, "float32", 3, ["ring"])
    assert set(medians) == {"ring", "mpi"}
    assert all(0 < seconds < 10 for seconds in medians.values())
    assert comm.allgather(medians) == [medians] * comm.size
