"""Where an elastic job may run: hosts found by a discovery script, given with ``-H``, or the
Slurm allocation's; which of them are blacklisted after a failure, and until when; and how
ranks are laid out on them (Horovod's rules, ``horovod/runner/elastic/discovery.py``)."""

from __future__ import annotations

import random
import re
import subprocess
import time
from collections.abc import Mapping
from dataclasses import dataclass, field

__all__ = [
    "Blacklist",
    "DiscoveryError",
    "FixedHosts",
    "ScriptDiscovery",
    "Slot",
    "assign",
    "count_hosts",
    "parse_discovery_output",
    "slurm_hosts",
]

Hosts = dict[str, int]
"""Host name to slots, in the order found."""

_LINE = re.compile(r"([A-Za-z0-9_.\-]+|\[[0-9A-Fa-f:]+\])(?::(\d+))?\Z")


class DiscoveryError(RuntimeError):
    """The hosts cannot be found: the discovery script failed or printed what is no host."""


def parse_discovery_output(text: str, default_slots: int, source: str) -> Hosts:
    """``host`` or ``host:slots`` lines (blank lines and ``#`` comments skipped); a bare host
    has ``default_slots``. DiscoveryError naming the first line that is neither."""
    hosts: Hosts = {}
    for number, line in enumerate(text.splitlines(), 1):
        item = line.split("#", 1)[0].strip()
        if not item:
            continue
        match = _LINE.match(item)
        if match is None or (match[2] is not None and int(match[2]) < 1):
            raise DiscoveryError(
                f"{source} printed {line.strip()!r} on line {number}: expected one host per "
                "line, as 'host' or 'host:slots' (slots >= 1)")
        hosts[match[1]] = int(match[2]) if match[2] is not None else default_slots
    return hosts


class ScriptDiscovery:
    """Hosts from ``--host-discovery-script``: an executable that prints the hosts
    available now, one per line, as horovodrun's does."""

    def __init__(self, script: str, default_slots: int, timeout: float = 30.0) -> None:
        self.script, self.default_slots, self.timeout = script, default_slots, timeout

    def __str__(self) -> str:
        return f"the host discovery script {self.script}"

    def find(self) -> Hosts:
        try:
            done = subprocess.run(self.script, shell=True, capture_output=True, text=True,
                                  timeout=self.timeout, check=False)
        except subprocess.TimeoutExpired:
            raise DiscoveryError(f"{self} did not finish within {self.timeout:.0f} s") from None
        if done.returncode != 0:
            said = done.stderr.strip().splitlines()[-1:] or ["nothing on stderr"]
            raise DiscoveryError(f"{self} failed with exit code {done.returncode}: {said[0]}")
        return parse_discovery_output(done.stdout, self.default_slots, str(self))


class FixedHosts:
    """Hosts given once (``-H``, ``--hostfile`` or the Slurm allocation): they change only by
    blacklisting."""

    def __init__(self, hosts: Hosts, what: str) -> None:
        self.hosts, self.what = dict(hosts), what

    def __str__(self) -> str:
        return self.what

    def find(self) -> Hosts:
        return dict(self.hosts)


def _expand_tasks(text: str) -> list[int]:
    """Slurm's ``2(x3),1`` as [2, 2, 2, 1]."""
    counts: list[int] = []
    for item in text.split(","):
        match = re.fullmatch(r"(\d+)(?:\(x(\d+)\))?", item.strip())
        if match is None:
            raise DiscoveryError(f"cannot read Slurm's task counts {text!r}")
        counts += [int(match[1])] * int(match[2] or 1)
    return counts


def slurm_hosts(environ: Mapping[str, str]) -> Hosts | None:
    """The allocation's hosts and their tasks (``SLURM_JOB_NODELIST`` through ``scontrol
    show hostnames``, ``SLURM_TASKS_PER_NODE``), inside a Slurm allocation; else None."""
    nodelist = environ.get("SLURM_JOB_NODELIST") or environ.get("SLURM_NODELIST")
    if not nodelist:
        return None
    try:
        names = subprocess.run(["scontrol", "show", "hostnames", nodelist], check=True,
                               capture_output=True, text=True, timeout=30).stdout.split()
    except (OSError, subprocess.SubprocessError) as error:
        raise DiscoveryError(f"cannot expand Slurm's node list {nodelist!r} with scontrol: "
                             f"{error}") from None
    tasks = environ.get("SLURM_TASKS_PER_NODE") or environ.get("SLURM_JOB_CPUS_PER_NODE", "1")
    counts = _expand_tasks(tasks)
    if len(counts) != len(names):
        counts = (counts * len(names))[: len(names)] if len(counts) == 1 else counts
    if len(counts) != len(names):
        raise DiscoveryError(f"Slurm lists {len(names)} nodes but tasks for {len(counts)} "
                             f"({tasks!r})")
    return dict(zip(names, counts, strict=True))


@dataclass
class _Entry:
    until: float = 0.0
    times: int = 0


@dataclass
class Blacklist:
    """Hosts whose ranks failed. Without a cooldown range a host stays out for good; with
    ``(low, high)`` seconds it comes back after ``low * 2**n + U(0, 1) * low`` seconds for its
    n-th time, clamped to the range (Horovod's exponential backoff)."""

    cooldown: tuple[float, float] | None = None
    entries: dict[str, _Entry] = field(default_factory=dict)
    clock: object = time.monotonic

    def add(self, host: str) -> None:
        now = self._now()
        entry = self.entries.setdefault(host, _Entry())
        if entry.until > now:
            return
        entry.times += 1
        if self.cooldown is None:
            entry.until = float("inf")
        else:
            low, high = self.cooldown
            delay = low * (1 << entry.times) + random.uniform(0, 1) * low
            entry.until = now + max(low, min(high, delay))

    def excludes(self, host: str) -> bool:
        entry = self.entries.get(host)
        return entry is not None and entry.until > self._now()

    def soonest_return(self) -> float | None:
        """Seconds until the next blacklisted host comes back; None if none will."""
        now = self._now()
        waits = [e.until - now for e in self.entries.values() if now < e.until < float("inf")]
        return min(waits) if waits else None

    def _now(self) -> float:
        return self.clock()  # type: ignore[operator]


@dataclass(frozen=True)
class Slot:
    """Where one rank of a job runs: its host (as discovered) and its place there."""

    host: str
    local_rank: int


def assign(hosts: Hosts, previous: list[str], max_np: int) -> list[Slot]:
    """The ranks of the next job, at most ``max_np``: hosts that ran the previous job first, in
    their order (so rank 0, the root that synchronizes the state, is on the oldest host), then
    new hosts in discovery order, each host's slots filled before the next's."""
    order = [h for h in previous if h in hosts] + [h for h in hosts if h not in previous]
    slots: list[Slot] = []
    for host in order:
        for local in range(hosts[host]):
            if len(slots) == max_np:
                return slots
            slots.append(Slot(host, local))
    return slots


def count_hosts(slots: list[Slot]) -> Hosts:
    """How many of ``slots`` each host has, in the slots' order."""
    hosts: Hosts = {}
    for slot in slots:
        hosts[slot.host] = hosts.get(slot.host, 0) + 1
    return hosts
