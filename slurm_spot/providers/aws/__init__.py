"""The ``aws`` provider: EC2 spot instances through ``create_fleet`` (type ``instant``).

Modules: :mod:`.provider` (the :class:`~slurm_spot.providers.base.Provider`), :mod:`.launch`
and :mod:`.fleet` (the launch plan and its I/O seam), :mod:`.errors` (the error-code table),
:mod:`.catalog` (instance shapes, ``instance_types.yaml``), :mod:`.checks` (config checks),
:mod:`.notices` (the IMDSv2 interruption notice), :mod:`.prices` (spot, on-demand and catalogue
prices), :mod:`.session` (the one boto3 session builder), :mod:`.events` (EventBridge events through
SQS, for the reconciler). Importing this package imports no boto3.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from slurm_spot.config import AwsProviderConfig, NodeSetConfig, ProviderSettings, SpotConfig
from slurm_spot.providers.base import ErrorClass, expect_settings, normalize_code

if TYPE_CHECKING:
    from slurm_spot.providers.base import Finding, Provider
    from slurm_spot.providers.events import EventSource
    from slurm_spot.providers.notices import NoticeSource
    from slurm_spot.providers.prices import PriceSource


def make_provider(config: SpotConfig, name: str, settings: ProviderSettings) -> Provider:
    """An :class:`~.provider.AwsProvider` (imports boto3)."""
    from slurm_spot.providers.aws.provider import AwsProvider

    return AwsProvider(config, name, expect_settings(settings, AwsProviderConfig, name))


def check_node_set(config: SpotConfig, index: int) -> list[str]:
    """Subnets, zones, instance types and the catalogue (:mod:`.checks`)."""
    from slurm_spot.providers.aws.checks import check_aws_node_set

    return check_aws_node_set(config.node_sets[index], f"node_sets.{index}")


def check_online(config: SpotConfig, name: str) -> list[Finding]:
    """Subnets and their zones, the launch template and version, instance types offered
    per zone, vCPU quotas, a DryRun launch and the credentials' permissions (:mod:`.online`)."""
    from slurm_spot.providers.aws.online import check_aws_online

    return check_aws_online(config, name)


def node_shape(config: SpotConfig, index: int) -> NodeSetConfig:
    """CPUs, memory and GPUs filled from the node set's EC2 instance types where the admin
    left them unset (:mod:`.catalog`)."""
    from slurm_spot.providers.aws.catalog import resolve_node_set_shape

    return resolve_node_set_shape(config.node_sets[index], where=f"node_sets.{index}",
                                  path=str(config.source_path))


def notice_source(config: SpotConfig, node: str, settings: ProviderSettings) -> NoticeSource:
    """IMDSv2 ``spot/instance-action`` (:mod:`.notices`)."""
    from slurm_spot.providers.aws.notices import ImdsNoticeSource

    return ImdsNoticeSource()


def event_source(config: SpotConfig, name: str, settings: ProviderSettings) -> EventSource | None:
    """EC2's spot interruption warnings and state changes from ``events_queue_url`` (an SQS
    queue an EventBridge rule fills, :mod:`.events`); None when it is not set."""
    aws = expect_settings(settings, AwsProviderConfig, name)
    if not aws.events_queue_url:
        return None
    from slurm_spot.providers.aws.events import SqsEventSource

    return SqsEventSource(name, aws)


def capacity_codes() -> frozenset[str]:
    """The CAPACITY rows of :data:`.errors.ERROR_TABLE`."""
    from slurm_spot.providers.aws.errors import ERROR_TABLE

    return frozenset(normalize_code(code) for code, kind in ERROR_TABLE.items()
                     if kind.error_class is ErrorClass.CAPACITY)


def instance_identity(config: SpotConfig, node: str,
                      settings: ProviderSettings) -> tuple[str, str] | None:
    """IMDS ``meta-data/instance-id`` and ``instance-type`` (IMDSv2; the endpoint is
    ``$AWS_EC2_METADATA_SERVICE_ENDPOINT`` or 169.254.169.254, :mod:`.notices`).

    Raises:
        ProviderError: IMDS cannot be reached or has no instance id.
    """
    from slurm_spot.errors import ProviderError
    from slurm_spot.providers.aws.notices import ImdsError
    from slurm_spot.providers.aws.notices import instance_identity as imds_identity

    try:
        found = imds_identity()
    except ImdsError as exc:
        raise ProviderError("IMDS_UNREADABLE", str(exc)) from None
    return found.instance_id, found.instance_type


def price_source(config: SpotConfig | None, name: str | None, live: bool = False,
                 live_on_demand: bool = False) -> PriceSource:
    """The prices of provider ``name`` (:func:`.prices.price_source`): the catalogue, and
    with ``live`` DescribeSpotPriceHistory, with ``live_on_demand`` the Price List API (boto3
    imported only when a price is first asked)."""
    from slurm_spot.providers.aws.prices import price_source as aws_prices

    return aws_prices(config, name, live, live_on_demand)


def permissions(config: SpotConfig, name: str) -> dict[str, dict[str, object]] | None:
    """The IAM policies of the controller, the checkpoint store and the nodes
    (:func:`.iam.grants`)."""
    from slurm_spot.providers.aws.iam import grants

    return grants(config)


def instance_types(config: SpotConfig, node_set: NodeSetConfig) -> list[str]:
    """The node set's ``instance_types`` (CreateFleet's overrides)."""
    return list(node_set.instance_types)
