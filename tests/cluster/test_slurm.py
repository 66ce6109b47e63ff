"""ringlet under a real Slurm on the emulated cluster (tools/emulated_slurm.sh): jobs submitted
the ways clusters run them, each checked for the topology ringlet reports against Slurm's
placement, an exact allreduce, a MismatchError, and nothing left running afterwards.

tests/cluster/run_slurm.sh runs this on host 0 (the login node: slurmctld runs there),
with SLURM_CONF set. By hand, after `make cluster-up SLURM=1`:
`eval "$(tools/emulated_slurm.sh env)"; tools/emulated_cluster.sh on 0 .venv/bin/python -m pytest
tests/cluster/test_slurm.py`.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import socket
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
from ipyparallel import interactive

from ringlet import jupyter

REPO = Path(__file__).resolve().parents[2]
SLURM_STATE = REPO / "build" / "emulated-cluster" / "slurm"
PROBE = Path(__file__).with_name("slurm_probe.py")
PYTHON = sys.executable
# Every job of these tests ends well within this; a hung one fails its test instead of the run.
JOB_SECONDS = 240

if socket.gethostname() != "rgl-h0" or not os.environ.get("SLURM_CONF"):
    pytest.fail("run this on host 0 of the emulated cluster with SLURM_CONF set "
                "(tests/cluster/run_slurm.sh)", pytrace=False)

sys.path.insert(0, str(REPO / "tests" / "jupyter"))
from engine_calls import allreduce_of_ranks, mismatched  # noqa: E402

from ipp_processes import wait_until_gone  # noqa: E402  (the stray-process check of the Jupyter tests)


def run(command: list[str], env: dict[str, str] | None = None,
        timeout: float = JOB_SECONDS) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(word) for word in command], env=env, cwd=REPO, text=True,
                          capture_output=True, timeout=timeout)


def job_environment(tmp_path: Path, **extra: str) -> dict[str, str]:
    """The environment a job inherits (Slurm forwards all of it): where the probe writes, a
    calibration cache of its own, and idle ranks that yield (the hosts share two cores)."""
    (tmp_path / "probe").mkdir(exist_ok=True)
    return {**os.environ, "PROBE_DIR": str(tmp_path / "probe"),
            "RINGLET_CACHE_DIR": str(tmp_path / "cache"), "OMPI_MCA_mpi_yield_when_idle": "1",
            **extra}


def expand(nodelist: str) -> list[str]:
    """Slurm's host list ("rgl-h[0-1]") as names, by Slurm itself."""
    return run(["scontrol", "show", "hostnames", nodelist]).stdout.split()


def check_probe(tmp_path: Path, ranks: int, per_node: int,
                output: subprocess.CompletedProcess[str]) -> None:
    """Every rank's report (slurm_probe.py) against the placement Slurm made: `per_node`
    consecutive ranks on each node of the job, in node order."""
    said = f"\nstdout:\n{output.stdout[-3000:]}\nstderr:\n{output.stderr[-3000:]}"
    assert output.returncode == 0, f"the job failed (exit {output.returncode}){said}"
    reports = []
    for rank in range(ranks):
        path = tmp_path / "probe" / f"rank{rank}.json"
        assert path.exists(), f"rank {rank} wrote no report{said}"
        reports.append(json.loads(path.read_text()))
    assert len(list((tmp_path / "probe").iterdir())) == ranks, "more ranks than asked for"
    job_nodes = expand(reports[0]["job_nodes"])
    assert len(job_nodes) == ranks // per_node
    hostnames = [report["hostname"] for report in reports]
    # Block placement over the job's nodes, as Slurm's default distribution and mpirun's
    # default mapping (by slot) lay the ranks out.
    assert hostnames == [node for node in job_nodes for _ in range(per_node)], hostnames
    assert Counter(hostnames) == {node: per_node for node in job_nodes}
    tested = Path(importlib.util.find_spec("ringlet").origin).parent
    for report in reports:
        where = f"rank {report['rank']}"
        assert report["size"] == ranks, where
        # The slurmd that started the rank (or its Open MPI daemon) is the host it runs on.
        assert report["slurm_node"] in (None, report["hostname"]), where
        # ringlet's topology: the hosts and nodes Slurm placed the ranks on.
        assert report["hosts"] == hostnames, where
        assert report["nodes"] == [rank // per_node for rank in range(ranks)], where
        assert (report["cross_size"], report["local_size"]) == (len(job_nodes), per_node), where
        assert report["placement"] == "block", where
        assert report["exact"] == dict.fromkeys(report["exact"], True), where
        assert report["mismatch"].startswith("MismatchError"), (where, report["mismatch"])
        assert report["exact_after_mismatch"], where
        # The ringlet under test, not another install: the environment reached every rank.
        assert Path(report["ringlet"]).parent == tested, where


def our_namespaces() -> dict[int, str]:
    """The network namespace inode of each emulated host."""
    return {os.stat(path).st_ino: path.name for path in Path("/run/netns").glob("rgl-h*")}


def parent(pid: int) -> int:
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])


