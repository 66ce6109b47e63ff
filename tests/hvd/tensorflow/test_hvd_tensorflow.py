"""ringlet.hvd.tensorflow against NumPy references: every collective eagerly and inside
tf.function, their gradients (Horovod's rules), DistributedGradientTape, variables, process
sets, and the errors, which every rank raises together and which leave the ranks in step."""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

import ringlet
import ringlet.hvd.tensorflow as hvd
from ringlet.hvd.tensorflow import _kernel

from mpi_fixtures import reference, same_on_every_rank

MODES = ["eager", "function"]

TF_DTYPES = [tf.float32, tf.float64, tf.float16, tf.bfloat16, tf.int32, tf.int64, tf.int8,
             tf.uint8, tf.int16, tf.uint16]


def in_mode(mode: str, fn):
    """``fn`` as called eagerly, or traced into a tf.function (a fresh one: traced now)."""
    return fn if mode == "eager" else tf.function(fn)


def rank_input(rank: int, shape=(3, 4), dtype=np.float32, offset: int = 0) -> np.ndarray:
    """Small integers (exact in every dtype and in any sum of a few ranks)."""
    count = int(np.prod(shape))
    return ((np.arange(count) * 7 + rank * 3 + offset) % 11).reshape(shape).astype(dtype)


def all_inputs(size: int, **kwargs) -> list[np.ndarray]:
    return [rank_input(q, **kwargs) for q in range(size)]


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("op,name", [(hvd.Sum, "sum"), (hvd.Average, "avg"), (hvd.Min, "min"),
                                     (hvd.Max, "max"), (hvd.Product, "prod")])
def test_allreduce_matches_numpy(mode, op, name, rank, size):
    dtype = np.float64
    x = tf.constant(rank_input(rank, dtype=dtype))
    out = in_mode(mode, lambda t: hvd.allreduce(t, op=op))(x)
    np.testing.assert_allclose(out.numpy(), reference(all_inputs(size, dtype=dtype), name))
    assert out.dtype == x.dtype and out.shape == x.shape


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("dtype", TF_DTYPES, ids=lambda d: d.name)
def test_allreduce_sum_of_every_dtype(mode, dtype, rank, size):
    x = tf.cast(tf.constant(rank_input(rank, dtype=np.int64)), dtype)
    out = in_mode(mode, lambda t: hvd.allreduce(t, op=hvd.Sum))(x)
    expected = np.sum(all_inputs(size, dtype=np.int64), axis=0)
    assert out.dtype == dtype
    np.testing.assert_array_equal(tf.cast(out, tf.float64).numpy(), expected.astype(np.float64))


def test_narrow_integers_wrap_as_horovods_sums_do(rank, size):
    x = tf.constant(np.full(4, 200, dtype=np.uint8))
    out = hvd.allreduce(x, op=hvd.Sum)
    assert out.dtype == tf.uint8
    np.testing.assert_array_equal(out.numpy(), np.full(4, (200 * size) % 256, dtype=np.uint8))


@pytest.mark.parametrize("mode", MODES)
def test_average_of_integers_truncates(mode, rank, size):
    x = tf.constant(rank_input(rank, dtype=np.int32) - 5)
    out = in_mode(mode, lambda t: hvd.allreduce(t))(x)
    np.testing.assert_array_equal(out.numpy(),
                                  reference([a - 5 for a in all_inputs(size, dtype=np.int32)],
                                            "avg"))


@pytest.mark.parametrize("mode", MODES)
def test_pre_and_postscale(mode, rank, size):
    x = tf.constant(rank_input(rank, dtype=np.float64))
    out = in_mode(mode, lambda t: hvd.allreduce(t, op=hvd.Sum, prescale_factor=0.5,
                                                postscale_factor=3.0))(x)
    expected = np.sum(all_inputs(size, dtype=np.float64), axis=0) * 0.5 * 3.0
    np.testing.assert_allclose(out.numpy(), expected)


