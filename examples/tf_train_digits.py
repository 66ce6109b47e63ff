"""Data-parallel TensorFlow 2 with Horovod's API on ringlet: an MLP on scikit-learn's digits,
trained with ``DistributedGradientTape`` in a ``tf.function``.

    mpirun -n 2 python examples/tf_train_digits.py [--epochs 10] [--batch-size 96] [--check]

A Horovod script, changed only in its import (``import ringlet.hvd.tensorflow as hvd``). Every
rank draws the same global batches (a permutation of the training set seeded by the epoch) and
trains on its own block of rows of each (batch-size // size() rows). The tape averages the
gradients over the ranks, so the step equals one on the global batch. Rank 0's initial weights
reach every rank through ``hvd.broadcast_variables``; rank 0 prints the loss and test accuracy
per epoch.

With --check, at the end: (a) the weights must be bit-identical on every rank, (b) equal,
within float32 rounding, to those of a single process training on the whole global batches from
the same initial weights in the same order, and (c) the test accuracy must exceed 0.95. The
script exits non-zero, saying what differs, otherwise.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np
import tensorflow as tf
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split

import ringlet.hvd.tensorflow as hvd

LAYERS = (128, 64, 10)
# --check's tolerance: float32 sums added in another order (within each shard, then across the
# ranks), through the whole training.
WEIGHTS_RTOL, WEIGHTS_ATOL = 1e-3, 1e-4
MIN_ACCURACY = 0.95


def load_data() -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The digits, scaled to [0, 1], split 80/20 the same way on every rank."""
    digits = load_digits()
    features = (digits.data / 16.0).astype(np.float32)
    return train_test_split(features, digits.target.astype(np.int32), test_size=0.2,
                            random_state=0, stratify=digits.target)


def build_model(seed: int) -> tf.keras.Model:
    tf.keras.utils.set_random_seed(seed)
    layers = [tf.keras.Input((64,))]
    layers += [tf.keras.layers.Dense(width, activation="relu") for width in LAYERS[:-1]]
    layers.append(tf.keras.layers.Dense(LAYERS[-1]))
    return tf.keras.Sequential(layers)


def make_step(model: tf.keras.Model, optimizer, distributed: bool):
    loss_fn = tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True)

    @tf.function
    def step(x: tf.Tensor, y: tf.Tensor) -> tf.Tensor:
        with tf.GradientTape() as tape:
            loss = loss_fn(y, model(x, training=True))
        if distributed:
            tape = hvd.DistributedGradientTape(tape)
        grads = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(grads, model.trainable_variables))
        return loss

    return step


def global_batches(n: int, batch_size: int, epoch: int) -> list[np.ndarray]:
    """The epoch's global batches of sample indices, the same on every rank (the incomplete last
    batch dropped)."""
    order = np.random.default_rng(epoch).permutation(n)
    return [order[s:s + batch_size] for s in range(0, n - batch_size + 1, batch_size)]


def train(model, optimizer, x, y, *, epochs: int, batch_size: int, rows: slice,
          distributed: bool, report=None) -> None:
    step = make_step(model, optimizer, distributed)
    for epoch in range(1, epochs + 1):
        losses = [step(tf.constant(x[batch[rows]]), tf.constant(y[batch[rows]]))
                  for batch in global_batches(len(x), batch_size, epoch)]
        if report is not None:
            report(epoch, float(np.mean([loss.numpy() for loss in losses])))


def accuracy(model: tf.keras.Model, x: np.ndarray, y: np.ndarray) -> float:
    return float(np.mean(np.argmax(model(x).numpy(), axis=1) == y))


def flat_weights(model: tf.keras.Model) -> np.ndarray:
    return np.concatenate([v.numpy().ravel() for v in model.trainable_variables])


def check(model, initial, data, args, per_rank: int) -> list[str]:
    """--check (collective): the failures, the same list on every rank."""
    x_train, x_test, y_train, y_test = data
    failures = []
    weights = flat_weights(model)
    digests = hvd.allgather_object(hashlib.sha256(weights.tobytes()).hexdigest())
    if len(set(digests)) != 1:
        failures.append(f"the weights differ between ranks: ranks "
                        f"{[r for r, d in enumerate(digests) if d != digests[0]]} hold other "
                        f"bits than rank 0")
    verdicts = None
    if hvd.rank() == 0:  # the others wait for its verdicts in broadcast_object
        single = build_model(seed=0)
        for v, value in zip(single.trainable_variables, initial):
            v.assign(value)
        train(single, tf.keras.optimizers.Adam(args.lr), x_train, y_train, epochs=args.epochs,
              batch_size=args.batch_size, rows=slice(0, per_rank * hvd.size()),
              distributed=False)
        expected = flat_weights(single)
        worst = float(np.max(np.abs(weights - expected)))
        verdicts = []
        if not np.allclose(weights, expected, rtol=WEIGHTS_RTOL, atol=WEIGHTS_ATOL):
            verdicts.append(f"the weights differ from a single process's on the global "
                            f"batches: max |difference| {worst:.3g} (rtol {WEIGHTS_RTOL}, "
                            f"atol {WEIGHTS_ATOL})")
        test_accuracy = accuracy(model, x_test, y_test)
        if test_accuracy <= MIN_ACCURACY:
            verdicts.append(f"test accuracy {test_accuracy:.3f} is not above {MIN_ACCURACY}")
        if not failures and not verdicts:
            print(f"check passed: weights bit-identical on all {hvd.size()} ranks, within "
                  f"{worst:.2g} of a single process's training on the global batches; test "
                  f"accuracy {test_accuracy:.3f}", flush=True)
    return failures + hvd.broadcast_object(verdicts, root_rank=0)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=10)
    parser.add_argument("--batch-size", type=int, default=96,
                        help="global: each rank trains on batch-size // ranks rows of it")
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--check", action="store_true",
                        help="verify the weights against every rank and a single process")
    args = parser.parse_args()
    if args.epochs < 1:
        parser.error("--epochs must be at least 1")

    hvd.init()
    rank, size = hvd.rank(), hvd.size()
    per_rank = args.batch_size // size
    if per_rank == 0:
        raise SystemExit(f"--batch-size {args.batch_size} gives no rows to each of {size} ranks")
    x_train, x_test, y_train, y_test = load_data()

    model = build_model(seed=rank)  # different on each rank until the broadcast
    hvd.broadcast_variables(model.variables, root_rank=0)
    initial = [v.numpy() for v in model.trainable_variables]

    def report(epoch: int, loss: float) -> None:
        if rank == 0:
            print(f"epoch {epoch:3d}  loss {loss:.4f}  test accuracy "
                  f"{accuracy(model, x_test, y_test):.3f}", flush=True)

    train(model, tf.keras.optimizers.Adam(args.lr), x_train, y_train, epochs=args.epochs,
          batch_size=args.batch_size, rows=slice(rank * per_rank, (rank + 1) * per_rank),
          distributed=True, report=report)
    if args.check:
        failures = check(model, initial, (x_train, x_test, y_train, y_test), args, per_rank)
        if failures:
            print(f"rank {rank}: check FAILED: " + "; ".join(failures), file=sys.stderr)
            sys.exit(1)


if __name__ == "__main__":
    main()
