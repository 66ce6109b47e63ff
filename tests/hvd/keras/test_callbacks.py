"""Horovod's Keras callbacks, in model.fit on the Keras backend in use: the broadcast against
rank 0's weights, the averaged logs against NumPy, the learning rates against Horovod's
formulas."""

from __future__ import annotations

import keras
import numpy as np
import pytest

import ringlet.hvd.keras as hvd


def tiny_model(seed: int, optimizer: keras.optimizers.Optimizer) -> keras.Model:
    keras.utils.set_random_seed(seed)
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(3)])
    model.compile(optimizer=hvd.DistributedOptimizer(optimizer), loss="mse")
    return model


def tiny_data(rows: int = 8) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(3)
    return rng.normal(size=(rows, 4)).astype(np.float32), rng.normal(size=(rows, 3)).astype(
        np.float32)


def test_every_rank_starts_from_the_roots_weights(comm, rank):
    model = tiny_model(100 + rank, keras.optimizers.SGD(0.0))  # lr 0: the weights stay
    mine = model.get_weights()
    roots = comm.bcast(mine, root=0)
    assert rank == 0 or not all(np.array_equal(a, b) for a, b in zip(mine, roots))
    model.fit(*tiny_data(), batch_size=4, epochs=1, shuffle=False, verbose=0,
              callbacks=[hvd.BroadcastGlobalVariablesCallback(0)])
    for got, want in zip(model.get_weights(), roots):
        np.testing.assert_array_equal(got, want)


def test_a_local_variable_is_not_broadcast(comm, rank):
    model = tiny_model(100 + rank, keras.optimizers.SGD(0.0))
    kernel = model.trainable_variables[0]
    mine = keras.ops.convert_to_numpy(kernel.value).copy()
    model.fit(*tiny_data(), batch_size=4, epochs=1, shuffle=False, verbose=0,
              callbacks=[hvd.BroadcastGlobalVariablesCallback(0, local_variables=[kernel])])
    np.testing.assert_array_equal(model.get_weights()[0], mine)  # each rank's own, still
    roots = comm.bcast(mine, root=0)
    assert rank == 0 or not np.array_equal(mine, roots)


def test_metrics_are_averaged_over_the_ranks_in_place(size, rank):
    logs = {"loss": float(rank + 1), "accuracy": 0.25 * rank}
    hvd.MetricAverageCallback().on_epoch_end(0, logs)
    assert logs == pytest.approx({"loss": np.mean(np.arange(1, size + 1)),
                                  "accuracy": np.mean(0.25 * np.arange(size))})


def test_the_epochs_logged_loss_is_every_ranks_average(comm, rank):
    model = tiny_model(0, keras.optimizers.SGD(0.0))
    x, y = tiny_data()
    history = model.fit(x * (rank + 1), y, batch_size=8, epochs=1, verbose=0,
                        callbacks=[hvd.MetricAverageCallback()])
    own = float(np.mean((model.predict(x * (rank + 1), verbose=0) - y) ** 2))
    assert history.history["loss"][0] == pytest.approx(np.mean(comm.allgather(own)), rel=1e-5)


class LearningRates(keras.callbacks.Callback):
    """The learning rate each step uses (read after the callbacks before it have run)."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: list[float] = []

    def on_train_batch_begin(self, batch, logs=None):
        sync = getattr(self.model, "jax_state_sync", None)
        if sync is not None:
            sync()
        self.seen.append(float(keras.ops.convert_to_numpy(self.model.optimizer.learning_rate)))


def test_warmup_follows_horovods_formula(size):
    lr, warmup, steps, epochs = 0.4, 2, 3, 3
    model = tiny_model(0, keras.optimizers.SGD(lr))
    rates = LearningRates()
    model.fit(*tiny_data(12), batch_size=4, epochs=epochs, shuffle=False, verbose=0,
              callbacks=[hvd.LearningRateWarmupCallback(lr, warmup_epochs=warmup), rates])
    expected = []
    for epoch in range(epochs):
        for batch in range(steps):
            e = epoch + batch / steps + 1 / steps
            expected.append(lr / size * (e * (size - 1) / warmup + 1) if epoch < warmup
                            else expected[-1])
    assert rates.seen == pytest.approx(expected, rel=1e-6)
    assert rates.seen[-1] == pytest.approx(lr)


def test_a_staircase_schedule_multiplies_from_its_start_epoch():
    # Horovod's: initial_lr * multiplier ** (epoch - start_epoch) at each epoch's first batch
    # in [start_epoch, end_epoch); before, the optimizer's own rate; after, the last one set.
    model = tiny_model(0, keras.optimizers.SGD(1.0))
    rates = LearningRates()
    schedule = hvd.LearningRateScheduleCallback(0.4, 0.5, start_epoch=1, end_epoch=3)
    model.fit(*tiny_data(8), batch_size=4, epochs=4, shuffle=False, verbose=0,
              callbacks=[schedule, rates])
    per_epoch = [1.0, 0.4, 0.2, 0.2]
    assert rates.seen == pytest.approx([r for r in per_epoch for _ in range(2)], rel=1e-6)


def test_momentum_correction_scales_the_velocity_by_the_rate_change():
    # Horovod multiplies the momentum by new_lr / old_lr for the step after a change; scaling
    # SGD's velocity by it instead gives the same step: velocity' = momentum * (v * r) - lr' g.
    optimizer = keras.optimizers.SGD(0.4, momentum=0.9)
    model = tiny_model(0, optimizer)
    model.fit(*tiny_data(4), batch_size=4, epochs=1, verbose=0)  # a velocity
    velocity = [keras.ops.convert_to_numpy(m.value).copy() for m in model.optimizer.momentums]
    assert any(np.any(v) for v in velocity)
    schedule = hvd.LearningRateScheduleCallback(0.4, 0.5)
    schedule.set_model(model)
    schedule._adjust_learning_rate(1)
    for m, v in zip(model.optimizer.momentums, velocity):
        np.testing.assert_allclose(keras.ops.convert_to_numpy(m.value), v * 0.5, rtol=1e-6)
    schedule.momentum_correction = False
    schedule._adjust_learning_rate(2)
    for m, v in zip(model.optimizer.momentums, velocity):
        np.testing.assert_allclose(keras.ops.convert_to_numpy(m.value), v * 0.5, rtol=1e-6)


def test_a_learning_rate_schedule_is_refused_clearly():
    schedule = keras.optimizers.schedules.ExponentialDecay(0.1, 10, 0.5)
    model = tiny_model(0, keras.optimizers.SGD(schedule))
    with pytest.raises(ValueError, match="LearningRateSchedule"):
        model.fit(*tiny_data(4), batch_size=4, epochs=1, verbose=0,
                  callbacks=[hvd.LearningRateWarmupCallback(0.1)])
