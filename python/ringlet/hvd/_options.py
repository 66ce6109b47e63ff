"""``DistributedOptimizer``'s options, checked and split once for torch, TensorFlow and Keras.

Horovod writes these checks in each framework's ``DistributedOptimizer``, with the same words;
here they are written once, so that the same options fuse and fail alike in every framework:

- ``gradient_predivide_factor`` other than 1 only with ``op=Average`` (Horovod's words), and
  not 0 (Horovod would divide by it at the first step; here it fails at once);
- ``backward_passes_per_step`` a whole number >= 1;
- ``num_groups`` deprecated in favour of ``groups`` (Horovod's DeprecationWarning), which is
  ``None``, a count > 0, or a list of lists of variables, none listed twice;
- ``groups=<n>`` splits the gradients into n consecutive, nearly equal parts (Horovod's
  ``split_list``); a list of lists makes one group of each list (of the variables that have
  a gradient) and one of each variable listed in none.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from ._ops import Average, Compression

__all__ = ["OptimizerOptions", "grouped", "optimizer_options", "split_list"]

T = TypeVar("T")


@dataclass(frozen=True)
class OptimizerOptions:
    """The checked options every framework's ``DistributedOptimizer`` reduces with."""

    op: Any = Average
    prescale: float = 1.0
    """Gradients are scaled by it before the sum (1 / gradient_predivide_factor)..."""
    postscale: float = 1.0
    """...and by it after the sum (gradient_predivide_factor; with Average's 1 / size)."""
    passes: int = 1
    """backward_passes_per_step."""
    groups: Any = None
    """None (ringlet's buckets), a count > 0, or a list of lists of variables."""
    compression: Any = Compression.none
    sparse_as_dense: bool = False


def split_list(items: Sequence[T], n: int) -> list[list[T]]:
    """``items`` in ``n`` consecutive parts of nearly equal length, the longer ones first
    (Horovod's ``horovod.common.util.split_list``)."""
    d, r = divmod(len(items), n)
    return [list(items[i * d + min(i, r):(i + 1) * d + min(i + 1, r)]) for i in range(n)]


def optimizer_options(*, op: Any = Average, gradient_predivide_factor: float = 1.0,
                      backward_passes_per_step: int = 1, num_groups: int = 0,
                      groups: Any = None, compression: Any = Compression.none,
                      sparse_as_dense: bool = False, stacklevel: int = 3) -> OptimizerOptions:
    """Horovod's checks of ``DistributedOptimizer``'s options (its words where it has them),
    then the options. The caller checks ``op`` itself (Keras takes only Average and Sum;
    torch and TensorFlow every op ringlet has) and the process set. ``stacklevel``: the
    deprecation warning's, counted from here (3: the caller's caller)."""
    if gradient_predivide_factor != 1.0 and op != Average:
        raise ValueError("gradient_predivide_factor not supported with op != Average")
    if gradient_predivide_factor == 0:
        raise ValueError("gradient_predivide_factor must not be 0: gradients are scaled by "
                         "1 / gradient_predivide_factor before the sum")
    if isinstance(backward_passes_per_step, bool) or not isinstance(
            backward_passes_per_step, int) or backward_passes_per_step < 1:
        raise ValueError(f"backward_passes_per_step must be an integer >= 1, got "
                         f"{backward_passes_per_step!r}")
    if num_groups != 0:
        warnings.warn("Parameter `num_groups` has been replaced by `groups` and will be "
                      "removed in v0.23.0.", DeprecationWarning, stacklevel=stacklevel)
        if groups is None:
            groups = num_groups
    if groups is not None:
        if isinstance(groups, bool) or not (
                isinstance(groups, list) or (isinstance(groups, int) and groups > 0)):
            raise ValueError("groups should be a non-negative integer or a list of list of "
                             "variables (torch.Tensor, tf.Variable or keras.Variable).")
        if isinstance(groups, list):
            seen: set[int] = set()
            for group in groups:
                for variable in group:
                    if id(variable) in seen:
                        raise ValueError("A parameter can only appear once in groups.")
                    seen.add(id(variable))
    predivide = float(gradient_predivide_factor)
    prescale, postscale = (1.0 / predivide, predivide) if op == Average else (1.0, 1.0)
    return OptimizerOptions(op=op, prescale=prescale, postscale=postscale,
                            passes=backward_passes_per_step, groups=groups,
                            compression=compression, sparse_as_dense=bool(sparse_as_dense))


def grouped(items: Sequence[T], groups: Any,
            variable_of: Callable[[T], Any] = lambda item: item) -> list[list[T]]:
    """``items`` (gradients, or their indices, in the order the framework lists its
    variables) in the fused groups that ``groups`` asks for: one group of all of them (None),
    Horovod's ``split_list`` into ``groups`` parts (a count; empty parts dropped), or one group
    per list of ``groups`` (in its order, of the items present) then one per item listed in
    none. ``variable_of(item)`` is the variable a list of ``groups`` names."""
    items = list(items)
    if groups is None:
        return [items] if items else []
    if isinstance(groups, int):
        return [part for part in split_list(items, groups) if part]
    position = {id(variable_of(item)): item for item in items}
    chosen: list[list[T]] = []
    for group in groups:
        part = [position.pop(id(v)) for v in group if id(v) in position]
        if part:
            chosen.append(part)
    rest = [item for item in items if id(variable_of(item)) in position]
    return chosen + [[item] for item in rest]
