"""pytest plugin (``-p _hvd_report``): each rank writes what happens to every test as JSON lines.

One line per event, flushed as it happens, so that a rank killed by pytest-timeout or by the
runner's time limit still leaves which tests ran, and which one it was in. The file is
``$RINGLET_TEST_REPORTS/<test file stem>.rank<N>.jsonl``; run.py reads it.

``tf.test.TestCase`` has a method ``test_session`` (a helper, not a test); pytest collects it
and skips it "Not a test.", so it is dropped here.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

NOT_TESTS = {"test_session"}
RANK_VARIABLES = ("OMPI_COMM_WORLD_RANK", "PMI_RANK", "PMIX_RANK", "SLURM_PROCID")
_out: Any = None


def _rank() -> int:
    return next((int(os.environ[v]) for v in RANK_VARIABLES if v in os.environ), 0)


def _write(**event: Any) -> None:
    if _out is not None:
        _out.write(json.dumps(event) + "\n")
        _out.flush()


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    dropped = [item for item in items if item.name in NOT_TESTS]
    if dropped:
        items[:] = [item for item in items if item.name not in NOT_TESTS]
        config.hook.pytest_deselected(items=dropped)


def pytest_collection_finish(session: pytest.Session) -> None:
    global _out
    files = sorted({Path(str(item.path)).stem for item in session.items})
    directory = Path(os.environ.get("RINGLET_TEST_REPORTS", "build/horovod-upstream"))
    directory.mkdir(parents=True, exist_ok=True)
    name = files[0] if len(files) == 1 else "session"
    _out = open(directory / f"{name}.rank{_rank()}.jsonl", "w")  # open for the whole session
    _write(event="collected", tests=[item.nodeid for item in session.items])


def pytest_runtest_logstart(nodeid: str, location: Any) -> None:
    _write(event="start", nodeid=nodeid)


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    context = getattr(report, "context", None)  # a SubtestReport's: graph_mode or eager_mode
    if report.skipped and isinstance(report.longrepr, tuple):
        text = report.longrepr[2]
    else:
        text = report.longreprtext if report.failed else ""
    _write(event="report", nodeid=report.nodeid, when=report.when, outcome=report.outcome,
           subtest=None if context is None else (context.msg or str(context.kwargs)),
           duration=round(report.duration, 3), text=text[-8000:])


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    global _out
    _write(event="finish", exitstatus=int(exitstatus))
    if _out is not None:
        _out.close()
        _out = None
