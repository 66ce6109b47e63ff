"""ringlet.hvd.tensorflow and ringlet.hvd.keras against tf.distribute.MultiWorkerMirroredStrategy
(MWMS) at 2 ranks on one machine, and against one process with no communication.

    python benchmarks/tf_bench.py [--rounds 3] [--calls 10] [--steps 15] [--warmup 3]
        [--gradient-mib 36] [--widths 1024,2048,2048,1280,512,10] [--batch 32]
        [--mpirun mpirun] [--json FILE] [--markdown] [--profile]

The script is its own driver: it launches ``mpirun -n 2`` jobs of itself (``--job``), one per
variant, because a process configures TensorFlow's collective implementation once. A round runs
one job of each variant, the order rotating from round to round (ringlet, mwms-ring, mwms-auto;
then mwms-ring, mwms-auto, ringlet; ...); the round order is printed. Per variant the report
gives the median over every round's samples and the spread of the per-round medians; ratios are
of those medians, with the spread of the ratio within each round (jobs next to each other).

Variants (jobs):
- ``ringlet``: ``ringlet.hvd.tensorflow`` and ``ringlet.hvd.keras``; this job also times the
  no-communication step (below);
- ``mwms-ring``, ``mwms-auto``: ``tf.distribute.MultiWorkerMirroredStrategy`` with
  ``CommunicationOptions(implementation=RING)`` or ``AUTO``; each rank's ``TF_CONFIG`` is
  built from its MPI rank, the two ports picked free by rank 0 and shared through mpi4py, before
  the strategy is created.

Measured in every job:
1. The allreduce (average) of a set of 20 float32 tensors shaped like a convnet's and an MLP's
   gradients, 256 B to 16 MiB, 36 MiB in all (``--gradient-mib`` scales it). Candidates in the
   ringlet job: ``ringlet-graph`` (``hvd.grouped_allreduce(tensors, op=hvd.Average)`` inside a
   ``tf.function``), ``ringlet-eager`` (the same, eagerly), and to tell where its time goes:
   ``ringlet-numpy`` (``hvd.grouped_allreduce_`` of 20 aligned NumPy arrays in place: ringlet's
   own part), ``numpy_function`` (a ``tf.numpy_function`` in a ``tf.function`` that returns its
   20 inputs: TensorFlow's cost of a Python op), ``copy`` (``t * 1`` of every tensor inside a
   ``tf.function``: the floor of a function that writes fresh tensors of that size); in
   an MWMS job, ``strategy.run`` of ``get_replica_context().all_reduce("mean", tensors)`` inside
   a ``tf.function`` (what Keras's optimizer calls, with "sum"). Each candidate is called twice
   untimed, then ``--calls`` times, the candidates alternating; a barrier precedes each call, a
   call's time is the slowest rank's. Every result is checked (rank r holds r + 1: mean 1.5).
2. A Keras training step: an MLP (``--widths``, ReLU; the default is train_bench.py's torch MLP:
   9.58M parameters, 36.5 MiB of gradients in 10 arrays), synthetic data (8 batches per rank,
   cycled, rank-dependent), ``--batch`` samples per rank, SGD with momentum, sparse categorical
   cross-entropy, ``jit_compile=False`` everywhere (ringlet's graph ops are Python functions,
   which XLA cannot compile), trained by ``model.fit`` for ``--warmup`` + ``--steps`` steps; a
   step's time is the time between the ends of consecutive batches (a Keras callback), the
   slowest rank's; the warm-up steps (tracing) are dropped. Paths:
   - ``none`` (ringlet job): rank 0 alone, no communication, while rank 1 waits in a barrier
     that sleeps (``Ibarrier`` polled every 5 ms, so that it leaves rank 0 the machine): the
     time of the same per-rank step without any other process computing;
   - ``none-x2`` (ringlet job): both ranks train at once without communicating: the same
     per-rank work with the machine as loaded as in the distributed paths, minus communication;
   - ``ringlet`` (ringlet job): ``model.compile(optimizer=ringlet.hvd.keras
     .DistributedOptimizer(SGD))`` if ringlet.hvd.keras imports, else ``ringlet-tape``;
   - ``ringlet-tape`` (ringlet job): a ``train_step`` with ``hvd.DistributedGradientTape``;
   - ``mwms`` (MWMS jobs): the model built and compiled in ``strategy.scope()``, fed a
     ``distribute_datasets_from_function`` dataset (each rank its own batches, per-replica batch
     ``--batch``).
   Every path starts from the same weights (Keras seed) on the same per-rank batches; checked
   (exit 1 if not): the distributed paths end with equal weights on both ranks, and the driver
   checks that ringlet's and MWMS's weights after training agree to rounding.

``--profile`` instead runs one ringlet job that times the parts of ringlet's graph op from
inside (its Python body and ringlet's grouped allreduce in it; wrapped in that process
only), per allreduce call and per training step, beside the step without communication, with a
plain GradientTape, and with a numpy_function round trip of the gradients.

Each rank is bound to one core by mpirun (TensorFlow's thread pools follow the affinity). The
driver prints Markdown tables with --markdown (plain text otherwise) and writes --json.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shlex
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from typing import Any

import numpy as np

VARIANTS = ("ringlet", "mwms-ring", "mwms-auto")
MIB = 1 << 20
DEFAULT_WIDTHS = "1024,2048,2048,1280,512,10"
SEED = 20260226
BATCHES = 8
"""Distinct batches per rank, cycled: enough to vary the data, little to hold in memory."""
LEARNING_RATE, MOMENTUM = 0.01, 0.9
WEIGHT_RTOL = 1e-3
"""ringlet's and MWMS's weights after training: max |a - b| <= WEIGHT_RTOL * max |a| per array
(different summation orders, amplified by the steps; a wrong average is off by far more)."""
BARRIER_POLL_S = 0.005
TARGETS = {"ringlet / mwms": 0.8, "ringlet / none": 1.3}

# The gradient set: a VGG-like convnet's kernels and biases, two dense layers, an embedding and
# three normalization scales; 9,437,184 float32 = 36 MiB exactly.
GRADIENT_SHAPES: tuple[tuple[int, ...], ...] = (
    (3, 3, 3, 64), (64,),
    (3, 3, 64, 128), (128,),
    (3, 3, 128, 256), (256,),
    (3, 3, 256, 256), (256,),
    (3, 3, 256, 512), (512,),
    (3, 3, 512, 512), (512,),
    (2048, 2048), (2048,),
    (2048, 256), (256,),
    (3342, 64),
    (512,), (512,), (512,),
)


# ---------------------------------------------------------------------------------------------
# Command line


def positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {text!r}")
    return value


def widths(text: str) -> list[int]:
    try:
        values = [int(w) for w in text.split(",") if w.strip()]
    except ValueError:
        values = []
    if len(values) < 2 or min(values) < 1:
        raise argparse.ArgumentTypeError(
            f"--widths takes two or more positive layer widths, e.g. 1024,2048,10; got {text!r}")
    return values


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    add = parser.add_argument
    add("--rounds", type=positive_int, default=3, help="jobs of every variant, interleaved")
    add("--calls", type=positive_int, default=10, help="timed allreduce calls per candidate/job")
    add("--steps", type=positive_int, default=15, help="timed training steps per path and job")
    add("--warmup", type=positive_int, default=3, help="untimed training steps (tracing)")
    add("--gradient-mib", type=float, default=36.0,
        help="the allreduce's gradient set, in MiB (36: the 20 shapes as listed)")
    add("--widths", type=widths, default=widths(DEFAULT_WIDTHS), help="the MLP's layer widths")
    add("--batch", type=positive_int, default=32, help="samples per rank and step")
    add("--variants", default=",".join(VARIANTS), help="comma-separated subset of the jobs")
    add("--mpirun", default="mpirun", help="the launcher (split like a shell command)")
    add("--timeout", type=float, default=600, help="seconds a job may take")
    add("--markdown", action="store_true", help="print Markdown tables")
    add("--json", metavar="FILE", help="write every sample and the summary as JSON")
    add("--profile", action="store_true",
        help="instead: one ringlet job that times the parts of ringlet's graph op from inside "
             "(its Python body and ringlet's grouped allreduce in it), per allreduce "
             "call and per training step beside the step without communication")
    add("--job", choices=VARIANTS, help=argparse.SUPPRESS)  # a job of the driver, under mpirun
    add("--out", help=argparse.SUPPRESS)  # the job's result file (rank 0 writes it)
    add("--round", type=int, default=0, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.gradient_mib <= 0:
        parser.error(f"--gradient-mib must be positive, got {args.gradient_mib}")
    variants = [v.strip() for v in args.variants.split(",") if v.strip()]
    unknown = sorted(set(variants) - set(VARIANTS))
    if unknown or not variants:
        parser.error(f"--variants: unknown {unknown or variants}; choose from {list(VARIANTS)}")
    args.variants = variants
    return args


def gradient_shapes(mib: float) -> list[tuple[int, ...]]:
    """The 36 MiB set, each tensor's largest dimension scaled by mib / 36 (at least 1)."""
    scale = mib / 36.0
    if scale == 1.0:
        return list(GRADIENT_SHAPES)
    scaled = []
    for shape in GRADIENT_SHAPES:
        axis = shape.index(max(shape))
        scaled.append(tuple(max(1, round(d * scale)) if i == axis else d
                            for i, d in enumerate(shape)))
    return scaled


