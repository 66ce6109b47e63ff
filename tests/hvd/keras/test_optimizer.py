"""hvd.DistributedOptimizer on the Keras backend in use: the update a rank applies is the one
NumPy computes from every rank's gradients (each rank rebuilds the others' data from seeds),
inside Keras' compiled train step and through ``optimizer.apply``."""

from __future__ import annotations

import keras
import numpy as np
import pytest

import ringlet.hvd as plain_hvd
import ringlet.hvd.keras as hvd
from ringlet.hvd.keras import _backends

BACKEND = keras.backend.backend()

LR = 0.1


def data(rank: int, seed: int = 7, rows: int = 5) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng([seed, rank])
    return (rng.normal(size=(rows, 4)).astype(np.float32),
            rng.normal(size=(rows, 3)).astype(np.float32))


def mse_gradients(weights: list[np.ndarray], x: np.ndarray, y: np.ndarray) -> list[np.ndarray]:
    """The gradient of Keras' "mse" of Dense(3) (mean over every element), in float64."""
    kernel, bias = (w.astype(np.float64) for w in weights)
    residual = x.astype(np.float64) @ kernel + bias - y
    scale = 2.0 / residual.size
    return [scale * x.T.astype(np.float64) @ residual, scale * residual.sum(axis=0)]


def linear_model(optimizer: keras.optimizers.Optimizer, seed: int = 0,
                 **compile_args) -> keras.Model:
    keras.utils.set_random_seed(seed)
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(3)])
    model.compile(optimizer=optimizer, loss="mse", **compile_args)
    return model


def weights(model: keras.Model) -> list[np.ndarray]:
    return [np.asarray(w) for w in model.get_weights()]


def assert_same_on_every_rank(comm, arrays: list[np.ndarray]) -> None:
    mine = b"".join(a.tobytes() for a in arrays)
    assert all(other == mine for other in comm.allgather(mine))


COMPILED = ["auto"] + ([False] if BACKEND != "torch" else [])


@pytest.mark.parametrize("jit_compile", COMPILED)
@pytest.mark.parametrize("op", ["Average", "Sum"])
def test_a_train_step_applies_every_ranks_gradients_reduced(comm, rank, size, op, jit_compile):
    model = linear_model(hvd.DistributedOptimizer(keras.optimizers.SGD(LR), op=getattr(hvd, op)),
                         jit_compile=jit_compile)
    before = weights(model)
    model.train_on_batch(*data(rank))
    every = [mse_gradients(before, *data(r)) for r in range(size)]
    reduce = np.mean if op == "Average" else np.sum
    expected = [w - LR * reduce([g[i] for g in every], axis=0) for i, w in enumerate(before)]
    after = weights(model)
    for got, want in zip(after, expected):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    assert_same_on_every_rank(comm, after)


@pytest.mark.parametrize("average_aggregated", [False, True])
def test_backward_passes_per_step_sums_locally_and_reduces_every_nth_pass(comm, rank, size,
                                                                           average_aggregated):
    optimizer = hvd.DistributedOptimizer(keras.optimizers.SGD(LR), backward_passes_per_step=2,
                                         average_aggregated_gradients=average_aggregated)
    model = linear_model(optimizer)
    start = weights(model)
    model.train_on_batch(*data(rank, seed=1))
    for got, want in zip(weights(model), start):  # first pass: summed here, nothing applied
        np.testing.assert_array_equal(got, want)
    assert int(keras.ops.convert_to_numpy(optimizer.iterations)) == 1  # as Horovod's
    model.train_on_batch(*data(rank, seed=2))
    passes = [[mse_gradients(start, *data(r, seed=s)) for r in range(size)] for s in (1, 2)]
    expected = []
    for i, w in enumerate(start):
        total = sum(np.mean([g[i] for g in every], axis=0) for every in passes)
        expected.append(w - LR * total / (2 if average_aggregated else 1))
    second = weights(model)
    for got, want in zip(second, expected):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    assert_same_on_every_rank(comm, second)
    model.train_on_batch(*data(rank, seed=3))  # the sums were reset: a first pass again
    for got, want in zip(weights(model), second):
        np.testing.assert_array_equal(got, want)
    assert int(keras.ops.convert_to_numpy(optimizer.iterations)) == 3


