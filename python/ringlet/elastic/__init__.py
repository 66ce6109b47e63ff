"""Elastic training: a job that goes on when ranks fail, hosts leave or hosts join.

Horovod's elastic API, over ringlet's collectives, for any MPI::

    state = ringlet.elastic.ObjectState(epoch=0, weights=w)

    @ringlet.elastic.run
    def train(state):
        for state.epoch in range(state.epoch, 10):
            ...                          # collectives: they run inside ``run`` only
            state.commit()               # a point to come back to; raises if hosts changed

    train(state)

Two mechanisms behind one API:

- Under MPI's fault tolerance (ULFM: Open MPI 5's ``mpirun --with-ft ulfm``), a rank or host
  that dies makes the survivors' next collective raise ``ProcessFailedError``; they shrink the
  communicator, set ringlet up again on the ranks left, restore the last commit from memory and
  go on, in the same job (``_ulfm``).
- Started by ``ringletrun --min-np N --max-np M --host-discovery-script S`` (the elastic
  driver) on any other MPI, a job that loses a rank or a host is restarted by the driver on
  the hosts that are left, and resumes from the last commit, which rank 0 sent to the driver.
  A job whose hosts change (the discovery script lists others) stops at its next commit and is
  restarted on the new hosts, from that commit.

Started any other way, ``run`` runs the function once after ``sync``, as a job without elastic
hosts would, and failures end the job.

``ringlet.hvd.elastic`` (and ``.torch``, ``.tensorflow``, ``.keras``) publish this under
Horovod's names, with the framework's state objects.
"""

from __future__ import annotations

import functools
import os
import pickle
import traceback
from collections.abc import Callable, Iterable
from typing import Any, TypeVar

import ringlet

from . import _link, _protocol, _ulfm
from ._ulfm import on_new_membership

__all__ = [
    "UNDER_DRIVER",
    "HostsUpdatedInterrupt",
    "ObjectState",
    "OutsideRunError",
    "State",
    "StateError",
    "driver_link",
    "inside_run",
    "on_new_membership",
    "refuse_outside_run",
    "run",
]

UNDER_DRIVER = bool(os.environ.get(_protocol.ADDRESS))
"""Whether this process is a rank of a job that ringletrun's elastic driver started."""

Result = TypeVar("Result")


class HostsUpdatedInterrupt(RuntimeError):
    """The hosts changed: raised by ``State.commit`` / ``check_host_updates`` on every rank at
    the same step. ``run`` catches it and carries on with the new hosts, without going back to
    the last commit. ``skip_sync`` is true when hosts were only removed."""

    def __init__(self, skip_sync: bool) -> None:
        super().__init__("the job's hosts changed" + (" (removed only)" if skip_sync else ""))
        self.skip_sync = skip_sync


class OutsideRunError(RuntimeError):
    """A collective called outside ``elastic.run`` in a job of the elastic driver."""


class StateError(ValueError):
    """A state object that cannot be committed: what it holds cannot be serialized."""


