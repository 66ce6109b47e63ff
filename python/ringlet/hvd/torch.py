"""Horovod's PyTorch API on ringlet: replace ``import horovod.torch as hvd`` with
``import ringlet.hvd.torch as hvd`` in a CPU training script.

Tensors go to the Rust core zero-copy (``tensor.numpy()`` views; bfloat16 through an int16
view). ``DistributedOptimizer`` registers a hook on every parameter: when a gradient is ready
during ``backward()``, its bucket's fused allreduce starts in ringlet's background thread, and
``step()`` waits for all of them first. Everything runs on CPU tensors. The collectives
(allreduce, allgather, broadcast, reducescatter, alltoall, and the grouped ones) are
differentiable, with Horovod's backward rules.
"""

from __future__ import annotations

import contextlib
import itertools
import time
import warnings
from collections.abc import Iterator
from typing import Any

import numpy as np

try:
    import torch
except ImportError as exc:  # pragma: no cover - torch is an optional extra
    raise ImportError(
        "ringlet.hvd.torch needs PyTorch: pip install 'ringlet[torch]'"
    ) from exc

import ringlet

from . import *  # noqa: F403 - the same API, now also for torch tensors
from . import __all__ as _hvd_all
from ._common import (
    _OPS,
    Adasum,
    Average,
    Backend,
    Compression,
    Sum,
    _collectively,
    _op_name,
    _ringlet_set,
    _set_rank,
    _set_size,
    global_process_set,
    register_backend,
)
from ._common import Horovod as _Horovod
from .timeline import Timeline


class TorchBackend(Backend):
    def array(self, tensor: Any) -> np.ndarray:
        if not isinstance(tensor, torch.Tensor):
            raise TypeError(f"expected a torch.Tensor, got {type(tensor).__name__}")
        if tensor.device.type != "cpu":
            raise ValueError(f"ringlet reduces CPU tensors; this one is on {tensor.device}")
        if tensor.is_sparse:
            raise ValueError("sparse tensors are reduced by sparse_allreduce_async (or by "
                             "DistributedOptimizer); densify them for the other collectives")
        plain = tensor.detach()
        if plain.dtype == torch.bfloat16:
            import ml_dtypes

            return plain.view(torch.int16).numpy().view(ml_dtypes.bfloat16)
        try:
            return plain.numpy()
        except TypeError as exc:
            raise TypeError(f"ringlet cannot reduce {tensor.dtype}: {exc}") from None

    def tensor(self, array: np.ndarray, like: Any) -> Any:
        if array.dtype.name == "bfloat16":
            return torch.from_numpy(array.view(np.int16)).view(torch.bfloat16)
        return torch.from_numpy(array)

    def dtype(self, tensor: Any) -> Any:
        return tensor.dtype

    def is_floating(self, tensor: Any) -> bool:
        return bool(tensor.dtype.is_floating_point)

    def cast(self, tensor: Any, dtype: Any) -> Any:
        return tensor.to(getattr(torch, dtype) if isinstance(dtype, str) else dtype)

    def assign(self, tensor: Any, array: np.ndarray) -> None:
        view = self.array(tensor)
        if view.__array_interface__["data"][0] == array.__array_interface__["data"][0]:
            return  # reduced in the tensor's own memory
        with torch.no_grad():
            tensor.copy_(self.tensor(array, tensor).reshape(tensor.shape))


register_backend(torch.Tensor, TorchBackend())
_api = _Horovod()


# ---- differentiable collectives (Horovod's autograd functions and backward rules) ----------


def _differentiable(tensors: Any) -> bool:
    return torch.is_grad_enabled() and any(t.requires_grad for t in tensors)


class _Allreduce(torch.autograd.Function):
    """The gradient of an allreduce is the allreduce of the gradient, same op and factors."""

    @staticmethod
    def forward(ctx: Any, tensor: torch.Tensor, op: Any, prescale: float, postscale: float,
                compression: Any, process_set: Any) -> torch.Tensor:
        ctx.reduction = (op, prescale, postscale, process_set)
        return _api.allreduce(tensor, op=op, prescale_factor=prescale,
                              postscale_factor=postscale, compression=compression,
                              process_set=process_set)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> Any:
        op, prescale, postscale, process_set = ctx.reduction
        return (_api.allreduce(grad.contiguous(), op=op, prescale_factor=prescale,
                               postscale_factor=postscale, process_set=process_set),
                None, None, None, None, None)


