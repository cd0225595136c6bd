"""Slurm's node Weights in the cost order (issue 24, part 2): which Weight each node set has
now, and the ``scontrol update nodename=... weight=N`` that bring Slurm in step with it.

The order itself is :mod:`slurm_spot.cost.order` (pure); this module feeds it:

- **prices**: each node set's cheapest instance type in its market, from spot.yaml's ``cost``,
  the provider's live price (AWS ``DescribeSpotPriceHistory`` through each AWS provider's own
  region, profile and credentials file, cached in ``<state_dir>/cost/spot-prices.json`` for
  ``cost.spot_price_max_age_s``), else the shipped catalogue (:class:`~slurm_spot.cost.prices.PriceBook`
  over each provider's price source);
  a node set whose price cannot be had keeps the last one this process saw, else sorts after
  the priced ones;
- **risk**: ``interruption_band`` of the node set (Spot Advisor band; unset: 5-10 % for spot,
  none for on-demand);
- **capacity**: a node set with a node DOWN under a cooldown reason that has not ended
  (:func:`cooling_node_sets`, the reason the failover and the reconciler write).

``render`` writes :func:`static_weights` into slurm.conf (spot.yaml and catalogue prices, no
network), so a restarted slurmctld starts in a sensible order; the reconciler then applies
:func:`live_weights` every pass with :func:`sync_weights`. Updating Weight at run time is
documented in scontrol(1) (22.05: ``Weight=<weight>`` "allows dynamic changes to weight
associated with nodes"; it lasts until slurmctld restarts without ``-R`` or reconfigures,
when slurm.conf's value is back and the next pass corrects it).

**Powered-down nodes.** Slurm 23.02 and newer order powered-down nodes by Weight; before 23.02
slurmctld replaces the Weight of an all-powered-down node set by one common reboot weight and
takes such nodes in node-name order (:attr:`SlurmVersion.powered_down_weight`), so there these
Weights only order nodes that are up, and :func:`name_order_warnings` (``config check``) tells
an admin whose node set names sort against the cost order.

**Not fighting an admin.** With ``power.order: weight`` nothing here runs: slurm.conf gets
spot.yaml's ``weight`` and no Weight is ever changed (but a prewarm's temporary 0). With
``power.order: cost`` (the default) an admin's ``weight:`` is a tier the cost order never
crosses (:mod:`slurm_spot.cost.order`), and :func:`weight_updates` only rewrites Weights it
could have written itself (1..N, N = the number of node sets): a node given another Weight by
hand (``scontrol update nodename=gpu-3 weight=1000``) is left alone until it is set back to
one of those, or slurmctld reconfigures. A prewarmed replacement's Weight 0 is
:mod:`slurm_spot.lifecycle.prewarm`'s to restore.
"""

from __future__ import annotations

import logging
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from itertools import pairwise

from slurm_spot.config import SpotConfig
from slurm_spot.cost.order import DEFAULT_SPOT_BAND, FIRST_WEIGHT, Offer, band_rate_per_h, order_weights
from slurm_spot.cost.prices import PriceOf, price_lookup
from slurm_spot.errors import SlurmCommandError
from slurm_spot.hostlist import slurm_node_order
from slurm_spot.slurm.client import Node, SlurmClient
from slurm_spot.slurm.reasons import parse_cooldown
from slurm_spot.slurm.version import SlurmVersion

log = logging.getLogger(__name__)

#: The Weight a prewarmed replacement has while it waits for its job (the lowest Slurm accepts);
#: :mod:`slurm_spot.lifecycle.prewarm` sets it and restores the cost order's.
PREWARM_WEIGHT = 0

def cooling_node_sets(config: SpotConfig, nodes: Iterable[Node], now: datetime) -> set[str]:
    """Node sets with a node DOWN under a cooldown reason that ends after ``now`` (aware
    UTC): the failover's and the reconciler's ``(Code:X)Temporarily disabled until T``."""
    found = set()
    for node in nodes:
        ns = config.node_set_of(node.name)
        cooldown = parse_cooldown(node.reason) if ns is not None else None
        if ns is not None and cooldown is not None and node.state.is_down and cooldown[1] > now:
            found.add(ns.name)
    return found


def offers(config: SpotConfig, price_of: PriceOf, cooling: Collection[str] = ()) -> list[Offer]:
    """The :class:`~slurm_spot.cost.order.Offer` of every node set: its price, its
    interruption rate (``interruption_band``, else :data:`DEFAULT_SPOT_BAND` for spot, 0
    on-demand), its spot.yaml ``weight`` as tier and its position."""
    found = []
    for position, ns in enumerate(config.node_sets):
        rate = 0.0 if ns.market == "on-demand" else band_rate_per_h(
            ns.interruption_band or DEFAULT_SPOT_BAND)
        found.append(Offer(ns.name, ns.market, price_of(ns), rate, ns.weight, position,
                           ns.name in cooling))
    return found


def static_weights(config: SpotConfig) -> dict[str, int]:
    """``{node set: Weight}`` for slurm.conf: spot.yaml's ``weight`` with ``power.order:
    weight``, else the cost order from spot.yaml and catalogue prices (no network, no
    cooldowns)."""
    if config.power.order == "weight":
        return {ns.name: ns.weight for ns in config.node_sets}
    return order_weights(offers(config, price_lookup(config, live=False)))


