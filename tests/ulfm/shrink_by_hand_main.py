"""ULFM without elastic.run: world rank 1 is killed; the survivors' next allreduce raises
ProcessFailedError, they shrink MPI_COMM_WORLD themselves (mpi4py), hand the result to
ringlet.init, and the allreduces after it are exact over the ranks left. Each survivor
prints one JSON line: its world rank, the error, how long the failed call took, and the
results after recovery, and what using a process set of the old communicator does."""

from __future__ import annotations

import json
import os
import signal
import time

import numpy as np
from mpi4py import MPI

import ringlet

world = MPI.COMM_WORLD
world.Set_errhandler(MPI.ERRORS_RETURN)
me = world.Get_rank()
ringlet.init()
pair = ringlet.add_process_set([0, 2])
before = ringlet.allreduce(np.full(1000, me + 1.0))
world.Barrier()
if me == 1:
    os.kill(os.getpid(), signal.SIGKILL)
started = time.monotonic()
try:
    ringlet.allreduce(np.full(1000, me + 1.0))
except ringlet.ProcessFailedError as error:
    failed = {"error": str(error), "seconds": time.monotonic() - started}
else:
    failed = {"error": None, "seconds": time.monotonic() - started}
survivors = world.Shrink()
ringlet.init(comm=survivors)
after = [float(ringlet.allreduce(np.full(1000, me + 1.0))[0]) for _ in range(3)]
try:  # a process set of the old communicator is gone with it
    ringlet.allreduce(np.ones(4), process_set=pair)
    old_set = "no error"
except (ValueError, ringlet.RingletError) as error:
    old_set = f"{type(error).__name__}: {error}"
print(json.dumps({"world_rank": me, "before": float(before[0]), "size": ringlet.size(),
                  "after": after, "old_set": old_set, **failed}), flush=True)
