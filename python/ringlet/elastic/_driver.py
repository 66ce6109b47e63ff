"""The elastic driver: ``ringletrun`` with ``--min-np``/``--max-np``/``--host-discovery-script``.

It runs the job as MPI jobs, one after another, each on the hosts available when it starts
(``mpirun`` itself, as ``ringletrun`` builds it). While a job runs the driver rediscovers the
hosts every second and tells the ranks when they change; rank 0 sends it each committed state.
When a job ends it decides what comes next:

- every rank finished its function: the driver exits 0;
- the hosts changed (the ranks stopped at a commit, saying ``reset``): the next job runs on the
  new hosts;
- a rank failed (it raised, was killed, or its host went silent): its host is blacklisted,
  and the next job runs on the hosts left, from the last commit the driver holds.

Under ULFM (``ElasticSettings.ulfm``) a rank that dies does not end its job: its host is
blacklisted, the reset counted, and the survivors go on; the job is restarted only when hosts
are added (the new ranks join at a restart), or when fewer than ``--min-np`` ranks are left.

It ends the run with an error when fewer than ``--min-np`` slots stay available for longer
than the elastic timeout, when every rank failed, when every host is blacklisted, or when the
next job would pass ``--reset-limit``.
"""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from multiprocessing.connection import Connection, Listener
from typing import Any, TextIO

from . import _protocol
from ._hosts import (
    Blacklist,
    DiscoveryError,
    FixedHosts,
    Hosts,
    ScriptDiscovery,
    Slot,
    assign,
    count_hosts,
)
from ._protocol import Ack, Bye, Commit, Fetch, Hello, HostsUpdated, Stored

__all__ = ["ElasticError", "ElasticSettings", "run"]

DISCOVERY_SECONDS = float(os.environ.get("RINGLET_ELASTIC_DISCOVERY_INTERVAL", "1.0"))
"""How often the hosts are rediscovered (Horovod's DISCOVER_HOSTS_FREQUENCY_SECS)."""
DEFAULT_TIMEOUT = 600.0
"""Horovod's default elastic timeout."""
DIED_GRACE = 1.0
"""Seconds between a rank's death and the driver ending its job (the launcher's own report of
which process died usually comes first)."""
LEFT_BEHIND_GRACE = 2.0
"""Under ULFM: how long a rank must have been dead, its job still running, to count as left
behind. A job that ends closes all its ranks' connections within that time; PRRTE, which
cannot survive a lost host (its daemon), ends the job too."""
SILENT_SECONDS = 5.0
"""After the launcher has exited, how long a rank's connection may stay open before its host
counts as lost (a host whose link is down never closes it)."""

EXITED_MESSAGE = ("ringlet's elastic driver: one or more processes exited with non-zero "
                  "status, thus causing the job to be terminated. The first process to do so "
                  "was:\nProcess name: {name}\nExit code: {code}")
RESET_LIMIT_MESSAGE = ("ringlet's elastic driver was shut down because the number of resets "
                       "during the elastic job exceeded its limit: {limit}")


class ElasticError(RuntimeError):
    """The elastic run cannot go on; the message says why."""


@dataclass
class ElasticSettings:
    """horovodrun's elastic options, checked."""

    discovery: ScriptDiscovery | FixedHosts
    np: int
    min_np: int
    max_np: int
    timeout: float = DEFAULT_TIMEOUT
    reset_limit: int | None = None
    cooldown: tuple[float, float] | None = None
    verbose: bool = False
    ulfm: bool = False
    """The jobs run under ULFM (Open MPI 5's ``--with-ft ulfm``): a rank that dies is left
    behind, its host blacklisted, and the survivors go on in the same job; only a change of
    hosts (or fewer than ``min_np`` ranks left) restarts it."""

    def __post_init__(self) -> None:
        if self.min_np < 1:
            raise ValueError(f"--min-np must be at least 1, got {self.min_np}")
        if self.min_np > self.max_np:
            raise ValueError(f"--min-np ({self.min_np}) is larger than --max-np "
                             f"({self.max_np}): no job size satisfies both")
        if not self.min_np <= self.np <= self.max_np:
            raise ValueError(f"-np ({self.np}) must lie between --min-np ({self.min_np}) and "
                             f"--max-np ({self.max_np})")
        if self.cooldown is not None:
            low, high = self.cooldown
            if not 1 <= low <= high <= 3600:
                raise ValueError(f"--blacklist-cooldown-range takes two numbers of seconds, "
                                 f"1 <= low <= high <= 3600, got {low} {high}")
        if self.reset_limit is not None and self.reset_limit < 0:
            raise ValueError(f"--reset-limit must be at least 0, got {self.reset_limit}")


