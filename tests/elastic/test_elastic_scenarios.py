"""Horovod's elastic integration scenarios (test/integration/elastic_common.py), rewritten for
ringletrun's elastic driver: the job restarts from rank 0's last commit (the mechanism for
every MPI). As in Horovod's tests, ``localhost`` and ``127.0.0.1`` are two hosts of this
machine. Each scenario checks, per epoch, the world size, the host of rank 0 and the number of
rendezvous, and that the final weights are bit-identical on every rank and equal to a
single-process replay of the steps the job made (exact_model.py). Plain pytest."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import exact_model  # noqa: E402

SCRIPT = HERE / "elastic_torch_main.py"
BATCHES_PER_EPOCH = 4
TWO_HOSTS = ["localhost:2", "127.0.0.1:2"]


def discovery_script(path: Path, logfile: Path, schedule: list) -> Path:
    """A script that prints the hosts of ``schedule`` for the epoch the log has reached (its
    line count), as Horovod's tests generate."""
    lines = ["#!/bin/bash", "epoch=0",
             f'if [ -f {logfile} ]; then epoch=$(wc -l < {logfile} | tr -d "[:space:]"); fi']
    for i, (epoch, hosts) in enumerate(schedule):
        echo = "; ".join(f"echo {h}" for h in hosts)
        if epoch is None:
            lines.append(f"{'else' if i else ''} {echo}" if i else echo)
        else:
            lines.append(f'{"if" if i == 0 else "elif"} [ "$epoch" == "{epoch}" ]; then {echo}')
    if len(schedule) > 1:
        lines.append("fi")
    path.write_text("\n".join(lines) + "\n")
    path.chmod(0o755)
    return path


def run(tmp_path: Path, discovery_schedule: list | None = None, exit_schedule: dict | None = None,
        exit_mode: str = "exception", np: int = 2, min_np: int = 2, max_np: int = 4,
        hosts: str | None = None, reset_limit: int | None = None,
        cooldown: tuple[int, int] | None = None, epoch_wait: float | None = None,
        epochs: int | None = None, timeout_s: int | None = None, discovery_wait: float = 10,
        seconds: float = 240) -> tuple[subprocess.CompletedProcess, list[dict]]:
    logfile = tmp_path / "log"
    command = [sys.executable, "-m", "ringlet.run", "-np", str(np), "--min-np", str(min_np)]
    if hosts:
        command += ["-H", hosts]
    else:
        script = discovery_script(tmp_path / "discover.sh", logfile, discovery_schedule or [])
        command += ["--host-discovery-script", str(script), "--max-np", str(max_np)]
    if reset_limit is not None:
        command += ["--reset-limit", str(reset_limit)]
    if cooldown is not None:
        command += ["--blacklist-cooldown-range", *map(str, cooldown)]
    if timeout_s is not None:
        command += ["--elastic-timeout", str(timeout_s)]
    command += [sys.executable, str(SCRIPT), "--logfile", str(logfile),
                "--batches-per-epoch", str(BATCHES_PER_EPOCH)]
    if discovery_schedule:
        command += ["--discovery-schedule", json.dumps(discovery_schedule),
                    "--discovery-wait", str(discovery_wait)]
    if exit_schedule:
        command += ["--exit-schedule", json.dumps(exit_schedule), "--exit-mode", exit_mode]
    if epoch_wait is not None:
        command += ["--epoch-wait", str(epoch_wait)]
    if epochs is not None:
        command += ["--epochs", str(epochs)]
    env = {**os.environ, "RINGLET_ELASTIC_DISCOVERY_INTERVAL": "0.2",
           "OMPI_MCA_rmaps_base_oversubscribe": "1"}
    done = subprocess.run(command, capture_output=True, text=True, timeout=seconds, env=env,
                          cwd=tmp_path)
    results = ([json.loads(line) for line in logfile.read_text().splitlines()]
               if logfile.exists() else [])
    return done, results


def check_weights(tmp_path: Path, size: int) -> None:
    """Every rank's final weights are the same, and those of a replay of the steps made (the
    last time each step was made: a step after the last commit is made again)."""
    weights = {p.name: p.read_text() for p in tmp_path.glob("log.weights.*")}
    assert len(weights) == size, weights
    assert len(set(weights.values())) == 1, weights
    steps: dict[tuple[int, int], int] = {}
    for line in (tmp_path / "log.steps").read_text().splitlines():
        epoch, batch, world = json.loads(line)
        steps[epoch, batch] = world
    replayed = exact_model.replay([(e, b, w) for (e, b), w in sorted(steps.items())],
                                  BATCHES_PER_EPOCH)
    assert replayed == next(iter(weights.values()))


def output(done: subprocess.CompletedProcess) -> str:
    return f"exit {done.returncode}\n--- stdout\n{done.stdout[-6000:]}\n--- stderr\n" \
           f"{done.stderr[-6000:]}"


