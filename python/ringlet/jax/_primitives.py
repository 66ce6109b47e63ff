"""ringlet's collectives as JAX primitives: each lowers to one of the core's XLA FFI handlers
(``_core.xla_handlers()``), carries an ordered effect so that XLA runs them in program order
on every rank (no tokens to pass), and has rules for ``jax.grad``/``jax.jvp`` (sum and avg:
the transpose of a sum-allreduce is a sum-allreduce) and ``jax.vmap``.

Outside ``jax.jit`` a primitive runs as a one-operation computation: XLA hands the handler the
input where it lives and a fresh result buffer, so no copy is made beyond writing the result.
"""

from __future__ import annotations

from functools import partial
from typing import Any, Literal

import jax
import jax.numpy as jnp
import numpy as np
from jax._src import core as _jax_core
from jax._src import dispatch as _dispatch
from jax._src import effects as _effects
from jax.extend.core import Primitive
from jax.interpreters import ad, batching, mlir

from .. import _core

for _name, _capsule in _core.xla_handlers().items():
    jax.ffi.register_ffi_target(_name, _capsule, platform="cpu")

# The element types the handlers take, and which of them ringlet reduces (one table, the core's).
MOVABLE = {d.name for d in _core.xla_dtypes()}
REDUCIBLE = {d.name for d in _core.xla_dtypes() if d.reducible}


class RingletEffect(_effects.Effect):
    """ringlet's collectives' ordered effect: XLA threads a token through them in program
    order, and JAX orders computations that have it, so every rank makes its collectives in
    the same order."""

    def __repr__(self) -> str:
        return "RingletEffect"


EFFECT = RingletEffect()
for _allowed in (
    _effects.lowerable_effects,
    _effects.ordered_effects,
    _effects.control_flow_allowed_effects,
    _effects.custom_derivatives_allowed_effects,
    _effects.remat_allowed_effects,
):
    _allowed.add_type(RingletEffect)

LINEAR_OPS = ("sum", "avg")


def forget_failed_collectives() -> None:
    """Start the next computation with a collective from a fresh token. JAX feeds the token
    the last such computation returned to the next one, to keep them in order: once a
    collective failed (a mismatch, a rank that died), that token holds the error, and every
    later computation would fail with it without running, on a new communicator too."""
    tokens = _dispatch.runtime_tokens
    tokens.current_tokens.pop(EFFECT, None)
    # The devices' tokens of the same computations, which jax.effects_barrier waits for.
    tokens.output_runtime_tokens.clear()


def _failed(token: _jax_core.Token) -> bool:
    """Whether the computation that returned ``token`` has ended in an error (never waits
    for one still running)."""
    if not token._buf.is_ready():
        return False
    try:
        token._buf.block_until_ready()
    except jax.errors.JaxRuntimeError:
        return True
    return False


class _Tokens(_dispatch.RuntimeTokenSet):
    """JAX's set of ordered-effect tokens, which drops ringlet's once the computation that
    returned it has failed: that computation is over, so the order holds, and the error
    reached its results already; else it would be raised again by every later one."""

    def get_token_input(self, eff: _jax_core.Effect, devices: list[Any]) -> _jax_core.Token:
        token = self.current_tokens.get(eff)
        if eff is EFFECT and isinstance(token, _jax_core.Token) and _failed(token):
            forget_failed_collectives()
        return super().get_token_input(eff, devices)


# The instance JAX's dispatch uses (per thread), with its class's one method extended.
_dispatch.runtime_tokens.__class__ = _Tokens


def wait_for_collectives() -> None:
    """``jax.effects_barrier()``: wait for the collectives dispatched so far. An error of
    theirs is raised here once, not again at every later wait."""
    try:
        jax.effects_barrier()
    except jax.errors.JaxRuntimeError:
        forget_failed_collectives()
        raise


Aliased = Literal["all", "computed", "none"]
"""Which results a primitive's lowering aliases to their operands (see ``_lowering``)."""


def _is_argument(value: Any) -> bool:
    """Whether an operand is an argument of the function being lowered (an MLIR block
    argument), which XLA keeps: aliasing a result to it would cost a copy."""
    return isinstance(value, mlir.ir.BlockArgument)


