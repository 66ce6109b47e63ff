"""Training step time: ringlet's DistributedOptimizer against PyTorch DDP on gloo and against
no communication at all, in one run, blocks of steps interleaved.

    mpirun -n 2 python benchmarks/train_bench.py [--models mlp,convnet] [--rounds 6]
        [--steps 10] [--json FILE] [--plot FILE] [--markdown]

Models (synthetic data, batch 32 per rank, SGD with momentum, one PyTorch thread per rank):
- ``mlp``: 1024-2048-2048-1280-512-10, 9.58M parameters in 10 arrays (36.5 MiB of gradients);
- ``convnet``: three 3x3 convolutions and two linear layers on 3x32x32 images, 2.2M
  parameters, far more compute per byte of gradient.

Each path trains its own copy of the model from the same initial weights on the same batches:
- ``none``: plain SGD on each rank, no communication (the floor);
- ``ringlet``: ``ringlet.hvd.torch.DistributedOptimizer`` (buckets as it chooses them, its
  operations matched as ``ringlet.hvd`` matches them by default: by name);
- ``ddp``: ``torch.nn.parallel.DistributedDataParallel`` on the gloo backend.

A round runs a block of steps of each path, in an order that rotates from round to round; a
step's time and parts are those of its slowest rank. Each block starts with untimed steps
(``--block-warmup``, every path alike): a path's first steps after another's are not its
steady state (name matching's negotiation starts afresh with each of its blocks, and its first
two steps announce the buckets' names and set up their lone runs: 2-12 ms more each). Printed
per model and path: the median step and the medians of its parts:
- compute: forward and backward (for ringlet, with its allreduces running in the background);
- exposed: communication still running after backward (ringlet: ``synchronize()``; DDP waits
  inside backward, so its exposed part is its forward+backward minus the ``none`` path's);
- pack: ringlet's packing and unpacking of fused runs, if any (from ``ringlet.stats()``);
- update: ``zero_grad()`` and ``optimizer.step()``.
At the end the ringlet and DDP models must hold equal parameters on every rank (exit 1 if not).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import socket
import statistics
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import date
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from mpi4py import MPI
from torch import nn

import ringlet
import ringlet.hvd.torch as hvd
from ringlet import _core
from ringlet.hvd._api import use_matching
from ringlet.hvd._negotiation import DEFAULT_MATCHING

BATCH = 32
PATHS = ("none", "ringlet", "ddp")
PARTS = ("compute", "exposed", "pack", "update")
# Also recorded, not a part of the step: the time ringlet's collectives ran in the background.
MEASURES = (*PARTS, "collectives")


def mlp() -> nn.Module:
    widths = (1024, 2048, 2048, 1280, 512, 10)
    layers: list[nn.Module] = []
    for fan_in, fan_out in zip(widths, widths[1:]):
        layers += [nn.Linear(fan_in, fan_out), nn.ReLU()]
    return nn.Sequential(*layers[:-1])


def convnet() -> nn.Module:
    return nn.Sequential(
        nn.Conv2d(3, 32, 3, padding=1), nn.ReLU(),
        nn.Conv2d(32, 64, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(64, 128, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(), nn.Linear(128 * 8 * 8, 256), nn.ReLU(), nn.Linear(256, 10),
    )


MODELS: dict[str, tuple[Callable[[], nn.Module], tuple[int, ...]]] = {
    "mlp": (mlp, (1024,)),
    "convnet": (convnet, (3, 32, 32)),
}


def batch(shape: tuple[int, ...], step: int) -> tuple[torch.Tensor, torch.Tensor]:
    """This rank's batch for ``step``: the same for every path, different on every rank."""
    g = torch.Generator().manual_seed(1_000_003 * ringlet.rank() + step)
    return torch.randn((BATCH, *shape), generator=g), torch.randint(0, 10, (BATCH,), generator=g)


@dataclass
class Variant:
    """ringlet run another way: how its comm thread waits, how large its buckets are, whether
    its gradients live in shared memory."""

    wait: tuple[int, int] | None = None  # (spin_us, max_sleep_us); None: the default
    fusion_threshold: str | None = None  # RINGLET_FUSION_THRESHOLD; None: the model's
    shared_gradients: bool = False  # DistributedOptimizer(shared_gradients=True)
    matching: str = DEFAULT_MATCHING  # ringlet.hvd's RINGLET_HVD_MATCHING: "order" or "name"

    @classmethod
    def parse(cls, spec: str) -> Variant:
        """``spin=1000,sleep=0,buckets=64M,shared=1,matching=order`` (each optional)."""
        fields = dict(item.split("=", 1) for item in spec.split(",") if item)
        wait = None
        if "spin" in fields or "sleep" in fields:
            default_spin, default_sleep = _core.wait_policy()
            wait = (int(fields.get("spin", default_spin)), int(fields.get("sleep", default_sleep)))
        buckets = fields.get("buckets")
        if buckets is not None:
            units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
            scale = units.get(buckets[-1].upper(), 1)
            buckets = str(int(buckets.rstrip("KkMmGg")) * scale)
        return cls(wait, buckets, fields.get("shared", "0") not in ("0", ""),
                   fields.get("matching", DEFAULT_MATCHING))


