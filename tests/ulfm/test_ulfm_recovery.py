"""ULFM, elastic.run's first mechanism: under Open MPI 5's ``mpirun --with-ft ulfm``, a rank
that dies is survived in the same job. The survivors' collective raises, they shrink the
communicator, set ringlet (and ringlet.hvd) up again on the ranks left, restore the last
commit from memory, and go on; nothing is restarted (rank 0's PID stays, the rendezvous count
says how many times the function was entered).

Horovod's scenarios (test/integration/elastic_common.py) that ULFM covers without a driver,
with the training script of tests/elastic (exact_model.py: the final weights must equal a
single-process replay of the steps kept, bit for bit), and a rank killed inside the
shared-memory tier's allreduce. Run by ``make test-ulfm``, in .venv-ompi5 (PyPI's Open MPI
5.0, built with ULFM): the test fails, not skips, on an MPI without it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE.parent / "elastic")]

import exact_model  # noqa: E402
from ulfm_common import BIN, require_ulfm  # noqa: E402

TORCH_SCRIPT = HERE.parent / "elastic" / "elastic_torch_main.py"
FAULTS_SCRIPT = HERE / "allreduce_faults_main.py"
BATCHES_PER_EPOCH = 4
MPIRUN = BIN / "mpirun"

require_ulfm()


def launch(tmp_path: Path, np: int, script: Path, *args: str,
           seconds: float = 180) -> subprocess.CompletedProcess:
    # osc ^ucx: UCX's one-sided component prints an error at every window under ULFM.
    command = [str(MPIRUN), "--with-ft", "ulfm", "--mca", "osc", "^ucx", "--oversubscribe",
               "-np", str(np), sys.executable, str(script), "--logfile", str(tmp_path / "log"),
               *args]
    env = {**os.environ, "OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1",
           "RINGLET_CACHE_DIR": str(tmp_path / "cache")}
    return subprocess.run(command, capture_output=True, text=True, timeout=seconds, env=env,
                          cwd=tmp_path)


def lines(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def output(done: subprocess.CompletedProcess) -> str:
    return (f"exit {done.returncode}\n--- stdout\n{done.stdout[-6000:]}\n--- stderr\n"
            f"{done.stderr[-6000:]}")


def train(tmp_path: Path, np: int, exits: dict[str, list[str]]) -> tuple[
        subprocess.CompletedProcess, list[dict]]:
    done = launch(tmp_path, np, TORCH_SCRIPT, "--batches-per-epoch", str(BATCHES_PER_EPOCH),
                  "--exit-mode", "kill", "--exit-schedule", json.dumps(exits))
    return done, lines(tmp_path / "log")


def check_weights(tmp_path: Path, survivors: int) -> None:
    """Every survivor's final weights are the same, and those of a replay of the steps kept
    (the last time each step was made: a step after the last commit is made again)."""
    weights = {p.name: p.read_text() for p in tmp_path.glob("log.weights.*")}
    assert len(weights) == survivors, weights
    assert len(set(weights.values())) == 1, weights
    steps: dict[tuple[int, int], int] = {}
    for epoch, batch, world in (json.loads(s) for s in
                                (tmp_path / "log.steps").read_text().splitlines()):
        steps[epoch, batch] = world
    replayed = exact_model.replay([(e, b, w) for (e, b), w in sorted(steps.items())],
                                  BATCHES_PER_EPOCH)
    assert replayed == next(iter(weights.values()))


def test_a_killed_rank_is_survived_in_the_same_job(tmp_path: Path) -> None:
    done, epochs = train(tmp_path, 3, {"(1, 2)": ["rank[1]"]})
    assert done.returncode == 0, output(done)
    assert [e["size"] for e in epochs] == [3, 2, 2], output(done)
    assert [e["rendezvous"] for e in epochs] == [1, 2, 2]
    assert len({e["pid"] for e in epochs}) == 1, "rank 0 was restarted, not recovered"
    check_weights(tmp_path, 2)


@pytest.mark.heavy
def test_rank_0_killed(tmp_path: Path) -> None:
    """The new rank 0 (world rank 1) has the last commit in memory, and broadcasts it."""
    done, epochs = train(tmp_path, 3, {"(0, 3)": ["rank[0]"]})
    assert done.returncode == 0, output(done)
    assert [e["size"] for e in epochs] == [2, 2, 2], output(done)
    assert [e["rendezvous"] for e in epochs] == [2, 2, 2]
    check_weights(tmp_path, 2)


@pytest.mark.heavy
def test_two_ranks_killed_one_after_the_other(tmp_path: Path) -> None:
    done, epochs = train(tmp_path, 4, {"(0, 1)": ["rank[1]"], "(1, 3)": ["rank[3]"]})
    assert done.returncode == 0, output(done)
    assert [e["size"] for e in epochs] == [3, 2, 2], output(done)
    assert [e["rendezvous"] for e in epochs] == [2, 3, 3]
    assert len({e["pid"] for e in epochs}) == 1
    check_weights(tmp_path, 2)


@pytest.mark.parametrize("victim", [0, 1])
def test_a_rank_killed_inside_the_shared_memory_allreduce(tmp_path: Path, victim: int) -> None:
    """Three ranks on one node, the shared-memory tier's allreduce of 64 MiB, one killed in
    the middle of it: both survivors raise from that allreduce at once, recover, and every
    later result is the exact sum over the two of them (fresh segments; the dead rank's is
    never read again)."""
    done = launch(tmp_path, 3, FAULTS_SCRIPT, "--victim", str(victim), "--kill-at", "2")
    assert done.returncode == 0, output(done)
    steps = lines(tmp_path / "log")
    assert [s["step"] for s in steps] == list(range(6)), output(done)
    assert [s["size"] for s in steps] == [3, 3, 2, 2, 2, 2]
    assert all(s["exact"] for s in steps), steps
    assert [s["recoveries"] for s in steps] == [1, 1, 2, 2, 2, 2]
    survivors = sorted({0, 1, 2} - {victim})
    for rank in survivors:
        failed = lines(tmp_path / f"log.failed.{rank}")
        assert [f["step"] for f in failed] == [2], failed
        assert failed[0]["seconds"] < 2.0, failed
        assert "PROC_FAILED" in failed[0]["error"] or "REVOKED" in failed[0]["error"], failed
    assert not (tmp_path / f"log.failed.{victim}").exists()


@pytest.mark.parametrize(("ulfm", "setting"), [(True, "1"), (False, None)],
                         ids=["with-ft-ulfm", "without"])
def test_under_ulfm_ringlet_starts_mpi_without_the_finalize_fence(
        tmp_path: Path, ulfm: bool, setting: str | None) -> None:
    """MPI_Finalize's fence waits for the dead too, and survivors hung there now and then:
    under --with-ft ulfm, the MPI that ringlet starts is told to leave it out (and only
    then)."""
    script = tmp_path / "fence.py"
    script.write_text("import json, os, ringlet\nringlet.init()\n"
                      "print(json.dumps(os.environ.get('OMPI_MCA_async_mpi_finalize')))\n")
    command = [str(MPIRUN), *(["--with-ft", "ulfm"] if ulfm else []), "--mca", "osc", "^ucx",
               "-np", "1", sys.executable, str(script)]
    env = {k: v for k, v in os.environ.items() if k != "OMPI_MCA_async_mpi_finalize"}
    done = subprocess.run(command, capture_output=True, text=True, timeout=120, cwd=tmp_path,
                          env={**env, "OMPI_ALLOW_RUN_AS_ROOT": "1",
                               "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1",
                               "RINGLET_CACHE_DIR": str(tmp_path / "cache")})
    assert done.returncode == 0, output(done)
    assert json.loads(done.stdout.strip().splitlines()[-1]) == setting, output(done)


def test_survivors_can_shrink_and_set_ringlet_up_again_by_hand(tmp_path: Path) -> None:
    """What failures.md promises outside elastic.run: ProcessFailedError at once, then
    ringlet.init(comm=...) on a communicator the program shrank itself."""
    done = launch(tmp_path, 3, HERE / "shrink_by_hand_main.py")
    assert done.returncode == 0, output(done)
    reports = sorted((json.loads(line) for line in done.stdout.splitlines()
                      if line.startswith("{")), key=lambda r: r["world_rank"])
    assert [r["world_rank"] for r in reports] == [0, 2], output(done)
    for report in reports:
        assert report["before"] == 1 + 2 + 3
        assert report["error"] is not None and "MPI_ERR_" in report["error"], report
        assert report["seconds"] < 1.0, report
        assert report["size"] == 2
        assert report["after"] == [1 + 3] * 3, report
        assert "process set 1 does not exist (it was removed" in report["old_set"], report