def three_layers() -> list[keras.Variable]:
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(3), keras.layers.Dense(2),
                              keras.layers.Dense(1)])
    return list(model.trainable_variables)


def integer_gradients(variables: list[keras.Variable], rank: int) -> list[np.ndarray]:
    """Small integers: every average over 2 ranks is exact in float32."""
    return [np.full(v.shape, 2 * (rank + 1) * (i + 1), np.float32)
            for i, v in enumerate(variables)]


def apply_and_expect(optimizer, rank: int, size: int) -> list[keras.Variable]:
    variables = three_layers()
    before = [np.asarray(keras.ops.convert_to_numpy(v.value)) for v in variables]
    grads = integer_gradients(variables, rank)
    optimizer.apply([keras.ops.convert_to_tensor(g) for g in grads], variables)
    every = [integer_gradients(variables, r) for r in range(size)]
    for i, (v, w) in enumerate(zip(variables, before)):
        want = w - np.mean([g[i] for g in every], axis=0)
        np.testing.assert_allclose(keras.ops.convert_to_numpy(v.value), want, rtol=1e-6)
    return variables


@pytest.mark.parametrize("groups, calls", [
    (None, [6]),
    (2, [3, 3]),
    ("first and last", [2, 1, 1, 1, 1]),
])
def test_gradients_go_in_one_fused_call_or_in_the_groups_asked_for(monkeypatch, rank, size,
                                                                    groups, calls):
    seen = []
    original = _backends.grouped_allreduce

    def counting(tensors, *args, **kwargs):
        seen.append(len(tensors))
        return original(tensors, *args, **kwargs)

    monkeypatch.setattr(_backends, "grouped_allreduce", counting)
    if groups == "first and last":
        variables = three_layers()
        optimizer = hvd.DistributedOptimizer(keras.optimizers.SGD(1.0),
                                             groups=[[variables[0], variables[-1]]])
        grads = integer_gradients(variables, rank)
        optimizer.apply([keras.ops.convert_to_tensor(g) for g in grads], variables)
    else:
        apply_and_expect(hvd.DistributedOptimizer(keras.optimizers.SGD(1.0), groups=groups),
                         rank, size)
    assert seen == calls


def test_num_groups_is_groups_with_horovods_deprecation_warning(rank, size):
    with pytest.warns(DeprecationWarning, match="num_groups"):
        optimizer = hvd.DistributedOptimizer(keras.optimizers.SGD(1.0), num_groups=2)
    apply_and_expect(optimizer, rank, size)


def test_gradient_predivide_factor_still_averages(rank, size):
    apply_and_expect(hvd.DistributedOptimizer(keras.optimizers.SGD(1.0),
                                              gradient_predivide_factor=2.0), rank, size)


@pytest.mark.parametrize("compression, expected", [
    ("none", 1 + 2.0 ** -12), ("fp16", 1.0), ("bf16", 1.0)])
def test_compression_sends_16_bit_floats(compression, expected):
    # 1 + 2**-12 is a float32, not a float16 nor a bfloat16: both round it to 1.
    variables = three_layers()
    optimizer = hvd.DistributedOptimizer(keras.optimizers.SGD(1.0),
                                         compression=getattr(hvd.Compression, compression))
    before = [np.asarray(keras.ops.convert_to_numpy(v.value)) for v in variables]
    grads = [np.full(v.shape, 1 + 2.0 ** -12, np.float32) for v in variables]
    optimizer.apply([keras.ops.convert_to_tensor(g) for g in grads], variables)
    for v, w in zip(variables, before):
        got = keras.ops.convert_to_numpy(v.value)
        assert got.dtype == np.float32
        np.testing.assert_array_equal(got, (w - np.float32(expected)).astype(np.float32))


