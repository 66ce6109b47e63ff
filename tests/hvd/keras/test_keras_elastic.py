"""ringlet.hvd.keras.elastic on the Keras backend KERAS_BACKEND names, under mpirun:
KerasState's save, restore, sync (optimizer variables too, built or not) and snapshot, and
the elastic callbacks' bookkeeping during model.fit (horovod/_keras/elastic.py)."""

from __future__ import annotations

import keras
import numpy as np
import pytest

import ringlet.hvd.keras as hvd


@pytest.fixture(autouse=True)
def _init() -> None:
    hvd.init()


def built_model(seed: int) -> keras.Model:
    keras.utils.set_random_seed(seed)
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
    model.compile(optimizer=keras.optimizers.SGD(0.1, momentum=0.9), loss="mse")
    return model


def weights(model: keras.Model) -> list[np.ndarray]:
    return [np.array(keras.ops.convert_to_numpy(v.value)) for v in model.variables]


def test_an_unbuilt_model_is_refused() -> None:
    with pytest.raises(ValueError, match="Model must be built first"):
        hvd.elastic.KerasState(keras.Sequential([keras.layers.Dense(2)]))


def test_restore_goes_back_to_the_commit_and_sync_spreads_rank_0s() -> None:
    model = built_model(hvd.rank())
    state = hvd.elastic.KerasState(model, epoch=hvd.rank())
    state.sync()  # the optimizer has no variables yet on any rank
    reference = weights(built_model(0))
    assert all(np.array_equal(a, b) for a, b in zip(weights(model), reference, strict=True))
    assert state.epoch == 0
    model.fit(np.ones((4, 3)), np.zeros((4, 2)), epochs=1, verbose=0)
    state.epoch = 1
    state.save()
    committed = weights(model)
    model.fit(np.ones((4, 3)), np.ones((4, 2)), epochs=1, verbose=0)
    state.epoch = 2
    state.restore()
    assert all(np.array_equal(a, b) for a, b in zip(weights(model), committed, strict=True))
    assert state.epoch == 1


def test_a_snapshot_carries_the_optimizer_into_a_fresh_model() -> None:
    model = built_model(0)
    model.fit(np.ones((4, 3)), np.zeros((4, 2)), epochs=1, verbose=0)
    state = hvd.elastic.KerasState(model, batch=3)
    fresh = built_model(1)
    other = hvd.elastic.KerasState(fresh, batch=0)
    other.load_snapshot(state.snapshot())
    assert all(np.array_equal(a, b) for a, b in zip(weights(fresh), weights(model), strict=True))
    assert other.batch == 3
    ours = [np.array(keras.ops.convert_to_numpy(v.value)) for v in model.optimizer.variables]
    theirs = [np.array(keras.ops.convert_to_numpy(v.value)) for v in fresh.optimizer.variables]
    assert len(ours) == len(theirs) > 0
    assert all(np.array_equal(a, b) for a, b in zip(ours, theirs, strict=True))


def test_the_callbacks_count_batches_and_epochs_and_commit() -> None:
    model = built_model(0)
    state = hvd.elastic.KerasState(model, batch=0, epoch=0)
    commits = []
    state.commit = lambda: commits.append((state.epoch, state.batch))  # type: ignore[method-assign]
    model.fit(np.ones((8, 3)), np.zeros((8, 2)), batch_size=2, epochs=2, verbose=0,
              callbacks=[hvd.elastic.UpdateBatchStateCallback(state),
                         hvd.elastic.UpdateEpochStateCallback(state),
                         hvd.elastic.CommitStateCallback(state, batches_per_commit=2)])
    assert state.epoch == 2 and state.batch == 0
    # Two commits per epoch by batch count (after batches 1 and 3), one at each epoch's end.
    assert len(commits) == 6, commits