class State:
    """What a training function needs to resume: subclasses say how to ``save`` it (at each
    commit), ``restore`` it (to the last commit), ``sync`` it (rank 0's to every rank) and
    serialize what ``save`` kept (``snapshot``/``load_snapshot``: how a commit survives a
    restart of the job). Horovod's ``State``, with its methods."""

    def __init__(self, bcast_object: Callable[[Any], Any] | None = None,
                 get_rank: Callable[[], int] | None = None) -> None:
        self._bcast_object = bcast_object or ringlet.broadcast_object
        self._rank = get_rank or ringlet.rank
        self._reset_callbacks: list[Callable[[], Any]] = []
        self._seen_updates = 0
        self._link: _link.DriverLink | None = None

    def register_reset_callbacks(self, callbacks: Iterable[Callable[[], Any]]) -> None:
        """Functions to call after each reset (the job's ranks changed), before the state is
        synchronized: for example to scale the learning rate by the new ``size()``."""
        callbacks = list(callbacks)
        for callback in callbacks:
            if not callable(callback):
                raise TypeError(f"a reset callback must be callable, got {callback!r}")
        self._reset_callbacks.extend(callbacks)

    def on_reset(self) -> None:
        """After a reset: ``reset()``, then every reset callback, in order."""
        self.reset()
        for callback in self._reset_callbacks:
            callback()

    def commit(self) -> None:
        """Keep the state as it is now as the point to come back to (``save``); under the
        elastic driver rank 0 also hands it to the driver, so that it survives a restart.
        Then ``check_host_updates``. Collective: every rank raises ``StateError`` together
        when rank 0 cannot serialize the state."""
        self.save()
        refusal = ""
        if self._link is not None and self._rank() == 0:
            try:
                serialize = self.serializer()
            except Exception as error:
                refusal = (f"cannot commit {type(self).__name__}: its saved state cannot be "
                           f"serialized ({type(error).__name__}: {error}); keep only picklable "
                           "values in it (arrays, numbers, state_dict()s), and rebuild the "
                           "rest in a reset callback")
            else:
                self._link.commit(serialize)
        self._exchange_news(refusal)

    def check_host_updates(self) -> None:
        """Raise ``HostsUpdatedInterrupt`` on every rank at once if the driver has reported
        new or removed hosts (collective: rank 0's view is broadcast)."""
        self._exchange_news("")

    def _exchange_news(self, refusal: str) -> None:
        news = (0, True, refusal)
        if self._link is not None and self._rank() == 0:
            news = (self._link.hosts_updates, self._link.removed_only, refusal)
        if ringlet.size() > 1:
            news = self._bcast_object(news)
        updates, removed_only, refusal = news
        if refusal:
            raise StateError(refusal)
        if updates > self._seen_updates:
            self._seen_updates = updates
            raise HostsUpdatedInterrupt(removed_only)

    def save(self) -> None:
        raise NotImplementedError

    def restore(self) -> None:
        raise NotImplementedError

    def sync(self) -> None:
        raise NotImplementedError

    def reset(self) -> None:
        """Called on a reset, before the callbacks (nothing by default)."""

    def snapshot(self) -> bytes:
        """What ``save`` kept, as bytes (``load_snapshot`` reads them back)."""
        raise NotImplementedError

    def load_snapshot(self, payload: bytes) -> None:
        """Make ``payload`` (from ``snapshot``) the saved state, and restore it."""
        raise NotImplementedError

    def serializer(self) -> Callable[[], bytes]:
        """What ``save`` kept, ready to become ``snapshot``'s bytes later, on another thread
        (a commit is sent in the background): by default serialized at once. A state whose
        ``save`` makes fresh copies returns a function over them, and serializes only what
        could still change now (raising here what cannot be serialized)."""
        payload = self.snapshot()
        return lambda: payload


class ObjectState(State):
    """Keyword arguments as attributes (``state.epoch``, ``state.weights``): ``save`` keeps
    their values, ``restore`` puts them back, ``sync`` broadcasts rank 0's saved values.
    Horovod's ``ObjectState``. Values must pickle to survive a restart."""

    def __init__(self, bcast_object: Callable[[Any], Any] | None = None,
                 get_rank: Callable[[], int] | None = None, **kwargs: Any) -> None:
        self._saved_state = kwargs
        self._set_attrs()
        super().__init__(bcast_object=bcast_object, get_rank=get_rank)

    def save(self) -> None:
        self._saved_state = {name: getattr(self, name) for name in self._saved_state}

    def restore(self) -> None:
        self._set_attrs()

    def sync(self) -> None:
        if self._saved_state:
            self._saved_state = self._bcast_object(self._saved_state)
            self._set_attrs()

    def snapshot(self) -> bytes:
        return pickle.dumps(self._saved_state, protocol=pickle.HIGHEST_PROTOCOL)

    def load_snapshot(self, payload: bytes) -> None:
        self._saved_state = pickle.loads(payload)
        self._set_attrs()

    def _set_attrs(self) -> None:
        for name, value in self._saved_state.items():
            setattr(self, name, value)


_depth = 0