@pytest.mark.parametrize("mode", MODES)
def test_fp16_compression_keeps_the_dtype(mode, rank, size):
    x = tf.constant(rank_input(rank, dtype=np.float32))
    out = in_mode(mode, lambda t: hvd.allreduce(t, op=hvd.Sum,
                                                compression=hvd.Compression.fp16))(x)
    assert out.dtype == tf.float32
    np.testing.assert_allclose(out.numpy(), np.sum(all_inputs(size), axis=0))


@pytest.mark.parametrize("mode", MODES)
def test_grouped_allreduce_of_mixed_dtypes(mode, rank, size):
    dtypes = [np.float32, np.float64, np.int32]
    xs = [tf.constant(rank_input(rank, shape=(i + 2,), dtype=d)) for i, d in enumerate(dtypes)]
    outs = in_mode(mode, lambda *ts: hvd.grouped_allreduce(list(ts), op=hvd.Sum))(*xs)
    for i, (d, out) in enumerate(zip(dtypes, outs)):
        assert out.dtype == tf.as_dtype(d)
        np.testing.assert_array_equal(out.numpy(),
                                      reference(all_inputs(size, shape=(i + 2,), dtype=d), "sum"))


def test_a_variable_is_reduced_and_left_unchanged(rank, size):
    v = tf.Variable(rank_input(rank))
    out = hvd.allreduce(v, op=hvd.Sum)
    np.testing.assert_array_equal(out.numpy(), np.sum(all_inputs(size), axis=0))
    np.testing.assert_array_equal(v.numpy(), rank_input(rank))


@pytest.fixture
def numpy_function_graphs(monkeypatch):
    """Graphs built as where ringlet's compiled operation cannot be: with tf.numpy_function."""
    monkeypatch.setattr(_kernel, "allreduce_op", lambda: None)


@pytest.fixture
def written_by_the_operation(monkeypatch):
    """Each run of a compiled allreduce operation traced from now on: its inputs' and its
    results' addresses, as the operation handed them to Python."""
    runs = []
    register = _kernel.register

    def recorded(compute, dtypes):
        def run(arrays, results):
            runs.append([(a.ctypes.data, r.ctypes.data) for a, r in zip(arrays, results)])
            compute(arrays, results)
        return register(run, dtypes)

    monkeypatch.setattr(_kernel, "register", recorded)
    return runs


def op_types(function, *args) -> list[str]:
    return [node.op for node in function.get_concrete_function(*args).graph.as_graph_def().node]


@pytest.mark.parametrize("mode", MODES)
def test_results_are_the_buffer_ringlet_wrote_without_a_copy(mode, rank, size, monkeypatch,
                                                             numpy_function_graphs):
    """The aligned buffer the reduction wrote is the memory of the tensor TensorFlow returns:
    eagerly through DLPack, in a function (built with tf.numpy_function) as its output."""
    written = []
    allocate = ringlet.aligned_empty

    def recorded(*args, **kwargs):
        array = allocate(*args, **kwargs)
        written.append(array.ctypes.data)
        return array

    monkeypatch.setattr(ringlet, "aligned_empty", recorded)
    x = tf.constant(rank_input(rank, shape=(1 << 16,)))
    function = in_mode(mode, lambda t: hvd.allreduce(t, op=hvd.Sum))
    out = function(x)
    np.testing.assert_array_equal(out.numpy(), np.sum(all_inputs(size, shape=(1 << 16,)), 0))
    assert written and out._numpy().ctypes.data == written[-1]
    assert written[-1] % 64 == 0
    if mode == "function":
        assert "PyFunc" in op_types(function, x)


