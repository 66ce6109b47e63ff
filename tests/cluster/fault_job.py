"""One rank of a fault test (tests/cluster/test_faults.py): exact allreduces in a
loop, until the test's fault ends the job or the loop's time is up.

    fault_job.py LOG_DIR SECONDS [ELEMENTS [ITERATIONS]]

Each rank writes everything it prints to LOG_DIR/rank<N>.log itself: a rank on a host whose
link is cut cannot send its output to mpirun. It starts with the rank's pid and host, says
"ready" after the first allreduce, and every result is checked against NumPy. With ITERATIONS
it makes exactly that many allreduces (and nothing else) instead of running for SECONDS."""

import os
import socket
import sys
import time

log_dir, seconds = sys.argv[1], float(sys.argv[2])
elements = int(sys.argv[3]) if len(sys.argv) > 3 else 1 << 18
iterations = int(sys.argv[4]) if len(sys.argv) > 4 else None
rank = int(os.environ["OMPI_COMM_WORLD_RANK"])
log = os.open(os.path.join(log_dir, f"rank{rank}.log"), os.O_WRONLY | os.O_CREAT | os.O_APPEND)
os.dup2(log, 1)
os.dup2(log, 2)  # the core's stall messages go to fd 2
sys.stdout.reconfigure(line_buffering=True)
sys.stderr.reconfigure(line_buffering=True)
print(f"rank {rank} pid {os.getpid()} host {socket.gethostname()}")

import warnings  # noqa: E402

warnings.simplefilter("always", RuntimeWarning)  # every warning counts, not one per place

import numpy as np  # noqa: E402  (after the redirection: import errors land in the log)

import ringlet  # noqa: E402

size = ringlet.size()
started = time.monotonic()
iteration = 0
while True:
    # Small integers in float32: every sum is exact, whatever the order of additions.
    x = np.arange(elements, dtype=np.float32) % 97 + rank + iteration % 5
    expected = (np.arange(elements, dtype=np.float32) % 97 + iteration % 5) * size \
        + size * (size - 1) // 2
    result = ringlet.allreduce(x)
    if not np.array_equal(result, expected):
        print(f"WRONG result in allreduce {iteration}")
        sys.exit(3)
    if iteration == 0:
        print("ready")
    iteration += 1
    if iteration % 100 == 0:
        print(f"{iteration} allreduces exact at {time.monotonic() - started:.1f} s")
    if iterations is not None:
        if iteration == iterations:
            break
        continue
    # Every rank stops after the same call: the slowest clock decides. Not `auto`, which may
    # pick MPI's own allreduce for 4 bytes: a rank waiting inside MPI_Allreduce is not watched
    # by the stall inspector, and a cut during this call then left rank 0 without its summary.
    late = np.array([time.monotonic() - started > seconds], dtype=np.int32)
    if ringlet.allreduce(late, op="max", algorithm="recursive_doubling")[0]:
        break
print(f"done: {iteration} allreduces exact")
ringlet.barrier()