def stray_processes() -> list[tuple[int, str, str]]:
    """(pid, host, command) of every process on the emulated hosts but Slurm's daemons (and
    slurmctld's helper, slurmscriptd) and this test's own process and its ancestors: once a
    job has ended, nothing else may run."""
    spared = {int(path.read_text()) for path in SLURM_STATE.glob("*/slurmd.pid")}
    controller = int((SLURM_STATE / "slurmctld.pid").read_text())
    spared.add(controller)
    pid = os.getpid()
    while pid > 1:
        spared.add(pid)
        pid = parent(pid)
    hosts = our_namespaces()
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) in spared:
            continue
        try:
            inode = os.stat(entry / "ns" / "net").st_ino
            command = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
            if parent(int(entry.name)) == controller and "slurmscriptd" in command:
                continue
        except OSError:  # gone meanwhile
            continue
        if inode in hosts and state != "Z":
            found.append((int(entry.name), hosts[inode], command.strip()))
    return found


def assert_nothing_left(seconds: float = 60.0) -> None:
    """No job in Slurm's queue (a completing one counts) and no process of a job on any host."""
    deadline = time.monotonic() + seconds
    while True:
        queue = run(["squeue", "-h", "-o", "%i %T %N"]).stdout.strip()
        strays = stray_processes()
        if not queue and not strays:
            return
        if time.monotonic() > deadline:
            pytest.fail(f"left after the job: queue {queue!r}, processes {strays}")
        time.sleep(0.5)


@pytest.fixture(autouse=True)
def nothing_left_after():
    """Every test starts on an idle cluster and leaves it idle."""
    assert_nothing_left()
    yield
    assert_nothing_left()


def test_sbatch_runs_the_example(tmp_path):
    output = tmp_path / "train.out"
    # The example as it stands: train_digits.py fails (non-zero) below 95% test accuracy.
    job = run(["sbatch", "--wait", f"--output={output}", "examples/slurm/train.sbatch"],
              env=job_environment(tmp_path, PYTHON=PYTHON))
    printed = output.read_text() if output.exists() else "(no output file)"
    assert job.returncode == 0, f"{job.stdout}{job.stderr}\n{printed}"
    assert re.search(r"^Submitted batch job \d+$", job.stdout, re.M), job.stdout
    assert "2 nodes x 2 tasks" in printed, printed
    found = re.search(r"trained in [\d.]+ s on (\d+) ranks; final test accuracy ([\d.]+)", printed)
    assert found, printed
    assert int(found[1]) == 4
    assert float(found[2]) >= 0.95, printed


def test_sbatch_job_with_srun(tmp_path):
    job = run(["sbatch", "--wait", "--nodes=2", "--ntasks-per-node=2",
               f"--output={tmp_path / 'job.out'}",
               f"--wrap=srun --mpi=pmix {PYTHON} {PROBE}"], env=job_environment(tmp_path))
    if job.returncode != 0:
        job.stdout += (tmp_path / "job.out").read_text()
    check_probe(tmp_path, ranks=4, per_node=2, output=job)