# ---------------------------------------------------------------------------------------------
# A job: one variant under mpirun -n 2


def free_ports(count: int) -> list[int]:
    """Ports the OS hands out now; held open together so that they differ."""
    sockets = [socket.socket() for _ in range(count)]
    try:
        for s in sockets:
            s.bind(("localhost", 0))
        return [s.getsockname()[1] for s in sockets]
    finally:
        for s in sockets:
            s.close()


def sleeping_barrier(comm) -> None:
    """A barrier that sleeps while it waits (Open MPI's blocking barrier spins a core)."""
    request = comm.Ibarrier()
    while not request.Test():
        time.sleep(BARRIER_POLL_S)


class Job:
    """What a job shares: MPI, TensorFlow, the strategy (MWMS jobs), the results."""

    def __init__(self, args: argparse.Namespace) -> None:
        from mpi4py import MPI  # first: mpi4py initializes MPI, before ringlet and TensorFlow

        self.MPI = MPI
        self.comm = MPI.COMM_WORLD
        self.rank, self.size = self.comm.Get_rank(), self.comm.Get_size()
        self.args = args
        self.variant = args.job
        self.strategy = None
        if self.variant != "ringlet":
            ports = self.comm.bcast(free_ports(self.size) if self.rank == 0 else None)
            os.environ["TF_CONFIG"] = json.dumps({
                "cluster": {"worker": [f"localhost:{p}" for p in ports]},
                "task": {"type": "worker", "index": self.rank}})
        import tensorflow as tf

        self.tf = tf
        if self.variant != "ringlet":
            implementation = tf.distribute.experimental.CommunicationImplementation
            options = tf.distribute.experimental.CommunicationOptions(
                implementation=implementation.RING if self.variant == "mwms-ring"
                else implementation.AUTO)
            self.strategy = tf.distribute.MultiWorkerMirroredStrategy(
                communication_options=options)
            if self.strategy.num_replicas_in_sync != self.size:
                raise RuntimeError(f"MWMS has {self.strategy.num_replicas_in_sync} replicas "
                                   f"for {self.size} processes")
        else:
            import ringlet.hvd.tensorflow as hvd

            self.hvd = hvd
            hvd.init()
        self.errors: list[str] = []

    def slowest(self, seconds: list[float]) -> list[float]:
        values = np.asarray(seconds, dtype=np.float64)
        self.comm.Allreduce(self.MPI.IN_PLACE, values, op=self.MPI.MAX)
        return values.tolist()

    # -- 1. the allreduce ----------------------------------------------------------------------

    def allreduce_candidates(self, tensors: list) -> dict[str, Callable[[], list]]:
        tf = self.tf
        if self.strategy is None:
            hvd = self.hvd

            @tf.function
            def graph():
                return hvd.grouped_allreduce(tensors, op=hvd.Average)

            @tf.function
            def copy():
                return [t * 1.0 for t in tensors]

            dtypes = [t.dtype for t in tensors]

            @tf.function
            def round_trip():
                return tf.numpy_function(lambda *arrays: list(arrays), tensors, dtypes,
                                         stateful=True)

            # The same collective on NumPy arrays, in place: what the graph op's Python body
            # calls after copying its inputs (the floor of ringlet's part).
            import ringlet

            arrays = [ringlet.aligned_empty(t.shape, np.float32) for t in tensors]
            for array in arrays:
                array.fill(self.rank + 1)

            def in_place():
                hvd.grouped_allreduce_(arrays, op=hvd.Average)
                return arrays

            return {"ringlet-graph": graph,
                    "ringlet-eager": lambda: hvd.grouped_allreduce(tensors, op=hvd.Average),
                    "ringlet-numpy": in_place,
                    "numpy_function": round_trip,
                    "copy": copy}
        strategy = self.strategy

        @tf.function
        def mwms():
            return strategy.run(
                lambda: tf.distribute.get_replica_context().all_reduce("mean", tensors))

        name = self.variant
        return {name: lambda: strategy.experimental_local_results(mwms())[0]}

    def time_allreduce(self) -> dict[str, Any]:
        tf = self.tf
        shapes = gradient_shapes(self.args.gradient_mib)
        tensors = [tf.fill(shape, float(self.rank + 1)) for shape in shapes]
        nbytes = sum(int(np.prod(s)) * 4 for s in shapes)
        candidates = self.allreduce_candidates(tensors)
        expected = (self.size + 1) / 2  # the mean of 1, ..., size
        correct = {}
        for name, call in candidates.items():
            for _ in range(2):
                result = call()
            values = [np.asarray(r) for r in result]
            # copy and the numpy_function round trip return their input
            want = self.rank + 1.0 if name in ("copy", "numpy_function") else expected
            correct[name] = bool(len(values) == len(shapes) and all(
                v.shape == s and np.all(v == want) for v, s in zip(values, shapes)))
        samples: dict[str, list[float]] = {name: [] for name in candidates}
        names = list(candidates)
        for i in range(self.args.calls):
            for name in names[i % len(names):] + names[:i % len(names)]:
                self.comm.Barrier()
                start = time.perf_counter()
                result = candidates[name]()
                np.asarray(result[0])  # CPU eager results are ready; this makes sure
                samples[name].append(time.perf_counter() - start)
        for name in names:
            samples[name] = self.slowest(samples[name])
            correct[name] = bool(self.comm.allreduce(correct[name], op=self.MPI.LAND))
            if not correct[name]:
                self.errors.append(f"{name}: wrong allreduce result")
        return {"bytes": nbytes, "tensors": len(shapes),
                "smallest_bytes": min(int(np.prod(s)) * 4 for s in shapes),
                "largest_bytes": max(int(np.prod(s)) * 4 for s in shapes),
                "seconds": samples, "correct": correct}

    # -- 2. the Keras training step --------------------------------------------------------------

    def batches(self, rank: int) -> tuple[np.ndarray, np.ndarray]:
        rng = np.random.default_rng([SEED, rank])
        n = BATCHES * self.args.batch
        x = rng.standard_normal((n, self.args.widths[0]), dtype=np.float32)
        y = rng.integers(0, self.args.widths[-1], size=n).astype(np.int32)
        return x, y

    def dataset(self):
        x, y = self.batches(self.rank)
        return self.tf.data.Dataset.from_tensor_slices((x, y)).repeat().batch(
            self.args.batch, drop_remainder=True)

    def build_model(self, model_class=None):
        import keras

        keras.utils.set_random_seed(SEED)  # the same initial weights in every job and path
        w = self.args.widths
        layers = [keras.Input((w[0],))]
        layers += [keras.layers.Dense(width, activation="relu") for width in w[1:-1]]
        layers.append(keras.layers.Dense(w[-1]))
        return (model_class or keras.Sequential)(layers)

    def compile(self, model, optimizer) -> None:
        import keras

        model.compile(optimizer=optimizer, jit_compile=False,
                      loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))

    @staticmethod
    def sgd():
        import keras

        return keras.optimizers.SGD(learning_rate=LEARNING_RATE, momentum=MOMENTUM)

    def fit(self, model, data, extra: list | None = None) -> list[float]:
        """Step periods of model.fit after the warm-up (this rank's)."""
        import keras

        ends: list[float] = []

        class Timer(keras.callbacks.Callback):
            def on_train_begin(self, logs=None):
                ends.append(time.perf_counter())

            def on_train_batch_end(self, batch, logs=None):
                ends.append(time.perf_counter())

        model.fit(data, epochs=1, steps_per_epoch=self.args.warmup + self.args.steps,
                  callbacks=[Timer(), *(extra or [])], verbose=0)
        periods = np.diff(ends).tolist()
        return periods[self.args.warmup:]

    def weights(self, model) -> list[np.ndarray]:
        return [np.asarray(v) for v in model.trainable_variables]

    def same_on_every_rank(self, weights: list[np.ndarray]) -> bool:
        gathered = self.comm.gather(weights if self.rank != 0 else None)
        ok = True
        if self.rank == 0:
            ok = all(np.array_equal(a, b) for other in gathered[1:] for a, b in zip(weights,
                                                                                    other))
        return bool(self.comm.bcast(ok))

    def train_paths(self) -> dict[str, Callable[[], tuple[list[float], Any]]]:
        """path -> a function that trains a fresh model and returns (slowest-rank step periods,
        rank 0's final weights or None)."""
        if self.strategy is not None:
            return {"mwms": self.train_mwms}
        paths = {"none": self.train_alone, "none-x2": self.train_independent}
        try:
            import ringlet.hvd.keras as hvd_keras
        except ImportError:
            hvd_keras = None
        if hvd_keras is not None:
            paths["ringlet"] = lambda: self.train_ringlet_optimizer(hvd_keras)
        paths["ringlet-tape"] = self.train_ringlet_tape
        return paths

    def train_alone(self):
        periods: list[float] = []
        if self.rank == 0:
            model = self.build_model()
            self.compile(model, self.sgd())
            periods = self.fit(model, self.dataset())
        sleeping_barrier(self.comm)
        return self.comm.bcast(periods), None

    def train_independent(self):
        model = self.build_model()
        self.compile(model, self.sgd())
        return self.slowest(self.fit(model, self.dataset())), None

    def distributed(self, model) -> tuple[list[float], Any]:
        periods = self.slowest(self.fit(model, self.distributed_data(model)))
        weights = self.weights(model)
        if not self.same_on_every_rank(weights):
            self.errors.append("weights differ between the ranks after training")
        return periods, weights if self.rank == 0 else None

    def distributed_data(self, model):
        if self.strategy is None:
            return self.dataset()
        return self.strategy.distribute_datasets_from_function(lambda context: self.dataset())

    def train_ringlet_optimizer(self, hvd_keras):
        model = self.build_model()
        self.compile(model, hvd_keras.DistributedOptimizer(self.sgd()))
        return self.distributed(model)

    def tape_model(self, between: str = "ringlet"):
        """A train_step with a GradientTape: ``between`` gradient and update, ringlet's
        DistributedGradientTape, or (--profile) nothing, or a stateful tf.numpy_function that
        returns the gradients (TensorFlow's cost of a Python op in the step)."""
        import keras

        hvd, tf = self.hvd, self.tf

        def round_trip(grads):
            return tf.numpy_function(lambda *arrays: list(arrays), grads,
                                     [g.dtype for g in grads], stateful=True)

        class TapeModel(keras.Sequential):
            def train_step(self, data):
                x, y = data
                with tf.GradientTape() as tape:
                    y_pred = self(x, training=True)
                    loss = self.compute_loss(x=x, y=y, y_pred=y_pred)
                if between == "ringlet":
                    tape = hvd.DistributedGradientTape(tape)
                grads = tape.gradient(loss, self.trainable_variables)
                if between == "numpy_function":
                    grads = round_trip(grads)
                self.optimizer.apply(grads, self.trainable_variables)
                return self.compute_metrics(x, y, y_pred)

        model = self.build_model(TapeModel)
        self.compile(model, self.sgd())
        return model

    def train_ringlet_tape(self):
        return self.distributed(self.tape_model())

    def train_mwms(self):
        import keras

        job = self

        class MWMSModel(keras.Sequential):
            # Keras 3's fit under a multi-worker MWMS builds the model from a batch it takes
            # from fit's iterator and reduces across the workers with strategy.reduce, which
            # fails on a (x, y) pair of PerReplica values (keras-team/keras#20585) and would
            # skip that batch: build from a local batch instead, leaving fit's iterator alone.
            def _maybe_symbolic_build(self, iterator=None, data_batch=None):
                if data_batch is None:
                    data_batch = next(iter(job.dataset()))
                with self.distribute_strategy.scope():
                    self._symbolic_build(data_batch=data_batch)

            # And it averages each step's logs over the workers with strategy.reduce("MEAN",
            # log, axis=0), which fails on a scalar: hand it each log as a 1-vector.
            def train_step(self, data):
                logs = super().train_step(data)
                return {name: job.tf.reshape(value, [1]) for name, value in logs.items()}

        with self.strategy.scope():
            model = self.build_model(MWMSModel)
            self.compile(model, self.sgd())
        return self.distributed(model)

    def time_training(self) -> dict[str, Any]:
        paths = self.train_paths()
        names = list(paths)
        shift = self.args.round % len(names)
        order = names[shift:] + names[:shift]
        seconds, weights = {}, {}
        for name in order:
            seconds[name], weights[name] = paths[name]()
        parameters = sum(int(np.prod(w.shape)) for w in self.build_model().trainable_variables)
        return {"order": order, "seconds": seconds, "weights": weights,
                "parameters": parameters}


    # -- where ringlet's time goes (--profile) --------------------------------------------------

    def profile(self) -> dict[str, Any]:
        """The graph op's parts, timed from inside: its Python body (ringlet.as_caller, which
        the body enters first and leaves last) and ringlet's grouped allreduce in it
        (``grouped_allreduce_`` in place, ``grouped_allreduce_into`` into the op's results).
        Wrapped here, in this process only; per allreduce call and per training step, medians
        over the calls (the slowest rank's)."""
        import contextlib

        import keras

        import ringlet
        from ringlet.hvd._api import api

        spent = dict.fromkeys(("body", "allreduce"), 0.0)
        in_place, into, caller = api.grouped_allreduce_, api.grouped_allreduce_into, \
            ringlet.as_caller

        def timed(part: str, function: Callable) -> Callable:
            def wrapper(*args, **kwargs):
                start = time.perf_counter()
                try:
                    return function(*args, **kwargs)
                finally:
                    spent[part] += time.perf_counter() - start
            return wrapper

        @contextlib.contextmanager
        def timed_caller(name: str):
            start = time.perf_counter()
            with caller(name):
                yield
            spent["body"] += time.perf_counter() - start

        # The graph op's body calls these by these names (hvd/tensorflow/_collectives.py).
        api.grouped_allreduce_ = timed("allreduce", in_place)
        api.grouped_allreduce_into = timed("allreduce", into)
        ringlet.as_caller = timed_caller
        try:
            return {"allreduce": self.profile_allreduce(spent),
                    "train": self.profile_training(spent, keras)}
        finally:
            ringlet.as_caller = caller
            del api.grouped_allreduce_, api.grouped_allreduce_into

    def profile_allreduce(self, spent: dict[str, float]) -> dict[str, list[float]]:
        tf, hvd = self.tf, self.hvd
        tensors = [tf.fill(shape, float(self.rank + 1))
                   for shape in gradient_shapes(self.args.gradient_mib)]

        @tf.function
        def graph():
            return hvd.grouped_allreduce(tensors, op=hvd.Average)

        calls = {"graph": graph,
                 "eager": lambda: hvd.grouped_allreduce(tensors, op=hvd.Average)}
        parts = {mode: {k: [] for k in ("call", *spent)} for mode in calls}
        for i in range(2 + self.args.calls):
            for mode, call in calls.items():
                self.comm.Barrier()
                before = dict(spent)
                start = time.perf_counter()
                np.asarray(call()[0])
                if i >= 2:
                    parts[mode]["call"].append(time.perf_counter() - start)
                    for k in spent:
                        parts[mode][k].append(spent[k] - before[k])
        return {mode: {k: self.slowest(v) for k, v in timed.items()}
                for mode, timed in parts.items()}

    def profile_training(self, spent: dict[str, float], keras) -> dict[str, list[float]]:
        snapshots: list[dict[str, float]] = []

        class Snapshot(keras.callbacks.Callback):
            def on_train_batch_end(self, batch, logs=None):
                snapshots.append(dict(spent))

        plain = self.build_model()
        self.compile(plain, self.sgd())
        parts: dict[str, list[float]] = {"none-x2": self.slowest(self.fit(plain,
                                                                          self.dataset()))}
        for between in ("nothing", "numpy_function"):
            parts[f"tape+{between}"] = self.slowest(self.fit(self.tape_model(between),
                                                             self.dataset()))
        model = self.tape_model()
        parts["step"] = self.slowest(self.fit(model, self.dataset(), [Snapshot()]))
        timed_snapshots = snapshots[self.args.warmup - 1:]
        for k in spent:
            parts[k] = self.slowest([b[k] - a[k] for a, b in zip(timed_snapshots,
                                                                  timed_snapshots[1:])])
        return parts