def test_a_functions_results_reuse_its_buffers_once_freed_and_never_while_held(
        rank, size, monkeypatch, numpy_function_graphs):
    """A graph op (tf.numpy_function) writes into the arrays it returned before once
    TensorFlow has freed their tensors (no fresh pages per step), and never into one a live
    tensor still holds."""
    made = []
    allocate = ringlet.aligned_empty
    monkeypatch.setattr(ringlet, "aligned_empty", lambda *a, **k: made.append(a) or allocate(
        *a, **k))
    shapes = [(1 << 16,), (5,), (3, 7)]
    step = tf.Variable(0.0)
    xs = [tf.constant(rank_input(rank, shape=s)) for s in shapes]

    @tf.function
    def reduce():
        return hvd.grouped_allreduce([x + step for x in xs], op=hvd.Sum)

    def expected(k: float) -> list[np.ndarray]:
        return [np.sum(all_inputs(size, shape=s), 0) + size * k for s in shapes]

    held = reduce()
    for k in range(1, 6):
        step.assign(float(k))
        results = reduce()
        for result, want in zip(results, expected(k)):
            np.testing.assert_array_equal(result.numpy(), want)
        del results, result
    # The held results are intact, and the other calls took turns in one more set of buffers.
    for result, want in zip(held, expected(0)):
        np.testing.assert_array_equal(result.numpy(), want)
    assert len(made) == 2 * len(shapes), made


@pytest.mark.parametrize("single", [True, False], ids=["allreduce", "grouped"])
def test_a_function_reduces_the_tensors_it_computed_in_place(single, rank, size,
                                                             written_by_the_operation):
    """Gradients computed in the function are nobody else's: ringlet's compiled operation
    reduces them where TensorFlow put them, and returns that memory."""
    shapes = [(1 << 16,), (5,), (3, 7)][:1 if single else 3]
    xs = [tf.constant(rank_input(rank, shape=s)) for s in shapes]

    @tf.function
    def reduce(*ts):
        computed = [t * 2.0 for t in ts]
        if single:
            return [hvd.allreduce(computed[0], op=hvd.Sum)]
        return hvd.grouped_allreduce(computed, op=hvd.Sum)

    assert "RingletAllreduce" in op_types(reduce, *xs)
    assert "PyFunc" not in op_types(reduce, *xs)
    for _ in range(3):
        outs = reduce(*xs)
        for out, s in zip(outs, shapes):
            np.testing.assert_array_equal(out.numpy(), 2 * np.sum(all_inputs(size, shape=s), 0))
    assert written_by_the_operation and all(
        source == result for source, result in written_by_the_operation[-1])
    assert outs[0]._numpy().ctypes.data == written_by_the_operation[-1][0][1]


def test_a_compiled_operation_keeps_its_results_and_never_writes_a_held_one(
        rank, size, written_by_the_operation):
    """Inputs someone else holds (constants) are only read: the operation writes results it
    keeps from call to call, reused once TensorFlow has freed them, never while held, and
    TensorFlow returns them without a copy."""
    shapes = [(1 << 16,), (5,), (3, 7)]
    xs = [tf.constant(rank_input(rank, shape=s)) for s in shapes]

    @tf.function
    def reduce():
        return hvd.grouped_allreduce(xs, op=hvd.Sum)

    expected = [np.sum(all_inputs(size, shape=s), 0) for s in shapes]
    held = reduce()
    for _ in range(5):
        results = reduce()
        for result, want in zip(results, expected):
            np.testing.assert_array_equal(result.numpy(), want)
        assert results[0]._numpy().ctypes.data == written_by_the_operation[-1][0][1]
        del results, result
    for held_result, want in zip(held, expected):
        np.testing.assert_array_equal(held_result.numpy(), want)
    for x, s in zip(xs, shapes):
        np.testing.assert_array_equal(x.numpy(), rank_input(rank, shape=s))
    runs = written_by_the_operation
    assert len(runs) == 6
    for i in range(len(shapes)):
        assert all(run[i][0] != run[i][1] for run in runs)  # never in place
        results = {run[i][1] for run in runs}
        # The held one, and one more the other five calls took turns in.
        assert len(results) == 2, results
        assert runs[0][i][1] == held[i]._numpy().ctypes.data


