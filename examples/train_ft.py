#!/usr/bin/env python3
"""Fault-tolerant training with torchft: replica groups that keep training when one is lost.

Each process is one *replica group* (here one process; data parallel across groups). At every
step torchft's lighthouse forms a quorum of the groups alive; their gradients are all-reduced
among them only, so when a group is lost the others go on at the next step, and a group that
(re)joins copies the weights and optimizer state from a live peer ("heals") instead of reading
a checkpoint. Needs ``pip install 'slurm-spot[ft]'`` (torchft) and a lighthouse
(``slurm_spot.jobs.services.ft_lighthouse``; under Slurm, ``slurm-spot sbatch --torchrun
--fault-tolerant`` starts one on the coordinator).

What a training loop changes for torchft (docs/ml-engineer.md, "Fault-tolerant training"):

1. a ``Manager`` with a ``ProcessGroupGloo`` (NCCL on GPUs) and two functions that give and
   take the state a healing peer copies (:func:`make_manager`);
2. the optimizer wrapped in ``torchft.optim.OptimizerWrapper``: its ``zero_grad()`` starts the
   step's quorum, its ``step()`` steps only when every group of the quorum committed;
3. each gradient all-reduced with ``manager.allreduce(grad).wait()`` before ``step()`` (not
   torchft's ``DistributedDataParallel`` wrapper: in torchft 0.2.0 it dies when a peer is
   lost, ``AssertionError: assert fut._fut`` in its comm hook);
4. the step counter is ``manager.current_step()`` (a healed group takes its peer's);
5. the data of a step is a share of that step's global batch, by
   ``manager.participating_rank()`` of ``manager.num_participants()``.

Every step uses the same global batch whatever the number of groups: each participant takes
its share, the summed loss / global batch is all-reduced with SUM, so a step is the mean-loss
gradient over the same samples as in one process (:func:`train_reference`); a group that heals
adds zeros (torchft zeroes its gradients) and gets the others' sum.

Checkpoints (``Checkpointer``) are for when every group is lost: every ``--checkpoint-every``
steps (and at the last) the group of participating rank 0 saves the model, optimizer and
torchft's step. A group
restores one only when its first quorum finds nobody ahead of step 0 (every group lost):
otherwise it heals from a peer, with no storage read.

On the preemption signal (or SIGTERM) a group leaves at the next step boundary, without a
checkpoint (the others hold the state), and exits with the requeue code (85): under Slurm its
job is requeued, and the run that follows heals from a peer.

One JSON object per line on stdout, each with ``replica`` and ``time`` (seconds since the
epoch)::

    {"event": "start", "step": 0, "replica": "r0", "restarts": 0}
    {"event": "heal", "step": 57, "from_peer": true, "heal_s": 0.21, "bytes": 97320, ...}
    {"event": "restore", "step": 40, "checkpoint": "/ck/step_000000040", ...}
    {"event": "step", "step": 58, "loss": 0.41, "participants": 2, ...}
    {"event": "leave", "step": 90, "signal": 12, ...}
    {"event": "done", "step": 300, "loss": 0.09, "weights_sha256": "..."}
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import signal
import sys
import time
from datetime import timedelta
from typing import Any

import torch
from sklearn.datasets import load_digits
from torch import nn

from slurm_spot.checkpoint.checkpointer import Checkpointer, TrainState
from slurm_spot.checkpoint.elastic import epoch_order, global_batch_indices, rank_share
from slurm_spot.checkpoint.preemption import PreemptionHandler
from slurm_spot.contract import jobenv

#: Samples in scikit-learn's digits data set (``load_digits``): the largest --global-batch.
DIGITS_SAMPLES = 1797

#: The key of torchft's own state (step, batches committed) in a checkpoint's ``extra``.
TORCHFT_KEY = "torchft"


def _count(low: int) -> Any:
    def parse(text: str) -> int:
        value = int(text)
        if value < low:
            raise ValueError(text)
        return value
    parse.__name__ = f"integer >= {low}"
    return parse


def _seconds(text: str) -> float:
    value = float(text)
    if not 0 < value < float("inf"):
        raise ValueError(text)
    return value


_seconds.__name__ = "number of seconds > 0"


def _non_negative(text: str) -> float:
    value = float(text)
    if not 0 <= value < float("inf"):
        raise ValueError(text)
    return value


_non_negative.__name__ = "number >= 0"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--steps", type=_count(0), default=300, help="total optimizer steps")
    p.add_argument("--steps-file",
                   help="a file whose integer, once it exists, replaces --steps (read before "
                   "each step; every group reads the same): ends a running job early, at the "
                   "same step in every group (the demo ends once its replacements healed)")
    p.add_argument("--global-batch", type=_count(1), default=96,
                   help=f"samples per optimizer step, shared among the groups (<= {DIGITS_SAMPLES})")
    p.add_argument("--lr", type=_seconds, default=0.05, help="learning rate (SGD, momentum 0.9)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--step-sleep", type=_non_negative, default=0.0,
                   help="seconds to sleep per step (a stand-in for a bigger model)")
    p.add_argument("--log-every", type=_count(1), default=10, help="steps between step events")
    p.add_argument("--checkpoint-dir",
                   help="shared by every group (default $SLURM_SPOT_CHECKPOINT_DIR)")
    p.add_argument("--checkpoint-every", type=_count(1), default=50, help="steps between saves")
    p.add_argument("--replica-id", default=os.environ.get("REPLICA_GROUP_ID"),
                   help="this group's name (default $REPLICA_GROUP_ID)")
    p.add_argument("--lighthouse", default=os.environ.get("TORCHFT_LIGHTHOUSE"),
                   help="http://HOST:PORT of the lighthouse (default $TORCHFT_LIGHTHOUSE)")
    p.add_argument("--host", default=os.environ.get("SLURM_SPOT_FT_HOST"),
                   help="this node's address the other groups reach it at (default "
                   "$SLURM_SPOT_FT_HOST, else this machine's hostname)")
    p.add_argument("--min-replicas", type=_count(1), default=1,
                   help="fewest groups that may commit a step")
    p.add_argument("--timeout", type=_seconds, default=10.0,
                   help="seconds a collective or a peer's checkpoint transfer may take")
    p.add_argument("--quorum-timeout", type=_seconds, default=60.0,
                   help="seconds to wait for a quorum")
    p.add_argument("--reference", action="store_true",
                   help="train in this process alone, without torchft (the result to compare)")
    args = p.parse_args(argv)
    if args.global_batch > DIGITS_SAMPLES:
        p.error(f"argument --global-batch: at most {DIGITS_SAMPLES} (the data set)")
    if not args.reference:
        for option, value in (("--replica-id", args.replica_id),
                              ("--lighthouse", args.lighthouse)):
            if not value:
                p.error(f"argument {option}: required (or set its environment variable)")
    return args


def make_model() -> nn.Module:
    """The MLP (no dropout: every group computes the same function of the same weights)."""
    return nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 64), nn.ReLU(),
                         nn.Linear(64, 10))


def load_data() -> tuple[torch.Tensor, torch.Tensor]:
    digits = load_digits()
    return (torch.tensor(digits.data / 16.0, dtype=torch.float32),
            torch.tensor(digits.target, dtype=torch.long))


def batch_of_step(step: int, samples: int, global_batch: int, seed: int) -> list[int]:
    """The global batch of optimizer step ``step`` (0-based): epochs of ``samples //
    global_batch`` whole batches, each epoch's order drawn from ``seed``."""
    per_epoch = samples // global_batch
    epoch, index = divmod(step, per_epoch)
    return global_batch_indices(epoch_order(samples, epoch, seed), index, global_batch)


