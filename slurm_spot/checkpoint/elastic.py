"""Data order for elastic training when the world size changes (pure): two policies.

**keep-global** (the global batch is kept, gradient accumulation). An epoch is one
permutation of the data set (``torch.randperm`` seeded with ``seed + epoch``, as
``DistributedSampler`` draws it), cut into global batches of ``global_batch`` samples
(the tail that does not fill one is dropped, as ``drop_last=True``). Global batch ``k`` of the
epoch is the same samples whatever the world size; rank ``r`` of ``world`` takes every
``world``-th of them from position ``r``. The position saved in a checkpoint is the number of
global batches done in the epoch (``TrainState.batch_in_epoch``), which does not depend on the
world size, so a run that resumes with another world size goes on with the next global batch:
within an epoch no sample is skipped and none is seen twice.

**scale-lr** (the learning rate is rescaled). Each rank takes a fixed ``per_rank_batch`` per
step, so the global batch is ``per_rank_batch x world`` and changes with the world; the
learning rate follows it linearly (:func:`scaled_lr`). Step after step takes the next
samples of the same permutation (:func:`next_samples`); the position saved is the number of
*samples* consumed in the epoch (``TrainState.extra[SAMPLES_KEY]``), since a count of steps
means a different number of samples for each world size. The last step of an epoch takes
what is left, so each epoch uses every sample exactly once whatever world sizes it saw.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any


def steps_per_epoch(samples: int, global_batch: int) -> int:
    """Global batches per epoch (``samples // global_batch``).

    Raises:
        ValueError: ``global_batch`` < 1, or larger than the data set.
    """
    if global_batch < 1 or global_batch > samples:
        raise ValueError(f"global batch {global_batch}: must be 1..{samples} (the data set)")
    return samples // global_batch


def epoch_order(samples: int, epoch: int, seed: int) -> list[int]:
    """The epoch's permutation of ``range(samples)`` (``torch.randperm``, generator seeded
    ``seed + epoch``: the same on every rank and every run)."""
    import torch

    generator = torch.Generator().manual_seed(seed + epoch)
    return [int(i) for i in torch.randperm(samples, generator=generator)]


def global_batch_indices(order: Sequence[int], step_in_epoch: int,
                         global_batch: int) -> list[int]:
    """The samples of global batch ``step_in_epoch`` of the epoch whose order is ``order``.

    Raises:
        IndexError: the epoch has no such global batch.
    """
    start = step_in_epoch * global_batch
    if step_in_epoch < 0 or start + global_batch > len(order):
        raise IndexError(f"global batch {step_in_epoch}: the epoch has "
                         f"{len(order) // global_batch}")
    return list(order[start:start + global_batch])


def rank_share(indices: Sequence[int], rank: int, world: int) -> list[int]:
    """Rank ``rank``'s part of a global batch: every ``world``-th sample from ``rank`` (sizes
    differ by at most one when ``world`` does not divide the batch).

    Raises:
        ValueError: ``rank`` is not in ``0..world-1``.
    """
    if not 0 <= rank < world:
        raise ValueError(f"rank {rank}: must be 0..{world - 1}")
    return list(indices[rank::world])


def micro_batches(indices: Sequence[int], size: int) -> list[list[int]]:
    """``indices`` in micro-batches of at most ``size`` (gradient accumulation steps)."""
    return [list(indices[i:i + size]) for i in range(0, len(indices), size)]


# -- the other policy: a fixed per-rank batch, the learning rate scaled with the world ----------

#: Key of :attr:`TrainState.extra` holding the epoch position in samples (int): how many of
#: the epoch's permutation are consumed. A checkpoint without it (written before it existed)
#: resumes at ``batch_in_epoch x global batch`` (:func:`samples_done`).
SAMPLES_KEY = "samples_in_epoch"
#: Key of :attr:`TrainState.extra` naming the batch policy that wrote the checkpoint
#: (``"keep-global"`` or ``"scale-lr"``; absent: keep-global).
POLICY_KEY = "batch_policy"
KEEP_GLOBAL = "keep-global"
SCALE_LR = "scale-lr"
POLICIES = (KEEP_GLOBAL, SCALE_LR)


def scaled_lr(base_lr: float, world: int, reference_world: int) -> float:
    """The learning rate for ``world`` ranks under the linear scaling rule (Goyal et al.
    2017, "Accurate, Large Minibatch SGD": when the minibatch grows k-fold, multiply the
    learning rate by k): with a fixed per-rank batch the global batch is proportional to the
    world size, so ``base_lr * world / reference_world``. ``base_lr`` is the rate tuned for
    ``reference_world`` ranks.

    Raises:
        ValueError: ``world`` or ``reference_world`` < 1, or ``base_lr`` not a finite number
            > 0.
    """
    if world < 1 or reference_world < 1:
        raise ValueError(f"world {world}, reference world {reference_world}: both must be >= 1")
    if not base_lr > 0 or base_lr == float("inf"):
        raise ValueError(f"learning rate {base_lr}: must be a finite number > 0")
    return base_lr * world / reference_world


def next_samples(order: Sequence[int], samples_done: int, per_rank_batch: int,
                 world: int) -> list[int]:
    """The samples of the next optimizer step with a fixed per-rank batch: the
    ``per_rank_batch x world`` samples of ``order`` after the first ``samples_done`` (fewer
    at the end of the epoch: the last step takes what is left, so every sample of the epoch
    is used once, whatever world sizes the epoch saw). Split it among the ranks with
    :func:`rank_share` (each gets ``per_rank_batch``, the last step of an epoch fewer).

    Raises:
        ValueError: ``per_rank_batch`` or ``world`` < 1, or ``samples_done`` outside
            ``0..len(order) - 1`` (the epoch is over, or the position is not of this data set).
    """
    if per_rank_batch < 1 or world < 1:
        raise ValueError(f"per-rank batch {per_rank_batch}, world {world}: both must be >= 1")
    if not 0 <= samples_done < len(order):
        raise ValueError(f"position {samples_done} samples: the epoch has {len(order)} "
                         "(a checkpoint of another data set?)")
    return list(order[samples_done:samples_done + per_rank_batch * world])


def samples_done(extra: Mapping[str, Any], batch_in_epoch: int, global_batch: int) -> int:
    """The epoch position (samples consumed) a checkpoint resumes at: ``extra``
    [:data:`SAMPLES_KEY`] when the checkpoint has it, else ``batch_in_epoch x global_batch``
    (a checkpoint of the keep-global policy written before the key existed: its position is
    whole global batches of ``global_batch`` samples).

    Raises:
        ValueError: the stored value is not a whole number >= 0.
    """
    value = extra.get(SAMPLES_KEY)
    if value is None:
        return batch_in_epoch * global_batch
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"checkpoint extra[{SAMPLES_KEY!r}] is {value!r}: "
                         "must be a whole number >= 0")
    return value


def batches_done(samples: int, global_batch: int, epoch_samples: int) -> int:
    """The keep-global position (global batches done) of a position in samples, for a run
    that goes back from scale-lr to keep-global, or resumes with another ``--global-batch``.
    ``epoch_samples``: the data set's size; a position after which no full global batch is
    left (keep-global drops such a tail, as ``drop_last=True``) is the epoch's last global
    batch done: the epoch is over.

    Raises:
        ValueError: ``samples`` is not a whole number of global batches (global batch ``k``
            of keep-global is ``order[k*G:(k+1)*G]``: resuming in the middle of one would use
            samples twice); finish the epoch with scale-lr, or choose a --global-batch that
            divides it.
    """
    if samples + global_batch > epoch_samples:
        return epoch_samples // global_batch
    if samples % global_batch:
        raise ValueError(f"the checkpoint is {samples} samples into its epoch, not a whole "
                         f"number of global batches of {global_batch}")
    return samples // global_batch
