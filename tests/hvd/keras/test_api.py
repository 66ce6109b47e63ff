"""ringlet.hvd.keras's collectives on values and load_model, on the Keras backend in use,
against NumPy and against the saved model."""

from __future__ import annotations

import keras
import numpy as np
import pytest

import ringlet.hvd.keras as hvd

BACKEND = keras.backend.backend()


def mine(rank: int) -> np.ndarray:
    return np.arange(6, dtype=np.float32).reshape(3, 2) * (rank + 1)


def test_allreduce_averages_and_sums_backend_tensors(size, rank):
    every = [mine(r) for r in range(size)]
    got = hvd.allreduce(keras.ops.convert_to_tensor(mine(rank)))
    assert keras.ops.is_tensor(got)
    np.testing.assert_allclose(keras.ops.convert_to_numpy(got), np.mean(every, axis=0))
    summed = hvd.allreduce(mine(rank), op=hvd.Sum, prescale_factor=2.0)
    np.testing.assert_allclose(keras.ops.convert_to_numpy(summed), 2 * np.sum(every, axis=0))


def test_allgather_broadcast_and_reducescatter(size, rank):
    every = [mine(r)[: r + 1] for r in range(size)]
    gathered = hvd.allgather(keras.ops.convert_to_tensor(every[rank]))
    np.testing.assert_array_equal(keras.ops.convert_to_numpy(gathered), np.concatenate(every))
    root = hvd.broadcast(keras.ops.convert_to_tensor(mine(rank)), root_rank=size - 1)
    np.testing.assert_array_equal(keras.ops.convert_to_numpy(root), mine(size - 1))
    rows = np.arange(4 * size, dtype=np.float32).reshape(2 * size, 2) * (rank + 1)
    part = hvd.reducescatter(keras.ops.convert_to_tensor(rows), op=hvd.Sum)
    total = sum(np.arange(4 * size, dtype=np.float32).reshape(2 * size, 2) * (r + 1)
                for r in range(size))
    np.testing.assert_array_equal(keras.ops.convert_to_numpy(part), total[2 * rank:2 * rank + 2])


def test_broadcast_global_variables_says_what_to_use_instead():
    with pytest.raises(RuntimeError, match="BroadcastGlobalVariablesCallback"):
        hvd.broadcast_global_variables(0)


@pytest.mark.skipif(BACKEND != "tensorflow", reason="imports TensorFlow (30 s under load): "
                    "checked in the TensorFlow backend's run")
def test_the_tensorflow_keras_name_is_the_same_api():
    import ringlet.hvd.tensorflow.keras as tf_keras_hvd

    assert tf_keras_hvd.DistributedOptimizer is hvd.DistributedOptimizer
    assert tf_keras_hvd.callbacks.MetricAverageCallback is hvd.MetricAverageCallback


def test_load_model_restores_a_distributed_optimizer_with_its_state(tmp_path, comm, rank):
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(3)])
    model.compile(optimizer=hvd.DistributedOptimizer(keras.optimizers.Adam(1e-2)), loss="mse")
    rng = np.random.default_rng([5, rank])
    x, y = rng.normal(size=(8, 4)).astype(np.float32), rng.normal(size=(8, 3)).astype(np.float32)
    model.train_on_batch(x, y)
    path = tmp_path / f"model-{rank}.keras"
    model.save(path)

    loaded = hvd.load_model(path)
    assert getattr(loaded.optimizer, "_ringlet_distributed", False)
    assert isinstance(loaded.optimizer, keras.optimizers.Adam)
    for a, b in zip(loaded.optimizer.variables, model.optimizer.variables):
        np.testing.assert_array_equal(keras.ops.convert_to_numpy(a.value),
                                      keras.ops.convert_to_numpy(b.value))
    plain = keras.models.load_model(path)  # without ringlet: the plain optimizer
    assert not getattr(plain.optimizer, "_ringlet_distributed", False)

    # It keeps averaging: from the same weights, every rank's own data, the same step.
    loaded.train_on_batch(x, y)
    model.train_on_batch(x, y)
    ours = np.concatenate([w.ravel() for w in loaded.get_weights()])
    assert all(np.array_equal(ours, other) for other in comm.allgather(ours))
    np.testing.assert_array_equal(ours, np.concatenate([w.ravel() for w in model.get_weights()]))
