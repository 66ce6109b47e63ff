"""Allreduce inside ``jax.jit``: ringlet.jax against mpi4jax and ``jax.lax.psum``, in one run.

    mpirun -n 2 python benchmarks/jax_bench.py [--sizes 8,64,512,4K,32K,256K,1M,4M,16M,64M]
        [--candidates ringlet,mpi4jax,psum] [--time-budget 5] [--min-rounds 10]
        [--max-rounds 200] [--train-rounds 20] [--train-steps 10] [--no-train]
        [--markdown] [--json FILE]

Candidates, each a jitted function of a float32 vector (``make bench-jax``; RESULTS.md):
- ``ringlet``: ``ringlet.jax.allreduce(x, op="sum")`` (its XLA FFI custom call), consistency
  check as the environment sets it (on unless ``RINGLET_CHECK=0``; the header says which);
- ``mpi4jax``: ``mpi4jax.allreduce(x, op=MPI.SUM)``, built from PyPI against the same MPI
  (mpi4py's; it refuses another at import);
- ``psum``: ``jax.lax.psum`` in ``shard_map`` over the processes' devices, after
  ``jax.distributed.initialize`` (coordinator on rank 0, a free port; process id and count
  from MPI) with JAX's CPU collectives (gloo over TCP, JAX's default; ``--psum-collectives
  mpi`` needs MPItrampoline's ``MPITRAMPOLINE_LIB``).
A candidate whose import or set-up fails on any rank is skipped on every rank, the reason
printed. Beside them, ``none``: ``x + 1`` in ``jax.jit``, the floor of a jitted call that
communicates nothing. (ringlet and mpi4jax carry an ordered effect, which keeps JAX off its
C++ dispatch fast path: their calls pay JAX's Python dispatch, hundreds of µs on a busy
machine, which ``none`` does not.)

Allreduce: per size, two untimed calls of each candidate (compilation, first touch), then
rounds of one call of each, in a random order per round (the same on every rank), until
``--time-budget`` seconds are spent (clamped to [--min-rounds, --max-rounds]). A barrier
precedes every call, outside the timed region; a call is timed with ``time.perf_counter`` up
to ``block_until_ready()`` on its result, and its time is the slowest rank's. The table shows
the median over the rounds and ringlet's median over mpi4jax's (the issue's target: at most
1.1 below 16 MiB, at most 0.7 from 16 MiB). Every candidate's result is checked (the vector
holds ones, the sum the rank count).

Training step: an MLP (64-128-10, ReLU, softmax cross-entropy) on scikit-learn's digits, 64
samples per rank and step, optax adam; ``step(params, state, x, y)`` is one ``jax.jit`` with
the gradient averaged over the ranks by ``ringlet.jax.tree_allreduce(grads, op="avg")``, by
``mpi4jax.allreduce`` per array divided by the rank count, by JAX itself (the psum path: the
step in ``shard_map``, the loss a ``pmean``, so that autodiff sums the replicated parameters'
gradient), or not at all (``none``, the floor). Each path trains its own copy from the same
initial parameters on the same batches: two untimed steps (compilation), then rounds of
``--train-steps`` steps of each path, the order rotating, each step timed as above. Checked
(exit 1 if not): the first step's averaged gradient (adam's first moment over 1 - b1) equals
the mean over the ranks of the ``none`` path's, on every path, and every rank ends with the
same parameters. The paths' parameters after training differ by rounding only, which adam
amplifies where a gradient is near zero: the JSON reports the difference.

XLA runs single-threaded per rank (``XLA_FLAGS`` unless already set), as the ranks share the
cores. Rank 0 prints the tables (Markdown with --markdown) and writes --json.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import socket
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

os.environ.setdefault(
    "XLA_FLAGS", "--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1"
)
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax
import jax.numpy as jnp
import numpy as np
from bench_report import parse_size  # benchmarks/bench_report.py, next to this script
from mpi4py import MPI  # before ringlet and jax: mpi4py initializes MPI

CANDIDATES = ("ringlet", "mpi4jax", "psum")
DEFAULT_SIZES = "8,64,512,4K,32K,256K,1M,4M,16M,64M"
LARGE = 16 << 20
"""From this size the issue's target for ringlet over mpi4jax is 0.7, below it 1.1."""
TARGETS = {"small": 1.1, "large": 0.7}
SHUFFLE_SEED = 20260226
WARMUP_CALLS = 2
BATCH = 64
HIDDEN = 128
LEARNING_RATE = 1e-3
GRADIENT_RTOL, GRADIENT_ATOL = 1e-4, 1e-6
"""Averaged gradients against the mean of the ranks': |got - mean| <= RTOL (|mean| + ATOL)."""


