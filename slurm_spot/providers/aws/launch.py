"""One launch of one node set on EC2: the CreateFleet rounds, error handling, node mapping.

:class:`FleetLauncher` decides; an :class:`Ec2Ops` (implemented by
:class:`~slurm_spot.providers.aws.provider.AwsProvider`) does the I/O. The steps (EC2 API reference:
DescribeInstances, CreateFleet, CreateTags):

1. one DescribeInstances by cluster + node-set tag: nodes that already have an alive instance
   are returned as launched (a re-run starts nothing); alive, not yet mapped instances of an
   unfinished launch whose token we are about to use are adopted instead of launching again;
2. CreateFleet (instant) for all missing nodes at once (<= 1000 per call: more nodes take
   one call per 1000, a batch launched whole is not a retry round), over every
   instance type x subnet, in the node set's market. What comes back is handled by error class
   (:mod:`slurm_spot.providers.aws.errors`):

   - capacity: the failed pools are dropped and the others tried again (at most ``max_rounds``
     calls per market), then the fallback market (``fallback: on-demand``);
   - quota: what EC2 launched (up to the headroom) is kept, the rest fail with the quota code;
   - config / auth: stop; the reason says why (SpotMaxPriceTooLow: offered and required price);
   - throttle: the same request again (same ClientToken) with jittered exponential back-off,
     ``throttle_attempts`` in all;
   - unknown: look the launch up by its tag first (an instance may exist), then retry the same
     request (same token) at most ``unknown_retries`` times;

3. DescribeInstances by launch tag (private IP and DNS name for Slurm; one call for up to 1000
   instances, where a lookup by id would page), then the node-mapping tags
   (:func:`~slurm_spot.providers.aws.fleet.node_mapping_calls`). Instances that cannot be
   mapped are terminated at once and their nodes fail.

With ``allocation_strategy: lowest-price`` and a :class:`~slurm_spot.providers.pool_order.PoolRanker`,
step 2 asks one instance type per CreateFleet, cheapest per GPU first, and skips pools in
cooldown (:mod:`slurm_spot.providers.pool_order` says why); with a ranker, pools that had no
capacity are remembered for its cooldown whatever the strategy.

botocore retries nothing on CreateFleet (``total_max_attempts=1``): InsufficientInstanceCapacity
is an HTTP 500 that botocore's standard mode would repeat twice, spending seconds of the resume
hook on a pool with no capacity; throttling is retried here instead, with the same token, so a
retry can never launch twice.
"""

from __future__ import annotations

import dataclasses
import logging
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import tenacity

from slurm_spot.config import AwsNodeSetOptions
from slurm_spot.errors import ProviderError
from slurm_spot.providers.aws.errors import FleetError, decisive, error_kind
from slurm_spot.providers.aws.fleet import (
    MAX_FLEET_TARGET,
    TAG_LAUNCH,
    FleetSpec,
    Pool,
    build_create_fleet_params,
    client_token,
    instance_from_ec2,
    instance_tags,
    launch_tag,
    node_index,
    node_mapping_calls,
)
from slurm_spot.providers.base import (
    TAG_CLUSTER,
    TAG_NODE_SET,
    ErrorClass,
    Instance,
    LaunchFailure,
    LaunchRequest,
    LaunchResult,
    normalize_code,
)
from slurm_spot.providers.ledger import TokenLedger, UnofferedPairs
from slurm_spot.providers.pool_order import PoolRanker

log = logging.getLogger(__name__)
_VCPU_LIMIT = re.compile(r"vCPU limit of (\d+)")

Launched = tuple[str, str, str, str]  # (instance id, instance type, subnet, lifecycle)
Attempt = tuple[list[Launched], list[FleetError]]


