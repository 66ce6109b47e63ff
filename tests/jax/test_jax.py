"""ringlet.jax under mpirun: every collective inside and outside jax.jit against NumPy, pytrees,
gradients, vmap, errors inside jit (every rank raises, the ranks stay in step), and the order
of collectives in a jitted function."""

from __future__ import annotations

import re

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from jax.test_util import check_grads

import ringlet
import ringlet.jax as rj

from mpi_fixtures import ALL_DTYPES, exact_input, np_dtype, reference, same_on_every_rank

OPS = ("sum", "avg", "min", "max", "prod")
PLACES = ("eager", "jit")


def run(place: str, function, *args):
    """``function(*args)`` outside jit, or traced and compiled (a fresh jit each time)."""
    if place == "jit":
        return jax.jit(function)(*args)
    return function(*args)


def everyone(seed: int, size: int, shape, dtype: str, op: str = "sum") -> list[np.ndarray]:
    return [exact_input(seed, r, shape, dtype, op) for r in range(size)]


@pytest.mark.parametrize("place", PLACES)
@pytest.mark.parametrize("dtype", ALL_DTYPES)
@pytest.mark.parametrize("op", OPS)
def test_allreduce_matches_numpy(place, dtype, op, rank, size, comm):
    inputs = everyone(11, size, (3, 37), dtype, op)
    x = jnp.asarray(inputs[rank])
    got = run(place, lambda x: rj.allreduce(x, op), x)
    assert isinstance(got, jax.Array) and got.dtype == x.dtype and got.shape == x.shape
    np.testing.assert_array_equal(np.asarray(got), reference(inputs, op))
    assert same_on_every_rank(comm, np.asarray(got))
    np.testing.assert_array_equal(np.asarray(x), inputs[rank])  # the input is unchanged


@pytest.mark.parametrize("place", PLACES)
def test_allreduce_of_every_size_and_algorithm(place, rank, size):
    for algorithm in ("auto", *ringlet.ALGORITHMS):
        for n in (0, 1, 7, 1000, 70_001):
            inputs = everyone(n, size, (n,), "float32")
            got = run(place, lambda x, a=algorithm: rj.allreduce(x, algorithm=a),
                      jnp.asarray(inputs[rank]))
            np.testing.assert_array_equal(np.asarray(got), reference(inputs, "sum"),
                                          err_msg=f"{algorithm} n={n}")


@pytest.mark.parametrize("place", PLACES)
def test_16_bit_floats_reduce_bit_for_bit_as_in_the_numpy_api(place, rank, size, comm):
    """The same core path: float32 accumulation in every combine, 16-bit on the wire. Rank 0
    has 1, the others 3 * 2**-10 (under half of bfloat16's step at 1), so where partial sums
    are rounded to 16 bits changes the result: each algorithm must round where it does for
    NumPy arrays."""
    for dtype in ("bfloat16", "float16"):
        x = np.full(1000, 1.0 if rank == 0 else 3 * 2.0**-10, dtype=np.float32)
        x = x.astype(np_dtype(dtype))
        for algorithm in (a for a in ringlet.ALGORITHMS if a != "mpi"):
            got = run(place, lambda x, a=algorithm: rj.allreduce(x, algorithm=a),
                      jnp.asarray(x))
            assert got.dtype == np_dtype(dtype)
            want = ringlet.allreduce(x, algorithm=algorithm)
            np.testing.assert_array_equal(np.asarray(got), want, err_msg=algorithm)
            assert same_on_every_rank(comm, np.asarray(got))
    # MPI's own allreduce has no 16-bit floats: refused before anything runs, on every rank.
    with pytest.raises(ValueError, match="mpi"):
        run(place, lambda x: rj.allreduce(x, algorithm="mpi"), jnp.ones(3, jnp.bfloat16))


@pytest.mark.parametrize("place", PLACES)
def test_broadcast_from_every_root(place, rank, size):
    for root in range(size):
        inputs = everyone(root, size, (5, 2), "int32")
        got = run(place, lambda x, root=root: rj.broadcast(x, root), jnp.asarray(inputs[rank]))
        np.testing.assert_array_equal(np.asarray(got), inputs[root])


@pytest.mark.parametrize("place", PLACES)
@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "int64", "bool", "uint8", "complex64"])
def test_allgather_concatenates_in_rank_order(place, dtype, rank, size):
    inputs = [np.asarray(exact_input(3, r, (2, 3), "int32", "sum"), dtype=np_dtype(dtype)
                         if dtype in ALL_DTYPES else dtype) for r in range(size)]
    got = run(place, rj.allgather, jnp.asarray(inputs[rank]))
    np.testing.assert_array_equal(np.asarray(got), np.concatenate(inputs))


