"""The collectives for torch tensors: the tensors' backend, and Horovod's differentiable
collectives (its autograd functions and backward rules)."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

import ringlet

from .._api import api
from .._backend import Backend, register_backend
from .._ops import OPS, Average, Compression, Sum, ringlet_op
from .._process_sets import global_process_set, ringlet_set, set_rank, set_size

__all__ = ["TorchBackend", "allgather", "allreduce", "alltoall", "broadcast",
           "grouped_allgather", "grouped_allreduce", "grouped_reducescatter", "reducescatter",
           "sparse_allreduce_async"]


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

# ---- differentiable collectives (Horovod's autograd functions and backward rules) ----------


def _differentiable(tensors: Any) -> bool:
    return torch.is_grad_enabled() and any(t.requires_grad for t in tensors)


class _Allreduce(torch.autograd.Function):
    """The gradient of an allreduce is the allreduce of the gradient, same op and factors."""

    @staticmethod
    def forward(ctx: Any, tensor: torch.Tensor, op: Any, prescale: float, postscale: float,
                compression: Any, process_set: Any) -> torch.Tensor:
        ctx.reduction = (op, prescale, postscale, process_set)
        return api.allreduce(tensor, op=op, prescale_factor=prescale,
                             postscale_factor=postscale, compression=compression,
                             process_set=process_set)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> Any:
        op, prescale, postscale, process_set = ctx.reduction
        return (api.allreduce(grad.contiguous(), op=op, prescale_factor=prescale,
                              postscale_factor=postscale, process_set=process_set),
                None, None, None, None, None)


class _GroupedAllreduce(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, reduction: tuple[Any, float, float, Any, Any],
                *tensors: torch.Tensor) -> tuple[torch.Tensor, ...]:
        op, prescale, postscale, compression, process_set = reduction
        ctx.reduction = (op, prescale, postscale, process_set)
        return tuple(api.grouped_allreduce(list(tensors), op=op, prescale_factor=prescale,
                                           postscale_factor=postscale,
                                           compression=compression, process_set=process_set))

    @staticmethod
    def backward(ctx: Any, *grads: torch.Tensor) -> Any:
        op, prescale, postscale, process_set = ctx.reduction
        reduced = api.grouped_allreduce([g.contiguous() for g in grads], op=op,
                                        prescale_factor=prescale, postscale_factor=postscale,
                                        process_set=process_set)
        return (None, *reduced)


def _own_rows(grads: list[torch.Tensor], rows: list[int], process_set: Any) -> list[Any]:
    """Each gradient averaged over the ranks, narrowed to this rank's rows of it (the allgather
    backward rule: Horovod 0.28's; it summed before 0.20)."""
    reduced = api.grouped_allreduce([g.contiguous() for g in grads], op=Average,
                                    process_set=process_set)
    everyone = api.allgather_object(rows, process_set=process_set)
    me = set_rank(process_set)
    return [r.narrow(0, sum(other[i] for other in everyone[:me]), n)
            for i, (r, n) in enumerate(zip(reduced, rows))]


class _Allgather(torch.autograd.Function):
    """The gradient of an allgather is this rank's rows of the gradient averaged over ranks."""

    @staticmethod
    def forward(ctx: Any, tensor: torch.Tensor, process_set: Any) -> torch.Tensor:
        ctx.rows, ctx.process_set = tensor.shape[0], process_set
        return api.allgather(tensor, process_set=process_set)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> Any:
        return _own_rows([grad], [ctx.rows], ctx.process_set)[0], None


class _GroupedAllgather(torch.autograd.Function):
    """``_Allgather``'s rule for each tensor."""

    @staticmethod
    def forward(ctx: Any, process_set: Any, *tensors: torch.Tensor) -> tuple[torch.Tensor, ...]:
        ctx.rows, ctx.process_set = [t.shape[0] for t in tensors], process_set
        return tuple(api.grouped_allgather(list(tensors), process_set=process_set))

    @staticmethod
    def backward(ctx: Any, *grads: torch.Tensor) -> Any:
        return (None, *_own_rows(list(grads), ctx.rows, ctx.process_set))


def _scattered_grads(grads: list[torch.Tensor], reduction: tuple[Any, float, float, Any]
                     ) -> list[Any]:
    """The reducescatter backward rule, Horovod's: every rank's gradient gathered, times the
    set's size for Sum, times both factors."""
    op, prescale, postscale, process_set = reduction
    factor = (set_size(process_set) if op == Sum else 1) * prescale * postscale
    scaled = [g.contiguous() * factor if factor != 1 else g.contiguous() for g in grads]
    return api.grouped_allgather(scaled, process_set=process_set)


