"""``DistributedOptimizer`` for torch: a hook on every parameter starts its bucket's fused
allreduce as soon as backward() has produced the bucket's gradients; ``step()`` waits for them
first."""

from __future__ import annotations

import contextlib
import itertools
import time
import warnings
from collections.abc import Iterator
from typing import Any

import numpy as np
import torch

import ringlet

from .._api import api
from .._handles import collectively
from .._ops import OPS, Average, Compression, ringlet_op
from .._options import OptimizerOptions, grouped, optimizer_options
from .._process_sets import global_process_set, ringlet_set
from ..timeline import Timeline
from ._collectives import sparse_allreduce_async

__all__ = ["DistributedOptimizer", "broadcast_optimizer_state"]


class _GradientHandle:
    """A bucket's reduction: its dense gradients' handle, and its sparse gradients' results,
    which ``synchronize`` installs as the parameters' gradients."""

    def __init__(self, dense: Any, sparse: list[tuple[torch.Tensor, Any]],
                 densified: list[torch.Tensor]) -> None:
        self.dense, self.sparse, self.densified = dense, sparse, densified

    def synchronize(self) -> None:
        if self.dense is not None:
            self.dense.synchronize()
        for p, result in self.sparse:
            p.grad = result()
        for p in self.densified:  # sparse_as_dense: sparse again for the update, as Horovod
            p.grad = p.grad.to_sparse()

    def timing(self) -> Any:
        return self.dense.timing() if self.dense is not None else None



_optimizers = itertools.count()
"""Numbers the DistributedOptimizers this process makes (their buckets' names)."""


