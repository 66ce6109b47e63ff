"""Elastic training with Horovod's API on ringlet: Horovod's elastic PyTorch example, with one
changed import. Run it under ringletrun's elastic driver, for example

    ringletrun -np 4 --min-np 2 --max-np 8 --host-discovery-script ./hosts.sh \
        python examples/elastic_train.py

A rank or host that fails is left out and training resumes from the last commit; hosts that
the discovery script adds join at the next commit (docs/guide/elastic.md)."""

import torch
import torch.nn.functional as F

import ringlet.hvd.torch as hvd  # was: import horovod.torch as hvd

hvd.init()
torch.manual_seed(0)
data = torch.randn(512, 20)
target = (data.sum(1) > 0).long()
dataset = torch.utils.data.TensorDataset(data, target)

lr = 0.01
model = torch.nn.Sequential(torch.nn.Linear(20, 32), torch.nn.ReLU(), torch.nn.Linear(32, 2))
optimizer = torch.optim.SGD(model.parameters(), lr=lr * hvd.size(), momentum=0.9)
optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters())
sampler = hvd.elastic.ElasticSampler(dataset, shuffle=True)
batch_size, epochs = 16, 3


@hvd.elastic.run
def train(state):
    while state.epoch < epochs:
        loader = torch.utils.data.DataLoader(dataset, batch_size=batch_size, sampler=sampler)
        for batch, (x, y) in enumerate(loader, start=state.batch):
            optimizer.zero_grad()
            loss = F.cross_entropy(model(x), y)
            loss.backward()
            optimizer.step()
            sampler.record_batch(batch, batch_size)
            state.batch = batch + 1
            state.commit()
        if hvd.rank() == 0:
            print(f"epoch {state.epoch}: loss {loss.item():.4f} on {hvd.size()} ranks",
                  flush=True)
        state.epoch, state.batch = state.epoch + 1, 0
        sampler.set_epoch(state.epoch)
        state.commit()


def on_state_reset():
    for group in optimizer.param_groups:
        group["lr"] = lr * hvd.size()


state = hvd.elastic.TorchState(model, optimizer, sampler=sampler, epoch=0, batch=0)
state.register_reset_callbacks([on_state_reset])
train(state)
