"""The model that tests/elastic's training script trains, and the single-process reference
that replays it: a linear regression in float64 whose per-rank gradients are rounded to
multiples of 2**-24 before they are summed, so that their sum is exact in any order and the
reference can reproduce every rank's weights bit for bit from the steps the job made (each
step's world size decides how the batch was split)."""

from __future__ import annotations

import numpy as np
import torch

FEATURES = 4
BATCH = 8
SAMPLES = 64
LEARNING_RATE = 0.05
QUANTUM = 2.0 ** 24

_rng = np.random.default_rng(1234)
DATA = torch.from_numpy(_rng.standard_normal((SAMPLES, FEATURES)))
TARGET = torch.from_numpy(DATA.numpy() @ np.array([1.5, -2.0, 0.5, 3.0]) + 0.25)


def new_model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Linear(FEATURES, 1).double()


def shard(epoch: int, batch: int, batches_per_epoch: int, rank: int, size: int) -> torch.Tensor:
    """The sample indices rank ``rank`` of ``size`` trains on at (epoch, batch)."""
    step = epoch * batches_per_epoch + batch
    indices = (np.arange(BATCH) + step * BATCH) % SAMPLES
    return torch.from_numpy(indices[rank::size])


def local_gradients(model: torch.nn.Module, indices: torch.Tensor) -> list[torch.Tensor]:
    """This rank's gradient of the summed squared error, rounded to multiples of 1/QUANTUM."""
    model.zero_grad()
    output = model(DATA[indices]).squeeze(1)
    ((output - TARGET[indices]) ** 2).sum().backward()
    return [torch.round(p.grad * QUANTUM) / QUANTUM for p in model.parameters()]


def apply(model: torch.nn.Module, summed: list[torch.Tensor], size: int) -> None:
    with torch.no_grad():
        for p, g in zip(model.parameters(), summed, strict=True):
            p.sub_(LEARNING_RATE * (g / size) / BATCH)


def weights_hex(model: torch.nn.Module) -> str:
    return "".join(p.detach().numpy().tobytes().hex() for p in model.parameters())


def replay(steps: list[tuple[int, int, int]], batches_per_epoch: int) -> str:
    """The weights after ``steps`` ((epoch, batch, world size) in order), as one process."""
    model = new_model()
    for epoch, batch, size in steps:
        parts = [local_gradients(model, shard(epoch, batch, batches_per_epoch, r, size))
                 for r in range(size)]
        summed = [sum(p[i] for p in parts) for i in range(len(parts[0]))]
        apply(model, summed, size)
    return weights_hex(model)
