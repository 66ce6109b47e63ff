"""ringlet.jupyter.start(hosts=...) on the emulated cluster: the notebook's process (this test)
runs on host 0, and ipyparallel's controller there; MPI engines start on other hosts through
Open MPI's rsh agent, which gives them a login's environment as ssh would, so everything they
need (ipyparallel's connection details, the caller's variables) must be forwarded.

tests/cluster/run.sh runs it on host 0 (after `make cluster-up`, by hand:
`tools/emulated_cluster.sh on 0 .venv/bin/python -m pytest tests/cluster/<this file>`).
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from ipyparallel import interactive

from ringlet import _launchers, jupyter
from ringlet._launchers import LauncherKind
from ringlet.run import default_launcher

REPO = Path(__file__).resolve().parents[2]
CLUSTER = REPO / "tools" / "emulated_cluster.sh"
HOSTFILE = REPO / "build" / "emulated-cluster" / "hostfile"

sys.path.insert(0, str(REPO / "tests" / "jupyter"))
from engine_calls import allreduce_of_ranks, mismatched  # noqa: E402

from ipp_processes import wait_until_gone  # noqa: E402  (the stray-process check of the Jupyter tests)

if socket.gethostname() != "rgl-h0" or not HOSTFILE.exists():
    pytest.fail("run this on host 0 of the emulated cluster (tests/cluster/run.sh)",
                pytrace=False)


def cluster_mpi_options() -> list[str]:
    """The emulated cluster's mpirun options (rsh agent, TCP on the bridge) without its hostfile:
    each test places the engines itself."""
    printed = subprocess.run(["bash", str(CLUSTER), "options"], check=True, text=True,
                             capture_output=True).stdout.split("\n")
    options = [word for word in printed if word]
    at = options.index("--hostfile")
    return options[:at] + options[at + 2:]


@interactive
def where_am_i():
    import os
    import socket

    import ringlet

    topology = ringlet.topology()
    return (ringlet.rank(), socket.gethostname(), topology.local_size, topology.cross_size,
            os.environ.get("RINGLET_TEST_MARK"), os.environ.get("RINGLET_CACHE_DIR"))


def start_and_check(tmp_path, hosts, expected_hosts, mpi_args=()):
    cache = str(tmp_path / "cache")
    # Not in `environment`: start() forwards the caller's RINGLET_* variables to other hosts.
    os.environ["RINGLET_TEST_MARK"] = "forwarded"
    os.environ["RINGLET_CACHE_DIR"] = cache
    cluster, view = jupyter.start(n=len(expected_hosts), hosts=hosts, progress=False, timeout=120,
                                  mpi_args=[*cluster_mpi_options(), *mpi_args])
    try:
        n = len(expected_hosts)
        found = jupyter.run(view, where_am_i)
        assert [r for r, *_ in found] == list(range(n))
        assert [host for _, host, *_ in found] == expected_hosts
        hosts_used = len(set(expected_hosts))
        assert all(cross == hosts_used for *_, cross, _, _ in found)
        assert all(local == expected_hosts.count(host) for _, host, local, *_ in found)
        assert all((mark, where) == ("forwarded", cache) for *_, mark, where in found)

        expected = sum(np.arange(1000, dtype=np.float32) + r for r in range(n))
        for two_tier, ring in jupyter.run(view, allreduce_of_ranks):
            np.testing.assert_array_equal(two_tier, expected)
            np.testing.assert_array_equal(ring, expected)

        with pytest.raises(jupyter.EngineError) as caught:
            jupyter.run(view, mismatched)
        assert set(caught.value.errors) == set(range(n))
        assert all(name == "MismatchError" for name, _ in caught.value.errors.values())
        # The mismatch left every rank in step: the next collective is right.
        for two_tier, _ in jupyter.run(view, allreduce_of_ranks):
            np.testing.assert_array_equal(two_tier, expected)
    finally:
        cluster_id = cluster.cluster_id
        cluster.stop_cluster_sync()
        del os.environ["RINGLET_TEST_MARK"]
    assert wait_until_gone(cluster_id) == [], "processes of the cluster outlived its stop"
    # Open MPI's daemons on the other hosts carry no ipyparallel variable: look for them by name
    # (4.x's orted, 5's prted), as the launcher start() used names them.
    daemon = launcher_kind().daemon
    assert daemons_gone(daemon), f"a {daemon} outlived the cluster's stop"


def launcher_kind() -> LauncherKind:
    found = default_launcher("mpiexec")  # what start() launches with
    kind = found.kind or _launchers.probe(found.launcher)
    assert kind is not None and kind.flavor == "openmpi", found
    return kind


def daemons_gone(name: str, seconds: float = 30.0) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if subprocess.run(["pgrep", "-x", name], capture_output=True).returncode != 0:
            return True
        time.sleep(0.2)
    return False


def test_engines_only_on_other_hosts_from_a_list_of_hosts(tmp_path):
    start_and_check(tmp_path, ["10.77.0.11:2", "10.77.0.12:2"],
                    ["rgl-h1", "rgl-h1", "rgl-h2", "rgl-h2"])


def test_engines_on_every_host_from_a_hostfile(tmp_path):
    start_and_check(tmp_path, str(HOSTFILE), ["rgl-h0", "rgl-h1", "rgl-h2", "rgl-h3"],
                    mpi_args=["--map-by", "node"])
