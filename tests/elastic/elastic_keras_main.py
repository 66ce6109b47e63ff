"""A Keras training script for tests/elastic's scenarios, after Horovod's
examples/elastic/tensorflow2/tensorflow2_keras_mnist_elastic.py (synthetic data: nothing is
downloaded): ``hvd.elastic.KerasState`` committed by Horovod's callbacks, the function under
``hvd.elastic.run``. On TensorFlow (KERAS_BACKEND) it imports Horovod's module,
``ringlet.hvd.tensorflow.keras``, and feeds a ``tf.data`` pipeline as the example does; on the
other backends ``ringlet.hvd.keras`` and NumPy arrays, without TensorFlow (whose LLVM cannot
share a process with torch's). Per epoch rank 0 logs one JSON line (epoch, size, rendezvous,
pid); at the end every rank writes a digest of its weights to LOG.weights.RANK. --exit-schedule
maps "(epoch, batch)" to the slots ("host[local_rank]") killed there, each once (a marker file
remembers it)."""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import signal
from pathlib import Path

import keras
import numpy as np

ON_TENSORFLOW = keras.backend.backend() == "tensorflow"
if ON_TENSORFLOW:
    import tensorflow as tf

    import ringlet.hvd.tensorflow.keras as hvd
else:
    import ringlet.hvd.keras as hvd

parser = argparse.ArgumentParser()
parser.add_argument("--logfile", required=True)
parser.add_argument("--epochs", type=int, default=3)
parser.add_argument("--batches-per-epoch", type=int, default=4)
parser.add_argument("--exit-schedule", default="{}")
args = parser.parse_args()

hvd.init()
slots = os.environ["RINGLET_ELASTIC_SLOTS"].split(",")
host, _, local = slots[hvd.rank()].rpartition(":")
slot = f"{host}[{local}]"
exit_schedule = json.loads(args.exit_schedule)

# The same data on every rank (a fixed seed): each rank's gradients differ by their shard only
# in Horovod's examples; here the averaged result is what matters.
rng = np.random.default_rng(7)
images = rng.standard_normal((256, 8, 8, 1)).astype(np.float32)
labels = rng.integers(0, 10, 256)
if ON_TENSORFLOW:
    data = {"x": tf.data.Dataset.from_tensor_slices((images, labels)).repeat().batch(16)}
else:  # unshuffled, so that every rank sees the same batches, as from the dataset
    data = {"x": images, "y": labels, "batch_size": 16, "shuffle": False}

model = keras.Sequential([keras.Input((8, 8, 1)), keras.layers.Conv2D(4, 3, activation="relu"),
                          keras.layers.Flatten(), keras.layers.Dense(10)])
opt = hvd.DistributedOptimizer(keras.optimizers.SGD(0.01 * hvd.size()))
model.compile(loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True), optimizer=opt)
# The optimizer's variables, for the state to keep (Horovod's example fits a step here: under
# ringletrun's driver a collective outside elastic.run is refused).
opt.build(model.trainable_variables)

state = hvd.elastic.KerasState(model, batch=0, epoch=0, rendezvous=0)


def on_state_reset() -> None:
    opt.learning_rate.assign(0.01 * hvd.size())


state.register_reset_callbacks([on_state_reset])


class KillOnSchedule(keras.callbacks.Callback):
    def on_train_batch_begin(self, batch: int, logs: object = None) -> None:
        at = str((state.epoch, batch))
        if slot not in exit_schedule.get(at, []):
            return
        marker = Path(f"{args.logfile}.exited.{slot}.{at}")
        if not marker.exists():
            marker.touch()
            os.kill(os.getpid(), signal.SIGKILL)


class LogEpochs(keras.callbacks.Callback):
    def on_epoch_end(self, epoch: int, logs: object = None) -> None:
        if hvd.rank() == 0:
            with open(args.logfile, "a") as log:
                log.write(json.dumps({"epoch": state.epoch, "size": hvd.size(),
                                      "rendezvous": state.rendezvous,
                                      "pid": os.getpid()}) + "\n")


callbacks = [KillOnSchedule(), hvd.elastic.UpdateEpochStateCallback(state),
             hvd.elastic.UpdateBatchStateCallback(state), hvd.elastic.CommitStateCallback(state),
             LogEpochs()]


@hvd.elastic.run
def train(state: hvd.elastic.KerasState) -> None:
    state.rendezvous += 1
    state.model.fit(**data, steps_per_epoch=args.batches_per_epoch,
                    epochs=args.epochs - state.epoch, callbacks=callbacks, verbose=0)


train(state)
digest = hashlib.sha256(b"".join(np.asarray(w).tobytes() for w in model.get_weights()))
Path(f"{args.logfile}.weights.{hvd.rank()}").write_text(digest.hexdigest())
