"""Data-parallel Keras 3 training with ringlet.hvd.keras (Horovod's Keras API): an MLP on
scikit-learn's digits, on any Keras backend.

    KERAS_BACKEND=jax mpirun -n 2 python examples/keras_train_digits.py [--epochs 15] [--check]

(KERAS_BACKEND: jax, torch or tensorflow.) A Horovod Keras script, ported by its import line:
the optimizer is wrapped in hvd.DistributedOptimizer, model.compile takes Keras' defaults (on
JAX the step runs inside jax.jit, on TensorFlow inside tf.function, on PyTorch eagerly), and
model.fit runs with Horovod's callbacks: BroadcastGlobalVariablesCallback (every rank starts from
rank 0's weights: each draws its own), MetricAverageCallback (the logged loss and accuracy
averaged over the ranks) and LearningRateWarmupCallback (lr/size to lr over the first epochs,
with SGD's momentum corrected).

The data order is fixed: one seeded permutation of the training set, cut into global batches
of --batch-size rows (the incomplete last one dropped); rank r trains, with shuffle=False, on
rows r*k:(r+1)*k of each, k = batch-size // size(). The mean of equal shards' mean losses is the
global batch's mean loss, so the averaged gradient is the global batch's gradient.

With --check, at the end: (a) the weights must be bit-identical on every rank, (b) close to those
of a single process (rank 0, without communication) that trains the same model from the same
initial weights with plain SGD and the same warmup on the concatenated global batches in the
same order, and (c) the test accuracy above 95%. The script exits 1, saying what failed,
otherwise.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import sys
import time

os.environ.setdefault("JAX_PLATFORMS", "cpu")  # the data is tiny: the CPU, on every backend
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras
import numpy as np
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split

import ringlet.hvd as hvd_collectives  # Horovod's collectives on Python objects
import ringlet.hvd.keras as hvd

# (b)'s tolerance: the distributed run sums each gradient in another order (within the shards,
# then across the ranks) than the single process does over the whole batch, so the weights
# differ by float32 rounding that the training carries along (measured: below 1e-6 after 15
# epochs at 2 ranks on each backend; as examples/jax_train.py's).
WEIGHTS_RTOL, WEIGHTS_ATOL = 1e-3, 1e-4
MIN_ACCURACY = 0.95


def load_data() -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The digits, scaled to [0, 1], split 80/20 the same way on every rank."""
    digits = load_digits()
    features = (digits.data / 16.0).astype(np.float32)
    x_train, x_test, y_train, y_test = train_test_split(
        features, digits.target.astype(np.int32), test_size=0.2, random_state=0,
        stratify=digits.target,
    )
    return x_train, y_train, x_test, y_test


def build_model() -> keras.Model:
    return keras.Sequential([
        keras.Input((64,)),
        keras.layers.Dense(128, activation="relu"),
        keras.layers.Dense(64, activation="relu"),
        keras.layers.Dense(10),
    ])


def rows_of(n: int, batch_size: int, rows: slice) -> np.ndarray:
    """Sample indices, in training order: the given rows of each global batch of a fixed
    permutation (the incomplete last batch dropped)."""
    order = np.random.default_rng(0).permutation(n)
    batches = [order[start:start + batch_size]
               for start in range(0, n - batch_size + 1, batch_size)]
    return np.concatenate([batch[rows] for batch in batches])


def compile_model(model: keras.Model, optimizer: keras.optimizers.Optimizer) -> None:
    model.compile(optimizer=optimizer,
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  metrics=["accuracy"])


def optimizer(args: argparse.Namespace) -> keras.optimizers.Optimizer:
    return keras.optimizers.SGD(learning_rate=args.lr, momentum=0.9)


def warmup(args: argparse.Namespace) -> keras.callbacks.Callback:
    return hvd.callbacks.LearningRateWarmupCallback(initial_lr=args.lr,
                                                    warmup_epochs=args.warmup_epochs)


def weights_of(model: keras.Model) -> np.ndarray:
    return np.concatenate([np.asarray(w, np.float32).ravel() for w in model.get_weights()])


def accuracy(model: keras.Model, x: np.ndarray, y: np.ndarray) -> float:
    return float(np.mean(np.argmax(model.predict(x, verbose=0), axis=1) == y))