class _GroupedAllreduce(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, reduction: tuple[Any, float, float, Any, Any],
                *tensors: torch.Tensor) -> tuple[torch.Tensor, ...]:
        op, prescale, postscale, compression, process_set = reduction
        ctx.reduction = (op, prescale, postscale, process_set)
        return tuple(_api.grouped_allreduce(list(tensors), op=op, prescale_factor=prescale,
                                            postscale_factor=postscale,
                                            compression=compression, process_set=process_set))

    @staticmethod
    def backward(ctx: Any, *grads: torch.Tensor) -> Any:
        op, prescale, postscale, process_set = ctx.reduction
        reduced = _api.grouped_allreduce([g.contiguous() for g in grads], op=op,
                                         prescale_factor=prescale, postscale_factor=postscale,
                                         process_set=process_set)
        return (None, *reduced)


def _own_rows(grads: list[torch.Tensor], rows: list[int], process_set: Any) -> list[Any]:
    """Each gradient averaged over the ranks, narrowed to this rank's rows of it (the allgather
    backward rule: Horovod 0.28's; it summed before 0.20)."""
    reduced = _api.grouped_allreduce([g.contiguous() for g in grads], op=Average,
                                     process_set=process_set)
    everyone = _api.allgather_object(rows, process_set=process_set)
    me = _set_rank(process_set)
    return [r.narrow(0, sum(other[i] for other in everyone[:me]), n)
            for i, (r, n) in enumerate(zip(reduced, rows))]


class _Allgather(torch.autograd.Function):
    """The gradient of an allgather is this rank's rows of the gradient averaged over ranks."""

    @staticmethod
    def forward(ctx: Any, tensor: torch.Tensor, process_set: Any) -> torch.Tensor:
        ctx.rows, ctx.process_set = tensor.shape[0], process_set
        return _api.allgather(tensor, process_set=process_set)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> Any:
        return _own_rows([grad], [ctx.rows], ctx.process_set)[0], None


class _GroupedAllgather(torch.autograd.Function):
    """``_Allgather``'s rule for each tensor."""

    @staticmethod
    def forward(ctx: Any, process_set: Any, *tensors: torch.Tensor) -> tuple[torch.Tensor, ...]:
        ctx.rows, ctx.process_set = [t.shape[0] for t in tensors], process_set
        return tuple(_api.grouped_allgather(list(tensors), process_set=process_set))

    @staticmethod
    def backward(ctx: Any, *grads: torch.Tensor) -> Any:
        return (None, *_own_rows(list(grads), ctx.rows, ctx.process_set))


def _scattered_grads(grads: list[torch.Tensor], reduction: tuple[Any, float, float, Any]
                     ) -> list[Any]:
    """The reducescatter backward rule, Horovod's: every rank's gradient gathered, times the
    set's size for Sum, times both factors."""
    op, prescale, postscale, process_set = reduction
    factor = (_set_size(process_set) if op == Sum else 1) * prescale * postscale
    scaled = [g.contiguous() * factor if factor != 1 else g.contiguous() for g in grads]
    return _api.grouped_allgather(scaled, process_set=process_set)


class _Reducescatter(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, tensor: torch.Tensor, op: Any, prescale: float, postscale: float,
                process_set: Any) -> torch.Tensor:
        ctx.reduction = (op, prescale, postscale, process_set)
        return _api.reducescatter(tensor, op=op, process_set=process_set,
                                  prescale_factor=prescale, postscale_factor=postscale)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> Any:
        return _scattered_grads([grad], ctx.reduction)[0], None, None, None, None


class _GroupedReducescatter(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, reduction: tuple[Any, float, float, Any],
                *tensors: torch.Tensor) -> tuple[torch.Tensor, ...]:
        op, prescale, postscale, process_set = reduction
        ctx.reduction = reduction
        return tuple(_api.grouped_reducescatter(
            list(tensors), op=op, process_set=process_set, prescale_factor=prescale,
            postscale_factor=postscale))

    @staticmethod
    def backward(ctx: Any, *grads: torch.Tensor) -> Any:
        return (None, *_scattered_grads(list(grads), ctx.reduction))


