"""The stray-process check of the Jupyter tests (and of the Jupyter tests across emulated
hosts, tests/cluster): every process an ipyparallel cluster started, found by the cluster id
ipyparallel puts in their environment."""

from __future__ import annotations

import os
import time
from pathlib import Path


def processes_of_cluster(cluster_id: str) -> list[tuple[int, str]]:
    """(pid, command line) of every process started for this ipyparallel cluster: ipyparallel
    puts IPP_CLUSTER_ID in the environment of the controller, mpiexec and every engine."""
    marker = f"IPP_CLUSTER_ID={cluster_id}".encode()
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            environment = (entry / "environ").read_bytes().split(b"\0")
            command = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            state = (entry / "stat").read_text().split(")")[-1].split()[0]
        except OSError:  # gone meanwhile, or not ours to read
            continue
        if marker in environment and state != "Z":
            found.append((int(entry.name), command.strip()))
    return found


def wait_until_gone(cluster_id: str, seconds: float = 30.0) -> list[tuple[int, str]]:
    deadline = time.monotonic() + seconds
    left = processes_of_cluster(cluster_id)
    while left and time.monotonic() < deadline:
        time.sleep(0.2)
        left = processes_of_cluster(cluster_id)
    return left
