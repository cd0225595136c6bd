"""What a recorded job used and cost: node-hours by market and instance type, interruptions,
compute lost to them, checkpoint storage and egress.

Where the job's runs come from:

- ``sacct`` when slurmdbd runs (``sacct -D`` lists every run of a requeued job: start, end,
  node list; sacct(1), Slurm 22.05);
- otherwise slurm-spot's own events: a node's part of the job runs from its instance's
  ``launched`` event (the node was powered up for the job; boot time is paid too) to the job's
  ``job_end`` (epilog) or interruption event on that node.

Which instance served a node (market, type, zone, provider) always comes from the ``launched``
events. Interruptions are the watcher's ``notice`` and the reconciler's ``reclaimed`` events of
the job (one per node within ``EPISODE_S``). Compute lost to an interruption is the wall time
since the last checkpoint before it (none when a checkpoint was written within ``EPISODE_S``
after the notice: the notice-time checkpoint); restart time runs from the interruption to the
next run's start.
"""

from __future__ import annotations

import math
import os
import statistics
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any

from slurm_spot.config import SpotConfig
from slurm_spot.cost.prices import PriceBook
from slurm_spot.errors import BadInputError
from slurm_spot.events import Action
from slurm_spot.hostlist import expand

EPISODE_S = 900.0
INTERRUPTION_ACTIONS = (Action.NOTICE, Action.RECLAIMED)
JOB_ACTIONS = (Action.JOB_END, Action.NOTICE, Action.REQUEUED, Action.RECLAIMED)


def _extra(ev: Mapping[str, Any]) -> dict[str, Any]:
    extra = ev.get("extra")
    return extra if isinstance(extra, dict) else {}


def _jobs(ev: Mapping[str, Any]) -> list[int]:
    jobs = ev.get("job_ids")
    return [j for j in jobs if isinstance(j, int)] if isinstance(jobs, list) else []


def _time(value: object) -> datetime | None:
    try:
        when = datetime.fromisoformat(str(value))
    except ValueError:
        return None
    return when if when.tzinfo else when.replace(tzinfo=timezone.utc)


@dataclass(frozen=True)
class Segment:
    """One node's share of one run of the job: wall interval and the instance behind it."""

    node: str
    start: datetime
    end: datetime
    provider: str
    market: str
    instance_type: str
    zone: str | None

    @property
    def hours(self) -> float:
        return max(0.0, (self.end - self.start).total_seconds() / 3600)


@dataclass(frozen=True)
class Interruption:
    """An interruption of the job on ``node`` at ``time`` (``kind``: notice or reclaimed)."""

    time: datetime
    node: str
    kind: str


@dataclass(frozen=True)
class CheckpointRecord:
    """A committed checkpoint of the job: when, at which step, how many bytes."""

    time: datetime
    step: int
    size_bytes: int


@dataclass
class JobUsage:
    """Everything known about one job's runs. ``runs`` are ``(start, end)`` of each run."""

    job_id: int
    source: str
    segments: list[Segment] = field(default_factory=list)
    interruptions: list[Interruption] = field(default_factory=list)
    runs: list[tuple[datetime, datetime]] = field(default_factory=list)
    checkpoints: list[CheckpointRecord] = field(default_factory=list)
    user: str | None = None
    notes: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class _Launch:
    time: datetime
    provider: str
    market: str
    instance_type: str
    zone: str | None


def _launches(events: Iterable[Mapping[str, Any]], config: SpotConfig) -> dict[str, list[_Launch]]:
    by_node: dict[str, list[_Launch]] = defaultdict(list)
    for ev in events:
        when = _time(ev.get("time"))
        node = ev.get("node")
        extra = _extra(ev)
        if ev.get("action") != Action.LAUNCHED or when is None or not isinstance(node, str):
            continue
        ns = config.node_set_of(node)
        provider = ns.provider if ns else str(extra.get("provider", "unknown"))
        by_node[node].append(_Launch(when, provider, str(extra.get("market") or "spot"),
                                     str(extra.get("type") or "unknown"),
                                     str(extra["zone"]) if extra.get("zone") else None))
    for launches in by_node.values():
        launches.sort(key=lambda launch: launch.time)
    return by_node


def _launch_before(launches: list[_Launch], when: datetime) -> _Launch | None:
    found = [launch for launch in launches if launch.time <= when]
    return found[-1] if found else None


def job_ids_in_events(events: Iterable[Mapping[str, Any]]) -> list[int]:
    """Every job id the events mention (job ends and interruptions), ascending."""
    ids: set[int] = set()
    for ev in events:
        if ev.get("action") in JOB_ACTIONS:
            ids.update(_jobs(ev))
    return sorted(ids)


