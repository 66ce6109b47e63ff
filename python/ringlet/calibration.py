"""Calibration of ``auto``'s cost model: measure it, cache it, agree on it, install it.

The model and every decision made with it live in the Rust core (``src/auto``): each
algorithm's cost, the built-in parameters, the decision table, the refinement on real calls.
This module only measures what the model needs on this machine and hands the core one set of
parameters, the same on every rank:

- latency (alpha) and bandwidth (beta) inside a node and between nodes, from a few exchanges,
  and the cost of combining (gamma) per dtype;
- whether messages between nodes go whole or in pieces (timed both ways; the core decides);
- the candidates timed at growing sizes, as long as they fit ``CALIBRATION_BUDGET`` seconds,
  which gives each algorithm's measured/model correction (what the model cannot see: cache
  effects, the MPI library's own tricks).

It runs once per layout of ranks on nodes, MPI library, ringlet build and settings, at the
first ``auto`` call (it is collective: every rank takes part), and is cached as JSON in
``$RINGLET_CACHE_DIR`` (default ``$XDG_CACHE_HOME/ringlet`` or ``~/.cache/ringlet``). Rank 0's
result is broadcast, so every rank installs the same parameters. ``RINGLET_CALIBRATE=0`` skips
it: the core's built-in parameters are used.

This module needs only the core (not the layers above it), so that ``init`` can settle the
pieces between nodes before any collective runs.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import math
import os
import sys
import tempfile
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from . import _core
from ._dtypes import SUPPORTED_DTYPES

__all__ = [
    "CACHE_FORMAT",
    "CALIBRATION_BUDGET",
    "CALIBRATION_SIZES",
    "LARGE_CALIBRATION_SIZE",
    "Calibration",
    "cache_dir",
    "cache_path",
    "cached",
    "calibration_key",
    "choose_message_pieces",
    "ensure_installed",
    "installed",
    "parameters",
    "recalibrate",
    "uninstall",
]

CACHE_FORMAT = 6  # bump when the calibration procedure or the file's layout changes
CALIBRATION_SIZES = (8, 64, 512, 4 << 10, 16 << 10, 64 << 10, 256 << 10, 1 << 20, 4 << 20,
                     16 << 20)
"""float32 message sizes (bytes) at which calibration times every candidate."""
LARGE_CALIBRATION_SIZE = 64 << 20
"""Also timed, for every candidate: beyond the last-level cache the winners change."""
CALIBRATION_BUDGET = 3.0
"""Seconds the timed runs of a calibration may take: the sizes stop where the next would not
fit (on a slow network, sooner; larger sizes keep the last measured correction)."""
ACROSS_PROBE_BYTES = 512 << 10
"""The exchange between nodes that measures their bandwidth: long enough to dwarf the latency,
short enough for a slow link (40 ms at 100 Mbit/s)."""


@dataclass
class Calibration:
    """A set of the model's parameters and where they come from. ``parameters`` is their JSON,
    as the core reads and checks it (``src/auto/model.rs`` says what each one means); this
    module never interprets it beyond the message limit between nodes."""

    parameters: str
    key: dict[str, Any] = field(default_factory=dict)
    created: str = ""
    calibration_seconds: float = 0.0
    source: str = "built-in defaults"

    @classmethod
    def built_in(cls, source: str) -> Calibration:
        return cls(_core.default_parameters(), source=source)

    def model(self) -> dict[str, Any]:
        """The parameters, for display (every value is the core's)."""
        return json.loads(self.parameters)

    def to_json(self) -> str:
        return json.dumps({"format": CACHE_FORMAT, "parameters": self.model(), "key": self.key,
                           "created": self.created,
                           "calibration_seconds": self.calibration_seconds}, sort_keys=True)

    @classmethod
    def from_json(cls, text: str, source: str) -> Calibration:
        """Parse a cached calibration; ValueError if anything is off (the core checks the
        parameters)."""
        data = json.loads(text)
        if not isinstance(data, dict) or data.get("format") != CACHE_FORMAT:
            raise ValueError("not a ringlet calibration of this format")
        if not isinstance(data.get("key"), dict) or not isinstance(data.get("parameters"), dict):
            raise ValueError("a calibration needs its key and parameters")
        return cls(_core.check_parameters(json.dumps(data["parameters"])), data["key"],
                   str(data.get("created", "")), float(data.get("calibration_seconds", 0.0)),
                   source)


_installed: Calibration | None = None
"""What ``install`` last put in the core (for ``explain`` to say where it came from)."""


def installed() -> Calibration | None:
    """The calibration in force, if the core holds one (``auto`` has run, or ``calibrate``)."""
    return _installed if _core.installed_parameters() is not None else None


def install(calibration: Calibration) -> None:
    """Hand ``calibration`` to the core for every ``auto`` decision. Every rank must install
    the same one (they come broadcast from rank 0)."""
    global _installed
    _core.install_parameters(calibration.parameters)
    _installed = calibration


def uninstall() -> None:
    """Forget the installed calibration: the next ``auto`` call on ringlet's communicator loads
    or measures one again (and reads the environment's overrides again); until then a process
    set's ``auto`` raises. Call it on every rank alike."""
    global _installed
    _core.uninstall_parameters()
    _installed = None


def ensure_installed() -> None:
    """Load or measure this communicator's calibration and install it, unless the core holds
    one. Collective the first time (every rank finds none installed at the same call)."""
    if _core.installed_parameters() is None:
        install(parameters())


def parameters(recalibrate: bool = False) -> Calibration:
    """This communicator's calibration: cached, or measured now (collective)."""
    _core.set_stats_enabled(False)  # calibration's own traffic is not the user's
    try:
        return _parameters(recalibrate)
    finally:
        _core.set_stats_enabled(True)


def _parameters(recalibrate: bool) -> Calibration:
    if _core.group().size <= 1:
        return Calibration.built_in("one rank: nothing to choose")
    if os.environ.get("RINGLET_CALIBRATE", "1") == "0":
        return Calibration.built_in("built-in defaults (RINGLET_CALIBRATE=0)")
    key = calibration_key()
    path = cache_path(key)
    found = None if recalibrate else _shared_cache(key, path)
    if found is None:
        found = _calibrate_and_save(key, path, recalibrate)
    # What these parameters were measured with, in force on every rank (a cache read elsewhere
    # may have been measured by another job).
    _use_message_limit(found.model()["across_message_bytes"])
    return found


def recalibrate() -> Calibration:
    """Measure again (collective), save, and install the result."""
    found = parameters(recalibrate=True)
    install(found)
    return found


# ---------------------------------------------------------------------------------------------
# The cache.


def cache_dir() -> Path:
    if os.environ.get("RINGLET_CACHE_DIR"):
        return Path(os.environ["RINGLET_CACHE_DIR"])
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "ringlet"


def calibration_key() -> dict[str, Any]:
    """What a calibration depends on (local: the hosts are known since ``init``)."""
    from ._version import __version__

    group = _core.group()
    size, hosts = group.size, group.hosts
    return {
        "hosts": sorted(set(hosts)),
        "ranks_per_host": sorted(hosts.count(h) for h in set(hosts)),
        "nodes": _core.nodes(0),
        "size": size,
        "mpi": _core.mpi_library()[0].splitlines()[0],
        "ringlet": __version__,
        "kernels": _core.kernel_level(),
        "core_build": _core_build(),
        "format": CACHE_FORMAT,
        "settings": _user_settings(),
        "algorithms": list(_core.algorithms("allreduce")),
        "shared_memory": _core.shared_memory(0).available,
    }


def _user_settings() -> dict[str, Any]:
    """The settings the user chose: calibration's own limit between nodes is its result, not
    part of what it depends on."""
    settings = _core.settings()
    if settings.pop("across_message_bytes_auto"):
        del settings["across_message_bytes"]
    return settings


def _core_build() -> str:
    """Size and time of the compiled core: a rebuilt core is calibrated afresh."""
    stat = Path(_core.__file__).stat()
    return f"{stat.st_size}-{int(stat.st_mtime)}"


def cache_path(key: dict[str, Any]) -> Path:
    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]
    return cache_dir() / f"calibration-{digest}.json"