class Ec2Ops(Protocol):
    """The I/O a launch needs; :class:`~slurm_spot.providers.aws.provider.AwsProvider` implements it
    (see its methods of the same names for what each does and raises)."""

    api_calls: int

    def describe(self, filters: dict[str, list[str]]) -> list[dict[str, Any]]: ...

    def describe_launched(
        self, tokens: Sequence[str], instance_ids: Sequence[str]
    ) -> list[dict[str, Any]]: ...

    def create_fleet(self, params: dict[str, Any]) -> Attempt: ...

    def create_tags(self, instance_ids: Sequence[str], tags: Sequence[tuple[str, str]]) -> None: ...

    def terminate_instances(self, instance_ids: Sequence[str]) -> None: ...

    def zone_of(self, subnet: str) -> str: ...

    def spot_price(self, instance_type: str, zone: str) -> float | None: ...


@dataclass
class _Outcome:
    """What one launch has produced so far."""

    placed: dict[str, str] = field(default_factory=dict)  # instance id -> node
    tokens: list[str] = field(default_factory=list)  # launch tokens of the placed instances
    failed: list[LaunchFailure] = field(default_factory=list)
    failed_pools: list[str] = field(default_factory=list)
    last: tuple[FleetError, str] | None = None  # the last deciding error and its market