@dataclass
class Path:
    """One way of training one model, with its per-step timings."""

    name: str
    model: nn.Module
    optimizer: torch.optim.Optimizer
    shape: tuple[int, ...]
    variant: Variant = field(default_factory=Variant)
    steps_done: int = 0
    parts: dict[str, list[float]] = field(default_factory=lambda: {p: [] for p in MEASURES})

    def step(self) -> dict[str, float]:
        x, y = batch(self.shape, self.steps_done)
        self.steps_done += 1
        stats_before = _stats_seconds()
        start = time.perf_counter()
        self.optimizer.zero_grad()
        zeroed = time.perf_counter()
        loss = nn.functional.cross_entropy(self.model(x), y)
        loss.backward()
        backward = time.perf_counter()
        if self.name.startswith("ringlet"):
            self.optimizer.synchronize()
            synced = time.perf_counter()
            with self.optimizer.skip_synchronize():
                self.optimizer.step()
        else:
            synced = backward
            self.optimizer.step()
        end = time.perf_counter()
        stats = {k: v - stats_before.get(k, 0.0) for k, v in _stats_seconds().items()}
        return {
            "compute": backward - zeroed,
            "exposed": synced - backward,
            "pack": stats.pop("pack", 0.0),
            "update": (zeroed - start) + (end - synced),
            "collectives": sum(stats.values()),
        }


def _stats_seconds() -> dict[str, float]:
    return {name: usage["seconds"] for name, usage in ringlet.stats().items()}


def build_paths(name: str, variants: dict[str, Variant]) -> dict[str, Path]:
    make, shape = MODELS[name]
    torch.manual_seed(0)
    initial = make().state_dict()
    paths = {}
    for path in (*PATHS, *variants):
        variant = variants.get(path, Variant())
        model = make()
        model.load_state_dict(initial)
        if path == "ddp":
            model = nn.parallel.DistributedDataParallel(model)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
        if path.startswith("ringlet"):
            with _environment("RINGLET_FUSION_THRESHOLD", variant.fusion_threshold):
                optimizer = hvd.DistributedOptimizer(
                    optimizer, named_parameters=model.named_parameters(),
                    shared_gradients=variant.shared_gradients)
        paths[path] = Path(path, model, optimizer, shape, variant)
    return paths


@contextlib.contextmanager
def _environment(name: str, value: str | None) -> Iterator[None]:
    old = os.environ.get(name)
    if value is not None:
        os.environ[name] = value
    try:
        yield
    finally:
        if old is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = old


@contextlib.contextmanager
def _matching(path: Path) -> Iterator[None]:
    """A ringlet path's matching for ringlet.hvd while it runs (name matching's negotiation
    runs only then, so that it costs the other paths nothing)."""
    use_matching(path.variant.matching if path.name.startswith("ringlet") else "order")
    try:
        yield
    finally:
        use_matching("order")


def run_block(path: Path, steps: int, comm: MPI.Comm, warmup: int = 0) -> None:
    default_wait = _core.wait_policy()
    if path.variant.wait is not None:
        _core.wait_policy(*path.variant.wait)
    comm.Barrier()
    with _matching(path):
        for _ in range(warmup):
            path.step()
        local = np.array([[t[p] for p in MEASURES]
                          for t in (path.step() for _ in range(steps))])
    # A step takes as long as its slowest rank, and its parts are that rank's (the parts' own
    # maxima would add one rank's compute to another's wait for it).
    every = np.stack(comm.allgather(local))  # (rank, step, measure)
    totals = every[:, :, :len(PARTS)].sum(axis=2)
    slowest = every[totals.argmax(axis=0), np.arange(steps)]
    _core.wait_policy(*default_wait)
    for column, part in enumerate(MEASURES):
        path.parts[part].extend(slowest[:, column].tolist())


def parameters_agree(paths: dict[str, Path], comm: MPI.Comm) -> tuple[bool, bool]:
    """(ringlet's parameters equal DDP's here, and every rank holds the same ringlet ones)."""
    ours = [p.detach() for p in paths["ringlet"].model.parameters()]
    theirs = [p.detach() for p in paths["ddp"].model.module.parameters()]
    equal = all(torch.equal(a, b) for a, b in zip(ours, theirs))
    flat = torch.cat([p.reshape(-1) for p in ours]).numpy()
    first = flat.copy()
    comm.Bcast(first, root=0)
    return bool(comm.allreduce(equal, MPI.LAND)), bool(
        comm.allreduce(bool(np.array_equal(first, flat)), MPI.LAND))


def summarize(paths: dict[str, Path]) -> dict[str, dict[str, float]]:
    none_compute = statistics.median(paths["none"].parts["compute"])
    out = {}
    for name, path in paths.items():
        totals = [sum(path.parts[p][i] for p in PARTS) for i in range(len(path.parts["compute"]))]
        row = {part: statistics.median(values) for part, values in path.parts.items()}
        if name == "ddp":  # DDP waits inside backward: what exceeds the no-comm compute
            row["exposed"] = max(row["compute"] - none_compute, 0.0)
            row["compute"] -= row["exposed"]
        row["step"] = statistics.median(totals)
        row["step_min"] = min(totals)
        out[name] = row
    return out


