"""A rank's side of its connection to the elastic driver (``_protocol``).

One thread per rank reads the driver's messages (acknowledgements, host updates, the stored
state). Rank 0 hands each commit to a second thread, which serializes it and sends it to the
driver: the training thread never waits for either. The latest commit wins: one that arrives
while the previous is still on its way replaces the one waiting behind it, so the driver
holds a recent commit (never a torn one) and a restart repeats the steps since.

Shipping is paced: a large state (a model of tens of MiB serializes and sends in a quarter
of a second) committed at every step would keep a core busy on rank 0's host. After a commit
that cost T seconds of the sender's CPU time (serializing and sending; waiting for the
driver's acknowledgement costs none, and on a loaded host it is no measure of the cost), the
next waits until ``T / SHIPPING_SHARE`` seconds have passed (the latest commit still wins
meanwhile), unless the job stops for new hosts, which ships at once; so a restart repeats at
most that much more.
"""

from __future__ import annotations

import os
import socket
import sys
import threading
import time
from collections.abc import Callable
from multiprocessing.connection import Connection
from typing import Any

from . import _protocol
from ._protocol import Ack, Bye, Commit, Fetch, Hello, HostsUpdated, Stored

__all__ = ["SHIPPING_SHARE", "DriverLink", "link"]


def _shipping_share() -> float:
    text = os.environ.get("RINGLET_ELASTIC_SHIPPING_SHARE", "0.05")
    try:
        share = float(text)
    except ValueError:
        share = -1.0
    if not 0 < share <= 1:
        raise ValueError(f"RINGLET_ELASTIC_SHIPPING_SHARE={text!r}: give the share of the time "
                         "that shipping commits to the elastic driver may take, above 0 and at "
                         "most 1 (1: every commit at once)")
    return share


SHIPPING_SHARE = _shipping_share()
"""At most this share of the time goes to shipping commits to the driver (see above)."""
UNPACED_SECONDS = 0.01
"""Commits that ship within this time are never held back (small states cost nothing)."""


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
        self._waiting: Callable[[], bytes] | None = None
        self._sending = False
        self._urgent = False
        self._reader = threading.Thread(target=self._read, name="ringlet-elastic-link",
                                        daemon=True)
        self._reader.start()
        self._sender: threading.Thread | None = None

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

    def commit(self, serialize: Callable[[], bytes], wait: bool = False) -> None:
        """Hand a commit (``serialize()`` makes its bytes) to the sender thread, in place of
        any that waits there still; with ``wait``, return once the driver has stored it."""
        with self._lock:
            self._sent += 1
            sequence = self._sent
            self._waiting = serialize
            self._urgent = self._urgent or wait
            if self._sender is None:
                self._sender = threading.Thread(target=self._send_commits, daemon=True,
                                                name="ringlet-elastic-commits")
                self._sender.start()
            self._lock.notify_all()
            if wait:
                self._wait_for(lambda: self._acked >= sequence)

    def _send_commits(self) -> None:
        while True:
            with self._lock:
                while self._waiting is None:
                    if self._closed:
                        return
                    self._lock.wait(1.0)
                serialize, self._waiting = self._waiting, None
                sequence = self._sent
            started, cpu_started = time.monotonic(), time.thread_time()
            try:
                payload = serialize()
            except Exception as error:  # a state that changed under the thread: say so, go on
                print(f"ringlet: warning: commit {sequence} not sent to the elastic driver: "
                      f"{type(error).__name__}: {error}", file=sys.stderr, flush=True)
                continue
            try:
                self._send(Commit(sequence, payload))
            except OSError:
                return
            cost = time.thread_time() - cpu_started
            with self._lock:
                self._wait_for(lambda done=sequence: self._acked >= done or self._closed)
                if cost > UNPACED_SECONDS:
                    self._lock.wait_for(lambda: self._urgent or self._closed,
                                        timeout=cost / SHIPPING_SHARE
                                        - (time.monotonic() - started))
                self._urgent = False

    def stored(self) -> int:
        """The sequence number of the last commit the driver has stored."""
        with self._lock:
            return self._acked

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

    def _wait_for(self, condition: Callable[[], bool]) -> None:
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
