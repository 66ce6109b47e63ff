"""Keras under ringletrun's elastic driver: ``hvd.elastic.KerasState`` and Horovod's Keras
callbacks (elastic_keras_main.py) through a rank killed mid-epoch. On Open MPI 4.1 the driver
restarts the job without the dead rank's host, from the last commit (this file); under ULFM
the survivors go on in the same job (tests/ulfm/test_ulfm_driver.py). Either way the run
ends with the world size shrunk and the weights identical on every rank. Plain pytest."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parent / "elastic_keras_main.py"


def run_keras_killing_one(tmp_path: Path, backend: str = "tensorflow"
                          ) -> tuple[subprocess.CompletedProcess, list[dict], str]:
    """4 ranks on localhost:2,127.0.0.1:2, 127.0.0.1[0] killed at epoch 1, batch 2: the
    driver's result, the epochs rank 0 logged, and everything the run printed. Checks that
    it ended well and that the weights are the same on the ranks left."""
    logfile = tmp_path / "log"
    command = [sys.executable, "-m", "ringlet.run", "-np", "4", "--min-np", "2",
               "-H", "localhost:2,127.0.0.1:2", sys.executable, str(SCRIPT),
               "--logfile", str(logfile), "--exit-schedule",
               json.dumps({"(1, 2)": ["127.0.0.1[0]"]})]
    env = {**os.environ, "OMPI_MCA_rmaps_base_oversubscribe": "1",
           "KERAS_BACKEND": backend, "TF_CPP_MIN_LOG_LEVEL": "2"}
    done = subprocess.run(command, capture_output=True, text=True, timeout=400, env=env,
                          cwd=tmp_path)
    said = f"exit {done.returncode}\n{done.stdout}\n{done.stderr}"
    assert done.returncode == 0, said
    epochs = [json.loads(line) for line in logfile.read_text().splitlines()]
    weights = {p.name: p.read_text() for p in tmp_path.glob("log.weights.*")}
    assert len(weights) == epochs[-1]["size"] and len(set(weights.values())) == 1, weights
    return done, epochs, said


@pytest.mark.heavy
@pytest.mark.parametrize("backend", ["tensorflow", "jax", "torch"])
def test_a_killed_rank_under_keras_resumes_from_the_last_commit(tmp_path: Path,
                                                                backend: str) -> None:
    done, epochs, said = run_keras_killing_one(tmp_path, backend)
    assert [(e["epoch"], e["size"]) for e in epochs] == [(1, 4), (2, 2), (3, 2)], said
    assert [e["rendezvous"] for e in epochs] == [1, 2, 2], said
    assert "blacklisted: 127.0.0.1" in done.stderr, said
