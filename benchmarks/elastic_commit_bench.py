"""What an elastic commit costs a training step: make bench-train's MLP (9.58M parameters,
SGD with momentum, batch 32 per rank) trained by ringlet.hvd.torch, with and without
``state.commit()`` after every step, in alternating blocks of one run (so the machine's swings
hit both alike). Run it under ringletrun's elastic driver, so that rank 0's commits really go
to the driver:

    ringletrun -np 2 --min-np 2 -H localhost:2 python benchmarks/elastic_commit_bench.py

Three kinds of block: ``plain`` steps; ``save``, each step followed by ``state.save()`` alone
(the copy of the model and optimizer that Horovod's own commit makes); ``commit``, each step
followed by ``state.commit()`` (the save, the serialization and the send to the driver on rank
0's commit thread, and the small broadcast of host updates). It prints the median step of each
(over the blocks' medians) and each kind's ratio to ``plain``, per round."""

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


def drain(state: hvd.elastic.TorchState) -> None:
    """Until the driver has the last commit: the commit thread's work must not spill into the
    next block."""
    link = state._link
    while link is not None and hvd.rank() == 0 and link.stored() < link._sent:
        time.sleep(0.01)
    hvd.barrier()


@hvd.elastic.run
def bench(state: hvd.elastic.TorchState) -> dict[str, list[float]]:
    times: dict[str, list[float]] = {"plain": [], "save": [], "commit": []}
    for _ in range(3):
        step()
        state.commit()
    for _ in range(args.rounds):
        for kind in ("plain", "save", "commit"):
            block = []
            for _ in range(args.steps):
                started = time.perf_counter()
                step()
                if kind == "commit":
                    state.commit()
                elif kind == "save":
                    state.save()
                block.append(time.perf_counter() - started)
            # The slowest rank sets the step.
            times[kind].append(max(hvd.allgather_object(statistics.median(block))))
            if kind == "commit":
                drain(state)
    return times


state = hvd.elastic.TorchState(model, optimizer, batch=0)
times = bench(state)
if hvd.rank() == 0:
    medians = {k: statistics.median(v) * 1e3 for k, v in times.items()}
    line = [f"{args.model}, {hvd.size()} ranks, {args.rounds} rounds of {args.steps} steps:"]
    line.append(f"step {medians['plain']:.1f} ms")
    for kind in ("save", "commit"):
        ratios = [t / p for p, t in zip(times["plain"], times[kind], strict=True)]
        line.append(f"with {kind} {medians[kind]:.1f} ms, ratio {statistics.median(ratios):.3f} "
                    f"({min(ratios):.3f}-{max(ratios):.3f})")
    print("; ".join(line), flush=True)