def evaluate(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> float:
    """Mean cross-entropy over the whole data set."""
    with torch.no_grad():
        return round(float(nn.functional.cross_entropy(model(x), y)), 6)


def weights_sha256(model: nn.Module) -> str:
    """sha256 of every parameter's bytes in order: equal only for bit-identical weights."""
    digest = hashlib.sha256()
    for tensor in model.state_dict().values():
        digest.update(tensor.detach().contiguous().numpy().tobytes())
    return digest.hexdigest()


def state_bytes(value: Any) -> int:
    """Bytes of the tensors in a (nested) state dict: what a heal copies, near enough."""
    if isinstance(value, torch.Tensor):
        return value.numel() * value.element_size()
    if isinstance(value, dict):
        return sum(state_bytes(v) for v in value.values())
    if isinstance(value, (list, tuple)):
        return sum(state_bytes(v) for v in value)
    return 0


def train_reference(args: argparse.Namespace) -> None:
    """The same steps in one process without torchft: the loss the groups should reach."""
    torch.set_num_threads(1)
    torch.manual_seed(args.seed)
    x, y = load_data()
    model = make_model()
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    for step in range(args.steps):
        batch = batch_of_step(step, len(y), args.global_batch, args.seed)
        optimizer.zero_grad()
        (nn.functional.cross_entropy(model(x[batch]), y[batch], reduction="sum")
         / len(batch)).backward()
        optimizer.step()
    print(json.dumps({"event": "done", "replica": "reference", "step": args.steps,
                      "loss": evaluate(model, x, y), "weights_sha256": weights_sha256(model),
                      "time": round(time.time(), 3)}), flush=True)


def make_manager(args: argparse.Namespace, model: nn.Module,
                 optimizer: torch.optim.Optimizer) -> tuple[Any, Any]:
    """torchft's Manager for this group (a group of one process: rank 0 of 1) and the group's
    own TCPStore on ``--host`` (keep it: other groups' process groups meet in the quorum
    leader's store)."""
    import socket

    from torchft import Manager, ProcessGroupGloo
    from torchft.checkpointing import HTTPTransport

    host = args.host or socket.gethostname()

    class Transport(HTTPTransport):
        """torchft's checkpoint server, advertised at ``host``: torchft 0.2.0 advertises
        ``socket.gethostname()``, which other nodes need not resolve (a cloud node's own
        name; the local cluster's nodes, each in its own UTS namespace)."""

        def address(self) -> str:
            port = self._server.socket.getsockname()[1]
            shown = f"[{host}]" if ":" in host else host
            return f"http://{shown}:{port}/checkpoint/"

    store = torch.distributed.TCPStore(host, 0, is_master=True, wait_for_workers=False)

    def state_dict() -> dict[str, Any]:  # what a healing peer copies from this group
        return {"model": model.state_dict(), "optim": optimizer.state_dict()}

    def load_state_dict(state: dict[str, Any]) -> None:  # this group healing from a peer
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optim"])

    manager = Manager(
        pg=ProcessGroupGloo(timeout=timedelta(seconds=args.timeout)),
        load_state_dict=load_state_dict, state_dict=state_dict,
        min_replica_size=args.min_replicas,
        timeout=timedelta(seconds=args.timeout),
        quorum_timeout=timedelta(seconds=args.quorum_timeout),
        connect_timeout=timedelta(seconds=args.timeout),
        rank=0, world_size=1, store_addr=host, store_port=store.port,
        lighthouse_addr=args.lighthouse, replica_id=args.replica_id, hostname=host,
        checkpoint_transport=Transport(timeout=timedelta(seconds=args.timeout), num_chunks=0),
        init_sync=False)  # every group seeds its initial weights the same
    return manager, store


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    if args.reference:
        train_reference(args)
        return
    # Under `slurm-spot sbatch --fault-tolerant` every group shares the lighthouse job's
    # checkpoint directory (jobenv.ft_checkpoint_dir), not its own job's.
    directory = args.checkpoint_dir or jobenv.ft_checkpoint_dir(os.environ)
    if directory is None:
        sys.exit("train_ft: pass --checkpoint-dir or set $SLURM_SPOT_CHECKPOINT_DIR")
    handler = PreemptionHandler().install()  # first: from here on a signal only sets a flag
    from torchft.optim import OptimizerWrapper

    def say(**event: Any) -> None:
        print(json.dumps({**event, "replica": args.replica_id,
                          "time": round(time.time(), 3)}), flush=True)

    torch.set_num_threads(1)
    torch.manual_seed(args.seed)  # the same initial weights in every group
    x, y = load_data()
    model = make_model()
    inner = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    manager, _store = make_manager(args, model, inner)
    optimizer = OptimizerWrapper(manager, inner)
    ckpt = Checkpointer(directory, keep=2)
    state = TrainState(model, inner)
    say(event="start", step=manager.current_step(), restarts=jobenv.restart_count(os.environ))
    first_quorum = True
    while manager.current_step() < total_steps(args):
        started = time.monotonic()
        before = manager.current_step()
        optimizer.zero_grad()  # starts this step's quorum
        rank, participants = manager.participating_rank(), manager.num_participants()
        healed = manager.current_step() > before  # the quorum set a peer's step: healing
        if first_quorum and manager.errored() is None:
            first_quorum = False
            if manager.current_step() == 0 and restore(ckpt, state, manager, say):
                continue  # every group was lost: go on from the checkpoint
        step = manager.current_step()
        batch = batch_of_step(step, len(y), args.global_batch, args.seed)
        mine = rank_share(batch, rank, participants) if rank is not None else []
        loss = (nn.functional.cross_entropy(model(x[mine]), y[mine], reduction="sum")
                / len(batch)) if mine else torch.zeros((), requires_grad=True)
        loss.backward()
        for param in model.parameters():
            if param.grad is None:
                param.grad = torch.zeros_like(param)
            manager.allreduce(param.grad, reduce_op=torch.distributed.ReduceOp.SUM).wait()
        batch_loss = loss.detach().clone()  # the mean loss over the global batch, once summed
        manager.allreduce(batch_loss, reduce_op=torch.distributed.ReduceOp.SUM).wait()
        optimizer.step()  # applies a healed state first, then steps if the quorum committed
        if manager.current_step() == step:
            continue  # not committed (a peer was lost mid-step): the same batch again
        if healed:
            say(event="heal", step=step, from_peer=True,
                heal_s=round(time.monotonic() - started, 3),
                bytes=state_bytes({"model": model.state_dict(), "optim": inner.state_dict()}),
                participants=participants)
        done = manager.current_step()
        if done % args.log_every == 0 or done == total_steps(args):
            say(event="step", step=done, loss=round(float(batch_loss), 6),
                participants=participants)
        if rank == 0 and (done % args.checkpoint_every == 0 or done == total_steps(args)):
            # The last step too: a group that starts after the end restores it and stops.
            state.step = done
            state.extra[TORCHFT_KEY] = manager.state_dict()
            ckpt.save(state)
        time.sleep(args.step_sleep)
        if handler.stop_requested and done < total_steps(args):
            # At a step boundary, without a checkpoint: the other groups hold the state.
            say(event="leave", step=done, signal=handler.received_signal)
            manager.shutdown(wait=False)
            sys.stdout.flush()
            os._exit(handler.exit_code)
    say(event="done", step=manager.current_step(), loss=evaluate(model, x, y),
        weights_sha256=weights_sha256(model))
    manager.shutdown(wait=False)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)


def total_steps(args: argparse.Namespace) -> int:
    """``--steps``, or the integer in ``--steps-file`` once that file exists (read once, then
    kept in ``args.steps``)."""
    if args.steps_file and os.path.exists(args.steps_file):
        try:
            with open(args.steps_file) as fh:
                args.steps = min(args.steps, int(fh.read().strip()))
        except ValueError:
            return int(args.steps)  # written but not yet complete: read it again next step
        args.steps_file = None
    return int(args.steps)


def restore(ckpt: Checkpointer, state: TrainState, manager: Any, say: Any) -> bool:
    """Restore the newest valid checkpoint into ``state`` and torchft's step; False when there
    is none. Called only when the first quorum found every group at step 0."""
    found = ckpt.restore(state)
    if found is None:
        return False
    manager.load_state_dict(state.extra[TORCHFT_KEY])
    say(event="restore", step=manager.current_step(), checkpoint=str(found.path))
    return True


if __name__ == "__main__":
    main()
