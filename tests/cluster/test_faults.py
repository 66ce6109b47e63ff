"""Faults across hosts on the emulated cluster (tools/emulated_cluster.sh, 4 hosts at 1 Gbit/s,
brought up by tests/cluster/run.sh): a host's link cut mid-allreduce, a rank killed
with SIGKILL on another host, one host's link slowed tenfold.

Run with plain pytest on this machine (root; not under mpirun): each test launches its own
job of tests/cluster/fault_job.py (4 hosts x 1 rank), makes the fault, and checks
how the job ends (exit code, seconds after the fault, each rank's own log, what is left
running). Every wait is bounded: a job still running at its limit fails the test and is
killed, and each test restores the links and ends whatever its job left behind (processes in
its job's session only: the cluster may be shared, under tests/cluster/run.sh's lock).
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
CLUSTER = ROOT / "tools" / "emulated_cluster.sh"
JOB = ROOT / "tests" / "cluster" / "fault_job.py"
SHAPE = ROOT / "build" / "emulated-cluster" / "shape"
HOSTS = 4
CUT_HOST = 3  # the host (and, one rank per host by node, the rank) each fault hits


def run(*command: str) -> str:
    return subprocess.run(command, check=True, capture_output=True, text=True,
                          timeout=30).stdout


def on_host(host: int, *command: str) -> str:
    return run("ip", "netns", "exec", f"rgl-h{host}", *command)


@pytest.fixture(scope="module", autouse=True)
def cluster():
    """The cluster run.sh brought up: 4 hosts (a missing cluster fails, it is not skipped)."""
    assert SHAPE.exists(), "no emulated cluster: run tests/cluster/run.sh"
    hosts, rate = SHAPE.read_text().split()
    assert int(hosts) >= HOSTS, f"the fault tests need {HOSTS} hosts, the cluster has {hosts}"
    return rate


@dataclass
class Job:
    """One mpirun of fault_job.py, 4 hosts x 1 rank, in a session of its own."""

    logs: Path
    env: dict[str, str]
    seconds: float = 120.0
    elements: int = 1 << 18
    iterations: int | None = None  # exactly this many allreduces, instead of ``seconds``
    ringletrun: bool = False  # started by ringletrun (on host 0), not the cluster's mpirun line
    process: subprocess.Popen | None = None
    started: float = 0.0
    pids: dict[int, int] = field(default_factory=dict)
    ended_at: dict[int, float] = field(default_factory=dict)

    def start(self) -> None:
        self.logs.mkdir(parents=True, exist_ok=True)
        self.output = open(self.logs / "mpirun.out", "w")  # closed in end_leftovers
        program = [sys.executable, str(JOB), str(self.logs), str(self.seconds),
                   str(self.elements),
                   *([str(self.iterations)] if self.iterations is not None else [])]
        launch = [str(CLUSTER), "mpirun", "-n", str(HOSTS), "--map-by", "node"]
        if self.ringletrun:
            launch = [str(CLUSTER), "on", "0", sys.executable, "-m", "ringlet.run",
                      "--mpi-launcher", shutil.which("mpirun") or "mpirun", "-H",
                      ",".join(f"10.77.0.{10 + h}:1" for h in range(HOSTS)),
                      "--mpi-args", shlex.join(network_options())]
        self.process = subprocess.Popen(
            [*launch, *program], cwd=ROOT, env={**os.environ, **self.env},
            stdout=self.output, stderr=subprocess.STDOUT, start_new_session=True)
        self.started = time.monotonic()

    def log(self, rank: int) -> str:
        path = self.logs / f"rank{rank}.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def mpirun_output(self) -> str:
        return (self.logs / "mpirun.out").read_text(errors="replace")

    def wait_ready(self, timeout: float = 90) -> None:
        """Until every rank has made its first allreduce (calibration included)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                pytest.fail(f"the job ended before the fault:\n{self.everything()}")
            if all("\nready\n" in self.log(rank) for rank in range(HOSTS)):
                for rank in range(HOSTS):
                    self.pids[rank] = int(re.search(r"pid (\d+)", self.log(rank))[1])
                return
            time.sleep(0.2)
        pytest.fail(f"the ranks were not ready after {timeout} s:\n{self.everything()}")

    def wait_end(self, limit: float) -> float:
        """Seconds until mpirun ended (failing the test past ``limit``), noting when each rank's
        process ended."""
        deadline = time.monotonic() + limit
        while self.process.poll() is None and time.monotonic() < deadline:
            self.note_ended_ranks()
            time.sleep(0.2)
        self.note_ended_ranks()
        if self.process.poll() is None:
            pytest.fail(f"the job still ran {limit} s later:\n{self.everything()}")
        return time.monotonic()

    def note_ended_ranks(self) -> None:
        for rank, pid in self.pids.items():
            if rank not in self.ended_at and not alive(pid):
                self.ended_at[rank] = time.monotonic()

    def left_running(self) -> list[tuple[int, str, str]]:
        """(pid, command, host) of every process still in this job's session."""
        if self.process is None:
            return []
        found = []
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            try:
                stat = (entry / "stat").read_text()
                command = (entry / "comm").read_text().strip()
            except OSError:
                continue
            session = int(stat.rsplit(")", 1)[1].split()[3])  # after state, ppid, pgrp
            if session == self.process.pid:
                pid = int(entry.name)
                host = subprocess.run(["ip", "netns", "identify", str(pid)],
                                      capture_output=True, text=True).stdout.strip()
                found.append((pid, command, host or "this machine"))
        return found

    def end_leftovers(self) -> None:
        for pid, _, _ in self.left_running():
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        if self.process is not None and self.process.poll() is None:
            self.process.wait(timeout=10)
        self.output.close()

    def everything(self) -> str:
        logs = "\n".join(f"--- rank {r}:\n{self.log(r)[-3000:]}" for r in range(HOSTS))
        return f"{logs}\n--- mpirun:\n{self.mpirun_output()[-3000:]}"


