"""Pure functions for the AWS provider: CreateFleet parameters, tags, node mapping, and the
translation of DescribeInstances records into :class:`~slurm_spot.providers.base.Instance`.

Nothing here does I/O, so every function is tested against expected dicts.

How a node finds its instance (and back)
----------------------------------------
One CreateFleet call starts N instances that all get the same tags (``TagSpecifications`` cannot
differ per instance), and one CreateTags call writes the same tags on every resource it names. So
N distinct node-name tags cost N CreateTags calls: 1000 for 1000 nodes. Instead, each instance
carries the *index* of its node in binary, one tag per set bit (``slurm-spot-node-bit3=1``), then
a completion mark (``slurm-spot-node-mapped=1``) written last, in one call for all. That is
``bit_length(largest index) + 1`` calls per launch (11 for 1000 nodes), whatever N is. The node
name is ``<node set tag>-<index>``; an instance without the mark has no node yet.

Leak-free: the cluster, node-set, market and launch tags are written *at launch*
(``TagSpecifications``), so an instance whose mapping was never finished is still found by the
cluster tag, shows ``node=None`` and is an orphan the reconciler terminates after its grace time;
the launcher itself terminates it at once when it cannot finish the mapping.

A ``slurm-spot-node`` tag with a readable node name, where present (written by hand or by an
older tool), wins over the bits.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

from slurm_spot.providers.base import (
    TAG_CLUSTER,
    TAG_MARKET,
    TAG_NODE,
    TAG_NODE_SET,
    Instance,
    InstanceState,
)

TAG_LAUNCH = "slurm-spot-launch"  # the ClientToken of the CreateFleet call that made the instance
TAG_NODE_MAPPED = f"{TAG_NODE}-mapped"  # written last: the bit tags are complete
TAG_NODE_BIT = f"{TAG_NODE}-bit"  # + bit number, value "1"
MAX_FLEET_TARGET = 1000  # instances per CreateFleet call (the RunInstances resource bucket size)
MAX_TAG_RESOURCES = 1000  # CreateTags: at most 1000 resource ids per call

_STATES = {
    "pending": InstanceState.PENDING,
    "running": InstanceState.RUNNING,
    "shutting-down": InstanceState.STOPPING,
    "stopping": InstanceState.STOPPING,
    "stopped": InstanceState.STOPPED,
    "terminated": InstanceState.TERMINATED,
}


@dataclass(frozen=True)
class Pool:
    """One capacity pool: an instance type in a subnet (hence in one availability zone).

    ``zone`` is "" when the subnet's zone is not known yet.
    """

    instance_type: str
    subnet: str
    zone: str = ""

    def label(self, market: str) -> str:
        """``<instance type>/<zone or subnet>/<market>``, the pool string of LaunchFailure."""
        return f"{self.instance_type}/{self.zone or self.subnet}/{market}"


@dataclass(frozen=True)
class FleetSpec:
    """What one CreateFleet (instant) call asks for, before tags and token.

    Attributes:
        template: launch template name, or its id (``lt-`` + hex).
        template_version: ``$Default``, ``$Latest`` or a number.
        pools: the overrides, in preference order.
        market: ``spot`` or ``on-demand`` (``DefaultTargetCapacityType``).
        count: ``TotalTargetCapacity``, instances (1..1000).
        allocation_strategy: spot allocation strategy (on-demand always uses ``lowest-price``).
        max_price_usd_per_hour: spot ``MaxPrice`` of every override, USD per instance-hour.
    """

    template: str
    template_version: str
    pools: tuple[Pool, ...]
    market: str
    count: int
    allocation_strategy: str = "price-capacity-optimized"
    max_price_usd_per_hour: float | None = None


def launch_template_spec(template: str, version: str) -> dict[str, str]:
    """``LaunchTemplateSpecification``: by id when ``template`` looks like ``lt-<hex>``, else by
    name (EC2 API reference, FleetLaunchTemplateSpecificationRequest)."""
    by_id = re.fullmatch(r"lt-[0-9a-f]{8,17}", template)
    return {"LaunchTemplateId" if by_id else "LaunchTemplateName": template, "Version": version}


def format_price(usd_per_hour: float) -> str:
    """A price as EC2 wants it: a decimal string (``0.35``), no exponent."""
    text = f"{usd_per_hour:.6f}".rstrip("0").rstrip(".")
    return text or "0"


def build_overrides(spec: FleetSpec) -> list[dict[str, Any]]:
    """One override per pool (instance type x subnet); ``MaxPrice`` on spot overrides only.

    EC2 API reference, FleetLaunchTemplateOverridesRequest (a request of type instant takes one
    subnet per override).
    """
    overrides: list[dict[str, Any]] = []
    for pool in spec.pools:
        override: dict[str, Any] = {"InstanceType": pool.instance_type, "SubnetId": pool.subnet}
        if spec.market == "spot" and spec.max_price_usd_per_hour is not None:
            override["MaxPrice"] = format_price(spec.max_price_usd_per_hour)
        overrides.append(override)
    return overrides


def instance_tags(
    cluster: str, node_set: str, market: str, launch_id: str
) -> list[tuple[str, str]]:
    """Tags every instance gets at launch: cluster, node set, market, launch id and a Name."""
    return [
        (TAG_CLUSTER, cluster),
        (TAG_NODE_SET, node_set),
        (TAG_MARKET, market),
        (TAG_LAUNCH, launch_id),
        ("Name", f"{cluster}-{node_set} (slurm-spot)"),
    ]


def build_create_fleet_params(
    spec: FleetSpec, tags: Sequence[tuple[str, str]], client_token: str
) -> dict[str, Any]:
    """Keyword arguments of ``ec2.create_fleet`` for ``spec`` (EC2 API reference, CreateFleet).

    Type ``instant`` (synchronous, returns ``Instances`` and ``Errors``); spot interruption
    behaviour is always ``terminate``, the only one an instant fleet supports (stop/hibernate
    need a ``maintain`` fleet; config checks reject them).

    Raises:
        ValueError: ``count`` outside 1..MAX_FLEET_TARGET, no pools, or an unknown market.
    """
    if not 1 <= spec.count <= MAX_FLEET_TARGET:
        raise ValueError(f"count must be 1..{MAX_FLEET_TARGET}, not {spec.count}")
    if not spec.pools:
        raise ValueError("a fleet needs at least one pool")
    if spec.market not in ("spot", "on-demand"):
        raise ValueError(f"unknown market {spec.market!r}")
    template = launch_template_spec(spec.template, spec.template_version)
    params: dict[str, Any] = {
        "Type": "instant",
        "ClientToken": client_token,
        "LaunchTemplateConfigs": [
            {
                "LaunchTemplateSpecification": template,
                "Overrides": build_overrides(spec),
            }
        ],
        "TargetCapacitySpecification": {
            "TotalTargetCapacity": spec.count,
            "DefaultTargetCapacityType": spec.market,
        },
        "TagSpecifications": [
            {"ResourceType": "instance", "Tags": [{"Key": k, "Value": v} for k, v in tags]}
        ],
    }
    if spec.market == "spot":
        params["SpotOptions"] = {
            "AllocationStrategy": spec.allocation_strategy,
            "InstanceInterruptionBehavior": "terminate",
        }
    else:
        params["OnDemandOptions"] = {"AllocationStrategy": "lowest-price"}
    return params


def client_token(spec: FleetSpec, request_key: str, generation: int = 0) -> str:
    """A CreateFleet ``ClientToken`` (<= 64 ASCII chars) derived from the request.

    The same spec and key give the same token, so a retried or concurrent identical request is
    answered by EC2 with the first one's instances (EC2 "Ensuring idempotency"); a different
    spec gives a different token (reusing a token with other parameters is
    ``IdempotentParameterMismatch``). ``generation`` > 0 makes a fresh token when a previous
    launch with the same token has already ended.
    """
    payload = json.dumps(
        {"spec": repr(spec), "key": request_key, "generation": generation}, sort_keys=True
    )
    return "slurm-spot-" + hashlib.sha256(payload.encode()).hexdigest()[:40]


def fleet_instance_ids(response: Mapping[str, Any]) -> list[tuple[str, str, str, str]]:
    """``(instance id, instance type, subnet, lifecycle)`` for every instance a CreateFleet
    (instant) response lists under ``Instances`` (EC2 API reference, CreateFleetInstance)."""
    found = []
    for entry in response.get("Instances") or []:
        overrides = (entry.get("LaunchTemplateAndOverrides") or {}).get("Overrides") or {}
        for instance_id in entry.get("InstanceIds") or []:
            found.append(
                (
                    str(instance_id),
                    str(entry.get("InstanceType") or overrides.get("InstanceType") or ""),
                    str(overrides.get("SubnetId") or ""),
                    str(entry.get("Lifecycle") or ""),
                )
            )
    return found


def node_index(node: str, node_set: str) -> int:
    """The number of ``node`` in its node set (``gpu-12`` in ``gpu`` -> 12).

    Raises:
        ValueError: ``node`` is not ``<node_set>-<positive integer>``.
    """
    match = re.fullmatch(re.escape(node_set) + r"-([1-9][0-9]*)", node)
    if not match:
        raise ValueError(f"{node!r} is not a node of node set {node_set!r}")
    return int(match.group(1))


TagCall = tuple[list[str], list[tuple[str, str]]]  # (instance ids, [(key, value)])


def node_mapping_calls(assignment: Mapping[str, int]) -> list[TagCall]:
    """The CreateTags calls that map instances to node indices: ``(instance ids, tags)`` each.

    One call per bit that is set in some index (ids in chunks of 1000), then the completion
    mark for every instance, last. ``assignment`` maps instance id -> node index (>= 1).
    """
    calls: list[TagCall] = []
    width = max(assignment.values(), default=0).bit_length()
    for bit in range(width):
        ids = sorted(i for i, index in assignment.items() if index >> bit & 1)
        for start in range(0, len(ids), MAX_TAG_RESOURCES):
            calls.append((ids[start : start + MAX_TAG_RESOURCES], [(f"{TAG_NODE_BIT}{bit}", "1")]))
    everyone = sorted(assignment)
    for start in range(0, len(everyone), MAX_TAG_RESOURCES):
        calls.append((everyone[start : start + MAX_TAG_RESOURCES], [(TAG_NODE_MAPPED, "1")]))
    return calls


def decode_node(tags: Mapping[str, str]) -> str | None:
    """The node an instance belongs to, from its tags, or None if it has none (yet).

    A readable ``slurm-spot-node`` tag wins; otherwise the bit tags count only once the
    ``slurm-spot-node-mapped`` mark is there.
    """
    if tags.get(TAG_NODE):
        return tags[TAG_NODE]
    node_set = tags.get(TAG_NODE_SET)
    if not node_set or tags.get(TAG_NODE_MAPPED) != "1":
        return None
    index = 0
    for key, value in tags.items():
        if key.startswith(TAG_NODE_BIT) and value == "1" and key[len(TAG_NODE_BIT) :].isdigit():
            index |= 1 << int(key[len(TAG_NODE_BIT) :])
    return f"{node_set}-{index}" if index else None


def instance_from_ec2(record: Mapping[str, Any]) -> Instance:
    """An :class:`Instance` from one DescribeInstances ``Reservations[].Instances[]`` record.

    Market from ``InstanceLifecycle`` (``spot``; absent means on-demand), hostname is the first
    label of ``PrivateDnsName`` (what ``hostname -s`` prints on the instance, so slurmd finds its
    NodeHostName), ``state_reason`` is ``StateReason.Code`` (``Server.SpotInstanceTermination``).
    EC2 API reference, DescribeInstances / Instance.
    """
    tags = {t["Key"]: t["Value"] for t in record.get("Tags") or []}
    launch_time = record.get("LaunchTime")
    if not isinstance(launch_time, datetime):
        launch_time = datetime.fromtimestamp(0, timezone.utc)
    elif launch_time.tzinfo is None:
        launch_time = launch_time.replace(tzinfo=timezone.utc)
    dns = str(record.get("PrivateDnsName") or "")
    return Instance(
        instance_id=str(record["InstanceId"]),
        node=decode_node(tags),
        node_set=tags.get(TAG_NODE_SET),
        state=_STATES.get((record.get("State") or {}).get("Name", ""), InstanceState.TERMINATED),
        market="spot" if record.get("InstanceLifecycle") == "spot" else "on-demand",
        instance_type=str(record.get("InstanceType") or ""),
        zone=str((record.get("Placement") or {}).get("AvailabilityZone") or ""),
        launch_time=launch_time.astimezone(timezone.utc),
        private_ip=record.get("PrivateIpAddress") or None,
        hostname=dns.split(".")[0] or None,
        state_reason=str((record.get("StateReason") or {}).get("Code") or ""),
    )


def launch_tag(record: Mapping[str, Any]) -> str:
    """The ``slurm-spot-launch`` tag of a DescribeInstances record, or ""."""
    return next((t["Value"] for t in record.get("Tags") or [] if t["Key"] == TAG_LAUNCH), "")