@pytest.mark.parametrize("place", PLACES)
@pytest.mark.parametrize("op", ["sum", "avg", "max"])
def test_reduce_scatter_gives_each_rank_its_rows(place, op, rank, size):
    inputs = everyone(5, size, (2 * size, 3), "float64", op)
    got = run(place, lambda x: rj.reduce_scatter(x, op), jnp.asarray(inputs[rank]))
    np.testing.assert_array_equal(np.asarray(got), reference(inputs, op)[2 * rank:2 * rank + 2])


@pytest.mark.parametrize("place", PLACES)
def test_tree_allreduce_keeps_the_structure_and_reduces_every_leaf(place, rank, size):
    def tree_of(r: int):
        return {
            "dense": [exact_input(1, r, (4, 3), "float32", "sum"),
                      exact_input(2, r, (3,), "float32", "sum")],
            "scale": (exact_input(3, r, (), "float64", "sum"),),
            "steps": exact_input(4, r, (2,), "int32", "sum"),
            "half": exact_input(5, r, (6,), "bfloat16", "sum"),
        }

    trees = [tree_of(r) for r in range(size)]
    got = run(place, lambda t: rj.tree_allreduce(t, "avg"),
              jax.tree.map(jnp.asarray, trees[rank]))
    expected = jax.tree.map(lambda *leaves: reference(list(leaves), "avg"), *trees)
    assert jax.tree.structure(got) == jax.tree.structure(expected)
    for leaf, want in zip(jax.tree.leaves(got), jax.tree.leaves(expected), strict=True):
        assert leaf.dtype == want.dtype
        np.testing.assert_array_equal(np.asarray(leaf), want)
    assert run(place, rj.tree_allreduce, {}) == {}


def test_barrier_inside_and_outside_jit(size):
    rj.barrier()

    @jax.jit
    def with_barrier(x):
        rj.barrier()
        return rj.allreduce(x)

    np.testing.assert_array_equal(np.asarray(with_barrier(jnp.ones(3))), np.full(3, size))


def test_a_jitted_function_is_compiled_once_and_reused(rank, size):
    step = jax.jit(lambda x: rj.allreduce(x, "avg") * 2)
    for i in range(5):
        got = step(jnp.full(4, float(rank + i)))
        np.testing.assert_allclose(np.asarray(got), 2 * (np.mean(range(size)) + i))
    assert step._cache_size() == 1


# Differentiation: every rank's program is part of one function of all ranks' inputs.


@pytest.mark.parametrize("op", ["sum", "avg"])
def test_check_grads_of_allreduce(op):
    # check_grads draws the same directions on every rank, so the numerical derivative
    # perturbs every rank's input alike, as the rules assume.
    check_grads(lambda x: rj.allreduce(jnp.sin(x), op) ** 2, (jnp.linspace(0.1, 1.0, 7),),
                order=1, modes=("fwd", "rev"), atol=1e-4, rtol=1e-4)
    check_grads(lambda x: jax.jit(lambda y: rj.tree_allreduce({"y": y}, op)["y"])(x) * x,
                (jnp.linspace(-1.0, 1.0, 5),), order=1, modes=("fwd", "rev"),
                atol=1e-4, rtol=1e-4)


def test_gradients_of_the_global_loss(rank, size):
    """The gradient of sum over ranks of each rank's loss, worked out by hand."""
    xs = [np.arange(1.0, 6.0) * (r + 1) for r in range(size)]
    x = jnp.asarray(xs[rank])
    total = np.sum(xs, axis=0)
    # L_r = sum(allreduce(x)**2): dL/dx_s = sum over r of 2*S = 2*N*S.
    grad = jax.jit(jax.grad(lambda x: jnp.sum(rj.allreduce(x) ** 2)))(x)
    np.testing.assert_allclose(np.asarray(grad), 2 * size * total)
    # L_r = sum(avg(x) * w_r) with w_r = r + 1: dL/dx_s = sum over r of w_r / N.
    grad = jax.grad(lambda x: jnp.sum(rj.allreduce(x, "avg") * (rank + 1)))(x)
    np.testing.assert_allclose(np.asarray(grad), np.full(5, sum(range(1, size + 1)) / size))
    # L_r = sum(broadcast(x, 0) * w_r): only the root's input matters, by the sum of the w_r.
    grad = jax.grad(lambda x: jnp.sum(rj.broadcast(x, 0) * (rank + 1)))(x)
    np.testing.assert_allclose(np.asarray(grad),
                               np.full(5, sum(range(1, size + 1)) if rank == 0 else 0.0))
    # L_r = sum(allgather(x) * c) with c the row number: rank s's rows are s*2, s*2+1.
    rows = jnp.arange(2 * size, dtype=jnp.float64)[:, None]
    grad = jax.grad(lambda x: jnp.sum(rj.allgather(x) * rows))(jnp.ones((2, 3)))
    np.testing.assert_allclose(np.asarray(grad),
                               size * np.repeat(np.arange(2.0 * rank, 2.0 * rank + 2)[:, None],
                                                3, axis=1))
    # reduce_scatter's adjoint is allgather: L_r = sum(rs(x) * (r + 1)).
    grad = jax.grad(lambda x: jnp.sum(rj.reduce_scatter(x) * (rank + 1)))(jnp.ones((size, 2)))
    np.testing.assert_allclose(np.asarray(grad),
                               np.repeat(np.arange(1.0, size + 1)[:, None], 2, axis=1))


