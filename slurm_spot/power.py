"""Slurm's power-saving hooks: resume, suspend and resume-fail (slurm.conf(5): ResumeProgram,
SuspendProgram, ResumeFailProgram).

- :func:`resume` groups the nodes by node set, launches through each node set's provider in
  one request per node set, records NodeAddr/NodeHostName in Slurm, and sets every node it
  could not launch DOWN with a ``(Code:<code>)<message>`` reason, then POWER_DOWN, so slurmctld
  requeues the node's job at once instead of waiting out ResumeTimeout.
- :func:`suspend` and :func:`resume_fail` terminate every instance behind the nodes
  (duplicates too); both are idempotent.

Nodes are validated before anything is done: an unknown name changes nothing.
"""

from __future__ import annotations

import hashlib
import logging
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field

from slurm_spot import events
from slurm_spot.config import NodeSetConfig, SpotConfig
from slurm_spot.errors import ProviderError, SlurmCommandError
from slurm_spot.hostlist import group_by_node_set
from slurm_spot.providers import get_provider
from slurm_spot.providers.base import (
    ErrorClass,
    Instance,
    LaunchFailure,
    LaunchRequest,
    Provider,
)
from slurm_spot.slurm.client import SlurmClient

log = logging.getLogger(__name__)

ProviderFactory = Callable[[SpotConfig, str], Provider]


@dataclass
class PowerResult:
    """What a hook did: instances launched or terminated, failures, and Slurm errors."""

    launched: list[Instance] = field(default_factory=list)
    terminated: list[Instance] = field(default_factory=list)
    failed: list[LaunchFailure] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, object]:
        return {
            "launched": [i.to_json() for i in self.launched],
            "terminated": [i.to_json() for i in self.terminated],
            "failed": [
                {"nodes": list(f.nodes), "code": f.code, "class": f.error_class.value,
                 "reason": f.reason}
                for f in self.failed
            ],
            "errors": self.errors,
        }


def client_token(cluster: str, nodes: list[str]) -> str:
    """A stable idempotency token for launching ``nodes`` (EC2 allows 64 ASCII chars)."""
    digest = hashlib.sha256(f"{cluster}:{','.join(sorted(nodes))}".encode()).hexdigest()
    return f"slurm-spot-{digest[:48]}"


def resume(
    config: SpotConfig,
    hostlist: str,
    slurm: SlurmClient,
    providers: ProviderFactory = get_provider,
) -> PowerResult:
    """Launch instances for ``hostlist`` (see the module docstring).

    A failure for one node set (provider error, Slurm refusing an update) is recorded and the
    other node sets still proceed.

    Raises:
        HostlistError, UnknownNodeError: bad input; nothing was launched.
    """
    groups = group_by_node_set(config, hostlist)
    result = PowerResult()
    for set_name, nodes in groups.items():
        node_set = config.node_set(set_name)
        _resume_node_set(config, node_set, nodes, slurm, providers, result)
    return result


def _resume_node_set(
    config: SpotConfig,
    node_set: NodeSetConfig,
    nodes: list[str],
    slurm: SlurmClient,
    providers: ProviderFactory,
    result: PowerResult,
) -> None:
    request = LaunchRequest(config.cluster, node_set, tuple(nodes), client_token(config.cluster, nodes))
    try:
        outcome = providers(config, node_set.provider).launch(request)
        failures = list(outcome.failed)
        launched = list(outcome.launched)
    except ProviderError as exc:
        launched = []
        failures = [LaunchFailure(tuple(nodes), exc.code, str(exc).split(": ", 1)[-1],
                                  ErrorClass(exc.error_class))]
    result.launched.extend(launched)
    result.failed.extend(failures)
    for inst in launched:
        events.emit(config.log_dir, events.Event(
            events.Action.LAUNCHED, "resume", node=inst.node, instance=inst.instance_id,
            extra={"market": inst.market, "type": inst.instance_type, "zone": inst.zone}))
    addresses = {
        i.node: (i.private_ip, i.hostname or i.node)
        for i in launched
        if i.node and i.private_ip
    }
    if addresses:
        try:
            slurm.set_addresses(addresses)  # type: ignore[arg-type]
        except SlurmCommandError as exc:
            # An instance Slurm cannot reach is a leak: give it back now, tell the caller.
            result.errors.append(f"{exc}; terminating the instances just launched")
            _give_back(config, node_set, providers, launched, result)
    for failure in failures:
        mark_launch_failed(config, slurm, failure, result)


