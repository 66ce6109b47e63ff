"""The Jupyter tests start ipyparallel clusters themselves (single process, no mpirun around
them); ipp_processes.py checks that nothing of a cluster survives its stop. engines/ holds what
runs on each engine, tested under mpirun (tests/run_mpi_suite.py), so a plain run leaves it out."""

from __future__ import annotations

import os

import pytest

collect_ignore = [] if "RINGLET_TEST_RANK" in os.environ else ["engines"]


@pytest.fixture(autouse=True)
def private_calibration_cache(tmp_path_factory, monkeypatch):
    """Engines inherit the environment: keep their calibration out of the user's cache."""
    monkeypatch.setenv("RINGLET_CACHE_DIR", str(tmp_path_factory.getbasetemp() / "cache"))