def network_options() -> list[str]:
    """The emulated cluster's mpirun options (its network, its ssh agent) without the hostfile
    and the TCP keepalive, which a ringletrun job must get from ringletrun."""
    words = run(str(CLUSTER), "options").split()
    kept: list[str] = []
    i = 0
    while i < len(words):
        if words[i] == "--hostfile":
            i += 2
        elif i + 1 < len(words) and "keepalive" in words[i + 1]:
            i += 3
        else:
            kept.append(words[i])
            i += 1
    assert "keepalive" not in " ".join(kept) and kept, words
    return kept


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie has ended (its parent has not reaped it yet).
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


@pytest.fixture(scope="module")
def cache(tmp_path_factory) -> Path:
    """One calibration cache for the module's jobs (the first calibrates; not the user's)."""
    return tmp_path_factory.mktemp("calibration-cache")


@pytest.fixture
def job(tmp_path, cluster, cache):
    """A job to start, and afterwards: the links as they were, nothing of the job running."""
    jobs: list[Job] = []

    def make(env: dict[str, str], **options) -> Job:
        jobs.append(Job(logs=tmp_path / "job", env={"RINGLET_CACHE_DIR": str(cache), **env},
                        **options))
        return jobs[-1]

    yield make
    for host in range(HOSTS):
        on_host(host, "ip", "link", "set", "eth0", "up")
    set_rate(CUT_HOST, cluster)
    for each in jobs:
        each.end_leftovers()
        assert each.left_running() == [], "the job's processes could not be ended"


def set_rate(host: int, rate: str) -> None:
    """``host``'s link to ``rate`` both ways (burst and queue as tools/emulated_cluster.sh sets
    them up: its `rate` command)."""
    run(str(CLUSTER), "rate", str(host), rate)


