"""Operations matched across ranks by name, as Horovod's coordinator matches them.

By default (``RINGLET_HVD_MATCHING=name``), every collective submitted through ``ringlet.hvd``
is a ``Request`` keyed by (collective, name, process set): unnamed ones get Horovod's automatic
names ("allreduce.noname.<n>", counted per collective and set on each rank). A background
thread, the same on every rank, runs cycles (at once when something is submitted, and every
``RINGLET_HVD_CYCLE_TIME`` ms while anything waits on any rank): in each, the ranks agree
which requests every member of their process set has submitted, and those run, in an order
every rank computes alike, fused where they can be. A request still waiting for a rank waits;
it does not hold up the others. A caller that waits for its request runs the cycles itself
while no other thread of its rank runs one: no hand-off to the thread and back.

While nothing waits on any rank, no cycle runs: every rank's thread waits on a doorbell
(``ringlet.doorbell``), taking no core and sending nothing, and the first rank that has work
rings it before its cycle, which wakes the others into the same cycle. (Timed idle cycles,
Horovod's way, cost every rank a collective per period, each waiting for the slowest rank's
timer: 9-15% of a training step at 10 ms. Where MPI grants less than MPI_THREAD_MULTIPLE there
is no doorbell, and idle cycles run every ``RINGLET_HVD_IDLE_CYCLE_TIME`` ms instead.)

A cycle is designed after Horovod's controller and response cache (controller.cc,
response_cache.cc), written anew over ringlet's public API, on a communicator of its own (a
process set of every rank). ringlet runs one collective at a time in a process, so while it
runs every collective of the program must pass through it: the ones that are not Horovod's
(adding a process set, planning buckets) run on their caller's thread in their turn, every
rank's negotiation waiting meanwhile (``inline`` requests). A cycle is:

- one small ``min`` allreduce: six flags (someone announces something, someone shuts down,
  someone has waited too long, someone has anything waiting, someone waits for something it
  cannot mark, and whether every rank entered the cycle chasing, below), then two entries per
  cached name: 1 where this rank has that name waiting (or takes no part in it), and -1 where
  it has it waiting. A name every rank marks runs: repeats cost this one vector. When every
  name some rank waits for runs, nothing is left: the ranks are idle, and the next rank that
  submits rings. Otherwise a rank whose requests still wait (for ranks that have not
  submitted them) enters the next cycle at once and waits in it, where the others' own
  submissions bring them; the rest run timed cycles. (Timed cycles left in a training step
  waited up to 7 ms for a rank whose Python thread could not get the GIL while its forward
  pass ran, spinning meanwhile on the other.)
- only when a rank announces something: an ``allgather_object`` of the announcements (a name
  seen for the first time, or with other arguments than its cached ones, and ``join``). Every
  rank adds them to the same table; a name all members have announced runs, or fails on every
  rank when they passed different arguments (Horovod's error, naming what each rank passed).
  A name that ran is cached (least recently used out when the cache is full; a rank waiting
  for an evicted name announces it again).
- only when a rank's request has waited longer than ``RINGLET_STALL_WARNING`` (60 s; 0: never),
  the core's stall warning: an ``allgather_object`` of every rank's waiting names, then the
  core stall inspector's messages (runtime/stall.rs), once per request: each waiting rank says
  what it waits in and for which rank, and rank 0 names, for each name, the ranks that have not
  submitted it (the stall inspector).

While the ranks are idle, an allreduce of a cached name skips the cycle (``run_alone``): each
rank that calls it starts its collective at once, which pairs up with the other ranks' same
call as their cycle. A rank that has other work runs a cycle instead, which meets the lone
call in the consistency check: the check fails on every rank before anything is written, and
they all run the cycle, where the lone call's request then waits. A lone named allreduce, and
a training step's bucket, then cost what one matched by order does, plus building its key and
signature. An asynchronous one learns how its lone run ended when its handle is polled or
synchronized, or at its rank's next cycle, whichever comes first; one lone run is under way
at a time.

Joined ranks (``join``) take part in every allreduce the others run, with zeros; other
collectives fail on every rank while a rank has joined. Mismatches and joins are reported in
the core's words (runtime/consistency.rs) after Horovod's first words ("Mismatched allreduce
tensor shapes"), which scripts and Horovod's tests match. ``join`` returns when every rank has
joined, with the rank that joined last.
"""

from __future__ import annotations

import atexit
import os
import sys
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

import numpy as np

import ringlet

from ._reports import (
    join_refusal,
    mismatch,
    missing_report,
    stall_warning_from_environment,
    waiting_report,
)
from ._requests import Key, Request