def interruptions_of(job_id: int, events: Iterable[Mapping[str, Any]]) -> list[Interruption]:
    """The job's interruptions, one per node and episode (a notice and the reclaim that
    follows it are one)."""
    found: list[Interruption] = []
    for ev in events:
        when = _time(ev.get("time"))
        jobs = _jobs(ev)
        if ev.get("action") not in INTERRUPTION_ACTIONS or when is None or job_id not in jobs:
            continue
        node = str(ev.get("node"))
        if any(i.node == node and abs((when - i.time).total_seconds()) < EPISODE_S for i in found):
            continue
        found.append(Interruption(when, node, str(ev.get("action"))))
    return sorted(found, key=lambda i: i.time)


def usage_from_events(job_id: int, events: Sequence[Mapping[str, Any]], config: SpotConfig) -> JobUsage:
    """The job's usage from slurm-spot's events alone (see the module docstring).

    Raises:
        BadInputError: the events never mention the job.
    """
    usage = JobUsage(job_id, "events", interruptions=interruptions_of(job_id, events))
    launches = _launches(events, config)
    ends: list[tuple[datetime, str]] = []
    for ev in events:
        when = _time(ev.get("time"))
        jobs = _jobs(ev)
        if ev.get("action") == Action.JOB_END and when is not None and job_id in jobs:
            ends.append((when, str(ev.get("node"))))
    ends += [(i.time, i.node) for i in usage.interruptions]
    if not ends:
        raise BadInputError(f"job {job_id}: no event of slurm-spot mentions it (and no sacct)")
    last_end: dict[str, datetime] = {}
    for end, node in sorted(ends):
        launch = _launch_before(launches.get(node, []), end)
        if launch is None:
            usage.notes.append(f"{node}: no launched event before {end.isoformat()}; not counted")
            continue
        start = max(launch.time, last_end.get(node, launch.time))
        if end > start:
            usage.segments.append(Segment(node, start, end, launch.provider, launch.market,
                                          launch.instance_type, launch.zone))
        last_end[node] = end
    usage.runs = _runs_from_segments(usage.segments, usage.interruptions)
    return usage


def _runs_from_segments(segments: list[Segment], interruptions: list[Interruption]
                        ) -> list[tuple[datetime, datetime]]:
    """Split the job's time into runs at its interruptions."""
    if not segments:
        return []
    cuts = sorted({i.time for i in interruptions})
    runs = []
    start = min(s.start for s in segments)
    for cut in cuts:
        later = [s.start for s in segments if s.start > cut]
        runs.append((start, cut))
        if not later:
            return runs
        start = min(later)
    runs.append((start, max(s.end for s in segments)))
    return runs


def usage_from_sacct(job_id: int, rows: list[dict[str, str]], events: Sequence[Mapping[str, Any]],
                     config: SpotConfig, now: datetime) -> JobUsage:
    """The job's usage from ``sacct -D`` rows (keys ``Start``, ``End``, ``NodeList``, ``User``;
    times in the local zone, ``Unknown`` end while running) plus the events' instances.

    Raises:
        BadInputError: no row has a start time (the job never ran).
    """
    usage = JobUsage(job_id, "sacct", interruptions=interruptions_of(job_id, events))
    launches = _launches(events, config)
    for row in rows:
        start = _local_time(row.get("Start", ""))
        if start is None:
            continue
        end = _local_time(row.get("End", "")) or now
        usage.user = row.get("User") or usage.user
        usage.runs.append((start, end))
        nodelist = row.get("NodeList", "")
        if not nodelist or nodelist in ("None assigned", "(null)"):
            continue
        for node in expand(nodelist):
            launch = _launch_before(launches.get(node, []), end)
            if launch is None:
                usage.notes.append(f"{node}: no launched event before {end.isoformat()}; "
                                   "its instance type is unknown, not counted")
                continue
            usage.segments.append(Segment(node, start, end, launch.provider, launch.market,
                                          launch.instance_type, launch.zone))
    if not usage.runs:
        raise BadInputError(f"job {job_id}: sacct shows no run that started")
    usage.runs.sort()
    return usage


def _local_time(text: str) -> datetime | None:
    if not text or text in ("Unknown", "None"):
        return None
    try:
        when = datetime.fromisoformat(text)
    except ValueError:
        return None
    return when.astimezone(timezone.utc) if when.tzinfo is None else when


def checkpoint_records(committed: Iterable[tuple[int, Mapping[str, Any]]]
                       ) -> list[CheckpointRecord]:
    """The :class:`CheckpointRecord` of each ``(step, manifest)`` a store lists
    (:meth:`~slurm_spot.checkpoint.store.CheckpointStore.committed`), oldest first: when it was
    committed (the manifest's ``created_unix_s``, seconds since the epoch) and its bytes (the
    sum of the ``size`` of each entry of ``files``; a size that is not a non-negative integer
    counts 0). A manifest without a numeric ``created_unix_s`` or an integer ``step`` is left
    out. Reads nothing."""
    found = []
    for _, manifest in committed:
        files = manifest.get("files")
        sizes = [f.get("size") for f in files.values() if isinstance(f, dict)] \
            if isinstance(files, dict) else []
        size = sum(v for v in sizes if isinstance(v, int) and not isinstance(v, bool) and v >= 0)
        created, step = manifest.get("created_unix_s"), manifest.get("step")
        if isinstance(created, int | float) and isinstance(step, int):
            found.append(CheckpointRecord(datetime.fromtimestamp(created, timezone.utc), step, size))
    return sorted(found, key=lambda c: c.time)


