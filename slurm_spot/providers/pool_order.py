"""The order in which a launch asks a node set's pools where slurm-spot, not the cloud, chooses
it: cheapest per GPU first (per vCPU for node sets without GPUs), pools in cooldown left out.

Who chooses:

- **GCP**: always slurm-spot. A bulk insert names one machine type (GCE only picks the zone of a
  regional request), so the launch tries the node set's machine types one after the other; with
  ``gcp.type_order: price`` (the default) cheapest per GPU first, with ``config`` in the order
  written. Either way pools in cooldown are skipped.
- **AWS** with ``allocation_strategy: lowest-price``: EC2 ranks the overrides by *instance*
  price, so a 4-GPU type at three times the price of a 1-GPU type loses to it although it is
  cheaper per GPU. slurm-spot ranks the instance types by price per GPU, skips pools in
  cooldown, and sends one CreateFleet per instance type in that order (EC2 still picks the
  cheapest zone of that type, which is the same ranking). With the other strategies EC2 weighs
  capacity it knows and slurm-spot does not, so EC2 keeps the choice.

Prices come from :func:`~slurm_spot.providers.prices.price_of` (``cost.*_usd_per_hour`` in
spot.yaml, then the provider's own source: the AWS spot price history for AWS spot, then its
shipped catalogue). **A type
with no price anywhere is never taken as free**: it goes after every priced type (in config
order among themselves) and a ``price_unknown`` event names it and says how to price it. Each
ranking is a ``launch_order`` event (the order, each pool's USD per GPU-hour and source, the
pools skipped and until when), so ``slurm-spot events`` shows why a type was chosen.

Cooldowns are remembered per pool (``<type>/<zone>/<market>``) in
:class:`~slurm_spot.providers.ledger.PoolCooldowns` for ``reconcile.cooldown_s`` after the pool
answered "no capacity"; pools the provider called not offered at all (EC2 ``Unsupported``) are
left out before ranking (:class:`~slurm_spot.providers.ledger.UnofferedPairs`). When every pool
of a market is cooling down, the launch asks none of them (the next market, if any, is tried)
and the nodes fail with ``PoolCooldown`` / ``POOL_COOLDOWN``, a capacity code, so the job is
requeued at once as for any capacity failure.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from pathlib import Path

from slurm_spot import events
from slurm_spot.config import NodeSetConfig
from slurm_spot.providers.ledger import PoolCooldowns
from slurm_spot.providers.prices import Price, UnknownPriceError

log = logging.getLogger(__name__)

#: (market, instance type, zone or "") -> USD per instance-hour; raises UnknownPriceError.
PriceLookup = Callable[[str, str, str], Price]
#: instance type -> (GPUs, vCPUs) of one instance where known (None: unknown).
ShapeLookup = Callable[[str], tuple[int | None, int | None]]


@dataclass(frozen=True)
class RankedPool:
    """One candidate pool with its price.

    Attributes:
        index: its position in the candidates given to :func:`rank_pools`.
        instance_type: ``g5.xlarge``, ``a2-highgpu-1g``.
        zone: its zone (or, when the zone is unknown, the subnet): part of the pool label.
        market: ``spot`` or ``on-demand``.
        usd_per_h: USD per instance-hour, None when no price is known.
        units: GPUs (or vCPUs) of one instance, what the price is divided by.
        unit: ``GPU`` or ``vCPU``.
        source: where the price came from (``config``, ``aws-spot-price-history``,
            ``catalogue ...``), "" when unknown or not ranked by price.
    """

    index: int
    instance_type: str
    zone: str
    market: str
    usd_per_h: float | None
    units: int
    unit: str
    source: str = ""

    @property
    def label(self) -> str:
        """``<instance type>/<zone>/<market>``, the pool string of cooldowns and failures."""
        return f"{self.instance_type}/{self.zone}/{self.market}"

    @property
    def usd_per_unit_h(self) -> float | None:
        """USD per GPU-hour (or vCPU-hour), None without a price."""
        if self.usd_per_h is None:
            return None
        return self.usd_per_h / max(1, self.units)

    def to_json(self) -> dict[str, object]:
        """The pool as the ``launch_order`` event lists it."""
        per_unit = self.usd_per_unit_h
        return {"pool": self.label, "usd_per_h": self.usd_per_h, "unit": self.unit,
                "units": self.units,
                "usd_per_unit_h": round(per_unit, 6) if per_unit is not None else None,
                "source": self.source}


@dataclass(frozen=True)
class PoolOrder:
    """The pools to ask, best first, and what was left out.

    Attributes:
        pools: the pools to ask, in order.
        skipped: ``(pool label, cooldown end, ISO 8601 UTC)`` of the pools left out.
        unpriced: instance type -> why it has no price (it was put last).
    """

    pools: tuple[RankedPool, ...] = ()
    skipped: tuple[tuple[str, str], ...] = ()
    unpriced: Mapping[str, str] = field(default_factory=dict)

    def by_type(self) -> list[tuple[str, list[RankedPool]]]:
        """The pools grouped by instance type, the types in the order of their best pool."""
        groups: dict[str, list[RankedPool]] = {}
        for pool in self.pools:
            groups.setdefault(pool.instance_type, []).append(pool)
        return list(groups.items())


def rank_pools(
    candidates: Sequence[tuple[str, str]], market: str, *, price: PriceLookup | None,
    units: Callable[[str], tuple[int, str]], cooled: Mapping[str, datetime],
) -> PoolOrder:
    """Order ``candidates`` (``(instance type, zone)`` pairs) of ``market`` (pure).

    Pools whose label is in ``cooled`` are left out. With ``price`` the rest go cheapest per
    unit first (ties and unpriced types keep the candidates' order, unpriced ones last); with
    ``price=None`` they keep the candidates' order.

    Args:
        candidates: the node set's pools, in config order.
        market: ``spot`` or ``on-demand``.
        price: USD per instance-hour of a pool (raises UnknownPriceError), or None.
        units: instance type -> (units per instance, ``GPU`` or ``vCPU``).
        cooled: pool label -> end of its cooldown (UTC).
    """
    keyed: list[tuple[tuple[int, float, int], RankedPool]] = []
    skipped: list[tuple[str, str]] = []
    unpriced: dict[str, str] = {}
    for index, (instance_type, zone) in enumerate(candidates):
        count, unit = units(instance_type)
        pool = RankedPool(index, instance_type, zone, market, None, count, unit)
        if pool.label in cooled:
            skipped.append((pool.label, cooled[pool.label].isoformat()))
            continue
        if price is None:
            keyed.append(((0, 0.0, index), pool))
            continue
        try:
            found = price(market, instance_type, zone)
        except UnknownPriceError as exc:
            unpriced.setdefault(instance_type, str(exc))
            keyed.append(((1, 0.0, index), pool))
            continue
        pool = RankedPool(index, instance_type, zone, market, found.usd_per_h, count, unit,
                          found.source)
        per_unit = pool.usd_per_unit_h
        keyed.append(((0, per_unit if per_unit is not None else math.inf, index), pool))
    keyed.sort(key=lambda item: item[0])
    return PoolOrder(tuple(p for _, p in keyed), tuple(skipped), unpriced)


def unit_counter(node_set: NodeSetConfig, types: Iterable[str],
                 shape: ShapeLookup) -> Callable[[str], tuple[int, str]]:
    """Instance type -> (units, unit) for ranking ``node_set``'s types: GPUs when the node
    set has GPUs (``gpus``) or any of its types does, else vCPUs. A type whose count is not
    known counts what the node set says one node has (``gpus.count``, ``cpus``)."""
    by_gpu = node_set.gpus is not None or any((shape(t)[0] or 0) > 0 for t in types)

    def count(instance_type: str) -> tuple[int, str]:
        gpus, vcpus = shape(instance_type)
        if by_gpu:
            return (gpus or (node_set.gpus.count if node_set.gpus else 1)), "GPU"
        return (vcpus or node_set.cpus), "vCPU"

    return count


@dataclass
class PoolRanker:
    """Orders a provider's pools and keeps their cooldowns (see the module docstring).

    Args:
        price: USD per instance-hour of a pool (raises UnknownPriceError).
        shape: instance type -> (GPUs, vCPUs) where known.
        cooldowns: the pool cooldown memory, or None (nothing remembered).
        cooldown_s: how long a pool that had no capacity is skipped (seconds; 0: never).
        log_dir: where ``launch_order`` / ``price_unknown`` events go (None: only logged).
        now: clock (aware UTC).
    """

    price: PriceLookup
    shape: ShapeLookup
    cooldowns: PoolCooldowns | None = None
    cooldown_s: float = 600.0
    log_dir: Path | None = None
    now: Callable[[], datetime] = lambda: datetime.now(timezone.utc)

    def cooled(self) -> dict[str, datetime]:
        """Pool label -> end of its cooldown, for the pools cooling down now."""
        return self.cooldowns.active(self.now()) if self.cooldowns is not None else {}

    def order(self, node_set: NodeSetConfig, market: str,
              candidates: Sequence[tuple[str, str]], by_price: bool = True) -> PoolOrder:
        """The pools of ``candidates`` to ask in ``market``, best first (see
        :func:`rank_pools`), reported as events. ``by_price=False`` keeps the given order
        and only leaves out pools in cooldown."""
        types = list(dict.fromkeys(t for t, _ in candidates))
        found = rank_pools(candidates, market, price=self.price if by_price else None,
                           units=unit_counter(node_set, types, self.shape),
                           cooled=self.cooled())
        self._report(node_set, market, found, by_price and len(types) > 1)
        return found

    def remember(self, pools: Iterable[str]) -> None:
        """Start a cooldown of ``cooldown_s`` for each pool label in ``pools`` (pools that
        answered "no capacity")."""
        pools = [p for p in pools if p]
        if not pools or self.cooldowns is None or self.cooldown_s <= 0:
            return
        now = self.now()
        self.cooldowns.remember(pools, now + timedelta(seconds=self.cooldown_s), now)

    def _report(self, node_set: NodeSetConfig, market: str, found: PoolOrder,
                price_matters: bool) -> None:
        if price_matters:
            for instance_type, why in found.unpriced.items():
                reason = (f"{instance_type}: {why}; tried after every priced type of node set "
                          f"{node_set.name} ({market})")
                log.warning("%s", reason)
                self._emit(events.Action.PRICE_UNKNOWN, reason,
                           {"node_set": node_set.name, "market": market, "type": instance_type})
        if found.skipped:
            log.info("node set %s (%s): skipping pools in cooldown: %s", node_set.name, market,
                     ", ".join(label for label, _ in found.skipped))
        if price_matters or found.skipped:
            order = ", ".join(p.label for p in found.pools) or "nothing"
            self._emit(events.Action.LAUNCH_ORDER, f"asking {order}", {
                "node_set": node_set.name, "market": market,
                "order": [p.to_json() for p in found.pools],
                "skipped": [{"pool": label, "until": until} for label, until in found.skipped],
            })

    def _emit(self, action: events.Action, reason: str, extra: dict[str, object]) -> None:
        if self.log_dir is not None:
            events.emit(self.log_dir, events.Event(action, "resume", reason=reason, extra=extra))