def names_host(message: str, host: int) -> bool:
    """Whether a stall message names the host: by name (the stall inspector's messages name
    the peer's host as well as its rank, "rank 3 (host rgl-h3)"), or by its one rank."""
    return f"rgl-h{host}" in message or re.search(rf"\brank\(?s?\)? ({host})\b", message) \
        is not None or re.search(rf"rank\(s\) [\d, ]*\b{host}\b", message) is not None


TIMEOUT = 30  # RINGLET_TIMEOUT in the link test: longer than mpirun's detection (10-15 s)
ABORT_GRACE = 3  # src/transport/mpi.rs: a rank whose MPI_Abort has not returned ends itself


@pytest.mark.parametrize("ringletrun", [False, True], ids=["mpirun", "ringletrun"])
def test_a_host_cut_off_mid_allreduce_ends_the_job(job, ringletrun):
    """Host 3's link goes down mid-loop, under the cluster's mpirun line or a job started by
    ringletrun (which must give mpirun the keepalive itself: without it such a job ran on until
    killed, 141 s later). Rank 0 soon names rank 3 as the one that has not
    joined; mpirun learns the host is gone (TCP keepalive on its connections, 10-15 s:
    tools/emulated_cluster.sh's options) and ends the job, non-zero, within 60 s of the cut,
    naming the host. The cut-off rank, which mpirun cannot reach, is ended by its own daemon
    (keepalive too) or gives up after RINGLET_TIMEOUT and ends itself when its MPI_Abort cannot
    (the abort's grace). No rank is left running; the cut-off host's daemon may be (the
    launcher's or scheduler's to clean, docs/guide/failures.md), and the test ends it."""
    fault = job(env={"RINGLET_TIMEOUT": str(TIMEOUT), "RINGLET_STALL_WARNING": "2"},
                ringletrun=ringletrun)
    fault.start()
    fault.wait_ready()
    time.sleep(2)
    on_host(CUT_HOST, "ip", "link", "set", "eth0", "down")
    cut = time.monotonic()
    ended = fault.wait_end(limit=75) - cut
    # mpirun may end before the cut-off rank has: wait for it too (it must end by itself).
    deadline = cut + TIMEOUT + ABORT_GRACE + 10
    while len(fault.ended_at) < HOSTS and time.monotonic() < deadline:
        fault.note_ended_ranks()
        time.sleep(0.2)
    report = fault.everything()
    print(f"mpirun ended {ended:.1f} s after the cut (exit {fault.process.returncode}); "
          f"ranks ended after {({r: round(t - cut, 1) for r, t in fault.ended_at.items()})} s")
    assert fault.process.returncode != 0, report
    assert ended <= 60, report
    # The launcher says which host it lost.
    assert re.search(rf"rgl-h{CUT_HOST}\b|10\.77\.0\.{10 + CUT_HOST}\b",
                     fault.mpirun_output()), report
    # Rank 0's stall summary names the rank and its host: "rank(s) 3 (host rgl-h3) have not
    # joined it".
    summary = [line for line in fault.log(0).splitlines() if "have not joined" in line]
    assert summary and re.search(rf"rank\(s\) {CUT_HOST} \(host rgl-h{CUT_HOST}\) have not",
                                 summary[0]), report
    # No rank is left waiting: each one's process ended by the timeout and the abort's grace
    # (and a few seconds' slack on this shared machine) after the cut.
    assert set(fault.ended_at) == set(range(HOSTS)), report
    for rank, at in fault.ended_at.items():
        assert at - cut <= TIMEOUT + ABORT_GRACE + 5, (rank, at - cut, report)
        assert "WRONG" not in fault.log(rank), report
    left = fault.left_running()
    print(f"left running after mpirun: {left}")
    assert all(command == "orted" and host == f"rgl-h{CUT_HOST}" for _, command, host in left), \
        left