def read_checkpoints(location: str | os.PathLike[str], settings: Any = None
                     ) -> list[CheckpointRecord]:
    """Committed checkpoints at ``location`` (a job's checkpoint directory, or a store's URL
    such as ``s3://bucket/prefix/<user>/<key>``), oldest first (:func:`checkpoint_records`),
    listed by the store the location names
    (:func:`~slurm_spot.checkpoint.store.open_configured_store` with ``settings``, spot.yaml's
    ``checkpoint`` section, for the store's options; ``committed()``): the checkpoint
    package's one reading of the layout. A location that does not exist gives ``[]``.

    Raises:
        CheckpointError: no store handles the location's URL scheme, or the store cannot be
            read (the message starts with the location and says why).
    """
    from slurm_spot.checkpoint.store import StoreNotFound, open_configured_store

    try:
        committed = open_configured_store(location, settings).committed()
    except StoreNotFound:
        return []
    return checkpoint_records(committed)


@dataclass(frozen=True)
class CostLine:
    """Node-hours and cost of one (provider, market, instance type, zone)."""

    provider: str
    market: str
    instance_type: str
    zone: str | None
    node_hours: float
    usd_per_h: float
    price_source: str
    cost_usd: float
    on_demand_usd_per_h: float
    on_demand_cost_usd: float


@dataclass(frozen=True)
class CostReport:
    """``slurm-spot cost`` for one job. Hours, USD, bytes."""

    job_id: int
    source: str
    lines: list[CostLine]
    compute_usd: float
    on_demand_usd: float
    saving_percent: float | None
    interruptions: int
    lost_compute_node_h: float
    recomputed_steps: int | None
    restart_h: float
    checkpoint_bytes: int
    storage_usd: float
    egress_usd: float
    total_usd: float
    notes: list[str]
    # prices taken from catalogue entries no fetched source confirmed: "<market> <type>: <USD/h>"
    unverified_prices: list[str] = field(default_factory=list)
    # why a price used may not be the cluster's region's (prices.Price.warning), each once
    price_warnings: list[str] = field(default_factory=list)
    # True when no checkpoint of the job was read: each interruption then counts all the
    # compute since its run started as lost, an upper bound of what was lost
    lost_compute_upper_bound: bool = False


def cost_report(usage: JobUsage, prices: PriceBook, now: datetime) -> CostReport:
    """Price ``usage``.

    Storage: the bytes of the job's newest ``keep``-many checkpoints (config) for the job's
    span, per GB-month (30 days); egress: one newest checkpoint per restart (a restore may
    cross zones). Both at the price of the job's first node's provider.

    Raises:
        UnknownPriceError: a needed price is not known (names the type and zone, or the
            provider for storage/egress).
    """
    groups: dict[tuple[str, str, str, str | None], float] = defaultdict(float)
    for seg in usage.segments:
        groups[(seg.provider, seg.market, seg.instance_type, seg.zone)] += seg.hours
    lines = []
    unverified: list[str] = []
    warnings: list[str] = []
    for (provider_name, market, itype, zone), hours in sorted(groups.items(), key=str):
        ptype = _provider_type(prices, provider_name)
        price = prices.instance(ptype, "spot" if market == "spot" else "on-demand", itype, zone)
        od = prices.instance(ptype, "on-demand", itype, zone)
        for used, kind in ((price, market), (od, "on-demand")):
            text = f"{kind} {itype}: {used.usd_per_h:g} USD/h"
            if not used.verified and text not in unverified:
                unverified.append(text)
            if used.warning and used.warning not in warnings:
                warnings.append(used.warning)
        lines.append(CostLine(provider_name, market, itype, zone, hours, price.usd_per_h,
                              price.source, hours * price.usd_per_h, od.usd_per_h,
                              hours * od.usd_per_h))
    compute = sum(line.cost_usd for line in lines)
    on_demand = sum(line.on_demand_cost_usd for line in lines)
    lost_h, recomputed = _lost_compute(usage)
    restart_h = _restart_hours(usage)
    ckpt_bytes, storage, egress = _storage_and_egress(usage, prices, now)
    return CostReport(
        job_id=usage.job_id, source=usage.source, lines=lines, compute_usd=compute,
        on_demand_usd=on_demand,
        saving_percent=100 * (1 - compute / on_demand) if on_demand > 0 else None,
        interruptions=len(usage.interruptions), lost_compute_node_h=lost_h,
        recomputed_steps=recomputed, restart_h=restart_h, checkpoint_bytes=ckpt_bytes,
        storage_usd=storage, egress_usd=egress, total_usd=compute + storage + egress,
        notes=list(usage.notes), unverified_prices=unverified, price_warnings=warnings,
        lost_compute_upper_bound=bool(usage.interruptions) and not usage.checkpoints)