def run_profile_job(job: Job) -> int:
    result = job.profile()
    if job.rank == 0:
        Path(job.args.out).write_text(json.dumps(result))
    return 0


def run_job(args: argparse.Namespace) -> int:
    job = Job(args)
    if args.profile:
        return run_profile_job(job)
    started = time.perf_counter()
    allreduce = job.time_allreduce()
    train = job.time_training()
    weights = train.pop("weights")
    if job.rank == 0:
        out = Path(args.out) if args.out else None
        result = {"variant": job.variant, "round": args.round, "allreduce": allreduce,
                  "train": train, "errors": job.errors, "meta": job_meta(job),
                  "seconds": time.perf_counter() - started}
        if out is not None:
            out.write_text(json.dumps(result))
            # The weights after training of every distributed path, for the driver's check
            # between the paths and variants: FILE.<path>.npz.
            for name, values in weights.items():
                if values is not None:
                    np.savez(out.with_suffix(f".{name}.npz"), *values)
        else:
            print(json.dumps(result, indent=1))
    return 1 if job.errors else 0


def job_meta(job: Job) -> dict[str, Any]:
    import keras

    return {"tensorflow": job.tf.__version__, "keras": keras.__version__,
            "mpi_library": job.MPI.Get_library_version().strip("\x00 \n").splitlines()[0],
            "affinity": sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity")
            else None}


