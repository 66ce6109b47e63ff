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


def test_ringlet_kernels_caps_the_simd_level_and_an_unknown_level_is_refused():
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OMPI_COMM", "PMIX_"))}
    code = "import ringlet; ringlet.init(); print(ringlet._core.kernel_level())"
    capped = subprocess.run([sys.executable, "-c", code], cwd=ROOT, text=True,
                            capture_output=True, timeout=120,
                            env={**env, "RINGLET_KERNELS": "generic"})
    assert capped.returncode == 0, capped.stderr
    assert capped.stdout.strip() == "generic"
    bad = subprocess.run([sys.executable, "-c", code], cwd=ROOT, text=True,
                         capture_output=True, timeout=120,
                         env={**env, "RINGLET_KERNELS": "avx9000"})
    assert bad.returncode != 0
    assert 'RINGLET_KERNELS="avx9000" is not a kernel level; accepted: "generic", "avx2", ' \
           '"avx512"' in bad.stderr


def test_a_process_started_by_another_mpis_launcher_is_refused():
    """Hydra (MPICH's launcher) sets PMI_SIZE; an Open MPI build then sees a job of 1. ringlet
    says so instead of running as N separate one-rank jobs."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OMPI_COMM", "PMIX_"))}
    result = subprocess.run(
        [sys.executable, "-c", "import ringlet; ringlet.init()"], cwd=ROOT, text=True,
        capture_output=True, timeout=120, env={**env, "PMI_SIZE": "4", "PMI_RANK": "1"},
    )
    assert result.returncode != 0
    assert "RingletError: this process is one of 4 started by a PMI launcher" in result.stderr
    assert "RINGLET_LIBMPI=" in result.stderr and "rebuild it against that MPI" in result.stderr


def test_the_mpi_library_ringlet_runs_on_is_the_one_it_was_built_with():
    result = run_python(
        "import ringlet; running, built = ringlet._core.mpi_library()\n"
        "print(built); print(running.splitlines()[0])\n"
    )
    assert result.returncode == 0, result.stderr
    built, running = result.stdout.splitlines()
    family = "Open MPI" if built.startswith("Open MPI") else "MPICH"
    assert built.startswith(family) and family in running, (built, running)


def test_the_wait_policy_comes_from_the_environment():
    code = "from ringlet import _core; print(*_core.wait_policy())"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OMPI_COMM", "PMIX_"))}
    env.update(RINGLET_WAIT_SPIN_US="7", RINGLET_WAIT_SLEEP_US="90")
    result = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, text=True,
                            capture_output=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["7", "90"]


def test_settings_say_whether_calls_are_checked():
    """``ringlet.settings()["consistency_check"]`` is RINGLET_CHECK as the core read it (what
    ringlet.hvd's lone allreduces rely on)."""
    code = "import ringlet; print(ringlet.settings()['consistency_check'])"
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("OMPI_COMM", "PMIX_")) and k != "RINGLET_CHECK"}
    for value, expected in ((None, "True"), ("0", "False"), ("1", "True")):
        extra = {} if value is None else {"RINGLET_CHECK": value}
        result = subprocess.run([sys.executable, "-c", code], cwd=ROOT, text=True,
                                capture_output=True, timeout=120, env={**env, **extra})
        assert result.returncode == 0, result.stderr
        assert result.stdout.strip() == expected, (value, result.stdout)