class _DistributedOptimizer(torch.optim.Optimizer):
    """Mixed into the user's optimizer class by ``DistributedOptimizer``."""

    _ringlet_distributed = True

    def __init__(self, params: Any, named_parameters: Any, options: OptimizerOptions,
                 process_set: Any, shared_gradients: bool = False) -> None:
        super(self.__class__, self).__init__(params)
        self._compression = options.compression
        self._op = ringlet_op(None, options.op)
        self._prescale = options.prescale
        self._postscale = options.postscale
        self._passes = options.passes
        self._sparse_as_dense = options.sparse_as_dense
        self._process_set = process_set
        groups = options.groups
        params = [p for group in self.param_groups for p in group["params"] if p.requires_grad]
        self._parameter_names = _parameter_names(self.param_groups, named_parameters)
        """Each parameter's name (Horovod's attribute; "allreduce.noname.<i>" if unnamed)."""
        if process_set is not None and not process_set.included():
            params = []  # outside its process set, it is the wrapped optimizer (as Horovod's)
        # Planning is collective (rank 0 plans for all): with name matching, in its turn.
        self._buckets = collectively("plan_buckets", lambda: _buckets(
            params, groups, ringlet_set(process_set)), process_set) if params else []
        self._bucket_of = {id(p): i for i, bucket in enumerate(self._buckets) for p in bucket}
        self._countdown = {id(p): self._passes for p in params}
        self._ready: list[set[int]] = [set() for _ in self._buckets]
        self._handles: dict[int, Any] = {}
        self._number = next(_optimizers)
        self._synchronized = False
        self._should_synchronize = True
        self.timeline = Timeline.from_environment()
        """Per-step times (RINGLET_TIMELINE), or None."""
        self._shared: dict[int, tuple[torch.Tensor, list[torch.Tensor]]] = {}
        """Bucket -> (its flat gradient storage in ringlet's shared memory, each parameter's
        view of it), for the buckets that ``shared_gradients`` could place there."""
        self._shared_arrays: list[np.ndarray] = []
        """The same storage as NumPy arrays (``ringlet.is_shared`` tells where it lives)."""
        if shared_gradients:
            self._place_gradients(ringlet_set(process_set))
        for p in params:
            p.register_post_accumulate_grad_hook(self._on_gradient)

    def _place_gradients(self, process_set: ringlet.ProcessSet | None) -> None:
        """Give each bucket whose parameters share a float dtype one flat gradient buffer in
        the node's shared memory (``ringlet.empty``, collective: every rank has the same
        buckets), each parameter's ``.grad`` a view of it. backward() accumulates into the
        views in place, and the bucket's allreduce reads the peers' buffers where they lie."""
        for bucket, members in enumerate(self._buckets):
            dtypes = {p.dtype for p in members}
            if len(dtypes) != 1 or dtypes.pop() not in _SHAREABLE or any(
                    p.grad is not None and p.grad.is_sparse for p in members):
                continue
            total = sum(p.numel() for p in members)
            storage = collectively("empty", lambda total=total, members=members: ringlet.empty(
                total, _SHAREABLE[members[0].dtype], process_set=process_set),
                self._process_set)
            storage[...] = 0
            flat = torch.from_numpy(storage)
            views, offset = [], 0
            for p in members:
                view = flat[offset:offset + p.numel()].view_as(p)
                if p.grad is not None:
                    view.copy_(p.grad)
                p.grad = view
                views.append(view)
                offset += p.numel()
            self._shared[bucket] = (flat, views)
            self._shared_arrays.append(storage)

    def _shared_storage(self, bucket: int) -> torch.Tensor | None:
        """The bucket's flat shared buffer, if every gradient of it still lives there (the user
        may have replaced a ``.grad``)."""
        placed = self._shared.get(bucket)
        if placed is None:
            return None
        flat, views = placed
        for p, view in zip(self._buckets[bucket], views):
            if p.grad is None or p.grad.data_ptr() != view.data_ptr():
                return None
        return flat

    def _on_gradient(self, p: torch.Tensor) -> None:
        key = id(p)
        if self._countdown[key] == 0:
            raise AssertionError(
                "Gradients were computed more than backward_passes_per_step times before call "
                "to step(). Increase backward_passes_per_step to accumulate gradients locally."
            )
        self._countdown[key] -= 1
        if self._countdown[key] == 0:
            bucket = self._bucket_of[key]
            self._ready[bucket].add(key)
            if len(self._ready[bucket]) == len(self._buckets[bucket]):
                self._launch(bucket)

    def _launch(self, bucket: int) -> None:
        flat = self._shared_storage(bucket)
        if flat is not None:  # one array, in shared memory: reduced in place, no packing
            submitted = time.perf_counter()
            handle = api.grouped_allreduce_async_(
                [flat], name=self._bucket_name(bucket), op=OPS[self._op],
                prescale_factor=self._prescale,
                postscale_factor=self._postscale, compression=self._compression,
                process_set=self._process_set,
            )
            self._handles[bucket] = _GradientHandle(handle, [], [])
            if self.timeline is not None:
                nbytes = flat.numel() * flat.element_size()
                self.timeline.launched(bucket, nbytes, submitted, self._handles[bucket])
            return
        grads, sparse, densified = [], [], []
        for p in self._buckets[bucket]:
            if p.grad is None:  # unused this step here, maybe used elsewhere: reduce zeros
                p.grad = torch.zeros_like(p)
            elif p.grad.is_sparse and self._sparse_as_dense:
                p.grad = p.grad.to_dense()
                densified.append(p)
            if p.grad.is_sparse:
                sparse.append((p, sparse_allreduce_async(
                    p.grad, self._parameter_names.get(p), OPS[self._op], self._process_set)))
            else:
                grads.append(p.grad)
        submitted = time.perf_counter()
        dense = api.grouped_allreduce_async_(
            grads, name=self._bucket_name(bucket), op=OPS[self._op],
            prescale_factor=self._prescale,
            postscale_factor=self._postscale, compression=self._compression,
            process_set=self._process_set,
        ) if grads else None
        self._handles[bucket] = _GradientHandle(dense, sparse, densified)
        if self.timeline is not None:
            nbytes = sum(g.numel() * g.element_size() for g in grads)
            self.timeline.launched(bucket, nbytes, submitted, self._handles[bucket])

    def _bucket_name(self, bucket: int) -> str:
        """The bucket's name, the same on every rank (optimizers are numbered in the order
        each rank makes them): with name matching, a name seen before costs one bit."""
        return f"DistributedOptimizer.{self._number}.bucket.{bucket}"

    def synchronize(self) -> None:
        """Finish every gradient's allreduce (starting those whose hooks did not fire)."""
        started = time.perf_counter()
        for bucket in range(len(self._buckets)):
            if bucket not in self._handles:
                self._launch(bucket)
        for bucket in sorted(self._handles):
            self._handles[bucket].synchronize()
        self._handles.clear()
        self._ready = [set() for _ in self._buckets]
        self._countdown = dict.fromkeys(self._countdown, self._passes)
        self._synchronized = True
        if self.timeline is not None:
            self.timeline.synchronized(started)

    @contextlib.contextmanager
    def skip_synchronize(self) -> Iterator[None]:
        """For ``optimizer.synchronize(); clip(...); with optimizer.skip_synchronize():
        optimizer.step()``."""
        self._should_synchronize = False
        try:
            yield
        finally:
            self._should_synchronize = True

    def step(self, closure: Any = None) -> Any:
        if self._should_synchronize:
            if self._synchronized:
                # Horovod's words: scripts and Horovod's tests match them.
                warnings.warn(
                    "optimizer.step() called without optimizer.skip_synchronize() context after "
                    "optimizer.synchronize(). This can cause training slowdown. You may want to "
                    "consider using optimizer.skip_synchronize() context if you use "
                    "optimizer.synchronize() in your code.", stacklevel=2,
                )
            self.synchronize()
        self._synchronized = False
        started = time.perf_counter()
        result = super(self.__class__, self).step(closure)
        if self.timeline is not None:
            self.timeline.updated(started)
        return result

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Load as the wrapped optimizer does, and forget the gradients in flight (as Horovod).
        They are waited for first: they write into the gradients' memory, and their names stay
        taken until they are synchronized."""
        for handle in self._handles.values():
            handle.synchronize()
        self._handles.clear()
        self._ready = [set() for _ in self._buckets]
        self._countdown = dict.fromkeys(self._countdown, self._passes)
        self._synchronized = False
        self._should_synchronize = True
        super(self.__class__, self).load_state_dict(state_dict)

    def zero_grad(self, set_to_none: bool = True) -> None:
        if self._handles:
            raise AssertionError(
                "optimizer.zero_grad() was called after loss.backward() but before "
                "optimizer.step() or optimizer.synchronize(). This is prohibited as it can "
                "cause a race condition."
            )
        super(self.__class__, self).zero_grad(set_to_none)
        for bucket, (flat, views) in self._shared.items():  # the storage stays; zeros in it
            flat.zero_()
            for p, view in zip(self._buckets[bucket], views):
                p.grad = view


_SHAREABLE = {torch.float32: np.float32, torch.float64: np.float64, torch.float16: np.float16}
"""Gradient dtypes that shared_gradients can place in shared memory (NumPy has them)."""


def _parameter_names(param_groups: list[dict[str, Any]],
                     named_parameters: Any) -> dict[torch.Tensor, str]:
    """Parameter -> name, checked as Horovod checks it (same errors, same words)."""
    params = [p for group in param_groups for p in group["params"]]
    if named_parameters is None:
        # Numbered over all groups (Horovod numbers per group, which repeats names).
        return {p: f"allreduce.noname.{i}" for i, p in enumerate(params)}
    named = list(named_parameters)
    if any(not isinstance(item, tuple) for item in named):
        raise ValueError("named_parameters should be a sequence of tuples (name, parameter), "
                         "usually produced by model.named_parameters().")
    seen: set[str] = set()
    duplicates = sorted({name for name, _ in named if name in seen or seen.add(name)})
    if duplicates:
        raise ValueError("Parameter names in named_parameters must be unique. "
                         f"Found duplicates: {', '.join(duplicates)}")
    named_ids = {id(p) for _, p in named}
    unnamed = [id(p) for p in params if id(p) not in named_ids]
    if unnamed:
        raise ValueError("named_parameters was specified, but one or more model parameters "
                         "were not named. Python object ids: "
                         f"{', '.join(str(i) for i in unnamed)}")
    return {p: name for name, p in named}


def _buckets(params: list[torch.Tensor], groups: Any,
             process_set: ringlet.ProcessSet | None) -> list[list[torch.Tensor]]:
    """Which gradients travel together: Horovod's ``groups`` (a count, or lists of
    parameters), else consecutive buckets in reverse order (the order backward() produces
    gradients), sized by ``ringlet.plan_buckets`` (the cost model, or RINGLET_FUSION_THRESHOLD).
    """
    if groups is not None:
        return grouped(params, groups)
    ready_order = list(reversed(params))
    plan = ringlet.plan_buckets([p.numel() * p.element_size() for p in ready_order],
                                compute_threads=torch.get_num_threads(),
                                process_set=process_set)
    return [[ready_order[i] for i in bucket] for bucket in plan.buckets]


def DistributedOptimizer(
    optimizer: torch.optim.Optimizer,
    named_parameters: Any = None,
    compression: Any = Compression.none,
    backward_passes_per_step: int = 1,
    op: Any = Average,
    gradient_predivide_factor: float = 1.0,
    num_groups: int = 0,
    groups: Any = None,
    sparse_as_dense: bool = False,
    process_set: Any = global_process_set,
    shared_gradients: bool = False,
) -> torch.optim.Optimizer:
    """Wrap ``optimizer`` so that ``step()`` uses gradients averaged over all ranks (or over
    ``process_set``'s, on its members).

    Gradients are allreduced (fused, in ringlet's background thread) as soon as backward()
    produces them; ``step()`` waits for them first. Arguments as in Horovod, and one of
    ringlet's own:

    ``shared_gradients=True`` (collective) keeps each fusion bucket's gradients in one flat
    buffer in the node's shared memory, every ``.grad`` a view of it, so that each bucket's
    allreduce reads the other ranks' gradients where they lie (no packing, no copy-in).
    ``zero_grad()`` then zeroes that storage instead of dropping it. It applies to buckets of
    one float dtype (float32, float64, float16) where the ranks share a node; elsewhere, and
    for a bucket whose ``.grad`` was replaced, gradients are reduced as usual.
    """
    ringlet_op(None, op)  # Adasum, or an op ringlet does not have: refused first
    options = optimizer_options(
        op=op, gradient_predivide_factor=gradient_predivide_factor,
        backward_passes_per_step=backward_passes_per_step, num_groups=num_groups,
        groups=groups, compression=compression, sparse_as_dense=sparse_as_dense)
    if isinstance(options.groups, list) and any(
            not isinstance(p, torch.Tensor) for group in options.groups for p in group):
        raise ValueError("groups must consist of torch.Tensor.")  # Horovod's words
    ringlet.init()
    ringlet_set(process_set)
    cls = type(optimizer.__class__.__name__, (optimizer.__class__,),
               dict(_DistributedOptimizer.__dict__))
    return cls(optimizer.param_groups, named_parameters, options, process_set, shared_gradients)


def broadcast_optimizer_state(optimizer: torch.optim.Optimizer, root_rank: int) -> None:
    """Make every rank's optimizer state (momentum buffers, Adam moments, step counts,
    hyperparameters) equal to ``root_rank``'s.

    As Horovod does, a fresh optimizer's state is first made by one step on zero gradients
    (for the parameters that require grad; parameters without them keep ``grad = None``), so
    that there is a state to send; an optimizer that still has none is stateless."""
    if isinstance(optimizer, torch.optim.LBFGS):
        raise ValueError("cannot broadcast torch.optim.LBFGS state")
    if not optimizer.state_dict()["state"]:
        for group in optimizer.param_groups:
            for p in group["params"]:
                if p.requires_grad:
                    p.grad = torch.zeros_like(p)
                    if isinstance(optimizer, torch.optim.SparseAdam):
                        p.grad = p.grad.to_sparse()
        if getattr(optimizer, "_ringlet_distributed", False):
            # Its step() would allreduce the zeros: a collective the caller did not ask for.
            super(optimizer.__class__, optimizer).step()
        else:
            optimizer.step()
    state = api.broadcast_object(optimizer.state_dict(), root_rank)
    optimizer.load_state_dict(state)
