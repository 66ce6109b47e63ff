"""ULFM without elastic.run: world rank 1 is killed; the survivors' next allreduce raises
ProcessFailedError, they shrink MPI_COMM_WORLD themselves (mpi4py), hand the result to
ringlet.init, and the allreduces after it are exact over the ranks left. Each survivor
prints one JSON line: its world rank, the error, how long the failed call took, and the
results after recovery."""

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
print(json.dumps({"world_rank": me, "before": float(before[0]), "size": ringlet.size(),
                  "after": after, **failed}), flush=True)
