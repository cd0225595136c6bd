"""The provider contract: typed records and the protocol every cloud module implements.

A provider owns the instances behind cloud nodes. Its state of record is the cloud itself
(tags/labels: cluster, node name, node set, market), never a local file, so a restarted
controller, a re-run hook or two hooks at once neither leak nor duplicate instances.
"""

from __future__ import annotations

import enum
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Protocol, TypeVar, runtime_checkable

from slurm_spot.config import NodeSetConfig, ProviderSettings, SpotConfig
from slurm_spot.errors import ConfigError
from slurm_spot.providers.notices import NoticeSource

if TYPE_CHECKING:
    from slurm_spot.providers.events import EventSource  # it imports this module
    from slurm_spot.providers.prices import PriceSource

# Tag / label keys every provider writes on its instances (label-safe: lowercase, dashes).
TAG_CLUSTER = "slurm-spot-cluster"
TAG_NODE = "slurm-spot-node"
TAG_NODE_SET = "slurm-spot-node-set"
TAG_MARKET = "slurm-spot-market"


class ErrorClass(str, enum.Enum):
    """What a launch error means for the next step (see tests/data/cloud-errors.yaml).

    - CAPACITY: this pool (instance type x zone x market) has none now; try the next pool,
      cool this one down, power the nodes down with a ``(Code:X)`` reason; never fail the job.
    - PERMANENT: this (instance type, zone) pair is not offered at all (EC2 ``Unsupported``;
      GCE ``invalid``/``notFound`` naming the zone's machine or accelerator type); remembered
      and never tried again; not capacity (no cooldown).
    - QUOTA: a regional limit; launch up to the headroom, back off longer.
    - CONFIG: the request is wrong; stop retrying this node set until the config changes.
    - THROTTLE: the API is rate limiting; retry the same request with jittered back-off.
    - AUTH: credentials or permissions; like CONFIG.
    - UNKNOWN: look instances up by node tag before any retry (one may exist); bounded retries.
    """

    CAPACITY = "capacity"
    PERMANENT = "permanent"
    QUOTA = "quota"
    CONFIG = "config"
    THROTTLE = "throttle"
    AUTH = "auth"
    UNKNOWN = "unknown"


def normalize_code(code: str) -> str:
    """Error codes compare case-insensitively and without separators
    (``QUOTA_EXCEEDED`` == ``quotaExceeded``)."""
    return re.sub(r"[^a-z0-9]", "", code.lower())


def classify(code: str, table: Mapping[str, ErrorClass]) -> ErrorClass:
    """Look ``code`` up in a provider's table (keys in any spelling); UNKNOWN if absent."""
    normalized = {normalize_code(k): v for k, v in table.items()}
    return normalized.get(normalize_code(code), ErrorClass.UNKNOWN)


class InstanceState(str, enum.Enum):
    """Provider-neutral life-cycle state of an instance."""

    PENDING = "pending"  # requested, booting (EC2 pending, GCE PROVISIONING/STAGING)
    RUNNING = "running"
    STOPPING = "stopping"  # shutting down, stopping, suspending
    STOPPED = "stopped"
    TERMINATED = "terminated"

    @property
    def is_alive(self) -> bool:
        """PENDING and RUNNING count as alive: the instance is, or will be, a node."""
        return self in (InstanceState.PENDING, InstanceState.RUNNING)