# ---------------------------------------------------------------------------------------------
# The driver


def launch(args: argparse.Namespace, variant: str, round_index: int, out: Path) -> dict:
    script = Path(__file__).resolve()
    forwarded = ["--calls", str(args.calls), "--steps", str(args.steps), "--warmup",
                 str(args.warmup), "--gradient-mib", str(args.gradient_mib), "--widths",
                 ",".join(map(str, args.widths)), "--batch", str(args.batch),
                 *(["--profile"] if args.profile else [])]
    command = [*shlex.split(args.mpirun), "-n", "2", sys.executable, str(script), "--job",
               variant, "--round", str(round_index), "--out", str(out), *forwarded]
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": os.environ.get("TF_CPP_MIN_LOG_LEVEL", "2")}
    started = time.perf_counter()
    job = subprocess.run(command, text=True, capture_output=True, timeout=args.timeout,
                         env=env)
    if job.returncode != 0 or not out.exists():
        tail = "\n".join((job.stdout + job.stderr).splitlines()[-40:])
        raise SystemExit(f"tf_bench: job {variant} (round {round_index + 1}) failed with exit "
                         f"code {job.returncode}:\n{tail}")
    result = json.loads(out.read_text())
    if not args.profile:
        result["wall_seconds"] = time.perf_counter() - started
    return result


