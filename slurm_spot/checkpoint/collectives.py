"""The collectives of a checkpointer: a gloo process group of its own over the training
ranks, and the three exchanges a save and a restore need (rank 0's decision shared, every
rank's value gathered, one rank's failure made everyone's).

Why a group of its own: an asynchronous save runs its collectives in a writer thread while
the trainer runs its own on the training group; two threads issuing collectives on one group
can interleave and deadlock (field case async-dcp-deadlock). The group is created on the
first call, collectively, with ``writer_timeout_s`` as its timeout.

Without torch.distributed initialised every exchange is local: rank 0 of a world of 1.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import torch.distributed as dist


class SaveGroup:
    """The ranks of ``process_group`` (default: the world) as a checkpointer sees them.

    Every method that exchanges values must be called by all ranks together, in the same
    order.

    Args:
        process_group: the training ranks (None: the world).
        timeout_s: seconds a collective of the save group may wait (the checkpointer's
            ``writer_timeout_s``); a rank that does not come raises there instead of hanging.
    """

    def __init__(self, process_group: Any, timeout_s: float) -> None:
        self.process_group = process_group
        self.timeout_s = timeout_s
        self._save_group: Any = None

    def active(self) -> bool:
        """True when torch.distributed is available and initialised (else everything is
        local)."""
        return dist.is_available() and dist.is_initialized()

    def rank_world(self) -> tuple[int, int]:
        """``(rank, world size)`` in ``process_group``; ``(0, 1)`` without torch.distributed."""
        if not self.active():
            return 0, 1
        return dist.get_rank(self.process_group), dist.get_world_size(self.process_group)

    def group(self) -> Any:
        """The save's own gloo group over the same ranks (created once, collectively, on the
        first call); None without torch.distributed.

        Raises:
            RuntimeError: torch.distributed could not create the group (from ``new_group``).
        """
        if not self.active():
            return None
        if self._save_group is None:
            ranks = (dist.get_process_group_ranks(self.process_group)
                     if self.process_group is not None
                     else list(range(dist.get_world_size())))
            self._save_group = dist.new_group(
                ranks=ranks, backend="gloo", timeout=timedelta(seconds=self.timeout_s))
        return self._save_group

    def source(self) -> int:
        """The global rank of the group's rank 0 (the source of :meth:`from_rank0`)."""
        return dist.get_global_rank(self.group(), 0)

    def from_rank0(self, value: Any) -> Any:
        """Rank 0's ``value`` on every rank (pickled; other ranks' values are ignored).

        Raises:
            RuntimeError: a rank did not take part within ``timeout_s`` (from gloo).
        """
        if not self.active():
            return value
        box = [value]
        dist.broadcast_object_list(box, src=self.source(), group=self.group())
        return box[0]

    def gather(self, value: Any) -> list[Any]:
        """Every rank's ``value``, indexed by rank, on every rank (pickled).

        Raises:
            RuntimeError: a rank did not take part within ``timeout_s`` (from gloo).
        """
        if not self.active():
            return [value]
        out: list[Any] = [None] * self.rank_world()[1]
        dist.all_gather_object(out, value, group=self.group())
        return out

    def agree(self, problem: str) -> str:
        """All ranks' problems joined as ``"rank R: problem; ..."`` ("" when every rank
        passed ""): one rank's failure is every rank's failure."""
        problems = self.gather(problem)
        return "; ".join(f"rank {r}: {p}" for r, p in enumerate(problems) if p)
