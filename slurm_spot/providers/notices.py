"""The notice contract shared by every provider's notice source."""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import datetime
from typing import Protocol


@dataclass(frozen=True)
class Notice:
    """An interruption notice.

    Attributes:
        action: what the provider will do: ``terminate``, ``stop``, ``hibernate`` (AWS),
            ``preempt`` (GCE), ``kill`` (local).
        deadline: when the instance goes away (timezone-aware UTC).
        source: ``aws-imds``, ``gce-metadata``, ``local``.
        kind: ``interruption`` (the instance is leaving) or ``rebalance`` (AWS rebalance
            recommendation: elevated risk only).
    """

    action: str
    deadline: datetime
    source: str
    kind: str = "interruption"

    @property
    def reason(self) -> str:
        """The Slurm node reason the watcher writes: ``spot-interruption:<action>@<time>``
        (:func:`slurm_spot.slurm.reasons.interruption_reason`); an action that is not a
        lowercase word (the provider's text, e.g. IMDS's ``instance-action``) is written as
        ``unknown`` so that the reason still reads back as slurm-spot's."""
        from slurm_spot.slurm.reasons import interruption_reason

        action = self.action.strip().lower()
        if not re.fullmatch(r"[a-z][a-z_-]*", action):
            action = "unknown"
        return interruption_reason(action, self.deadline)


class NoticeSource(Protocol):
    """Something that tells whether this instance is about to be taken back."""

    name: str

    def poll(self) -> Notice | None:
        """Return the notice if one is published, else None. Never raises for a transient
        error (a timeout or a 5xx is "no notice yet"); may block up to its poll interval
        (GCE's ``wait_for_change``)."""
        ...

    @property
    def interval_s(self) -> float:
        """Seconds to wait between two polls (0 for a source whose poll blocks)."""
        ...
