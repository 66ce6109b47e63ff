"""Allreduces under ULFM while something fails, in elastic.run: every rank runs
``ringlet.allreduce(..., algorithm=A)`` on a large array (64 MiB by default), step after step.
World rank ``--victim`` is SIGKILLed by a timer while it is in the middle of step
``--kill-at`` (in the shared-memory tier: its segment half written); or the test cuts a host
off from outside. The survivors must raise, shrink, and go on with fresh segments: each step's
result is checked against the exact sum for the ranks that made it, and rank 0 logs one JSON
line per step (step, size, pid, whether the result was exact). Each survivor logs the
allreduce that raised (its step, and how long it had waited) to LOG.failed.WORLD_RANK."""

from __future__ import annotations

import argparse
import json
import os
import signal
import threading
import time

import numpy as np

import ringlet
import ringlet.elastic

parser = argparse.ArgumentParser()
parser.add_argument("--logfile", required=True)
parser.add_argument("--victim", type=int, default=-1, help="world rank to kill (-1: none)")
parser.add_argument("--steps", type=int, default=6)
parser.add_argument("--kill-at", type=int, default=2)
parser.add_argument("--algorithm", default="shm")
parser.add_argument("--megabytes", type=int, default=64,
                    help="per allreduce: 64 MiB lasts tens of milliseconds in shared memory")
args = parser.parse_args()

ELEMENTS = args.megabytes * 1024 * 1024 // 4
world_rank = int(os.environ["OMPI_COMM_WORLD_RANK"])
state = ringlet.elastic.ObjectState(step=0, recoveries=0)


def kill_soon() -> None:
    # Inside the next allreduce: it starts within a millisecond and lasts far longer.
    threading.Timer(0.005, os.kill, (os.getpid(), signal.SIGKILL)).start()


@ringlet.elastic.run
def train(state: ringlet.elastic.ObjectState) -> None:
    state.recoveries += 1
    while state.step < args.steps:
        # Each rank contributes its world rank + 1 (integers: the float32 sum is exact).
        data = np.full(ELEMENTS, world_rank + 1, dtype=np.float32)
        if state.step == args.kill_at and world_rank == args.victim:
            kill_soon()
        started = time.monotonic()
        try:
            data = ringlet.allreduce(data, algorithm=args.algorithm)
        except ringlet.ProcessFailedError as error:
            with open(f"{args.logfile}.failed.{world_rank}", "a") as log:
                log.write(json.dumps({"step": state.step, "seconds": time.monotonic() - started,
                                      "error": str(error)}) + "\n")
            raise
        members = ringlet.allgather_object(world_rank + 1)
        exact = bool((data == sum(members)).all())
        if ringlet.rank() == 0:
            with open(args.logfile, "a") as log:
                log.write(json.dumps({"step": state.step, "size": ringlet.size(),
                                      "pid": os.getpid(), "recoveries": state.recoveries,
                                      "exact": exact}) + "\n")
        state.step += 1
        state.commit()


train(state)