def _lowering(target: str, attributes: tuple[str, ...], *, aliased: Aliased) -> Any:
    """The lowering of a primitive to the handler ``target``: its operands and results plus
    the ordered effect's token, and the ``attributes`` the handler reads (the primitive's other
    parameters stay in Python). ``aliased`` says which results are aliased to their operands:
    "all", "computed" (not the function's arguments: the handler reads those where they are
    and writes a fresh result, where an alias would make XLA copy them first) or "none". An
    aliased result lets XLA reuse the input when nothing else needs it, and copy it once
    otherwise."""

    def aliases(operands: tuple[Any, ...]) -> dict[int, int] | None:
        if aliased == "all":
            return {i: i for i in range(len(operands))}
        if aliased == "computed":
            return {i: i for i, value in enumerate(operands) if not _is_argument(value)} or None
        return None

    def lower(ctx: Any, *operands: Any, **params: Any) -> Any:
        values = {
            name: np.int64(params[name]) if isinstance(params[name], int) else params[name]
            for name in attributes
        }
        token = ctx.tokens_in.get(EFFECT)
        with_token = ctx.replace(
            avals_in=(*ctx.avals_in, _jax_core.abstract_token),
            avals_out=(*ctx.avals_out, _jax_core.abstract_token),
        )
        rule = jax.ffi.ffi_lowering(
            target,
            has_side_effect=True,
            operand_output_aliases=aliases(operands),
        )
        results = list(rule(with_token, *operands, token, **values))
        ctx.set_tokens_out(mlir.TokenSet({EFFECT: results.pop()}))
        return results

    return lower


def _primitive(target: str, attributes: tuple[str, ...], *, multiple: bool = False,
               aliased: Aliased = "all") -> Primitive:
    primitive = Primitive(target)
    primitive.multiple_results = multiple
    primitive.def_impl(partial(_dispatch.apply_primitive, primitive))
    # Not cached: JAX would lower a cacheable primitive inside a function of its own, where
    # every operand is an argument and "computed" could not be told.
    mlir.register_lowering(primitive, _lowering(target, attributes, aliased=aliased),
                           platform="cpu", cacheable=aliased != "computed")
    return primitive


_REDUCE = ("op", "algorithm", "process_set")
# The allreduce handler reduces out of place when its result is not aliased (the core's
# schedules read the input in their first step); the others copy into an unaliased result.
allreduce_p = _primitive("ringlet_allreduce", _REDUCE, aliased="computed")
tree_allreduce_p = _primitive("ringlet_tree_allreduce", (*_REDUCE, "fusion_bytes"), multiple=True)
broadcast_p = _primitive("ringlet_broadcast", ("root", "algorithm", "process_set"))
allgather_p = _primitive("ringlet_allgather", ("algorithm", "process_set"), aliased="none")
reduce_scatter_p = _primitive("ringlet_reduce_scatter", _REDUCE, aliased="none")
barrier_p = _primitive("ringlet_barrier", ("process_set",), multiple=True, aliased="none")


def _same(x: Any, **_: Any) -> tuple[Any, set[Any]]:
    return _jax_core.ShapedArray(x.shape, x.dtype), {EFFECT}


def _rows(x: Any, rows: int) -> tuple[Any, set[Any]]:
    """An array of ``x``'s shape with ``rows`` rows."""
    return _jax_core.ShapedArray((rows, *x.shape[1:]), x.dtype), {EFFECT}