def test_salloc_then_mpirun_without_a_hostfile(tmp_path):
    # Open MPI 4.1 reads the allocation (SLURM_* variables) and starts its daemons with srun.
    job = run(["salloc", "--nodes=4", "--ntasks-per-node=2", "mpirun", PYTHON, PROBE],
              env=job_environment(tmp_path))
    check_probe(tmp_path, ranks=8, per_node=2, output=job)


def test_srun_onto_the_ranks_with_pmix(tmp_path):
    job = run(["srun", "--nodes=4", "--ntasks-per-node=2", "--mpi=pmix", PYTHON, PROBE],
              env=job_environment(tmp_path))
    check_probe(tmp_path, ranks=8, per_node=2, output=job)


def test_srun_without_pmix_fails_as_the_docs_say(tmp_path):
    """docs/guide/running.md: Open MPI 4.1 has no Slurm PMI-2 client, so --mpi=pmi2 (or no
    --mpi, with MpiDefault=none) cannot start ranks, and Open MPI says why."""
    plugins = run(["srun", "--mpi=list"]).stdout + run(["srun", "--mpi=list"]).stderr
    assert {"pmix", "pmi2"} <= set(plugins.split()), plugins
    for mpi in ("pmi2", "none"):
        job = run(["srun", "--nodes=2", "--ntasks-per-node=1", f"--mpi={mpi}", PYTHON, PROBE],
                  env=job_environment(tmp_path))
        assert job.returncode != 0, mpi
        assert "OMPI was not built with SLURM's PMI support" in job.stderr, (mpi, job.stderr)
        assert not list((tmp_path / "probe").iterdir()), mpi


def test_ringletrun_inside_an_allocation(tmp_path):
    job = run(["salloc", "--nodes=2", "--ntasks-per-node=2", PYTHON, "-m", "ringlet.run",
               "-np", "4", PYTHON, PROBE], env=job_environment(tmp_path))
    check_probe(tmp_path, ranks=4, per_node=2, output=job)


CUT_OFF_TIMEOUT = 15
"""RINGLET_TIMEOUT for the jobs whose host 3 is cut off."""