@dataclass(frozen=True)
class Instance:
    """One instance as the provider reports it.

    Attributes:
        instance_id: the provider's id (``i-0abc...``, GCE instance name, local ``loc-...``).
        node: the Slurm node name from the node tag, or None for an untagged instance.
        node_set: node set name from its tag, or None.
        state: life-cycle state.
        market: ``"spot"`` or ``"on-demand"``.
        instance_type: ``g5.xlarge``, ``a2-highgpu-1g``, ``local``.
        zone: availability zone / GCE zone / ``local``.
        launch_time: when it was created (timezone-aware UTC).
        private_ip: address Slurm should use as NodeAddr, if known.
        hostname: NodeHostName, if known.
        state_reason: provider's reason for the last state change
            (``Server.SpotInstanceTermination``, ``preempted``), or "".
    """

    instance_id: str
    node: str | None
    node_set: str | None
    state: InstanceState
    market: str
    instance_type: str
    zone: str
    launch_time: datetime
    private_ip: str | None = None
    hostname: str | None = None
    state_reason: str = ""

    def age_s(self, now: datetime | None = None) -> float:
        """Seconds since launch."""
        now = now or datetime.now(timezone.utc)
        return (now - self.launch_time).total_seconds()

    @property
    def was_reclaimed(self) -> bool:
        """True if the provider took the instance back (spot interruption): its
        ``state_reason`` names a spot termination (EC2 ``Server.SpotInstanceTermination``), a
        preemption (GCE) or a reclaim (the local provider). ``spot`` inside ``slurm-spot`` (an
        instance slurm-spot itself terminated) does not count."""
        reason = self.state_reason.lower().replace("slurm-spot", "")
        return "spot" in reason or "preempt" in reason or "reclaim" in reason

    def to_json(self) -> dict[str, object]:
        """The fields ``slurm-spot instances --json`` prints, the same for every provider."""
        return {
            "instance_id": self.instance_id,
            "node": self.node,
            "node_set": self.node_set,
            "state": self.state.value,
            "market": self.market,
            "instance_type": self.instance_type,
            "zone": self.zone,
            "launch_time": self.launch_time.isoformat(),
            "private_ip": self.private_ip,
            "state_reason": self.state_reason,
        }


@dataclass(frozen=True)
class LaunchRequest:
    """Start one instance for each of ``nodes``, all of node set ``node_set``.

    ``client_token`` is stable for the same (cluster, nodes) so a re-run is idempotent where
    the API supports tokens.
    """

    cluster: str
    node_set: NodeSetConfig
    nodes: tuple[str, ...]
    client_token: str = ""


@dataclass(frozen=True)
class LaunchFailure:
    """Nodes that got no instance, with the provider's code and our class for it."""

    nodes: tuple[str, ...]
    code: str
    message: str
    error_class: ErrorClass
    pool: str = ""  # "<instance type>/<zone>/<market>" that failed, for cooldowns
    # QUOTA only, when the provider says: the quota's size and what one node takes of it, in
    # the quota's unit (vCPU for EC2 VcpuLimitExceeded), to tell a job that can never fit.
    quota_limit: int | None = None
    quota_per_node: int | None = None
    quota_unit: str = ""

    @property
    def reason(self) -> str:
        """The Slurm node reason: ``(Code:<code>)<message>``, one line, at most 200 chars."""
        from slurm_spot.slurm.reasons import launch_failure_reason

        return launch_failure_reason(self.code, self.message)


@dataclass(frozen=True)
class LaunchResult:
    """What a launch produced: instances (each with ``node`` set) and failures."""

    launched: tuple[Instance, ...] = ()
    failed: tuple[LaunchFailure, ...] = ()
    api_calls: int = 0
    failed_pools: tuple[str, ...] = field(default_factory=tuple)


@runtime_checkable
class Provider(Protocol):
    """What slurm-spot needs from a cloud. Implementations: local, aws, gcp."""

    name: str

    def launch(self, request: LaunchRequest) -> LaunchResult:
        """Start instances for ``request.nodes``; never more than one alive per node.

        Nodes that already have an alive instance are returned as launched without a new
        request. Errors for some nodes become ``LaunchResult.failed`` entries; the call raises
        only for errors that stop everything (credentials, a broken endpoint).

        Raises:
            ProviderError: nothing could be attempted.
        """
        ...

    def terminate(self, nodes: Sequence[str]) -> list[Instance]:
        """Terminate every instance tagged with one of ``nodes`` (duplicates too).

        Idempotent: already-gone instances are skipped. Returns what was terminated.
        """
        ...

    def terminate_instances(self, instance_ids: Sequence[str]) -> None:
        """Terminate instances by id; unknown or gone ids are ignored."""
        ...

    def list_instances(self) -> list[Instance]:
        """Every instance of this cluster (by cluster tag), alive or recently ended, in one
        paginated listing."""
        ...


@dataclass(frozen=True)
class Finding:
    """One result of ``config check --online`` (:func:`slurm_spot.providers.check_online`).

    Attributes:
        field: the spot.yaml field it is about, as a dotted path (``node_sets.0.aws.subnets.1``,
            ``providers.aws``); the command adds the line the file has it on.
        message: what is wrong and what to do.
        severity: ``error`` (a launch would fail: exit code 2) or ``warning`` (could not be
            checked, or only some launches would fail).
    """

    field: str
    message: str
    severity: str = "error"

    def __str__(self) -> str:
        return f"{self.field}: {self.message}"


