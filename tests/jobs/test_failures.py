"""Whole jobs that fail on purpose: each test launches mpirun and checks that the job ends, in
bounded time, with a non-zero exit and a message that says what happened. Run with plain
pytest (not under mpirun)."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def launch(script: str, ranks: int = 2, env: dict[str, str] | None = None, timeout: float = 60,
           on_start=None) -> tuple[int, str, float]:
    """Run ``script`` on ``ranks`` ranks; (exit code, stdout+stderr, seconds)."""
    path = ROOT / "build" / f"failure_{os.getpid()}_{time.monotonic_ns()}.py"
    path.parent.mkdir(exist_ok=True)
    path.write_text(textwrap.dedent(script))
    started = time.monotonic()
    process = subprocess.Popen(
        ["mpirun", "-n", str(ranks), sys.executable, str(path)],
        cwd=ROOT, env={**os.environ, **(env or {})},
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        start_new_session=True,
    )
    if on_start:
        on_start(process)
    try:
        output, _ = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        output, _ = process.communicate()
        pytest.fail(f"the job still ran after {timeout} s (it should have ended):\n{output}")
    finally:
        path.unlink(missing_ok=True)
    return process.returncode, output, time.monotonic() - started


LOOP = """
    import os, signal, time
    import numpy as np
    import ringlet
    x = np.ones(4 << 20, dtype=np.float32)
    ringlet.allreduce(x, out=x)
    print("ready", ringlet.rank(), flush=True)
"""


def test_a_rank_killed_mid_collective_ends_the_job():
    code, output, seconds = launch(LOOP + """
    for i in range(100000):
        if ringlet.rank() == 1 and i == 20:
            os.kill(os.getpid(), signal.SIGKILL)
        ringlet.allreduce(x, out=x, algorithm="ring")
    """)
    assert code != 0 and seconds < 60
    assert "signal 9" in output or "Killed" in output or "killed" in output, output


def test_an_uncaught_exception_on_one_rank_ends_the_job():
    code, output, seconds = launch(LOOP + """
    if ringlet.rank() == 1:
        raise RuntimeError("boom on rank 1")
    ringlet.allreduce(x, out=x)  # rank 0 would wait here forever
    """)
    assert code != 0 and seconds < 60
    assert "boom on rank 1" in output and "ending the job" in output, output


def test_stall_warning_names_the_rank_that_has_not_joined():
    code, output, _ = launch(LOOP + """
    # Every rank past the first allreduce before rank 2 sleeps: under MPICH a rank that sleeps
    # right after it may leave its last messages unprogressed, and rank 1 then waits in it.
    ringlet.barrier()
    if ringlet.rank() == 2:
        time.sleep(5)
    ringlet.allreduce(np.ones(1000, dtype=np.float32))
    print("done", ringlet.rank(), flush=True)
    """, ranks=3, env={"RINGLET_STALL_WARNING": "1"})
    assert code == 0, output
    # Each waiting rank names the rank it waits for ...
    assert re.search(r"rank [01] has waited 1 s in allreduce #\d+ of float32\[1000\]", output)
    # ... and rank 0, having heard from rank 1, names the one that has not joined.
    assert re.search(r"allreduce #\d+ of float32\[1000\].* has waited \d s: rank\(s\) 2 have "
                     r"not joined it", output), output
    assert output.count("done") == 3


def test_timeout_turns_a_stall_into_an_error_that_ends_the_job():
    code, output, seconds = launch(LOOP + """
    if ringlet.rank() == 1:
        time.sleep(120)  # never joins
    ringlet.allreduce(np.ones(10, dtype=np.float32))
    """, env={"RINGLET_TIMEOUT": "2"})
    assert code != 0 and seconds < 60, output
    assert re.search(r"rank 0 gives up after 2 s in allreduce #\d+ of float32\[10\]", output)
    assert "waiting for rank 1" in output, output


def test_ctrl_c_during_a_long_allreduce_exits_promptly():
    def interrupt_when_ready(process):
        time.sleep(4)  # the ranks are inside their allreduce loop by then
        os.kill(process.pid, signal.SIGINT)

    code, output, seconds = launch(LOOP + """
    big = np.ones(64 << 20, dtype=np.float32)
    while True:
        ringlet.allreduce(big, out=big, algorithm="ring")
    """, on_start=interrupt_when_ready, timeout=45)
    assert code != 0 and seconds < 45, output


def test_an_exception_printed_through_the_hook_while_python_runs_does_not_end_the_job():
    # A library that reports an error it has handled (as JAX's callbacks can) calls
    # sys.excepthook with the program still running: the job goes on.
    code, output, seconds = launch(LOOP + """
    import sys
    def report():
        try:
            raise ValueError("handled on rank 1")
        except ValueError as error:
            if ringlet.rank() == 1:
                sys.excepthook(type(error), error, error.__traceback__)
    report()
    ringlet.allreduce(x, out=x)
    print("went on", ringlet.rank(), flush=True)
    """)
    assert code == 0 and seconds < 60, output
    assert "handled on rank 1" in output and "ending the job" not in output, output
    assert output.count("went on") == 2, output
