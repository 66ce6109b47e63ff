"""The TensorFlow tests run under mpirun like tests/python (one pytest process per rank, the
same tests in the same order), with its fixtures and NumPy references."""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

_spec = importlib.util.spec_from_file_location(
    "mpi_conftest", Path(__file__).resolve().parents[1] / "python" / "conftest.py"
)
assert _spec is not None and _spec.loader is not None
_shared = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_shared)

# The fixtures, re-exported so that pytest finds them here.
comm = _shared.comm
rank = _shared.rank
size = _shared.size
_ringlet_ready = _shared._ringlet_ready
reference = _shared.reference
same_on_every_rank = _shared.same_on_every_rank