class _Reducescatter(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, tensor: torch.Tensor, op: Any, prescale: float, postscale: float,
                process_set: Any) -> torch.Tensor:
        ctx.reduction = (op, prescale, postscale, process_set)
        return api.reducescatter(tensor, op=op, process_set=process_set,
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
        return tuple(api.grouped_reducescatter(
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
        output, received = api.alltoall(tensor, splits, process_set=process_set)
        ctx.received, ctx.process_set = received, process_set
        ctx.mark_non_differentiable(received)
        return output, received

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor, _received_grad: Any) -> Any:
        sent_back, _ = api.alltoall(grad.contiguous(), ctx.received,
                                    process_set=ctx.process_set)
        return sent_back, None, None


class _Broadcast(torch.autograd.Function):
    """The gradient of a broadcast goes to the root: the average over ranks of the gradient
    there, zeros elsewhere (Horovod's rule)."""

    @staticmethod
    def forward(ctx: Any, tensor: torch.Tensor, root_rank: int, process_set: Any) -> torch.Tensor:
        ctx.root_rank, ctx.process_set = root_rank, process_set
        return api.broadcast(tensor, root_rank, process_set=process_set)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> Any:
        reduced = api.allreduce(grad.contiguous(), op=Average, process_set=ctx.process_set)
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
    op = OPS[ringlet_op(average, op)]
    if not _tensors_need_grad([tensor]):
        return api.allreduce(tensor, name=name, op=op, compression=compression,
                             process_set=process_set, prescale_factor=prescale_factor,
                             postscale_factor=postscale_factor)
    ringlet_set(process_set)
    return _Allreduce.apply(tensor, op, prescale_factor, postscale_factor, compression,
                            process_set)


def grouped_allreduce(tensors: Any, average: Any = None, name: Any = None,
                      compression: Any = Compression.none, op: Any = None,
                      prescale_factor: float = 1.0, postscale_factor: float = 1.0,
                      process_set: Any = global_process_set) -> list[Any]:
    """Horovod's ``grouped_allreduce``: new tensors, differentiable like ``allreduce``."""
    op = OPS[ringlet_op(average, op)]
    tensors = list(tensors)
    if not _tensors_need_grad(tensors):
        return api.grouped_allreduce(tensors, name=name, op=op, compression=compression,
                                     process_set=process_set, prescale_factor=prescale_factor,
                                     postscale_factor=postscale_factor)
    ringlet_set(process_set)
    reduction = (op, prescale_factor, postscale_factor, compression, process_set)
    return list(_GroupedAllreduce.apply(reduction, *tensors))


def allgather(tensor: Any, name: Any = None, process_set: Any = global_process_set) -> Any:
    """Horovod's ``allgather``: differentiable when ``tensor`` requires grad."""
    if not _tensors_need_grad([tensor]):
        return api.allgather(tensor, name, process_set)
    ringlet_set(process_set)
    return _Allgather.apply(tensor, process_set)


def grouped_allgather(tensors: Any, name: Any = None,
                      process_set: Any = global_process_set) -> list[Any]:
    """Horovod's ``grouped_allgather``: differentiable like ``allgather``."""
    tensors = list(tensors)
    if not _tensors_need_grad(tensors):
        return api.grouped_allgather(tensors, name, process_set)
    ringlet_set(process_set)
    return list(_GroupedAllgather.apply(process_set, *tensors))


def reducescatter(tensor: Any, name: Any = None, compression: Any = Compression.none,
                  op: Any = Average, process_set: Any = global_process_set,
                  prescale_factor: float = 1.0, postscale_factor: float = 1.0) -> Any:
    """Horovod's ``reducescatter``: differentiable when ``tensor`` requires grad."""
    if not _tensors_need_grad([tensor]):
        return api.reducescatter(tensor, name, op, process_set, prescale_factor,
                                 postscale_factor)
    ringlet_set(process_set)
    return _Reducescatter.apply(tensor, op, prescale_factor, postscale_factor, process_set)


def grouped_reducescatter(tensors: Any, name: Any = None, compression: Any = Compression.none,
                          op: Any = Average, process_set: Any = global_process_set,
                          prescale_factor: float = 1.0,
                          postscale_factor: float = 1.0) -> list[Any]:
    """Horovod's ``grouped_reducescatter``: differentiable like ``reducescatter``."""
    tensors = list(tensors)
    if not _tensors_need_grad(tensors):
        return api.grouped_reducescatter(tensors, name, op, process_set, prescale_factor,
                                         postscale_factor)
    ringlet_set(process_set)
    reduction = (op, prescale_factor, postscale_factor, process_set)
    return list(_GroupedReducescatter.apply(reduction, *tensors))


def alltoall(tensor: Any, splits: Any = None, name: Any = None,
             process_set: Any = global_process_set) -> Any:
    """Horovod's ``alltoall``: differentiable when ``tensor`` requires grad; returns the output,
    and with ``splits`` also the received splits."""
    if not _tensors_need_grad([tensor]):
        return api.alltoall(tensor, splits, name, process_set)
    ranks = set_size(process_set)
    if splits is None:
        return _Alltoall.apply(tensor, [tensor.shape[0] // ranks] * ranks, process_set)[0]
    return _Alltoall.apply(tensor, splits, process_set)


def broadcast(tensor: Any, root_rank: int, name: Any = None,
              process_set: Any = global_process_set) -> Any:
    """Horovod's ``broadcast``: a new tensor, differentiable when ``tensor`` requires grad."""
    if not _tensors_need_grad([tensor]):
        return api.broadcast(tensor, root_rank, name, process_set)
    ringlet_set(process_set)
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
    indices = api.allgather(tensor._indices().transpose(0, 1).contiguous(),
                            process_set=process_set)
    values = api.allgather(tensor._values().contiguous(), process_set=process_set)
    if op == Average:
        values = values / set_size(process_set)

    def result() -> torch.Tensor:
        return torch.sparse_coo_tensor(indices.transpose(0, 1), values, tensor.size(),
                                       check_invariants=True)

    return result