def inside_run() -> bool:
    """Whether a function decorated by ``run`` is running."""
    return _depth > 0


def refuse_outside_run(what: str) -> None:
    """Raise ``OutsideRunError`` if this is a rank of an elastic job and no ``run`` function
    is running: there, every collective belongs inside it (Horovod's rule), where a failure
    can be recovered from and the ranks of a new job meet the others in ``sync``."""
    if UNDER_DRIVER and _depth == 0:
        raise OutsideRunError(
            f"{what} was called outside elastic.run in a job of ringletrun's elastic driver: "
            "every collective of an elastic job runs inside the function decorated by "
            "elastic.run, so that a lost rank can be recovered from (state.sync() already "
            "broadcasts the state at its start); move the call into that function")


def driver_link() -> _link.DriverLink | None:
    """This rank's connection to the elastic driver; None when the job was not started by
    it. Initializes ringlet."""
    ringlet.init()
    return _link.link(ringlet.rank(), ringlet.size())


def run(func: Callable[..., Result]) -> Callable[..., Result]:
    """Decorate a training function ``func(state, *args, **kwargs)``: it runs after the
    state is synchronized (rank 0's everywhere), and, under the elastic driver, after a
    restart from the last commit (the reset callbacks first). Horovod's ``elastic.run``.

    Under the driver, when the hosts change (``HostsUpdatedInterrupt`` from a commit) every
    rank hands the state on and the process exits, for the driver to restart the job on the
    new hosts; when a collective fails because a rank or host is gone, the driver restarts the
    job on the hosts left, from the last commit. Any other exception ends the job, and the
    driver leaves that rank's host out of the next one."""

    @functools.wraps(func)
    def wrapper(state: State, *args: Any, **kwargs: Any) -> Result:
        global _depth
        if not isinstance(state, State):
            raise TypeError(f"elastic.run's function takes a ringlet.elastic.State first, "
                            f"got {type(state).__name__}")
        link = driver_link()
        _depth += 1
        try:
            if link is None:
                return _run_recovering(state, func, args, kwargs, reset=False)
            return _run_under_driver(link, state, func, args, kwargs)
        finally:
            _depth -= 1

    return wrapper


def _run_recovering(state: State, func: Callable[..., Result], args: tuple[Any, ...],
                    kwargs: dict[str, Any], reset: bool) -> Result:
    """Sync, then run ``func``; under ULFM, after a rank died: shrink, restore the last
    commit, run the reset callbacks, sync and run it again (Horovod's order), until it
    returns on every survivor alike."""
    membership = _ulfm.Membership() if _ulfm.active() else None
    while True:
        try:
            if reset:
                state.on_reset()
            state.sync()
            result = func(state, *args, **kwargs)
            if membership is not None:
                membership.agree()
            return result
        except Exception as error:  # a framework may carry ringlet's as its own type
            if membership is None or not _ulfm.is_process_failure(error):
                raise
            state.restore()
            membership.recover()
            reset = True


def _run_under_driver(link: _link.DriverLink, state: State, func: Callable[..., Result],
                      args: tuple[Any, ...], kwargs: dict[str, Any]) -> Result:
    state._link = link
    if link.resumed and ringlet.rank() == 0:
        payload = link.fetch()
        if payload is not None:
            state.load_snapshot(payload)
    try:
        result = _run_recovering(state, func, args, kwargs, reset=link.resumed)
    except HostsUpdatedInterrupt:
        # The new hosts take over from here: the state as it is, as Horovod carries it on.
        if ringlet.rank() == 0:
            state.save()
            link.commit(state.serializer(), wait=True)
        link.bye("reset")
        ringlet.shutdown()
        raise SystemExit(0) from None
    except ringlet.MismatchError as error:
        link.bye("failed", _describe(error))
        raise
    except ringlet.RingletError as error:
        link.bye("lost", _describe(error))
        raise
    except BaseException as error:
        link.bye("failed", _describe(error))
        raise
    link.bye("done")
    return result


def _describe(error: BaseException) -> str:
    return "".join(traceback.format_exception_only(type(error), error)).strip()
