"""The ``local`` provider: ``slurmd`` processes on this machine with a simulated spot market.

Modules: :mod:`.provider` (the :class:`~slurm_spot.providers.base.Provider`), :mod:`.boot`
(the detached boot of one instance), :mod:`.notices` (the notice-file source), :mod:`.events`
(the events file the reconciler follows between passes).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from slurm_spot.config import LocalProviderConfig, NodeSetConfig, ProviderSettings, SpotConfig
from slurm_spot.providers.base import expect_settings, normalize_code

if TYPE_CHECKING:
    from slurm_spot.providers.base import Finding, Provider
    from slurm_spot.providers.events import EventSource
    from slurm_spot.providers.notices import NoticeSource
    from slurm_spot.providers.prices import PriceSource


def make_provider(config: SpotConfig, name: str, settings: ProviderSettings) -> Provider:
    """A :class:`~.provider.LocalProvider`."""
    from slurm_spot.providers.local.provider import LocalProvider

    return LocalProvider(config, name, expect_settings(settings, LocalProviderConfig, name))


def check_node_set(config: SpotConfig, index: int) -> list[str]:
    """Nothing beyond the schema."""
    return []


def check_online(config: SpotConfig, name: str) -> list[Finding]:
    """Nothing to ask: the local provider has no cloud (``slurmd`` is checked offline)."""
    return []


def event_source(config: SpotConfig, name: str, settings: ProviderSettings) -> EventSource:
    """The provider's events file ``<state_dir>/local/events.jsonl`` (:mod:`.events`): every
    end of a local instance, a reclaim without notice included, read within ~0.1 s."""
    from slurm_spot.providers.local.events import LocalEventSource, events_path

    expect_settings(settings, LocalProviderConfig, name)
    return LocalEventSource(name, events_path(config.state_dir))


def node_shape(config: SpotConfig, index: int) -> NodeSetConfig:
    """The node set as written."""
    return config.node_sets[index]


def notice_source(config: SpotConfig, node: str, settings: ProviderSettings) -> NoticeSource:
    """The notice file ``<state_dir>/local/notices/<node>.json`` (:mod:`.notices`)."""
    from slurm_spot.providers.local.notices import LocalNoticeSource

    local = expect_settings(settings, LocalProviderConfig)
    return LocalNoticeSource(config.state_dir / "local" / "notices" / f"{node}.json",
                             local.notice_poll_s)


def capacity_codes() -> frozenset[str]:
    """The one code of the simulated market (EC2's, so the same rules apply)."""
    from slurm_spot.providers.local.provider import CAPACITY_CODE

    return frozenset({normalize_code(CAPACITY_CODE)})


def instance_identity(config: SpotConfig, node: str,
                      settings: ProviderSettings) -> tuple[str, str] | None:
    """None: a local node's slurmd is started by the provider itself, not by systemd."""
    return None


def price_source(config: SpotConfig | None, name: str | None, live: bool = False,
                 live_on_demand: bool = False) -> PriceSource:
    """No shipped prices: a local node's price is spot.yaml's ``cost`` (the default local
    config carries :data:`~slurm_spot.config.LOCAL_COST`); without one a lookup raises
    UnknownPriceError naming the key to set."""
    from slurm_spot.providers.prices import CataloguePrices

    return CataloguePrices("local", dict)


def permissions(config: SpotConfig, name: str) -> dict[str, dict[str, object]] | None:
    """None: local instances are processes on this machine, no cloud grants anything."""
    return None


def instance_types(config: SpotConfig, node_set: NodeSetConfig) -> list[str]:
    """The node set's ``instance_types`` (which only name a price in spot.yaml ``cost``, so a
    local cluster can rehearse the cost order), else ``local``."""
    return list(node_set.instance_types) or ["local"]
