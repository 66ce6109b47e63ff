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
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(ROOT / "tests" / "cluster"), str(ROOT / "tests" / "elastic"),
                str(ROOT / "tests" / "ulfm")]

from test_elastic_cluster import cut_a_link_under_the_driver  # noqa: E402
from test_faults import CLUSTER, SHAPE  # noqa: E402
from ulfm_common import require_ulfm  # noqa: E402

FAULTS = ROOT / "tests" / "ulfm" / "allreduce_faults_main.py"

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
    said = cut_a_link_under_the_driver(tmp_path)
    assert "--with-ft ulfm" in said, said  # the job ran under ULFM (--verbose shows its line)