MATCHING_VARIABLE = "RINGLET_HVD_MATCHING"
MATCHINGS = ("order", "name")
DEFAULT_MATCHING = "name"
"""Horovod's semantics by default: a lone named allreduce costs about 1.6x one matched by order,
a training step 1-2% more (``run_alone``; benchmarks/RESULTS.md, "Name matching", seventh
step). ``RINGLET_HVD_MATCHING=order`` gives ringlet's own matching."""

_FLAGS = 6  # announce, shut down, stall query, waiting, unmarked, chased
_ANNOUNCE, _SHUTDOWN, _STALL, _WAITING, _UNMARKED, _CHASED = range(_FLAGS)
_BELL_POLL = 1.0
"""Seconds an idle thread waits on the doorbell before it looks again whether it should stop."""
_BELL_PAUSE = 0.05
"""The longest pause between two polls of the doorbell: how late an idle rank with nothing to
submit may hear a ring (its own submissions wake it at once). Each poll asks MPI for messages
while the gradients' collectives run on another thread: polling every 1 ms cost 15-22% of a
training step, every 10 ms 4-11%, every 50 ms 0-5% (RESULTS.md, "Idle ranks wait on a
doorbell")."""
_MOST_NAMES = 1_000_000
"""The largest response cache: the slots' caller keys (``lane_caller``) are distinct up to
here (tests/hvd/torch/test_hvd_name_matching.py checks it)."""
_LANE_WAIT = 0.001
"""Seconds a synchronous lone allreduce waits for this rank's thread to let go of the cycle (it
holds it briefly whenever it wakes) before the call is submitted as usual: given up at once,
such a call rang the doorbell, whose cycle met the other ranks' lone calls, and so on, for a
third of the calls at 3 ranks."""
_SIT_OUT = 8
"""How many of its next calls an asynchronous allreduce whose lone run gave way submits as
usual before it runs alone again: in a burst submitted in different orders on different ranks
(which only name matching pairs), every first call would meet another name's and give way."""
EXCLUSIVE = ("ringlet.hvd matches operations by name (RINGLET_HVD_MATCHING=name) and ringlet runs "
             "one collective at a time in a process: a collective of ringlet's own API beside "
             "it could meet the negotiation's in another order on another rank, and wait "
             "forever. Call it through ringlet.hvd (hvd.allreduce, hvd.broadcast, ...), or "
             "match by order (RINGLET_HVD_MATCHING=order)")
"""Why ringlet's own collectives are refused on threads other than the negotiation's while it
runs (``ringlet.make_exclusive``)."""
CYCLE_CALLER = "ringlet.hvd negotiation"
"""The caller (``ringlet.as_caller``) of a cycle's collectives, whichever thread runs them."""
_JOIN_KEY: Key = ("join", "join", ())
"""join's key (it involves every rank, whatever they have joined to; it has no signature)."""


def _seconds(variable: str, default: float) -> float:
    text = os.environ.get(variable)
    if text is None or not text.strip():
        return default
    try:
        value = float(text)
    except ValueError:
        raise ValueError(f"{variable}={text!r} is not a number") from None
    if value < 0:
        raise ValueError(f"{variable}={text!r} must be at least 0")
    return value


def matching_from_environment(default: str = DEFAULT_MATCHING) -> str:
    """``RINGLET_HVD_MATCHING``: "order" (ringlet's own: every rank submits its collectives in
    the same order) or "name" (Horovod's: matched by name, in any order); ``default`` if
    unset."""
    text = os.environ.get(MATCHING_VARIABLE, "").strip().lower() or default
    if text not in MATCHINGS:
        raise ValueError(f"{MATCHING_VARIABLE}={os.environ[MATCHING_VARIABLE]!r}; accepted: "
                         f"{' or '.join(MATCHINGS)}")
    return text



