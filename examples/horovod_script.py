"""A Horovod PyTorch script, unchanged but for its import, run with ringletrun.

    ringletrun -np 2 python examples/horovod_script.py [--epochs 3] [--fp16-allreduce]

Written as Horovod's own PyTorch MNIST example is (DistributedSampler, learning rate scaled by
the number of ranks, parameters and optimizer state broadcast from rank 0, DistributedOptimizer
with optional fp16 compression, metrics averaged with hvd.allreduce), on scikit-learn's 8x8
digits so that it needs no download. The one line that differs from a Horovod script is marked.
"""

import argparse

import torch
import torch.nn as nn
import torch.nn.functional as F
import torch.optim as optim
import torch.utils.data.distributed
from sklearn.datasets import load_digits

import ringlet.hvd.torch as hvd  # was: import horovod.torch as hvd

parser = argparse.ArgumentParser(description="PyTorch digits example")
parser.add_argument("--batch-size", type=int, default=32, help="input batch size per rank")
parser.add_argument("--epochs", type=int, default=3, help="number of epochs to train")
parser.add_argument("--lr", type=float, default=0.05, help="learning rate")
parser.add_argument("--momentum", type=float, default=0.5, help="SGD momentum")
parser.add_argument("--seed", type=int, default=42, help="random seed")
parser.add_argument("--fp16-allreduce", action="store_true", help="use fp16 compression")
parser.add_argument("--sync-batch-norm", action="store_true", help="use hvd.SyncBatchNorm")


class Net(nn.Module):
    def __init__(self, norm):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 16, kernel_size=3, padding=1)
        self.norm = norm(16)
        self.conv2 = nn.Conv2d(16, 32, kernel_size=3, padding=1)
        self.fc1 = nn.Linear(32 * 2 * 2, 64)
        self.fc2 = nn.Linear(64, 10)

    def forward(self, x):
        x = F.relu(F.max_pool2d(self.norm(self.conv1(x)), 2))
        x = F.relu(F.max_pool2d(self.conv2(x), 2))
        x = F.relu(self.fc1(x.flatten(1)))
        return F.log_softmax(self.fc2(x), dim=1)


def datasets():
    digits = load_digits()
    images = torch.tensor(digits.images, dtype=torch.float32).unsqueeze(1) / 16.0
    labels = torch.tensor(digits.target)
    cut = int(0.8 * len(labels))
    return (torch.utils.data.TensorDataset(images[:cut], labels[:cut]),
            torch.utils.data.TensorDataset(images[cut:], labels[cut:]))


def metric_average(value, name):
    return hvd.allreduce(torch.tensor(value), name=name).item()


def main():
    args = parser.parse_args()
    hvd.init()
    torch.manual_seed(args.seed)
    torch.set_num_threads(1)

    train_dataset, test_dataset = datasets()
    train_sampler = torch.utils.data.distributed.DistributedSampler(
        train_dataset, num_replicas=hvd.size(), rank=hvd.rank())
    train_loader = torch.utils.data.DataLoader(
        train_dataset, batch_size=args.batch_size, sampler=train_sampler)
    test_sampler = torch.utils.data.distributed.DistributedSampler(
        test_dataset, num_replicas=hvd.size(), rank=hvd.rank(), shuffle=False)
    test_loader = torch.utils.data.DataLoader(
        test_dataset, batch_size=args.batch_size, sampler=test_sampler)

    model = Net(hvd.SyncBatchNorm if args.sync_batch_norm else nn.BatchNorm2d)
    optimizer = optim.SGD(model.parameters(), lr=args.lr * hvd.size(), momentum=args.momentum)
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(optimizer, root_rank=0)
    compression = hvd.Compression.fp16 if args.fp16_allreduce else hvd.Compression.none
    optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters(),
                                         compression=compression, op=hvd.Average)

    for epoch in range(1, args.epochs + 1):
        model.train()
        train_sampler.set_epoch(epoch)
        for data, target in train_loader:
            optimizer.zero_grad()
            loss = F.nll_loss(model(data), target)
            loss.backward()
            optimizer.step()
        model.eval()
        test_loss, correct, seen = 0.0, 0.0, 0.0
        with torch.no_grad():
            for data, target in test_loader:
                output = model(data)
                test_loss += F.nll_loss(output, target, reduction="sum").item()
                correct += output.argmax(dim=1).eq(target).sum().item()
                seen += len(target)
        test_loss = metric_average(test_loss / seen, "avg_loss")
        accuracy = metric_average(correct / seen, "avg_accuracy")
        if hvd.rank() == 0:
            print(f"epoch {epoch}: test loss {test_loss:.4f}, accuracy {100 * accuracy:.1f}% "
                  f"({hvd.size()} ranks)", flush=True)


if __name__ == "__main__":
    main()
