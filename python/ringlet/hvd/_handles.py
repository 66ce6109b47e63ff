"""Horovod's handles, and how an operation is started: at once (matched by order) or
submitted to name matching's negotiation under its name."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import ringlet
from ringlet import elastic

from ._negotiation import Negotiator
from ._process_sets import member_ranks
from ._requests import Key, Request
from ._state import state

__all__ = ["HandleSet", "Negotiated", "collectively", "finished_handle", "named",
           "signature_settings"]


class HandleSet:
    """Horovod handles: opaque objects that ``synchronize`` and ``poll`` take."""

    def __init__(self, work: Any, finish: Callable[[], Any]) -> None:
        self.work, self.finish, self.result, self.finished = work, finish, None, False
        self.name: Key | None = None
        """The name this handle holds (``named``) until it is synchronized."""

    def poll(self) -> bool:
        return self.finished or self.work.done()

    def synchronize(self) -> Any:
        if not self.finished:
            try:
                self.work.wait()
                self.result, self.finished = self.finish(), True
            finally:
                self.release_name()
        return self.result

    def outcome(self) -> None:
        """Wait until its collectives have run, without handing their results on; raises
        their error."""
        work = self.work
        if isinstance(work, HandleSet):
            work.outcome()
        elif work is not None:
            work.wait()

    def release_name(self) -> None:
        """Free this handle's name for the next operation (``named``)."""
        if self.name is not None and state.in_flight.get(self.name) is self:
            del state.in_flight[self.name]
        self.name = None

    def timing(self) -> tuple[float, float] | None:
        """As ``ringlet.Handle.timing``, for the collectives behind this handle."""
        timing = getattr(self.work, "timing", None)
        return timing() if timing is not None else None

    # So that handles can wrap handles.
    done, wait = poll, synchronize


class Negotiated(HandleSet):
    """The handle of an operation matched by name: it finishes once the negotiation has run it
    (every member submitted it) and its collective has finished, or once its lone run
    (``Negotiator.run_alone``) has paired up and finished."""

    def __init__(self, negotiator: Negotiator, request: Request) -> None:
        super().__init__(None, lambda: None)
        self.negotiator, self.request = negotiator, request

    def poll(self) -> bool:
        request = self.request
        if self.finished:
            return True
        if request.lone is not None:
            paired = self.negotiator.settle(request, block=False)
            if paired is not False:
                return bool(paired)
        return request.ran.is_set() and (request.work is None or request.work.poll())

    def synchronize(self) -> Any:
        if not self.finished:
            try:
                request = self.request
                if request.lone is not None and self.negotiator.settle(request):
                    self.result = request.lone.synchronize()
                else:
                    value = self.negotiator.wait(request)
                    work = request.work
                    self.result = work.synchronize() if work is not None else value
                self.finished = True
            finally:
                self.release_name()
        return self.result

    def timing(self) -> tuple[float, float] | None:
        work = self.request.lone or self.request.work
        return work.timing() if work is not None else None

    done, wait = poll, synchronize



def finished_handle(result: Any) -> HandleSet:
    """A handle for work that has already run."""
    handle = HandleSet(None, lambda: result)
    handle.result, handle.finished = result, True
    return handle



def named(collective: str, name: Any, start: Callable[[], HandleSet],
          signature: tuple[Any, ...] = (), process_set: Any = None,
          payload: Any = None, detail: str | None = None, inline: bool = False,
          waited_for: bool = False, alone: bool = False) -> HandleSet:
    """``start()`` the operation, unless one of the same collective and ``name`` is still in
    flight on this rank: then ValueError (Horovod's words) before anything is sent. A name is
    in flight until its handle is synchronized (successfully or not), not merely until its
    operation has finished: an operation may finish before its caller's next line, and
    whether a name were refused would then depend on timing (Horovod's duplicate-name tests
    submit one name twice in a row and expect the second to be refused on every rank).

    With name matching, the operation is submitted to the negotiation instead, under its name
    (unnamed: Horovod's "<collective>.noname.<n>"): ``signature`` is what every rank must pass
    alike (``detail``: what this rank passed, as an error names it); an allreduce's
    ``payload`` lets it be fused with others (``start`` is then unused); an ``inline`` one is
    run by the caller when its turn comes (``collectively``); one ``waited_for`` is
    synchronized by the caller at once (a synchronous call), which runs the cycles itself.
    An asynchronous one that may run ``alone`` (an allreduce of every rank, its name given) is
    started at once while every rank is idle, without a cycle (``Negotiator.run_alone``).
    """
    if not inline and elastic.UNDER_DRIVER:
        elastic.refuse_outside_run(f"hvd.{collective}")
    if name is None and state.negotiator is None:
        return start()
    members = member_ranks(process_set)
    # Names are per process set, as Horovod's (a controller per set).
    key = None if name is None else (collective, str(name), members)
    if key is not None and key in state.in_flight:
        raise ValueError(
            f"Requested to {collective} a tensor with the same name as another tensor that is "
            "currently being processed.  If you want to request another tensor, use a "
            "different tensor name.")
    if state.negotiator is None:
        handle = start()
    else:
        if ringlet.rank() not in members:
            raise ValueError(f"rank {ringlet.rank()} is not in {process_set}: only its members "
                             f"may call {collective} on it")
        if name is None:
            count = state.unnamed.get((collective, members), 0) + 1
            state.unnamed[collective, members] = count
            name = f"{collective}.noname.{count}"
        request = Request(collective, str(name), signature, members,
                          None if payload is not None else start, detail)
        request.payload, request.inline = payload, inline
        negotiator = state.negotiator
        if not alone or negotiator.run_alone(request.key, signature, start, request) is None:
            negotiator.submit(request, waited_for)
        handle = Negotiated(negotiator, request)
    if key is not None:
        state.in_flight[key] = handle
        handle.name = key
    return handle


def signature_settings(process_set: Any, **settings: Any) -> tuple[tuple[str, Any], ...]:
    """A signature's settings, with the process set's id."""
    set_id = getattr(process_set, "process_set_id", None) or 0
    return (*settings.items(), ("set", set_id))



def collectively(what: str, run: Callable[[], Any], process_set: Any = None) -> Any:
    """``run()``, a collective over every rank (of ``process_set``) that is not one of
    Horovod's (adding a process set, ...). With name matching it runs on the negotiation
    thread, in its turn: ringlet runs one collective at a time in a process, so a collective
    of the caller's thread could otherwise meet the negotiation's in another order on another
    rank, and both would wait."""
    if state.negotiator is None:
        return run()
    # It runs on this thread (ringlet's process sets are made on the thread that asks), when
    # the negotiation reaches it, which then waits until it has run.
    handle = named(what, None, lambda: finished_handle(None), process_set=process_set, inline=True)
    assert isinstance(handle, Negotiated)
    try:
        handle.synchronize()
        with ringlet.let_through():
            return run()
    finally:
        handle.request.resumed.set()