def test_nonlinear_ops_are_not_differentiated():
    with pytest.raises(NotImplementedError, match="only 'sum' and 'avg'"):
        jax.grad(lambda x: jnp.sum(rj.allreduce(x, "max")))(jnp.ones(3))


def test_vmap(rank, size):
    inputs = everyone(9, size, (4, 3), "float32")
    batch = jnp.asarray(inputs[rank])
    summed = jax.jit(jax.vmap(rj.allreduce))(batch)
    np.testing.assert_array_equal(np.asarray(summed), reference(inputs, "sum"))
    # Each of the 3 columns gathers its own rows: column-major batch of (4,) rows.
    gathered = jax.vmap(lambda column: rj.allgather(column[:, None]), in_axes=1)(batch)
    assert gathered.shape == (3, 4 * size, 1)
    np.testing.assert_array_equal(np.asarray(gathered)[..., 0],
                                  np.concatenate(inputs).T)


# Errors.


def test_bad_arguments_raise_before_anything_runs():
    with pytest.raises(ValueError, match="unknown op 'mean'"):
        jax.jit(lambda x: rj.allreduce(x, "mean"))(jnp.ones(2))
    with pytest.raises(ValueError, match="unknown algorithm 'fast'"):
        rj.allreduce(jnp.ones(2), algorithm="fast")
    with pytest.raises(TypeError, match="cannot reduce complex64 arrays; accepted: bfloat16"):
        jax.jit(rj.allreduce)(jnp.ones(2, jnp.complex64))
    with pytest.raises(TypeError, match="cannot reduce int8"):
        rj.tree_allreduce({"a": jnp.ones(2), "b": jnp.ones(2, jnp.int8)})
    with pytest.raises(ValueError, match="divisible by the"):
        rj.reduce_scatter(jnp.ones(()))
    if ringlet.size() > 1:
        with pytest.raises(ValueError, match=r"divisible by the \d+ ranks, got shape \(\d+,\)"):
            rj.reduce_scatter(jnp.ones(ringlet.size() + 1))
    with pytest.raises(ValueError, match="root 99 is outside"):
        rj.broadcast(jnp.ones(2), 99)
    # The ranks are still in step.
    np.testing.assert_array_equal(np.asarray(rj.allreduce(jnp.ones(2))),
                                  np.full(2, ringlet.size()))


@pytest.mark.parametrize("place", PLACES)
def test_a_shape_mismatch_raises_mismatch_error_on_every_rank_and_the_ranks_stay_in_step(
        place, rank, size, comm):
    if size == 1:
        pytest.skip("needs two ranks to disagree")  # (1 rank has no one to disagree with)
    step = jax.jit(lambda x: rj.allreduce(x) + 1) if place == "jit" else rj.allreduce
    with pytest.raises(ringlet.MismatchError, match=r"float(32|64)\[3\].*float(32|64)\[4\]"):
        with rj.ringlet_errors():
            np.asarray(step(jnp.ones(3 + (rank == size - 1))))
    # The next collectives work on every rank, inside and outside jit.
    np.testing.assert_array_equal(np.asarray(jax.jit(rj.allreduce)(jnp.ones(5))),
                                  np.full(5, size))
    np.testing.assert_array_equal(np.asarray(rj.allreduce(jnp.ones(2))), np.full(2, size))


