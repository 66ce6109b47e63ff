"""What the elastic driver (``ringletrun --min-np/--max-np/--host-discovery-script``) and the
ranks of the job it runs say to each other: the environment the driver gives each job, and the
messages on each rank's connection to it.

The connection carries no collective data: it is the driver's control channel, as Horovod's
elastic driver has one. Each rank says hello, rank 0 sends each committed state, and every rank
says why it ends; the driver tells the ranks when the hosts changed. Messages are
``multiprocessing.connection``'s pickled objects, on a connection authenticated by the job's
key (an HMAC challenge both ways), so nothing else on the network can join or feed it.
"""

from __future__ import annotations

import re
import secrets
from dataclasses import dataclass
from multiprocessing.connection import Client, Connection

__all__ = [
    "ADDRESS",
    "GENERATION",
    "KEY",
    "RANK_END_PATTERN",
    "RESUMED",
    "SLOTS",
    "Ack",
    "Bye",
    "Commit",
    "Fetch",
    "Hello",
    "HostsUpdated",
    "Stored",
    "connect",
    "new_key",
    "reporting_its_end",
]

ADDRESS = "RINGLET_ELASTIC_DRIVER"
"""Where the driver listens: ``host:port`` candidates separated by commas, tried in order (the
driver's address on each network its hosts are on, and loopback for its own host)."""
KEY = "RINGLET_ELASTIC_KEY"
"""The job's authentication key, in hex."""
GENERATION = "RINGLET_ELASTIC_GENERATION"
"""Which job of the driver this is: 1 for the first, one more for each restart (Horovod's
rendezvous count)."""
RESUMED = "RINGLET_ELASTIC_RESUMED"
"""``1`` when the driver holds a committed state for this job to resume from."""
SLOTS = "RINGLET_ELASTIC_SLOTS"
"""Where each rank of the job runs, in rank order: ``host:local_rank`` separated by commas,
with the host as discovered (two names of one machine stay two hosts)."""

# Under ULFM, PRRTE's launcher exits 0 when its processes die of a signal, and prints nothing:
# so each rank's program runs under a shell that says how it ended when that was not well,
# then ends the same way (the same signal, or status), as PRRTE and ULFM expect. A rank that
# died before it said hello is known to the driver by that line alone.
_REPORT_THE_END = (
    '"$@"; status=$?; '
    'if [ "$status" -ne 0 ]; then echo "ringletrun: elastic: the process of rank '
    '${OMPI_COMM_WORLD_RANK:-${PMIX_RANK:-?}} ended with status $status" >&2; fi; '
    'if [ "$status" -gt 128 ]; then kill -"$((status - 128))" $$ 2>/dev/null; fi; '
    'exit "$status"')
RANK_END_PATTERN = re.compile(r"ringletrun: elastic: the process of rank (\d+) ended with status "
                              r"(\d+)")
"""The line ``reporting_its_end`` prints: the rank, and its status (128 + N for signal N)."""


def reporting_its_end(program: list[str]) -> list[str]:
    """``program`` run under a shell that prints ``RANK_END_PATTERN``'s line if it fails."""
    return ["/bin/sh", "-c", _REPORT_THE_END, "ringlet-rank", *program]


CONNECT_SECONDS = 60.0
"""How long a rank tries the driver's addresses before it gives up."""


@dataclass(frozen=True)
class Hello:
    """A rank's first message: who and where it is."""

    rank: int
    size: int
    host: str
    pid: int


@dataclass(frozen=True)
class Commit:
    """Rank 0's committed state, serialized by the state object (``State.snapshot``)."""

    sequence: int
    payload: bytes


@dataclass(frozen=True)
class Ack:
    """The driver has stored commit ``sequence``: a restart resumes from it, or a later one."""

    sequence: int


@dataclass(frozen=True)
class Fetch:
    """Rank 0 of a resumed job asks for the state to resume from."""


@dataclass(frozen=True)
class Stored:
    """The driver's answer to ``Fetch``: the last commit it stored (None: none)."""

    sequence: int
    payload: bytes | None


@dataclass(frozen=True)
class HostsUpdated:
    """The discovered hosts differ from the job's: ``count`` changes since the job started;
    ``removed_only`` when no host or slot was added (Horovod's ``skip_sync``)."""

    count: int
    removed_only: bool


@dataclass(frozen=True)
class Bye:
    """Why a rank ends. ``reason`` is one of ``done`` (its function returned), ``reset`` (the
    hosts changed: restart me on the new ones), ``lost`` (a collective failed because another
    rank is gone) or ``failed`` (its function raised; ``detail`` says what)."""

    reason: str
    detail: str = ""


def new_key() -> bytes:
    """A fresh job key."""
    return secrets.token_bytes(32)


def connect(addresses: str, key: bytes, timeout: float = CONNECT_SECONDS) -> Connection:
    """A connection to the driver at the first of ``addresses`` (``ADDRESS``'s form) that
    answers; OSError naming every address tried when none does within ``timeout``."""
    import socket
    import time

    candidates = []
    for item in addresses.split(","):
        host, _, port = item.strip().rpartition(":")
        if host and port.isdigit():
            candidates.append((host.strip("[]"), int(port)))
    if not candidates:
        raise OSError(f"{ADDRESS}={addresses!r} names no host:port")
    deadline = time.monotonic() + timeout
    errors: dict[tuple[str, int], str] = {}
    while True:
        for host, port in candidates:
            try:
                # A quick probe first: Client() itself would wait for TCP's own timeout.
                with socket.create_connection((host, port), timeout=1.0):
                    pass
                return Client((host, port), authkey=key)
            except OSError as error:
                errors[host, port] = error.strerror or str(error)
        if time.monotonic() > deadline:
            tried = ", ".join(f"{h}:{p} ({why})" for (h, p), why in errors.items())
            raise OSError(f"cannot reach the elastic driver at {tried}")
        time.sleep(0.2)
