"""What an elastic commit costs a training step: make bench-train's MLP (9.58M parameters,
SGD with momentum, batch 32 per rank) trained by ringlet.hvd.torch, with and without
``state.commit()`` after every step, in alternating blocks of one run (so the machine's swings
hit both alike). Run it under ringletrun's elastic driver, so that rank 0's commits really go
to the driver:

    ringletrun -np 2 --min-np 2 -H localhost:2 python benchmarks/elastic_commit_bench.py

It prints, per block kind, the median step in ms over the blocks' medians, and their ratio."""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parent))

from train_bench import BATCH, MODELS

import ringlet.hvd.torch as hvd

parser = argparse.ArgumentParser()
parser.add_argument("--model", default="mlp", choices=sorted(MODELS))
parser.add_argument("--rounds", type=int, default=5)
parser.add_argument("--steps", type=int, default=10, help="steps per block")
args = parser.parse_args()

torch.set_num_threads(1)
hvd.init()
build, shape = MODELS[args.model]
torch.manual_seed(0)
model = build()
optimizer = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9),
                                     named_parameters=model.named_parameters())
generator = torch.Generator().manual_seed(hvd.rank())
x = torch.randn((BATCH, *shape), generator=generator)
y = torch.randint(0, 10, (BATCH,), generator=generator)


def step() -> None:
    optimizer.zero_grad()
    nn.functional.cross_entropy(model(x), y).backward()
    optimizer.step()


@hvd.elastic.run
def bench(state: hvd.elastic.TorchState) -> dict[str, list[float]]:
    times: dict[str, list[float]] = {"plain": [], "commit": []}
    for _ in range(3):
        step()
        state.commit()
    for _ in range(args.rounds):
        for kind in ("plain", "commit"):
            block = []
            for _ in range(args.steps):
                started = time.perf_counter()
                step()
                if kind == "commit":
                    state.commit()
                block.append(time.perf_counter() - started)
            # The slowest rank sets the step.
            times[kind].append(max(hvd.allgather_object(statistics.median(block))))
    return times


state = hvd.elastic.TorchState(model, optimizer, batch=0)
times = bench(state)
if hvd.rank() == 0:
    plain, commit = (statistics.median(times[k]) * 1e3 for k in ("plain", "commit"))
    ratios = [c / p for p, c in zip(times["plain"], times["commit"], strict=True)]
    print(f"{args.model}, {hvd.size()} ranks, {args.rounds} rounds of {args.steps} steps: step "
          f"{plain:.1f} ms, with a commit {commit:.1f} ms; ratio {statistics.median(ratios):.3f} "
          f"(range {min(ratios):.3f}-{max(ratios):.3f})", flush=True)
