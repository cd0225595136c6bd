"""The site configuration, ``spot.yaml``, as frozen pydantic models.

Where the file is looked for, first match wins (:func:`config_path`):

1. the ``--config`` option of the CLI;
2. the ``SLURM_SPOT_CONFIG`` environment variable;
3. ``spot.yaml`` beside the ``slurm.conf`` named by ``SLURM_CONF`` (slurmctld sets ``SLURM_CONF``
   for ResumeProgram/SuspendProgram and slurmd for Prolog/Epilog, whose environment is otherwise
   wiped);
4. ``/etc/slurm/spot.yaml``.

Every validation error names the file, the field (as a dotted path such as
``node_sets.0.count``) and the reason; see :class:`~slurm_spot.errors.ConfigError`.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Annotated, Literal, get_args

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PrivateAttr,
    StrictInt,
    ValidationError,
    field_validator,
    model_validator,
)

from slurm_spot.errors import ConfigError

DEFAULT_CONFIG_PATH = Path("/etc/slurm/spot.yaml")
NAME_PATTERN = r"^[a-z][a-z0-9-]{0,40}$"
# slurm.conf(5) MaxTime: minutes, [days-]hours[:minutes[:seconds]], or INFINITE/UNLIMITED.
MAX_TIME_PATTERN = r"^(INFINITE|UNLIMITED|[0-9]+(-[0-9]{1,2})?(:[0-9]{1,2}){0,2})$"
SIGNAL_NAMES = {"USR1": 10, "USR2": 12, "TERM": 15, "INT": 2, "HUP": 1, "QUIT": 3, "URG": 23}


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class LocalProviderConfig(_Model):
    """The built-in ``local`` provider: instances are ``slurmd`` processes on this machine."""

    type: Literal["local"] = "local"
    slurmd: str = Field("/usr/sbin/slurmd", pattern=r"^/", description="absolute path of slurmd")
    port_base: int = Field(17000, ge=1024, le=65000, description="node i listens on port_base+i")
    boot_delay_s: float = Field(2.0, ge=1.0, description="seconds between request and slurmd start")
    slurmd_timeout_s: int = Field(300, ge=10, description="SlurmdTimeout of the local cluster")
    kill_wait_s: int = Field(30, ge=1, description="KillWait of the local cluster")
    notice_poll_s: float = Field(1.0, gt=0, description="how often a local watcher polls")


class AwsProviderConfig(_Model):
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


class GcpProviderConfig(_Model):
    """Compute Engine through google-cloud-compute."""

    type: Literal["gcp"] = "gcp"
    project: str
    region: str
    api_endpoint: str | None = None
    credentials_file: Path | None = None


#: The settings of one ``providers:`` entry, whichever its type.
ProviderSettings = LocalProviderConfig | AwsProviderConfig | GcpProviderConfig
ProviderConfig = Annotated[ProviderSettings, Field(discriminator="type")]


class GpuSpec(_Model):
    """GPUs per node: ``type`` as in ``Gres=gpu:<type>:<count>``."""

    type: str = Field(pattern=r"^[a-z0-9_]+$")
    count: int = Field(ge=1, le=64)


class AwsNodeSetOptions(_Model):
    """EC2 settings of one node set (see the EC2 Fleet API reference, CreateFleet)."""

    launch_template: str = Field(description="launch template name, or its id (lt-...)")
    launch_template_version: str = "$Default"
    subnets: list[str] = Field(min_length=1)
    allocation_strategy: Literal[
        "price-capacity-optimized", "capacity-optimized", "lowest-price", "diversified"
    ] = "price-capacity-optimized"
    max_price_usd_per_hour: float | None = Field(None, gt=0)
    subnet_zones: dict[str, str] = Field(
        default_factory=dict, description="subnet id -> availability zone, for config checks"
    )
    interruption_behavior: Literal["terminate", "stop", "hibernate"] = "terminate"
    rebalance_drain: bool = False


class GcpNodeSetOptions(_Model):
    """Compute Engine settings of one node set."""

    zones: list[str] = Field(min_length=1)
    machine_type: str | None = None
    image: str | None = None
    instance_template: str | None = None
    network: str = "global/networks/default"
    subnetwork: str | None = None
    termination_action: Literal["DELETE", "STOP"] = "DELETE"
    preemptible: bool = False
    local_ssds: int = Field(0, ge=0)
    disk_size_gb: int = Field(50, ge=10)


class NodeSetConfig(_Model):
    """A group of identical cloud nodes, named ``<name>-1`` .. ``<name>-<count>``.

    ``memory_mib`` is Slurm's RealMemory (MiB). ``fallback`` names the market tried when the
    primary market has no capacity (``on-demand`` for a spot node set), or ``none``.
    """

    name: str = Field(pattern=NAME_PATTERN)
    provider: str
    count: StrictInt = Field(ge=1, le=10000)
    market: Literal["spot", "on-demand"] = "spot"
    fallback: Literal["on-demand", "none"] = "none"
    instance_types: list[str] = Field(default_factory=list)
    cpus: int = Field(1, ge=1)
    memory_mib: int = Field(1000, ge=1)
    gpus: GpuSpec | None = None
    features: list[Annotated[str, Field(pattern=r"^[A-Za-z0-9_.+-]+$")]] = Field(default_factory=list)
    weight: int = Field(1, ge=0)
    aws: AwsNodeSetOptions | None = None
    gcp: GcpNodeSetOptions | None = None

    @property
    def node_names(self) -> list[str]:
        """All node names of the set, in order (``gpu-1``, ``gpu-2``, ...)."""
        return [f"{self.name}-{i}" for i in range(1, self.count + 1)]

    @property
    def hostlist(self) -> str:
        """The node names as one Slurm hostlist expression (``gpu-[1-8]``)."""
        return f"{self.name}-[1-{self.count}]" if self.count > 1 else f"{self.name}-1"


class PartitionConfig(_Model):
    """A Slurm partition made of node sets. Timer overrides are in seconds."""

    name: str = Field(pattern=r"^[A-Za-z][A-Za-z0-9_-]{0,40}$")
    node_sets: list[str] = Field(min_length=1)
    default: bool = False
    suspend_time_s: int | None = Field(None, ge=0)
    resume_timeout_s: int | None = Field(None, ge=30)
    max_time: str = Field("INFINITE", pattern=MAX_TIME_PATTERN)


class PreemptionConfig(_Model):
    """How jobs learn of an interruption.

    ``signal`` goes to every step on a node that received a notice, and ``lead_s`` seconds
    before the time limit through sbatch ``--signal=<signal>@<lead_s>``. SIGUSR2 is the default
    because collective libraries (NCCL, some MPIs) catch SIGUSR1.
    """

    signal: str = "USR2"
    lead_s: int = Field(90, ge=1, le=65535)
    requeue_exit_code: int = Field(85, ge=1, le=254)

    @field_validator("signal")
    @classmethod
    def _known_signal(cls, value: str) -> str:
        name = value.upper().removeprefix("SIG")
        if name not in SIGNAL_NAMES:
            raise ValueError(f"unknown signal {value!r}; use one of {sorted(SIGNAL_NAMES)}")
        return name


class CheckpointConfig(_Model):
    """Where job checkpoints live: ``<root>/<user>/<job key>``; ``keep`` newest are kept."""

    root: Path = Path("/var/spool/slurm-spot/checkpoints")
    keep: int = Field(2, ge=1)


class PowerConfig(_Model):
    """Slurm power-saving timers (seconds), written into ``slurm-spot.conf``."""

    suspend_time_s: int = Field(300, ge=0)
    suspend_timeout_s: int = Field(60, ge=1)
    resume_timeout_s: int = Field(600, ge=30)


class ReconcileConfig(_Model):
    """The controller loop (``slurm-spot reconcile``). Durations in seconds."""

    interval_s: float = Field(30, gt=0)
    orphan_grace_s: float = Field(90, ge=0)
    cooldown_s: float = Field(600, ge=0)
    max_resume_failures: int = Field(3, ge=1)
    failure_window_s: float = Field(3600, gt=0)
    metrics_file: Path | None = None


def _default_providers() -> dict[str, ProviderSettings]:
    return {"local": LocalProviderConfig()}


class SpotConfig(_Model):
    """The whole ``spot.yaml``."""

    cluster: str = Field(pattern=NAME_PATTERN)
    providers: dict[str, ProviderConfig] = Field(default_factory=_default_providers)
    node_sets: list[NodeSetConfig] = Field(min_length=1)
    partitions: list[PartitionConfig] = Field(min_length=1)
    preemption: PreemptionConfig = PreemptionConfig()
    checkpoint: CheckpointConfig = CheckpointConfig()
    power: PowerConfig = PowerConfig()
    reconcile: ReconcileConfig = ReconcileConfig()
    state_dir: Path = Path("/var/lib/slurm-spot")
    log_dir: Path = Path("/var/log/slurm-spot")
    slurm_bin_dir: Path = Path("/usr/bin")
    _source_path: Path = PrivateAttr(default=DEFAULT_CONFIG_PATH)

    @property
    def source_path(self) -> Path:
        """The file this configuration was read from (absolute), for child processes."""
        return self._source_path

    @model_validator(mode="after")
    def _cross_references(self) -> SpotConfig:
        problems: list[str] = []
        for name, value in (("state_dir", self.state_dir), ("log_dir", self.log_dir),
                            ("slurm_bin_dir", self.slurm_bin_dir),
                            ("checkpoint.root", self.checkpoint.root)):
            if not value.is_absolute():
                problems.append(f"{name}: must be an absolute path, got {str(value)!r}")
        seen_sets: dict[str, int] = {}
        owner: dict[str, str] = {}
        for i, ns in enumerate(self.node_sets):
            where = f"node_sets.{i}"
            if ns.name in seen_sets:
                problems.append(f"{where}.name: node set {ns.name!r} is defined twice")
            seen_sets[ns.name] = i
            provider = self.providers.get(ns.provider)
            if provider is None:
                problems.append(
                    f"{where}.provider: provider {ns.provider!r} is not defined under 'providers'"
                )
            else:
                problems.extend(_provider_section_problems(where, ns, provider.type))
            if ns.market == "on-demand" and ns.fallback == "on-demand":
                problems.append(f"{where}.fallback: an on-demand node set cannot fall back to on-demand")
            for node in ns.node_names:
                if node in owner:
                    problems.append(
                        f"{where}: node name {node!r} is also produced by node set {owner[node]!r}"
                    )
                    break
                owner[node] = ns.name
        defaults = [p.name for p in self.partitions if p.default]
        if len(defaults) > 1:
            problems.append(f"partitions: more than one default partition: {', '.join(defaults)}")
        names: set[str] = set()
        for i, part in enumerate(self.partitions):
            if part.name in names:
                problems.append(f"partitions.{i}.name: partition {part.name!r} is defined twice")
            names.add(part.name)
            for j, ref in enumerate(part.node_sets):
                if ref not in seen_sets:
                    problems.append(
                        f"partitions.{i}.node_sets.{j}: node set {ref!r} is referenced but not defined"
                    )
        if problems:
            raise ValueError("; ".join(problems))
        return self

    def node_set(self, name: str) -> NodeSetConfig:
        """The node set called ``name``. Raises ``KeyError`` if there is none."""
        for ns in self.node_sets:
            if ns.name == name:
                return ns
        raise KeyError(name)

    def node_set_of(self, node: str) -> NodeSetConfig | None:
        """The node set that produces node name ``node`` (``gpu-3`` -> ``gpu``), or None."""
        match = re.fullmatch(r"(.+)-(\d+)", node)
        if not match:
            return None
        for ns in self.node_sets:
            if ns.name == match.group(1) and 1 <= int(match.group(2)) <= ns.count:
                if str(int(match.group(2))) == match.group(2):
                    return ns
        return None

    def all_nodes(self) -> list[str]:
        """Every cloud node name of every node set."""
        return [n for ns in self.node_sets for n in ns.node_names]


def _provider_section_problems(where: str, ns: NodeSetConfig, provider_type: str) -> list[str]:
    problems = []
    if provider_type == "aws" and ns.aws is None:
        problems.append(f"{where}.aws: required for a node set of an 'aws' provider")
    if provider_type == "gcp" and ns.gcp is None:
        problems.append(f"{where}.gcp: required for a node set of a 'gcp' provider")
    if provider_type != "aws" and ns.aws is not None:
        problems.append(f"{where}.aws: only allowed for a node set of an 'aws' provider")
    if provider_type != "gcp" and ns.gcp is not None:
        problems.append(f"{where}.gcp: only allowed for a node set of a 'gcp' provider")
    return problems


def config_path(explicit: str | os.PathLike[str] | None = None) -> Path:
    """Where the configuration is read from (see the module docstring for the order)."""
    if explicit:
        return Path(explicit)
    env = os.environ.get("SLURM_SPOT_CONFIG")
    if env:
        return Path(env)
    slurm_conf = os.environ.get("SLURM_CONF")
    if slurm_conf:
        beside = Path(slurm_conf).parent / "spot.yaml"
        if beside.exists():
            return beside
    return DEFAULT_CONFIG_PATH


def parse_config(data: object, path: str = "<config>") -> SpotConfig:
    """Validate already-parsed YAML data.

    Raises:
        ConfigError: naming ``path``, each bad field and the reason.
    """
    if not isinstance(data, dict):
        raise ConfigError(path, ["(top level): expected a mapping of settings"])
    try:
        return SpotConfig.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(path, _describe(exc)) from None


def load_config(path: str | os.PathLike[str] | None = None) -> SpotConfig:
    """Read and validate ``spot.yaml``.

    Args:
        path: explicit file; ``None`` applies :func:`config_path`.

    Raises:
        ConfigError: the file is missing, is not YAML (the message gives the line), or fails
            validation (the message gives every bad field).
    """
    file = config_path(path)
    try:
        text = file.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(str(file), [f"cannot read the file: {exc.strerror}"]) from None
    except UnicodeDecodeError as exc:
        raise ConfigError(str(file), [f"byte {exc.start}: not UTF-8 text"]) from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"line {mark.line + 1}, column {mark.column + 1}" if mark else "somewhere"
        problem = getattr(exc, "problem", None) or str(exc)
        raise ConfigError(str(file), [f"{where}: not valid YAML: {problem}"]) from None
    config = parse_config(data, str(file))
    config._source_path = file.absolute()
    return config


def _describe(exc: ValidationError) -> list[str]:
    problems = []
    for err in exc.errors():
        loc = ".".join(str(part) for part in err["loc"]) or "(top level)"
        msg = err["msg"].removeprefix("Value error, ")
        if err["type"] == "extra_forbidden":
            msg = "unknown key"
        if err["type"] in ("union_tag_invalid", "union_tag_not_found"):  # providers.<name>.type
            loc += ".type"
            known = ", ".join(repr(c.model_fields["type"].default) for c in get_args(ProviderSettings))
            given = err["input"].get("type") if isinstance(err["input"], dict) else None
            msg = (f"unknown provider type {given!r}" if given is not None else "missing") + \
                f"; known types: {known}"
        if err["type"] == "value_error" and not err["loc"]:
            problems.extend(msg.split("; "))
            continue
        problems.append(f"{loc}: {msg}")
    return problems


def default_local_config(
    state_dir: Path = Path("/var/lib/slurm-spot"),
    log_dir: Path = Path("/var/log/slurm-spot"),
) -> SpotConfig:
    """The configuration ``slurm-spot local up`` uses when none is given.

    A partition ``spot`` of 4 one-CPU nodes ``spot-[1-4]`` on the local provider.
    """
    return SpotConfig.model_validate(
        {
            "cluster": "local",
            "providers": {"local": {"type": "local"}},
            "node_sets": [{"name": "spot", "provider": "local", "count": 4, "cpus": 1}],
            "partitions": [{"name": "spot", "node_sets": ["spot"], "default": True}],
            "state_dir": str(state_dir),
            "log_dir": str(log_dir),
            "checkpoint": {"root": str(state_dir / "checkpoints")},
        }
    )
