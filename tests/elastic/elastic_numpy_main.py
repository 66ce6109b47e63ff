"""A training script for the restart mechanism on any MPI, with NumPy only (the MPICH and
Open MPI 5 venvs have no torch): ``ringlet.elastic.ObjectState`` holds int64 weights, and each
step adds the allreduced sum of every rank's (rank + 1) * (step + 1), so that the final weights
follow exactly from the steps kept and their world sizes (``replay``).

Per epoch rank 0 logs one JSON line (epoch, size, rendezvous, pid, the MPI library); at every
step it logs (epoch, batch, size) to LOG.steps; at the end every rank writes its weights to
LOG.weights.RANK. --kill "(epoch, batch)" --slot host[local_rank] SIGKILLs that slot there,
once (a marker file remembers it)."""

from __future__ import annotations

import argparse
import json
import os
import signal
import time
from pathlib import Path

import numpy as np

import ringlet
import ringlet.elastic

BATCHES_PER_EPOCH = 4


def replay(steps: list[tuple[int, int, int]]) -> list[int]:
    """The weights after ``steps`` ((epoch, batch, world size), in order)."""
    weights = np.zeros(4, dtype=np.int64)
    for epoch, batch, size in steps:
        step = epoch * BATCHES_PER_EPOCH + batch
        weights += (step + 1) * size * (size + 1) // 2
    return weights.tolist()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--logfile", required=True)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--kill", default="")
    parser.add_argument("--slot", default="")
    parser.add_argument("--epoch-wait", type=float, default=0.0)
    args = parser.parse_args()

    ringlet.init()
    slots = os.environ.get("RINGLET_ELASTIC_SLOTS", "").split(",")
    host, _, local = slots[ringlet.rank()].rpartition(":")
    slot = f"{host}[{local}]"
    state = ringlet.elastic.ObjectState(weights=np.zeros(4, dtype=np.int64), epoch=0, batch=0,
                                        rendezvous=0)

    @ringlet.elastic.run
    def train(state: ringlet.elastic.ObjectState) -> None:
        state.rendezvous += 1
        while state.epoch < args.epochs:
            while state.batch < BATCHES_PER_EPOCH:
                marker = Path(f"{args.logfile}.killed")
                if (str((state.epoch, state.batch)) == args.kill and slot == args.slot
                        and not marker.exists()):
                    marker.touch()
                    os.kill(os.getpid(), signal.SIGKILL)
                step = state.epoch * BATCHES_PER_EPOCH + state.batch
                mine = np.full(4, (ringlet.rank() + 1) * (step + 1), dtype=np.int64)
                state.weights = state.weights + ringlet.allreduce(mine)
                if ringlet.rank() == 0:
                    with open(args.logfile + ".steps", "a") as log:
                        log.write(json.dumps([state.epoch, state.batch, ringlet.size()]) + "\n")
                state.batch += 1
                state.commit()
            if ringlet.rank() == 0:
                with open(args.logfile, "a") as log:
                    log.write(json.dumps({"epoch": state.epoch, "size": ringlet.size(),
                                          "rendezvous": state.rendezvous, "pid": os.getpid(),
                                          "mpi": ringlet.mpi_library()}) + "\n")
            time.sleep(args.epoch_wait)
            state.epoch, state.batch = state.epoch + 1, 0
            state.commit()

    train(state)
    Path(f"{args.logfile}.weights.{ringlet.rank()}").write_text(
        json.dumps(state.weights.tolist()))


if __name__ == "__main__":
    main()
