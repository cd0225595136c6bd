"""Checks of a loaded config that go beyond its schema: provider-specific rules.

Each problem is one line that names the field (``node_sets.0.aws.subnets``) and the reason.
"""

from __future__ import annotations

from slurm_spot.config import AwsProviderConfig, GcpProviderConfig, SpotConfig


def check_config(config: SpotConfig) -> list[str]:
    """Problems the schema cannot see (empty list: fine). Imports a provider's checks only
    when a node set of that provider exists."""
    problems: list[str] = []
    for i, ns in enumerate(config.node_sets):
        where = f"node_sets.{i}"
        settings = config.providers[ns.provider]
        if isinstance(settings, AwsProviderConfig):
            from slurm_spot.providers.aws.checks import check_aws_node_set

            problems.extend(check_aws_node_set(ns, where))
        elif isinstance(settings, GcpProviderConfig):
            from slurm_spot.providers.gcp.checks import check_gcp_node_set

            problems.extend(check_gcp_node_set(ns, settings, where, cluster=config.cluster))
    return problems
