#!/usr/bin/env python3
"""Train an MLP on scikit-learn's digits with DDP (gloo, CPU) and survive spot interruptions.

Launch (one node, two ranks)::

    torchrun --standalone --nproc-per-node=2 examples/train_digits.py \\
        --steps 300 --checkpoint-every 50 --checkpoint-dir /tmp/digits-ckpt

The checkpoint directory is ``$SLURM_SPOT_CHECKPOINT_DIR`` (exported by slurm-spot's
TaskProlog) or else ``--checkpoint-dir``; the run resumes from the newest valid checkpoint in it.
On the preemption signal (SIGUSR2 unless ``SLURM_SPOT_PREEMPT_SIGNAL`` says otherwise) or SIGTERM
all ranks stop after the same step, save a checkpoint and exit with the requeue code (85).

Reference weights: ``--reference`` trains the same steps without reading or writing any
checkpoint; its ``done`` line's ``weights_sha256`` is what an interrupted and resumed run must
end with (the run is deterministic for a given world size, seed and step count).

Rank 0 prints one JSON object per line on stdout::

    {"event": "start", "step": 0, "world_size": 2, "restarts": 0}
    {"event": "resume", "step": 120, "checkpoint": "/ck/step_000000120", "restarts": 1}
    {"event": "step", "step": 130, "epoch": 4, "loss": 0.4121}
    {"event": "checkpoint", "step": 150, "path": "/ck/step_000000150", "reason": "periodic"}
    {"event": "preempted", "step": 163, "signal": 12, "checkpoint": "/ck/step_000000163"}
    {"event": "done", "step": 300, "loss": 0.0912, "weights_sha256": "3f1c..."}

``step`` events come every ``--log-every`` steps with rank 0's batch loss; ``checkpoint`` events
are the periodic saves (the preemption save is in the ``preempted`` line, whose ``signal`` is
the number rank 0 received, or null when only another rank got it); ``done`` has the mean loss
over the whole data set with dropout off and the sha256 of the final weights. With
``--timestamps`` every event also has ``time`` (seconds since the epoch) and ``start``/``resume``
have ``process_started`` (when this process started, from /proc), ``started`` (when ``main()``
began: the imports are done), ``process_group`` (gloo is up) and ``restoring`` (before the
checkpoint is read): ``slurm-spot demo`` times recovery with them (slurm_spot/recovery.py).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import random
import sys
import time
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from sklearn.datasets import load_digits
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

from slurm_spot.checkpoint import Checkpointer, SkipSampler, TrainState
from slurm_spot.checkpoint.preemption import PreemptionHandler
from slurm_spot.contract import jobenv
from slurm_spot.recovery import process_started


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--steps", type=int, default=300, help="total optimizer steps")
    p.add_argument("--checkpoint-dir", help="used when $SLURM_SPOT_CHECKPOINT_DIR is unset")
    p.add_argument("--checkpoint-every", type=int, default=50, help="steps between checkpoints")
    p.add_argument("--keep", type=int, default=2, help="checkpoints to keep")
    p.add_argument("--step-sleep", type=float, default=0.0, help="seconds to sleep per step")
    p.add_argument("--batch-size", type=int, default=32, help="per rank")
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--log-every", type=int, default=10, help="steps between step events")
    p.add_argument("--workers", type=int, default=0, help="DataLoader worker processes")
    p.add_argument("--reference", action="store_true",
                   help="no checkpoints read or written: prints the reference weights hash")
    p.add_argument("--timestamps", action="store_true",
                   help="add 'time' (seconds since the epoch) to every event, and 'started' "
                        "(when main() began, after the imports) to start/resume")
    return p.parse_args(argv)


def emit(rank: int, **event: Any) -> None:
    """One JSON line on stdout, from rank 0 only."""
    if rank == 0:
        print(json.dumps(event), flush=True)


def weights_sha256(model: nn.Module) -> str:
    """sha256 over every parameter and buffer: names and raw bytes, in state_dict order."""
    digest = hashlib.sha256()
    for name, tensor in model.state_dict().items():
        digest.update(name.encode())
        digest.update(tensor.detach().cpu().contiguous().numpy().tobytes())
    return digest.hexdigest()


def make_model() -> nn.Module:
    return nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Dropout(0.2),
                         nn.Linear(128, 64), nn.ReLU(), nn.Dropout(0.1), nn.Linear(64, 10))


def evaluate(model: nn.Module, data: TensorDataset) -> float:
    """Mean cross-entropy over the whole data set, dropout off."""
    model.eval()
    with torch.no_grad():
        x, y = data.tensors
        loss = float(nn.functional.cross_entropy(model(x), y))
    model.train()
    return round(loss, 6)


def checkpoint_directory(args: argparse.Namespace) -> str | None:
    if args.reference:
        return None
    directory = jobenv.checkpoint_dir(os.environ) or args.checkpoint_dir
    if directory is None:
        sys.exit("train_digits: set $SLURM_SPOT_CHECKPOINT_DIR or pass --checkpoint-dir "
                 "(or --reference)")
    return str(directory)


def main(argv: list[str] | None = None) -> None:
    started = time.time()
    args = parse_args(argv)
    directory = checkpoint_directory(args)
    handler = PreemptionHandler().install()  # first: from here on a signal only sets a flag
    distributed = "WORLD_SIZE" in os.environ
    if distributed:
        dist.init_process_group("gloo")
    times = {"process_started": process_started(), "started": round(started, 3),
             "process_group": round(time.time(), 3)}
    rank = dist.get_rank() if distributed else 0
    world = dist.get_world_size() if distributed else 1

    def say(**event: Any) -> None:
        if args.timestamps:
            event["time"] = round(time.time(), 3)
            if event["event"] in ("start", "resume"):
                event.update(times)
        emit(rank, **event)

    torch.use_deterministic_algorithms(True)
    torch.set_num_threads(1)
    torch.manual_seed(args.seed)  # the same initial weights on every rank
    digits = load_digits()
    data = TensorDataset(torch.tensor(digits.data / 16.0, dtype=torch.float32),
                         torch.tensor(digits.target, dtype=torch.long))
    sampler = SkipSampler(DistributedSampler(data, num_replicas=world, rank=rank, shuffle=True,
                                             seed=args.seed, drop_last=True))
    loader = DataLoader(data, batch_size=args.batch_size, sampler=sampler, drop_last=True,
                        num_workers=args.workers, worker_init_fn=handler.worker_init_fn,
                        generator=torch.Generator().manual_seed(args.seed))
    net = make_model()
    model: nn.Module = DistributedDataParallel(net) if distributed else net
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=100, gamma=0.5)
    state = TrainState(model, optimizer, scheduler)
    # Each rank draws its own dropout masks (and python/numpy numbers) from here on.
    torch.manual_seed(args.seed + 1000 * (rank + 1))
    random.seed(args.seed + rank)
    np.random.seed(args.seed + rank)

    ckpt = Checkpointer(directory, keep=args.keep) if directory else None
    restarts = jobenv.restart_count(os.environ)
    times["restoring"] = round(time.time(), 3)
    found = ckpt.restore(state) if ckpt else None
    if found is not None:
        say(event="resume", step=state.step, checkpoint=str(found.path), restarts=restarts)
    else:
        say(event="start", step=state.step, world_size=world, restarts=restarts)

    loss = torch.zeros(())
    while state.step < args.steps:
        sampler.set_epoch(state.epoch)
        sampler.skip(state.batch_in_epoch * args.batch_size)
        for x, y in loader:
            optimizer.zero_grad()
            loss = nn.functional.cross_entropy(model(x), y)
            loss.backward()
            optimizer.step()
            scheduler.step()
            # A little python/numpy randomness, as augmentation code would draw.
            state.extra["noise"] = random.random() + float(np.random.rand())
            state.step += 1
            state.batch_in_epoch += 1
            if state.step % args.log_every == 0:
                say(event="step", step=state.step, epoch=state.epoch,
                     loss=round(float(loss.detach()), 6))
            time.sleep(args.step_sleep)
            stop = handler.should_stop() and state.step < args.steps
            periodic = state.step % args.checkpoint_every == 0 or state.step == args.steps
            path = ckpt.save(state) if ckpt and (stop or periodic) else None
            if path is not None and not stop:
                say(event="checkpoint", step=state.step, path=str(path), reason="periodic")
            if stop:
                say(event="preempted", step=state.step, signal=handler.received_signal,
                     checkpoint=str(path) if path else None)
                handler.exit_for_requeue()
            if state.step >= args.steps:
                break
        else:
            state.epoch += 1
            state.batch_in_epoch = 0

    say(event="done", step=state.step, loss=evaluate(net, data),
         weights_sha256=weights_sha256(net))
    if distributed:
        # Every rank gets here before any closes its gloo pairs: a peer that tears down while
        # another still talks to it makes gloo abort the process (SIGABRT) on its way out.
        dist.barrier()
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