allreduce_p.def_effectful_abstract_eval(_same)
broadcast_p.def_effectful_abstract_eval(_same)
tree_allreduce_p.def_effectful_abstract_eval(
    lambda *xs, **_: ([_jax_core.ShapedArray(x.shape, x.dtype) for x in xs], {EFFECT})
)
allgather_p.def_effectful_abstract_eval(
    lambda x, *, size, **_: _rows(x, x.shape[0] * size)
)
reduce_scatter_p.def_effectful_abstract_eval(
    lambda x, *, size, **_: _rows(x, x.shape[0] // size)
)
barrier_p.def_effectful_abstract_eval(lambda **_: ([], {EFFECT}))

# Differentiation. Each rank's program is differentiated as part of one global function of
# every rank's inputs, so a collective's transpose is its adjoint across ranks: allreduce(sum)
# is self-adjoint, allgather's adjoint is reduce_scatter(sum), broadcast's is a sum to the root.


def _linear_only(op: str, what: str) -> None:
    if op not in LINEAR_OPS:
        raise NotImplementedError(
            f"ringlet.jax cannot differentiate {what} with op={op!r}: only 'sum' and 'avg' "
            "are linear"
        )


def _allreduce_jvp(primals: Any, tangents: Any, **params: Any) -> Any:
    _linear_only(params["op"], "allreduce")
    (x,), (t,) = primals, tangents
    return allreduce_p.bind(x, **params), allreduce_p.bind(ad.instantiate_zeros(t), **params)


def _allreduce_transpose(ct: Any, x: Any, **params: Any) -> Any:
    _linear_only(params["op"], "allreduce")
    return [allreduce_p.bind(ad.instantiate_zeros(ct), **params)]


ad.primitive_jvps[allreduce_p] = _allreduce_jvp
ad.primitive_transposes[allreduce_p] = _allreduce_transpose


def _tree_jvp(primals: Any, tangents: Any, **params: Any) -> Any:
    _linear_only(params["op"], "tree_allreduce")
    tangents = [ad.instantiate_zeros(t) for t in tangents]
    return tree_allreduce_p.bind(*primals, **params), tree_allreduce_p.bind(*tangents, **params)


def _tree_transpose(cts: Any, *xs: Any, **params: Any) -> Any:
    _linear_only(params["op"], "tree_allreduce")
    return tree_allreduce_p.bind(*(ad.instantiate_zeros(ct) for ct in cts), **params)


ad.primitive_jvps[tree_allreduce_p] = _tree_jvp
ad.primitive_transposes[tree_allreduce_p] = _tree_transpose


def _broadcast_jvp(primals: Any, tangents: Any, **params: Any) -> Any:
    (x,), (t,) = primals, tangents
    return broadcast_p.bind(x, **params), broadcast_p.bind(ad.instantiate_zeros(t), **params)


def _broadcast_transpose(ct: Any, x: Any, *, root: int, is_root: bool, algorithm: str,
                         process_set: int) -> Any:
    total = allreduce_p.bind(ad.instantiate_zeros(ct), op="sum", algorithm=algorithm,
                             process_set=process_set)
    return [total if is_root else jnp.zeros_like(total)]


ad.primitive_jvps[broadcast_p] = _broadcast_jvp
ad.primitive_transposes[broadcast_p] = _broadcast_transpose


def _allgather_jvp(primals: Any, tangents: Any, **params: Any) -> Any:
    (x,), (t,) = primals, tangents
    return allgather_p.bind(x, **params), allgather_p.bind(ad.instantiate_zeros(t), **params)


def _allgather_transpose(ct: Any, x: Any, *, size: int, algorithm: str, process_set: int) -> Any:
    return [reduce_scatter_p.bind(ad.instantiate_zeros(ct), op="sum", size=size,
                                  algorithm="auto", process_set=process_set)]


def _reduce_scatter_jvp(primals: Any, tangents: Any, **params: Any) -> Any:
    _linear_only(params["op"], "reduce_scatter")
    (x,), (t,) = primals, tangents
    tangent = reduce_scatter_p.bind(ad.instantiate_zeros(t), **params)
    return reduce_scatter_p.bind(x, **params), tangent


def _reduce_scatter_transpose(ct: Any, x: Any, *, op: str, size: int, algorithm: str,
                              process_set: int) -> Any:
    _linear_only(op, "reduce_scatter")
    gathered = allgather_p.bind(ad.instantiate_zeros(ct), size=size, algorithm="auto",
                                process_set=process_set)
    return [gathered / size if op == "avg" else gathered]


ad.primitive_jvps[allgather_p] = _allgather_jvp
ad.primitive_transposes[allgather_p] = _allgather_transpose
ad.primitive_jvps[reduce_scatter_p] = _reduce_scatter_jvp
ad.primitive_transposes[reduce_scatter_p] = _reduce_scatter_transpose


# vmap. Element-wise collectives keep the batch axis where it is; the row collectives work on
# the first axis, so the batch axis goes second (each batch element then gathers or scatters
# its own rows).


def _elementwise_batch(primitive: Primitive) -> Any:
    def rule(args: Any, dims: Any, **params: Any) -> Any:
        out = primitive.bind(*args, **params)
        return out, dims if primitive.multiple_results else dims[0]

    return rule


def _rows_batch(primitive: Primitive) -> Any:
    def rule(args: Any, dims: Any, **params: Any) -> Any:
        (x,), (dim,) = args, dims
        if x.ndim < 2:
            raise ValueError(
                f"ringlet.jax: {primitive.name.removeprefix('ringlet_')} under vmap needs "
                "arrays of at least one dimension besides the mapped one"
            )
        x = jnp.moveaxis(x, dim, 1)
        return primitive.bind(x, **params), 1

    return rule


batching.primitive_batchers[allreduce_p] = _elementwise_batch(allreduce_p)
batching.primitive_batchers[broadcast_p] = _elementwise_batch(broadcast_p)
batching.primitive_batchers[tree_allreduce_p] = _elementwise_batch(tree_allreduce_p)
batching.primitive_batchers[allgather_p] = _rows_batch(allgather_p)
batching.primitive_batchers[reduce_scatter_p] = _rows_batch(reduce_scatter_p)