def train_reference(initial: list[np.ndarray], x: np.ndarray, y: np.ndarray,
                    args: argparse.Namespace, rows_per_step: int) -> np.ndarray:
    """A single process's training (no communication) on the concatenated global batches:
    what data-parallel training with averaged gradients computes, up to float rounding."""
    model = build_model()
    model.set_weights(initial)
    compile_model(model, optimizer(args))
    order = rows_of(len(x), args.batch_size, slice(0, rows_per_step))
    model.fit(x[order], y[order], batch_size=rows_per_step, epochs=args.epochs, shuffle=False,
              callbacks=[warmup(args)], verbose=0)
    return weights_of(model)


def check(model: keras.Model, initial: list[np.ndarray], x: np.ndarray, y: np.ndarray,
          args: argparse.Namespace, rows_per_step: int) -> list[str]:
    """--check's (a) and (b) (collective): the failures, the same list on every rank."""
    failures = []
    weights = weights_of(model)
    digests = hvd_collectives.allgather_object(hashlib.sha256(weights.tobytes()).hexdigest())
    if len(set(digests)) != 1:
        differ = [r for r, d in enumerate(digests) if d != digests[0]]
        failures.append(f"the weights differ between ranks: ranks {differ} hold other bits "
                        "than rank 0")
    verdict = None
    if hvd.rank() == 0:  # the others wait for its verdict in broadcast_object
        expected = train_reference(initial, x, y, args, rows_per_step)
        worst = float(np.max(np.abs(weights - expected)))
        if not np.allclose(weights, expected, rtol=WEIGHTS_RTOL, atol=WEIGHTS_ATOL):
            verdict = (f"the trained weights differ from a single process's on the global "
                       f"batches: max |difference| {worst:.3g} (rtol {WEIGHTS_RTOL}, atol "
                       f"{WEIGHTS_ATOL})")
        elif not failures:
            print(f"check passed: weights bit-identical on all {hvd.size()} ranks and within "
                  f"{worst:.2g} of a single process's training on the global batches",
                  flush=True)
    verdict = hvd_collectives.broadcast_object(verdict, root_rank=0)
    return failures + ([verdict] if verdict else [])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=15)
    parser.add_argument("--batch-size", type=int, default=64,
                        help="global: each rank trains on batch-size // ranks rows of it")
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--warmup-epochs", type=int, default=3)
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

    x_train, y_train, x_test, y_test = load_data()
    mine = rows_of(len(x_train), args.batch_size, slice(rank * per_rank, (rank + 1) * per_rank))

    keras.utils.set_random_seed(1000 + rank)  # different weights: the broadcast makes them one
    model = build_model()
    compile_model(model, hvd.DistributedOptimizer(optimizer(args)))
    callbacks = [
        hvd.callbacks.BroadcastGlobalVariablesCallback(0),
        hvd.callbacks.MetricAverageCallback(),
        warmup(args),
    ]
    initial = model.get_weights()  # rank 0's: what every rank starts from

    started = time.perf_counter()
    model.fit(x_train[mine], y_train[mine], batch_size=per_rank, epochs=args.epochs,
              shuffle=False, callbacks=callbacks, verbose=2 if rank == 0 else 0)
    elapsed = time.perf_counter() - started
    test_accuracy = accuracy(model, x_test, y_test)
    if rank == 0:
        print(f"\n{keras.backend.backend()}: trained in {elapsed:.1f} s on {size} ranks, "
              f"{per_rank} rows per rank per step; test accuracy {test_accuracy:.4f}",
              flush=True)

    failures = check(model, initial, x_train, y_train, args, per_rank * size) if args.check \
        else []
    if args.check and test_accuracy <= MIN_ACCURACY:
        failures.append(f"test accuracy {test_accuracy:.4f} is not above {MIN_ACCURACY}")
    # Rank 0's verdict for every rank, sent once it has said why: mpirun stops the job as soon
    # as one rank exits non-zero.
    if rank == 0 and failures:
        print("FAILED: " + "; ".join(failures), file=sys.stderr, flush=True)
    if hvd_collectives.broadcast_object(bool(failures), root_rank=0):
        raise SystemExit(1)


if __name__ == "__main__":
    main()
