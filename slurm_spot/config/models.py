"""The site configuration, ``spot.yaml``, as frozen pydantic models: every field, its default
and bounds, and the checks that need only the values (cross references, ports, names).
The providers and node sets (what a provider type adds) are
:mod:`slurm_spot.config.provider_models`. Reading the file and reporting problems with their
lines is :mod:`slurm_spot.config.loader`.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Annotated, Literal

from pydantic import Field, PrivateAttr, field_validator, model_validator

from slurm_spot.config.base import ConfigModel
from slurm_spot.config.plain import (
    DEFAULT_CONFIG_PATH,
    DEFAULT_STATE_DIR,
    MAX_TIME_PATTERN,
    NAME_PATTERN,
    S3_ROOT_PATTERN,
    SIGNAL_NAMES,
    find_node_set,
    node_set_for,
)
from slurm_spot.config.provider_models import (
    LocalProviderConfig,
    NodeSetConfig,
    ProviderConfig,
    ProviderSettings,
    provider_section_problems,
)
from slurm_spot.config.yamlfile import Path_, with_line


class PartitionConfig(ConfigModel):
    """A Slurm partition made of node sets. Timer overrides are in seconds."""

    name: str = Field(pattern=r"^[A-Za-z][A-Za-z0-9_-]{0,40}$")
    node_sets: list[str] = Field(min_length=1)
    default: bool = False
    suspend_time_s: int | None = Field(None, ge=0, le=365 * 86400)
    resume_timeout_s: int | None = Field(None, ge=30, le=86400)
    max_time: str = "INFINITE"

    @field_validator("max_time")
    @classmethod
    def _max_time_in_range(cls, value: str) -> str:
        """A limit Slurm can hold and a person meant: see :func:`max_time_minutes`."""
        if not re.fullmatch(MAX_TIME_PATTERN, value):
            raise ValueError(f"{value!r} is not a Slurm time: use minutes (90), "
                             f"days-hours[:minutes[:seconds]] (1-12), "
                             f"hours:minutes:seconds (2:00:00) or INFINITE")
        max_time_minutes(value)
        return value


MAX_TIME_LIMIT_MINUTES = 366 * 24 * 60  # a year; longer is INFINITE


def max_time_minutes(value: str) -> int | None:
    """Minutes of a slurm.conf(5) ``MaxTime`` (None for INFINITE/UNLIMITED).

    Formats (slurm.conf(5) MaxTime, as sbatch(1) ``--time``): ``minutes``,
    ``minutes:seconds``, ``hours:minutes:seconds``, ``days-hours``, ``days-hours:minutes``,
    ``days-hours:minutes:seconds``; seconds are rounded up to a minute as Slurm does.

    Raises:
        ValueError: not one of those formats, a field out of its range (hours < 24 after a
            day count, minutes and seconds < 60), zero, or over :data:`MAX_TIME_LIMIT_MINUTES`
            (Slurm keeps minutes in 32 bits; "99999999999999999999" is a typo, not a limit).
    """
    if value in ("INFINITE", "UNLIMITED"):
        return None
    match = re.fullmatch(r"(?:(\d+)-)?(\d+)(?::(\d+))?(?::(\d+))?", value)
    if not match:
        raise ValueError(f"{value!r} is not a Slurm time (minutes, days-hours[:min[:sec]], "
                         f"hours:min:sec or INFINITE)")
    days, first, second, third = match.groups()
    if days is not None:  # days-hours[:minutes[:seconds]]
        d, h, m, sec = int(days), int(first), int(second or 0), int(third or 0)
        if h > 23:
            raise ValueError(f"{value!r}: hours must be 0-23 after a day count")
    elif third is not None:  # hours:minutes:seconds
        d, h, m, sec = 0, int(first), int(second), int(third)
    else:  # minutes[:seconds]
        d, h, m, sec = 0, 0, int(first), int(second or 0)
        if len(first) > 9:
            raise ValueError(f"{value!r}: over a year; use INFINITE for no limit")
    if (second is not None and (days is not None or third is not None) and m > 59) or sec > 59:
        raise ValueError(f"{value!r}: minutes and seconds must be 0-59")
    minutes = ((d * 24 + h) * 60 + m) + (1 if sec else 0)
    if minutes < 1:
        raise ValueError(f"{value!r}: a time limit of 0 lets no job run; use at least 1 minute")
    if minutes > MAX_TIME_LIMIT_MINUTES:
        raise ValueError(f"{value!r} is {minutes} minutes, over a year "
                         f"({MAX_TIME_LIMIT_MINUTES}); use INFINITE for no limit")
    return minutes


class PreemptionConfig(ConfigModel):
    """How jobs learn of an interruption.

    ``signal`` goes to every step on a node that received a notice, and ``lead_s`` seconds
    before the time limit through sbatch ``--signal=<signal>@<lead_s>``. SIGUSR2 is the default
    because collective libraries (NCCL, some MPIs) catch SIGUSR1.

    On a notice, with ``prewarm`` (the default) the watcher first has a replacement node
    powered up for each job on the node (same node set, else a compatible one), lets the jobs
    train on while it boots, and signals each job when the replacement is up, or at the latest
    at ``deadline - margin - (the job's checkpoint time + step time) - signal_margin_s``,
    whichever comes first (:mod:`slurm_spot.lifecycle.prewarm`). The checkpoint and step times come from
    the job's own saves (``save_s`` in each checkpoint's manifest); a job without saves is
    assumed to need ``default_checkpoint_s``. Without ``prewarm`` the jobs are signalled at once
    and their replacement boots after the requeue.
    """

    signal: str = "USR2"
    lead_s: int = Field(90, ge=1, le=65535)
    requeue_exit_code: int = Field(85, ge=1, le=254)
    prewarm: bool = Field(True, description="power a replacement up at once on a notice and "
                          "signal the jobs when it is up (see the class docstring)")
    default_checkpoint_s: float = Field(
        30.0, ge=0, le=3600,
        description="seconds a job without a recorded save is assumed to need to checkpoint")
    signal_margin_s: float = Field(
        10.0, ge=0, le=600,
        description="seconds kept free between a job's expected end of checkpointing and "
                    "the node's power-down (the watcher's margin before the deadline)")

    @field_validator("signal")
    @classmethod
    def _known_signal(cls, value: str) -> str:
        name = value.upper().removeprefix("SIG")
        if name not in SIGNAL_NAMES:
            raise ValueError(f"unknown signal {value!r}; use one of {sorted(SIGNAL_NAMES)}")
        return name


def check_listen_address(value: str) -> str:
    """An IPv4/IPv6 address to listen on (``127.0.0.1``, ``0.0.0.0``, ``::``), normalised.

    Raises:
        ValueError: not an IP address (a host name is refused: which of its addresses would
            be meant is ambiguous).
    """
    import ipaddress

    try:
        return str(ipaddress.ip_address(value.strip().strip("[]")))
    except ValueError:
        raise ValueError(f"{value!r} is not an IPv4 or IPv6 address (e.g. 127.0.0.1, "
                         "0.0.0.0 for every interface, ::)") from None




class S3Settings(ConfigModel):
    """How to reach an S3-compatible store for an ``s3://`` checkpoint root. Credentials are
    not configured here: the job's boto3 finds them in its standard chain (environment, shared
    credentials file, instance or workload metadata)."""

    endpoint_url: str | None = Field(None, pattern=r"^https?://\S+$")
    addressing_style: Literal["auto", "path", "virtual"] = "auto"


class CheckpointConfig(ConfigModel):
    """Where job checkpoints live: ``<root>/<user>/<job key>``; ``keep`` newest are kept.

    ``root`` is an absolute directory (local or shared POSIX file system), or an
    ``s3://bucket/prefix`` URL (bucket name rules of the S3 API reference), reached as ``s3``
    says; a job may choose its own root (``SLURM_SPOT_CHECKPOINT_ROOT`` in its environment, set
    by ``slurm-spot sbatch --checkpoint-root``).
    """

    root: Annotated[str, Field(pattern=S3_ROOT_PATTERN)] | Path = Path(
        "/var/spool/slurm-spot/checkpoints")
    keep: int = Field(2, ge=1, le=10000)
    s3: S3Settings = S3Settings()

    @property
    def is_s3(self) -> bool:
        """True when ``root`` is an ``s3://`` URL."""
        from slurm_spot.contract.location import is_s3

        return is_s3(self.root)


