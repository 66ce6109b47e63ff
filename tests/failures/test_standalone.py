"""A single process without mpirun (MPI singleton), as in a plain `python script.py` run."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def run_python(code: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OMPI_COMM", "PMIX_"))}
    return subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, text=True,
                          capture_output=True, timeout=120)


def test_import_and_allreduce_need_no_ml_dtypes():
    result = run_python(
        "import sys; sys.modules['ml_dtypes'] = None\n"  # any import of it now fails
        "import numpy as np, ringlet\n"
        "print(ringlet.allreduce(np.arange(3.0), 'sum').tolist(), ringlet.size())\n"
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["[0.0,", "1.0,", "2.0]", "1"]


def test_ringlet_finalizes_mpi_only_when_it_initialized_it():
    ours = run_python(
        "import ringlet; ringlet.init(); print(ringlet.owns_mpi())\n"
        "from mpi4py import MPI; print(MPI.Is_initialized(), MPI.Is_finalized())\n"
    )
    assert ours.returncode == 0, ours.stderr
    assert ours.stdout.split() == ["True", "True", "False"]
    theirs = run_python(
        "from mpi4py import MPI\n"
        "import ringlet; ringlet.init(); print(ringlet.owns_mpi())\n"
        "ringlet.shutdown(); print(MPI.Is_finalized()); print(MPI.COMM_WORLD.allreduce(1))\n"
    )
    assert theirs.returncode == 0, theirs.stderr
    assert theirs.stdout.split() == ["False", "False", "1"]