def test_a_rank_killed_on_another_host_ends_the_job(job):
    """SIGKILL to host 2's rank mid-loop: its daemon reports it, and mpirun ends every rank and
    exits non-zero within 10 s."""
    fault = job(env={"RINGLET_STALL_WARNING": "2"})
    fault.start()
    fault.wait_ready()
    time.sleep(2)
    victim = 2
    assert f"host rgl-h{victim}" in fault.log(victim)
    os.kill(fault.pids[victim], signal.SIGKILL)
    killed = time.monotonic()
    ended = fault.wait_end(limit=30) - killed
    report = fault.everything()
    print(f"mpirun ended {ended:.1f} s after the kill (exit {fault.process.returncode})")
    assert fault.process.returncode != 0, report
    assert ended <= 10, report
    assert re.search(rf"process rank {victim} with PID {fault.pids[victim]} on node \S+ exited "
                     r"on signal 9", fault.mpirun_output()), report
    assert set(fault.ended_at) == set(range(HOSTS)), report
    assert fault.left_running() == [], fault.left_running()


def test_a_host_slowed_tenfold_gives_exact_results(job, cluster):
    """Host 3's link at a tenth of the rate, both ways, from the job's start: every allreduce is
    exact (checked against NumPy in fault_job.py), the job ends normally, and a stall report,
    if one comes, names the slow host's rank."""
    assert re.fullmatch(r"\d+gbit", cluster), f"the test slows a link of whole Gbit/s: {cluster}"
    slow = f"{int(cluster[:-4]) * 100}mbit"
    # A fixed number of 4 MiB allreduces and nothing else: a small collective between them (a
    # time-based stop) would make the fast ranks wait for ranks that wait for the slow one.
    fault = job(env={"RINGLET_STALL_WARNING": "1"}, elements=1 << 20, iterations=6)
    set_rate(CUT_HOST, slow)
    shown = f"rate {int(cluster[:-4]) * 100}Mbit"  # as tc prints it
    assert shown in run("tc", "qdisc", "show", "dev", f"rglv{CUT_HOST}")
    assert shown in on_host(CUT_HOST, "tc", "qdisc", "show", "dev", "eth0")
    fault.start()
    fault.wait_ready(timeout=120)
    fault.wait_end(limit=90)
    report = fault.everything()
    assert fault.process.returncode == 0, report
    for rank in range(HOSTS):
        assert re.search(r"done: \d+ allreduces exact", fault.log(rank)), report
        assert "WRONG" not in fault.log(rank), report
    stalls = [line for rank in range(HOSTS) for line in fault.log(rank).splitlines()
              if "has waited" in line]
    print(f"{len(stalls)} stall report(s): {stalls[:4]}")
    for line in stalls:
        waiter = int(re.search(r"rank (\d+) has waited", line)[1]) if "rank(s)" not in line \
            else None
        assert names_host(line, CUT_HOST) or waiter == CUT_HOST, (line, report)


def test_a_damaged_cache_warns_once_across_hosts(job, cache):
    """On ranks that span hosts both init (the message pieces between hosts) and the first
    auto call look for the cached calibration: a truncated file is still one warning, on rank
    0, and the job recalibrates, runs exactly and leaves a valid file."""
    first = job(env={}, seconds=0)
    first.start()
    first.wait_end(limit=120)
    assert first.process.returncode == 0, first.everything()
    files = sorted(cache.glob("calibration-*.json"))
    assert files, "the first job saved its calibration"
    for path in files:
        text = path.read_text()
        path.write_text(text[: len(text) // 2])
    damaged = job(env={}, seconds=0)
    damaged.logs = damaged.logs.with_name("damaged")
    damaged.start()
    damaged.wait_end(limit=120)
    report = damaged.everything()
    assert damaged.process.returncode == 0, report
    warned = [r for r in range(HOSTS) for line in damaged.log(r).splitlines()
              if "unreadable calibration cache" in line]
    assert warned == [0], report
    assert all("done: " in damaged.log(r) for r in range(HOSTS)), report
    from ringlet.calibration import CACHE_FORMAT

    for path in files:
        assert json.loads(path.read_text())["format"] == CACHE_FORMAT