class _Alltoall(torch.autograd.Function):
    """The gradient of an alltoall is the alltoall of the gradient, sent back along the rows
    it came from (Horovod's rule)."""

    @staticmethod
    def forward(ctx: Any, tensor: torch.Tensor, splits: Any, process_set: Any) -> Any:
        output, received = _api.alltoall(tensor, splits, process_set=process_set)
        ctx.received, ctx.process_set = received, process_set
        ctx.mark_non_differentiable(received)
        return output, received

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor, _received_grad: Any) -> Any:
        sent_back, _ = _api.alltoall(grad.contiguous(), ctx.received,
                                     process_set=ctx.process_set)
        return sent_back, None, None


class _Broadcast(torch.autograd.Function):
    """The gradient of a broadcast goes to the root: the average over ranks of the gradient
    there, zeros elsewhere (Horovod's rule)."""

    @staticmethod
    def forward(ctx: Any, tensor: torch.Tensor, root_rank: int, process_set: Any) -> torch.Tensor:
        ctx.root_rank, ctx.process_set = root_rank, process_set
        return _api.broadcast(tensor, root_rank, process_set=process_set)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> Any:
        reduced = _api.allreduce(grad.contiguous(), op=Average, process_set=ctx.process_set)
        if ringlet.rank() != ctx.root_rank:
            reduced = torch.zeros_like(reduced)
        return reduced, None, None


def _tensors_need_grad(tensors: list[Any]) -> bool:
    return all(isinstance(t, torch.Tensor) for t in tensors) and _differentiable(tensors)


def allreduce(tensor: Any, average: Any = None, name: Any = None,
              compression: Any = Compression.none, op: Any = None,
              prescale_factor: float = 1.0, postscale_factor: float = 1.0,
              process_set: Any = global_process_set) -> Any:
    """Horovod's ``allreduce``: a new tensor, differentiable when ``tensor`` requires grad."""
    op = _OPS[_op_name(average, op)]
    if not _tensors_need_grad([tensor]):
        return _api.allreduce(tensor, name=name, op=op, compression=compression,
                              process_set=process_set, prescale_factor=prescale_factor,
                              postscale_factor=postscale_factor)
    _ringlet_set(process_set)
    return _Allreduce.apply(tensor, op, prescale_factor, postscale_factor, compression,
                            process_set)


def grouped_allreduce(tensors: Any, average: Any = None, name: Any = None,
                      compression: Any = Compression.none, op: Any = None,
                      prescale_factor: float = 1.0, postscale_factor: float = 1.0,
                      process_set: Any = global_process_set) -> list[Any]:
    """Horovod's ``grouped_allreduce``: new tensors, differentiable like ``allreduce``."""
    op = _OPS[_op_name(average, op)]
    tensors = list(tensors)
    if not _tensors_need_grad(tensors):
        return _api.grouped_allreduce(tensors, name=name, op=op, compression=compression,
                                      process_set=process_set, prescale_factor=prescale_factor,
                                      postscale_factor=postscale_factor)
    _ringlet_set(process_set)
    reduction = (op, prescale_factor, postscale_factor, compression, process_set)
    return list(_GroupedAllreduce.apply(reduction, *tensors))


def allgather(tensor: Any, name: Any = None, process_set: Any = global_process_set) -> Any:
    """Horovod's ``allgather``: differentiable when ``tensor`` requires grad."""
    if not _tensors_need_grad([tensor]):
        return _api.allgather(tensor, name, process_set)
    _ringlet_set(process_set)
    return _Allgather.apply(tensor, process_set)


def grouped_allgather(tensors: Any, name: Any = None,
                      process_set: Any = global_process_set) -> list[Any]:
    """Horovod's ``grouped_allgather``: differentiable like ``allgather``."""
    tensors = list(tensors)
    if not _tensors_need_grad(tensors):
        return _api.grouped_allgather(tensors, name, process_set)
    _ringlet_set(process_set)
    return list(_GroupedAllgather.apply(process_set, *tensors))


def reducescatter(tensor: Any, name: Any = None, compression: Any = Compression.none,
                  op: Any = Average, process_set: Any = global_process_set,
                  prescale_factor: float = 1.0, postscale_factor: float = 1.0) -> Any:
    """Horovod's ``reducescatter``: differentiable when ``tensor`` requires grad."""
    if not _tensors_need_grad([tensor]):
        return _api.reducescatter(tensor, name, op, process_set, prescale_factor,
                                  postscale_factor)
    _ringlet_set(process_set)
    return _Reducescatter.apply(tensor, op, prescale_factor, postscale_factor, process_set)


