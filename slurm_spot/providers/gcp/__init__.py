"""The ``gcp`` provider: Compute Engine SPOT VMs through ``bulk_insert``.

Modules: :mod:`.provider` (the :class:`~slurm_spot.providers.base.Provider`), :mod:`.launch`
(the launch state machine), :mod:`.requests` (pure request builders and parsers), :mod:`.api`
(the only code touching google-cloud-compute), :mod:`.errors` (the error-code table),
:mod:`.checks` (config checks), :mod:`.notices` (the metadata-server preemption notice),
:mod:`.events` (the zones' preemption operations, for the reconciler), :mod:`.prices` (the
catalogue ``prices.yaml``), :mod:`.shapes` (GPUs and vCPUs from a machine type's name),
:mod:`.iam` (the permissions ``config iam`` prints). Importing this package imports no
Google library: the functions below, the provider type's entry points
(:class:`~slurm_spot.providers.base.ProviderPackage`), import on call.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from slurm_spot.config import GcpProviderConfig, NodeSetConfig, ProviderSettings, SpotConfig
from slurm_spot.providers.base import ErrorClass, expect_settings, normalize_code

if TYPE_CHECKING:
    from slurm_spot.providers.base import Finding, Provider
    from slurm_spot.providers.events import EventSource
    from slurm_spot.providers.notices import NoticeSource
    from slurm_spot.providers.prices import PriceSource


def make_provider(config: SpotConfig, name: str, settings: ProviderSettings) -> Provider:
    """A :class:`~.provider.GcpProvider` (google-cloud-compute is imported on first use)."""
    from slurm_spot.providers.gcp.provider import GcpProvider

    return GcpProvider(config, name, expect_settings(settings, GcpProviderConfig, name))


def check_node_set(config: SpotConfig, index: int) -> list[str]:
    """Zones, machine type or template, instance-name length (:mod:`.checks`)."""
    from slurm_spot.providers.gcp.checks import check_gcp_node_set

    ns = config.node_sets[index]
    settings = expect_settings(config.providers[ns.provider], GcpProviderConfig, ns.provider)
    return check_gcp_node_set(ns, settings, f"node_sets.{index}", cluster=config.cluster)


def event_source(config: SpotConfig, name: str, settings: ProviderSettings) -> EventSource | None:
    """The preemption operations of the zones of ``name``'s node sets (:mod:`.events`); None
    when ``preemption_events`` is false or no node set uses the provider."""
    gcp = expect_settings(settings, GcpProviderConfig, name)
    zones = {z for ns in config.node_sets if ns.provider == name and ns.gcp for z in ns.gcp.zones}
    if not gcp.preemption_events or not zones:
        return None
    from slurm_spot.providers.gcp.events import PreemptionOperations

    return PreemptionOperations(name, gcp, zones)


def check_online(config: SpotConfig, name: str) -> list[Finding]:
    """Zones, machine and accelerator types per zone, image, network and subnetwork,
    instance template, regional quotas and the credentials' permissions (:mod:`.online`)."""
    from slurm_spot.providers.gcp.online import check_gcp_online

    return check_gcp_online(config, name)


def node_shape(config: SpotConfig, index: int) -> NodeSetConfig:
    """CPUs, memory and GPUs filled from the node set's machine types where the admin left
    them unset (:func:`.shapes.resolve_node_set_shape`)."""
    from slurm_spot.providers.gcp.shapes import resolve_node_set_shape

    node_set = config.node_sets[index]
    return resolve_node_set_shape(node_set, instance_types(config, node_set),
                                  where=f"node_sets.{index}", path=str(config.source_path))


def notice_source(config: SpotConfig, node: str, settings: ProviderSettings) -> NoticeSource:
    """The metadata server's ``instance/preempted`` (:mod:`.notices`)."""
    from slurm_spot.providers.gcp.notices import GceMetadataNoticeSource

    return GceMetadataNoticeSource()


def capacity_codes() -> frozenset[str]:
    """The CAPACITY rows of :data:`.errors.GCP_ERROR_CLASSES`."""
    from slurm_spot.providers.gcp.errors import GCP_ERROR_CLASSES

    return frozenset(normalize_code(code) for code, error_class in GCP_ERROR_CLASSES.items()
                     if error_class is ErrorClass.CAPACITY)


def instance_identity(config: SpotConfig, node: str,
                      settings: ProviderSettings) -> tuple[str, str] | None:
    """The metadata server's ``instance/name`` (slurm-spot's GCE instance id is the name) and
    the short form of ``instance/machine-type`` (:mod:`.notices`).

    Raises:
        ProviderError: the metadata server cannot be read.
    """
    from slurm_spot.providers.gcp.notices import instance_identity as metadata_identity

    return metadata_identity()


def price_source(config: SpotConfig | None, name: str | None, live: bool = False,
                 live_on_demand: bool = False) -> PriceSource:
    """The prices of provider ``name`` (:func:`.prices.price_source`: the shipped catalogue;
    nothing is asked of Google, so ``live`` and ``live_on_demand`` change nothing)."""
    from slurm_spot.providers.gcp.prices import price_source as gcp_prices

    return gcp_prices(config, name)


def permissions(config: SpotConfig, name: str) -> dict[str, dict[str, object]] | None:
    """The controller's permissions and roles (:func:`.iam.grants`)."""
    from slurm_spot.providers.gcp.iam import grants

    return grants(config, name)


def instance_types(config: SpotConfig, node_set: NodeSetConfig) -> list[str]:
    """``gcp.machine_type`` first (when set and not listed), then ``instance_types``."""
    found = list(node_set.instance_types)
    if node_set.gcp is not None and node_set.gcp.machine_type and \
            node_set.gcp.machine_type not in found:
        found.insert(0, node_set.gcp.machine_type)
    return found