def test_a_process_set_reduces_over_its_members_only(rank, size):
    if size < 2:
        pytest.skip("a set of rank 0 alone is the global set at 1 rank")
    alone = hvd.add_process_set([0])
    try:
        # Rank 0 averages over itself; the others are outside the set: their own step. Either
        # way, each rank's own gradient (averaged over all ranks, it would differ).
        variables = three_layers()
        optimizer = hvd.DistributedOptimizer(keras.optimizers.SGD(1.0), process_set=alone)
        before = [np.asarray(keras.ops.convert_to_numpy(v.value)) for v in variables]
        grads = integer_gradients(variables, rank)
        optimizer.apply([keras.ops.convert_to_tensor(g) for g in grads], variables)
        for v, w, g in zip(variables, before, grads):
            np.testing.assert_allclose(keras.ops.convert_to_numpy(v.value), w - g, rtol=1e-6)
    finally:
        hvd.remove_process_set(alone)


def test_a_local_variable_keeps_its_gradient_divided_by_size(rank, size):
    variables = three_layers()
    optimizer = hvd.DistributedOptimizer(keras.optimizers.SGD(1.0))
    optimizer.register_local_var(variables[1])
    before = [np.asarray(keras.ops.convert_to_numpy(v.value)) for v in variables]
    grads = integer_gradients(variables, rank)
    optimizer.apply([keras.ops.convert_to_tensor(g) for g in grads], variables)
    every = [integer_gradients(variables, r) for r in range(size)]
    for i, (v, w) in enumerate(zip(variables, before)):
        step = grads[i] / size if i == 1 else np.mean([g[i] for g in every], axis=0)
        np.testing.assert_allclose(keras.ops.convert_to_numpy(v.value), w - step, rtol=1e-6)


def test_wrapping_adam_keeps_its_class_config_and_serialization():
    adam = keras.optimizers.Adam(learning_rate=3e-3, beta_1=0.8, amsgrad=True)
    wrapped = hvd.DistributedOptimizer(adam)
    assert type(wrapped).__name__ == "Adam"
    assert isinstance(wrapped, keras.optimizers.Adam)
    assert wrapped.get_config() == adam.get_config()
    restored = keras.optimizers.deserialize(keras.optimizers.serialize(wrapped))
    assert type(restored) is type(adam)  # loads without ringlet (torch: Keras picks its Adam)
    assert restored.get_config() == adam.get_config()


@pytest.mark.parametrize("arguments, error, words", [
    (dict(op=plain_hvd.Min), ValueError, "only supports Average and Sum"),
    (dict(op=plain_hvd.Adasum), ValueError, "only supports Average and Sum"),
    (dict(op=hvd.Sum, gradient_predivide_factor=2.0), ValueError, "op != Average"),
    (dict(backward_passes_per_step=0), ValueError, "backward_passes_per_step"),
    (dict(groups=-1), ValueError, "groups should be"),
    (dict(device_dense="/gpu:0"), ValueError, "on the CPU"),
    (dict(compression=object()), NotImplementedError, "Compression.none"),
])
def test_bad_arguments_are_refused_with_what_is_accepted(arguments, error, words):
    with pytest.raises(error, match=words):
        hvd.DistributedOptimizer(keras.optimizers.SGD(0.1), **arguments)


def test_only_keras_optimizers_are_wrapped_and_only_once():
    with pytest.raises(TypeError, match=r"keras\.optimizers\.Optimizer"):
        hvd.DistributedOptimizer(object())
    wrapped = hvd.DistributedOptimizer(keras.optimizers.SGD(0.1))
    with pytest.raises(ValueError, match="already a DistributedOptimizer"):
        hvd.DistributedOptimizer(wrapped)


@pytest.mark.skipif(BACKEND != "tensorflow", reason="XLA compilation of ringlet's op: "
                    "TensorFlow's jit_compile=True (JAX's jit is supported; torch's is eager)")
def test_xla_on_tensorflow_is_refused_with_what_to_do(rank):
    model = linear_model(hvd.DistributedOptimizer(keras.optimizers.SGD(LR)), jit_compile=True)
    with pytest.raises(ValueError, match="jit_compile=False"):
        model.train_on_batch(*data(rank))


