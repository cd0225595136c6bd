"""The providers' own news of an instance's end, read by the reconciler between passes
(issue 26: a node lost without notice is handled when the provider says so, not at the next
pass, which comes every ``reconcile.interval_s``, 30-60 s in production).

Each provider package may offer ``event_source(config, name, settings)`` (see
:class:`~slurm_spot.providers.base.ProviderPackage`): EC2's EventBridge events in an SQS queue
(:mod:`slurm_spot.providers.aws.events`), GCE's ``compute.instances.preempted`` zone
operations (:mod:`slurm_spot.providers.gcp.events`). An event only *starts a pass early* and
tells it which listed instances have ended although the listing (eventually consistent) may
still show them alive; every decision stays the pass's (:mod:`slurm_spot.reconcile.rules`),
so one interruption is still one requeue (docs/DESIGN.md, flows 3 and 6), and the passes'
listings remain the fallback for a lost, late or unreadable event.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Protocol

from slurm_spot.providers.base import InstanceState

if TYPE_CHECKING:
    from slurm_spot.config import SpotConfig

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ProviderEvent:
    """One instance's news from its provider.

    Attributes:
        provider: the provider's name under ``providers:`` in spot.yaml.
        instance_id: the instance as :class:`~slurm_spot.providers.base.Instance` spells it
            (``i-0abc...``, the GCE instance name).
        kind: ``interruption-warning`` (EC2's two-minute warning: the instance still runs),
            ``state-change`` (EC2) or ``preempted`` (GCE).
        state: the state reported; None for a warning.
        time: when the provider says it happened (aware UTC), if it says.
        detail: the provider's words (``instance-action: terminate``, ``shutting-down``).
    """

    provider: str
    instance_id: str
    kind: str
    state: InstanceState | None
    time: datetime | None
    detail: str

    @property
    def ended(self) -> bool:
        """True when the event says the instance is going or gone (not a warning)."""
        return self.state is not None and not self.state.is_alive

    @property
    def reason(self) -> str:
        """The instance's ``state_reason`` once the event has been applied: says a spot
        interruption (so ``Instance.was_reclaimed`` holds) for a preemption or a warning."""
        return f"{self.kind}: {self.detail}"

    def to_json(self) -> dict[str, object]:
        """The event's fields for the events file (``provider_event``)."""
        return {"provider": self.provider, "instance_id": self.instance_id, "kind": self.kind,
                "state": self.state.value if self.state else None,
                "time": self.time.isoformat() if self.time else None, "detail": self.detail}


class EventSource(Protocol):
    """One provider's stream of :class:`ProviderEvent`.

    A source may set ``cluster_only = True`` when every event it gives is about this
    cluster's instances (the local provider's events file): the reconciler then acts on an
    end of an instance it has not listed yet (launched since its last pass). Without it (an
    account-wide SQS queue, a zone's operations) only instances the last pass saw alive count.
    """

    provider: str

    def receive(self, wait_s: float) -> list[ProviderEvent]:
        """The events since the last call, waiting at most ``wait_s`` seconds for one (a
        source that cannot wait returns at once). Never raises: a failing read is logged and
        gives no events (the passes' listings are the fallback)."""
        ...

    def close(self) -> None:
        """Release the source's clients."""
        ...


def event_time(text: object) -> datetime | None:
    """An event's ISO 8601 time (EventBridge ``time``, GCE ``insertTime``; ``Z`` or an offset,
    which Python 3.11's ``fromisoformat`` reads), or None when it is missing or malformed."""
    if not isinstance(text, str):
        return None
    try:
        return datetime.fromisoformat(text)
    except ValueError:
        return None


def event_sources(config: SpotConfig) -> list[EventSource]:
    """The event source of every provider of ``config`` that has one and has it enabled; a
    provider whose source cannot be built is logged and left to polling."""
    from slurm_spot.providers import package_for

    sources: list[EventSource] = []
    for name in sorted({ns.provider for ns in config.node_sets}):
        package = package_for(config, name)
        build = getattr(package, "event_source", None)
        if build is None:
            continue
        try:
            source = build(config, name, config.providers[name])
        except Exception as exc:  # an SDK or credentials problem: polling still works
            log.error("provider %s: no event source (%s); its losses wait for a pass", name, exc)
            continue
        if source is not None:
            sources.append(source)
    return sources


def ended_instances(events: Sequence[ProviderEvent]) -> dict[tuple[str, str], ProviderEvent]:
    """(provider, instance id) -> the latest event saying that instance ended."""
    ended: dict[tuple[str, str], ProviderEvent] = {}
    for event in events:
        if event.ended:
            ended[(event.provider, event.instance_id)] = event
    return ended