PROFILE_ROWS = (
    # (key, label)
    ("call", "whole call / step"),
    ("none-x2", "the step without communication (both ranks computing)"),
    ("tape+nothing", "the same train_step with a plain GradientTape, no communication"),
    ("tape+numpy_function", "  with a stateful `tf.numpy_function` returning the gradients"),
    ("body", "the op's Python body"),
    ("allreduce", "  ringlet's grouped allreduce in it"),
)


def run_profile_driver(args: argparse.Namespace) -> int:
    with tempfile.TemporaryDirectory(prefix="tf_bench.") as tmp:
        out = Path(tmp) / "profile.json"
        result = launch(args, "ringlet", 0, out)
    graph, eager, tr = result["allreduce"]["graph"], result["allreduce"]["eager"], \
        result["train"]
    tr["call"] = tr.pop("step")
    eager.pop("body")  # only a graph op has a body (eagerly the collective runs in the call)

    def cell(parts: dict, key: str) -> str:
        return fmt_ms(median(parts[key])) if key in parts else "-"

    cells = [[label, cell(graph, key), cell(eager, key), cell(tr, key)]
             for key, label in PROFILE_ROWS]
    step, alone = median(tr["call"]), median(tr["none-x2"])
    cells.append(["the op's cost outside its body (step - no-communication step - body)", "-",
                  "-", fmt_ms(step - alone - median(tr["body"]))])
    cells.append(["outside the body (call - body)",
                  fmt_ms(median(graph["call"]) - median(graph["body"])), "-", "-"])
    cells.append(["eagerly, outside the allreduce (call - allreduce)", "-",
                  fmt_ms(median(eager["call"]) - median(eager["allreduce"])), "-"])
    print(f"Where ringlet's graph op spends its time: {args.gradient_mib:g} MiB allreduce "
          f"({args.calls} calls of each) and the MLP {'-'.join(map(str, args.widths))} step "
          f"with DistributedGradientTape ({args.steps} steps), ms, medians of the slowest rank:")
    print()
    print(table(["part", "allreduce in tf.function ms", "allreduce eager ms", "training step ms"],
                cells, args.markdown))
    return 0


