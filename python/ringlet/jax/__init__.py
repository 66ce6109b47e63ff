"""ringlet's collectives on JAX arrays, inside and outside ``jax.jit``.

>>> import jax, jax.numpy as jnp, ringlet.jax as rj
>>> @jax.jit
... def step(grads):
...     return rj.tree_allreduce(grads, op="avg")      # one fused collective for the pytree

Inside ``jax.jit`` (and under ``jax.grad`` or ``jax.vmap``) each collective is an XLA custom
call to ringlet's core (XLA FFI), with an ordered effect: on every rank XLA runs them in program
order, with no tokens to pass. Outside, a collective waits for JAX's pending collectives, then
runs on the array's memory as ringlet's NumPy API does and hands its result to JAX without a
copy (zero-copy both ways on CPU). The core checks that the
ranks agree on each call and watches the wait, as for NumPy arrays; bf16 and fp16 are reduced
with float32 accumulation. Sum and avg are differentiable (``jax.grad`` of a sum-allreduce is
a sum-allreduce of the cotangent), and every collective works under ``jax.vmap``.

Errors: outside ``jax.jit`` a collective raises ringlet's exceptions (``MismatchError``,
``RingletError``, ``ValueError``, ``TypeError``). Inside, XLA reports them as
``jax.errors.JaxRuntimeError`` whose message starts with the exception's name; run the jitted
function within :func:`ringlet_errors` to get ringlet's exception instead. Every rank raises
at the same call, and the ranks stay in step.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Callable, Iterator
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from .. import _core, elastic, selector
from .._allreduce import allreduce as _numpy_allreduce
from .._arrays import aligned_empty
from .._collectives import allgather as _numpy_allgather
from .._collectives import broadcast as _numpy_broadcast
from .._collectives import check_algorithm, check_root
from .._collectives import reduce_scatter as _numpy_reduce_scatter
from .._core import MismatchError, ProcessFailedError, RingletError
from .._dtypes import check_op
from .._gradients import fusion_threshold_bytes
from .._membership import Place, ProcessSet, place
from . import _primitives as p

__all__ = [
    "allgather",
    "allreduce",
    "average_gradients",
    "barrier",
    "broadcast",
    "broadcast_parameters",
    "reduce_scatter",
    "ringlet_error",
    "ringlet_errors",
    "tree_allreduce",
]

# Under ULFM, the survivors' collectives on their shrunk communicator start afresh.
elastic.on_new_membership(p.forget_failed_collectives, lambda: None)

_EXCEPTIONS: dict[str, type[Exception]] = {
    "MismatchError": MismatchError,
    "ProcessFailedError": ProcessFailedError,
    "RingletError": RingletError,
    "ValueError": ValueError,
    "TypeError": TypeError,
}
# XLA's message: "<status code>: <exception name>: <ringlet's message>".
_CARRIED = re.compile(r"^(?:[A-Z_]+: )?(" + "|".join(_EXCEPTIONS) + r"): (.*)$", re.DOTALL)


def ringlet_error(error: BaseException) -> Exception | None:
    """The ringlet exception that an XLA error carries, or None if it carries none."""
    if not isinstance(error, jax.errors.JaxRuntimeError):
        return None
    found = _CARRIED.match(str(error))
    if found is None:
        return None
    return _EXCEPTIONS[found.group(1)](found.group(2).strip())


@contextlib.contextmanager
def ringlet_errors() -> Iterator[None]:
    """Raise ringlet's own exception (``MismatchError``, ``RingletError``, ``ValueError``,
    ``TypeError``) for an error of a ringlet collective that XLA reports as
    ``jax.errors.JaxRuntimeError`` (the XLA error is its ``__cause__``). Also a decorator::

        with ringlet.jax.ringlet_errors():
            params = step(params, batch)      # a jitted function with ringlet collectives
    """
    try:
        yield
    except jax.errors.JaxRuntimeError as error:
        carried = ringlet_error(error)
        if carried is None:
            raise
        raise carried from error


def _run(bind: Callable[..., Any], *args: Any, **params: Any) -> Any:
    """Bind a primitive: traced inside jit; run now outside it, raising ringlet's errors."""
    with ringlet_errors():
        return bind(*args, **params)


