"""EC2's own news of a spot instance's end, from EventBridge through an SQS queue
(``providers.<name>.events_queue_url``; docs/admin.md has the rule an admin creates).

EventBridge delivers each matched event to the queue as the message body, the event's JSON
as EventBridge defines it (``version``, ``id``, ``detail-type``, ``source: aws.ec2``,
``account``, ``time``, ``region``, ``resources``, ``detail``). Two kinds are read:

- ``EC2 Spot Instance Interruption Warning``: ``detail: {"instance-id", "instance-action"}``,
  two minutes before EC2 interrupts the instance (the instance still runs: the node's watcher
  acts on the same notice, docs/DESIGN.md flow 3);
- ``EC2 Instance State-change Notification``: ``detail: {"instance-id", "state"}`` with
  ``state`` one of ``pending``, ``running``, ``shutting-down``, ``stopping``, ``stopped``,
  ``terminated``.

A change to ``pending`` or ``running`` and any other message are deleted and logged at debug
level. Messages are deleted once read:
an event lost after that is the passes' listing's to find (the fallback). The receive is an
SQS long poll (``WaitTimeSeconds``, at most 20 s: the Amazon SQS API Reference,
ReceiveMessage), so the reconciler's wait between passes *is* the receive.
"""

from __future__ import annotations

import json
import logging
from typing import Any

from slurm_spot.config import AwsProviderConfig
from slurm_spot.providers.base import InstanceState
from slurm_spot.providers.events import ProviderEvent, event_time

log = logging.getLogger(__name__)

WARNING = "EC2 Spot Instance Interruption Warning"
STATE_CHANGE = "EC2 Instance State-change Notification"
MAX_WAIT_S = 20  # ReceiveMessage WaitTimeSeconds: 0-20
_STATES = {"pending": InstanceState.PENDING, "running": InstanceState.RUNNING,
           "shutting-down": InstanceState.STOPPING, "stopping": InstanceState.STOPPING,
           "stopped": InstanceState.STOPPED, "terminated": InstanceState.TERMINATED}


def parse_message(provider: str, body: str, warned: set[str] | None = None) -> ProviderEvent | None:
    """The :class:`ProviderEvent` in one SQS message body (an EventBridge event), or None for
    any other message. ``warned`` (instance ids that had a warning) is updated with a warning
    and makes a later end read as a spot interruption (``Instance.was_reclaimed``)."""
    try:
        event = json.loads(body)
    except ValueError:
        return None
    if not isinstance(event, dict) or event.get("source") != "aws.ec2":
        return None
    detail = event.get("detail")
    if not isinstance(detail, dict) or not isinstance(detail.get("instance-id"), str):
        return None
    instance = detail["instance-id"]
    when = event_time(event.get("time"))
    warned = warned if warned is not None else set()
    if event.get("detail-type") == WARNING:
        warned.add(instance)
        return ProviderEvent(provider, instance, "interruption-warning", None, when,
                             f"spot instance-action {detail.get('instance-action', '?')}")
    if event.get("detail-type") == STATE_CHANGE:
        state = _STATES.get(str(detail.get("state")))
        if state is None or state.is_alive:  # pending, running: no news of an end
            return None
        after = " after a spot interruption warning" if instance in warned else ""
        return ProviderEvent(provider, instance, "state-change", state, when,
                             f"{detail.get('state')}{after}")
    return None


class SqsEventSource:
    """Reads ``events_queue_url`` with the provider's credentials (``profile``,
    ``credentials_file``, the boto3 chain) and region.

    Args:
        name: the provider's name in spot.yaml.
        settings: its settings (``events_queue_url`` must be set).
        session: a ``boto3.session.Session`` to use (tests); else one is built.
    """

    def __init__(self, name: str, settings: AwsProviderConfig, session: Any = None) -> None:
        from botocore.config import Config

        from slurm_spot.providers.aws.session import boto_session

        if not settings.events_queue_url:
            raise ValueError(f"providers.{name}.events_queue_url is not set")
        self.provider = name
        self.queue_url = settings.events_queue_url
        session = session or boto_session(settings)
        # the long poll must not outlast the read timeout (botocore would retry it)
        self._sqs = session.client("sqs", region_name=settings.region, config=Config(
            retries={"mode": "standard", "total_max_attempts": 3}, connect_timeout=5,
            read_timeout=MAX_WAIT_S + 10))
        self._warned: set[str] = set()

    def receive(self, wait_s: float) -> list[ProviderEvent]:
        """Up to 10 messages, long-polling ``wait_s`` seconds (whole, 0-20); each message is
        deleted once read. Never raises (a failure is logged; no events)."""
        try:
            answer = self._sqs.receive_message(
                QueueUrl=self.queue_url, MaxNumberOfMessages=10,
                WaitTimeSeconds=max(0, min(MAX_WAIT_S, int(wait_s))))
        except Exception as exc:  # throttling, network, permissions: the passes still list
            log.warning("provider %s: reading %s failed: %s", self.provider, self.queue_url, exc)
            return []
        messages = answer.get("Messages") or []
        found = []
        for message in messages:
            event = parse_message(self.provider, message.get("Body", ""), self._warned)
            if event is None:
                log.debug("provider %s: ignored message %s", self.provider,
                          message.get("MessageId"))
            else:
                found.append(event)
        if messages:
            try:
                self._sqs.delete_message_batch(QueueUrl=self.queue_url, Entries=[
                    {"Id": str(i), "ReceiptHandle": m["ReceiptHandle"]}
                    for i, m in enumerate(messages)])
            except Exception as exc:  # they come back after the visibility timeout: harmless
                log.warning("provider %s: deleting read messages failed: %s", self.provider, exc)
        if len(self._warned) > 10000:  # a long-running daemon: forget the oldest warnings
            self._warned.clear()
        return found

    def close(self) -> None:
        """Close the SQS client's connections."""
        self._sqs.close()