@pytest.mark.parametrize("sparse_as_dense", [False, True])
def test_an_embeddings_gradient_is_averaged_sparse_or_dense(comm, rank, size, sparse_as_dense):
    # On TensorFlow the gradient of an embedding is a tf.IndexedSlices: allgathered (Horovod's
    # sparse average) or densified first; on JAX and PyTorch it is dense either way.
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((1,), dtype="int32"), keras.layers.Embedding(6, 2),
                              keras.layers.Flatten()])
    model.compile(optimizer=hvd.DistributedOptimizer(keras.optimizers.SGD(LR),
                                                     sparse_as_dense=sparse_as_dense),
                  loss="mse")
    table = weights(model)[0].astype(np.float64)

    def rows(r: int) -> np.ndarray:
        return np.array([[r], [r + 2], [r]], np.int32)

    model.train_on_batch(rows(rank), np.zeros((3, 2), np.float32))
    gradients = []
    for r in range(size):  # mean over the 3 x 2 outputs of e**2: 2 e / 6 per occurrence
        g = np.zeros_like(table)
        np.add.at(g, rows(r)[:, 0], 2 * table[rows(r)[:, 0]] / 6)
        gradients.append(g)
    expected = table - LR * np.mean(gradients, axis=0)
    np.testing.assert_allclose(weights(model)[0], expected, rtol=1e-5, atol=1e-7)
    assert_same_on_every_rank(comm, weights(model))


def test_a_partial_optimizers_local_layers_keep_their_gradients(comm, rank, size):
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(3), keras.layers.Dense(3)])
    local = model.layers[0]
    with pytest.raises(ValueError, match=r"keras\.layers\.Layer"):
        hvd.PartialDistributedOptimizer(keras.optimizers.SGD(LR), local_layers=[object()])
    model.compile(optimizer=hvd.PartialDistributedOptimizer(keras.optimizers.SGD(LR),
                                                            local_layers=local), loss="mse")
    before = weights(model)
    x, y = data(rank)
    grads_of = {}
    for r in range(size):  # each rank's gradients, by a single process's Keras on its data
        twin = keras.models.clone_model(model)
        twin.set_weights(before)
        twin.compile(optimizer=keras.optimizers.SGD(1.0), loss="mse")
        twin.train_on_batch(*data(r))
        grads_of[r] = [w - a for w, a in zip(before, weights(twin))]
    model.train_on_batch(x, y)
    for i, (got, w) in enumerate(zip(weights(model), before)):
        if i < 2:  # the local layer: this rank's own gradient, divided by the size
            want = w - LR * grads_of[rank][i] / size
        else:
            want = w - LR * np.mean([grads_of[r][i] for r in range(size)], axis=0)
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def test_init_matches_by_name_except_on_jax_where_only_order_can(monkeypatch, comm, rank,
                                                                 size):
    from ringlet.hvd._api import use_matching
    from ringlet.hvd._state import state

    monkeypatch.delenv("RINGLET_HVD_MATCHING", raising=False)
    use_matching("order")  # a fresh start: init reads the default again
    hvd.init()
    try:
        assert state.matching_by_name() == (BACKEND != "jax")
        model = linear_model(hvd.DistributedOptimizer(keras.optimizers.SGD(LR)))
        before = weights(model)
        model.train_on_batch(*data(rank))  # and it trains, on every backend
        assert any(not np.array_equal(a, b) for a, b in zip(weights(model), before))
        assert_same_on_every_rank(comm, weights(model))
        if BACKEND == "jax":
            # Asked for by name, JAX's step refuses on every rank, before any collective.
            use_matching("name")
            model = linear_model(hvd.DistributedOptimizer(keras.optimizers.SGD(LR)))
            with pytest.raises(RuntimeError, match="cannot run under name matching.*"
                                                   r"ringlet\.hvd\.keras\.init\(\)"):
                model.train_on_batch(*data(rank))
    finally:
        plain_hvd.barrier()
        use_matching("order")