def print_table(model: str, rows: dict[str, dict[str, float]], steps: int) -> None:
    floor = rows["none"]["step"]
    print(f"\n{model}: median of {steps} steps per path (ms), slowest rank per step")
    print("| path | step | min | compute | exposed comm | pack | update | collectives (background)"
          " | / none | / ddp |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for name, row in rows.items():
        cells = [row[k] * 1e3 for k in ("step", "step_min", *MEASURES)]
        print(f"| {name} | " + " | ".join(f"{c:.1f}" for c in cells)
              + f" | {row['step'] / floor:.2f}x | {row['step'] / rows['ddp']['step']:.2f}x |")


def plot(results: dict[str, Any], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    models = list(results["models"])
    fig, axes = plt.subplots(1, len(models), figsize=(6 * len(models), 4.5), squeeze=False)
    colors = {"compute": "#4c72b0", "exposed": "#dd8452", "pack": "#c44e52", "update": "#55a868"}
    for ax, model in zip(axes[0], models):
        rows = results["models"][model]["paths"]
        bottom = np.zeros(len(rows))
        for part in PARTS:
            heights = np.array([rows[p][part] * 1e3 for p in rows])
            ax.bar(list(rows), heights, bottom=bottom, color=colors[part], label=part)
            bottom += heights
        ax.set_title(f"{model}, N={results['ranks']}: median of each part of a step")
        ax.set_ylabel("ms")
        ax.tick_params(axis="x", labelrotation=30)
        for label in ax.get_xticklabels():
            label.set_horizontalalignment("right")
    axes[0][0].legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def init_gloo(comm: MPI.Comm) -> None:
    """torch.distributed on gloo, rendezvous on a free local port chosen by rank 0."""
    port = 0
    if comm.rank == 0:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
    port = comm.bcast(port, root=0)
    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=comm.rank, world_size=comm.size)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="mlp,convnet")
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--steps", type=int, default=10, help="steps per block")
    parser.add_argument("--warmup", type=int, default=3, help="untimed steps per path first")
    parser.add_argument("--block-warmup", type=int, default=2,
                        help="untimed steps at the start of every block")
    parser.add_argument(
        "--variant", action="append", default=[], metavar="NAME=SPEC",
        help="another ringlet path, e.g. spinning=spin=1000,sleep=0, one-bucket=buckets=64M or "
             "shared=shared=1 (gradients in shared memory), by-order=matching=order (ringlet.hvd's "
             "order matching)")
    parser.add_argument("--json", help="write the medians here")
    parser.add_argument("--plot", help="write a bar chart of the step breakdown here (PNG)")
    args = parser.parse_args()
    torch.set_num_threads(1)
    comm = MPI.COMM_WORLD
    ringlet.init()
    hvd.init()
    init_gloo(comm)
    results: dict[str, Any] = {
        "command": " ".join(["mpirun", "-n", str(comm.size), "python", *sys.argv]),
        "date": date.today().isoformat(), "machine": f"{platform.node()}, {os.cpu_count()} cores",
        "ranks": comm.size, "rounds": args.rounds, "steps_per_block": args.steps,
        "block_warmup": args.block_warmup, "models": {},
    }
    variants = {}
    for item in args.variant:
        name, _, spec = item.partition("=")
        variants[f"ringlet:{name}"] = Variant.parse(spec)
    results["wait_policy_us"] = _core.wait_policy()
    results["variants"] = {name: vars(v) for name, v in variants.items()}
    agreed = True
    for model in args.models.split(","):
        paths = build_paths(model, variants)
        for path in paths.values():
            with _matching(path):
                for _ in range(args.warmup):
                    path.step()
        names = list(paths)
        for round_ in range(args.rounds):
            order = names[round_ % len(names):] + names[:round_ % len(names)]
            for name in order:
                run_block(paths[name], args.steps, comm, args.block_warmup)
        equal_to_ddp, same_everywhere = parameters_agree(paths, comm)
        agreed &= equal_to_ddp and same_everywhere
        rows = summarize(paths)
        params = sum(p.numel() for p in paths["none"].model.parameters())
        results["models"][model] = {
            "parameters": params, "paths": rows,
            "equal_to_ddp": equal_to_ddp, "equal_across_ranks": same_everywhere,
        }
        if comm.rank == 0:
            print_table(f"{model} ({params / 1e6:.1f}M parameters)", rows,
                        args.rounds * args.steps)
            print(f"parameters after {paths['ringlet'].steps_done} steps: equal to DDP's: "
                  f"{equal_to_ddp}; equal on every rank: {same_everywhere}")
    if comm.rank == 0:
        if args.json:
            with open(args.json, "w") as f:
                json.dump(results, f, indent=1)
        if args.plot:
            plot(results, args.plot)
    dist.destroy_process_group()
    return 0 if agreed else 1


if __name__ == "__main__":
    sys.exit(main())
