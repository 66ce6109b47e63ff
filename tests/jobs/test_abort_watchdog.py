"""A rank whose MPI_Abort cannot complete ends its own process within the abort's grace (3 s,
src/transport/mpi.rs), as when the host's launcher daemon is out of reach. Here the launcher
is stopped with SIGSTOP: mpirun and every process it started but the ranks (MPICH's Hydra has
a proxy between them, which would otherwise end the other ranks). Open MPI's MPI_Abort waits
for the launcher's answer. Run with plain pytest (not under mpirun)."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
ABORT_GRACE = 3.0

SCRIPT = """
    import os, sys, time
    from pathlib import Path
    import ringlet
    from ringlet import _core
    ringlet.init()
    print(f"rank {ringlet.rank()} pid {os.getpid()}", flush=True)
    if ringlet.rank() == 1:
        while not Path(sys.argv[1]).exists():
            time.sleep(0.05)
        _core.abort(3)  # what RINGLET_TIMEOUT and an uncaught exception call
    time.sleep(120)
"""


def alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie has ended: its parent, stopped, cannot reap it)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def launcher_processes(launcher: int, ranks: set[int]) -> list[int]:
    """``launcher`` and its descendants, but not ``ranks`` (nor theirs)."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                parent = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, ValueError):
                continue
            children.setdefault(parent, []).append(int(entry.name))
    found, todo = [], [launcher]
    while todo:
        pid = todo.pop()
        if pid not in ranks:
            found.append(pid)
            todo += children.get(pid, [])
    return found


def test_a_rank_whose_abort_hangs_ends_itself(tmp_path):
    script = tmp_path / "abort_job.py"
    script.write_text(textwrap.dedent(SCRIPT))
    go = tmp_path / "go"
    output = tmp_path / "output"
    with open(output, "w") as out:
        mpirun = subprocess.Popen(["mpirun", "-n", "2", sys.executable, str(script), str(go)],
                                  cwd=ROOT, stdout=out, stderr=subprocess.STDOUT,
                                  start_new_session=True)
    try:
        deadline = time.monotonic() + 60
        pids: dict[int, int] = {}
        while len(pids) < 2:
            assert time.monotonic() < deadline and mpirun.poll() is None, output.read_text()
            pids = {int(r): int(p) for r, p in
                    re.findall(r"rank (\d) pid (\d+)", output.read_text())}
            time.sleep(0.1)
        for pid in launcher_processes(mpirun.pid, set(pids.values())):
            os.kill(pid, signal.SIGSTOP)  # the launcher stops answering
        go.touch()
        asked = time.monotonic()
        while alive(pids[1]) and time.monotonic() - asked < ABORT_GRACE + 10:
            time.sleep(0.05)
        took = time.monotonic() - asked
        assert not alive(pids[1]), f"rank 1 still runs {took:.1f} s after its abort"
        # It waited in MPI_Abort (which did not return), then its watchdog ended it.
        assert ABORT_GRACE - 0.5 <= took <= ABORT_GRACE + 5, took
        assert alive(pids[0]), "rank 0 was not ended: its launcher is stopped"
    finally:
        os.killpg(mpirun.pid, signal.SIGKILL)
        os.killpg(mpirun.pid, signal.SIGCONT)
        mpirun.wait(timeout=30)