def test_a_collective_that_fails_after_it_was_dispatched_leaves_the_next_ones_working(
        rank, size):
    """The mismatch is found while the computation runs, after jit returned (its input is
    still being computed), so the error lands in the ordered effect's token too, which JAX
    hands to the next computation: unless ringlet drops it, every later collective, jitted or
    not, fails with the same error without running."""
    if size == 1:
        pytest.skip("needs two ranks to disagree")
    slow = jax.jit(lambda a: (a @ a @ a @ a).sum(axis=0))
    step = jax.jit(lambda x: rj.allreduce(x * 2))
    big = jnp.full((1500, 1500), 1e-3, jnp.float32)
    slow(big).block_until_ready()  # compiled, so that the next call only dispatches
    computed = slow(big)
    failing = step(computed[: 1500 - (rank == size - 1)])
    assert not failing.is_ready(), "the collective ran at its dispatch: nothing to check"
    with pytest.raises(ringlet.MismatchError, match=r"float32\[1500\].*float32\[1499\]"):
        with rj.ringlet_errors():
            np.asarray(failing)
    np.testing.assert_array_equal(np.asarray(step(jnp.ones(5))), np.full(5, 2 * size))
    np.testing.assert_array_equal(np.asarray(rj.allreduce(jnp.ones(2))), np.full(2, size))
    jax.effects_barrier()  # the failure is not raised again, here or at exit


def test_without_ringlet_errors_jax_reports_the_exception_by_name(rank, size):
    if size == 1:
        pytest.skip("needs two ranks to disagree")
    with pytest.raises(jax.errors.JaxRuntimeError, match=r"MismatchError: ranks disagree"):
        np.asarray(jax.jit(rj.allreduce)(jnp.ones(2 + rank)))
    np.testing.assert_array_equal(np.asarray(rj.allreduce(jnp.ones(2))), np.full(2, size))


# Order.


def test_collectives_in_a_jitted_function_are_chained_in_program_order():
    def two(x, y):
        return rj.allreduce(y, "max"), rj.allreduce(x, "sum")

    text = jax.jit(two).lower(jnp.ones(3), jnp.ones(4)).as_text()
    calls = re.findall(r"(%\S+):2 = stablehlo.custom_call @ringlet_allreduce\((%\S+), (%\S+)\)"
                       r".*op = \"(\w+)\"", text)
    assert [op for *_, op in calls] == ["max", "sum"], text
    # The second takes the token the first returns: XLA cannot run them the other way round.
    (first, _, _, _), (_, _, token, _) = calls
    assert token == f"{first}#1", text


def test_an_argument_is_reduced_from_where_it_is_and_a_computed_value_in_place(rank, size):
    """A result aliased to a jitted function's argument makes XLA copy the argument first (it
    keeps it); the allreduce reads it where it is instead. A computed value's buffer is free to
    reuse: its result stays aliased."""
    def aliases(function, x) -> list[str]:
        text = jax.jit(function).lower(x).as_text()
        return re.findall(r"custom_call @ringlet_allreduce\(.*", text)

    x = jnp.arange(6.0)
    (argument,) = aliases(lambda x: rj.allreduce(x), x)
    (computed,) = aliases(lambda x: rj.allreduce(x + 1), x)
    assert "output_operand_aliases" not in argument, argument
    assert "output_operand_aliases" in computed, computed
    for n in (1000, 700_001):  # shm's one-shot, and its two-shot over segments
        inputs = everyone(n, size, (n,), "float32")
        given = jnp.asarray(inputs[rank])
        for function, shift in ((lambda x: rj.allreduce(x), 0), (lambda x: rj.allreduce(x + 1), 1)):
            got = jax.jit(function)(given)
            expected = reference([a + np.float32(shift) for a in inputs], "sum")
            np.testing.assert_array_equal(np.asarray(got), expected)
        np.testing.assert_array_equal(np.asarray(given), inputs[rank])  # the argument is kept


def test_collectives_keep_program_order_when_the_data_would_allow_another(rank, size):
    """On the last rank the first collective's input takes long to compute and the second's is
    ready at once, elsewhere not: were the order free, the ranks would disagree (a
    MismatchError, as the calls differ in size)."""
    slow = rank == size - 1

    @jax.jit
    def step(x, y):
        if slow:
            for _ in range(50):
                x = jnp.sin(x) @ jnp.eye(x.shape[0], dtype=x.dtype)
        return rj.allreduce(x), rj.allreduce(y)

    for _ in range(3):
        a, b = step(jnp.zeros(200), jnp.ones(3))
        np.testing.assert_array_equal(np.asarray(a), np.zeros(200))
        np.testing.assert_array_equal(np.asarray(b), np.full(3, size))