class PowerConfig(ConfigModel):
    """Slurm power-saving timers (seconds), written into ``slurm-spot.conf``."""

    suspend_time_s: int = Field(300, ge=0, le=365 * 86400)
    suspend_timeout_s: int = Field(60, ge=1, le=86400)
    resume_timeout_s: int = Field(600, ge=30, le=86400)
    all_or_nothing: bool = Field(
        True, description="when a multi-node job's resume could not launch all its nodes, "
        "give back at once the nodes of that job that were launched (SLURM_RESUME_FILE says "
        "which nodes are whose), instead of letting them idle until SuspendTime")
    failover: bool = Field(
        True, description="when a node set has no capacity (or quota), cool the whole node "
        "set down and clear Slurm's requeue hold of the jobs it failed, so they start on "
        "another node set of their partition within seconds (slurm_spot/lifecycle/failover.py); false: "
        "the failed node alone goes DOWN and its job waits out Slurm's ~121 s requeue hold")
    prolog_slurmctld: bool = Field(
        True, description="render PrologSlurmctld=slurm-spot-prolog-slurmctld, which holds a "
        "job on powered-up nodes until they registered so slurmctld launches it at once, not "
        "on its next 30 s periodic check (slurm_spot/lifecycle/bootwait.py, docs/admin.md); false on a "
        "Slurm before 24.05 whose slurm.conf has a PrologSlurmctld of its own (one only there)")
    order: Literal["cost", "weight"] = Field(
        "cost", description="how the node sets of a partition are ordered (Slurm's node "
        "Weight): cost: cheapest expected cost first within each spot.yaml weight, on-demand "
        "last, kept in step with live prices and cooldowns by the reconciler "
        "(slurm_spot/cost/order.py, docs/admin.md); weight: spot.yaml's weight as written, "
        "never changed by slurm-spot")