class Negotiator:
    """The negotiation thread of this rank and its state, the same on every rank.

    ``run_fused(requests, signatures)`` is given, in order, the allreduces to fuse into one
    collective (this rank's requests, or None where this rank has joined and adds zeros of the
    signature's shapes and dtypes) and returns one handle per request."""

    exclusive_owner: Negotiator | None = None
    """The negotiation that made ringlet's collectives exclusive to it (the running one)."""

    def __init__(self, run_fused: Callable[[list[Request | None], list[tuple[Any, ...]]],
                                           list[Any]]) -> None:
        self._run_fused = run_fused
        self.cycle_time = _seconds("RINGLET_HVD_CYCLE_TIME", 1.0) / 1000
        self.idle_cycle_time = _seconds("RINGLET_HVD_IDLE_CYCLE_TIME", 10.0) / 1000
        self._idle = False
        """Whether no rank had anything waiting at the last cycle (the same on every rank): the
        next cycle then waits for the doorbell."""
        self.stall_seconds = stall_warning_from_environment()
        """RINGLET_STALL_WARNING, the core's: after how long a waiting request is reported
        (None: never)."""
        self.capacity = max(int(_seconds("RINGLET_HVD_CACHE_CAPACITY", 1024)), 1)
        if self.capacity > _MOST_NAMES:
            raise ValueError(f"RINGLET_HVD_CACHE_CAPACITY={self.capacity} is more than "
                             f"{_MOST_NAMES} names")
        self.rank, self.size = ringlet.rank(), ringlet.size()
        self.everyone = tuple(range(self.size))
        # Its own communicator: collective over ringlet's (hvd.init is called on every rank).
        self.comm = ringlet.add_process_set(self.everyone)
        try:
            self._bell: ringlet.Doorbell | None = ringlet.doorbell(self.comm)
        except ringlet.RingletError:  # MPI_THREAD_MULTIPLE was not granted (on any rank alike)
            self._bell = None
        self._alone = self._bell is not None and bool(ringlet.settings()["consistency_check"])
        """Whether a lone allreduce may skip the cycle (``run_alone``): only the consistency
        check tells it from another rank's cycle, and only idle ranks that wait on the doorbell
        run no timed cycles."""
        self._chasing = False
        """Whether this rank enters the next cycle at once, not at its timer: it has requests
        that wait only for other ranks, which meet it as they submit (see ``_cycle``)."""
        self._chase_blocked = False
        """Set when every rank chased and nothing ran (each waits for what another has not
        submitted): timed cycles until something runs."""
        self._called = -1
        """The last idle cycle after which a rank rang the doorbell, as far as this rank knows
        (it rang, or heard it): the next cycle is on (see ``_may_cycle``)."""
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._cycling = threading.Lock()
        """Held by the thread that runs this rank's cycle: the negotiation thread, or a caller
        waiting for its request (``wait``), which then needs no hand-off to the thread and back."""
        self._in_cycle = threading.local()
        self._stopped = False
        self._local: dict[Key, Request] = {}
        """This rank's requests that have not run."""
        self._unannounced: list[Request] = []
        self._cache: OrderedDict[Key, tuple[int, tuple[Any, ...]]] = OrderedDict()
        """Names that ran: (slot in the vector, signature), least recently run first."""
        self._slots: list[Key | None] = []
        self._table: dict[Key, dict[int, tuple[tuple[Any, ...], str]]] = {}
        """Announced names that have not run: rank -> (signature, detail), first seen first."""
        self._joined: list[int] = []
        self._join: Request | None = None
        self._join_announced = False
        self._shutting_down = False
        self.failure: BaseException | None = None
        """Why negotiation stopped (every later request raises it)."""
        self.cycles = 0
        self.ran_alone = 0
        """How many lone allreduces paired up in place of a cycle (``run_alone``)."""
        self._lone: Request | None = None
        """The asynchronous lone run not yet settled (``run_alone``)."""
        self._sitting_out: dict[Key, int] = {}
        """Names whose last asynchronous lone run gave way: how many calls each still sits out
        (``_SIT_OUT``)."""
        self._last_cycle = time.monotonic()
        """When the last cycle's vector was agreed (``time.monotonic()``)."""
        self._started: list[Any] = []
        """Handles of what it started, not yet seen finished."""
        ringlet.make_exclusive(EXCLUSIVE)
        Negotiator.exclusive_owner = self
        self._thread = threading.Thread(target=self._loop, name="ringlet.hvd negotiation",
                                        daemon=True)
        self._thread.start()
        atexit.register(self.stop)

    # ---- this rank's side ----------------------------------------------------------------
    def submit(self, request: Request, waited_for: bool = False) -> None:
        """Add ``request`` to the next cycle. The negotiation thread is woken at once, unless
        the caller is about to wait for it (``waited_for``): the caller then runs the cycle
        itself (``wait``), and waking the thread would only take a core from it."""
        with self._lock:
            if self.failure is not None:
                raise self.failure
            self._queue(request)
        # At once: its name stays taken until its handle is synchronized (``_handles.named``),
        # so an operation that finishes before its caller's next line lets no name through
        # twice.
        if not waited_for or request.inline:
            self._poke()

    def run_alone(self, key: Key, signature: tuple[Any, ...], run: Callable[[], Any],
                  request: Request | None = None) -> Any:
        """An allreduce of a cached name, started at once without agreeing first, when every
        rank was idle after the last cycle and this one has nothing else waiting: ``run()``
        (on the negotiation's communicator, as in a cycle) starts it and returns its handle,
        which this returns; or this returns None and the caller submits its request as usual.

        Every rank that runs the same name this way meanwhile makes the same call, which pairs
        up as the cycle's: one collective, as matched by order, instead of a cycle and its
        collective. The name's slot is in the consistency check's caller key, so two names
        never pair up. A rank that runs a cycle instead (it had other work, and rang the
        doorbell) meets this call with its vector: the check fails on every rank before
        anything is written, the cycle's ranks send their vector again, and this rank submits
        the request, which that cycle then sees.

        A synchronous call knows at once whether it paired up. An asynchronous one (its
        ``request`` given) learns later: its run is ``request.lone`` until ``settle`` (its
        caller's poll or synchronize, or this rank's next cycle, whichever comes first) knows
        how it ended, and submits the request if it gave way. One lone run at a time: a
        cycle's vector sent again must meet this rank's vector, not a second lone run."""
        # An asynchronous call behind another's lone run gives up at once: in a burst, each
        # would otherwise wait while this rank's cycle waits for that run.
        if not (self._alone and self._idle) or (request is not None and (
                self._lone is not None or self._local or self._sits_out(key))):
            return None
        if not self._cycling.acquire(timeout=_LANE_WAIT):
            return None
        try:
            if self._lone is not None:
                self.settle(self._lone, block=False)
            with self._lock:
                cached = self._cache.get(key)
                if (cached is None or cached[1] != signature or not self._idle
                        or self._local or self._lone is not None or self._called >= self.cycles
                        or self._join is not None or self._joined or self._shutting_down
                        or self._stopped):
                    return None
            self._in_cycle.active = True
            try:
                with ringlet.as_caller(lane_caller(cached[0])), ringlet.let_through():
                    handle = run()
            except ringlet.MismatchError:
                return None  # another rank runs a cycle (see above)
            except BaseException as exc:  # as a cycle's failure
                self._stop(exc)
                raise
            finally:
                self._in_cycle.active = False
            with self._lock:
                if request is None:
                    self._paired(key)
                else:
                    request.lone, self._lone = handle, request
        finally:
            self._cycling.release()
        if self._pending():
            self._poke()  # the thread skipped a wake-up while this ran
        return handle

    def _sits_out(self, key: Key) -> bool:
        """Whether a call of ``key`` sits out its turn to run alone (``_SIT_OUT``); counts it."""
        if key not in self._sitting_out:
            return False
        with self._lock:
            left = self._sitting_out.pop(key, 0) - 1
            if left > 0:
                self._sitting_out[key] = left
        return True

    def settle(self, request: Request, block: bool = True) -> bool | None:
        """How ``request``'s lone run (``run_alone``) ended: True if it paired up (its handle
        stays ``request.lone``), False if it gave way to another rank's cycle (the request is
        then submitted, and ``request.lone`` None); None while that is not known and not
        ``block``. The first thread that knows settles it; the others see the same answer."""
        lone = request.lone
        if lone is None:
            return False
        if not block and not lone.poll():
            return None
        failure: BaseException | None = None
        try:
            lone.outcome()
            paired = True
        except ringlet.MismatchError:
            paired = False
        except BaseException as exc:  # as a cycle's failure; its caller's synchronize raises it
            paired, failure = True, exc
        with self._lock:
            if self._lone is not request:  # another thread settled it meanwhile
                return request.lone is not None
            self._lone = None
            if paired:
                self._paired(request.key)
            else:
                request.lone = None
                self._sitting_out[request.key] = _SIT_OUT
                self._queue(request)
        if failure is not None:
            self._stop(failure)
        elif not paired:
            self._poke()
        return paired

    def _paired(self, key: Key) -> None:
        """Under the lock: a lone run of ``key`` paired up on every rank (not a cycle: no rank
        counts it as one, so the doorbell's cycle numbers stay alike)."""
        self.ran_alone += 1
        if key in self._cache:
            self._cache.move_to_end(key)

    def _queue(self, request: Request) -> None:
        """Under the lock: ``request`` waits for the next cycle, announced there unless its name
        is cached with its arguments."""
        self._local[request.key] = request
        cached = self._cache.get(request.key)
        if cached is None or cached[1] != request.signature:
            self._unannounced.append(request)

    def join(self) -> int:
        """Join (see the module's text); the rank that joined last."""
        collective, name, members = _JOIN_KEY
        request = Request(collective, name, (), members)
        with self._lock:
            if self.failure is not None:
                raise self.failure
            self._join = request
        self._poke()
        return int(self.wait(request))

    def wait(self, request: Request) -> Any:
        """Until ``request`` has run (or negotiation has stopped); its value. The caller runs
        the cycles itself while no other thread of this rank runs one (an ``inline`` request
        is the exception: its caller runs it between two cycles)."""
        while not request.ran.is_set():
            if not request.inline and not self._stopped:
                # Waits while the negotiation thread runs a cycle, then runs the next one
                # unless that one ran the request.
                if not self._cycling.acquire(timeout=0.05):
                    continue
                try:
                    if not request.ran.is_set():
                        self._run_cycle(timed=False)
                finally:
                    self._cycling.release()
                if request.ran.is_set() and self._pending():
                    self._poke()  # the thread skipped a wake-up while this ran cycles
            elif not request.ran.wait(0.05) and self._stopped:
                raise self.failure or ringlet.RingletError(
                    "ringlet.hvd's negotiation has stopped")
        if request.error is not None:
            raise request.error
        return request.value

    def stop(self) -> None:
        """Stop negotiating on every rank (each rank calls it; ``hvd.shutdown`` and the end of
        the program do). Requests that have not run raise on every rank."""
        if not self._thread.is_alive():
            return
        if not self._stopped:
            with self._lock:
                self._shutting_down = True
        # Stopped by a failure, the thread may still be on its way out: wait for it too, so
        # that ringlet's own collectives are let through again once this returns.
        self._poke()
        if threading.current_thread() is not self._thread:
            self._thread.join()

    def is_negotiation_thread(self) -> bool:
        """Whether this thread is running a cycle (the negotiation thread's, or a caller's)."""
        return getattr(self._in_cycle, "active", False)

    # ---- the cycle -----------------------------------------------------------------------
    def _poke(self) -> None:
        """Wake this rank's negotiation thread, wherever it waits."""
        self._wake.set()
        if self._bell is not None:
            self._bell.interrupt()

    def _loop(self) -> None:
        try:
            self._serve()
        finally:
            # ringlet's own collectives are the program's again, however negotiation ended.
            if Negotiator.exclusive_owner is self:  # not a later negotiation's
                ringlet.make_exclusive(None)
                Negotiator.exclusive_owner = None

    def _serve(self) -> None:
        while not self._stopped:
            heard = None
            chasing = False
            if self._idle and self._bell is not None:
                try:
                    heard = self._bell.wait(_BELL_POLL, _BELL_PAUSE)
                except ringlet.RingletError as exc:  # ringlet was shut down under it
                    self._stop(exc)
                    return
                if heard is not None:
                    with self._lock:
                        self._called = max(self._called, heard)
                woken = True
            elif self._chasing:
                woken = chasing = True
            else:
                # A timed cycle is due a period after the last cycle, whichever thread ran it:
                # while callers run cycles themselves, the thread need not.
                period = self.idle_cycle_time if self._idle else self.cycle_time
                due = self._last_cycle + period - time.monotonic()
                woken = due > 0 and self._wake.wait(due)
                if not woken and time.monotonic() - self._last_cycle < period:
                    continue
            self._wake.clear()
            # Woken by a submission while a caller runs cycles: that caller wakes it again if
            # anything is left when it stops. The timed cycles always run (other ranks wait for
            # them), and so do a cycle another rank rang for and a chase (which, given up, would
            # be tried again at once, and again, holding the GIL from the caller).
            if not self._cycling.acquire(blocking=not woken or heard is not None or chasing):
                continue
            try:
                self._run_cycle(timed=not woken)
            finally:
                self._cycling.release()
        if self._bell is not None:
            self._bell.close()

    def _may_cycle(self, timed: bool) -> bool:
        """Under ``_cycling``: whether this rank runs the next cycle now. After an idle cycle
        that is when a rank rang the doorbell: this one rings it first if it has work."""
        if self._stopped:
            return False
        if not self._idle or self._bell is None:
            return timed or self._pending()
        with self._lock:
            if self._called >= self.cycles:
                return True
        if not self._pending():
            return False
        self._bell.ring(self.cycles)
        with self._lock:
            self._called = self.cycles
        return True

    def _pending(self) -> bool:
        """Whether this rank has anything the negotiation has not run."""
        with self._lock:
            return bool(self._local or self._join is not None or self._shutting_down)

    def _run_cycle(self, timed: bool) -> None:
        """One cycle if it is due (``_may_cycle``), on the thread that holds ``_cycling``. Every
        rank's cycles pair up in order whichever of its threads runs them (as one caller in the
        consistency check)."""
        self._in_cycle.active = True
        try:
            lone = self._lone
            if lone is not None:
                self.settle(lone, block=False)  # given way: this cycle brings its request
            if not self._may_cycle(timed):
                return
            lone = self._lone
            if lone is not None:
                self.settle(lone)  # it comes first in the core's queue anyway
            with ringlet.as_caller(CYCLE_CALLER), ringlet.let_through():
                going_on = self._cycle()
        except BaseException as exc:
            self._stop(exc)
            return
        finally:
            self._in_cycle.active = False
        if not going_on:
            self._stop(ringlet.RingletError(
                "ringlet.hvd was shut down (hvd.shutdown() or the end of the program on some "
                "rank) before every rank had submitted this operation"))

    def _stop(self, error: BaseException) -> None:
        """Stop negotiating because of ``error``, which every waiting and later request raises
        (as a RingletError)."""
        self._stopped = True
        self._fail(error if isinstance(error, ringlet.RingletError) else ringlet.RingletError(
            f"ringlet.hvd's negotiation failed on rank {self.rank}: {error!r}"))

    def _fail(self, error: BaseException) -> None:
        with self._lock:
            self.failure = error
            waiting = list(self._local.values()) + ([self._join] if self._join else [])
            self._local.clear()
            self._join = None
        for request in waiting:
            request.finish(error=error)

    def _vector(self) -> tuple[np.ndarray, list[tuple[Any, ...]]]:
        """This rank's vector (negated flags, then one entry per cache slot) and
        announcements; under the lock."""
        announcements = [(r.key, r.signature, r.detail) for r in self._unannounced]
        self._unannounced.clear()
        if self._join is not None and not self._join_announced:
            announcements.append((self._join.key, (), ""))
            self._join_announced = True
        announced = {key for key, _, _ in announcements}
        width = len(self._slots)
        vector = np.zeros(_FLAGS + 2 * width, np.int32)
        marks, held = vector[_FLAGS:_FLAGS + width], vector[_FLAGS + width:]
        vector[_ANNOUNCE] = -1 if announcements else 0
        vector[_SHUTDOWN] = -1 if self._shutting_down else 0
        vector[_WAITING] = -1 if self._local or self._join is not None else 0
        now = time.monotonic()
        vector[_STALL] = -1 if self._stalled(now) else 0
        joined = set(self._joined)
        marked = 0  # of this rank's requests
        for slot, key in enumerate(self._slots):
            if key is None:
                marks[slot] = 1
                continue
            members = key[2]
            mine = self._local.get(key)
            if self.rank not in members:
                ready = True  # not its business
            elif mine is not None:
                ready = key not in announced and mine.signature == self._cache[key][1]
                held[slot] = -1
            else:  # joined ranks take part in whatever the others run
                ready = self.rank in joined and not set(members) <= joined
            marks[slot] = int(ready)
            if ready and mine is not None:
                marked += 1
        vector[_CHASED] = int(self._chasing)  # not negated: the min says whether all chased
        # Requests the others know nothing of: neither marked nor announced (now or before).
        unknown = len(self._local) - marked - sum(
            1 for key in self._local if key in announced or key in self._table)
        vector[_UNMARKED] = -1 if (unknown > 0 or self._joined or self._join is not None
                                   or self._shutting_down) else 0
        return vector, announcements

    def _stalled(self, now: float) -> list[Request]:
        """This rank's requests that have waited past the stall warning, not yet reported."""
        limit = self.stall_seconds
        if limit is None:
            return []
        return [r for r in self._local.values()
                if not r.stall_reported and now - r.submitted >= limit]

    def _cycle(self) -> bool:
        """One cycle; False once negotiation stops."""
        with self._lock:
            vector, announcements = self._vector()
        announced = {key for key, _, _ in announcements}
        try:
            agreed = ringlet.allreduce(vector, "min", out=vector, process_set=self.comm)
        except ringlet.MismatchError:
            # Another rank's lone allreduce (``run_alone``) met this vector: every rank now
            # sends its vector (nothing was written). Vectors never differ in shape.
            agreed = ringlet.allreduce(vector, "min", out=vector, process_set=self.comm)
        self.cycles += 1
        self._last_cycle = time.monotonic()
        everyone = ringlet.allgather_object(announcements, process_set=self.comm) \
            if agreed[_ANNOUNCE] < 0 else []
        if agreed[_STALL] < 0:
            self._inspect_stall()
        with self._lock:
            # Names every member marked, in their slots' order, then names whose last member
            # announced them, in the order they were first announced.
            slots = self._slots
            ready = [key for key in (slots[i] for i in np.flatnonzero(
                agreed[_FLAGS:_FLAGS + len(slots)] == 1)) if key is not None]
            for rank, theirs in enumerate(everyone):
                for key, signature, detail in theirs:
                    if key == _JOIN_KEY:
                        self._joined.append(rank)
                        continue
                    if key in self._cache:
                        # Its own announcement of it is on its way: no need to repeat it.
                        self._evict(key, again=key not in announced)
                    self._table.setdefault(key, {})[rank] = (signature, detail)
            joined = set(self._joined)
            for key, submitted in self._table.items():
                members = set(key[2])
                if members <= set(submitted) | joined and not members <= joined:
                    ready.append(key)
            # This rank's requests that run now leave before any name is cached or evicted:
            # one evicted while still waiting would be announced again, and run again (with
            # zeros from the ranks that no longer had it, and the data of a rank that had
            # submitted the name anew: a wrong result).
            mine = {key: self._local.pop(key, None) for key in ready}
            running = {id(request) for request in mine.values() if request is not None}
            self._unannounced = [r for r in self._unannounced if id(r) not in running]
            responses = [self._respond(key, joined) for key in ready]
            everyone_joined = len(joined) == self.size
            # Announced names still waiting for a member (the table is alike on every rank).
            table_left = bool(self._table)
        # Idle from now on if nothing is left waiting on any rank: nothing waited, or all that
        # waited runs now (a rank that submits more rings).
        width = (len(agreed) - _FLAGS) // 2
        marks, held = agreed[_FLAGS:_FLAGS + width], agreed[_FLAGS + width:]
        was_idle, self._idle = self._idle, bool(agreed[_WAITING] == 0) or bool(
            agreed[_UNMARKED] == 0 and np.all(marks[held < 0] == 1) and not table_left)
        if was_idle and not self._idle and self._bell is not None:
            # Timed cycles from now on: the thread leaves the doorbell (where it may wait, if a
            # caller ran this cycle) for them.
            self._bell.interrupt()
        # A rank still waiting after this cycle enters the next one at once (chases): it waits
        # there for the other ranks, whose submissions wake them into it, so its requests start
        # as soon as the last rank submits them, not up to a period later at its timer. Not
        # while every rank chases in vain: each then waits for what another has not submitted,
        # and they would cycle back to back.
        if ready:
            self._chase_blocked = False
        elif agreed[_CHASED] == 1:
            self._chase_blocked = True
        with self._lock:
            self._chasing = bool(self._local) and not self._chase_blocked and not self._idle
            left = bool(self._local)
        if self._idle and left:
            # Submitted while this cycle ran, or a name evicted in it and to be announced again:
            # this rank rings for it.
            self._poke()
        self._started = [work for work in self._started if not work.poll()]
        self._execute(responses, mine)
        if everyone_joined:
            self._finish_join()
        # A rank shutting down still takes part in this last cycle: what is ready runs.
        return bool(agreed[_SHUTDOWN] == 0)

    def _evict(self, key: Key, again: bool = True) -> None:
        """Forget a cached name (on every rank alike); a rank waiting for it by its bit
        announces it ``again``."""
        slot = self._cache.pop(key)[0]
        self._slots[slot] = None
        mine = self._local.get(key)
        if again and mine is not None and mine not in self._unannounced:
            self._unannounced.append(mine)

    def _respond(self, key: Key, joined: set[int]) -> tuple[Any, ...]:
        """What every rank does for a ready name: ("run", key, signature) or ("fail", key,
        message). Caches names that run."""
        collective, name, members = key
        submitted = self._table.pop(key, None)
        if submitted is None:  # cached: every member passed the cached arguments
            signature = self._cache[key][1]
            self._cache.move_to_end(key)
        else:
            passed = dict(sorted(submitted.items()))
            signature = next(iter(passed.values()))[0]
            if any(value[0] != signature for value in passed.values()):
                return ("fail", key, mismatch(collective, name, passed))
            self._insert(key, signature)
        absent = sorted(joined & set(members))
        if absent and not _joinable(collective, signature):
            return ("fail", key, join_refusal(absent, f"{collective} {name!r}"))
        return ("run", key, signature)

    def _insert(self, key: Key, signature: tuple[Any, ...]) -> None:
        if len(self._cache) >= self.capacity:
            self._evict(next(iter(self._cache)))
        slot = self._slots.index(None) if None in self._slots else len(self._slots)
        if slot == len(self._slots):
            self._slots.append(key)
        else:
            self._slots[slot] = key
        self._cache[key] = (slot, signature)

    def _execute(self, responses: list[tuple[Any, ...]],
                 mine: dict[Key, Request | None]) -> None:
        """Run the ready names in their agreed order (``mine``: this rank's request for each,
        None where it has joined): consecutive allreduces that may be fused as one collective,
        the rest one by one. The groups are formed alike on every rank; a rank outside a name's
        process set skips it, a joined one adds zeros to allreduces."""
        groups: list[tuple[Any, list[tuple[Any, ...]]]] = []
        for response in responses:
            kind, key, detail = response
            fusion = (_fusion_of(key[0], detail), key[2]) if kind == "run" else (None, None)
            if fusion[0] is not None and groups and groups[-1][0] == fusion:
                groups[-1][1].append(response)
            else:
                groups.append((fusion, [response]))
        for (fusion, _), group in groups:
            kind, key, detail = group[0]
            if self.rank not in key[2]:
                continue
            if fusion is not None:
                self._run_group([(mine[r[1]], r[2]) for r in group])
                continue
            request = mine[key]
            if request is None:
                continue  # joined: allreduces are all it takes part in
            if kind == "fail":
                request.finish(error=ringlet.MismatchError(detail))
                continue
            if request.inline:
                # The caller runs it now, on its own thread, while every rank's negotiation
                # waits at this same point (so nothing of the negotiation's comes between),
                # once what the negotiation started has finished (adding a process set while
                # ringlet's thread runs a collective is not safe in the core).
                self._drain()
                request.finish()
                request.resumed.wait()
                continue
            try:
                assert request.start is not None
                work = request.start()
                self._started.append(work)
                request.finish(work=work)
            except Exception as exc:  # the caller's synchronize raises it
                request.finish(error=exc)

    def _drain(self) -> None:
        """Until every collective this negotiation started has finished."""
        for work in self._started:
            while not work.poll():
                time.sleep(0.0002)
        self._started.clear()

    def _run_group(self, group: list[tuple[Request | None, tuple[Any, ...]]]) -> None:
        requests = [request for request, _ in group]
        try:
            handles = self._run_fused(requests, [signature for _, signature in group])
        except Exception as exc:  # the caller's synchronize raises it
            for request in requests:
                if request is not None:
                    request.finish(error=exc)
            return
        self._started.extend(handles)
        for request, handle in zip(requests, handles):
            if request is not None:
                request.finish(work=handle)

    def _finish_join(self) -> None:
        last = self._joined[-1]
        with self._lock:
            request, self._join = self._join, None
            self._joined, self._join_announced = [], False
        if request is not None:
            request.finish(value=last)

    def _inspect_stall(self) -> None:
        """Every rank's waiting names, then the core's stall messages (runtime/stall.rs): each
        rank, for its requests that have waited past RINGLET_STALL_WARNING, what it waits in
        and for which rank; rank 0, for each name, the ranks that have not submitted it."""
        now = time.monotonic()
        with self._lock:
            due = self._stalled(now)
            for request in due:
                request.stall_reported = True
            mine = [(r.key, now - r.submitted, r in due) for r in self._local.values()]
            joined = set(self._joined)
        everyone = ringlet.allgather_object(mine, process_set=self.comm)
        waiting: dict[Key, dict[int, tuple[float, bool]]] = {}
        for rank, theirs in enumerate(everyone):
            for key, age, is_due in theirs:
                waiting.setdefault(key, {})[rank] = (age, is_due)
        lines = []
        for key, ages in sorted(waiting.items()):
            collective, name, members = key
            missing = [m for m in members if m not in ages and m not in joined]
            if not missing:
                continue
            label = f"{collective} {name!r}"
            age, is_due = ages.get(self.rank, (0.0, False))
            if is_due:
                lines.append(waiting_report(self.rank, age, label, missing[0],
                                            self.stall_seconds or 0.0))
            if self.rank == 0 and any(d for _, d in ages.values()):
                oldest = max(a for a, _ in ages.values())
                lines.append(missing_report(label, oldest, missing))
        if lines:
            print("\n".join(lines), file=sys.stderr, flush=True)


def lane_caller(slot: int) -> str:
    """The caller (``ringlet.as_caller``) of a lone allreduce of the name in cache ``slot``: the
    consistency check pairs calls only of the same caller, so only of the same name."""
    return f"{CYCLE_CALLER}, slot {slot}"


def _joinable(collective: str, signature: tuple[Any, ...]) -> bool:
    return collective == "allreduce" and (("op", "sum") in signature or ("op", "avg") in signature)


def _fusion_of(collective: str, signature: tuple[Any, ...]) -> tuple[Any, ...] | None:
    """What two allreduces must share to be fused (everything but their tensors); None for a
    collective that is not fused."""
    if collective != "allreduce":
        return None
    settings = tuple(item for item in signature if not isinstance(item[1], tuple))
    if ("fusable", False) in settings:
        return None
    return settings
