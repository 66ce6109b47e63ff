"""The Keras tests run under mpirun like tests/collectives (one pytest process per rank, the same
tests in the same order), with its fixtures, on the Keras backend that KERAS_BACKEND names
(jax, torch or tensorflow; make test-keras runs the suite once per backend)."""

from __future__ import annotations

import os

os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras

BACKEND = keras.backend.backend()


def pytest_report_header(config):
    return f"keras {keras.__version__}, backend {BACKEND}"


def pytest_configure(config):
    # Keras 3.15's Variable.__array__ takes no copy keyword; NumPy 2 warns about it on every
    # np.array(variable), from inside Keras (get_config, numpy()): not ours to fix.
    config.addinivalue_line(
        "filterwarnings",
        "ignore:__array__ implementation doesn't accept a copy keyword:DeprecationWarning")
