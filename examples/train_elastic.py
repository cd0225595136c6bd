#!/usr/bin/env python3
"""Elastic training on spot nodes: scikit-learn's digits, an MLP, gloo on CPU, any world size.

Submit (2 to 3 nodes; a node that is reclaimed leaves, the others go on)::

    slurm-spot sbatch --torchrun --elastic 2:3 -p spot examples/train_elastic.py --steps 300

What makes it elastic:

- **the same global batch whatever the world size**: every optimizer step uses
  ``--global-batch`` samples (global batch ``k`` of an epoch is the same samples for any world
  size, :mod:`slurm_spot.checkpoint.elastic`); each rank takes its share in micro-batches of
  at most ``--micro-batch`` (gradient accumulation), the gradient of the summed loss / global
  batch is all-reduced (SUM), so every step is the mean-loss gradient over the same samples;
- **no sample skipped or seen twice within an epoch**: the position saved is the number of
  global batches done in the epoch, which does not depend on the world size;
- **leaving**: on the preemption signal (or SIGTERM) all ranks agree at the next step boundary
  (one all-reduce), save one checkpoint, and exit: the ranks that got the preemption signal
  (their node is going) with the requeue code (85), the others with :data:`REJOIN_EXIT` so
  that their torchrun agent re-rendezvouses with the smaller world and restarts them; they
  resume from that checkpoint. A rank whose peer vanished without notice fails in its next
  collective (at the latest after ``--pg-timeout`` seconds) and resumes from the last
  periodic save;
- **joining**: when a node waits in the rendezvous (a replacement), every agent restarts its
  workers with SIGTERM: they save at the same step boundary (the same all-reduce) and resume
  from that step with the larger world, so no step is lost or repeated.

Rank 0 prints one JSON object per line (every event has ``time``, seconds since the epoch)::

    {"event": "start", "step": 0, "world_size": 3, "restarts": 0, "elastic_round": 0}
    {"event": "resume", "step": 40, "world_size": 2, "restarts": 0, "elastic_round": 1, ...}
    {"event": "step", "step": 41, "epoch": 0, "loss": 0.41, "world_size": 2}
    {"event": "leave", "step": 40, "leaving_ranks": [2], "checkpoint": "/ck/step_000000040"}
    {"event": "regroup", "step": 70, "world_size": 2, "checkpoint": "/ck/step_000000070"}
    {"event": "done", "step": 300, "loss": 0.09, "world_size": 2}

``--sample-log FILE``: every rank appends ``{"step", "epoch", "rank", "world", "samples"}``
per step (a test reads it to check each epoch's samples are each used once).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist
from sklearn.datasets import load_digits
from torch import nn

from slurm_spot.checkpoint.checkpointer import Checkpointer, TrainState
from slurm_spot.checkpoint.elastic import (
    epoch_order,
    global_batch_indices,
    micro_batches,
    rank_share,
    steps_per_epoch,
)
from slurm_spot.checkpoint.preemption import PreemptionHandler
from slurm_spot.jobs import jobenv

#: Exit code of a rank that stops only because another node leaves or joins: any non-zero
#: code makes torchrun's agent restart its workers after a new rendezvous; this one says why in
#: the log, and tells the agent that a spent restart budget is an interruption (it requeues).
REJOIN_EXIT = jobenv.REJOIN_EXIT_CODE


#: Samples in scikit-learn's digits data set (``load_digits``): the largest --global-batch.
DIGITS_SAMPLES = 1797


def _count(low: int, high: int | None = None) -> Any:
    """An argparse type: an integer in low..high (argparse turns the ValueError into a usage
    error naming the option)."""
    def parse(text: str) -> int:
        value = int(text)
        if value < low or (high is not None and value > high):
            raise ValueError(text)
        return value
    parse.__name__ = f"integer in {low}..{high if high is not None else 'inf'}"
    return parse


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--steps", type=_count(0), default=300, help="total optimizer steps")
    p.add_argument("--checkpoint-dir", help="used when $SLURM_SPOT_CHECKPOINT_DIR is unset")
    p.add_argument("--checkpoint-every", type=_count(1), default=20, help="steps between saves")
    p.add_argument("--global-batch", type=_count(1, DIGITS_SAMPLES), default=96,
                   help=f"samples per optimizer step (1..{DIGITS_SAMPLES}, the data set)")
    p.add_argument("--micro-batch", type=_count(1), default=32, help="samples per forward pass")
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--step-sleep", type=float, default=0.0, help="seconds to sleep per step")
    p.add_argument("--log-every", type=_count(1), default=10, help="steps between step events")
    p.add_argument("--pg-timeout", type=float, default=30.0,
                   help="seconds a collective may wait for a vanished peer")
    p.add_argument("--sample-log", help="append every rank's samples per step to this file")
    return p.parse_args(argv)


def make_model() -> nn.Module:
    return nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Dropout(0.2),
                         nn.Linear(128, 64), nn.ReLU(), nn.Linear(64, 10))


def evaluate(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> float:
    """Mean cross-entropy over the whole data set, dropout off."""
    model.eval()
    with torch.no_grad():
        loss = float(nn.functional.cross_entropy(model(x), y))
    model.train()
    return round(loss, 6)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    directory = jobenv.checkpoint_dir(os.environ) or args.checkpoint_dir
    if directory is None:
        sys.exit("train_elastic: set $SLURM_SPOT_CHECKPOINT_DIR or pass --checkpoint-dir")
    handler = PreemptionHandler().install()  # first: from here on a signal only sets a flag
    distributed = "WORLD_SIZE" in os.environ
    if distributed:
        dist.init_process_group("gloo", timeout=timedelta(seconds=args.pg_timeout))
    rank = dist.get_rank() if distributed else 0
    world = dist.get_world_size() if distributed else 1
    rounds = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))

    def say(**event: Any) -> None:
        if rank == 0:
            print(json.dumps({**event, "time": round(time.time(), 3)}), flush=True)

    torch.set_num_threads(1)
    torch.manual_seed(args.seed)  # the same initial weights on every rank
    digits = load_digits()
    x_all = torch.tensor(digits.data / 16.0, dtype=torch.float32)
    y_all = torch.tensor(digits.target, dtype=torch.long)
    per_epoch = steps_per_epoch(len(y_all), args.global_batch)
    model = make_model()
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    state = TrainState(model, optimizer)
    torch.manual_seed(args.seed + 1000 * (rank + 1))  # per-rank dropout masks
    ckpt = Checkpointer(directory, keep=2)
    found = ckpt.restore(state)
    restarts = jobenv.restart_count(os.environ)
    if found is not None:
        say(event="resume", step=state.step, epoch=state.epoch, world_size=world,
            restarts=restarts, elastic_round=rounds, checkpoint=str(found.path))
    else:
        say(event="start", step=state.step, world_size=world, restarts=restarts,
            elastic_round=rounds)
    log = open(args.sample_log, "a") if args.sample_log else None
    first = True
    while state.step < args.steps:
        order = epoch_order(len(y_all), state.epoch, args.seed)
        while state.batch_in_epoch < per_epoch and state.step < args.steps:
            mine = rank_share(global_batch_indices(order, state.batch_in_epoch,
                                                   args.global_batch), rank, world)
            optimizer.zero_grad()
            total = torch.zeros(())
            for part in micro_batches(mine, args.micro_batch):
                loss = nn.functional.cross_entropy(model(x_all[part]), y_all[part],
                                                   reduction="sum") / args.global_batch
                loss.backward()
                total += loss.detach()
            for param in model.parameters():
                if param.grad is None:
                    # An empty share (world size > global batch): this rank adds zeros, so
                    # every rank makes the same collective calls below.
                    param.grad = torch.zeros_like(param)
            if distributed:
                # The mean-loss gradient over the whole global batch, whatever the world size.
                for param in model.parameters():
                    dist.all_reduce(param.grad)
                dist.all_reduce(total)
            optimizer.step()
            if log is not None:
                log.write(json.dumps({"step": state.step + 1, "epoch": state.epoch,
                                      "rank": rank, "world": world, "samples": mine}) + "\n")
                log.flush()
            state.step += 1
            state.batch_in_epoch += 1
            if first or state.step % args.log_every == 0:
                say(event="step", step=state.step, epoch=state.epoch,
                    loss=round(float(total), 6), world_size=world)
                first = False
            time.sleep(args.step_sleep)
            stop = handler.should_stop() and state.step < args.steps
            if stop or state.step % args.checkpoint_every == 0:
                path = ckpt.save(state)
            if stop:
                leave(handler, rank, world, state.step, str(path), say)
        if state.batch_in_epoch >= per_epoch:
            state.epoch += 1
            state.batch_in_epoch = 0
    say(event="done", step=state.step, loss=evaluate(model, x_all, y_all), world_size=world)
    if distributed:
        dist.barrier()
        dist.destroy_process_group()


def leave(handler: PreemptionHandler, rank: int, world: int, step: int, path: str,
          say: Any) -> None:
    """After the agreed save: ranks whose node got the preemption signal exit with the requeue
    code, the others with :data:`REJOIN_EXIT` (their agent re-rendezvouses and restarts them).

    SIGTERM alone is the agent restarting its workers (torch/distributed/elastic/agent/server/
    api.py ``_restart_workers``: a node is waiting to join, a replacement; or another worker
    failed) or Slurm ending the step: the rank saved like the others and no node leaves
    (event ``regroup``)."""
    going = handler.received_signal == handler.spec.number
    if dist.is_initialized():
        flags = [torch.zeros(1) for _ in range(world)]
        dist.all_gather(flags, torch.tensor([1.0 if going else 0.0]))
        leaving = [r for r, f in enumerate(flags) if f.item()]
        if leaving:
            say(event="leave", step=step, leaving_ranks=leaving, checkpoint=path)
        else:
            say(event="regroup", step=step, world_size=world, checkpoint=path)
        dist.barrier()
        dist.destroy_process_group()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(handler.exit_code if going else REJOIN_EXIT)


if __name__ == "__main__":
    main()
