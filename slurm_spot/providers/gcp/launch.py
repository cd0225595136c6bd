"""One launch of the ``gcp`` provider as a small state machine (see :mod:`.provider` for the
flow): list, bulk insert per attempt, wait, list again, and decide by the most specific error
code what to try next. Only :class:`GcpProvider` and :class:`ComputeApi` do I/O.

The machine types of a market are tried cheapest per GPU first (``gcp.type_order: price``, the
default) or in config order (``config``); either way zones whose pool is cooling down are left
out (:mod:`slurm_spot.providers.pool_order`), and pools that had no capacity start a cooldown.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from typing import Protocol

from slurm_spot.config import GcpProviderConfig, NodeSetConfig
from slurm_spot.errors import ProviderError
from slurm_spot.providers.base import (
    ErrorClass,
    Instance,
    LaunchFailure,
    LaunchRequest,
    LaunchResult,
)
from slurm_spot.providers.gcp.api import ComputeApi, GceCallError, OperationStatus
from slurm_spot.providers.gcp.errors import GceError, most_specific, quota_limit
from slurm_spot.providers.gcp.requests import (
    Attempt,
    accelerator_type,
    attaches_gpus,
    bulk_insert_body,
    instance_name,
    is_valid_instance_name,
    request_id,
)
from slurm_spot.providers.ledger import UnofferedPairs
from slurm_spot.providers.pool_order import PoolRanker

log = logging.getLogger("slurm_spot.providers.gcp.provider")
STOP_CLASSES = (ErrorClass.CONFIG, ErrorClass.AUTH)
RETRY_CLASSES = (ErrorClass.THROTTLE, ErrorClass.UNKNOWN)
MAX_REPLAYS = 8


class GceOps(Protocol):
    """The I/O a launch needs, the same seam style as AWS's ``Ec2Ops``;
    :class:`~slurm_spot.providers.gcp.provider.GcpProvider` implements it (see its members of
    the same names for what each does and raises)."""

    settings: GcpProviderConfig
    max_attempts: int
    replay_window_s: float
    unoffered: UnofferedPairs | None  # (type, zone) pairs GCE said it does not offer

    @property
    def api(self) -> ComputeApi: ...

    @property
    def pool_ranker(self) -> PoolRanker | None: ...

    def backoff(self, attempt: int) -> None: ...

    def delete(self, instances: Sequence[Instance], wait: bool = False) -> list[Instance]: ...

    def node_set_instances(self, node_set: NodeSetConfig) -> dict[str, list[Instance]]: ...

    def wait(self, op: OperationStatus) -> OperationStatus: ...


@dataclass
class LaunchRun:
    """The state of one :meth:`GcpProvider.launch`: nodes still pending, those launched or
    failed, failed pools, the latest error, and the request-id salt."""

    provider: GceOps
    request: LaunchRequest
    started: datetime
    pending: list[str] = field(default_factory=list)
    launched: dict[str, Instance] = field(default_factory=dict)
    failed: list[LaunchFailure] = field(default_factory=list)
    failed_pools: list[str] = field(default_factory=list)
    last: tuple[GceError, str] | None = None
    stopped: bool = False
    salt: int = 0
    capacity_pools: list[str] = field(default_factory=list)

    @property
    def node_set(self) -> NodeSetConfig:
        """The node set being launched."""
        return self.request.node_set

    @property
    def zones(self) -> list[str]:
        """The node set's zones, in config order."""
        assert self.node_set.gcp is not None
        return list(self.node_set.gcp.zones)

    def execute(self) -> None:
        """Run the launch: invalid names fail at once, then list, clean up ended instances
        of the requested nodes, and go through :meth:`plan` until nothing is pending."""
        cluster = self.request.cluster
        bad = [n for n in self.request.nodes
               if not is_valid_instance_name(instance_name(cluster, n))]
        if bad:
            self.failed.append(LaunchFailure(
                tuple(bad), "INVALID_INSTANCE_NAME", f"'{cluster}-<node>' is not a valid GCE "
                "instance name (max 63 chars of [a-z0-9-])", ErrorClass.CONFIG))
        self.pending = [n for n in self.request.nodes if n not in bad]
        dead = self.refresh()
        if dead:
            self.provider.delete(dead, wait=True)
        try:
            for market, machine_type, zones in self.plan():
                if not self.pending or self.stopped:
                    break
                self.try_machine(market, machine_type, zones)
        finally:
            ranker = self.provider.pool_ranker
            if ranker is not None:
                ranker.remember(self.capacity_pools)

    def plan(self) -> list[tuple[str, str | None, list[str]]]:
        """(market, machine type, zones) in the order tried: the node set's market, then its
        fallback; within a market ``gcp.machine_type`` and ``instance_types`` (None: the
        instance template's own), cheapest per GPU first unless ``gcp.type_order`` is
        ``config``, each with its zones that are not cooling down."""
        opts = self.node_set.gcp
        assert opts is not None
        named = [opts.machine_type, *self.node_set.instance_types]
        types: list[str | None] = list(dict.fromkeys(t for t in named if t)) or [None]
        markets = [self.node_set.market]
        if self.node_set.market == "spot" and self.node_set.fallback == "on-demand":
            markets.append("on-demand")
        ranker = self.provider.pool_ranker
        if ranker is None:
            return [(m, t, self.zones) for m in markets for t in types]
        steps: list[tuple[str, str | None, list[str]]] = []
        for market in markets:
            kinds = {t or opts.instance_template or "template": t for t in types}
            candidates = [(kind, zone) for kind in kinds for zone in self.zones]
            order = ranker.order(self.node_set, market, candidates,
                                 by_price=opts.type_order == "price" and types != [None])
            steps += [(market, kinds[kind], [p.zone for p in pools])
                      for kind, pools in order.by_type()]
            if not order.pools and order.skipped:
                cooling = ", ".join(f"{label} until {until[11:19]}Z"
                                    for label, until in order.skipped)
                self.last = (GceError("POOL_COOLDOWN", "every pool had no capacity a moment "
                                      f"ago and is cooling down ({cooling})"),
                             order.skipped[0][0])
        return steps

    def refresh(self) -> list[Instance]:
        """List the node set; move nodes with an alive instance from pending to launched.
        Returns ended instances of pending nodes."""
        found = self.provider.node_set_instances(self.node_set)
        dead: list[Instance] = []
        for node in list(self.pending):
            alive = [i for i in found.get(node, []) if i.state.is_alive]
            if alive:
                self.launched[node] = alive[0]
                self.pending.remove(node)
            else:
                dead.extend(found.get(node, []))
        return dead

    def types_of(self, machine_type: str | None) -> set[str]:
        """The types a request with ``machine_type`` needs offered in its zone: the machine
        type and, when GPUs are attached to it, their accelerator type."""
        gpus = self.node_set.gpus
        named = {machine_type} if machine_type else set()
        if gpus and attaches_gpus(machine_type):
            named.add(accelerator_type(gpus.type))
        return named

    def offered_zones(self, machine_type: str | None) -> list[str]:
        """The node set's zones without those remembered as not offering ``machine_type``
        (or its accelerator type)."""
        known = self.provider.unoffered.pairs() if self.provider.unoffered else frozenset()
        needed = self.types_of(machine_type)
        return [z for z in self.zones if not any((t, z) in known for t in needed)]

    def try_machine(self, market: str, machine_type: str | None,
                    zones: list[str] | None = None) -> None:
        """Bulk inserts for one (market, machine type) in ``zones`` (default: the node
        set's) until nothing is pending or those zones are used up; the error class of each
        decides the next step. Zones of the node set not in ``zones`` are denied; zones
        remembered as not offering the type are never asked."""
        offered = self.offered_zones(machine_type)
        if not offered and self.pending:
            self.not_offered(machine_type)
        zones = [z for z in (self.zones if zones is None else zones) if z in offered]
        tries = 0
        while zones and self.pending and not self.stopped:
            denied = tuple(z for z in self.zones if z not in zones)
            attempt = Attempt(market, machine_type, tuple(zones), len(self.zones) > 1, denied)
            error = self.bulk(attempt)
            if error is None and not self.pending:
                return
            error = error or GceError("NOT_CREATED", "no error reported, yet no instance exists")
            failed_zones = self.record(error, attempt)
            cls = error.error_class
            if self.stopped or cls in STOP_CLASSES:
                self.stopped = True
            elif cls is ErrorClass.CAPACITY:
                zones = [z for z in zones if z not in failed_zones]
            elif cls is ErrorClass.PERMANENT:
                if not failed_zones:
                    return  # no zone of this attempt named: on to the next type
                zones = [z for z in zones if z not in failed_zones]
            elif cls is ErrorClass.QUOTA:
                return
            elif tries + 1 < self.provider.max_attempts:  # throttle, unknown
                tries += 1
                self.salt += 1
                self.provider.backoff(tries)
            else:
                self.stopped = True

    def not_offered(self, machine_type: str | None) -> None:
        """Every zone is remembered as not offering ``machine_type``: nothing is asked. Unless
        an earlier type failed otherwise (that failure says more), the latest failure says
        so: PERMANENT, slurm-spot's ``TYPE_NOT_OFFERED``, no pool (never a cooldown)."""
        needed = self.types_of(machine_type)
        known = self.provider.unoffered.pairs() if self.provider.unoffered else frozenset()
        pairs = ", ".join(f"{t} in {z}" for t, z in sorted(known) if t in needed)
        error = GceError("TYPE_NOT_OFFERED", f"permanent: not offered in the node set's zones "
                         f"(remembered: {pairs})")
        if self.last is None:
            self.last = (error, "")
        log.info("node set %s: %s not offered in any of its zones (remembered)",
                 self.node_set.name, machine_type or "the template's type")

    def record(self, error: GceError, attempt: Attempt) -> list[str]:
        """Keep ``error`` as the latest failure and, for capacity and quota, note its failed
        pools (for cooldowns); remember a (type, zone) pair GCE does not offer (never a
        cooldown: not capacity); return the zones it is about."""
        zones = _failed_zones(error, attempt)
        template = self.node_set.gcp.instance_template if self.node_set.gcp else None
        pools = replace(attempt, zones=tuple(zones)).pools(template)
        if error.error_class in (ErrorClass.CAPACITY, ErrorClass.QUOTA):
            self.failed_pools.extend(p for p in pools if p not in self.failed_pools)
        if error.error_class is ErrorClass.CAPACITY:  # quota is regional: no pool cooldown
            self.capacity_pools.extend(p for p in pools if p not in self.capacity_pools)
        if error.error_class is ErrorClass.PERMANENT and error.not_offered and zones:
            if self.provider.unoffered is not None:
                self.provider.unoffered.remember((error.not_offered, z) for z in zones)
        if error.error_class is not ErrorClass.PERMANENT:
            self.last = (error, pools[0] if pools else "")
        elif self.last is None:  # an earlier type's capacity/quota failure says more
            self.last = (error, "")
        log.warning("node set %s: %s on %s for %d node(s)", self.node_set.name, error.code,
                    ",".join(pools), len(self.pending))
        return zones

    def bulk(self, attempt: Attempt) -> GceError | None:
        """One bulk insert for the pending nodes; the most specific error, if any. Stops the
        launch when the outcome is unknowable (operation not done, listing failed)."""
        names = [instance_name(self.request.cluster, n) for n in self.pending]
        settings = self.provider.settings
        body = bulk_insert_body(settings.project, settings.region, self.request.cluster,
                                self.node_set, names, attempt)
        op = self.submit(body, attempt)
        if isinstance(op, GceError):
            self.stopped = op.error_class in RETRY_CLASSES  # retried enough already
            return op
        op = self.provider.wait(op)
        self.stopped = not op.done  # still running: another request could duplicate it
        try:
            self.refresh()
        except ProviderError as exc:
            self.stopped = True
            return GceError(exc.code, f"cannot list instances after {op.name}: {exc}")
        return most_specific(op.errors)

    def submit(self, body: dict[str, object], attempt: Attempt) -> OperationStatus | GceError:
        """Send the bulk insert; retry throttled/unknown HTTP errors with the same request id
        and re-send a stale replay with a new one. Returns the operation or the final error."""
        token = self.request.client_token or ",".join(sorted(self.request.nodes))
        zone = None if attempt.regional else attempt.zones[0]
        stale_before = self.started - timedelta(seconds=self.provider.replay_window_s)
        tries = 0
        while True:
            rid = request_id(f"{self.request.cluster}|{token}", attempt, self.salt)
            try:
                op = self.provider.api.bulk_insert(body, zone, self.provider.settings.region, rid)
            except GceCallError as exc:
                error = most_specific(exc.errors) or GceError(exc.code, str(exc))
                tries += 1
                if error.error_class not in RETRY_CLASSES or tries >= self.provider.max_attempts:
                    return error
                self.provider.backoff(tries)
                continue
            replayed = op.done and op.insert_time is not None and op.insert_time < stale_before
            if replayed and self.salt < MAX_REPLAYS:
                log.info("request id %s replayed an operation of %s: sending anew", rid,
                         op.insert_time)
                self.salt += 1
                continue
            return op

    def _quota(self, error: GceError) -> tuple[int | None, int | None, str]:
        """(quota limit, what one node of the node set takes of it, unit) for a
        ``QUOTA_EXCEEDED`` error that names its quota (:func:`quota_limit`), so that a job
        which can never fit is held as on AWS (:func:`slurm_spot.lifecycle.power.flag_jobs_beyond_quota`);
        ``(None, None, "")`` otherwise. A node takes the node set's ``cpus`` of a CPU quota,
        its GPU count of a GPU quota, one of INSTANCES."""
        found = quota_limit(error)
        if found is None or not found.unit:
            return None, None, ""
        gpus = self.node_set.gpus.count if self.node_set.gpus else 0
        per_node = {"vCPU": self.node_set.cpus, "GPU": gpus, "instance": 1}[found.unit]
        if not per_node:
            return None, None, ""
        return found.limit, per_node, found.unit

    def result(self, api_calls: int) -> LaunchResult:
        """The :class:`LaunchResult`: launched in request order; the nodes still pending fail
        with the latest error (its code, class, message and first failed pool)."""
        failed = list(self.failed)
        if self.pending:
            error, pool = self.last or (GceError("NOT_CREATED", "not attempted"), "")
            limit, per_node, unit = self._quota(error)
            failed.append(LaunchFailure(tuple(self.pending), error.code, error.message,
                                        error.error_class, pool, quota_limit=limit,
                                        quota_per_node=per_node, quota_unit=unit))
        launched = tuple(self.launched[n] for n in self.request.nodes if n in self.launched)
        return LaunchResult(launched, tuple(failed), api_calls, tuple(self.failed_pools))


def _failed_zones(error: GceError, attempt: Attempt) -> list[str]:
    """The zones a capacity error is about: ``errorInfo.metadatas.zone``, else the zone its
    message names, else every zone of the attempt. A not-offered error: the zone it names,
    else the zone of a zonal attempt, else none (unknown). Other classes: every zone."""
    if error.error_class is ErrorClass.PERMANENT:
        if error.zone:
            return [error.zone] if error.zone in attempt.zones else []
        return [] if attempt.regional else list(attempt.zones[:1])
    if error.error_class is ErrorClass.CAPACITY:
        if error.zone and error.zone in attempt.zones:
            return [error.zone]
        named = re.search(r"zones/([a-z0-9-]+)", error.message)
        if named and named.group(1) in attempt.zones:
            return [named.group(1)]
    return list(attempt.zones)