def _provider_type(prices: PriceBook, provider_name: str) -> str:
    return prices.provider_types.get(provider_name, provider_name)


def _nodes_at(usage: JobUsage, when: datetime) -> int:
    return sum(1 for s in usage.segments if s.start <= when <= s.end) or 1


def _lost_compute(usage: JobUsage) -> tuple[float, int | None]:
    """Node-hours since the last checkpoint before each interruption, and the steps that
    represents at the job's checkpointed step rate."""
    lost_h = 0.0
    for intr in usage.interruptions:
        after = [c for c in usage.checkpoints
                 if 0 <= (c.time - intr.time).total_seconds() <= EPISODE_S]
        if after:
            continue  # the notice-time checkpoint kept the work
        run_start = max((r[0] for r in usage.runs if r[0] <= intr.time), default=intr.time)
        before = [c.time for c in usage.checkpoints if c.time <= intr.time]
        since = max([run_start, *before])
        lost_h += (intr.time - since).total_seconds() / 3600 * _nodes_at(usage, intr.time)
    rates = [(b.step - a.step) / (b.time - a.time).total_seconds()
             for a, b in zip(usage.checkpoints, usage.checkpoints[1:], strict=False)
             if b.time > a.time and b.step > a.step]
    if not rates:
        return lost_h, None
    nodes = max((_nodes_at(usage, i.time) for i in usage.interruptions), default=1)
    return lost_h, round(lost_h / nodes * 3600 * statistics.median(rates))


def _restart_hours(usage: JobUsage) -> float:
    total = 0.0
    for intr in usage.interruptions:
        later = [r[0] for r in usage.runs if r[0] > intr.time]
        if later:
            total += (min(later) - intr.time).total_seconds() / 3600
    return total


def _storage_and_egress(usage: JobUsage, prices: PriceBook, now: datetime
                        ) -> tuple[int, float, float]:
    if not usage.checkpoints or not usage.segments:
        return 0, 0.0, 0.0
    keep = prices.checkpoint_keep
    kept = sum(c.size_bytes for c in usage.checkpoints[-keep:])
    newest = usage.checkpoints[-1].size_bytes
    start = min(s.start for s in usage.segments)
    end = min(max(s.end for s in usage.segments), now)
    months = max(0.0, (end - start).total_seconds()) / (30 * 86400)
    provider = usage.segments[0].provider
    gb = 1e9
    storage = kept / gb * months * prices.storage_usd_per_gb_month(provider)
    restarts = sum(1 for i in usage.interruptions if any(r[0] > i.time for r in usage.runs))
    egress = newest / gb * restarts * prices.egress_usd_per_gb(provider) if restarts else 0.0
    return kept, storage, egress


def observed_node_rate_per_h(events: Sequence[Mapping[str, Any]], now: datetime) -> tuple[float, str]:
    """Interruptions per spot node-hour seen in the events: (notice/reclaimed episodes) /
    (spot instance-hours from ``launched`` to ``terminated`` or now).

    Raises:
        BadInputError: no spot instance-hours recorded.
    """
    launched: dict[str, datetime] = {}
    ended: dict[str, datetime] = {}
    episodes: list[tuple[str, datetime]] = []
    for ev in events:
        when = _time(ev.get("time"))
        inst = ev.get("instance")
        extra = _extra(ev)
        if when is None:
            continue
        if ev.get("action") == Action.LAUNCHED and isinstance(inst, str) and extra.get("market") == "spot":
            launched[inst] = when
        elif ev.get("action") == Action.TERMINATED and isinstance(inst, str):
            ended.setdefault(inst, when)
        elif ev.get("action") in INTERRUPTION_ACTIONS:
            node = str(ev.get("node"))
            if not any(n == node and abs((when - t).total_seconds()) < EPISODE_S
                       for n, t in episodes):
                episodes.append((node, when))
    hours = sum((ended.get(i, now) - t).total_seconds() / 3600 for i, t in launched.items())
    if hours <= 0 or math.isclose(hours, 0):
        raise BadInputError("no spot instance-hours in the event log: cannot observe a rate; "
                            "use --interruption-band or --interruption-rate F")
    return len(episodes) / hours, f"observed: {len(episodes)} interruptions in {hours:.1f} " \
                                  "spot node-hours of the event log"
