"""The restart mechanism on whichever MPI this Python's ringlet loads, with NumPy only
(elastic_numpy_main.py): make test runs it on Open MPI 4.1 (tests/elastic), on MPICH
(make test-mpich-quick, in .venv-mpich) and on Open MPI 5 with its fault tolerance left off
(make test-ulfm, RINGLET_ELASTIC_MECHANISM=restart). RINGLET_TEST_EXPECT_MPI, when set, is
what the MPI library must call itself there.

One host (localhost, 2 slots), a rank killed mid-epoch: the driver ends the job, blacklists
the host, takes it back after its cooldown (1-2 s) and resumes from the last commit it holds;
the final weights are the same on both ranks and equal the replay of the steps kept."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from elastic_numpy_main import replay  # noqa: E402

SCRIPT = HERE / "elastic_numpy_main.py"


def test_a_killed_rank_is_restarted_from_the_last_commit(tmp_path: Path) -> None:
    logfile = tmp_path / "log"
    command = [sys.executable, "-m", "ringlet.run", "-np", "2", "--min-np", "2",
               "-H", "localhost:2", "--blacklist-cooldown-range", "1", "2",
               sys.executable, str(SCRIPT), "--logfile", str(logfile),
               "--kill", "(1, 2)", "--slot", "localhost[1]"]
    env = {**os.environ, "RINGLET_ELASTIC_DISCOVERY_INTERVAL": "0.2",
           "RINGLET_CACHE_DIR": str(tmp_path / "cache")}
    done = subprocess.run(command, capture_output=True, text=True, timeout=240, env=env,
                          cwd=tmp_path)
    report = f"exit {done.returncode}\n{done.stdout[-4000:]}\n{done.stderr[-6000:]}"
    assert done.returncode == 0, report
    epochs = [json.loads(line) for line in logfile.read_text().splitlines()]
    assert [e["epoch"] for e in epochs] == [0, 1, 2], report
    assert [e["size"] for e in epochs] == [2, 2, 2], report
    assert [e["rendezvous"] for e in epochs] == [1, 2, 2], report
    assert epochs[0]["pid"] != epochs[1]["pid"], "the job was not restarted"
    assert "blacklisted: localhost" in done.stderr and "job 2: 2 ranks" in done.stderr, report
    expected = os.environ.get("RINGLET_TEST_EXPECT_MPI")
    if expected is not None:
        assert all(expected in e["mpi"] for e in epochs), (expected, epochs)
    last: dict[tuple[int, int], int] = {}
    for line in (tmp_path / "log.steps").read_text().splitlines():
        epoch, batch, size = json.loads(line)
        last[epoch, batch] = size
    weights = {p.name: p.read_text() for p in tmp_path.glob("log.weights.*")}
    assert len(weights) == 2 and len(set(weights.values())) == 1, weights
    assert json.loads(next(iter(weights.values()))) == replay(
        [(e, b, s) for (e, b), s in sorted(last.items())])