def live_weights(config: SpotConfig, nodes: Iterable[Node], now: datetime,
                 price_of: PriceOf) -> dict[str, int]:
    """``{node set: Weight}`` now: :func:`static_weights` with ``power.order: weight``, else
    the cost order with ``price_of``'s prices and the cooldowns read from ``nodes``."""
    if config.power.order == "weight":
        return static_weights(config)
    return order_weights(offers(config, price_of, cooling_node_sets(config, nodes, now)))


def current_weights(config: SpotConfig, nodes: Iterable[Node]) -> dict[str, int]:
    """``{node set: Weight}`` as Slurm has it now (pure): the most common Weight of the set's
    nodes in ``nodes``, a prewarm's 0 not counted; :func:`static_weights` for a set with no
    such node (not listed, or every node prewarmed)."""
    from collections import Counter

    seen: dict[str, Counter[int]] = {}
    for node in nodes:
        ns = config.node_set_of(node.name)
        if ns is not None and node.weight is not None and node.weight != PREWARM_WEIGHT:
            seen.setdefault(ns.name, Counter())[node.weight] += 1
    result = {}
    fallback: dict[str, int] | None = None
    for ns in config.node_sets:
        if ns.name in seen:
            result[ns.name] = min(seen[ns.name].most_common(),
                                  key=lambda wc: (-wc[1], wc[0]))[0]
        else:
            fallback = fallback if fallback is not None else static_weights(config)
            result[ns.name] = fallback[ns.name]
    return result


def ours(config: SpotConfig, weight: int) -> bool:
    """A Weight slurm-spot may have written itself: one of the cost order's (1..N), or the
    node set weights of spot.yaml (slurm.conf's with ``power.order: weight``)."""
    return (FIRST_WEIGHT <= weight < FIRST_WEIGHT + len(config.node_sets)
            or weight in {ns.weight for ns in config.node_sets})


def weight_updates(config: SpotConfig, weights: Mapping[str, int],
                   nodes: Iterable[Node]) -> dict[int, list[str]]:
    """``{Weight: nodes}`` that differ from ``weights`` (node set -> Weight) and are
    slurm-spot's to change (pure): nodes of a node set, Weight known and :func:`ours`
    (a prewarm's 0 and an admin's hand-set Weight are left alone); nodes in name order."""
    updates: dict[int, list[str]] = {}
    for node in sorted(nodes, key=lambda n: n.name):
        ns = config.node_set_of(node.name)
        if ns is None or ns.name not in weights or node.weight is None:
            continue
        if node.weight == PREWARM_WEIGHT or not ours(config, node.weight):
            continue
        if node.weight != weights[ns.name]:
            updates.setdefault(weights[ns.name], []).append(node.name)
    return updates


@dataclass
class WeightSync:
    """What :func:`sync_weights` did: ``changed`` Weight -> nodes updated, ``errors``."""

    changed: dict[int, list[str]] = field(default_factory=dict)
    errors: list[str] = field(default_factory=list)


def sync_weights(config: SpotConfig, slurm: SlurmClient, weights: Mapping[str, int],
                 nodes: Iterable[Node]) -> WeightSync:
    """Apply :func:`weight_updates`: one ``scontrol update nodename=<hostlist> weight=N`` per
    Weight. A refused update is one line in ``errors``; the other Weights still go."""
    done = WeightSync()
    for weight, names in sorted(weight_updates(config, weights, nodes).items()):
        try:
            slurm.set_weight(names, weight)
        except SlurmCommandError as exc:
            done.errors.append(f"weight {weight} for {','.join(names)}: {exc}")
            continue
        done.changed[weight] = names
    return done


def name_order_warnings(config: SpotConfig, version: SlurmVersion | None) -> list[str]:
    """One line per partition whose node sets Slurm would not try in the cost order while
    their nodes are powered down: ``[]`` on Slurm 23.02 and newer, which orders powered-down
    nodes by Weight (:attr:`SlurmVersion.powered_down_weight`); before (or ``version`` None,
    Slurm unknown) the powered-down node first in slurmctld's node table gets the job, and that
    table is sorted by node name (:func:`slurm_spot.hostlist.slurm_node_order`), whatever the
    order of the NodeName lines, the partition's ``Nodes=`` or the Weights. A partition is fine
    when its nodes in that name order have non-decreasing :func:`static_weights`.

    Each line names the partition, the node sets in name order and in cost order (with their
    Weights), and what to do (rename, or Slurm 23.02+). Pure but for the catalogue prices
    :func:`static_weights` reads.
    """
    if version is not None and version.powered_down_weight:
        return []
    weights = static_weights(config)
    slurm = f"Slurm {version}" if version is not None else "Slurm before 23.02"
    lines = []
    for index, part in enumerate(config.partitions):
        if len(part.node_sets) < 2:
            continue
        owner = {n: name for name in part.node_sets for n in config.node_set(name).node_names}
        in_name_order = slurm_node_order(owner)
        ordered = [weights[owner[n]] for n in in_name_order]
        if all(a <= b for a, b in pairwise(ordered)):
            continue
        seen = ", ".join(dict.fromkeys(owner[n] for n in in_name_order))
        by_cost = ", ".join(f"{name} (Weight {weights[name]})" for name in sorted(
            part.node_sets, key=lambda name: (weights[name], part.node_sets.index(name))))
        lines.append(
            f"partitions.{index}.node_sets: partition {part.name}: node sets {seen} sort by "
            f"name in another order than their cost order {by_cost}: "
            f"{slurm} gives a job the first powered-down node by name "
            f"({in_name_order[0]}), not by Weight. Rename the node sets so their "
            f"names sort in the cost order, or run Slurm 23.02 or newer "
            f"(docs/admin.md, 'What Weight can do while nodes are powered down')."
        )
    return lines
