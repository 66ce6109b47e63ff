"""Elastic training's two mechanisms across the emulated cluster's hosts under Open MPI 5 with
ULFM (tools/emulated_cluster.sh, 4 hosts x 2 ranks, block placement; run by tests/cluster/run.sh
--ulfm, from make test-openmpi5-cluster, in .venv-ompi5):

- a rank killed inside the shared-memory tier of two_tier's allreduce, on a two-rank host:
  the seven survivors go on in the same job (ULFM), with exact results;
- a host's link cut mid-allreduce under ringletrun's elastic driver: PRRTE cannot survive a
  lost daemon and ends the job (Open MPI 5.0's runtime has no node-failure recovery), so the
  driver blacklists the cut-off host and restarts on the three hosts left, from the last
  commit; the weights match the single-process replay.

Plain pytest on this machine (root; not under mpirun)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(ROOT / "tests" / "cluster"), str(ROOT / "tests" / "elastic"),
                str(ROOT / "tests" / "ulfm")]

import exact_model  # noqa: E402
from test_elastic_cluster import HOSTS, job_processes_on, session_pids  # noqa: E402
from test_faults import CLUSTER, SHAPE, network_options, on_host  # noqa: E402
from ulfm_common import require_ulfm  # noqa: E402

TRAIN = ROOT / "tests" / "elastic" / "elastic_torch_main.py"
FAULTS = ROOT / "tests" / "ulfm" / "allreduce_faults_main.py"
BATCHES_PER_EPOCH = 4
CUT = 3

require_ulfm()


@pytest.fixture(scope="module", autouse=True)
def cluster() -> None:
    assert SHAPE.exists(), "no emulated cluster: run tests/cluster/run.sh"
    assert int(SHAPE.read_text().split()[0]) >= 4, "these tests need 4 hosts"


def lines(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def test_a_rank_killed_inside_the_shared_memory_tier_is_survived(tmp_path: Path) -> None:
    victim = 5  # host 2's second rank: its host partner is left alone there
    done = subprocess.run(
        [str(CLUSTER), "mpirun", "-n", "8", "--map-by", "ppr:2:node", "--with-ft", "ulfm",
         "--mca", "osc", "^ucx", sys.executable, str(FAULTS), "--logfile",
         str(tmp_path / "log"), "--algorithm", "two_tier", "--megabytes", "16",
         "--victim", str(victim), "--kill-at", "2"],
        cwd=ROOT, capture_output=True, text=True, timeout=180)
    report = f"exit {done.returncode}\n{done.stdout[-4000:]}\n{done.stderr[-4000:]}"
    assert done.returncode == 0, report
    steps = lines(tmp_path / "log")
    assert [s["size"] for s in steps] == [8, 8, 7, 7, 7, 7], report
    assert all(s["exact"] for s in steps), steps
    assert len({s["pid"] for s in steps}) == 1, "rank 0 was restarted"
    for rank in set(range(8)) - {victim}:
        failed = lines(tmp_path / f"log.failed.{rank}")
        assert [f["step"] for f in failed] == [2], (rank, failed)
        assert failed[0]["seconds"] < 2.0, (rank, failed)


def test_a_link_cut_under_the_driver_restarts_on_the_hosts_left(tmp_path: Path) -> None:
    logfile = tmp_path / "log"
    command = [str(CLUSTER), "on", "0", sys.executable, "-m", "ringlet.run", "--verbose",
               "-np", "8", "--min-np", "4", "-H", ",".join(f"{h}:2" for h in HOSTS),
               "--mpi-args", " ".join(network_options()),
               sys.executable, str(TRAIN), "--logfile", str(logfile), "--epochs", "6",
               "--epoch-wait", "1", "--batches-per-epoch", str(BATCHES_PER_EPOCH)]
    output = open(tmp_path / "driver.out", "w")
    driver = subprocess.Popen(command, cwd=ROOT, stdout=output, stderr=subprocess.STDOUT,
                              env={**os.environ, "RINGLET_ELASTIC_DISCOVERY_INTERVAL": "0.5"},
                              start_new_session=True)
    said = lambda: (tmp_path / "driver.out").read_text()  # noqa: E731
    try:
        deadline = time.monotonic() + 180
        while len(lines(logfile)) < 2:
            assert driver.poll() is None, said()
            assert time.monotonic() < deadline, said()
            time.sleep(0.2)
        on_host(CUT, "ip", "link", "set", "eth0", "down")
        cut = time.monotonic()
        steps, resumed = tmp_path / "log.steps", None
        while driver.poll() is None and time.monotonic() < cut + 240:
            if resumed is None and any(json.loads(s)[2] == 6
                                       for s in steps.read_text().splitlines()):
                resumed = time.monotonic() - cut
            time.sleep(0.1)
        assert driver.poll() == 0, said()
    finally:
        on_host(CUT, "ip", "link", "set", "eth0", "up")
        for pid in session_pids(driver.pid) + [p for h in range(4)
                                               for p in job_processes_on(h, logfile)]:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        output.close()
    print(f"training resumed {resumed} s after host {CUT}'s link was cut", flush=True)
    text = said()
    assert "--with-ft ulfm" in text, text  # the job ran under ULFM (--verbose shows its line)
    assert "job 1 failed" in text and f"blacklisted: {HOSTS[CUT]}" in text, text
    assert "job 2: 6 ranks" in text, text
    assert resumed is not None, text
    sizes = [e["size"] for e in lines(logfile)]
    assert sizes[:2] == [8, 8] and sizes[-1] == 6 and len(sizes) == 6, sizes
    weights = {p.name: p.read_text() for p in tmp_path.glob("log.weights.*")}
    assert len(weights) == 6 and len(set(weights.values())) == 1, weights
    last: dict[tuple[int, int], int] = {}
    for line in steps.read_text().splitlines():
        epoch, batch, world = json.loads(line)
        last[epoch, batch] = world
    replay = exact_model.replay([(e, b, w) for (e, b), w in sorted(last.items())],
                                BATCHES_PER_EPOCH)
    assert replay == next(iter(weights.values()))
