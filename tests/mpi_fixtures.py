"""The pytest plugin of every suite that runs under mpirun (one pytest process per rank):
tests/run_mpi_suite.py loads it (``-p mpi_fixtures``) for tests/collectives, tests/hvd,
tests/jax and tests/jupyter/engines, and their tests import its helpers by name
(``from mpi_fixtures import exact_input, reference``).

Every rank collects the same tests in the same order, so collectives inside tests line up.
Inputs are derived from (seed, rank), so each rank can rebuild every other rank's input and
compute the NumPy reference locally, independently of any communication.
"""

from __future__ import annotations

import numpy as np
import pytest
from mpi4py import MPI

import ringlet

ALL_DTYPES = ("float32", "float64", "float16", "bfloat16", "int32", "int64")
NATIVE_MPI_DTYPES = ("float32", "float64", "int32", "int64")


def np_dtype(name: str) -> np.dtype:
    if name == "bfloat16":
        import ml_dtypes

        return np.dtype(ml_dtypes.bfloat16)
    return np.dtype(name)


def exact_input(seed: int, rank: int, shape: tuple[int, ...], dtype: str, op: str) -> np.ndarray:
    """Small integers: every reduction over up to 8 ranks is exact in every dtype."""
    rng = np.random.default_rng([seed, rank])
    if op == "prod":
        values = rng.choice([1, 1, 1, 2, -1], size=shape)
    else:
        values = rng.integers(-8, 9, size=shape)
    return values.astype(np_dtype(dtype))


def reference(inputs: list[np.ndarray], op: str) -> np.ndarray:
    """The reduction of all ranks' inputs, computed by NumPy in the inputs' dtype."""
    stack = np.stack(inputs)
    dtype = stack.dtype
    if op in ("sum", "avg"):
        total = np.sum(stack, axis=0, dtype=dtype)
        if op == "sum":
            return total
        n = len(inputs)
        if dtype.kind == "i":
            # Integer avg truncates toward zero, like C (and Horovod's Average).
            return (np.sign(total) * (np.abs(total) // n)).astype(dtype)
        return (total / np.asarray(n, dtype=dtype)).astype(dtype)
    if op == "prod":
        return np.prod(stack, axis=0, dtype=dtype)
    if op == "min":
        return np.min(stack, axis=0)
    return np.max(stack, axis=0)


@pytest.fixture(scope="session")
def comm() -> MPI.Intracomm:
    return MPI.COMM_WORLD


@pytest.fixture(scope="session")
def rank(comm: MPI.Intracomm) -> int:
    return comm.Get_rank()


@pytest.fixture(scope="session")
def size(comm: MPI.Intracomm) -> int:
    return comm.Get_size()


@pytest.fixture(autouse=True)
def _ringlet_ready():
    """Each test starts with ringlet on COMM_WORLD and leaves no rank behind."""
    ringlet.init()
    yield
    MPI.COMM_WORLD.Barrier()


def same_on_every_rank(comm: MPI.Intracomm, array: np.ndarray) -> bool:
    mine = array.tobytes()
    return all(other == mine for other in comm.allgather(mine))


def python_progress_during(work) -> tuple[int, float]:
    """(how often another Python thread ran, seconds) while ``work()`` ran: a call that holds
    the GIL leaves the other thread at 0."""
    import threading
    import time

    ticks = 0
    stop = threading.Event()

    def count() -> None:
        nonlocal ticks
        while not stop.is_set():
            ticks += 1
            time.sleep(0)

    counter = threading.Thread(target=count)
    counter.start()
    time.sleep(0.01)
    before = ticks
    started = time.perf_counter()
    work()
    elapsed = time.perf_counter() - started
    during = ticks - before
    stop.set()
    counter.join()
    return during, elapsed
