"""Without shared memory ringlet warns once (when it could not be had) and runs on the
point-to-point algorithms: a /dev/shm too small for the segment (in a mount namespace of its
own, as in a container), and RINGLET_SHM=0. Whole jobs, run with plain pytest."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

JOB = """
    import warnings
    import numpy as np
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        import ringlet
        ringlet.init()
    status = ringlet.shared_memory()
    x = ringlet.allreduce(np.arange(100_000, dtype=np.float32))
    assert (x == 2 * np.arange(100_000, dtype=np.float32)).all()
    assert not ringlet.is_shared(ringlet.empty(10))  # an ordinary array
    try:
        ringlet.allreduce(np.ones(4), algorithm="shm")
    except ValueError as e:
        refused = str(e)
    ringlet.barrier()  # still in step after the refusal
    warned = [str(w.message) for w in caught if "shared memory" in str(w.message)]
    print(f"rank {ringlet.rank()}: {status.available} | {status.reason} | {len(warned)} | "
          f"{refused}", flush=True)
"""


def run(command: list[str], env: dict[str, str]) -> str:
    path = ROOT / "build" / f"shm_fallback_{os.getpid()}.py"
    path.parent.mkdir(exist_ok=True)
    path.write_text(textwrap.dedent(JOB))
    try:
        result = subprocess.run(
            [*command, "mpirun", "-n", "2", sys.executable, str(path)], cwd=ROOT,
            env={**os.environ, **env}, capture_output=True, text=True, timeout=120,
        )
    finally:
        path.unlink(missing_ok=True)
    assert result.returncode == 0, result.stdout + result.stderr
    return result.stdout


def lines(output: str) -> list[str]:
    """Each rank's report (the ranks' prints may share a line)."""
    return sorted(re.findall(r"rank \d: .*? \| .*? \| \d \| .*?\(see ringlet\.shared_memory\(\)\)",
                             output))


def test_a_small_dev_shm_gives_a_warning_and_the_point_to_point_algorithms() -> None:
    if os.geteuid() != 0 or shutil.which("unshare") is None:
        pytest.skip("mounting a small /dev/shm needs root and unshare")
    # Room for the MPI library's own segments (MPICH over UCX takes 4 MiB per rank at
    # MPI_Init, and fails with less), not for ringlet's 4 MiB per rank plus its margin.
    tiny = "mount -t tmpfs -o size=16m tmpfs /dev/shm && exec \"$@\""
    output = run(["unshare", "-m", "sh", "-c", tiny, "sh"], {})
    got = lines(output)
    assert len(got) == 2, output
    for line in got:
        available, reason, warnings, refused = line.split(": ", 1)[1].split(" | ")
        assert available == "False"
        assert reason.startswith("not enough shared memory:") and "/dev/shm has" in reason
        assert warnings == "1"  # warned once
        assert 'algorithm "shm" cannot run here' in refused


def test_ringlet_shm_0_turns_it_off_without_a_warning() -> None:
    got = lines(run([], {"RINGLET_SHM": "0"}))
    assert len(got) == 2
    for line in got:
        available, reason, warnings, refused = line.split(": ", 1)[1].split(" | ")
        assert (available, reason, warnings) == ("False", "turned off by RINGLET_SHM=0", "0")
        assert "cannot run here" in refused
