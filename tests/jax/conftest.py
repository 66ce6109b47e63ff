"""The JAX tests run with 64-bit types on (the fixtures come from tests/mpi_fixtures.py, loaded
by tests/run_mpi_suite.py)."""

from __future__ import annotations

import jax

jax.config.update("jax_enable_x64", True)
