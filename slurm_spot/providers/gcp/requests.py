"""Pure builders of Compute Engine request bodies and parsers of its responses, as REST JSON
(camelCase dicts, exactly as the GCE REST reference spells them), so they can be tested
against expected dicts and read next to the reference.

References (Compute Engine API v1):

- ``instances.bulkInsert`` / ``regionInstances.bulkInsert`` with a ``BulkInsertInstanceResource``
  (``count``, ``minCount``, ``perInstanceProperties``, ``instanceProperties``,
  ``sourceInstanceTemplate``, ``locationPolicy``);
- ``Scheduling`` (``provisioningModel`` SPOT/STANDARD, ``instanceTerminationAction``
  DELETE/STOP, ``onHostMaintenance``, ``automaticRestart``, ``preemptible``);
- ``Instance`` (``name``, ``zone``, ``machineType``, ``status``, ``labels``, ``scheduling``,
  ``networkInterfaces[].networkIP``, ``creationTimestamp``);
- resource naming: ``[a-z]([-a-z0-9]*[a-z0-9])?``, at most 63 characters; label values: at most
  63 of ``[a-z0-9_-]``; list ``filter`` expressions ``labels.KEY = "VALUE"``.

``perInstanceProperties`` can only set ``name`` and ``hostname``, so the per-node label
(TAG_NODE) cannot be written by a bulk insert: the node is read back from the instance name
``<cluster>-<node>`` (the instance also carries the cluster, node-set and market labels).
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timezone

from slurm_spot.config import GcpNodeSetOptions, NodeSetConfig
from slurm_spot.providers.base import (
    TAG_CLUSTER,
    TAG_MARKET,
    TAG_NODE_SET,
    Instance,
    InstanceState,
)

NAME_RE = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
MAX_NAME_LEN = 63
REQUEST_ID_NAMESPACE = uuid.UUID("6f1c3a8e-2d4b-5c7e-9a10-4b2f8d6e0c11")

#: GCE ``Instance.status`` -> provider-neutral state (unlisted: STOPPED).
STATUS_STATES: Mapping[str, InstanceState] = {
    "PROVISIONING": InstanceState.PENDING,
    "STAGING": InstanceState.PENDING,
    "REPAIRING": InstanceState.PENDING,
    "RUNNING": InstanceState.RUNNING,
    "STOPPING": InstanceState.STOPPING,
    "SUSPENDING": InstanceState.STOPPING,
    "PENDING_STOP": InstanceState.STOPPING,
    "TERMINATED": InstanceState.STOPPED,
    "STOPPED": InstanceState.STOPPED,
    "SUSPENDED": InstanceState.STOPPED,
}

#: Slurm GRES type -> GCE accelerator type name (others: ``nvidia-<type>``).
ACCELERATOR_TYPES: Mapping[str, str] = {
    "t4": "nvidia-tesla-t4",
    "v100": "nvidia-tesla-v100",
    "p100": "nvidia-tesla-p100",
    "p4": "nvidia-tesla-p4",
    "l4": "nvidia-l4",
    "a100": "nvidia-tesla-a100",
    "a100_80gb": "nvidia-a100-80gb",
    "h100": "nvidia-h100-80gb",
}

#: Machine families whose GPUs come with the machine type (no ``guestAccelerators``).
GPU_BUNDLED_FAMILIES = ("a2-", "a3-", "a4-", "g2-", "g4-")


@dataclass(frozen=True)
class Attempt:
    """One bulk insert: a market, a machine type (None: the template's) and the zones GCE
    may use (regional: a location policy ALLOWing ``zones`` and DENYing ``denied``, the node
    set's zones that failed already; else a zonal request in ``zones[0]``)."""

    market: str
    machine_type: str | None
    zones: tuple[str, ...]
    regional: bool
    denied: tuple[str, ...] = ()

    def pools(self, template: str | None = None) -> tuple[str, ...]:
        """``<machine type>/<zone>/<market>`` of each zone, for cooldowns."""
        kind = self.machine_type or template or "template"
        return tuple(f"{kind}/{zone}/{self.market}" for zone in self.zones)


def instance_name(cluster: str, node: str) -> str:
    """The GCE instance name of a Slurm node: ``<cluster>-<node>`` (may be invalid: check
    with :func:`is_valid_instance_name`)."""
    return f"{cluster}-{node}"


def is_valid_instance_name(name: str) -> bool:
    """True if ``name`` is a valid GCE resource name (RFC 1035 label, at most 63 chars)."""
    return len(name) <= MAX_NAME_LEN and NAME_RE.fullmatch(name) is not None


def node_of(cluster: str, name: str) -> str | None:
    """The Slurm node behind instance ``name`` of ``cluster``, or None if not ours."""
    prefix = f"{cluster}-"
    return name[len(prefix):] if name.startswith(prefix) and len(name) > len(prefix) else None


def label_value(text: str) -> str:
    """``text`` as a valid label value: lowercase, ``[a-z0-9_-]``, at most 63 chars."""
    return re.sub(r"[^a-z0-9_-]", "-", text.lower())[:63]


def instance_labels(cluster: str, node_set: str, market: str) -> dict[str, str]:
    """The labels every instance of a node set carries (see the module docstring)."""
    return {
        TAG_CLUSTER: label_value(cluster),
        TAG_NODE_SET: label_value(node_set),
        TAG_MARKET: label_value(market),
    }


def label_filter(labels: Mapping[str, str]) -> str:
    """A list ``filter`` matching every label: ``(labels.k = "v") AND (...)``."""
    return " AND ".join(f'(labels.{k} = "{v}")' for k, v in sorted(labels.items()))


def request_id(token: str, attempt: Attempt, salt: int = 0) -> str:
    """A UUID derived from the batch (``token``), the attempt and ``salt``: a retried HTTP call
    reuses it (GCE then returns the first operation instead of creating twice); a new try
    after an operation failed, or after a stale replay, raises ``salt``."""
    key = f"{token}|{attempt.market}|{attempt.machine_type}|{','.join(attempt.zones)}|{salt}"
    return str(uuid.uuid5(REQUEST_ID_NAMESPACE, key))


def scheduling(market: str, termination_action: str, preemptible: bool) -> dict[str, object]:
    """``Scheduling`` for a market: Spot VMs (``provisioningModel=SPOT`` with
    ``instanceTerminationAction``), legacy preemptible VMs, or standard VMs. All terminate on
    host maintenance and never restart by themselves (required for Spot and for GPUs)."""
    base: dict[str, object] = {"onHostMaintenance": "TERMINATE", "automaticRestart": False}
    if market == "spot":
        return {**base, "provisioningModel": "SPOT",
                "instanceTerminationAction": termination_action}
    if preemptible:
        return {**base, "preemptible": True}
    return {**base, "provisioningModel": "STANDARD"}


def accelerator_type(gres_type: str) -> str:
    """The GCE accelerator type name of a Slurm GRES GPU type (``t4`` -> ``nvidia-tesla-t4``)."""
    return ACCELERATOR_TYPES.get(gres_type, "nvidia-" + gres_type.replace("_", "-"))


def attaches_gpus(machine_type: str | None) -> bool:
    """True if GPUs are attached to ``machine_type`` as ``guestAccelerators`` (False for the
    families whose GPUs come with the machine type, and for the template's own type)."""
    return machine_type is not None and not machine_type.startswith(GPU_BUNDLED_FAMILIES)


def _resource_path(value: str, prefix: str) -> str:
    return value if "/" in value else f"{prefix}/{value}"


def instance_properties(
    project: str, region: str, node_set: NodeSetConfig, labels: Mapping[str, str],
    attempt: Attempt,
) -> dict[str, object]:
    """``instanceProperties`` of a bulk insert: labels, scheduling and, without an instance
    template, machine type, boot disk, local SSDs and network. With a template these fields
    override the template's; the template supplies the rest."""
    opts = _gcp(node_set)
    props: dict[str, object] = {
        "labels": dict(labels),
        "scheduling": scheduling(attempt.market, opts.termination_action, opts.preemptible),
    }
    if attempt.machine_type:
        props["machineType"] = attempt.machine_type
    if node_set.gpus and attaches_gpus(attempt.machine_type):
        props["guestAccelerators"] = [{
            "acceleratorType": accelerator_type(node_set.gpus.type),
            "acceleratorCount": node_set.gpus.count,
        }]
    if opts.instance_template:
        return props
    disks: list[dict[str, object]] = [{
        "boot": True, "autoDelete": True, "type": "PERSISTENT",
        "initializeParams": {
            "sourceImage": _resource_path(opts.image or "", f"projects/{project}/global/images"),
            "diskSizeGb": str(opts.disk_size_gb),
        },
    }]
    disks += [{"type": "SCRATCH", "interface": "NVME", "autoDelete": True,
               "initializeParams": {"diskType": "local-ssd"}}] * opts.local_ssds
    nic: dict[str, object] = {"network": opts.network}
    if opts.subnetwork:
        nic["subnetwork"] = _resource_path(opts.subnetwork, f"regions/{region}/subnetworks")
    return {**props, "disks": disks, "networkInterfaces": [nic]}


def bulk_insert_body(
    project: str, region: str, cluster: str, node_set: NodeSetConfig, names: Sequence[str],
    attempt: Attempt,
) -> dict[str, object]:
    """The ``BulkInsertInstanceResource`` creating ``names`` (one instance each) for
    ``attempt``. ``minCount`` 1: GCE creates what it can; the rest fail over."""
    opts = _gcp(node_set)
    labels = instance_labels(cluster, node_set.name, attempt.market)
    body: dict[str, object] = {
        "count": str(len(names)),
        "minCount": "1",
        "perInstanceProperties": {name: {"name": name} for name in names},
        "instanceProperties": instance_properties(project, region, node_set, labels, attempt),
    }
    if opts.instance_template:
        body["sourceInstanceTemplate"] = _resource_path(
            opts.instance_template, f"projects/{project}/global/instanceTemplates")
    if attempt.regional:
        body["locationPolicy"] = {
            "locations": {
                **{f"zones/{z}": {"preference": "ALLOW"} for z in attempt.zones},
                **{f"zones/{z}": {"preference": "DENY"} for z in attempt.denied},
            },
            "targetShape": "ANY_SINGLE_ZONE",
        }
    return body


def _gcp(node_set: NodeSetConfig) -> GcpNodeSetOptions:
    if node_set.gcp is None:
        raise ValueError(f"node set {node_set.name!r} has no 'gcp' section")
    return node_set.gcp


def short_name(url: str | None) -> str:
    """The last path segment of a GCE URL (``.../zones/us-central1-a`` -> ``us-central1-a``)."""
    return (url or "").rstrip("/").rsplit("/", 1)[-1]


def parse_timestamp(text: str | None) -> datetime | None:
    """An RFC 3339 GCE timestamp (``2024-06-26T11:42:22.006-07:00``) as aware UTC, or None."""
    if not text:
        return None
    try:
        stamp = datetime.fromisoformat(text)  # Python 3.11 reads the final Z
    except ValueError:
        return None
    return (stamp if stamp.tzinfo else stamp.replace(tzinfo=timezone.utc)).astimezone(
        timezone.utc)


def instance_from_resource(resource: Mapping[str, object], cluster: str) -> Instance:
    """An ``Instance`` resource (REST JSON) as an :class:`Instance`.

    ``market`` comes from ``scheduling.provisioningModel`` (SPOT) or ``preemptible``; a spot
    instance that ended (TERMINATED) without a status message counts as preempted, since
    slurm-spot deletes its instances and never stops them.
    """
    name = str(resource.get("name", ""))
    labels = _mapping(resource.get("labels"))
    sched = _mapping(resource.get("scheduling"))
    spot = sched.get("provisioningModel") == "SPOT" or bool(sched.get("preemptible"))
    status = str(resource.get("status", ""))
    state = STATUS_STATES.get(status, InstanceState.STOPPED)
    reason = str(resource.get("statusMessage") or "")
    if not reason and spot and status == "TERMINATED":
        reason = "preempted"
    nics = resource.get("networkInterfaces")
    first_nic = _mapping(nics[0]) if isinstance(nics, list) and nics else {}
    created = parse_timestamp(str(resource.get("creationTimestamp") or ""))
    return Instance(
        instance_id=name,
        node=node_of(cluster, name),
        node_set=str(labels[TAG_NODE_SET]) if TAG_NODE_SET in labels else None,
        state=state,
        market="spot" if spot else "on-demand",
        instance_type=short_name(str(resource.get("machineType") or "")),
        zone=short_name(str(resource.get("zone") or "")),
        launch_time=created or datetime.fromtimestamp(0, timezone.utc),
        private_ip=str(first_nic["networkIP"]) if first_nic.get("networkIP") else None,
        hostname=name,
        state_reason=reason,
    )


def _mapping(value: object) -> Mapping[str, object]:
    return value if isinstance(value, Mapping) else {}