def test_jitted_and_eager_collectives_run_in_call_order(size):
    step = jax.jit(lambda x: rj.allreduce(x * 2))
    for i in range(4):
        first = step(jnp.full(8, float(i)))
        second = rj.allreduce(jnp.full(3, float(i)))
        np.testing.assert_array_equal(np.asarray(first), np.full(8, 2.0 * i * size))
        np.testing.assert_array_equal(np.asarray(second), np.full(3, i * size))


# Training helpers.


def test_average_gradients_in_an_optax_chain(rank, size):
    grads = {"w": jnp.full((3, 2), float(rank)), "b": jnp.arange(2.0) * rank}
    params = jax.tree.map(jnp.zeros_like, grads)
    optimizer = optax.chain(rj.average_gradients(), optax.sgd(1.0))
    state = optimizer.init(params)
    updates, state = jax.jit(optimizer.update)(grads, state, params)
    mean = np.mean(range(size))
    np.testing.assert_allclose(np.asarray(updates["w"]), np.full((3, 2), -mean))
    np.testing.assert_allclose(np.asarray(updates["b"]), -np.arange(2.0) * mean)


def test_broadcast_parameters_gives_every_rank_the_roots(rank, size, comm):
    params = {"w": jnp.full((2, 2), float(rank)), "n": jnp.asarray(rank)}
    got = rj.broadcast_parameters(params, root=size - 1)
    np.testing.assert_array_equal(np.asarray(got["w"]), np.full((2, 2), size - 1.0))
    assert int(got["n"]) == size - 1


def test_outside_jit_the_input_is_read_and_the_result_handed_to_jax_in_place(monkeypatch, size):
    x = jnp.arange(1 << 16, dtype=jnp.float32)
    made = []
    empty = rj._empty
    monkeypatch.setattr(rj, "_empty", lambda *args: made.append(empty(*args)) or made[-1])
    read = []
    host = rj._host
    monkeypatch.setattr(rj, "_host", lambda array: read.append(host(array)) or read[-1])
    result = rj.allreduce(x)
    np.testing.assert_array_equal(np.asarray(result), np.arange(1 << 16) * size)
    # Read where JAX keeps x, reduced into a fresh array that JAX then owns: no copy either way.
    assert read[0].ctypes.data == x.unsafe_buffer_pointer()
    assert result.unsafe_buffer_pointer() == made[0].ctypes.data


@pytest.mark.parametrize("place", PLACES)
def test_collectives_on_a_process_set(place, rank, size):
    """Each half of the ranks (even, odd) reduces, broadcasts and gathers within itself, at
    the same time as the other half."""
    even = ringlet.add_process_set(range(0, size, 2))
    odd = ringlet.add_process_set(range(1, size, 2)) if size > 1 else None
    mine, members = (even, list(range(0, size, 2))) if rank % 2 == 0 else (
        odd, list(range(1, size, 2)))
    try:
        inputs = {r: exact_input(21, r, (3, 4), "float32", "sum") for r in range(size)}
        x = jnp.asarray(inputs[rank])

        def within(x):
            return (rj.allreduce(x, "avg", process_set=mine),
                    rj.broadcast(x, root=members[-1], process_set=mine),
                    rj.allgather(x, process_set=mine),
                    rj.tree_allreduce({"x": x}, "sum", process_set=mine)["x"])

        averaged, broadcast, gathered, summed = run(place, within, x)
        ours = [inputs[r] for r in members]
        np.testing.assert_array_equal(np.asarray(averaged), reference(ours, "avg"))
        np.testing.assert_array_equal(np.asarray(broadcast), inputs[members[-1]])
        np.testing.assert_array_equal(np.asarray(gathered), np.concatenate(ours))
        np.testing.assert_array_equal(np.asarray(summed), reference(ours, "sum"))
    finally:
        for added in (even, odd):
            if added is not None:
                ringlet.remove_process_set(added)
    np.testing.assert_array_equal(np.asarray(rj.allreduce(jnp.ones(2))), np.full(2, size))


def test_the_result_shapes_are_exact_for_any_number_of_ranks():
    # 49 * (1 / 49) is 0.999... in floating point: the row counts are integer arithmetic.
    from ringlet.jax import _primitives as p

    rows = jax.ShapeDtypeStruct((49, 2), jnp.float32)
    scattered = jax.eval_shape(lambda x: p.reduce_scatter_p.bind(
        x, op="sum", size=49, algorithm="auto", process_set=0), rows)
    gathered = jax.eval_shape(lambda x: p.allgather_p.bind(
        x, size=49, algorithm="auto", process_set=0), rows)
    assert (scattered.shape, gathered.shape) == ((1, 2), (49 * 49, 2))
