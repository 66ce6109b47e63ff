"""What a training step spends its time on, as ``DistributedOptimizer`` sees it.

``RINGLET_TIMELINE=1`` prints a per-step summary on rank 0 when the script ends;
``RINGLET_TIMELINE=trace.json`` also writes each rank's events as a Chrome trace
(``trace.json`` on one rank, ``trace.<rank>.json`` on several; open it in chrome://tracing or
https://ui.perfetto.dev), like Horovod's timeline. ``optimizer.timeline`` is the same record
from code: ``optimizer.timeline.summary()``.

A step runs from the end of one ``step()`` to the end of the next:
- compute: until ``synchronize()`` starts (forward, backward, and the user's own code);
- exposed: ``synchronize()``, the communication backward did not hide;
- update: the wrapped optimizer's ``step()``;
- collectives: how long the buckets' allreduces ran in ringlet's comm thread, of which
  ``overlapped`` ran before ``synchronize()`` started;
- pack: copies into and out of packed fusion buffers (``ringlet.stats()["pack"]``).
"""

from __future__ import annotations

import atexit
import json
import os
import statistics
import sys
import time
from dataclasses import dataclass, field
from typing import Any

import ringlet

__all__ = ["COLUMNS", "Step", "Timeline"]

COLUMNS = ("step", "compute", "exposed", "update", "collectives", "overlapped", "pack")


@dataclass
class Step:
    start: float
    buckets: list[tuple[int, int, float, Any]] = field(default_factory=list)
    sync: tuple[float, float] | None = None
    update: tuple[float, float] | None = None
    pack_seconds: float = 0.0


class Timeline:
    """The steps of one optimizer, in ``time.perf_counter()`` seconds."""

    def __init__(self, trace_path: str | None = None) -> None:
        self.trace_path = trace_path
        self.rank, self.size = ringlet.rank(), ringlet.size()
        self.steps: list[dict[str, float]] = []
        self.events: list[dict[str, Any]] = []
        self._origin = time.perf_counter()
        self._step = Step(self._origin)
        self._pack_before = _pack_seconds()

    @classmethod
    def from_environment(cls) -> Timeline | None:
        """A timeline if RINGLET_TIMELINE asks for one, reported when the script ends."""
        setting = os.environ.get("RINGLET_TIMELINE", "").strip()
        if setting in ("", "0"):
            return None
        timeline = cls(None if setting == "1" else setting)
        atexit.register(timeline.report)
        return timeline

    def launched(self, bucket: int, nbytes: int, submitted: float, handle: Any) -> None:
        """Bucket ``bucket`` of ``nbytes`` was submitted at ``submitted`` (taken just before
        the call: on a core shared with the comm thread, the call may return late)."""
        self._step.buckets.append((bucket, nbytes, submitted, handle))

    def synchronized(self, started: float) -> None:
        self._step.sync = (started, time.perf_counter())

    def updated(self, started: float) -> None:
        """The end of a step: record it and start the next."""
        end = time.perf_counter()
        step, self._step = self._step, Step(end)
        step.update = (started, end)
        pack = _pack_seconds()
        step.pack_seconds, self._pack_before = pack - self._pack_before, pack
        self._record(step, end)

    def _record(self, step: Step, end: float) -> None:
        sync_start, sync_end = step.sync or (step.update[0] if step.update else end,) * 2
        ran = overlapped = 0.0
        for bucket, nbytes, submitted, handle in step.buckets:
            timing = handle.timing()
            if timing is None:
                continue
            start = submitted + timing[0]
            finish = start + timing[1]
            ran += timing[1]
            overlapped += min(max(0.0, min(finish, sync_start) - start), timing[1])
            self._event(f"allreduce bucket {bucket} ({nbytes} B)", "ringlet-comm", start, finish)
        self._event("compute", "python", step.start, sync_start)
        self._event("synchronize", "python", sync_start, sync_end)
        if step.update:
            self._event("update", "python", *step.update)
        self.steps.append({
            "step": end - step.start,
            "compute": sync_start - step.start,
            "exposed": sync_end - sync_start,
            "update": step.update[1] - step.update[0] if step.update else 0.0,
            "collectives": ran,
            "overlapped": overlapped,
            "pack": step.pack_seconds,
        })

    def _event(self, name: str, thread: str, start: float, end: float) -> None:
        if self.trace_path is None:
            return
        self.events.append({
            "name": name, "ph": "X", "pid": self.rank, "tid": thread,
            "ts": (start - self._origin) * 1e6, "dur": max(end - start, 0.0) * 1e6,
        })

    def summary(self, skip: int = 1) -> dict[str, float]:
        """Median seconds per step of each column, leaving out the first ``skip`` steps
        (warm-up); empty before any step."""
        steps = self.steps[skip:] or self.steps
        if not steps:
            return {}
        return {column: statistics.median(s[column] for s in steps) for column in COLUMNS}

    def table(self) -> str:
        medians = self.summary()
        if not medians:
            return "ringlet timeline: no optimizer step was taken"
        header = "| " + " | ".join(COLUMNS) + " |"
        cells = "| " + " | ".join(f"{medians[c] * 1e3:.2f} ms" for c in COLUMNS) + " |"
        return (f"ringlet timeline, rank {self.rank}: median of {len(self.steps)} steps\n"
                f"{header}\n|{'---|' * len(COLUMNS)}\n{cells}")

    def write_trace(self) -> str | None:
        """Write the Chrome trace; returns its path (None if no path was asked for)."""
        if self.trace_path is None:
            return None
        path = self.trace_path
        if self.size > 1:
            root, ext = os.path.splitext(path)
            path = f"{root}.{self.rank}{ext or '.json'}"
        names = [{"name": "thread_name", "ph": "M", "pid": self.rank, "tid": t,
                  "args": {"name": t}} for t in ("python", "ringlet-comm")]
        with open(path, "w") as f:
            json.dump({"traceEvents": names + self.events, "displayTimeUnit": "ms"}, f)
        return path

    def report(self) -> None:
        path = self.write_trace()
        if self.rank == 0:
            print(self.table(), file=sys.stderr)
            if path is not None:
                print(f"ringlet timeline: Chrome trace in {path} (one file per rank)",
                      file=sys.stderr)


def _pack_seconds() -> float:
    return ringlet.stats().get("pack", {}).get("seconds", 0.0)
