"""Run pytest as one rank of an mpirun job.

Rank 0 reports on the terminal; the other ranks write to build/test-logs/, which
tests/run_mpi_suite.py prints if that rank fails. Each rank writes a JUnit report, so the
suite counts every rank's results, not only rank 0's.

Each rank also keeps, in rankN.current, the id of the test it is running: a rank that
crashes (a signal, an abort) writes no report, and the suite names that test from this file.

Each rank has a temporary directory of its own (--basetemp), removed when it ends: under
pytest's shared default, /tmp/pytest-of-USER, every rank prunes the older numbered directories
as its session ends, all at once, and one rank's rmtree fails on a directory another rank is
emptying (a PytestWarning at exit, an error under -W error, after every test passed).
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
from pathlib import Path

import pytest

RANK_VARIABLES = ("OMPI_COMM_WORLD_RANK", "PMI_RANK", "PMIX_RANK", "SLURM_PROCID")


def launcher_rank() -> int:
    for name in RANK_VARIABLES:
        if name in os.environ:
            return int(os.environ[name])
    return 0


class CurrentTest:
    """Keeps the id of the running test in a file, so a crash can be traced to it."""

    def __init__(self, path: Path) -> None:
        self.path = path

    @pytest.hookimpl(tryfirst=True)
    def pytest_runtest_logstart(self, nodeid: str, location: object) -> None:
        self.path.write_text(nodeid + "\n")

    def pytest_sessionfinish(self) -> None:
        self.path.write_text("(session finished)\n")


def main() -> int:
    rank = launcher_rank()
    # Tells a folder's conftest that this pytest is one rank of a job (tests/jupyter collects
    # its engines/ tests only then).
    os.environ["RINGLET_TEST_RANK"] = str(rank)
    report_dir = Path(os.environ.get("RINGLET_TEST_REPORTS", "build/test-reports"))
    report_dir.mkdir(parents=True, exist_ok=True)
    if rank != 0:
        log = open(report_dir / f"rank{rank}.log", "w")  # kept open for the whole process
        os.dup2(log.fileno(), 1)
        os.dup2(log.fileno(), 2)
    plugins = [CurrentTest(report_dir / f"rank{rank}.current")]
    args = [*sys.argv[1:], f"--junitxml={report_dir / f'rank{rank}.xml'}", "-p", "no:cacheprovider"]
    if any(arg.startswith("--basetemp") for arg in args):
        return pytest.main(args, plugins=plugins)
    basetemp = tempfile.mkdtemp(prefix=f"ringlet-pytest-rank{rank}-")
    try:
        return pytest.main([*args, f"--basetemp={basetemp}"], plugins=plugins)
    finally:
        shutil.rmtree(basetemp, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