# ---------------------------------------------------------------------------------------------
# Command line


def float32_size(text: str) -> int:
    """A size (see ``bench_report.parse_size``) that is a whole number of float32."""
    size = parse_size(text)
    if size < 4 or size % 4:
        raise argparse.ArgumentTypeError(f"not a whole number of float32: {text!r}")
    return size


def size_label(nbytes: int) -> str:
    for suffix, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if nbytes >= scale and nbytes % scale == 0:
            return f"{nbytes // scale} {suffix}"
    return f"{nbytes} B"


class RootParser(argparse.ArgumentParser):
    """Help and errors on rank 0 only (every rank still exits)."""

    def _print_message(self, message: str, file=None) -> None:
        if MPI.COMM_WORLD.Get_rank() == 0:
            super()._print_message(message, file)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = RootParser(description=__doc__.splitlines()[0],
                        formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    add = parser.add_argument
    add("--sizes", default=DEFAULT_SIZES, help="comma-separated message sizes in bytes")
    add("--candidates", default=",".join(CANDIDATES), help="comma-separated subset")
    add("--time-budget", type=float, default=5.0, help="seconds of timed rounds per size")
    add("--min-rounds", type=int, default=10)
    add("--max-rounds", type=int, default=200)
    add("--train-rounds", type=int, default=20, help="rounds of the training-step comparison")
    add("--train-steps", type=int, default=10, help="timed steps per path and round")
    add("--no-train", action="store_true", help="skip the training-step comparison")
    add("--psum-collectives", choices=("gloo", "mpi"), default="gloo",
        help="jax_cpu_collectives_implementation for the psum path")
    add("--input", choices=("argument", "computed"), default="argument",
        help="allreduce the jitted function's argument x, or x + 1 computed in it (as gradients "
             "are computed in a training step: ringlet then reduces in XLA's buffer, no copy)")
    add("--markdown", action="store_true", help="print Markdown tables")
    add("--json", metavar="FILE", help="write the results as JSON (rank 0)")
    args = parser.parse_args(argv)
    try:
        args.sizes = [float32_size(s) for s in args.sizes.split(",") if s]
    except argparse.ArgumentTypeError as error:
        parser.error(f"--sizes: {error}")
    args.candidates = [c.strip() for c in args.candidates.split(",") if c.strip()]
    unknown = set(args.candidates) - set(CANDIDATES)
    if unknown:
        parser.error(f"unknown candidates {sorted(unknown)}; choose from {list(CANDIDATES)}")
    return args


# ---------------------------------------------------------------------------------------------
# Candidates: each import or set-up may fail, on any rank; then every rank skips it.


@dataclass
class Backends:
    rank: int
    size: int
    local_device: Any = None
    rj: Any = None  # ringlet.jax
    mpi4jax: Any = None
    mesh: Any = None  # psum: a Mesh over every process's device, axis "i"
    input: str = "argument"  # what the allreduce reduces (--input)
    skipped: dict[str, str] = field(default_factory=dict)

    @property
    def available(self) -> list[str]:
        return [name for name in CANDIDATES
                if name not in self.skipped and getattr(self, self.attr(name)) is not None]

    @staticmethod
    def attr(name: str) -> str:
        return {"ringlet": "rj", "mpi4jax": "mpi4jax", "psum": "mesh"}[name]


def agree(comm: MPI.Comm, error: str | None) -> str | None:
    """None if no rank failed, else the first failing rank's reason (the same on every rank)."""
    errors = comm.allgather(error)
    for rank, message in enumerate(errors):
        if message is not None:
            return f"rank {rank}: {message}"
    return None


def describe(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}".strip().splitlines()[0][:300]


def set_up(comm: MPI.Comm, args) -> Backends:
    """Import the requested candidates and start jax.distributed for psum, in that order:
    jax.distributed must start before JAX computes anything."""
    backends = Backends(comm.Get_rank(), comm.Get_size(), input=args.input)
    for name in CANDIDATES:
        if name not in args.candidates:
            backends.skipped[name] = "not requested (--candidates)"
    if "ringlet" in args.candidates:
        error = None
        try:
            import ringlet.jax as rj
            backends.rj = rj
        except Exception as exc:
            error = describe(exc)
        if (reason := agree(comm, error)) is not None:
            backends.rj, backends.skipped["ringlet"] = None, f"import ringlet.jax failed ({reason})"
    if "mpi4jax" in args.candidates:
        error = None
        try:
            import mpi4jax
            backends.mpi4jax = mpi4jax
        except Exception as exc:
            error = describe(exc)
        if (reason := agree(comm, error)) is not None:
            backends.mpi4jax, backends.skipped["mpi4jax"] = None, (
                f"import mpi4jax failed ({reason}); `make bench-jax` builds it against "
                f"this MPI"
            )
    if "psum" in args.candidates:
        error = None
        try:
            backends.mesh = start_distributed(comm, args.psum_collectives)
        except Exception as exc:
            error = describe(exc)
        if (reason := agree(comm, error)) is not None:
            backends.mesh, backends.skipped["psum"] = None, (
                f"jax.distributed with {args.psum_collectives} collectives failed ({reason})"
            )
    backends.local_device = jax.local_devices()[0]
    return backends


def start_distributed(comm: MPI.Comm, collectives: str):
    """jax.distributed over the MPI job: rank 0 hosts the coordinator on a free port."""
    from jax.sharding import Mesh

    if collectives == "mpi" and not os.environ.get("MPITRAMPOLINE_LIB"):
        # jaxlib's MPI collectives load MPI through MPItrampoline, which exits the process
        # without it.
        raise RuntimeError("MPITRAMPOLINE_LIB is not set (MPItrampoline's MPIwrapper library)")
    jax.config.update("jax_cpu_collectives_implementation", collectives)
    hosts = comm.allgather(socket.gethostname())
    address = None
    if comm.Get_rank() == 0:
        host = "127.0.0.1" if len(set(hosts)) == 1 else socket.gethostname()
        with socket.socket() as probe:
            probe.bind(("", 0))
            address = f"{host}:{probe.getsockname()[1]}"
    address = comm.bcast(address)
    jax.distributed.initialize(coordinator_address=address, num_processes=comm.Get_size(),
                               process_id=comm.Get_rank(), initialization_timeout=60)
    devices = jax.devices()
    if len(devices) != comm.Get_size():
        raise RuntimeError(f"{len(devices)} global devices for {comm.Get_size()} processes "
                           f"(one CPU device per process expected)")
    mesh = Mesh(np.array(devices), ("i",))
    # One collective now, so that a broken transport fails here, not inside the timing.
    check = shard_psum(mesh)(global_vector(mesh, np.ones(2, np.float32)))
    if not np.all(np.asarray(check.addressable_shards[0].data) == comm.Get_size()):
        raise RuntimeError("psum returned a wrong sum")
    return mesh


def global_vector(mesh, local: np.ndarray):
    """The global array whose shard on this process's device is ``local`` (axis "i")."""
    from jax.sharding import NamedSharding, PartitionSpec

    sharding = NamedSharding(mesh, PartitionSpec("i"))
    piece = jax.device_put(local, jax.local_devices()[0])
    return jax.make_array_from_single_device_arrays(
        (local.shape[0] * mesh.size, *local.shape[1:]), sharding, [piece])


def global_replicated(mesh, tree):
    """Global arrays replicated on every process (each passes the same values)."""
    from jax.sharding import NamedSharding, PartitionSpec

    sharding = NamedSharding(mesh, PartitionSpec())
    device = jax.local_devices()[0]
    return jax.tree.map(
        lambda leaf: jax.make_array_from_single_device_arrays(
            np.shape(leaf), sharding, [jax.device_put(leaf, device)]),
        tree)


def shard_psum(mesh) -> Callable:
    from jax.sharding import PartitionSpec as P

    return jax.jit(jax.shard_map(lambda a: jax.lax.psum(a, "i"), mesh=mesh,
                                 in_specs=P("i"), out_specs=P("i")))


# ---------------------------------------------------------------------------------------------
# Timing


def round_orders(rounds: int, k: int, seed: int) -> list[list[int]]:
    """A fresh random order of the k candidates for every round, the same on every rank."""
    rng = np.random.default_rng(seed)
    return [rng.permutation(k).tolist() for _ in range(rounds)]


def timed(comm: MPI.Comm, run: Callable[[], Any]) -> float:
    comm.Barrier()
    start = time.perf_counter()
    jax.block_until_ready(run())
    return time.perf_counter() - start


def slowest(comm: MPI.Comm, seconds: np.ndarray) -> np.ndarray:
    comm.Allreduce(MPI.IN_PLACE, seconds, op=MPI.MAX)
    return seconds


def clamp(value: float, low: int, high: int) -> int:
    return int(min(max(value, low), high))


# ---------------------------------------------------------------------------------------------
# Allreduce


def allreduce_runs(backends: Backends, nbytes: int) -> dict[str, tuple[Callable, Callable]]:
    """Per candidate: a call to time and a function of its result that checks it (local)."""
    count = nbytes // 4
    size = backends.size
    local = jax.device_put(np.ones(count, np.float32), backends.local_device)
    runs: dict[str, tuple[Callable, Callable]] = {}

    def ok(result) -> bool:
        return bool(np.all(np.asarray(result) == size))

    floor_fn = jax.jit(lambda x: x + 1)
    runs["none"] = (lambda: floor_fn(local), lambda result: bool(np.all(np.asarray(result) == 2)))

    # The value reduced: the argument (XLA keeps it, so ringlet, which reduces in place in a
    # buffer aliased to its input, first gets a copy), or x + 1 computed in the function.
    computed = backends.input == "computed"
    value = (lambda x: x + 1) if computed else (lambda x: x)
    if computed:
        def ok(result) -> bool:
            return bool(np.all(np.asarray(result) == 2 * size))

    if "ringlet" in backends.available:
        rj = backends.rj
        ringlet_fn = jax.jit(lambda x: rj.allreduce(value(x), op="sum"))
        runs["ringlet"] = (lambda: ringlet_fn(local), ok)
    if "mpi4jax" in backends.available:
        m4j = backends.mpi4jax
        mpi4jax_fn = jax.jit(lambda x: m4j.allreduce(value(x), op=MPI.SUM))
        runs["mpi4jax"] = (lambda: mpi4jax_fn(local), ok)
    if "psum" in backends.available and not computed:
        psum_fn = shard_psum(backends.mesh)
        global_x = global_vector(backends.mesh, np.ones(count, np.float32))
        runs["psum"] = (lambda: psum_fn(global_x),
                        lambda result: ok(result.addressable_shards[0].data))
    return runs


def time_allreduce(comm: MPI.Comm, backends: Backends, nbytes: int, args) -> dict[str, Any]:
    runs = allreduce_runs(backends, nbytes)
    names = list(runs)
    correct = True
    started = time.perf_counter()
    for name in names:  # compilation and first touch, outside the budget
        for _ in range(WARMUP_CALLS):
            correct &= runs[name][1](runs[name][0]())
    warm = comm.allreduce(time.perf_counter() - started, op=MPI.MAX)
    # One timed round to size the rest.
    probe = time.perf_counter()
    for name in names:
        timed(comm, runs[name][0])
    per_round = comm.allreduce(time.perf_counter() - probe, op=MPI.MAX)
    rounds = clamp(args.time_budget / max(per_round, 1e-9), args.min_rounds, args.max_rounds)
    seconds = np.empty((rounds, len(names)))
    for r, order in enumerate(round_orders(rounds, len(names), SHUFFLE_SEED + nbytes)):
        for index in order:
            seconds[r, index] = timed(comm, runs[names[index]][0])
    seconds = slowest(comm, seconds)
    for name in names:  # the results after the timing, too
        correct &= runs[name][1](runs[name][0]())
    correct = comm.allreduce(correct, op=MPI.LAND)
    row: dict[str, Any] = {
        "bytes": nbytes,
        "rounds": rounds,
        "warmup_s": warm,
        "correct": correct,
        "median_us": {n: float(np.median(seconds[:, i])) * 1e6 for i, n in enumerate(names)},
        "min_us": {n: float(seconds[:, i].min()) * 1e6 for i, n in enumerate(names)},
    }
    if "ringlet" in runs and "mpi4jax" in runs:
        ratios = seconds[:, names.index("ringlet")] / seconds[:, names.index("mpi4jax")]
        row["ringlet_over_mpi4jax"] = row["median_us"]["ringlet"] / row["median_us"]["mpi4jax"]
        row["ringlet_over_mpi4jax_paired"] = float(np.median(ratios))
        row["target"] = TARGETS["large" if nbytes >= LARGE else "small"]
    return row


# ---------------------------------------------------------------------------------------------
# Training step


def digits_batches(rank: int, size: int, steps: int) -> list[tuple[np.ndarray, np.ndarray]]:
    """``steps`` batches of BATCH samples for this rank: every rank a disjoint slice."""
    from sklearn.datasets import load_digits

    data = load_digits()
    x = (data.data / 16.0).astype(np.float32)
    y = data.target.astype(np.int32)
    order = np.random.default_rng(0).permutation(len(x))
    x, y = x[order], y[order]
    per_step = BATCH * size
    batches = []
    for step in range(steps):
        start = (step * per_step) % (len(x) - per_step) + rank * BATCH
        batches.append((x[start:start + BATCH], y[start:start + BATCH]))
    return batches


def init_params(features: int, classes: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(1)
    return {
        "w1": (rng.standard_normal((features, HIDDEN)) / np.sqrt(features)).astype(np.float32),
        "b1": np.zeros(HIDDEN, np.float32),
        "w2": (rng.standard_normal((HIDDEN, classes)) / np.sqrt(HIDDEN)).astype(np.float32),
        "b2": np.zeros(classes, np.float32),
    }


def loss_fn(params, x, y):
    hidden = jax.nn.relu(x @ params["w1"] + params["b1"])
    logits = hidden @ params["w2"] + params["b2"]
    return -jnp.mean(jnp.take_along_axis(jax.nn.log_softmax(logits), y[:, None], axis=1))


def make_steps(backends: Backends, optimizer) -> dict[str, Callable]:
    """Per path, the jitted step (params, state, x, y) -> (params, state, loss)."""
    size = backends.size

    def step_with(average: Callable, loss=loss_fn) -> Callable:
        def step(params, state, x, y):
            value, grads = jax.value_and_grad(loss)(params, x, y)
            grads = average(grads)
            updates, state = optimizer.update(grads, state, params)
            return jax.tree.map(jnp.add, params, updates), state, value

        return step

    steps: dict[str, Callable] = {"none": jax.jit(step_with(lambda g: g))}
    if "ringlet" in backends.available:
        rj = backends.rj
        steps["ringlet"] = jax.jit(step_with(lambda g: rj.tree_allreduce(g, op="avg")))
    if "mpi4jax" in backends.available:
        m4j = backends.mpi4jax
        steps["mpi4jax"] = jax.jit(step_with(
            lambda g: jax.tree.map(lambda a: m4j.allreduce(a, op=MPI.SUM) / size, g)))
    if "psum" in backends.available:
        from jax.sharding import PartitionSpec as P

        # The idiom of shard_map: the loss is the mean over the ranks; the gradient of the
        # parameters (replicated, P()) then comes out summed over "i" by autodiff itself (a
        # psum in the transpose), averaged by the pmean: a pmean of the gradient on top would
        # double it.
        def mean_loss(params, x, y):
            return jax.lax.pmean(loss_fn(params, x, y), "i")

        steps["psum"] = jax.jit(jax.shard_map(
            step_with(lambda g: g, loss=mean_loss), mesh=backends.mesh,
            in_specs=(P(), P(), P("i"), P("i")), out_specs=(P(), P(), P())))
    return steps


def local_value(array) -> np.ndarray:
    """This process's values of a local or a global (replicated) array."""
    if getattr(array, "is_fully_addressable", True):
        return np.asarray(array)
    return np.asarray(array.addressable_shards[0].data)


def time_training(comm: MPI.Comm, backends: Backends, args) -> dict[str, Any]:
    import optax

    optimizer = optax.adam(LEARNING_RATE)
    steps = make_steps(backends, optimizer)
    names = list(steps)
    total = args.train_rounds * args.train_steps + WARMUP_CALLS
    raw = digits_batches(backends.rank, backends.size, total)
    params0 = init_params(raw[0][0].shape[1], 10)
    device = backends.local_device
    local_batches = [(jax.device_put(x, device), jax.device_put(y, device)) for x, y in raw]
    state: dict[str, list] = {}
    batches: dict[str, list] = {}
    for name in names:
        if name == "psum":
            params = global_replicated(backends.mesh, params0)
            opt_state = optimizer.init(params)
            batches[name] = [(global_vector(backends.mesh, x), global_vector(backends.mesh, y))
                             for x, y in raw]
        else:
            params = jax.device_put(params0, device)
            opt_state = optimizer.init(params)
            batches[name] = local_batches
        state[name] = [params, opt_state]
    cursor = dict.fromkeys(names, 0)

    def run(name: str) -> Callable[[], Any]:
        def one_step():
            x, y = batches[name][cursor[name]]
            cursor[name] += 1
            params, opt_state, loss = steps[name](*state[name], x, y)
            state[name] = [params, opt_state]
            return loss

        return one_step

    calls = {name: run(name) for name in names}
    # What the step's communication is held against (issue 35: at most 2x): one allreduce of
    # the gradients' bytes, computed in the jitted function as a gradient is, over the floor
    # of that function without the allreduce; interleaved with the steps.
    parameters = sum(int(np.size(v)) for v in params0.values())
    flat = jax.device_put(np.ones(parameters, np.float32), device)
    one = {"floor": jax.jit(lambda x: x + 1)}
    if "ringlet" in backends.available:
        one["one allreduce"] = jax.jit(lambda x: backends.rj.allreduce(x + 1, op="avg"))
    for name, function in one.items():
        calls[name] = lambda function=function: function(flat)
        for _ in range(WARMUP_CALLS):
            jax.block_until_ready(calls[name]())
    timed_names = names + list(one)
    # The first step of every path starts from the same parameters and a fresh adam state on
    # the same batch, so the first moment it leaves is (1 - b1) times the gradient it applied:
    # the averaging paths' must equal the mean over the ranks of the none path's.
    first_moments = {}
    for name in names:
        jax.block_until_ready(calls[name]())
        first_moments[name] = {k: local_value(v) for k, v in state[name][1][0].mu.items()}
        for _ in range(WARMUP_CALLS - 1):
            jax.block_until_ready(calls[name]())
    averaged = [n for n in names if n != "none"]
    expected = {k: np.mean([m[k] for m in comm.allgather(first_moments["none"])], axis=0)
                for k in params0}
    gradient_errors = {n: max(float(np.max(np.abs(first_moments[n][k] - expected[k])
                                            / (np.abs(expected[k]) + GRADIENT_ATOL)))
                              for k in params0) for n in averaged}
    gradients_right = all(error <= GRADIENT_RTOL for error in gradient_errors.values())
    seconds = np.empty((args.train_rounds, len(timed_names), args.train_steps))
    for r in range(args.train_rounds):
        rotation = timed_names[r % len(timed_names):] + timed_names[:r % len(timed_names)]
        for name in rotation:
            for s in range(args.train_steps):
                seconds[r, timed_names.index(name), s] = timed(comm, calls[name])
    seconds = slowest(comm, seconds.reshape(args.train_rounds, -1)).reshape(seconds.shape)
    # After training the paths differ in rounding only, which adam amplifies where a gradient
    # is near zero: reported, not checked. Every rank must hold the same parameters.
    final = {name: {k: local_value(v) for k, v in state[name][0].items()} for name in names}
    differences = {n: max(float(np.max(np.abs(final[n][k] - final[averaged[0]][k])))
                          for k in params0) for n in averaged}
    gathered = comm.allgather({n: final[n] for n in averaged})
    equal_ranks = all(np.array_equal(g[n][k], final[n][k])
                      for g in gathered for n in averaged for k in params0)
    medians = {n: float(np.median(seconds[:, i, :])) * 1e6 for i, n in enumerate(timed_names)}
    one_us = {n: medians.pop(n) for n in one}
    communication = {n: medians[n] - medians["none"] for n in averaged}
    one_allreduce = one_us.get("one allreduce", float("nan")) - one_us["floor"]
    return {
        "model": f"MLP {raw[0][0].shape[1]}-{HIDDEN}-10, {parameters} parameters "
                 f"({parameters * 4} B of gradients in {len(params0)} arrays)",
        "batch_per_rank": BATCH,
        "rounds": args.train_rounds,
        "steps_per_round": args.train_steps,
        "median_us": medians,
        "communication_us": communication,
        "one_allreduce_us": one_allreduce,
        "one_allreduce_call_us": one_us,
        "communication_over_one_allreduce": {n: c / one_allreduce
                                             for n, c in communication.items()},
        "max_difference_from_" + (averaged[0] if averaged else "none"): differences,
        "gradient_errors": gradient_errors,
        "gradients_averaged_right": bool(comm.allreduce(gradients_right, op=MPI.LAND)),
        "equal_across_ranks": bool(comm.allreduce(equal_ranks, op=MPI.LAND)),
    }


# ---------------------------------------------------------------------------------------------
# Report


def table(header: list[str], rows: list[list[str]], markdown: bool) -> str:
    widths = [max(len(str(c)) for c in column) for column in zip(header, *rows)]
    if markdown:
        line = lambda cells: "| " + " | ".join(  # noqa: E731
            str(c).rjust(w) for c, w in zip(cells, widths)) + " |"
        rule = "|" + "|".join("-" * (w + 1) + ":" for w in widths) + "|"
        return "\n".join([line(header), rule, *map(line, rows)])
    line = lambda cells: "  ".join(str(c).rjust(w) for c, w in zip(cells, widths))  # noqa: E731
    return "\n".join([line(header), *map(line, rows)])


def fmt_us(value: float | None) -> str:
    if value is None:
        return "-"
    return f"{value:.1f}" if value < 1000 else f"{value:.0f}"


def allreduce_table(results: list[dict], names: list[str], markdown: bool) -> str:
    header = ["size", *[f"{n} µs" for n in names]]
    ratio = "ringlet" in names and "mpi4jax" in names
    if ratio:
        header += ["ringlet/mpi4jax", "target"]
    rows = []
    for row in results:
        cells = [size_label(row["bytes"]), *[fmt_us(row["median_us"].get(n)) for n in names]]
        if ratio:
            met = row["ringlet_over_mpi4jax"] <= row["target"]
            cells += [f"{row['ringlet_over_mpi4jax']:.2f}",
                      f"≤ {row['target']} {'met' if met else 'MISSED'}"]
        if not row["correct"]:
            cells[0] += " (WRONG RESULT)"
        rows.append(cells)
    return table(header, rows, markdown)


def training_table(train: dict, markdown: bool) -> str:
    header = ["path", "step µs (median)", "communication µs (step - none)",
              "communication / one allreduce"]
    ratios = train["communication_over_one_allreduce"]
    rows = [[n, fmt_us(us), fmt_us(train["communication_us"].get(n)) if n != "none" else "-",
             f"{ratios[n]:.2f}" if n in ratios else "-"]
            for n, us in train["median_us"].items()]
    return table(header, rows, markdown)


def metadata(comm: MPI.Comm, backends: Backends) -> dict[str, Any]:
    def version(module: Any, name: str) -> str | None:
        if module is None:
            return None
        try:
            from importlib.metadata import version as dist_version

            return dist_version(name)
        except Exception:
            return getattr(module, "__version__", None)

    return {
        "date": datetime.now().astimezone().isoformat(timespec="seconds"),
        "hostname": socket.gethostname(),
        "cpu": platform.processor() or platform.machine(),
        "cores": os.cpu_count(),
        "load_average": os.getloadavg()[0] if hasattr(os, "getloadavg") else None,
        "ranks": comm.Get_size(),
        "mpi_library": MPI.Get_library_version().strip("\x00 \n").splitlines()[0].strip(),
        "jax": jax.__version__,
        "ringlet": version(backends.rj, "ringlet"),
        "ringlet_check": os.environ.get("RINGLET_CHECK", "1") != "0",
        "mpi4jax": version(backends.mpi4jax, "mpi4jax"),
        "psum_collectives": jax.config.jax_cpu_collectives_implementation
        if backends.mesh is not None else None,
        "xla_flags": os.environ.get("XLA_FLAGS", ""),
        "skipped": backends.skipped,
    }


def report(meta: dict, results: list[dict], train: dict | None, names: list[str],
           args) -> None:
    print(f"# jax_bench: {meta['ranks']} ranks on {meta['hostname']} ({meta['cores']} cores, "
          f"load {meta['load_average']:.1f}), {meta['date']}")
    print(f"# {meta['mpi_library']}; jax {meta['jax']}; ringlet {meta['ringlet'] or '-'} "
          f"(check {'on' if meta['ringlet_check'] else 'OFF'}); mpi4jax {meta['mpi4jax'] or '-'};"
          f" psum over jax.distributed ({meta['psum_collectives'] or '-'})")
    for name, reason in meta["skipped"].items():
        print(f"# skipped {name}: {reason}")
    print()
    reduced = ("x + 1, computed in the jitted function" if args.input == "computed"
               else "the jitted function's argument x")
    print(f"Allreduce (sum, float32) of {reduced}, inside jax.jit, median µs per call (slowest "
          "rank); none: x + 1 inside jax.jit, no communication:")
    print()
    print(allreduce_table(results, names, args.markdown))
    if train is not None:
        print()
        print(f"Training step ({train['model']}, batch {train['batch_per_rank']} per rank, "
              f"adam), median µs per step:")
        print()
        print(training_table(train, args.markdown))
        calls = train["one_allreduce_call_us"]
        print()
        print(f"one allreduce: ringlet.jax's allreduce of the gradients' bytes computed in "
              f"jax.jit, {fmt_us(calls.get('one allreduce'))} µs, over the same function "
              f"without it, {fmt_us(calls['floor'])} µs: {fmt_us(train['one_allreduce_us'])} µs")
        print()
        print(f"first step's averaged gradient equal to the mean of the ranks' (every path): "
              f"{train['gradients_averaged_right']}; parameters equal across ranks: "
              f"{train['equal_across_ranks']}")


def progress(items: list[int], enabled: bool):
    try:
        from tqdm import tqdm
    except ImportError:
        return items
    return tqdm(items, desc="jax allreduce", unit="size", file=sys.stderr, disable=not enabled)


def main(argv: list[str] | None = None) -> int:
    comm = MPI.COMM_WORLD
    args = parse_args(argv)
    started = time.perf_counter()
    backends = set_up(comm, args)
    rank = comm.Get_rank()
    phases = {"set_up_s": time.perf_counter() - started}
    if rank == 0:
        for name, reason in backends.skipped.items():
            print(f"skipping {name}: {reason}", file=sys.stderr, flush=True)
    names = ["none", *backends.available]
    results = [time_allreduce(comm, backends, nbytes, args)
               for nbytes in progress(args.sizes, rank == 0)]
    phases["allreduce_s"] = time.perf_counter() - started - sum(phases.values())
    train = None
    if not args.no_train:
        try:
            import optax  # noqa: F401
            import sklearn  # noqa: F401
        except ImportError as exc:
            if rank == 0:
                print(f"skipping the training step: {describe(exc)}", file=sys.stderr)
        else:
            train = time_training(comm, backends, args)
            phases["training_s"] = time.perf_counter() - started - sum(phases.values())
    meta = metadata(comm, backends)
    meta["phases"] = phases
    if rank == 0:
        report(meta, results, train, names, args)
        if args.json:
            with open(args.json, "w") as f:
                json.dump({"meta": meta, "allreduce": results, "train": train}, f, indent=1)
            print(f"wrote {args.json}", file=sys.stderr)
        print(f"total {time.perf_counter() - started:.1f} s ("
              + ", ".join(f"{k.removesuffix('_s')} {v:.1f} s" for k, v in phases.items()) + ")",
              file=sys.stderr)
    failed = not all(r["correct"] for r in results) or (
        train is not None
        and not (train["gradients_averaged_right"] and train["equal_across_ranks"]))
    if backends.mesh is not None:
        jax.distributed.shutdown()
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
