"""The providers and node sets of ``spot.yaml``, as frozen pydantic models: each provider
type's settings (a ``providers:`` entry), the union of them (:data:`ProviderSettings`, with
:data:`PROVIDER_TYPE_NAMES` derived from it), each provider type's node-set section
(``node_sets[].aws``, ``.gcp``) and the node set that holds it (:class:`NodeSetConfig`):
everything a new provider type adds to the configuration (docs/DESIGN.md, "Adding a
provider"). The whole file and its cross references are :mod:`slurm_spot.config.models`.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Annotated, Literal, get_args

from pydantic import Field, StrictInt, field_validator, model_validator

from slurm_spot.config.base import ConfigModel
from slurm_spot.config.plain import NODE_SET_PATTERN, hostlist_of, node_names

_SLURM_UNSIGNALLABLE = "+"  # see plain.NODE_SET_PATTERN


class LocalProviderConfig(ConfigModel):
    """The built-in ``local`` provider: instances are ``slurmd`` processes on this machine."""

    type: Literal["local"] = "local"
    slurmd: str = Field("/usr/sbin/slurmd", pattern=r"^/", description="absolute path of slurmd")
    port_base: int = Field(17000, ge=1024, le=65000, description="node i listens on port_base+i")
    boot_delay_s: float = Field(
        2.0, ge=1.0, le=3600,
        description="seconds between the launch request and slurmd's start: the simulated "
                    "boot (a cloud GPU node takes 60-180 s; slurmd itself adds ~2-3 s)")
    slurmd_timeout_s: int = Field(300, ge=10, le=86400,
                                  description="SlurmdTimeout of the local cluster")
    kill_wait_s: int = Field(30, ge=1, le=3600, description="KillWait of the local cluster")
    notice_poll_s: float = Field(1.0, ge=0.05, le=60,
                                 description="how often a local watcher polls (seconds)")


class AwsProviderConfig(ConfigModel):
    """EC2 through boto3 (credentials from the standard boto3 chain, never from this file)."""

    type: Literal["aws"] = "aws"
    region: str
    endpoint_url: str | None = None
    profile: str | None = None
    credentials_file: Path | None = Field(
        None,
        description="shared credentials file (INI, like ~/.aws/credentials) to read instead of "
        "the default one: slurmctld runs the hooks with an empty environment, so "
        "AWS_SHARED_CREDENTIALS_FILE cannot reach them (a controller outside EC2, tests)",
    )
    events_queue_url: str | None = Field(
        None, pattern=r"^https?://\S+$",
        description="SQS queue that an EventBridge rule fills with EC2's spot interruption "
        "warnings and instance state-change notifications (docs/admin.md has the rule): the "
        "reconciler long-polls it and handles a lost instance at once instead of at its next "
        "pass; unset: the passes' listings alone find it")


class GcpProviderConfig(ConfigModel):
    """Compute Engine through google-cloud-compute."""

    type: Literal["gcp"] = "gcp"
    project: str
    region: str
    api_endpoint: str | None = None
    credentials_file: Path | None = None
    preemption_events: bool = Field(
        True, description="the reconciler lists the node sets' zones' operations every "
        "reconcile.events_poll_s for compute.instances.preempted and handles a preempted "
        "instance at once instead of at its next pass")


#: The settings of one ``providers:`` entry, whichever its type. A provider type is one model
#: here (its ``type`` Literal is the name) and one package in the registry
#: (:data:`slurm_spot.providers.PROVIDER_TYPES`, which must name the same types:
#: tests/test_provider_registry.py); every other list of types is derived from this union
#: (tests/test_change_cost_provider.py adds a type to it and to the registry, and nothing else).
ProviderSettings = LocalProviderConfig | AwsProviderConfig | GcpProviderConfig
ProviderConfig = Annotated[ProviderSettings, Field(discriminator="type")]
#: The provider type names spot.yaml accepts, in the order of :data:`ProviderSettings`.
PROVIDER_TYPE_NAMES: tuple[str, ...] = tuple(
    str(model.model_fields["type"].default) for model in get_args(ProviderSettings))


class GpuSpec(ConfigModel):
    """GPUs per node: ``type`` as in ``Gres=gpu:<type>:<count>``."""

    type: str = Field(pattern=r"^[a-z0-9_]+$")
    count: int = Field(ge=1, le=64)


class AwsNodeSetOptions(ConfigModel):
    """EC2 settings of one node set (see the EC2 Fleet API reference, CreateFleet)."""

    launch_template: str = Field(description="launch template name, or its id (lt-...)")
    launch_template_version: str = "$Default"
    subnets: list[str] = Field(min_length=1)
    # lowest-price: slurm-spot orders the types by price per GPU and skips pools in cooldown
    # (providers/pool_order.py); the others leave the choice among all pools to EC2.
    allocation_strategy: Literal[
        "price-capacity-optimized", "capacity-optimized", "lowest-price", "diversified"
    ] = "price-capacity-optimized"
    max_price_usd_per_hour: float | None = Field(None, gt=0, le=10000)
    subnet_zones: dict[str, str] = Field(
        default_factory=dict, description="subnet id -> availability zone, for config checks"
    )
    interruption_behavior: Literal["terminate", "stop", "hibernate"] = "terminate"
    rebalance_drain: bool = False


class GcpNodeSetOptions(ConfigModel):
    """Compute Engine settings of one node set."""

    zones: list[str] = Field(min_length=1)
    machine_type: str | None = None
    image: str | None = None
    instance_template: str | None = None
    network: str = "global/networks/default"
    subnetwork: str | None = None
    termination_action: Literal["DELETE", "STOP"] = "DELETE"
    preemptible: bool = False
    local_ssds: int = Field(0, ge=0, le=24)
    disk_size_gb: int = Field(50, ge=10, le=65536)
    type_order: Literal["price", "config"] = Field(
        "price", description="order in which a launch tries machine_type and instance_types: "
        "cheapest per GPU (per vCPU without GPUs) first, or as written; pools cooling down "
        "after a capacity failure are skipped either way")


class NodeSetConfig(ConfigModel):
    """A group of identical cloud nodes, named ``<name>-1`` .. ``<name>-<count>``.

    ``memory_mib`` is Slurm's RealMemory (MiB). ``fallback`` names the market tried when the
    primary market has no capacity (``on-demand`` for a spot node set), or ``none``.
    """

    name: str
    provider: str
    count: StrictInt = Field(ge=1, le=10000)
    market: Literal["spot", "on-demand"] = "spot"
    fallback: Literal["on-demand", "none"] = "none"
    instance_types: list[str] = Field(default_factory=list)
    # StrictInt: YAML reads yes/no/on/off as booleans, and pydantic took them as 1/0
    # (`weight: no` was Weight 0, the prewarm's; `cpus: on` one CPU).
    cpus: StrictInt = Field(1, ge=1, le=65536)
    memory_mib: StrictInt = Field(1000, ge=1, le=2**40)
    gpus: GpuSpec | None = None
    features: list[Annotated[str, Field(pattern=r"^[A-Za-z0-9_.+-]+$")]] = Field(default_factory=list)
    weight: StrictInt = Field(1, ge=0, le=65533)  # slurm.conf(5) Weight: 0..65533
    interruption_band: str | None = Field(
        None, description="AWS Spot Advisor 'frequency of interruption' band of this node "
        "set's spot capacity (<5%, 5-10%, 10-15%, 15-20%, >20%), for the cost order of "
        "power.order: cost (slurm_spot/cost/order.py); unset: 5-10% for a spot node set")
    aws: AwsNodeSetOptions | None = None
    gcp: GcpNodeSetOptions | None = None
    spares: StrictInt = Field(
        0, ge=0, le=10000,
        description="hot spares (issue 26): this many nodes of the node set are kept powered "
        "up and idle, so that a job (a requeued one after a reclaim without notice too) starts "
        "without waiting for a boot. Slurm keeps them from its power saving (SuspendExcNodes="
        "<nodes>:<N>, rendered); the reconciler powers nodes up to N each pass. Each costs its "
        "hourly price around the clock (`slurm-spot plan` shows it); at most count")

    @model_validator(mode="after")
    def _spares_within_count(self) -> NodeSetConfig:
        if self.spares > self.count:
            raise ValueError(f"node set {self.name!r}: spares ({self.spares}) cannot exceed "
                             f"count ({self.count})")
        return self

    @field_validator("interruption_band")
    @classmethod
    def _known_band(cls, value: str | None) -> str | None:
        """One of the five Spot Advisor bands (slurm_spot/config/plain.py BANDS)."""
        if value is None:
            return None
        from slurm_spot.config.plain import band_fraction
        from slurm_spot.errors import BadInputError

        try:
            band_fraction(value)
        except BadInputError as exc:
            raise ValueError(str(exc)) from None
        return value

    @field_validator("name")
    @classmethod
    def _signallable_name(cls, value: str) -> str:
        """Refuses names Slurm 22.05 cannot signal a job step on (see NODE_SET_PATTERN)."""
        bad = sorted({c for c in value if c in _SLURM_UNSIGNALLABLE})
        if bad:
            raise ValueError(
                f"node set {value!r}: {' '.join(repr(c) for c in bad)} cannot be used in a node "
                f"set name: slurmd 22.05 cannot signal job steps on nodes named so (scancel "
                f"fails with 'Invalid job id specified'), so jobs there would get no "
                f"preemption signal; use '_', '.' or '-' instead")
        if not re.fullmatch(NODE_SET_PATTERN, value):
            raise ValueError(f"node set {value!r}: must start with a-z and hold only a-z, 0-9, "
                             f"'.', '_', '-' (at most 41 characters)")
        return value

    @property
    def node_names(self) -> list[str]:
        """All node names of the set, in order (``gpu-1``, ``gpu-2``, ...)."""
        return node_names(self.name, self.count)

    @property
    def hostlist(self) -> str:
        """The node names as one Slurm hostlist expression (``gpu-[1-8]``)."""
        return hostlist_of(self.name, self.count)


def node_set_sections() -> tuple[str, ...]:
    """The node-set sections named after a provider type (``aws``, ``gcp``): a
    :class:`NodeSetConfig` field whose name is in :data:`PROVIDER_TYPE_NAMES`."""
    return tuple(t for t in PROVIDER_TYPE_NAMES if t in NodeSetConfig.model_fields)


def provider_section_problems(where: str, ns: NodeSetConfig, provider_type: str) -> list[str]:
    """A node set of a provider type that has a section needs it; no other type's section
    is allowed (derived from :func:`node_set_sections`, so a new type's section is checked
    as soon as it exists). ``where``: the node set's place in the file (``node_sets.0``);
    returns one problem line per wrong section, for :class:`~.models.SpotConfig`'s checks."""
    sections = node_set_sections()
    problems = [f"{where}.{s}: required for a node set of a {s!r} provider" for s in sections
                if s == provider_type and getattr(ns, s) is None]
    problems += [f"{where}.{s}: only allowed for a node set of a {s!r} provider" for s in sections
                 if s != provider_type and getattr(ns, s) is not None]
    return problems