def _traced(*arrays: Any) -> bool:
    """Whether a transformation (jit, grad, vmap) is tracing: the collective is then a
    primitive in the computation; otherwise it runs now, on the arrays' memory."""
    return any(isinstance(x, jax.core.Tracer) for x in arrays)


def _host(x: jax.Array) -> np.ndarray:
    """``x``'s memory as NumPy sees it (no copy on CPU), once JAX's pending collectives have
    run (they come first, in call order) and ``x`` is computed."""
    p.wait_for_collectives()
    return np.asarray(x)


def _empty(shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
    """A fresh array aligned for JAX to take over without a copy."""
    return aligned_empty(shape, dtype)


def _to_jax(result: np.ndarray) -> jax.Array:
    """Hand a result nobody else holds to JAX (without a copy when it is aligned)."""
    return jax.device_put(result)


def _where(process_set: ProcessSet | None, algorithm: str, collective: str,
           reduces: tuple[str, str] | None = None) -> Place:
    """Where the collective runs, once its algorithm is known to take ``reduces`` (dtype, op):
    checked when traced, so that a refusal is an exception before anything runs."""
    where = place(process_set)
    check_algorithm(algorithm, collective)
    if reduces is not None:
        _core.check_algorithm(collective, algorithm, *reduces)
    if algorithm == "auto" and where.id == 0:
        selector.prepare()  # the cost model auto decides with (collective on its first call)
    return where


def _array(x: Any, collective: str, *, reduce: bool) -> jax.Array:
    if not isinstance(x, jax.Array):
        x = jnp.asarray(x)
    accepted = p.REDUCIBLE if reduce else p.MOVABLE
    if x.dtype.name not in accepted:
        verb = "reduce" if reduce else "move"
        raise TypeError(
            f"ringlet.jax.{collective} cannot {verb} {x.dtype.name} arrays; accepted: "
            f"{', '.join(sorted(accepted))}"
        )
    return x


def allreduce(x: Any, op: str = "sum", *, algorithm: str = "auto",
              process_set: ProcessSet | None = None) -> jax.Array:
    """Reduce ``x`` element-wise across the ranks (``op``: "sum", "avg", "min", "max" or
    "prod"); every rank gets the same result. ``algorithm`` is "auto" or one of
    ``ringlet.ALGORITHMS``."""
    x = _array(x, "allreduce", reduce=True)
    where = _where(process_set, algorithm, "allreduce", (x.dtype.name, check_op(op)))
    if _traced(x):
        return _run(p.allreduce_p.bind, x, op=op, algorithm=algorithm, process_set=where.id)
    out = _empty(x.shape, x.dtype)
    _numpy_allreduce(_host(x), op, out=out, algorithm=algorithm, process_set=process_set)
    return _to_jax(out)


def tree_allreduce(tree: Any, op: str = "avg", *, algorithm: str = "auto",
                   process_set: ProcessSet | None = None) -> Any:
    """Allreduce every leaf of a pytree (gradients, say) in one fused collective per dtype,
    reduced where the leaves are (no packing copy); returns a pytree of the same structure."""
    leaves, structure = jax.tree.flatten(tree)
    leaves = [_array(leaf, "tree_allreduce", reduce=True) for leaf in leaves]
    where = place(process_set)
    for dtype in {leaf.dtype.name for leaf in leaves} or {"float32"}:
        _where(process_set, algorithm, "allreduce", (dtype, check_op(op)))
    params = dict(op=op, algorithm=algorithm, process_set=where.id,
                  fusion_bytes=fusion_threshold_bytes())
    reduced: list[Any] = list(leaves)
    for dtype in dict.fromkeys(leaf.dtype for leaf in leaves):
        indices = [i for i, leaf in enumerate(leaves) if leaf.dtype == dtype]
        results = _run(p.tree_allreduce_p.bind, *(leaves[i] for i in indices), **params)
        for i, result in zip(indices, results, strict=True):
            reduced[i] = result
    return jax.tree.unflatten(structure, reduced)


def broadcast(x: Any, root: int = 0, *, algorithm: str = "auto",
              process_set: ProcessSet | None = None) -> jax.Array:
    """``x`` of rank ``root`` (a rank of ringlet's communicator) on every rank."""
    x = _array(x, "broadcast", reduce=False)
    where = _where(process_set, algorithm, "broadcast")
    local_root = check_root(root, where)
    if _traced(x):
        return _run(p.broadcast_p.bind, x, root=local_root, is_root=where.rank == local_root,
                    algorithm=algorithm, process_set=where.id)
    out = _empty(x.shape, x.dtype)
    _numpy_broadcast(_host(x), root, out=out, algorithm=algorithm, process_set=process_set)
    return _to_jax(out)


def allgather(x: Any, *, algorithm: str = "auto",
              process_set: ProcessSet | None = None) -> jax.Array:
    """Every rank's ``x`` concatenated along the first axis, in rank order. Inside
    ``jax.jit`` every rank's shape must be the same (the result's shape is fixed when traced);
    outside, the first dimension may differ between ranks."""
    x = _array(x, "allgather", reduce=False)
    if x.ndim == 0:
        raise ValueError("ringlet.jax.allgather needs an array of at least one dimension")
    where = _where(process_set, algorithm, "allgather")
    if _traced(x):
        return _run(p.allgather_p.bind, x, size=where.size, algorithm=algorithm,
                    process_set=where.id)
    return _to_jax(_numpy_allgather(_host(x), algorithm=algorithm, process_set=process_set))


def reduce_scatter(x: Any, op: str = "sum", *, algorithm: str = "auto",
                   process_set: ProcessSet | None = None) -> jax.Array:
    """Reduce ``x`` across the ranks and give each rank its block of rows: rank r gets rows
    ``r*k:(r+1)*k`` of the reduction, k being ``x.shape[0]`` divided by the number of ranks
    (it must divide evenly)."""
    x = _array(x, "reduce_scatter", reduce=True)
    where = _where(process_set, algorithm, "reduce_scatter", (x.dtype.name, check_op(op)))
    if x.ndim == 0 or x.shape[0] % where.size:
        raise ValueError(
            f"ringlet.jax.reduce_scatter needs a first dimension divisible by the {where.size} "
            f"ranks, got shape {tuple(x.shape)}"
        )
    if _traced(x):
        return _run(p.reduce_scatter_p.bind, x, op=op, size=where.size,
                    algorithm=algorithm, process_set=where.id)
    return _to_jax(_numpy_reduce_scatter(_host(x), op, algorithm=algorithm,
                                         process_set=process_set))


def barrier(process_set: ProcessSet | None = None) -> None:
    """Wait until every rank has reached it (in program order with the other collectives,
    also inside ``jax.jit``)."""
    _run(p.barrier_p.bind, process_set=place(process_set).id)


def broadcast_parameters(tree: Any, root: int = 0, *,
                         process_set: ProcessSet | None = None) -> Any:
    """Every leaf of ``tree`` (initial parameters, an optimizer's state) as rank ``root`` has
    it, on every rank."""
    return jax.tree.map(lambda leaf: broadcast(leaf, root, process_set=process_set), tree)


def average_gradients(*, process_set: ProcessSet | None = None,
                      algorithm: str = "auto") -> Any:
    """An optax gradient transformation that averages the updates (gradients) across ranks
    in one fused collective: ``optax.chain(ringlet.jax.average_gradients(), optax.adam(1e-3))``.
    Needs optax (``pip install ringlet[jax]``)."""
    try:
        import optax
    except ImportError as missing:
        raise ImportError(
            "ringlet.jax.average_gradients needs optax: pip install 'ringlet[jax]'"
        ) from missing

    def init(params: Any) -> Any:
        return optax.EmptyState()

    def update(updates: Any, state: Any, params: Any = None) -> tuple[Any, Any]:
        return tree_allreduce(updates, "avg", algorithm=algorithm, process_set=process_set), state

    return optax.GradientTransformation(init, update)
