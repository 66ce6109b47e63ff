"""Run pytest as one rank of an mpirun job.

Rank 0 reports on the terminal; the other ranks write to build/test-logs/, which
tests/run_mpi_suite.py prints if that rank fails. Each rank writes a JUnit report, so the
suite counts every rank's results, not only rank 0's.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

RANK_VARIABLES = ("OMPI_COMM_WORLD_RANK", "PMI_RANK", "PMIX_RANK", "SLURM_PROCID")


def launcher_rank() -> int:
    for name in RANK_VARIABLES:
        if name in os.environ:
            return int(os.environ[name])
    return 0


def main() -> int:
    rank = launcher_rank()
    report_dir = Path(os.environ.get("RINGLET_TEST_REPORTS", "build/test-reports"))
    report_dir.mkdir(parents=True, exist_ok=True)
    if rank != 0:
        log = open(report_dir / f"rank{rank}.log", "w")  # kept open for the whole process
        os.dup2(log.fileno(), 1)
        os.dup2(log.fileno(), 2)
    args = [*sys.argv[1:], f"--junitxml={report_dir / f'rank{rank}.xml'}", "-p", "no:cacheprovider"]
    return pytest.main(args)


if __name__ == "__main__":
    sys.exit(main())