class ProviderPackage(Protocol):
    """What the package of one provider type (``providers/<type>/__init__.py``) offers the
    rest of slurm-spot; the registry in :mod:`slurm_spot.providers` finds it by type. Each
    function imports the provider's modules (and cloud library) only when called. A cloud
    type's library is the package extra named after the type (``pip install
    slurm-spot[<type>]``, what the Ansible role installs for it; tests/test_change_cost_provider.py)."""

    def make_provider(self, config: SpotConfig, name: str, settings: ProviderSettings) -> Provider:
        """The provider called ``name``, whose settings are ``settings``.

        Raises:
            ConfigError: ``settings`` are not of this type.
        """
        ...

    def check_node_set(self, config: SpotConfig, index: int) -> list[str]:
        """Problems of ``config.node_sets[index]`` the schema cannot see, each one line
        naming its field (``node_sets.0.aws.subnets``); empty when fine."""
        ...

    def node_shape(self, config: SpotConfig, index: int) -> NodeSetConfig:
        """``config.node_sets[index]`` with what the provider knows filled in (an EC2 type's
        CPUs, memory and GPUs); the node set itself when there is nothing to add.

        Raises:
            ConfigError: the shape cannot be known (an instance type missing from the catalogue).
        """
        ...

    def notice_source(self, config: SpotConfig, node: str, settings: ProviderSettings) -> NoticeSource:
        """The interruption-notice source ``slurm-spot watch`` polls on ``node``."""
        ...

    def event_source(self, config: SpotConfig, name: str,
                     settings: ProviderSettings) -> EventSource | None:
        """The provider's own events of instances ending, which the reconciler reads between
        passes (:mod:`slurm_spot.providers.events`); None when it has none or they are off."""
        ...

    def capacity_codes(self) -> frozenset[str]:
        """This provider's error codes that mean "no capacity in this pool now", normalized
        with :func:`normalize_code` (from its error table)."""
        ...

    def check_online(self, config: SpotConfig, name: str) -> list[Finding]:
        """Ask the cloud, read-only (and with DryRun where the API has it), about everything
        the node sets of provider ``name`` name: what would make a launch fail is an error,
        what could not be checked (a refused permission, an API the endpoint lacks) a
        warning. Never raises for a cloud error: it becomes a finding."""
        ...

    def price_source(self, config: SpotConfig | None, name: str | None, live: bool = False,
                     live_on_demand: bool = False) -> PriceSource:
        """The instance-hour prices of provider ``name`` of ``config`` (its region), or of
        the type's shipped catalogue when ``config`` or ``name`` is None
        (:mod:`slurm_spot.providers.prices`). ``live``: ask the cloud for prices that change
        (AWS spot price history); ``live_on_demand``: also for list prices the catalogue does
        not have for the region (AWS Price List API). No I/O until a price is asked.

        Raises:
            ConfigError: ``name``'s settings are not of this type.
        """
        ...

    def permissions(self, config: SpotConfig, name: str) -> dict[str, dict[str, object]] | None:
        """What ``config iam`` prints for provider ``name``: per principal (``controller``,
        ``nodes``, ...) where to attach (``attach``) which policy or permissions, derived
        from the calls the package makes (its ``iam.py``); None when it needs none."""
        ...

    def instance_types(self, config: SpotConfig, node_set: NodeSetConfig) -> list[str]:
        """The instance types ``node_set`` (one of this provider's) may launch, the ones its
        price is asked for (``instance_types``, and whatever else the provider's section
        names, e.g. a GCE ``machine_type``), in config order."""
        ...

    def instance_identity(self, config: SpotConfig, node: str,
                          settings: ProviderSettings) -> tuple[str, str] | None:
        """``(instance id, instance type)`` of the instance this process runs on, read from
        the provider's metadata service, the id spelled as the resume hook records it in the
        node's InstanceId (Slurm 23.11+); None for a provider whose nodes are no instances.

        Raises:
            ProviderError: the metadata service cannot be read.
        """
        ...


_S = TypeVar("_S")


def expect_settings(settings: ProviderSettings, kind: type[_S], name: str = "<name>") -> _S:
    """``settings`` as the settings class ``kind`` of a provider type.

    Raises:
        ConfigError: ``settings`` are of another provider type (``providers.<name>.type``).
    """
    if not isinstance(settings, kind):
        raise ConfigError("<config>", [f"providers.{name}.type: {settings.type!r} is not the "
                                       f"type of {kind.__name__}"])
    return settings