@dataclass
class _Rank:
    """What the driver knows of one rank of the running job."""

    slot: Slot
    pid: int = 0
    bye: Bye | None = None
    closed_at: float | None = None
    connection: Connection | None = None
    dead: bool = False
    """Died and left behind, the survivors going on without it (ULFM)."""

    @property
    def closed_without_a_word(self) -> bool:
        """Started, then closed its connection without saying why: it died (one that ends
        says so)."""
        return bool(self.pid) and self.bye is None and self.closed_at is not None


@dataclass
class _Job:
    """One MPI job of the run, as the driver follows it."""

    generation: int
    slots: list[Slot]
    hosts: Hosts
    ranks: dict[int, _Rank] = field(default_factory=dict)
    updates: int = 0
    removed_only: bool = True
    named_in_output: set[int] = field(default_factory=set)
    pids_in_output: set[int] = field(default_factory=set)
    hosts_in_output: set[str] = field(default_factory=set)
    ended_badly: dict[int, int] = field(default_factory=dict)
    """Under ULFM, the ranks whose program said it ended badly, with its status."""
    notified_for: list[Slot] | None = None
    """The slots the ranks were last told the hosts changed to."""
    ending_since: float | None = None
    """When the driver began ending the job (ULFM: a rank raised)."""
    exited_at: float | None = None
    """When the driver saw the launcher exit."""

    def live_slots(self) -> list[Slot]:
        """The slots of the ranks that have not died (all of them but under ULFM)."""
        return [rank.slot for rank in self.ranks.values() if not rank.dead]


class _Store:
    """The last committed state rank 0 sent (it outlives every job)."""

    def __init__(self) -> None:
        self.sequence = 0
        self.payload: bytes | None = None


# What launchers print about the process that ended a job, by rank or by PID.
_RANK_PATTERNS = (
    re.compile(r"noticed that process rank (\d+) with PID"),
    re.compile(r"MPI_ABORT was invoked on rank (\d+)"),
    re.compile(r"Process name: \[\[\d+,\d+\],(\d+)\]"),
    re.compile(r"RANK (\d+) PID \d+ RUNNING AT"),
)
_PID_PATTERNS = (re.compile(r"PID (\d+) RUNNING AT"),)
# What Open MPI prints about a host whose daemon it lost (4.x's ORTE, 5's PRRTE).
_HOST_PATTERNS = (re.compile(r"Remote daemon: \[\[\d+,\d+\],\d+\] on node (\S+)"),
                  re.compile(r"Remote daemon: \[\S+@\d+,\d+\] on node (\S+)"),
                  re.compile(r"lost communication with a remote daemon.*?on node (\S+)"))


