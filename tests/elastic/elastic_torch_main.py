"""The training script of tests/elastic's scenarios: Horovod's
test/integration/data/elastic_torch_main.py, rewritten for ringletrun and made exact
(exact_model.py) so that a recovered run can be compared bit for bit with a replay.

Per epoch rank 0 logs one JSON line (epoch, batch, commits, host, rank, size, rendezvous),
as Horovod's does; at every step it also logs (epoch, batch, size) to LOG.steps, and at the
end every rank writes its weights to LOG.weights.RANK. --exit-schedule maps "(epoch, batch)"
to the slots ("host[local_rank]") that fail there, each once (a marker file remembers it); a
job without the driver (ULFM's, under plain mpirun) names its slots by MPI_COMM_WORLD's rank
("rank[N]"), which stays as ranks die and ringlet's numbering shrinks."""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

import exact_model

import ringlet.hvd.torch as hvd

parser = argparse.ArgumentParser()
parser.add_argument("--batches-per-epoch", type=int, default=4)
parser.add_argument("--batches-per-commit", type=int, default=1)
parser.add_argument("--epochs", type=int, default=3)
parser.add_argument("--epoch-wait", type=float, default=0.0)
parser.add_argument("--logfile", required=True)
parser.add_argument("--discovery-schedule", default="[]")
parser.add_argument("--discovery-wait", type=float, default=10.0)
parser.add_argument("--exit-schedule", default="{}")
parser.add_argument("--exit-mode", default="exception", choices=["exception", "kill"])
args = parser.parse_args()

hvd.init()
slots = os.environ.get("RINGLET_ELASTIC_SLOTS", "").split(",")
if slots[0]:
    host, _, local = slots[hvd.rank()].rpartition(":")
    slot = f"{host}[{local}]"
else:
    host, slot = "", f"rank[{os.environ['OMPI_COMM_WORLD_RANK']}]"

model = exact_model.new_model()
discovery_schedule = json.loads(args.discovery_schedule)
epoch_to_hosts = {epoch: hosts for epoch, hosts in discovery_schedule if epoch is not None}
default_hosts = discovery_schedule[-1][1] if discovery_schedule else []
exit_schedule = json.loads(args.exit_schedule)


def check_exit(epoch: int, batch: int) -> None:
    if slot not in exit_schedule.get(str((epoch, batch)), []):
        return
    marker = Path(f"{args.logfile}.exited.{slot}.{epoch}.{batch}")
    if marker.exists():
        return
    marker.touch()
    if args.exit_mode == "exception":
        raise RuntimeError(f"check_rank and exit epoch={epoch} batch={batch} slot={slot} "
                           f"rank={hvd.rank()}")
    os.kill(os.getpid(), signal.SIGKILL)


def log_state(state: hvd.elastic.TorchState) -> None:
    line = {"epoch": state.epoch, "batch": state.batch, "commits": state.commits,
            "hostname": host, "rank": hvd.rank(), "size": hvd.size(), "pid": os.getpid(),
            "rendezvous": state.rendezvous}
    with open(args.logfile, "a") as log:
        log.write(json.dumps(line) + "\n")


def step(state: hvd.elastic.TorchState) -> None:
    indices = exact_model.shard(state.epoch, state.batch, args.batches_per_epoch, hvd.rank(),
                                hvd.size())
    grads = exact_model.local_gradients(model, indices)
    summed = hvd.grouped_allreduce(grads, op=hvd.Sum, name="grads")
    exact_model.apply(model, summed, hvd.size())
    if hvd.rank() == 0:
        with open(args.logfile + ".steps", "a") as log:
            log.write(json.dumps([state.epoch, state.batch, hvd.size()]) + "\n")


@hvd.elastic.run
def train(state: hvd.elastic.TorchState) -> None:
    state.rendezvous += 1
    while state.epoch < args.epochs:
        while state.batch < args.batches_per_epoch:
            check_exit(state.epoch, state.batch)
            step(state)
            state.batch += 1
            if state.batch % args.batches_per_commit == 0:
                state.commits += 1
                state.commit()
        if hvd.rank() == 0:
            log_state(state)
            current = epoch_to_hosts.get(state.epoch, default_hosts)
            following = epoch_to_hosts.get(state.epoch + 1, default_hosts)
            if args.discovery_wait > 0 and current != following:
                # As Horovod's script: wait for the driver's notice of the change.
                started = time.monotonic()
                link = state._link
                while link is not None and link.hosts_updates <= state._seen_updates:
                    if time.monotonic() - started > args.discovery_wait:
                        raise TimeoutError("timed out waiting for the driver's host update")
                    time.sleep(0.05)
        if args.epoch_wait > 0:
            time.sleep(args.epoch_wait)
        state.epoch += 1
        state.batch = 0
        state.commits += 1
        state.commit()


state = hvd.elastic.TorchState(model, batch=0, epoch=0, commits=0, rendezvous=0)
train(state)
Path(f"{args.logfile}.weights.{hvd.rank()}").write_text(exact_model.weights_hex(model))