def cut_off_host_3(tmp_path: Path, launch: list[str]) -> tuple[str, int, float]:
    """Start `launch` (4 nodes x 1 rank, the probe's loop of allreduces), take host 3's link
    down once every rank is under way, and wait for the job's end: its output, exit status and
    seconds since the cut. The link comes back, and the host back into service, either way."""
    job = subprocess.Popen(
        [*launch, PYTHON, PROBE, "--loop", "300"], cwd=REPO, text=True,
        env=job_environment(tmp_path, RINGLET_TIMEOUT=str(CUT_OFF_TIMEOUT)),
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 120
        while len(list((tmp_path / "probe").glob("*.looping"))) < 4:
            if job.poll() is not None or time.monotonic() > deadline:
                job.kill()
                pytest.fail(f"the ranks did not all get under way: {job.communicate()[0]}")
            time.sleep(0.2)
        subprocess.run(["ip", "netns", "exec", "rgl-h3", "ip", "link", "set", "eth0", "down"],
                       check=True)
        cut = time.monotonic()
        output, _ = job.communicate(timeout=150)
        ended = time.monotonic() - cut
    finally:
        if job.poll() is None:
            job.kill()
        subprocess.run(["ip", "netns", "exec", "rgl-h3", "ip", "link", "set", "eth0", "up"],
                       check=True)
    states = run(["sinfo", "-h", "-n", "rgl-h3", "-o", "%T"]).stdout.strip()
    output += f"\n[rgl-h3 at the job's end: {states}]"
    # A host Slurm set DOWN stays so once it answers again: back into service, as an
    # administrator would.
    run(["scontrol", "update", "nodename=rgl-h3", "state=resume"])
    deadline = time.monotonic() + 90
    while run(["sinfo", "-h", "-n", "rgl-h3", "-o", "%T"]).stdout.strip() != "idle":
        assert time.monotonic() < deadline, run(["sinfo", "-N"]).stdout
        time.sleep(1)
    return output, job.returncode, ended


def test_a_node_cut_off_under_srun(tmp_path):
    """docs/guide/running.md, "A node that becomes unreachable": under srun --mpi=pmix, the
    ranks' RINGLET_TIMEOUT ends the job (MPI_Abort reaches slurmstepd, which cancels the step)
    although Slurm cannot reach the cut-off host; once its link is back, nothing is left."""
    output, status, ended = cut_off_host_3(
        tmp_path, ["srun", "--nodes=4", "--ntasks-per-node=1", "--mpi=pmix"])
    assert status != 0, output
    # RINGLET_TIMEOUT, then srun's wait for the step's end on the unreachable host.
    assert CUT_OFF_TIMEOUT <= ended < CUT_OFF_TIMEOUT + 30, (ended, output)
    assert f"(RINGLET_TIMEOUT={CUT_OFF_TIMEOUT}): ending the job" in output, output


def test_a_node_cut_off_under_salloc_and_mpirun(tmp_path):
    """The same under salloc + mpirun: the ranks give up, but mpirun waits for its daemon on the
    cut-off host; Slurm ends the job when it sets the host DOWN (SlurmdTimeout, 30 s here)."""
    output, status, ended = cut_off_host_3(
        tmp_path, ["salloc", "--nodes=4", "--ntasks-per-node=1", "mpirun"])
    assert status != 0, output
    assert f"(RINGLET_TIMEOUT={CUT_OFF_TIMEOUT}): ending the job" in output, output
    assert "Node failure on rgl-h3" in output, output
    assert "[rgl-h3 at the job's end: down" in output, output
    assert 30 <= ended < 90, (ended, output)


@interactive
def where_am_i():
    import socket

    import ringlet

    topology = ringlet.topology()
    return ringlet.rank(), socket.gethostname(), list(topology.hosts), topology.cross_size


def test_jupyter_engines_from_slurm(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # ipyparallel writes its batch script into the current directory
    monkeypatch.setenv("RINGLET_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("OMPI_MCA_mpi_yield_when_idle", "1")
    cluster, view = jupyter.start(n=4, engines="slurm", progress=False, timeout=180,
                                  sbatch_args=["--nodes=2", "--ntasks-per-node=2"],
                                  profile_dir=str(tmp_path / "profile"))
    try:
        found = jupyter.run(view, where_am_i)
        assert [rank for rank, *_ in found] == [0, 1, 2, 3]
        hostnames = [host for _, host, *_ in found]
        # Two engines on each of two hosts, none on the notebook's unless Slurm chose it.
        assert hostnames[0] == hostnames[1] != hostnames[2] == hostnames[3], hostnames
        assert all(hosts == hostnames and cross == 2 for *_, hosts, cross in found), found
        expected = sum(np.arange(1000, dtype=np.float32) + r for r in range(4))
        for two_tier, ring in jupyter.run(view, allreduce_of_ranks):
            np.testing.assert_array_equal(two_tier, expected)
            np.testing.assert_array_equal(ring, expected)
        with pytest.raises(jupyter.EngineError) as caught:
            jupyter.run(view, mismatched)
        assert {rank: name for rank, (name, _) in caught.value.errors.items()} == \
            dict.fromkeys(range(4), "MismatchError")
        for two_tier, _ in jupyter.run(view, allreduce_of_ranks):
            np.testing.assert_array_equal(two_tier, expected)
    finally:
        cluster_id = cluster.cluster_id
        cluster.stop_cluster_sync()
    assert wait_until_gone(cluster_id) == [], "processes of the cluster outlived its stop"
