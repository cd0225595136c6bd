"""GCE's own news of a preemption: the ``compute.instances.preempted`` operations that
Compute Engine adds to a zone's operations list when it preempts an instance there (the
Compute Engine API reference, zoneOperations.list; the operation's ``targetLink`` names the
instance, ``insertTime`` says when, ``user`` is ``system``).

:class:`PreemptionOperations` lists each zone of the provider's node sets with the filter
``operationType="compute.instances.preempted"`` whenever the reconciler asks (every
``reconcile.events_poll_s`` while it waits for its next pass): it cannot wait for an
operation, so it answers at once. An operation is reported once; operations inserted before
the source started (less a look-back of :data:`LOOKBACK_S`) are left to the passes.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from datetime import datetime, timedelta, timezone
from typing import Any

from slurm_spot.config import GcpProviderConfig
from slurm_spot.providers.base import InstanceState
from slurm_spot.providers.events import ProviderEvent, event_time

log = logging.getLogger(__name__)

PREEMPTED = "compute.instances.preempted"
FILTER = f'operationType="{PREEMPTED}"'
LOOKBACK_S = 120.0  # a preemption just before a (re)start of the reconciler is still news


class PreemptionOperations:
    """Preemption operations of the zones ``zones`` of provider ``name``.

    Args:
        name: the provider's name in spot.yaml.
        settings: its settings (project, endpoint, credentials).
        zones: the zones its node sets launch in.
        api: a :class:`~slurm_spot.providers.gcp.api.ComputeApi` to use; else one is built.
        now: aware-UTC clock (tests).
    """

    def __init__(self, name: str, settings: GcpProviderConfig, zones: Iterable[str],
                 api: Any = None, now: Callable[[], datetime] | None = None) -> None:
        if api is None:
            from slurm_spot.providers.gcp.api import ComputeApi

            api = ComputeApi(settings, call_timeout_s=10.0, read_retry_s=5.0)
        self.provider = name
        self.zones = sorted(set(zones))
        self.api = api
        self._since = (now or (lambda: datetime.now(timezone.utc)))() - timedelta(
            seconds=LOOKBACK_S)
        self._seen: dict[str, set[str]] = {zone: set() for zone in self.zones}

    def receive(self, wait_s: float) -> list[ProviderEvent]:
        """New preemptions in every zone (one list call per zone and page); returns at once
        whatever ``wait_s``. Never raises: a zone that cannot be read is logged and skipped."""
        found: list[ProviderEvent] = []
        for zone in self.zones:
            try:
                operations = self.api.list_zone_operations(zone, FILTER)
            except Exception as exc:  # the passes still list the instances
                log.warning("provider %s: listing operations in %s failed: %s",
                            self.provider, zone, exc)
                continue
            listed = set()
            for op in operations:
                key = str(op.get("id") or op.get("name") or "")
                listed.add(key)
                if not key or key in self._seen[zone] or op.get("operationType") != PREEMPTED:
                    continue
                when = event_time(op.get("insertTime"))
                target = str(op.get("targetLink") or "").rsplit("/", 1)[-1]
                if not target or (when is not None and when < self._since):
                    continue
                found.append(ProviderEvent(
                    self.provider, target, "preempted", InstanceState.TERMINATED, when,
                    f"{PREEMPTED} in {zone}"))
            self._seen[zone] = listed  # what GCE no longer lists cannot come back
        return found

    def close(self) -> None:
        """Nothing to release (the Compute clients close with the process)."""


