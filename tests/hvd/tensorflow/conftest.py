"""TensorFlow's own logging kept to warnings and errors (the fixtures come from
tests/mpi_fixtures.py, loaded by tests/run_mpi_suite.py)."""

from __future__ import annotations

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