def round_order(variants: list[str], round_index: int) -> list[str]:
    shift = round_index % len(variants)
    return variants[shift:] + variants[:shift]


def median(values: list[float]) -> float:
    return float(statistics.median(values)) if values else float("nan")


def summarize(results: list[dict], key: str) -> dict[str, dict[str, Any]]:
    """Per candidate or path: pooled median and per-round medians, in seconds."""
    rows: dict[str, dict[str, Any]] = {}
    for result in results:
        for name, samples in result[key]["seconds"].items():
            row = rows.setdefault(name, {"samples": [], "rounds": {}})
            row["samples"].extend(samples)
            row["rounds"][result["round"]] = median(samples)
    for row in rows.values():
        row["median"] = median(row["samples"])
        row["round_medians"] = [row["rounds"][r] for r in sorted(row["rounds"])]
    return rows


def ratio_row(rows: dict, numerator: str, denominator: str) -> dict[str, Any] | None:
    """numerator / denominator: of the pooled medians, and per round (measured side by side)."""
    if numerator not in rows or denominator not in rows:
        return None
    top, bottom = rows[numerator], rows[denominator]
    per_round = [top["rounds"][r] / bottom["rounds"][r]
                 for r in sorted(top["rounds"]) if r in bottom["rounds"]]
    return {"ratio": top["median"] / bottom["median"], "per_round": per_round}


def compare_weights(paths: dict[str, Path]) -> dict[str, float]:
    """Max over arrays of max |w - w_ref| / max |w_ref|, every variant against the first."""
    loaded = {name: np.load(path) for name, path in paths.items() if path.exists()}
    if len(loaded) < 2:
        return {}
    reference_name, reference = next(iter(loaded.items()))
    errors = {}
    for name, other in loaded.items():
        if name == reference_name:
            continue
        errors[name] = max(float(np.max(np.abs(other[k] - reference[k]))
                                 / max(float(np.max(np.abs(reference[k]))), 1e-30))
                           for k in reference.files)
    return errors


def fmt_ms(seconds: float) -> str:
    ms = seconds * 1e3
    return f"{ms:.1f}" if ms < 100 else f"{ms:.0f}"


