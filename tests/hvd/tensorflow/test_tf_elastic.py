"""ringlet.hvd.tensorflow.elastic under mpirun: TensorFlowState's save, restore, sync and
snapshot of plain variables, and TensorFlowKerasState as KerasState
(horovod/tensorflow/elastic.py)."""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

import ringlet.hvd.tensorflow as hvd


@pytest.fixture(autouse=True)
def _init() -> None:
    hvd.init()


def test_tensorflow_state_restores_syncs_and_snapshots_its_variables() -> None:
    variables = [tf.Variable(np.full(3, float(hvd.rank()))), tf.Variable(hvd.rank())]
    state = hvd.elastic.TensorFlowState(variables, step=hvd.rank())
    state.sync()
    assert np.array_equal(variables[0].numpy(), np.zeros(3)) and variables[1].numpy() == 0
    assert state.step == 0
    variables[0].assign(np.ones(3))
    state.save()
    variables[0].assign(np.full(3, 7.0))
    state.restore()
    assert np.array_equal(variables[0].numpy(), np.ones(3))
    other = [tf.Variable(np.zeros(3)), tf.Variable(5)]
    fresh = hvd.elastic.TensorFlowState(other, step=9)
    fresh.load_snapshot(state.snapshot())
    assert np.array_equal(other[0].numpy(), np.ones(3)) and fresh.step == 0


def test_tensorflow_state_refuses_nothing_to_keep_and_tf1_sessions() -> None:
    with pytest.raises(ValueError, match="needs the variables to keep"):
        hvd.elastic.TensorFlowState([])
    with pytest.raises(ValueError, match="TensorFlow 1's"):
        hvd.elastic.TensorFlowState([tf.Variable(1.0)], session=object())


def test_tensorflow_keras_state_is_the_keras_state() -> None:
    import keras

    model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
    model.compile(optimizer="sgd", loss="mse")
    state = hvd.elastic.TensorFlowKerasState(model, epoch=3)
    state.sync()
    assert state.epoch == 3 and isinstance(state, hvd.elastic.State)