def test_without_a_compiler_graphs_fall_back_with_one_warning(rank, size, tmp_path,
                                                              monkeypatch):
    """Where the operation cannot be built, a function still reduces, through
    tf.numpy_function, and says once why."""
    monkeypatch.setattr(_kernel, "_use_operation", None)  # decided again
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / f"rank{rank}"))  # nothing built there
    monkeypatch.setenv("CXX", str(tmp_path / "no-such-compiler"))
    x = tf.constant(rank_input(rank))
    reduce = tf.function(lambda t: hvd.allreduce(t * 1.0, op=hvd.Sum))
    with pytest.warns(RuntimeWarning, match="could not build .*no C..? compiler"):
        traced = op_types(reduce, x)
    assert "PyFunc" in traced and "RingletAllreduce" not in traced
    np.testing.assert_array_equal(reduce(x).numpy(), np.sum(all_inputs(size), 0))
    assert _kernel.allreduce_op() is None


def test_the_ranks_build_the_operation_once_and_every_rank_loads_it(rank, size, comm,
                                                                    monkeypatch, tmp_path):
    """An empty cache shared by every rank (one machine): one rank compiles under the lock,
    the others wait for its build, and the operation then reduces (TensorFlow registers it
    once per process: where an earlier test loaded it, that one runs)."""
    cache = comm.bcast(str(tmp_path / "shared-cache") if rank == 0 else None, root=0)
    monkeypatch.setenv("XDG_CACHE_HOME", cache)
    path = _kernel.library_path()
    assert str(path).startswith(cache) and not path.exists()
    comm.Barrier()
    monkeypatch.setattr(_kernel, "_use_operation", None)  # decided again
    assert _kernel.allreduce_op() is not None  # built or loaded, without a warning
    assert path.exists() and len(list(path.parent.glob("*.so"))) == 1  # no partial builds left
    x = tf.constant(rank_input(rank))
    reduce = tf.function(lambda t: hvd.allreduce(t * 2.0, op=hvd.Sum))
    assert "RingletAllreduce" in op_types(reduce, x)
    np.testing.assert_array_equal(reduce(x).numpy(), 2 * np.sum(all_inputs(size), 0))


def test_ringlet_tf_kernel_0_builds_graphs_with_numpy_function(rank, size, monkeypatch):
    monkeypatch.setattr(_kernel, "_use_operation", None)  # decided again
    monkeypatch.setenv("RINGLET_TF_KERNEL", "0")
    x = tf.constant(rank_input(rank))
    reduce = tf.function(lambda t: hvd.allreduce(t * 1.0, op=hvd.Sum))
    assert "PyFunc" in op_types(reduce, x)
    np.testing.assert_array_equal(reduce(x).numpy(), np.sum(all_inputs(size), 0))


def test_collectives_in_a_function_run_in_program_order(rank, size):
    """Two independent collectives of different shapes: were they to run in another order
    on some rank, the ranks would disagree on shapes (MismatchError) or hang."""

    @tf.function
    def many(a, b):
        outs = []
        for i in range(6):
            outs.append(hvd.allreduce(a * float(i), op=hvd.Sum))
            outs.append(hvd.allgather(b))
        return outs

    a = tf.constant(rank_input(rank, shape=(5,)))
    b = tf.constant(rank_input(rank, shape=(2, 3)))
    outs = many(a, b)
    for i in range(6):
        np.testing.assert_allclose(outs[2 * i].numpy(),
                                   np.sum(all_inputs(size, shape=(5,)), axis=0) * i)
        np.testing.assert_array_equal(outs[2 * i + 1].numpy(),
                                      np.concatenate(all_inputs(size, shape=(2, 3))))


@pytest.mark.parametrize("mode", MODES)
def test_allgather_of_different_row_counts(mode, rank, size):
    x = tf.constant(rank_input(rank, shape=(rank + 1, 2)))
    out = in_mode(mode, hvd.allgather)(x)
    expected = np.concatenate([rank_input(q, shape=(q + 1, 2)) for q in range(size)])
    np.testing.assert_array_equal(out.numpy(), expected)


@pytest.mark.parametrize("mode", MODES)
def test_broadcast_from_each_root(mode, rank, size):
    for root in range(size):
        out = in_mode(mode, lambda t, root=root: hvd.broadcast(t, root))(
            tf.constant(rank_input(rank)))
        np.testing.assert_array_equal(out.numpy(), rank_input(root))


