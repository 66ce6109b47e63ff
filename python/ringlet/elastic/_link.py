"""A rank's side of its connection to the elastic driver (``_protocol``).

One thread per rank reads the driver's messages (acknowledgements, host updates, the stored
state); rank 0 sends each commit from a second thread, so that a commit costs the step only
its serialization, not the trip to the driver. At most one commit is in flight: the next
waits for its acknowledgement, so a restart loses at most the commit that was still on its
way.
"""

from __future__ import annotations

import os
import socket
import threading
from multiprocessing.connection import Connection
from typing import Any

from . import _protocol
from ._protocol import Ack, Bye, Commit, Fetch, Hello, HostsUpdated, Stored

__all__ = ["DriverLink", "link"]


class DriverLink:
    """This rank's connection to the driver, and what the driver has told it."""

    def __init__(self, connection: Connection, generation: int, resumed: bool) -> None:
        self.connection = connection
        self.generation = generation
        self.resumed = resumed
        self.hosts_updates = 0
        """How many host changes the driver has reported since this job started."""
        self.removed_only = True
        self._lock = threading.Condition()
        self._acked = 0
        self._sent = 0
        self._stored: Stored | None = None
        self._closed = False
        self._send_lock = threading.Lock()
        self._reader = threading.Thread(target=self._read, name="ringlet-elastic-link",
                                        daemon=True)
        self._reader.start()

    def _read(self) -> None:
        while True:
            try:
                message = self.connection.recv()
            except (EOFError, OSError):
                with self._lock:
                    self._closed = True
                    self._lock.notify_all()
                return
            with self._lock:
                if isinstance(message, Ack):
                    self._acked = max(self._acked, message.sequence)
                elif isinstance(message, HostsUpdated):
                    self.hosts_updates = message.count
                    self.removed_only = message.removed_only
                elif isinstance(message, Stored):
                    self._stored = message
                self._lock.notify_all()

    def _send(self, message: Any) -> None:
        with self._send_lock:
            self.connection.send(message)

    def hello(self, rank: int, size: int) -> None:
        self._send(Hello(rank, size, socket.gethostname(), os.getpid()))

    def commit(self, payload: bytes, wait: bool = False) -> None:
        """Send a committed state (rank 0), once the previous one is acknowledged; with
        ``wait``, also wait for this one's acknowledgement."""
        with self._lock:
            self._wait_for(lambda: self._acked >= self._sent)
            self._sent += 1
            sequence = self._sent
        self._send(Commit(sequence, payload))
        if wait:
            with self._lock:
                self._wait_for(lambda: self._acked >= sequence)

    def fetch(self) -> bytes | None:
        """The committed state the driver holds (rank 0 of a resumed job)."""
        self._send(Fetch())
        with self._lock:
            self._wait_for(lambda: self._stored is not None)
            stored, self._stored = self._stored, None
        assert stored is not None
        self._sent = self._acked = stored.sequence
        return stored.payload

    def bye(self, reason: str, detail: str = "") -> None:
        """Tell the driver why this rank ends (it may be gone already: then nothing)."""
        try:
            self._send(Bye(reason, detail[:4000]))
        except OSError:
            pass

    def _wait_for(self, condition: Any) -> None:
        while not condition():
            if self._closed:
                raise ConnectionError("the elastic driver closed its connection to this rank")
            self._lock.wait(1.0)


_link: DriverLink | None = None
_link_pid: int | None = None


def link(rank: int, size: int) -> DriverLink | None:
    """This process's link to the driver, made on first use; None when the job was not
    started by the elastic driver."""
    global _link, _link_pid
    if _link is not None and _link_pid == os.getpid():
        return _link
    address = os.environ.get(_protocol.ADDRESS)
    if not address:
        return None
    key = bytes.fromhex(os.environ.get(_protocol.KEY, ""))
    connection = _protocol.connect(address, key)
    _link = DriverLink(connection, int(os.environ.get(_protocol.GENERATION, "1")),
                       os.environ.get(_protocol.RESUMED) == "1")
    _link_pid = os.getpid()
    _link.hello(rank, size)
    return _link
