"""Notices of the ``local`` provider's simulated spot market: a JSON file per node,
``{"action": "terminate", "time": "<ISO 8601 UTC>"}``, published by ``slurm-spot local preempt``."""

from __future__ import annotations

import json
from datetime import datetime
from pathlib import Path

from slurm_spot.providers.notices import Notice


class LocalNoticeSource:
    """Reads ``<state_dir>/local/notices/<node>.json``.

    Args:
        path: the notice file of this node.
        interval_s: seconds between polls.
    """

    name = "local"

    def __init__(self, path: Path, interval_s: float = 1.0) -> None:
        self.path = path
        #: Seconds between polls.
        self.interval_s = interval_s

    def poll(self) -> Notice | None:
        """The published notice, or None (missing or half-written file: no notice yet)."""
        try:
            data = json.loads(self.path.read_text())
            return Notice(str(data["action"]), datetime.fromisoformat(data["time"]), "local")
        except (OSError, ValueError, KeyError, TypeError):
            return None