_warned_unreadable: set[tuple[str, int, int]] = set()
"""The unreadable cache files this process has warned about (path, size, mtime): one warning
per file, though ``init`` and the first ``auto`` call both look for it."""


def load(path: Path, key: dict[str, Any]) -> Calibration | None:
    """The calibration cached at ``path`` for ``key``; None if there is none, or if it was
    measured for another key (another ringlet, MPI, layout or settings). A file that cannot be
    read as one (corrupt, truncated, not text) is ignored with one warning (and recalibrated).
    Never raises: rank 0 reads for every rank, which would otherwise wait for it. Local."""
    try:
        data = path.read_bytes()
        stat = path.stat()
    except OSError:
        return None
    try:
        found = Calibration.from_json(data.decode(), source=str(path))
    except (ValueError, TypeError, KeyError, RecursionError) as exc:  # UnicodeDecodeError too
        seen = (str(path), stat.st_size, stat.st_mtime_ns)
        if seen not in _warned_unreadable:
            _warned_unreadable.add(seen)
            warnings.warn(f"ringlet: ignoring unreadable calibration cache {path} ({exc}); "
                          "recalibrating", RuntimeWarning, stacklevel=3)
        return None
    return found if found.key == key else None


def save(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` atomically: to a temporary file of its own in the same
    directory, flushed to disk, then renamed over ``path``, so that a job reading the cache
    (another job, on a shared home directory) sees the old file or the new one, never part of
    one, and two jobs saving at once leave one of their files whole. Raises OSError."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, name = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as file:
            os.fchmod(fd, 0o644)  # as a plain write makes it (mkstemp's is 0600): readable
            file.write(text)
            file.flush()
            os.fsync(file.fileno())
        os.replace(name, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(name)
        raise


def cached() -> Calibration:
    """This communicator's cached calibration, or the built-in parameters. Local."""
    if _core.group().size <= 1:
        return Calibration.built_in("one rank: nothing to choose")
    key = calibration_key()
    path = cache_path(key)
    found = load(path, key)
    if found is None:
        return Calibration.built_in(f"built-in defaults (no cached calibration at {path})")
    return found


def _shared_cache(key: dict[str, Any], path: Path) -> Calibration | None:
    """Rank 0's cached calibration for ``key``, the same on every rank, or None. Collective."""
    text = ""
    if _core.group().rank == 0:
        found = load(path, key)
        text = found.to_json() if found else ""
    text = _broadcast_text(text)
    return Calibration.from_json(text, source=str(path)) if text else None


def _calibrate_and_save(key: dict[str, Any], path: Path, recalibrate: bool) -> Calibration:
    """Measure (collective), broadcast rank 0's result, and have rank 0 save it."""
    first = _core.group().rank == 0
    measured = _measure(key, reuse_pieces=not recalibrate)
    text = _broadcast_text(measured.to_json() if first else "")
    found = Calibration.from_json(text, source=f"calibrated now, saved to {path}")
    if first:
        try:
            save(path, text)
        except OSError as exc:
            warnings.warn(f"ringlet: cannot save calibration to {path}: {exc}", stacklevel=3)
    return found


# ---------------------------------------------------------------------------------------------
# Between nodes: whole messages or pieces.


_pieces_measured: dict[str, tuple[int, float]] = {}
"""Per calibration key: the message limit between nodes measured in this process, and the
exchange's slowdown with it (``init`` measures them; the calibration that follows keeps them)."""


def _digest(key: dict[str, Any]) -> str:
    return cache_path(key).stem


def _use_message_limit(limit: int) -> None:
    """Put calibration's message limit between nodes in force (not over the user's own). Every
    rank must call it alike: the limit is part of every call's check."""
    settings = _core.settings()
    if settings["across_message_bytes_auto"] and settings["across_message_bytes"] != limit:
        _core.use_calibrated_message_limit(limit)


def choose_message_pieces() -> None:
    """On a communicator that spans nodes, the message limit between nodes from the cached
    calibration if there is one, else measured now (a few exchanges of ``ACROSS_PROBE_BYTES``
    between pairs of nodes: about 0.5 s on 4 hosts at 1 Gbit/s), so that every call, whatever
    its algorithm, sends what calibration would. ``init`` calls it. Collective; nothing (and no
    message) on one node, with one rank, or with ``RINGLET_CALIBRATE=0``."""
    nodes = _core.nodes(0)
    if len(set(nodes)) <= 1 or os.environ.get("RINGLET_CALIBRATE", "1") == "0":
        return
    _core.set_stats_enabled(False)  # calibration's own traffic is not the user's
    try:
        key = calibration_key()
        found = _shared_cache(key, cache_path(key))
        if found is not None:
            _use_message_limit(found.model()["across_message_bytes"])
            return
        _pieces_measured[_digest(key)] = _time_message_pieces()
    finally:
        _core.set_stats_enabled(True)


def _time_message_pieces() -> tuple[int, float]:
    """Time pairs of ranks on two nodes exchanging ``ACROSS_PROBE_BYTES`` both ways at once with
    each limit the core offers (or only the user's, if set), put in force the one the core
    keeps, and return it with how much longer than one way the exchange takes with it. Every
    pairing of nodes that halving-doubling uses takes part (whether a connection runs both ways
    at once with whole messages is a matter of chance, connection by connection), each
    pairing's slowest pair counts, and their sum decides, the same on every rank. Collective."""
    settings = _core.settings()
    auto = settings["across_message_bytes_auto"]
    options = _core.message_limit_options() if auto else [settings["across_message_bytes"]]
    pairings = _pairings(len(set(_core.nodes(0))))
    one_way = _pair_seconds("pairs_one_way", ACROSS_PROBE_BYTES, 5, pairings)
    both_ways = {}
    for limit in options:
        if auto:
            _core.use_calibrated_message_limit(limit)
        both_ways[limit] = _pair_seconds("pairs", ACROSS_PROBE_BYTES, 5, pairings)
    chosen = _core.choose_message_limit(list(both_ways.items()))
    if auto:
        _core.use_calibrated_message_limit(chosen)
    return chosen, max(both_ways[chosen], 1e-9) / max(one_way, 1e-9)


# ---------------------------------------------------------------------------------------------
# Measuring.


def _measure(key: dict[str, Any], reuse_pieces: bool = True) -> Calibration:
    """Run the calibration. Collective; at most about ``CALIBRATION_BUDGET`` seconds on any
    network: latency and bandwidth per tier from a few exchanges, then the candidates timed at
    growing sizes while the time spent and the next size's expected time fit the budget. The
    pieces between nodes that ``init`` measured in this process are kept unless
    ``reuse_pieces`` is false."""
    nodes = _core.nodes(0)
    several = len(set(nodes)) > 1
    progress = _Progress(f"{len(nodes)} ranks on {len(set(nodes))} node(s)")
    measured: dict[str, Any] = {}
    if not several or max(nodes.count(n) for n in set(nodes)) > 1:
        tier = "within" if several else "any"
        small = _pair_seconds(tier, 8, 200)
        large = _pair_seconds(tier, 1 << 20, 20)
        measured["alpha"] = max(small, 1e-9)
        measured["beta"] = max((large - small) / (1 << 20), 1e-13)
    if several:
        pieces = _pieces_measured.get(_digest(key)) if reuse_pieces else None
        if pieces is None:
            pieces = _pieces_measured[_digest(key)] = _time_message_pieces()
        measured["across_message_bytes"], measured["exchange_slowdown"] = pieces
        small = _pair_seconds("across", 8, 50)
        large = _pair_seconds("across", ACROSS_PROBE_BYTES, 5)
        measured["alpha_across"] = max(small, 1e-9)
        measured["beta_across"] = max((large - small) / ACROSS_PROBE_BYTES, 1e-13)
    probe = 256 << 10
    gammas = _max_over_ranks([_core.measure_combine(d, probe, 20) / probe
                              for d in SUPPORTED_DTYPES])
    measured["gamma"] = {d: max(float(g), 1e-13) for d, g in zip(SUPPORTED_DTYPES, gammas)}
    progress.tick()
    measured["corrections"] = _corrections(json.dumps(measured), progress)
    return Calibration(_core.check_parameters(json.dumps(measured)), key,
                       time.strftime("%Y-%m-%dT%H:%M:%S"), progress.elapsed(),
                       "calibrated now")


def _corrections(parameters: str, progress: _Progress) -> dict[str, list[tuple[int, float]]]:
    """Each candidate's measured/model ratio at the sizes that fit the budget: the candidates
    timed on float32 sums, interleaved, against the core's model with ``parameters``."""
    def models(nbytes: int) -> dict[str, float]:
        rows = _core.explain(nbytes, "float32", "sum", parameters=parameters).candidates
        return {row.algorithm: row.model_seconds for row in rows}

    timed = tuple(models(8))
    measured: dict[str, list[tuple[int, float]]] = {name: [] for name in timed}
    spent = 0.0  # seconds the sizes so far took, the same on every rank (slowest rank's)
    started = time.perf_counter()
    sizes = (*CALIBRATION_SIZES, LARGE_CALIBRATION_SIZE)
    for index, nbytes in enumerate(sizes):
        model = models(nbytes)
        # Each size gets an equal share of what is left of the budget, so that a slow network
        # still sees every size it can afford. One round of every candidate is predicted with
        # each one's latest measured/model ratio: every rank computes the same from the same
        # numbers, so all time the same sizes, as often. Fewer repetitions where the share is
        # tight; none below 3, where the minimum means little (and larger sizes cost more).
        allowance = (CALIBRATION_BUDGET - spent) / (len(sizes) - index)
        per_round = sum(model[name] * (measured[name][-1][1] if measured[name] else 1)
                        for name in timed)
        wanted = 40 if nbytes < (1 << 20) else 5
        repeats = min(wanted, int(allowance / max(per_round, 1e-9)))
        if repeats < 3:
            break
        samples = _time_candidates(nbytes, timed, repeats, allowance)
        # Wall-clock, barriers included, on the slowest rank's clock: the same on every rank.
        spent = float(_max_over_ranks([time.perf_counter() - started])[0])
        for j, name in enumerate(timed):
            # The minimum: on a shared machine noise only adds time.
            ratio = max(float(samples[j].min()), 1e-9) / max(model[name], 1e-12)
            measured[name].append((nbytes, ratio))
        progress.tick()
    progress.done()
    return measured


def _time_candidates(nbytes: int, algorithms: tuple[str, ...], repeats: int,
                     allowance: float = math.inf) -> np.ndarray:
    """Seconds (the slowest rank's, per run) of each algorithm on float32 zeros, one row per
    algorithm and one column per round: the same numbers on every rank. Stops after the round
    that passes ``allowance`` seconds (the slowest rank's clock decides, so all stop together),
    but not before 3 rounds."""
    buf = np.zeros(max(1, nbytes // 4), dtype=np.float32)
    samples = np.zeros((len(algorithms), repeats))
    started = time.perf_counter()
    rounds = 0
    while rounds < repeats:
        for j, name in enumerate(algorithms):  # interleaved, so noise hits all alike
            _core.barrier()
            start = time.perf_counter()
            _core.allreduce(buf, "float32", "sum", name)
            samples[j, rounds] = time.perf_counter() - start
        rounds += 1
        if rounds >= 3 and math.isfinite(allowance) and \
                _max_over_ranks([time.perf_counter() - started])[0] > allowance:
            break
    return _max_over_ranks(samples[:, :rounds])


def _pair_seconds(tier: str, nbytes: int, repeats: int, distances: tuple[int, ...] = (1,)
                  ) -> float:
    """The slowest pair's median exchange of ``nbytes`` on ``tier``; for the "pairs" tiers,
    summed over the pairings of nodes at ``distances``, as halving-doubling's steps follow one
    another (a sum also evens out the noise of one pairing). Collective."""
    times = [_core.measure_sendrecv(nbytes, repeats, tier, d) for d in distances]
    return float(_max_over_ranks(times).sum())


def _pairings(nodes: int) -> tuple[int, ...]:
    """The distances at which nodes pair up as halving-doubling's steps do (node n with node
    n XOR d, d a power of two below the number of nodes)."""
    return tuple(1 << k for k in range(max(nodes - 1, 1).bit_length()))


def _max_over_ranks(values: Any) -> np.ndarray:
    """The element-wise maximum over ringlet's ranks of float64 ``values``. Collective."""
    result = np.array(values, dtype=np.float64, order="C", copy=True)
    _core.allreduce(result, "float64", "max", "ring")
    return result


def _broadcast_text(text: str) -> str:
    """Rank 0's ``text`` on every rank (the others pass anything). Collective."""
    mine = _core.group().rank == 0
    data = text.encode() if mine else b""
    length = np.array([len(data)], dtype=np.int64)
    _core.broadcast(length, "int64", 0, "binomial")
    payload = np.zeros(int(length[0]), dtype=np.uint8)
    if mine:
        payload[:] = np.frombuffer(data, dtype=np.uint8)
    if payload.size:
        _core.broadcast(payload, "uint8", 0, "binomial")
    return payload.tobytes().decode()


class _Progress:
    """One line on rank 0 once calibration has taken more than a second, and one at the end."""

    def __init__(self, what: str) -> None:
        self.started = time.perf_counter()
        self.what = what
        self.shown = _core.group().rank != 0  # only rank 0 speaks

    def elapsed(self) -> float:
        return time.perf_counter() - self.started

    def tick(self) -> None:
        if not self.shown and self.elapsed() > 1.0:
            self.shown = True
            print(f"ringlet: calibrating the allreduce model for {self.what} (once; cached in "
                  f"{cache_dir()}) ...", file=sys.stderr, flush=True)

    def done(self) -> None:
        if self.shown and _core.group().rank == 0:
            print(f"ringlet: calibrated in {self.elapsed():.1f} s", file=sys.stderr, flush=True)