class ReconcileConfig(ConfigModel):
    """The controller loop (``slurm-spot reconcile``). Durations in seconds."""

    interval_s: float = Field(30, ge=0.01, le=3600)  # below 10 ms: a typo, not a setting
    orphan_grace_s: float = Field(90, ge=0, le=7 * 86400)
    cooldown_s: float = Field(600, ge=0, le=7 * 86400)
    quota_backoff_s: float = Field(
        1800, ge=0, le=7 * 86400,
        description="after a quota error (regional: another zone will not help) the node set "
        "is disabled this long; separate from capacity cooldowns")
    max_resume_failures: int = Field(3, ge=1, le=1000)
    failure_window_s: float = Field(3600, ge=1, le=30 * 86400)
    max_fast_requeues: int = Field(
        3, ge=1, le=1000,
        description="a job that requeued itself with the requeue exit code has Slurm's "
        "~121 s requeue hold cleared at most this many times within fast_requeue_window_s; "
        "later requeues (a crash loop: every run exits at once) wait out the hold (event "
        "expedite_withheld)")
    fast_requeue_window_s: float = Field(600, ge=1, le=7 * 86400)
    missing_grace_s: float = Field(
        60, ge=0, le=3600,
        description="an up node with no instance at all in successful listings is declared "
        "reclaimed only after this many seconds (listings are eventually consistent)")
    events_poll_s: float = Field(
        5, ge=1, le=20,
        description="while waiting for its next pass the reconciler reads the providers' "
        "events (providers.<name>.events_queue_url, preemption_events) in steps of this many "
        "seconds: the longest a lost instance waits to be handled, and how long a stop may wait "
        "for an SQS long poll to end")
    metrics_file: Path | None = Field(
        None, description="write the Prometheus metrics here after every pass, atomically "
        "(node-exporter's textfile collector: <dir>/slurm_spot.prom)")
    metrics_port: int | None = Field(
        None, ge=1, le=65535, description="serve the Prometheus metrics over HTTP on this port "
        "(`reconcile --metrics-port` overrides it); unset: no HTTP endpoint")
    metrics_addr: str = Field(
        "127.0.0.1", description="address the metrics endpoint listens on (`reconcile "
        "--metrics-addr` overrides it): 127.0.0.1 keeps it on the controller (a local "
        "Prometheus or node-exporter); the controller's own address, or 0.0.0.0 / :: for "
        "every interface, lets a Prometheus elsewhere scrape it")

    @field_validator("metrics_addr")
    @classmethod
    def _ip_address(cls, value: str) -> str:
        return check_listen_address(value)

    @field_validator("max_fast_requeues", "fast_requeue_window_s", mode="before")
    @classmethod
    def _not_a_boolean(cls, value: object) -> object:
        """YAML reads ``yes``/``true``/``on`` as a boolean, which pydantic takes as 1: the
        crash-loop cap would silently become one expedited requeue, or a 1 s window."""
        if isinstance(value, bool):
            raise ValueError("a number, not true/false (YAML reads yes/no/on/off as booleans)")
        return value


