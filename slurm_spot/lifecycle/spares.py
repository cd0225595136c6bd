"""Hot spares (issue 26): ``spares: N`` on a node set keeps N of its nodes powered up and
idle, so that a job (a job requeued after a reclaim without notice too) starts on a node that
is already up instead of waiting for a boot.

Two parts, Slurm's own where it has one:

- Slurm keeps idle spares up: ``SuspendExcNodes=<node set hostlist>:<N>`` in the rendered
  fragment (:func:`slurm_spot.render.suspend_exc_nodes`; slurm.conf(5), 22.05 to 26.05:
  prevents N nodes of the set from being powered down). Through 23.11 N counts idle nodes
  only; from 24.05 busy nodes count too, so the reconciler raises N by the busy nodes each
  pass (``scontrol update SuspendExcNodes=``, :func:`suspend_exc_value`).
- The reconciler powers spares up (:func:`spares_to_power_up`, each pass): Slurm's form
  never powers a node up, so without it a node set would have no spare after
  ``slurm-spot local up`` or once a job took the spare.

A spare is a node of the set that is up, idle, runs no job and may take one, or one booting
without a job (``idle#``, a spare on its way). Nodes powered up are chosen as Slurm would
schedule them in the set: in name order (``spot-2`` before ``spot-10``), never a drained,
down or cooling-down node; a node set cooling down after a capacity error gets none (its
launches would fail).
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass
from datetime import datetime

from slurm_spot.config import SpotConfig
from slurm_spot.lifecycle.prewarm import BLOCKING_FLAGS, can_power_up, is_ready_replacement, natural_order
from slurm_spot.slurm.client import Node


def is_spare(node: Node) -> bool:
    """Idle and up (:func:`slurm_spot.lifecycle.prewarm.is_ready_replacement`), or booting without a
    job (``IDLE+POWERING_UP``, not drained or down): it counts as one of its set's spares."""
    if is_ready_replacement(node):
        return True
    return (node.state.base == "IDLE" and node.state.is_powering_up and not node.jobs
            and not node.state.flags & BLOCKING_FLAGS)


def is_busy(node: Node) -> bool:
    """Runs a job and is powered up, not drained: what Slurm 24.05+ counts against a node
    set's ``SuspendExcNodes`` count (``_node_state_active`` in ``src/slurmctld/power_save.c``:
    allocated, not powering up or down, not powered down, not drained)."""
    flags = node.state.flags
    return ((node.state.base in ("ALLOCATED", "MIXED") or bool(node.jobs))
            and not node.state.is_powered_down and not node.state.is_powering_up
            and not node.state.is_powering_down and not node.state.is_drained
            and "NOT_RESPONDING" not in flags)


def suspend_exc_value(config: SpotConfig, nodes: Sequence[Node] = (),
                      counts_busy: bool = False) -> str | None:
    """slurm.conf's ``SuspendExcNodes`` for the node sets with ``spares``: ``<node set
    hostlist>:<count>`` each, comma separated (``spot-[1-4]:1,gpu-[1-8]:2``), or None when no
    node set has spares.

    ``count`` is ``spares``; with ``counts_busy`` (Slurm 24.05+, :attr:`slurm_spot.slurm.
    version.SlurmVersion.suspend_exc_counts_busy`), ``spares`` plus the node set's busy
    ``nodes`` (:func:`is_busy`), at most the node set's size, so that ``spares`` *idle* nodes
    stay kept on every release.
    """
    specs = []
    for ns in config.node_sets:
        if ns.spares <= 0:
            continue
        count = ns.spares
        if counts_busy:
            count += sum(1 for n in nodes if is_busy(n)
                         and (of := config.node_set_of(n.name)) is not None and of.name == ns.name)
        specs.append(f"{ns.hostlist}:{min(count, ns.count)}")
    return ",".join(specs) or None


@dataclass(frozen=True)
class SpareShortfall:
    """One node set short of spares.

    Attributes:
        node_set: its name.
        wanted: its ``spares``.
        have: nodes counting as spares now (:func:`is_spare`).
        power_up: the powered-down nodes to power up now, in name order (fewer than
            ``wanted - have`` when no more can be).
    """

    node_set: str
    wanted: int
    have: int
    power_up: tuple[str, ...]


def spares_to_power_up(config: SpotConfig, nodes: Sequence[Node], now: datetime,
                       unavailable: Collection[str] = ()) -> list[SpareShortfall]:
    """The node sets with ``spares`` that have fewer spares than that, and which of their
    nodes to power up (pure).

    Args:
        config: the node sets and their ``spares``.
        nodes: Slurm's nodes now.
        now: aware UTC, for the cooldowns (:func:`slurm_spot.lifecycle.weights.cooling_node_sets`).
        unavailable: node sets to leave alone (their provider could not be listed).
    """
    from slurm_spot.lifecycle.weights import cooling_node_sets

    cooling = cooling_node_sets(config, nodes, now)
    short = []
    for ns in config.node_sets:
        if ns.spares <= 0 or ns.name in unavailable or ns.name in cooling:
            continue
        members = [n for n in nodes if (of := config.node_set_of(n.name)) is not None
                   and of.name == ns.name]
        have = sum(1 for n in members if is_spare(n))
        if have >= ns.spares:
            continue
        cold = sorted((n for n in members if can_power_up(n)), key=lambda n: natural_order(n.name))
        short.append(SpareShortfall(ns.name, ns.spares, have,
                                    tuple(n.name for n in cold[:ns.spares - have])))
    return short