class FleetLauncher:
    """Launches the missing nodes of one :class:`LaunchRequest` (see the module docstring).

    Args:
        ops: the EC2 I/O.
        request: what to launch; ``request.node_set.aws`` must be set.
        now: clock (seconds since the epoch).
        ledger: tokens whose CreateFleet was answered before (never sent again); None: only
            the instances' launch tags tell (tests of a single launch).
        unoffered: (instance type, zone) pairs EC2 answered ``Unsupported`` for: left out of
            every request, and new ones added (None: not remembered).
        ranker: orders the pools of a ``lowest-price`` node set and keeps pool cooldowns
            (None: EC2 gets every pool at once, nothing is remembered).
        sleep: how to wait between throttled attempts (seconds).
        max_rounds: CreateFleet calls per market for capacity retries over the remaining pools.
        throttle_attempts: CreateFleet attempts in a row while throttled.
        unknown_retries: retries of a request that failed with an unknown error.

    Raises:
        ProviderError: (constructor) the node set has no ``aws`` section.
    """

    def __init__(
        self,
        ops: Ec2Ops,
        request: LaunchRequest,
        *,
        now: Callable[[], float],
        sleep: Callable[[float], None],
        max_rounds: int = 3,
        throttle_attempts: int = 5,
        unknown_retries: int = 2,
        ledger: TokenLedger | None = None,
        unoffered: UnofferedPairs | None = None,
        ranker: PoolRanker | None = None,
    ) -> None:
        opts = request.node_set.aws
        if opts is None:
            msg = f"node set {request.node_set.name!r} has no aws section"
            raise ProviderError("MissingAwsSettings", msg, "config")
        self.ops = ops
        self.request = request
        self.ns = request.node_set
        self.opts: AwsNodeSetOptions = opts
        self._now = now
        self._sleep = sleep
        self.max_rounds = max_rounds
        self.throttle_attempts = throttle_attempts
        self.unknown_retries = unknown_retries
        self._ended_tokens: set[str] = set()
        self._adoptable: dict[str, list[str]] = {}
        self._ledger = ledger
        self._unoffered = unoffered
        self._ranker = ranker

    @property
    def ordered(self) -> bool:
        """True when slurm-spot, not EC2, orders the pools (``lowest-price`` with a ranker)."""
        return self._ranker is not None and self.opts.allocation_strategy == "lowest-price"

    # ---- the whole launch ---------------------------------------------------------------
    def run(self) -> LaunchResult:
        """Look up, launch, describe and map; per-node problems become failures.

        Raises:
            ProviderError: the first lookup failed, or credentials were refused before anything
                was launched.
        """
        start_calls = self.ops.api_calls
        out = _Outcome()
        nodes = self._valid_nodes(out)
        records = self.ops.describe(
            {f"tag:{TAG_CLUSTER}": [self.request.cluster], f"tag:{TAG_NODE_SET}": [self.ns.name]}
        )
        existing = self._index_snapshot(records)
        remaining = [n for n in nodes if n not in existing]
        problem = self._static_problem()
        if remaining and problem is not None:
            out.failed.append(self._failure(remaining, problem, self.ns.market))
            remaining = []
        try:
            if remaining:
                self._launch_markets(remaining, out)
            launched = [existing[n] for n in nodes if n in existing] + self._finish(out)
        finally:  # answered (or raised after an answer); a killed hook never gets here
            if self._ledger is not None:
                self._ledger.finish(out.tokens)
            if self._ranker is not None:
                self._ranker.remember(out.failed_pools)
        return LaunchResult(
            launched=tuple(launched),
            failed=tuple(out.failed),
            api_calls=self.ops.api_calls - start_calls,
            failed_pools=tuple(out.failed_pools),
        )

    def _valid_nodes(self, out: _Outcome) -> list[str]:
        nodes, bad = [], []
        for node in dict.fromkeys(self.request.nodes):
            try:
                node_index(node, self.ns.name)
                nodes.append(node)
            except ValueError:
                bad.append(node)
        if bad:
            msg = f"config: not nodes of node set {self.ns.name!r}"
            out.failed.append(LaunchFailure(tuple(bad), "UnknownNode", msg, ErrorClass.CONFIG))
        return sorted(nodes, key=lambda n: node_index(n, self.ns.name))

    def _index_snapshot(self, records: list[dict[str, Any]]) -> dict[str, Instance]:
        existing: dict[str, Instance] = {}
        for record in records:
            inst = instance_from_ec2(record)
            token = launch_tag(record)
            if not inst.state.is_alive:
                self._ended_tokens.add(token)
            elif inst.node is None:
                self._adoptable.setdefault(token, []).append(inst.instance_id)
            elif inst.node not in existing or inst.launch_time < existing[inst.node].launch_time:
                existing[inst.node] = inst
        return existing

    def _static_problem(self) -> FleetError | None:
        if self.opts.interruption_behavior != "terminate":
            return FleetError(
                "UnsupportedInterruptionBehavior",
                f"aws.interruption_behavior {self.opts.interruption_behavior!r} needs a maintain "
                "fleet; EC2 Fleet instant supports only 'terminate'",
            )
        if not self.ns.instance_types:
            return FleetError("NoInstanceTypes", "instance_types is empty for an aws node set")
        return None

    # ---- CreateFleet rounds -------------------------------------------------------------
    def _launch_markets(self, remaining: list[str], out: _Outcome) -> None:
        pools = [Pool(t, s) for t in self.ns.instance_types for s in self.opts.subnets]
        known = self._unoffered.pairs() if self._unoffered is not None else frozenset()
        if known:
            pools = [p for p in pools if (p.instance_type, self.ops.zone_of(p.subnet)) not in known]
            if not pools:
                unoffered = ", ".join(f"{t} in {z}" for t, z in sorted(known))
                out.failed.append(self._failure(remaining, FleetError(
                    "Unsupported", f"no instance type of the node set is offered in its zones "
                    f"(remembered: {unoffered})"), self.ns.market))
                return
        markets: list[str] = [self.ns.market]
        if self.ns.market == "spot" and self.ns.fallback == "on-demand":
            markets.append("on-demand")
        for market in markets:
            if self.ordered:
                remaining, stop = self._launch_ordered(market, pools, remaining, out)
            else:
                remaining, stop = self._launch_market(market, pools, remaining, out)
            if stop or not remaining:
                break
        if remaining:
            error, market = out.last or (FleetError("UnfulfillableCapacity", "no pool left"), "")
            out.failed.append(self._failure(remaining, error, market))

    def _launch_ordered(
        self, market: str, pools: list[Pool], remaining: list[str], out: _Outcome
    ) -> tuple[list[str], bool]:
        """CreateFleet rounds in one market, one instance type at a time, cheapest per GPU
        first, pools in cooldown left out; returns (nodes still missing, stop everything)."""
        assert self._ranker is not None
        candidates = [(p.instance_type, self.ops.zone_of(p.subnet) or p.subnet) for p in pools]
        order = self._ranker.order(self.ns, market, candidates)
        if not order.pools:
            cooling = ", ".join(f"{label} until {until[11:19]}Z" for label, until in order.skipped)
            out.last = (FleetError("PoolCooldown", f"every pool had no capacity a moment ago "
                                   f"and is cooling down ({cooling})"), market)
            return remaining, False
        for _, group in order.by_type():
            chosen = [pools[r.index] for r in group]
            remaining, stop = self._launch_market(market, chosen, remaining, out)
            if stop or not remaining:
                return remaining, stop
        return remaining, False

    def _launch_market(
        self, market: str, pools: list[Pool], remaining: list[str], out: _Outcome
    ) -> tuple[list[str], bool]:
        """CreateFleet rounds in one market; returns (nodes still missing, stop everything)."""
        available = list(pools)
        rounds, unknown_left = 0, self.unknown_retries
        while remaining and available and rounds < self.max_rounds:
            rounds += 1
            target = remaining[:MAX_FLEET_TARGET]
            spec = FleetSpec(
                self.opts.launch_template, self.opts.launch_template_version, tuple(available),
                market, len(target), self.opts.allocation_strategy,
                self.opts.max_price_usd_per_hour,
            )
            token = self._token(spec, target)
            got, errors = self._attempt(spec, token)
            available = self._without_unoffered(available, errors)
            if token not in out.tokens:
                out.tokens.append(token)
            remaining = self._place(got, target, remaining, out)
            if not remaining:
                break
            if len(got) >= len(target) and not errors:  # a whole batch: on to the next one
                rounds -= 1
                continue
            error = decisive(errors) or FleetError(
                "UnfulfillableCapacity", f"CreateFleet launched {len(got)} of {len(target)}"
            )
            out.last = (error, market)
            cls = error.error_class
            if cls in (ErrorClass.CAPACITY, ErrorClass.PERMANENT):
                available = self._drop_failed_pools(available, errors or [error], market, out)
            elif cls is ErrorClass.UNKNOWN and unknown_left > 0:
                unknown_left, rounds = unknown_left - 1, rounds - 1
                remaining = self._place(self._find_launch(token, market), target, remaining, out)
            elif not (cls is ErrorClass.THROTTLE and got):
                if cls is ErrorClass.AUTH and not out.placed:
                    raise ProviderError(error.code, error.message, cls.value)
                return remaining, True
        return remaining, False

    def _token(self, spec: FleetSpec, target: list[str]) -> str:
        """The ClientToken for launching ``target`` with ``spec``: the same in every run (no
        time in it), so an unfinished launch is adopted by any later run; a token whose
        instances ended, or whose call was answered before (the ledger), moves on to its next
        generation, unless alive unmapped instances carry it (they are adopted)."""
        parts = [self.request.cluster, self.ns.name, ",".join(target), self.request.client_token]
        key = "|".join(parts)
        generation = 0
        token = client_token(spec, key)
        while token not in self._adoptable and (token in self._ended_tokens or (
                self._ledger is not None and self._ledger.finished(token))):
            generation += 1
            token = client_token(spec, key, generation)
        return token

    def _attempt(self, spec: FleetSpec, token: str) -> Attempt:
        """CreateFleet, or adoption of an unfinished launch with the same token; throttling is
        retried with the same parameters (tenacity: jittered exponential, bounded)."""
        adoptable = self._adoptable.pop(token, [])
        if adoptable:
            log.info("adopting %d instance(s) of unfinished launch %s", len(adoptable), token)
            return [(i, "", "", spec.market) for i in adoptable[: spec.count]], []
        tags = instance_tags(self.request.cluster, self.ns.name, spec.market, token)
        params = build_create_fleet_params(spec, tags, token)
        retrying = tenacity.Retrying(
            stop=tenacity.stop_after_attempt(self.throttle_attempts),
            wait=tenacity.wait_random_exponential(multiplier=0.5, max=10),
            retry=tenacity.retry_if_result(_throttled_without_instances),
            retry_error_callback=_last_result,
            sleep=self._sleep,
        )
        result: Attempt = retrying(self.ops.create_fleet, params)
        return result

    def _find_launch(self, token: str, market: str) -> list[Launched]:
        """Alive instances tagged with launch ``token`` (after an unknown error)."""
        records = self.ops.describe({f"tag:{TAG_LAUNCH}": [token]})
        alive = [r for r in records if instance_from_ec2(r).state.is_alive]
        return [(r["InstanceId"], "", "", market) for r in alive]

    def _place(
        self, got: Sequence[Launched], target: list[str], remaining: list[str], out: _Outcome
    ) -> list[str]:
        """Give launched instances (sorted by id, so concurrent identical launches agree) to the
        first nodes of ``target`` still without one; returns the nodes still missing."""
        free = [n for n in target if n in remaining]
        new = [g for g in sorted(got) if g[0] not in out.placed]
        for (instance_id, *_), node in zip(new, free, strict=False):
            out.placed[instance_id] = node
        taken = set(out.placed.values())
        return [n for n in remaining if n not in taken]

    def _without_unoffered(self, available: list[Pool], errors: list[FleetError]) -> list[Pool]:
        """``available`` without the pools EC2 called ``Unsupported`` (the instance type is not
        offered in that zone), which are remembered for every later launch."""
        unoffered = _pools_named(available, errors, ErrorClass.PERMANENT)
        if unoffered and self._unoffered is not None:
            self._unoffered.remember(
                (p.instance_type, zone) for p in unoffered
                if p.instance_type and (zone := self.ops.zone_of(p.subnet)))
        return [p for p in available if p not in unoffered]

    def _drop_failed_pools(
        self, available: list[Pool], errors: list[FleetError], market: str, out: _Outcome
    ) -> list[Pool]:
        """Pools to ask in the next round: without those that had no capacity (labelled in
        ``out.failed_pools`` for cooldowns). Pools not offered at all were already removed by
        :meth:`_without_unoffered` and are never labelled (not capacity)."""
        if not any(e.error_class is ErrorClass.CAPACITY for e in errors) and any(
                e.error_class is ErrorClass.PERMANENT for e in errors):
            return available
        failed = _pools_named(available, errors, ErrorClass.CAPACITY)
        if not failed:  # errors name no pool we asked for: none of them is worth asking again
            failed = list(available)
        for pool in failed:
            label = dataclasses.replace(pool, zone=self.ops.zone_of(pool.subnet)).label(market)
            if label not in out.failed_pools:
                out.failed_pools.append(label)
        return [p for p in available if p not in failed]

    # ---- failures -----------------------------------------------------------------------
    def _failure(self, nodes: Sequence[str], error: FleetError, market: str) -> LaunchFailure:
        pool = ""
        if error.instance_type and error.subnet:
            zone = self.ops.zone_of(error.subnet)
            pool = Pool(error.instance_type, error.subnet, zone).label(error.market or market)
        message = self._message(error, nodes, market)
        limit, per_node = self._vcpu_quota(error)
        return LaunchFailure(tuple(nodes), error.code, message, error.error_class, pool,
                             quota_limit=limit, quota_per_node=per_node,
                             quota_unit="vCPU" if limit is not None else "")

    def _vcpu_quota(self, error: FleetError) -> tuple[int | None, int | None]:
        """(vCPU limit, vCPUs of the node set's smallest instance type) for a
        ``VcpuLimitExceeded`` error. EC2 states the limit only in the message ("... your
        current vCPU limit of 32 allows ..."): the number is read from it, the class never."""
        if normalize_code(error.code) != normalize_code("VcpuLimitExceeded"):
            return None, None
        match = _VCPU_LIMIT.search(error.message)
        from slurm_spot.providers.aws.catalog import catalogue

        shapes = catalogue()
        sizes = [shapes[t].vcpus for t in self.ns.instance_types if t in shapes]
        return (int(match.group(1)) if match else None), (min(sizes) if sizes else self.ns.cpus)

    def _message(self, error: FleetError, nodes: Sequence[str], market: str) -> str:
        cls = error.error_class
        if normalize_code(error.code) == normalize_code("SpotMaxPriceTooLow"):
            return self._price_message(error)
        if cls is ErrorClass.CAPACITY:
            where = f"{market} " if market else ""
            return f"capacity: no {where}capacity for {len(nodes)} node(s); {error.message}"
        return f"{cls.value}: {error.message}"

    def _price_message(self, error: FleetError) -> str:
        instance_type = error.instance_type or self.ns.instance_types[0]
        subnet = error.subnet or self.opts.subnets[0]
        zone = self.ops.zone_of(subnet)
        required = self.ops.spot_price(instance_type, zone) if zone else None
        offered = self.opts.max_price_usd_per_hour
        need = f"{required:g} USD/h" if required is not None else "unknown"
        return (
            f"config: offered max price {offered} USD/h < required spot price {need} for "
            f"{instance_type} in {zone or subnet}; raise or remove aws.max_price_usd_per_hour"
        )

    # ---- describe and map ---------------------------------------------------------------
    def _finish(self, out: _Outcome) -> list[Instance]:
        """Read the new instances and write the node mapping; what cannot be mapped is
        terminated at once and its nodes fail (the reconciler would catch it as an orphan)."""
        if not out.placed:
            return []
        try:
            found = self.ops.describe_launched(out.tokens, list(out.placed))
        except ProviderError as exc:
            return self._abandon(out, dict(out.placed), exc.code, f"cannot read them: {exc}")
        records = {r["InstanceId"]: r for r in found}
        alive: dict[str, Instance] = {}
        unseen = []
        for instance_id, node in out.placed.items():
            inst = instance_from_ec2(records[instance_id]) if instance_id in records else None
            if inst is None or not inst.state.is_alive:
                code = (inst.state_reason if inst else "") or "InstanceNotFound"
                cls = error_kind(code).error_class
                msg = f"{cls.value}: instance {instance_id} ended at launch"
                out.failed.append(LaunchFailure((node,), code, msg, cls))
                unseen += [] if inst else [instance_id]
                continue
            alive[instance_id] = dataclasses.replace(inst, node=node, node_set=self.ns.name)
        if unseen:
            self._terminate_quietly(unseen)
        try:
            assignment = {i: node_index(inst.node or "", self.ns.name) for i, inst in alive.items()}
            for ids, tags in node_mapping_calls(assignment):
                self.ops.create_tags(ids, tags)
        except ProviderError as exc:
            placed = {i: inst.node or "" for i, inst in alive.items()}
            return self._abandon(out, placed, exc.code, f"node mapping tags failed: {exc}")
        return sorted(alive.values(), key=lambda i: node_index(i.node or "", self.ns.name))

    def _abandon(self, out: _Outcome, placed: dict[str, str], code: str, why: str) -> list[Instance]:
        log.error("giving up %d new instance(s): %s", len(placed), why)
        self._terminate_quietly(list(placed))
        nodes = tuple(placed.values())
        out.failed.append(LaunchFailure(nodes, code, f"unknown: {why}", ErrorClass.UNKNOWN))
        return []

    def _terminate_quietly(self, instance_ids: list[str]) -> None:
        try:
            self.ops.terminate_instances(instance_ids)
        except ProviderError as exc:
            log.error("cannot terminate %s (the reconciler will): %s", instance_ids, exc)


def _pools_named(available: list[Pool], errors: list[FleetError],
                 error_class: ErrorClass) -> list[Pool]:
    """The pools of ``available`` that an error of ``error_class`` names: the same instance
    type and subnet, where the error gives them (a whole-call error, with neither, names every
    pool). A pool named by several errors is listed once per error. Never raises."""
    return [
        p for p in available
        for e in errors
        if e.error_class is error_class
        and e.instance_type in ("", p.instance_type)
        and e.subnet in ("", p.subnet)
    ]


def _throttled_without_instances(result: Attempt) -> bool:
    got, errors = result
    error = decisive(errors)
    return not got and error is not None and error.error_class is ErrorClass.THROTTLE


def _last_result(state: tenacity.RetryCallState) -> Attempt:
    """After the last throttled attempt, hand back what it returned (not a RetryError)."""
    result: Attempt = state.outcome.result() if state.outcome else ([], [])
    return result