#: The highest instance-hour price spot.yaml's ``cost`` takes (USD).
MAX_USD_PER_HOUR = 10_000.0
#: The highest storage (per GB-month) or egress (per GB) price it takes (USD).
MAX_USD_PER_GB = 1_000.0


class CostConfig(ConfigModel):
    """Prices for ``slurm-spot plan``, ``cost`` and ``simulate`` (USD).

    Instance-type keys are the provider's type names (``g5.xlarge``, ``a2-highgpu-1g``); an
    entry here wins over the shipped catalogue (``slurm_spot/providers/<type>/prices.yaml``)
    and, for spot, over the AWS spot price history. Storage and egress prices are keyed by
    provider name (a key of ``providers``), since they differ by provider and region. A price
    that is needed and found nowhere is an error naming the type and zone, never zero.
    """

    # Upper bounds: a price past them is a typo (1e308 made `plan` print spares costing a
    # 300-digit $ figure "= unbounded (never finishes)/h", and null in --json); 10000 USD/h
    # is also the bound of `plan --spot-usd-h` and of aws max_price_usd_per_hour.
    on_demand_usd_per_hour: dict[str, Annotated[float, Field(ge=0, le=MAX_USD_PER_HOUR)]] = Field(
        default_factory=dict, description="instance type -> on-demand USD per instance-hour")
    spot_usd_per_hour: dict[str, Annotated[float, Field(ge=0, le=MAX_USD_PER_HOUR)]] = Field(
        default_factory=dict, description="instance type -> spot USD per instance-hour")
    storage_usd_per_gb_month: dict[str, Annotated[float, Field(ge=0, le=MAX_USD_PER_GB)]] = Field(
        default_factory=dict,
        description="provider name -> checkpoint storage USD per GB-month (e.g. S3 Standard)")
    egress_usd_per_gb: dict[str, Annotated[float, Field(ge=0, le=MAX_USD_PER_GB)]] = Field(
        default_factory=dict,
        description="provider name -> USD per GB a restore moves (inter-zone or internet egress)")
    spot_price_max_age_s: float = Field(
        3600, gt=0, description="cached AWS spot prices older than this are fetched again")


def _default_providers() -> dict[str, ProviderSettings]:
    return {"local": LocalProviderConfig()}