@pytest.mark.parametrize("mode", MODES)
def test_reducescatter_gives_each_rank_its_rows(mode, rank, size):
    rows = 2 * size + 1
    x = tf.constant(rank_input(rank, shape=(rows, 3), dtype=np.float64))
    out = in_mode(mode, lambda t: hvd.reducescatter(t, op=hvd.Sum))(x)
    total = np.sum(all_inputs(size, shape=(rows, 3), dtype=np.float64), axis=0)
    counts = [rows // size + (1 if q < rows % size else 0) for q in range(size)]
    start = sum(counts[:rank])
    np.testing.assert_array_equal(out.numpy(), total[start:start + counts[rank]])


@pytest.mark.parametrize("mode", MODES)
def test_alltoall_with_splits(mode, rank, size):
    splits = [q + 1 for q in range(size)]
    x = tf.constant(np.concatenate([np.full((s, 2), 10 * rank + q, np.float32)
                                    for q, s in enumerate(splits)]))
    out, received = in_mode(mode, lambda t: hvd.alltoall(t, splits=splits))(x)
    np.testing.assert_array_equal(received.numpy(), [rank + 1] * size)
    expected = np.concatenate([np.full((rank + 1, 2), 10 * q + rank, np.float32)
                               for q in range(size)])
    np.testing.assert_array_equal(out.numpy(), expected)


# ---- gradients ------------------------------------------------------------------------------


@pytest.mark.parametrize("mode", MODES)
def test_allreduce_gradient_is_the_allreduce_of_the_gradient(mode, rank, size):
    x = tf.Variable(rank_input(rank, dtype=np.float64))

    def grad():
        with tf.GradientTape() as tape:
            y = hvd.allreduce(x * (rank + 1.0), op=hvd.Sum)
            loss = tf.reduce_sum(y)
        return tape.gradient(loss, x)

    g = in_mode(mode, grad)()
    # d(sum_q (x_q * (q+1))) / dx_me through the adjoint: the summed output gradient, scaled.
    np.testing.assert_allclose(g.numpy(), np.full((3, 4), size * (rank + 1.0)))


@pytest.mark.parametrize("mode", MODES)
def test_allgather_gradient_is_this_ranks_rows_of_the_average(mode, rank, size):
    x = tf.Variable(rank_input(rank, shape=(rank + 1, 2), dtype=np.float64))
    weights = tf.constant(np.arange(sum(q + 1 for q in range(size)) * 2,
                                    dtype=np.float64).reshape(-1, 2))

    def grad():
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(hvd.allgather(x) * weights)
        return tape.gradient(loss, x)

    g = in_mode(mode, grad)()
    start = sum(q + 1 for q in range(rank))
    np.testing.assert_allclose(g.numpy(), weights.numpy()[start:start + rank + 1])


@pytest.mark.parametrize("mode", MODES)
def test_broadcast_gradient_goes_to_the_root(mode, rank, size):
    x = tf.Variable(rank_input(rank, dtype=np.float64))

    def grad():
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(hvd.broadcast(x, 0) * 2.0)
        return tape.gradient(loss, x)

    g = in_mode(mode, grad)()
    np.testing.assert_allclose(g.numpy(), np.full((3, 4), 2.0 if rank == 0 else 0.0))


@pytest.mark.parametrize("mode", MODES)
def test_reducescatter_gradient_gathers(mode, rank, size):
    rows = 2 * size
    x = tf.Variable(rank_input(rank, shape=(rows, 2), dtype=np.float64))

    def grad():
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(hvd.reducescatter(x, op=hvd.Average) * (rank + 1.0))
        return tape.gradient(loss, x)

    g = in_mode(mode, grad)()
    expected = np.concatenate([np.full((2, 2), q + 1.0) for q in range(size)])
    np.testing.assert_allclose(g.numpy(), expected)


@pytest.mark.parametrize("mode", MODES)
def test_alltoall_gradient_goes_back(mode, rank, size):
    x = tf.Variable(rank_input(rank, shape=(size, 2), dtype=np.float64))

    def grad():
        with tf.GradientTape() as tape:
            out, _ = hvd.alltoall(x, splits=[1] * size)
            loss = tf.reduce_sum(out * (rank + 1.0))
        return tape.gradient(loss, x)

    g = in_mode(mode, grad)()
    # Row q went to rank q, whose loss weighs it by q + 1.
    np.testing.assert_allclose(g.numpy(), np.repeat(np.arange(1.0, size + 1)[:, None], 2, 1))


# ---- DistributedGradientTape, variables -----------------------------------------------------


def local_gradients(rank: int, w: np.ndarray) -> np.ndarray:
    return 2.0 * w * (rank + 1.0)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("groups", [None, 2, "lists"])
def test_distributed_gradient_tape_averages(mode, groups, rank, size):
    shapes = [(3,), (2, 2), (4,)]
    ws = [tf.Variable(np.full(s, 1.5), dtype=tf.float64) for s in shapes]
    grouping = [[ws[0], ws[2]]] if groups == "lists" else groups

    def grad():
        with tf.GradientTape() as tape:
            loss = sum(tf.reduce_sum(w * w) * (rank + 1.0) for w in ws)
        tape = hvd.DistributedGradientTape(tape, groups=grouping)
        return tape.gradient(loss, ws)

    gs = in_mode(mode, grad)()
    mean = np.mean([q + 1.0 for q in range(size)])
    for g, s in zip(gs, shapes):
        np.testing.assert_allclose(g.numpy(), np.full(s, 3.0 * mean))


def test_tape_predivide_factor_and_local_sources(rank, size):
    shared, local = tf.Variable([1.0, 2.0]), tf.Variable([4.0])
    with tf.GradientTape() as tape:
        loss = (tf.reduce_sum(shared) + tf.reduce_sum(local)) * (rank + 1.0)
    tape = hvd.DistributedGradientTape(tape, gradient_predivide_factor=2.0)
    tape.register_local_source(local)
    g_shared, g_local = tape.gradient(loss, [shared, local])
    np.testing.assert_allclose(g_shared.numpy(), np.full(2, np.mean(np.arange(1.0, size + 1))),
                               rtol=1e-6)
    np.testing.assert_allclose(g_local.numpy(), [(rank + 1.0) / size], rtol=1e-6)


def test_tape_keeps_a_missing_gradient_none(rank, size):
    used, unused = tf.Variable([1.0]), tf.Variable([1.0])
    with tf.GradientTape() as tape:
        loss = tf.reduce_sum(used) * (rank + 1.0)
    g_used, g_unused = hvd.DistributedGradientTape(tape).gradient(loss, [used, unused])
    assert g_unused is None
    np.testing.assert_allclose(g_used.numpy(), [np.mean(np.arange(1.0, size + 1))])


def test_sparse_gradients_are_allgathered(rank, size):
    table = tf.Variable(np.zeros((size + 1, 2)))
    with tf.GradientTape() as tape:
        loss = tf.reduce_sum(tf.gather(table, [rank]) + 1.0)
    g = hvd.DistributedGradientTape(tape).gradient(loss, [table])[0]
    assert isinstance(g, tf.IndexedSlices)
    dense = tf.convert_to_tensor(g).numpy()
    expected = np.zeros((size + 1, 2))
    expected[:size] = 1.0 / size
    np.testing.assert_allclose(dense, expected)


@pytest.mark.parametrize("mode", MODES)
def test_broadcast_variables_assigns_the_roots_values(mode, rank, size):
    vs = [tf.Variable(rank_input(rank)), tf.Variable(rank_input(rank, shape=(2,),
                                                                dtype=np.int64))]
    def assign() -> None:
        hvd.broadcast_variables(vs, root_rank=size - 1)

    in_mode(mode, assign)()
    np.testing.assert_array_equal(vs[0].numpy(), rank_input(size - 1))
    np.testing.assert_array_equal(vs[1].numpy(), rank_input(size - 1, shape=(2,),
                                                            dtype=np.int64))


def test_training_with_the_tape_keeps_weights_identical(rank, size, comm):
    tf.random.set_seed(rank)  # different initial weights: the broadcast makes them equal
    model = tf.keras.Sequential([tf.keras.Input((4,)), tf.keras.layers.Dense(3),
                                 tf.keras.layers.Dense(1)])
    opt = tf.keras.optimizers.SGD(0.1)
    hvd.broadcast_variables(model.variables, root_rank=0)
    data = np.random.default_rng(rank).normal(size=(8, 4)).astype(np.float32)

    @tf.function
    def step(x):
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(model(x) ** 2)
        tape = hvd.DistributedGradientTape(tape)
        grads = tape.gradient(loss, model.trainable_variables)
        opt.apply_gradients(zip(grads, model.trainable_variables))
        return loss

    for _ in range(3):
        step(tf.constant(data))
    for v in model.variables:
        assert same_on_every_rank(comm, v.numpy())


def test_legacy_optimizer_reduces_in_a_session(rank, size):
    graph = tf.Graph()
    with graph.as_default():
        w = tf.compat.v1.get_variable("w", initializer=tf.constant([1.0, 1.0]))
        loss = tf.reduce_sum(w) * (rank + 1.0)
        opt = hvd.DistributedOptimizer(tf.compat.v1.train.GradientDescentOptimizer(1.0))
        grads = opt.compute_gradients(loss, [w])
        train = opt.apply_gradients(grads)
        with tf.compat.v1.Session(graph=graph) as session:
            session.run(tf.compat.v1.global_variables_initializer())
            session.run(train)
            value = session.run(w)
    np.testing.assert_allclose(value, 1.0 - np.mean(np.arange(1.0, size + 1)))


# ---- process, process sets, objects ---------------------------------------------------------


def test_rank_and_size_ops(rank, size):
    assert int(hvd.rank_op()) == rank and int(hvd.size_op()) == size
    assert int(hvd.local_size_op()) == hvd.local_size()
    assert int(hvd.local_rank_op()) == hvd.local_rank()
    assert int(hvd.process_set_included_op()) == 1


def test_objects(rank, size):
    assert hvd.broadcast_object({"from": rank}, root_rank=0) == {"from": 0}
    assert hvd.allgather_object(rank * 2) == [2 * q for q in range(size)]


@pytest.mark.parametrize("mode", MODES)
def test_process_set_of_even_ranks(mode, rank, size):
    evens = hvd.add_process_set(list(range(0, size, 2)))
    try:
        assert int(hvd.process_set_included_op(evens.process_set_id)) == int(rank % 2 == 0)
        if rank % 2 == 0:
            x = tf.constant(rank_input(rank))
            out = in_mode(mode, lambda t: hvd.allreduce(t, op=hvd.Sum, process_set=evens))(x)
            expected = np.sum([rank_input(q) for q in range(0, size, 2)], axis=0)
            np.testing.assert_array_equal(out.numpy(), expected)
    finally:
        hvd.remove_process_set(evens)


@pytest.mark.parametrize("mode", MODES)
def test_barrier_and_join(mode, rank, size):
    in_mode(mode, hvd.barrier)()
    last = in_mode(mode, hvd.join)()
    assert 0 <= int(last) < size


# ---- errors ---------------------------------------------------------------------------------


@pytest.mark.parametrize("mode", MODES)
def test_disagreeing_shapes_raise_on_every_rank_and_keep_ranks_in_step(mode, rank, size):
    if size == 1:
        pytest.skip("one rank cannot disagree with itself")
    x = tf.constant(np.ones(rank + 2, np.float32))
    with pytest.raises((ringlet.MismatchError, tf.errors.OpError), match="disagree"):
        in_mode(mode, lambda t: hvd.allreduce(t, op=hvd.Sum))(x)
    out = hvd.allreduce(tf.constant([float(rank)]), op=hvd.Sum)
    np.testing.assert_allclose(out.numpy(), [sum(range(size))])


def test_bad_arguments_are_refused_before_anything_runs(rank, size):
    x = tf.constant([1.0])
    with pytest.raises(NotImplementedError, match="Adasum"):
        hvd.allreduce(x, op=hvd.Adasum)
    with pytest.raises(ValueError, match="unknown op"):
        hvd.allreduce(x, op=17)
    with pytest.raises(ValueError, match="supersedes average"):
        hvd.allreduce(x, average=True, op=hvd.Sum)
    with pytest.raises(ValueError, match="root_rank"):
        hvd.broadcast(x, size)
    with pytest.raises(ValueError, match="scalar"):
        hvd.allgather(tf.constant(1.0))
    with pytest.raises(ValueError, match="gradient_predivide_factor"):
        hvd.DistributedGradientTape(tf.GradientTape(), op=hvd.Sum, gradient_predivide_factor=2.0)
    with pytest.raises(TypeError, match=r"tf\.Variable"):
        hvd.broadcast_(x, 0)
    with pytest.raises(TypeError, match=r"ringlet\.hvd\.tensorflow\.keras"):
        hvd.DistributedOptimizer(tf.keras.optimizers.SGD(0.1))
    with pytest.raises(tf.errors.InvalidArgumentError, match="divisible"):
        hvd.alltoall(tf.ones([2 * size + 1]))
    out = hvd.allreduce(tf.constant([float(rank)]), op=hvd.Sum)
    np.testing.assert_allclose(out.numpy(), [sum(range(size))])


def test_an_xla_compiled_function_is_refused_clearly(rank, size):
    @tf.function(jit_compile=True)
    def compiled(t):
        return hvd.allreduce(t)

    with pytest.raises(ValueError, match="XLA"):
        compiled(tf.constant([1.0]))
    out = hvd.allreduce(tf.constant([float(rank)]), op=hvd.Sum)
    np.testing.assert_allclose(out.numpy(), [sum(range(size))])


def test_alltoall_without_splits_returns_the_output_alone(rank, size):
    x = tf.constant(np.repeat(np.arange(size, dtype=np.float32)[:, None] + 10 * rank, 2, 1))
    out = hvd.alltoall(x)
    assert isinstance(out, tf.Tensor)
    np.testing.assert_array_equal(out.numpy(), np.repeat(
        np.array([10.0 * q + rank for q in range(size)], np.float32)[:, None], 2, 1))


def test_a_tensorflow_1_graph_runs_independent_collectives_in_build_order(rank, size):
    """A session may run independent operations in any order, differently on each rank:
    each collective waits for the one built before it."""
    with tf.Graph().as_default(), tf.compat.v1.Session() as session:
        built = [hvd.allreduce(tf.ones([3] * d), op=hvd.Sum) for d in (1, 2, 3)]
        values = session.run(built[::-1])
    for d, value in zip((3, 2, 1), values):
        np.testing.assert_array_equal(value, np.full([3] * d, float(size)))


def test_allreduce_of_a_variable_under_a_tape(rank, size):
    v = tf.Variable([1.0, 2.0])
    with tf.GradientTape() as tape:
        loss = tf.reduce_sum(hvd.allreduce(v, op=hvd.Sum) * 3.0)
    np.testing.assert_allclose(tape.gradient(loss, v).numpy(), [3.0 * size] * 2)


def test_broadcast_gradients_in_a_tensorflow_1_graph_run_on_every_rank(rank, size):
    """Off the root the gradient is zeros, which must still wait for the reduction the root
    waits in (constant zeros would leave the root alone in it)."""
    with tf.Graph().as_default(), tf.compat.v1.Session() as session:
        for root in range(size):
            t = tf.ones([5]) * rank
            grad = tf.gradients(hvd.broadcast(t, root), t, tf.ones([5]))[0]
            np.testing.assert_array_equal(session.run(grad),
                                          np.full(5, 1.0 if rank == root else 0.0))
