"""Data-parallel training with ringlet's Horovod API: an MLP on scikit-learn's digits.

    mpirun -n 2 python examples/train_digits.py [--epochs 30] [--batch-size 32]

The script is a Horovod script with one changed import (``ringlet.hvd.torch`` for
``horovod.torch``). Each rank trains on its shard of the training set; DistributedOptimizer
averages the gradients across ranks during backward(). Rank 0 prints the loss and test accuracy
per epoch, and a summary of the communication at the end.
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import torch
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split

import ringlet
import ringlet.hvd.torch as hvd


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=30)
    parser.add_argument("--batch-size", type=int, default=32, help="per rank")
    parser.add_argument("--lr", type=float, default=1e-3, help="scaled by the number of ranks")
    args = parser.parse_args()

    hvd.init()
    torch.manual_seed(0)  # the same data split everywhere; the model is broadcast anyway
    torch.set_num_threads(1)  # one core per rank

    digits = load_digits()
    features = (digits.data / 16.0).astype(np.float32)
    x_train, x_test, y_train, y_test = train_test_split(
        features, digits.target, test_size=0.2, random_state=0, stratify=digits.target
    )
    # Each rank trains on every size()-th sample.
    shard = slice(hvd.rank(), None, hvd.size())
    x_train = torch.from_numpy(x_train[shard])
    y_train = torch.from_numpy(y_train[shard]).long()
    x_test, y_test = torch.from_numpy(x_test), torch.from_numpy(y_test).long()

    torch.manual_seed(1000 + hvd.rank())  # different initial weights: broadcast fixes that
    model = torch.nn.Sequential(
        torch.nn.Linear(64, 128), torch.nn.ReLU(),
        torch.nn.Linear(128, 64), torch.nn.ReLU(),
        torch.nn.Linear(64, 10),
    )
    optimizer = torch.optim.Adam(model.parameters(), lr=args.lr * hvd.size())
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(optimizer, root_rank=0)
    optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters())
    loss_fn = torch.nn.CrossEntropyLoss()

    ringlet.reset_stats()
    started = time.perf_counter()
    for epoch in range(1, args.epochs + 1):
        model.train()
        order = torch.randperm(len(x_train), generator=torch.Generator().manual_seed(epoch))
        total, batches = 0.0, 0
        for start in range(0, len(order), args.batch_size):
            batch = order[start:start + args.batch_size]
            optimizer.zero_grad()
            loss = loss_fn(model(x_train[batch]), y_train[batch])
            loss.backward()
            optimizer.step()
            total, batches = total + loss.item(), batches + 1
        mean_loss = hvd.allreduce(torch.tensor([total / batches])).item()
        model.eval()
        with torch.no_grad():
            accuracy = (model(x_test).argmax(dim=1) == y_test).float().mean().item()
        if hvd.rank() == 0:
            print(f"epoch {epoch:3d}  loss {mean_loss:.4f}  test accuracy {accuracy:.4f}",
                  flush=True)
    elapsed = time.perf_counter() - started

    # Every rank must hold the same model.
    checksum = sum(p.double().sum().item() for p in model.parameters())
    same = hvd.allgather_object(checksum)
    if hvd.rank() == 0:
        print(f"\ntrained in {elapsed:.1f} s on {hvd.size()} ranks; final test accuracy "
              f"{accuracy:.4f}; parameters identical on every rank: {len(set(same)) == 1}")
        print("communication (rank 0):")
        print(f"  {'algorithm':<20}{'calls':>8}{'MiB':>10}{'seconds':>10}")
        for name, use in sorted(ringlet.stats().items()):
            print(f"  {name:<20}{use['calls']:>8}{use['bytes'] / 2**20:>10.2f}"
                  f"{use['seconds']:>10.3f}")
    if accuracy < 0.95:
        raise SystemExit(f"test accuracy {accuracy:.4f} is below 0.95")


if __name__ == "__main__":
    main()
