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
- **or a fixed per-rank batch, the learning rate rescaled** (``--batch-policy scale-lr``):
  every rank takes ``--batch-per-rank`` samples per step, so the global batch is
  ``--batch-per-rank x world`` and the learning rate follows it by the linear scaling rule
  (Goyal et al. 2017, "Accurate, Large Minibatch SGD"): ``--lr x world / --reference-world``
  (``--lr`` is the rate for ``--reference-world`` ranks). Steps take the next samples of the
  epoch's permutation; the position saved is the number of samples consumed in the epoch
  (``TrainState.extra["samples_in_epoch"]``), so a run resumed with another world size goes on
  with the next unseen samples; the last step of an epoch takes what is left (every sample
  once per epoch). A checkpoint of the default policy resumes under either;
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

    {"event": "start", "step": 0, "world_size": 3, "restarts": 0, "elastic_round": 0,
     "batch_policy": "keep-global", "global_batch": 96, "lr": 0.05}
    {"event": "resume", "step": 40, "world_size": 2, "restarts": 0, "elastic_round": 1, ...}
    {"event": "step", "step": 41, "epoch": 0, "loss": 0.41, "world_size": 2, "lr": 0.05}
    {"event": "leave", "step": 40, "leaving_ranks": [2], "checkpoint": "/ck/step_000000040"}
    {"event": "regroup", "step": 70, "world_size": 2, "checkpoint": "/ck/step_000000070"}
    {"event": "done", "step": 300, "loss": 0.09, "world_size": 2}

``--sample-log FILE``: every rank appends ``{"step", "epoch", "rank", "world", "lr",
"samples"}`` per step (a test reads it to check each epoch's samples are each used once).
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
    KEEP_GLOBAL,
    POLICIES,
    POLICY_KEY,
    SAMPLES_KEY,
    SCALE_LR,
    batches_done,
    epoch_order,
    global_batch_indices,
    micro_batches,
    next_samples,
    rank_share,
    samples_done,
    scaled_lr,
    steps_per_epoch,
)
from slurm_spot.checkpoint.preemption import PreemptionHandler
from slurm_spot.contract import jobenv

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


def _positive(text: str) -> float:
    """An argparse type: a finite number > 0."""
    value = float(text)
    if not 0 < value < float("inf"):
        raise ValueError(text)
    return value


_positive.__name__ = "number > 0"


def _non_negative(text: str) -> float:
    """An argparse type: a finite number >= 0."""
    value = float(text)
    if not 0 <= value < float("inf"):
        raise ValueError(text)
    return value


_non_negative.__name__ = "number >= 0"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--steps", type=_count(0), default=300, help="total optimizer steps")
    p.add_argument("--checkpoint-dir", help="used when $SLURM_SPOT_CHECKPOINT_DIR is unset")
    p.add_argument("--checkpoint-every", type=_count(1), default=20, help="steps between saves")
    p.add_argument("--global-batch", type=_count(1, DIGITS_SAMPLES), default=96,
                   help=f"samples per optimizer step (1..{DIGITS_SAMPLES}, the data set; "
                   "keep-global)")
    p.add_argument("--batch-policy", choices=POLICIES, default=KEEP_GLOBAL,
                   help="when the world size changes: keep the global batch (gradient "
                   "accumulation) or keep --batch-per-rank and scale the learning rate")
    p.add_argument("--batch-per-rank", type=_count(1, DIGITS_SAMPLES), default=32,
                   help="samples per rank per optimizer step (scale-lr)")
    p.add_argument("--reference-world", type=_count(1), default=1,
                   help="world size --lr is meant for (scale-lr: lr = --lr x world / this)")
    p.add_argument("--micro-batch", type=_count(1), default=32, help="samples per forward pass")
    p.add_argument("--lr", type=_positive, default=0.05,
                   help="learning rate (scale-lr: for --reference-world ranks)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--step-sleep", type=_non_negative, default=0.0, help="seconds to sleep per step")
    p.add_argument("--log-every", type=_count(1), default=10, help="steps between step events")
    p.add_argument("--pg-timeout", type=_positive, default=30.0,
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
    policy = args.batch_policy
    scale = policy == SCALE_LR
    lr = scaled_lr(args.lr, world, args.reference_world) if scale else args.lr
    for group in optimizer.param_groups:  # restore brought the rate of the world that saved
        group["lr"] = lr
    try:  # the epoch position in samples (an old checkpoint: batch_in_epoch global batches)
        done = samples_done(state.extra, state.batch_in_epoch, args.global_batch)
        if not scale and (SAMPLES_KEY in state.extra
                          or state.extra.get(POLICY_KEY) == SCALE_LR):
            # In global batches of *this* run's --global-batch: the checkpoint's
            # batch_in_epoch counts those of the run that wrote it (scale-lr steps, or
            # another --global-batch), and resuming at it would use samples twice.
            state.batch_in_epoch = batches_done(done, args.global_batch, len(y_all))
    except ValueError as exc:
        print(f"train_elastic: {found.path if found else directory}: {exc}", file=sys.stderr)
        sys.exit(2)
    sizes = {"batch_policy": policy, "lr": lr, **(
        {"batch_per_rank": args.batch_per_rank, "global_batch": args.batch_per_rank * world}
        if scale else {"global_batch": args.global_batch})}
    if found is not None:
        say(event="resume", step=state.step, epoch=state.epoch, world_size=world,
            restarts=restarts, elastic_round=rounds, checkpoint=str(found.path),
            samples_in_epoch=done, **sizes)
    else:
        say(event="start", step=state.step, world_size=world, restarts=restarts,
            elastic_round=rounds, **sizes)
    log = open(args.sample_log, "a") if args.sample_log else None
    first = True

    def epoch_left() -> bool:
        return done < len(y_all) if scale else state.batch_in_epoch < per_epoch

    while state.step < args.steps:
        order = epoch_order(len(y_all), state.epoch, args.seed)
        while epoch_left() and state.step < args.steps:
            if scale:
                batch = next_samples(order, done, args.batch_per_rank, world)
            else:
                batch = global_batch_indices(order, state.batch_in_epoch, args.global_batch)
            mine = rank_share(batch, rank, world)
            optimizer.zero_grad()
            total = torch.zeros(())
            for part in micro_batches(mine, args.micro_batch):
                loss = nn.functional.cross_entropy(model(x_all[part]), y_all[part],
                                                   reduction="sum") / len(batch)
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
                                      "rank": rank, "world": world, "lr": lr,
                                      "samples": mine}) + "\n")
                log.flush()
            state.step += 1
            state.batch_in_epoch += 1  # scale-lr: steps of the epoch (the position is done)
            done += len(batch)
            state.extra.update({SAMPLES_KEY: done, POLICY_KEY: policy})
            if first or state.step % args.log_every == 0:
                say(event="step", step=state.step, epoch=state.epoch,
                    loss=round(float(total), 6), world_size=world, lr=lr)
                first = False
            time.sleep(args.step_sleep)
            stop = handler.should_stop() and state.step < args.steps
            if stop or state.step % args.checkpoint_every == 0:
                path = ckpt.save(state)
            if stop:
                leave(handler, rank, world, state.step, str(path), say)
        if not epoch_left():
            state.epoch += 1
            state.batch_in_epoch = done = 0
            state.extra[SAMPLES_KEY] = 0
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