class _Driver:
    def __init__(self, settings: ElasticSettings,
                 command_for: Callable[[list[Slot], dict[str, str]], list[str]],
                 environ: dict[str, str], out: TextIO, err: TextIO) -> None:
        self.settings, self.command_for, self.environ = settings, command_for, environ
        self.started = time.monotonic()
        self.out, self.err = out, err
        self.blacklist = Blacklist(settings.cooldown)
        self.store = _Store()
        self.lock = threading.Lock()
        self.job: _Job | None = None
        self.key = _protocol.new_key()
        # Every rank of a job connects at once: a backlog for all of them (Listener's is 1).
        self.listener = Listener(("0.0.0.0", 0), backlog=1024, authkey=self.key)
        self.port = self.listener.address[1]
        self.closed = False
        self.last_found: Hosts = {}
        self.resets = 0
        self.fatal: ElasticError | None = None
        """Why the running job was ended and the run cannot go on (ULFM's reset limit)."""
        threading.Thread(target=self._accept, name="ringlet-elastic-accept", daemon=True).start()

    def say(self, text: str) -> None:
        elapsed = time.monotonic() - self.started
        print(f"ringletrun: elastic: [{elapsed:.1f} s] {text}", file=self.err, flush=True)

    # -- the hosts ------------------------------------------------------------------------

    def discover(self, first: bool = False) -> Hosts:
        """The discovered hosts; on a failure after the first, the last ones found."""
        try:
            self.last_found = self.settings.discovery.find()
        except DiscoveryError as error:
            if first:
                raise ElasticError(str(error)) from None
            self.say(f"warning: {error}; keeping the hosts found before")
        return self.last_found

    def available(self, hosts: Hosts) -> Hosts:
        return {h: n for h, n in hosts.items() if not self.blacklist.excludes(h)}

    def wait_for_slots(self, wanted: int, first: bool) -> Hosts:
        """Hosts with at least ``wanted`` slots not blacklisted, rediscovered each second;
        ElasticError after the timeout."""
        deadline = time.monotonic() + self.settings.timeout
        said = False
        while True:
            hosts = self.available(self.discover(first))
            first = False
            if sum(hosts.values()) >= wanted:
                return hosts
            found = self.last_found
            if found and all(self.blacklist.excludes(h) for h in found) and (
                    self.blacklist.soonest_return() is None):
                raise ElasticError(
                    "every host is blacklisted (its ranks failed), and none will come back "
                    f"(no --blacklist-cooldown-range): {', '.join(found)}")
            if time.monotonic() > deadline:
                raise ElasticError(
                    f"timed out after {self.settings.timeout:.0f} s waiting for {wanted} slots "
                    f"to become available (found {sum(hosts.values())}: "
                    f"{_describe_hosts(hosts) or 'none'}; blacklisted: "
                    f"{', '.join(h for h in found if self.blacklist.excludes(h)) or 'none'}); "
                    "check that there are enough resources for --min-np processes, or raise "
                    "--elastic-timeout")
            if not said:
                self.say(f"waiting for {wanted} slots (have {sum(hosts.values())})")
                said = True
            time.sleep(DISCOVERY_SECONDS)

    # -- the ranks' connections -----------------------------------------------------------

    def _accept(self) -> None:
        while True:
            try:
                connection = self.listener.accept()
            except OSError:
                if self.closed:
                    return
                continue  # a probe, or a peer without the key
            except Exception:
                continue
            threading.Thread(target=self._serve, args=(connection,), daemon=True).start()

    def _serve(self, connection: Connection) -> None:
        rank: _Rank | None = None
        try:
            while True:
                message = connection.recv()
                with self.lock:
                    job = self.job
                    if isinstance(message, Hello) and job is not None:
                        rank = job.ranks.get(message.rank)
                        if rank is not None:
                            rank.pid, rank.connection = message.pid, connection
                            if job.updates:
                                connection.send(HostsUpdated(job.updates, job.removed_only))
                    elif isinstance(message, Commit):
                        self.store.sequence, self.store.payload = message.sequence, message.payload
                        connection.send(Ack(message.sequence))
                    elif isinstance(message, Fetch):
                        connection.send(Stored(self.store.sequence, self.store.payload))
                    elif isinstance(message, Bye) and rank is not None:
                        rank.bye = message
        except (EOFError, OSError):
            pass
        finally:
            with self.lock:
                if rank is not None and rank.closed_at is None:
                    rank.closed_at = time.monotonic()
                    rank.connection = None
            connection.close()

    def notify(self, job: _Job, removed_only: bool) -> None:
        with self.lock:
            job.updates += 1
            job.removed_only = job.removed_only and removed_only
            message = HostsUpdated(job.updates, job.removed_only)
            for rank in job.ranks.values():
                if rank.connection is not None:
                    try:
                        rank.connection.send(message)
                    except OSError:
                        pass

    # -- one job ---------------------------------------------------------------------------

    def addresses(self, slots: list[Slot]) -> str:
        """Where ranks reach the driver: its address towards each host, then loopback."""
        found: list[str] = []
        for host in dict.fromkeys(s.host for s in slots):
            try:
                with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
                    probe.connect((socket.gethostbyname(host), 9))  # sends nothing
                    address = probe.getsockname()[0]
            except OSError:
                continue
            if address not in found and not address.startswith("127."):
                found.append(address)
        return ",".join(f"{a}:{self.port}" for a in [*found, "127.0.0.1"])

    def run_job(self, job: _Job) -> int:
        env = dict(self.environ)
        env.update({
            _protocol.ADDRESS: self.addresses(job.slots),
            _protocol.KEY: self.key.hex(),
            _protocol.GENERATION: str(job.generation),
            _protocol.RESUMED: "1" if self.store.payload is not None else "0",
            _protocol.SLOTS: ",".join(f"{s.host}:{s.local_rank}" for s in job.slots),
        })
        command = self.command_for(job.slots, env)
        self.say(f"job {job.generation}: {len(job.slots)} ranks on "
                 f"{_describe_hosts(count_hosts(job.slots))}")
        if self.settings.verbose:
            self.say(" ".join(command))
        with self.lock:
            job.ranks = {r: _Rank(slot) for r, slot in enumerate(job.slots)}
            self.job = job
        process = subprocess.Popen(command, env=env, stdout=subprocess.PIPE,
                                   stderr=subprocess.PIPE, text=True, errors="replace",
                                   start_new_session=True)
        relays = [threading.Thread(target=self._relay, args=(stream, sink, job), daemon=True)
                  for stream, sink in ((process.stdout, self.out), (process.stderr, self.err))]
        for relay in relays:
            relay.start()
        try:
            ending_since: float | None = None
            while process.poll() is None:
                if self.settings.ulfm:
                    self._leave_the_dead_behind(job, process)
                self._watch_hosts(job)
                if not self.settings.ulfm:
                    ending_since = self._end_if_a_rank_died(job, process, ending_since)
                try:
                    process.wait(min(DISCOVERY_SECONDS, 0.25))
                except subprocess.TimeoutExpired:
                    pass
        except KeyboardInterrupt:
            os.killpg(process.pid, signal.SIGINT)
            process.wait()
            raise
        job.exited_at = time.monotonic()
        for relay in relays:
            relay.join(5)
        self.say(f"job {job.generation}'s launcher exited ({process.returncode})")
        self._wait_for_connections(job)
        if self.settings.ulfm and process.returncode == 0:
            # The survivors may finish within the grace of a rank that died: it is left
            # behind all the same, not a failed job to restart.
            self._leave_the_dead_behind(job, process, ended=True)
        return process.returncode

    def _end_if_a_rank_died(self, job: _Job, process: subprocess.Popen,
                            since: float | None) -> float | None:
        """A rank whose connection closed without a word has died (one that ends says why):
        the job cannot go on, so end it now rather than wait for the launcher to notice (which
        takes seconds, and minutes for some MPIs). Its launcher gets DIED_GRACE seconds to
        report which process it was, then SIGTERM, then SIGKILL."""
        now = time.monotonic()
        with self.lock:
            died = [r for r, k in job.ranks.items() if k.closed_without_a_word]
        if not died:
            return since
        if since is None:
            self.say(f"rank(s) {', '.join(map(str, died))} of job {job.generation} ended "
                     "without a word; ending the job")
            return now
        if now - since > DIED_GRACE and process.poll() is None:
            try:
                os.killpg(process.pid, signal.SIGTERM if now - since < DIED_GRACE + 5
                          else signal.SIGKILL)
            except ProcessLookupError:
                pass
        return since

    def _leave_the_dead_behind(self, job: _Job, process: subprocess.Popen,
                               ended: bool = False) -> None:
        """Under ULFM: a rank whose connection closed without a word has died, and the
        survivors go on without it. Its host is blacklisted (its other ranks go on to the end
        of the job, but no new one starts there), and each death is a reset: past the reset
        limit the job is ended. With fewer than ``min_np`` ranks left, the ranks are told to
        stop at their next commit, to be restarted when enough slots are found. Once the job
        has ``ended`` well, with every other rank done, a death in its last LEFT_BEHIND_GRACE
        seconds counts the same."""
        if job.hosts_in_output:
            return  # the launcher lost a host's daemon: the whole job is ending
        if self._end_if_a_rank_raised(job, process):
            return
        died, live = self._mark_the_dead(job, process, ended)
        if died:
            self._count_the_dead(job, process, died, live, ended)

    def _end_if_a_rank_raised(self, job: _Job, process: subprocess.Popen) -> bool:
        """An exception is no process failure: the job ends, as on any MPI, and run()
        restarts it without that rank's host. Under ULFM the rank's MPI_Abort does not end
        the others, so the driver does (SIGTERM, then SIGKILL). Whether a rank raised."""
        with self.lock:
            raised = [r for r, k in job.ranks.items()
                      if k.bye is not None and k.bye.reason in ("failed", "lost")]
        if not raised:
            return False
        now = time.monotonic()
        if job.ending_since is None:
            job.ending_since = now
            self.say(f"rank(s) {', '.join(map(str, raised))} of job {job.generation} failed; "
                     "ending the job")
        self._end(process, kill=now - job.ending_since > 5)
        return True

    def _mark_the_dead(self, job: _Job, process: subprocess.Popen,
                       ended: bool) -> tuple[list[int], int]:
        """The ranks that died (silent for LEFT_BEHIND_GRACE, or at all once the job has
        ``ended`` with every other rank done), marked dead, and how many ranks are left; none
        while the job is ending on its own, which run() then judges."""
        now = time.monotonic()
        with self.lock:
            died = [r for r, k in job.ranks.items()
                    if k.closed_without_a_word and not k.dead
                    and (ended or now - (k.closed_at or now) >= LEFT_BEHIND_GRACE)]
            if ended:
                others = [k for r, k in job.ranks.items() if k.pid and not k.dead
                          and r not in died]
                if not others or any(k.bye is None or k.bye.reason != "done" for k in others):
                    return [], 0  # not a job that went on without them
            elif process.poll() is not None:
                return [], 0
            for r in died:
                job.ranks[r].dead = True
            return died, len(job.live_slots())

    def _count_the_dead(self, job: _Job, process: subprocess.Popen, died: list[int],
                        live: int, ended: bool) -> None:
        """Each death blacklists its host and is a reset (past the limit, the job is ended);
        below ``min_np`` ranks the job stops at its next commit."""
        left = f"the {live} left go on without it" if live else "none is left to go on"
        for r in died:
            slot = job.ranks[r].slot
            self.blacklist.add(slot.host)
            self.say(f"rank {r} ({slot.host}[{slot.local_rank}]) of job {job.generation} died; "
                     f"{left} (ULFM); blacklisted: {slot.host}")
            limit = self.settings.reset_limit
            if limit is not None and self.resets >= limit:
                self.fatal = ElasticError(RESET_LIMIT_MESSAGE.format(limit=limit))
                self._end(process)
                return
            self.resets += 1
        if 0 < live < self.settings.min_np and not ended:
            self.say(f"{live} ranks left, fewer than --min-np {self.settings.min_np}: the job "
                     "stops at its next commit")
            self.notify(job, removed_only=True)

    def _every_rank_died(self, job: _Job) -> bool:
        """Under ULFM a rank's death ends no other: a job whose every rank closed without a
        word before the launcher exited, the driver ending none and the launcher losing no
        host, lost them all (each died), with none left to go on."""
        exited = job.exited_at
        if (not self.settings.ulfm or exited is None or job.ending_since is not None
                or job.hosts_in_output):
            return False
        with self.lock:
            return all(k.closed_without_a_word and (k.closed_at or exited) <= exited
                       for k in job.ranks.values())

    def _end(self, process: subprocess.Popen, kill: bool = False) -> None:
        try:
            os.killpg(process.pid, signal.SIGKILL if kill else signal.SIGTERM)
        except ProcessLookupError:
            pass

    def _relay(self, stream: Any, sink: TextIO, job: _Job) -> None:
        for line in stream:
            sink.write(line)
            sink.flush()
            for pattern in _RANK_PATTERNS:
                for found in pattern.findall(line):
                    job.named_in_output.add(int(found))
            for pattern in _PID_PATTERNS:
                for found in pattern.findall(line):
                    job.pids_in_output.add(int(found))
            for pattern in _HOST_PATTERNS:
                job.hosts_in_output.update(pattern.findall(line))
            for rank, status in _protocol.RANK_END_PATTERN.findall(line):
                job.ended_badly.setdefault(int(rank), int(status))

    def _watch_hosts(self, job: _Job) -> None:
        hosts = self.available(self.discover())
        if sum(hosts.values()) < self.settings.min_np:
            return  # Horovod too waits for enough slots before it tells the ranks
        slots = assign(hosts, list(job.hosts), self.settings.max_np)
        current = job.slots
        if self.settings.ulfm:
            # The ranks left behind are gone already, and those on a blacklisted host go on
            # until the job ends: neither is a change to stop for.
            with self.lock:
                current = [s for s in job.live_slots() if not self.blacklist.excludes(s.host)]
            if set(slots) == set(current):
                return
        if slots == current:
            return
        removed_only = set(slots) < set(current)
        if job.notified_for != slots:
            job.notified_for = slots
            self.say(f"hosts changed: {_describe_hosts(count_hosts(slots))}; the job stops at its "
                     "next commit")
            self.notify(job, removed_only)

    def _wait_for_connections(self, job: _Job) -> None:
        deadline = time.monotonic() + SILENT_SECONDS
        while time.monotonic() < deadline:
            with self.lock:
                if all(r.closed_at is not None or r.pid == 0 for r in job.ranks.values()):
                    return
            time.sleep(0.05)
        with self.lock:
            for rank in job.ranks.values():
                if rank.connection is not None:
                    rank.connection.close()

    # -- what comes next -------------------------------------------------------------------

    def failed_hosts(self, job: _Job) -> tuple[set[str], str]:
        """The hosts to blacklist after a failed job, and the first failed process's name."""
        with self.lock:
            ranks = dict(job.ranks)
        def name(r: int) -> str:
            return f"{ranks[r].slot.host}[{ranks[r].slot.local_rank}]"
        raised = [r for r, k in ranks.items() if k.bye is not None and k.bye.reason == "failed"]
        silent = [r for r, k in ranks.items() if k.pid and k.closed_at is None]
        named = sorted(r for r in job.named_in_output if r in ranks and (
            ranks[r].bye is None or ranks[r].bye.reason == "failed"))
        by_pid = [r for r, k in ranks.items() if k.pid and k.pid in job.pids_in_output]
        lost_hosts = [r for r, k in ranks.items() if k.slot.host in job.hosts_in_output]
        blamed = raised or silent or lost_hosts or named or by_pid
        if not blamed:
            unsaid = [r for r, k in ranks.items() if k.closed_without_a_word]
            if unsaid:
                first = min(ranks[r].closed_at or 0.0 for r in unsaid)
                blamed = [r for r in unsaid if (ranks[r].closed_at or 0.0) <= first + 0.001]
        for r in raised:
            assert ranks[r].bye is not None
            self.say(f"rank {r} ({name(r)}) failed: {ranks[r].bye.detail}")
        for r in silent:
            self.say(f"rank {r} ({name(r)}) went silent: its host is unreachable")
        first = name(min(blamed)) if blamed else "unknown"
        return {ranks[r].slot.host for r in blamed}, first

    def run(self) -> int:
        settings = self.settings
        hosts = self.wait_for_slots(settings.np, first=True)
        previous: list[str] = []
        generation = 0
        while True:
            generation += 1
            slots = assign(hosts, previous, settings.max_np)
            job = _Job(generation, slots, count_hosts(slots))
            code = self.run_job(job)
            if self.fatal is not None:
                raise self.fatal
            with self.lock:
                byes = [r.bye for r in job.ranks.values() if not r.dead]
                said_hello = any(r.pid for r in job.ranks.values())
            if code == 0 and byes and all(b is not None and b.reason == "done" for b in byes):
                return 0
            if not said_hello and job.ended_badly:
                # Under ULFM the launcher exits 0 all the same: the ranks' own word counts.
                rank, status = min(job.ended_badly.items())
                host = job.slots[rank].host if rank < len(job.slots) else "?"
                raise ElasticError(
                    f"job {generation}: the process of rank {rank} ({host}) "
                    f"ended with status {status}{_signal_name(status)} before any rank reached "
                    "elastic.run: nothing to recover")
            if code == 0 and not said_hello:
                return 0  # a program that does not use elastic.run: nothing to resume
            if code == 0 and any(b is not None and b.reason == "reset" for b in byes):
                self.say(f"job {generation} stopped for the new hosts")
            else:
                if not said_hello:
                    raise ElasticError(f"job {generation} failed (exit code {code}) before any "
                                       "rank reached elastic.run: nothing to recover")
                failed, first = self.failed_hosts(job)
                if not failed:
                    raise ElasticError(
                        f"job {generation} failed (exit code {code}) without losing a rank or "
                        "a host (see its output above): restarting would fail the same way")
                if self._every_rank_died(job):
                    raise ElasticError(EXITED_MESSAGE.format(name=first, code=code or 1) +
                                       "\n(every rank died: none is left to go on)")
                if all(b is not None and b.reason == "failed" for b in byes):
                    raise ElasticError(EXITED_MESSAGE.format(name=first, code=code or 1) +
                                       "\n(every rank failed)")
                for host in failed:
                    self.blacklist.add(host)
                self.say(f"job {generation} failed (exit code {code}); blacklisted: "
                         f"{', '.join(sorted(failed))}")
                found = self.available(self.discover())
                if not found and self.blacklist.soonest_return() is None:
                    raise ElasticError(EXITED_MESSAGE.format(name=first, code=code or 1) +
                                       "\n(every host is blacklisted)")
            if settings.reset_limit is not None and self.resets >= settings.reset_limit:
                raise ElasticError(RESET_LIMIT_MESSAGE.format(limit=settings.reset_limit))
            self.resets += 1
            previous = list(job.hosts)
            hosts = self.wait_for_slots(settings.min_np, first=False)

    def close(self) -> None:
        self.closed = True
        self.listener.close()


def _signal_name(status: int) -> str:
    """`` (SIGABRT)`` for a shell's status 134, else nothing."""
    try:
        return f" ({signal.Signals(status - 128).name})" if status > 128 else ""
    except ValueError:
        return ""


def _describe_hosts(hosts: Hosts) -> str:
    return ",".join(f"{h}:{n}" for h, n in hosts.items())


def run(settings: ElasticSettings,
        command_for: Callable[[list[Slot], dict[str, str]], list[str]],
        environ: dict[str, str] | None = None) -> int:
    """Run the elastic job to its end: 0 when every rank finished; ElasticError when it cannot
    go on. ``command_for(slots, env)`` is the launcher's command for one job."""
    driver = _Driver(settings, command_for, dict(os.environ if environ is None else environ),
                     sys.stdout, sys.stderr)
    try:
        return driver.run()
    finally:
        driver.close()
