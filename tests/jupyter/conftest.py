"""The Jupyter tests start ipyparallel clusters themselves (single process, no mpirun around
them); ipp_processes.py checks that nothing of a cluster survives its stop."""

from __future__ import annotations

import pytest


@pytest.fixture(autouse=True)
def private_calibration_cache(tmp_path_factory, monkeypatch):
    """Engines inherit the environment: keep their calibration out of the user's cache."""
    monkeypatch.setenv("RINGLET_CACHE_DIR", str(tmp_path_factory.getbasetemp() / "cache"))