def _give_back(config: SpotConfig, node_set: NodeSetConfig, providers: ProviderFactory,
               launched: list[Instance], result: PowerResult) -> None:
    ids = [i.instance_id for i in launched]
    try:
        providers(config, node_set.provider).terminate_instances(ids)
    except ProviderError as exc:
        result.errors.append(f"could not terminate {', '.join(ids)}: {exc}; the reconciler will")
        return
    result.launched = [i for i in result.launched if i.instance_id not in set(ids)]
    result.terminated.extend(launched)
    for inst in launched:
        events.emit(config.log_dir, events.Event(
            events.Action.TERMINATED, "resume", node=inst.node, instance=inst.instance_id,
            reason="Slurm did not accept the node's address"))


def mark_launch_failed(
    config: SpotConfig, slurm: SlurmClient, failure: LaunchFailure, result: PowerResult
) -> None:
    """DOWN with ``(Code:X)...`` (slurmctld requeues the jobs at once), then POWER_DOWN so the
    node returns to ``idle~`` instead of staying in plain DOWN."""
    nodes = list(failure.nodes)
    events.record(config.log_dir, "resume", events.Action.LAUNCH_FAILED, nodes, reason=failure.reason,
                  extra={"code": failure.code, "class": failure.error_class.value,
                         "pool": failure.pool})
    try:
        slurm.set_state(nodes, "DOWN", failure.reason)
        slurm.set_state(nodes, "POWER_DOWN", failure.reason)
    except SlurmCommandError as exc:
        log.error("could not mark %s down: %s", ",".join(nodes), exc)
        result.errors.append(str(exc))


def terminate_nodes(
    config: SpotConfig,
    hostlist: str,
    source: str,
    providers: ProviderFactory = get_provider,
) -> PowerResult:
    """Terminate every instance behind ``hostlist`` (suspend and resume-fail).

    Idempotent: nodes without instances are fine. A provider error for one node set is
    recorded in ``errors`` and the others proceed.

    Raises:
        HostlistError, UnknownNodeError: bad input; nothing was terminated.
    """
    groups = group_by_node_set(config, hostlist)
    by_provider: dict[str, list[str]] = defaultdict(list)
    for set_name, nodes in groups.items():
        by_provider[config.node_set(set_name).provider].extend(nodes)
    result = PowerResult()
    for provider_name, nodes in by_provider.items():
        try:
            ended = providers(config, provider_name).terminate(nodes)
        except ProviderError as exc:
            result.errors.append(f"{provider_name}: {exc}")
            continue
        result.terminated.extend(ended)
        for inst in ended:
            events.emit(config.log_dir, events.Event(
                events.Action.TERMINATED, source, node=inst.node, instance=inst.instance_id))
    return result


def suspend(config: SpotConfig, hostlist: str, providers: ProviderFactory = get_provider) -> PowerResult:
    """SuspendProgram: terminate the instances of nodes Slurm powers down."""
    return terminate_nodes(config, hostlist, "suspend", providers)


def resume_fail(
    config: SpotConfig, hostlist: str, providers: ProviderFactory = get_provider
) -> PowerResult:
    """ResumeFailProgram: nodes that did not register within ResumeTimeout. Terminate what is
    behind them; the reconciler returns the nodes to ``idle~``."""
    return terminate_nodes(config, hostlist, "resume-fail", providers)
