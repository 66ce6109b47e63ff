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

try:
    import torch
except ImportError as exc:  # pragma: no cover - torch is an optional extra
    raise ImportError(
        "ringlet.hvd.torch needs PyTorch: pip install 'ringlet[torch]'"
    ) from exc

from .. import *  # noqa: F403 - the same API, now also for torch tensors
from .. import __all__ as _hvd_all
from .._ops import Sum
from ._collectives import (  # noqa: F401 - torch's own, in place of the NumPy ones
    TorchBackend,
    allgather,
    allreduce,
    alltoall,
    broadcast,
    grouped_allgather,
    grouped_allreduce,
    grouped_reducescatter,
    reducescatter,
    sparse_allreduce_async,
)
from ._optimizer import DistributedOptimizer, broadcast_optimizer_state


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


from . import elastic  # noqa: E402 - hvd.elastic, as in horovod.torch (it uses the above)

__all__ = [*_hvd_all, "DistributedOptimizer", "SyncBatchNorm", "broadcast_optimizer_state",
           "elastic", "sparse_allreduce_async"]