def test_hosts_added_and_removed(tmp_path: Path) -> None:
    schedule = [(0, ["localhost:2"]), (1, TWO_HOSTS), (None, ["127.0.0.1:2"])]
    done, results = run(tmp_path, schedule, np=2, min_np=2, max_np=4)
    assert done.returncode == 0, output(done)
    assert [r["size"] for r in results] == [2, 4, 2], output(done)
    assert [r["hostname"] for r in results] == ["localhost", "localhost", "127.0.0.1"]
    assert [r["rendezvous"] for r in results] == [1, 2, 3]
    check_weights(tmp_path, 2)


@pytest.mark.parametrize("exit_mode", [pytest.param("exception", marks=pytest.mark.heavy),
                                       "kill"])
def test_single_rank_failure(tmp_path: Path, exit_mode: str) -> None:
    done, results = run(tmp_path, [(None, TWO_HOSTS)], {"(1, 0)": ["localhost[0]"]}, exit_mode)
    assert done.returncode == 0, output(done)
    assert [r["size"] for r in results] == [4, 2, 2], output(done)
    assert [r["hostname"] for r in results] == ["localhost", "127.0.0.1", "127.0.0.1"]
    assert [r["rendezvous"] for r in results] == [1, 2, 2]
    assert "blacklisted: localhost" in done.stderr
    check_weights(tmp_path, 2)


@pytest.mark.heavy
@pytest.mark.parametrize("exit_mode", ["exception", "kill"])
def test_fault_tolerance_without_scaling(tmp_path: Path, exit_mode: str) -> None:
    done, results = run(tmp_path, exit_schedule={"(1, 0)": ["localhost[0]"]},
                        exit_mode=exit_mode, np=4, hosts=",".join(TWO_HOSTS))
    assert done.returncode == 0, output(done)
    assert [r["size"] for r in results] == [4, 2, 2], output(done)
    assert [r["rendezvous"] for r in results] == [1, 2, 2]
    check_weights(tmp_path, 2)


def test_all_ranks_failure(tmp_path: Path) -> None:
    every = ["localhost[0]", "localhost[1]", "127.0.0.1[0]", "127.0.0.1[1]"]
    done, _ = run(tmp_path, [(None, TWO_HOSTS)], {"(1, 0)": every})
    assert done.returncode != 0, output(done)
    assert "one or more processes exited with non-zero status" in done.stderr, output(done)


@pytest.mark.heavy
def test_all_hosts_blacklisted(tmp_path: Path) -> None:
    done, _ = run(tmp_path, [(None, TWO_HOSTS)], {"(1, 0)": ["localhost[0]", "127.0.0.1[0]"]})
    assert done.returncode != 0, output(done)
    assert "one or more processes exited with non-zero status" in done.stderr, output(done)


def test_min_hosts_timeout(tmp_path: Path) -> None:
    started = time.monotonic()
    done, _ = run(tmp_path, [(None, TWO_HOSTS)], {"(1, 0)": ["localhost[0]"]}, np=4,
                  min_np=4, timeout_s=3)
    assert done.returncode != 0, output(done)
    assert "timed out after 3 s waiting for 4 slots" in done.stderr, output(done)
    assert time.monotonic() - started < 120


@pytest.mark.heavy
@pytest.mark.parametrize("limit", [1, 2])
def test_reset_limit(tmp_path: Path, limit: int) -> None:
    schedule = [(0, ["localhost:2"]), (1, TWO_HOSTS), (None, ["127.0.0.1:2"])]
    done, results = run(tmp_path, schedule, reset_limit=limit)
    if limit == 1:
        assert done.returncode != 0, output(done)
        assert "exceeded its limit: 1" in done.stderr, output(done)
    else:
        assert done.returncode == 0, output(done)
        assert len(results) == 3
        check_weights(tmp_path, 2)


@pytest.mark.heavy
def test_resurrecting_blacklisted_hosts(tmp_path: Path) -> None:
    done, results = run(tmp_path, [(None, TWO_HOSTS)],
                        {"(1, 0)": ["127.0.0.1[1]"], "(3, 0)": ["127.0.0.1[1]"]},
                        epochs=5, epoch_wait=1.0, cooldown=(1, 2))
    assert done.returncode == 0, output(done)
    jobs = re.findall(r"job \d+: (\d+) ranks on (\S+)", done.stderr)
    # Out after each failure, back after each cooldown: 4, 2, 4, 2, 4 ranks.
    assert [int(n) for n, _ in jobs] == [4, 2, 4, 2, 4], output(done)
    assert done.stderr.count("blacklisted: 127.0.0.1") == 2
    assert [r["epoch"] for r in results] == [0, 1, 2, 3, 4]
    assert [r["hostname"] for r in results] == ["localhost"] * 5
    check_weights(tmp_path, 4)


@pytest.mark.heavy
def test_a_discovery_script_that_fails_later_changes_nothing(tmp_path: Path) -> None:
    done, results = run(tmp_path, [(0, TWO_HOSTS), (None, ["not a host"])], np=4,
                        discovery_wait=0)
    # The generated script prints "not a host" from epoch 1 on. The driver warns
    # and keeps the hosts it had; the job runs on, unchanged.
    assert done.returncode == 0, output(done)
    assert "keeping the hosts found before" in done.stderr, output(done)
    assert [r["size"] for r in results] == [4, 4, 4]
    assert [r["rendezvous"] for r in results] == [1, 1, 1]
    check_weights(tmp_path, 4)