def spread(values: list[float], scale: float = 1e3, digits: int = 1) -> str:
    if not values:
        return "-"
    low, high = min(values) * scale, max(values) * scale
    return f"{low:.{digits}f}-{high:.{digits}f}" if len(values) > 1 else f"{low:.{digits}f}"


def table(header: list[str], rows: list[list[str]], markdown: bool) -> str:
    widths_ = [max(len(str(c)) for c in column) for column in zip(header, *rows)]
    if markdown:
        line = lambda cells: "| " + " | ".join(  # noqa: E731
            str(c).ljust(w) if i == 0 else str(c).rjust(w)
            for i, (c, w) in enumerate(zip(cells, widths_))) + " |"
        rule = "|" + "|".join(("-" * (w + 1) + ":") if i else (":" + "-" * (w + 1))
                              for i, w in enumerate(widths_)) + "|"
        return "\n".join([line(header), rule, *map(line, rows)])
    line = lambda cells: "  ".join(  # noqa: E731
        str(c).ljust(w) if i == 0 else str(c).rjust(w)
        for i, (c, w) in enumerate(zip(cells, widths_)))
    return "\n".join([line(header), *map(line, rows)])


ALLREDUCE_LABELS = {
    "ringlet-graph": "ringlet `grouped_allreduce` in `tf.function`",
    "ringlet-eager": "ringlet `grouped_allreduce`, eager",
    "mwms-ring": "MWMS `all_reduce`, RING",
    "mwms-auto": "MWMS `all_reduce`, AUTO",
    "ringlet-numpy": "ringlet `grouped_allreduce_` on NumPy arrays, in place",
    "numpy_function": "`tf.numpy_function` returning its inputs, in `tf.function`",
    "copy": "copy (`t * 1` in `tf.function`, no communication)",
}
TRAIN_LABELS = {
    "none": "no communication, one process",
    "none-x2": "no communication, both ranks computing",
    "ringlet": "ringlet `hvd.keras.DistributedOptimizer`",
    "ringlet-tape": "ringlet `DistributedGradientTape` train_step",
    "mwms-ring": "MWMS `model.fit`, RING",
    "mwms-auto": "MWMS `model.fit`, AUTO",
}


def train_rows(results: list[dict]) -> dict[str, dict[str, Any]]:
    """The training paths, MWMS's named by its job (mwms-ring, mwms-auto)."""
    renamed = []
    for result in results:
        seconds = {(result["variant"] if name == "mwms" else name): samples
                   for name, samples in result["train"]["seconds"].items()}
        renamed.append({"round": result["round"], "train": {"seconds": seconds}})
    return summarize(renamed, "train")


def report(summary: dict[str, Any], markdown: bool) -> str:
    out = []
    meta = summary["meta"]
    out.append(f"# tf_bench: 2 ranks on {meta['hostname']} ({meta['cores']} cores), "
               f"{meta['date']}; TensorFlow {meta['tensorflow']}, Keras {meta['keras']}; "
               f"{meta['mpi_library']}")
    out.append(f"# {summary['rounds']} rounds; job order: "
               + "; ".join(", ".join(order) for order in summary["round_orders"]))
    ar = summary["allreduce"]
    out.append("")
    out.append(f"Allreduce (average) of {ar['tensors']} float32 tensors, "
               f"{ar['bytes'] / MIB:.1f} MiB ({ar['smallest_bytes']} B to "
               f"{ar['largest_bytes'] / MIB:.1f} MiB), ms per call (slowest rank):")
    out.append("")
    best_mwms = summary["best_mwms_allreduce"]
    header = ["candidate", "median ms", "round medians", "calls", "/ best MWMS", "correct"]
    rows = []
    for name, row in ar["rows"].items():
        r = ratio_row(ar["rows"], name, best_mwms) if best_mwms else None
        rows.append([ALLREDUCE_LABELS.get(name, name), fmt_ms(row["median"]),
                     spread(row["round_medians"]), str(len(row["samples"])),
                     f"{r['ratio']:.2f}" if r else "-",
                     "yes" if ar["correct"].get(name) else "NO"])
    out.append(table(header, rows, markdown))
    tr = summary["train"]
    out.append("")
    out.append(f"Keras training step: MLP {'-'.join(map(str, summary['widths']))} "
               f"({tr['parameters']:,} parameters, {tr['parameters'] * 4 / MIB:.1f} MiB of "
               f"gradients), batch {summary['batch']} per rank, SGD with momentum, ms per step "
               f"(slowest rank):")
    out.append("")
    header = ["path", "median ms", "round medians", "steps", "/ none", "/ best MWMS"]
    rows = []
    for name, row in tr["rows"].items():
        to_none = ratio_row(tr["rows"], name, "none")
        to_mwms = ratio_row(tr["rows"], name, summary["best_mwms_train"]) \
            if summary["best_mwms_train"] else None
        rows.append([TRAIN_LABELS.get(name, name), fmt_ms(row["median"]),
                     spread(row["round_medians"]), str(len(row["samples"])),
                     f"{to_none['ratio']:.2f}" if to_none else "-",
                     f"{to_mwms['ratio']:.2f}" if to_mwms else "-"])
    out.append(table(header, rows, markdown))
    out.append("")
    header = ["target", "ratio (medians)", "per round", "met"]
    rows = []
    for target in summary["targets"]:
        rows.append([f"{target['what']} ≤ {target['limit']}", f"{target['ratio']:.2f}",
                     spread(target["per_round"], 1, 2),
                     "met" if target["ratio"] <= target["limit"] else "**missed**"])
    out.append(table(header, rows, markdown))
    out.append("")
    checks = summary["checks"]
    out.append(f"weights after training, max relative difference from {checks['reference']}: "
               + (", ".join(f"{k} {v:.1e}" for k, v in checks["weight_difference"].items())
                  or "-")
               + f" (≤ {WEIGHT_RTOL}: {'yes' if checks['weights_agree'] else 'NO'}); every "
               f"allreduce result right: {'yes' if checks['allreduce_correct'] else 'NO'}")
    return "\n".join(out)


