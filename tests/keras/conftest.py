"""The Keras tests run under mpirun like tests/python (one pytest process per rank, the same
tests in the same order), with its fixtures, on the Keras backend that KERAS_BACKEND names
(jax, torch or tensorflow; make test-keras runs the suite once per backend)."""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras

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
same_on_every_rank = _shared.same_on_every_rank

BACKEND = keras.backend.backend()


def pytest_report_header(config):
    return f"keras {keras.__version__}, backend {BACKEND}"


def pytest_configure(config):
    # Keras 3.15's Variable.__array__ takes no copy keyword; NumPy 2 warns about it on every
    # np.array(variable), from inside Keras (get_config, numpy()): not ours to fix.
    config.addinivalue_line(
        "filterwarnings",
        "ignore:__array__ implementation doesn't accept a copy keyword:DeprecationWarning")
