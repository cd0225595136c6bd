"""Data order for elastic training: the same global batches whatever the world size (pure).

An epoch is one permutation of the data set (``torch.randperm`` seeded with ``seed + epoch``,
as ``DistributedSampler`` draws it), cut into global batches of ``global_batch`` samples
(the tail that does not fill one is dropped, as ``drop_last=True``). Global batch ``k`` of the
epoch is the same samples whatever the world size; rank ``r`` of ``world`` takes every
``world``-th of them from position ``r``. The position saved in a checkpoint is the number of
global batches done in the epoch (``TrainState.batch_in_epoch``), which does not depend on the
world size, so a run that resumes with another world size goes on with the next global batch:
within an epoch no sample is skipped and none is seen twice.
"""

from __future__ import annotations

from collections.abc import Sequence


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