def targets(summary: dict[str, Any]) -> list[dict[str, Any]]:
    found = []
    ringlet = next((p for p in ("ringlet", "ringlet-tape") if p in summary["train"]["rows"]),
                   None)
    rows = summary["train"]["rows"]
    best = summary["best_mwms_train"]
    if ringlet and best:
        r = ratio_row(rows, ringlet, best)
        found.append({"what": f"{ringlet} / {best} (training step)",
                      "limit": TARGETS["ringlet / mwms"], **r})
    if ringlet and "none" in rows:
        r = ratio_row(rows, ringlet, "none")
        found.append({"what": f"{ringlet} / none (training step)",
                      "limit": TARGETS["ringlet / none"], **r})
    ar = summary["allreduce"]["rows"]
    best = summary["best_mwms_allreduce"]
    for name in ("ringlet-graph", "ringlet-eager"):
        if name in ar and best:
            r = ratio_row(ar, name, best)
            found.append({"what": f"{name} / {best} (allreduce)",
                          "limit": TARGETS["ringlet / mwms"], **r})
    return found


def run_driver(args: argparse.Namespace) -> int:
    started = time.perf_counter()
    results = []
    orders = []
    with tempfile.TemporaryDirectory(prefix="tf_bench.") as tmp:
        weight_files: dict[str, Path] = {}
        for r in range(args.rounds):
            order = round_order(args.variants, r)
            orders.append(order)
            for variant in order:
                out = Path(tmp) / f"{variant}.{r}.json"
                print(f"tf_bench: round {r + 1}/{args.rounds}: {variant}", file=sys.stderr,
                      flush=True)
                result = launch(args, variant, r, out)
                results.append(result)
                if r == 0:  # the first round's weights: MWMS's path is named by its job
                    for path in sorted(Path(tmp).glob(f"{variant}.{r}.*.npz")):
                        name = path.suffixes[-2].lstrip(".")
                        weight_files[variant if name == "mwms" else name] = path
                if result["errors"]:
                    print(f"tf_bench: {variant}: {result['errors']}", file=sys.stderr)
        # Every distributed path's weights against ringlet's DistributedGradientTape path's.
        reference = "ringlet-tape" if "ringlet-tape" in weight_files else next(
            iter(weight_files), "-")
        differences = compare_weights({reference: weight_files[reference], **weight_files}
                                      if reference in weight_files else {})
    allreduce = summarize(results, "allreduce")
    mwms = [v for v in ("mwms-ring", "mwms-auto") if v in allreduce]
    first = results[0]
    correct: dict[str, bool] = {}
    for result in results:
        for name, ok in result["allreduce"]["correct"].items():
            correct[name] = correct.get(name, True) and ok
    train = train_rows(results)
    mwms_train = [v for v in ("mwms-ring", "mwms-auto") if v in train]
    summary: dict[str, Any] = {
        "meta": {"date": datetime.now().astimezone().isoformat(timespec="seconds"),
                 "hostname": socket.gethostname(), "cores": os.cpu_count(),
                 "machine": platform.machine(), **first["meta"]},
        "rounds": args.rounds, "round_orders": orders, "widths": args.widths,
        "batch": args.batch, "calls": args.calls, "steps": args.steps, "warmup": args.warmup,
        "allreduce": {"rows": allreduce, "correct": correct,
                      **{k: first["allreduce"][k] for k in ("bytes", "tensors",
                                                            "smallest_bytes",
                                                            "largest_bytes")}},
        "train": {"rows": train, "parameters": first["train"]["parameters"]},
        "best_mwms_allreduce": min(mwms, key=lambda v: allreduce[v]["median"]) if mwms else None,
        "best_mwms_train": min(mwms_train, key=lambda v: train[v]["median"])
        if mwms_train else None,
        "job_seconds": [{"variant": r["variant"], "round": r["round"],
                         "wall": r["wall_seconds"], "timed": r["seconds"]} for r in results],
    }
    summary["checks"] = {
        "reference": reference,
        "weight_difference": differences,
        "weights_agree": all(d <= WEIGHT_RTOL for d in differences.values()),
        "allreduce_correct": all(correct.values()),
        "errors": {f"{r['variant']}.{r['round']}": r["errors"] for r in results if r["errors"]},
    }
    summary["targets"] = targets(summary)
    summary["driver_seconds"] = time.perf_counter() - started
    print(report(summary, args.markdown))
    if args.json:
        Path(args.json).write_text(json.dumps(summary, indent=1))
        print(f"tf_bench: wrote {args.json}", file=sys.stderr)
    print(f"tf_bench: {summary['driver_seconds']:.0f} s", file=sys.stderr)
    ok = summary["checks"]["weights_agree"] and summary["checks"]["allreduce_correct"] \
        and not summary["checks"]["errors"]
    return 0 if ok else 1


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.job:
        return run_job(args)
    if args.profile:
        return run_profile_driver(args)
    return run_driver(args)


if __name__ == "__main__":
    raise SystemExit(main())