class SpotConfig(ConfigModel):
    """The whole ``spot.yaml``."""

    cluster: str = Field(pattern=NAME_PATTERN)
    providers: dict[str, ProviderConfig] = Field(default_factory=_default_providers)
    node_sets: list[NodeSetConfig] = Field(min_length=1)
    partitions: list[PartitionConfig] = Field(min_length=1)
    preemption: PreemptionConfig = PreemptionConfig()
    checkpoint: CheckpointConfig = CheckpointConfig()
    power: PowerConfig = PowerConfig()
    reconcile: ReconcileConfig = ReconcileConfig()
    cost: CostConfig = CostConfig()
    state_dir: Path = DEFAULT_STATE_DIR
    log_dir: Path = Path("/var/log/slurm-spot")
    slurm_bin_dir: Path = Path("/usr/bin")
    _source_path: Path = PrivateAttr(default=DEFAULT_CONFIG_PATH)
    _lines: dict[Path_, int] = PrivateAttr(default_factory=dict)

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
            if isinstance(value, Path) and not value.is_absolute():
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
                problems.extend(provider_section_problems(where, ns, provider.type))
            if ns.market == "on-demand" and ns.fallback == "on-demand":
                problems.append(f"{where}.fallback: an on-demand node set cannot fall back to on-demand")
            for node in ns.node_names:
                if node in owner:
                    problems.append(
                        f"{where}: node name {node!r} is also produced by node set {owner[node]!r}"
                    )
                    break
                owner[node] = ns.name
        problems.extend(self._port_problems())
        defaults = [p.name for p in self.partitions if p.default]
        if len(defaults) > 1:
            problems.append(f"partitions: more than one default partition: {', '.join(defaults)}")
        in_partitions = {ref for part in self.partitions for ref in part.node_sets}
        for i, ns in enumerate(self.node_sets):
            if ns.spares > 0 and ns.name not in in_partitions:
                problems.append(
                    f"node_sets.{i}.spares: node set {ns.name!r} is in no partition: its "
                    f"{ns.spares} spare(s) would be kept up, and paid for, for jobs that can "
                    "never run there; add it to a partition or drop spares")
        names: set[str] = set()
        for i, part in enumerate(self.partitions):
            if part.name in names:
                problems.append(f"partitions.{i}.name: partition {part.name!r} is defined twice")
            names.add(part.name)
            for j, ref in enumerate(part.node_sets):
                if ref in part.node_sets[:j]:  # its nodes twice in Nodes=, twice in the order
                    problems.append(f"partitions.{i}.node_sets.{j}: node set {ref!r} is "
                                    "listed twice")
                if ref not in seen_sets:
                    problems.append(
                        f"partitions.{i}.node_sets.{j}: node set {ref!r} is referenced but not defined"
                    )
        if problems:
            raise ValueError("; ".join(problems))
        return self

    def _port_problems(self) -> list[str]:
        """Local nodes listen on port_base + offset + index (render.node_lines): the last one
        must still be a TCP port."""
        problems = []
        for name, provider in self.providers.items():
            if not isinstance(provider, LocalProviderConfig):
                continue
            total = sum(ns.count for ns in self.node_sets if ns.provider == name)
            if provider.port_base + total > 65535:
                problems.append(
                    f"providers.{name}.port_base: {provider.port_base} + {total} local nodes "
                    f"gives port {provider.port_base + total}, above 65535; lower port_base "
                    "or the node counts")
        return problems

    def with_lines(self, problems: list[str]) -> list[str]:
        """``node_sets.0.aws.subnets: ...`` -> ``line 12: node_sets.0.aws.subnets: ...`` for
        problems found after loading (provider checks), from where the file had each key."""
        return [with_line(p, self._lines) for p in problems]

    def node_set(self, name: str) -> NodeSetConfig:
        """The node set called ``name``. Raises ``KeyError`` if there is none."""
        return find_node_set(self.node_sets, name)

    def node_set_of(self, node: str) -> NodeSetConfig | None:
        """The node set that produces node name ``node`` (``gpu-3`` -> ``gpu``), or None."""
        return node_set_for(self.node_sets, node)

    def all_nodes(self) -> list[str]:
        """Every cloud node name of every node set."""
        return [n for ns in self.node_sets for n in ns.node_names]


# Prices of the local provider's "instances" (instance type and provider name ``local``), so
# that ``slurm-spot cost`` and ``plan``/``simulate`` work on the local cluster. Illustrative,
# not a bill: a local node is priced like the catalogue's g5.xlarge on-demand (1.006 USD/h,
# slurm_spot/providers/aws/prices.yaml) with spot at about 40 % of it; storage and egress at cloud-like
# rates. examples/spot-local.yaml carries the same.
LOCAL_COST: dict[str, dict[str, float]] = {
    "spot_usd_per_hour": {"local": 0.40},
    "on_demand_usd_per_hour": {"local": 1.006},
    "storage_usd_per_gb_month": {"local": 0.023},
    "egress_usd_per_gb": {"local": 0.01},
}


def default_local_config(
    state_dir: Path = Path("/var/lib/slurm-spot"),
    log_dir: Path = Path("/var/log/slurm-spot"),
) -> SpotConfig:
    """The configuration ``slurm-spot local up`` uses when none is given.

    A partition ``spot`` of 4 one-CPU nodes ``spot-[1-4]`` on the local provider, priced
    with :data:`LOCAL_COST`.
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
            "cost": LOCAL_COST,
        }
    )