def grouped_reducescatter(tensors: Any, name: Any = None, compression: Any = Compression.none,
                          op: Any = Average, process_set: Any = global_process_set,
                          prescale_factor: float = 1.0,
                          postscale_factor: float = 1.0) -> list[Any]:
    """Horovod's ``grouped_reducescatter``: differentiable like ``reducescatter``."""
    tensors = list(tensors)
    if not _tensors_need_grad(tensors):
        return _api.grouped_reducescatter(tensors, name, op, process_set, prescale_factor,
                                          postscale_factor)
    _ringlet_set(process_set)
    reduction = (op, prescale_factor, postscale_factor, process_set)
    return list(_GroupedReducescatter.apply(reduction, *tensors))


def alltoall(tensor: Any, splits: Any = None, name: Any = None,
             process_set: Any = global_process_set) -> Any:
    """Horovod's ``alltoall``: differentiable when ``tensor`` requires grad; returns the output,
    and with ``splits`` also the received splits."""
    if not _tensors_need_grad([tensor]):
        return _api.alltoall(tensor, splits, name, process_set)
    ranks = _set_size(process_set)
    if splits is None:
        return _Alltoall.apply(tensor, [tensor.shape[0] // ranks] * ranks, process_set)[0]
    return _Alltoall.apply(tensor, splits, process_set)


def broadcast(tensor: Any, root_rank: int, name: Any = None,
              process_set: Any = global_process_set) -> Any:
    """Horovod's ``broadcast``: a new tensor, differentiable when ``tensor`` requires grad."""
    if not _tensors_need_grad([tensor]):
        return _api.broadcast(tensor, root_rank, name, process_set)
    _ringlet_set(process_set)
    return _Broadcast.apply(tensor, root_rank, process_set)


def sparse_allreduce_async(tensor: torch.Tensor, name: Any = None, op: Any = Average,
                           process_set: Any = global_process_set) -> Any:
    """Horovod's: the reduction of a sparse COO tensor, as the allgather of every rank's
    indices and values (their duplicates add up when the result is coalesced), divided by the
    set's size for Average. Returns a function that returns the result, as Horovod's does."""
    if not (isinstance(tensor, torch.Tensor) and tensor.is_sparse):
        raise ValueError("sparse_allreduce_async takes a sparse COO tensor")
    if op not in (Average, Sum):
        raise ValueError("sparse_allreduce_async supports Sum and Average")
    # Allgather concatenates the first dimension: indices travel transposed.
    indices = _api.allgather(tensor._indices().transpose(0, 1).contiguous(),
                             process_set=process_set)
    values = _api.allgather(tensor._values().contiguous(), process_set=process_set)
    if op == Average:
        values = values / _set_size(process_set)

    def result() -> torch.Tensor:
        return torch.sparse_coo_tensor(indices.transpose(0, 1), values, tensor.size(),
                                       check_invariants=True)

    return result


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


class SyncBatchNorm(torch.nn.modules.batchnorm._BatchNorm):
    """Batch normalization over the batches of all ranks together, for CPU tensors (Horovod's
    runs on GPUs only), as a drop-in for ``torch.nn.BatchNorm1d/2d/3d``.

    In training, each channel's mean and variance are those of every rank's batch: one
    allreduce of the per-channel sums and counts, one of the squared deviations from the mean
    (two passes, as exact as BatchNorm's own). Both allreduces are differentiable, so backward
    sums the statistics' gradients over ranks, as PyTorch's SyncBatchNorm does. Every rank
    must call it in the same order. In evaluation, or on one rank, it is plain BatchNorm."""

    def _check_input_dim(self, input: torch.Tensor) -> None:
        if input.dim() < 2:
            raise ValueError(f"expected at least 2D input (got {input.dim()}D input)")

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        self._check_input_dim(input)
        factor = 0.0
        if self.training and self.track_running_stats and self.num_batches_tracked is not None:
            self.num_batches_tracked.add_(1)
            factor = (1.0 / float(self.num_batches_tracked) if self.momentum is None
                      else self.momentum)
        if not self.training and self.track_running_stats:
            return torch.nn.functional.batch_norm(
                input, self.running_mean, self.running_var, self.weight, self.bias, False, 0.0,
                self.eps)
        channels = input.shape[1]
        dims = [0, *range(2, input.dim())]
        shape = [1, channels] + [1] * (input.dim() - 2)
        local = torch.cat([input.sum(dims), input.new_full((1,), input.numel() / channels)])
        total = allreduce(local, op=Sum)
        count = float(total[-1].detach())
        if count <= 1:
            raise ValueError("Expected more than 1 value per channel when training, got "
                             f"input size {list(input.shape)} on all ranks together")
        mean = total[:-1] / count
        centered = input - mean.reshape(shape)
        var = allreduce((centered * centered).sum(dims), op=Sum) / count
        output = centered * torch.rsqrt(var + self.eps).reshape(shape)
        if self.affine:
            output = output * self.weight.reshape(shape) + self.bias.reshape(shape)
        if self.training and self.track_running_stats:
            with torch.no_grad():
                self.running_mean.mul_(1 - factor).add_(mean.detach(), alpha=factor)
                unbiased = var.detach() * (count / (count - 1))
                self.running_var.mul_(1 - factor).add_(unbiased, alpha=factor)
        return output


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
    state = _api.broadcast_object(optimizer.state_dict(), root_rank)
    optimizer.load_state_dict(state)


_optimizers = itertools.count()
"""Numbers the DistributedOptimizers this process makes (their buckets' names)."""


class _DistributedOptimizer(torch.optim.Optimizer):
    """Mixed into the user's optimizer class by ``DistributedOptimizer``."""

    _ringlet_distributed = True

    def __init__(self, params: Any, named_parameters: Any, compression: Any,
                 backward_passes_per_step: int, op: Any, gradient_predivide_factor: float,
                 groups: Any, sparse_as_dense: bool, process_set: Any,
                 shared_gradients: bool = False) -> None:
        super(self.__class__, self).__init__(params)
        self._compression = compression
        self._op = _op_name(None, op)
        self._prescale = 1.0 / gradient_predivide_factor
        self._postscale = gradient_predivide_factor
        self._passes = backward_passes_per_step
        self._sparse_as_dense = sparse_as_dense
        self._process_set = process_set
        params = [p for group in self.param_groups for p in group["params"] if p.requires_grad]
        self._parameter_names = _parameter_names(self.param_groups, named_parameters)
        """Each parameter's name (Horovod's attribute; "allreduce.noname.<i>" if unnamed)."""
        if process_set is not None and not process_set.included():
            params = []  # outside its process set, it is the wrapped optimizer (as Horovod's)
        # Planning is collective (rank 0 plans for all): with name matching, in its turn.
        self._buckets = _collectively("plan_buckets", lambda: _buckets(
            params, groups, _ringlet_set(process_set)), process_set) if params else []
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
            self._place_gradients(_ringlet_set(process_set))
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
            storage = _collectively("empty", lambda total=total, members=members: ringlet.empty(
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
            handle = _api.grouped_allreduce_async_(
                [flat], name=self._bucket_name(bucket), op=_OPS[self._op],
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
                    p.grad, self._parameter_names.get(p), _OPS[self._op], self._process_set)))
            else:
                grads.append(p.grad)
        submitted = time.perf_counter()
        dense = _api.grouped_allreduce_async_(
            grads, name=self._bucket_name(bucket), op=_OPS[self._op],
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
        """Load as the wrapped optimizer does, and forget gradients in flight (as Horovod)."""
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
    if isinstance(groups, int) and groups > 0:
        size = -(-len(params) // groups)
        return [params[i:i + size] for i in range(0, len(params), size)]
    if groups:
        wanted = [list(g) for g in groups]
        listed = {id(p) for g in wanted for p in g}
        rest = [p for p in params if id(p) not in listed]
        return [g for g in wanted if g] + [[p] for p in rest]
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
    if gradient_predivide_factor != 1.0 and op != Average:
        raise ValueError("gradient_predivide_factor not supported with op != Average")
    if backward_passes_per_step < 1:
        raise ValueError("backward_passes_per_step must be >= 1")
    if op == Adasum:
        raise NotImplementedError("Adasum is not supported by ringlet; use Average or Sum")
    ringlet.init()
    _ringlet_set(process_set)
    cls = type(optimizer.__class__.__name__, (optimizer.__class__,),
               dict(_DistributedOptimizer.__dict__))
    return cls(optimizer.param_groups, named_parameters, compression, backward_passes_per_step,
               op, gradient_predivide_factor, groups if groups is not None else num_groups,
               sparse_as_dense, process_set, shared_gradients)


__all__ = [*_hvd_all, "DistributedOptimizer", "SyncBatchNorm", "broadcast_optimizer_state",
           "sparse_allreduce_async"]
