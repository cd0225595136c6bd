"""Checks of a GCP node set beyond the schema (``slurm-spot config check``). Pure.

Rules, each from the Compute Engine documentation:

- instance names (``<cluster>-<node>``) must be valid resource names: ``[a-z]([-a-z0-9]*
  [a-z0-9])?``, at most 63 characters;
- zones must lie in the provider's region (``us-central1-a`` is in ``us-central1``): a
  regional bulk insert only places VMs in its own region;
- a node set is Spot (``market: spot``, ``provisioningModel=SPOT``) or legacy preemptible
  (``preemptible: true``), not both;
- no ``instanceTerminationAction=STOP`` with local SSDs: a stopped Spot VM's local SSD data
  is discarded or the stop refused, depending on ``onInstanceStopAction`` and API version, and
  a node whose scratch vanished must not come back as if nothing happened (issue 6);
- instances need an instance template, or a machine type and an image.
"""

from __future__ import annotations

from slurm_spot.config import GcpProviderConfig, NodeSetConfig
from slurm_spot.providers.gcp.requests import (
    MAX_NAME_LEN,
    instance_name,
    is_valid_instance_name,
)


def check_gcp_node_set(
    node_set: NodeSetConfig, provider_settings: GcpProviderConfig, where: str,
    cluster: str | None = None,
) -> list[str]:
    """Problems of one GCP node set (empty list: fine), each naming the field under
    ``where`` (``node_sets.0``), e.g. ``node_sets.0.gcp.zones.1: ...``.

    Args:
        node_set: the node set.
        provider_settings: its provider (for the region).
        where: the node set's dotted path in the config.
        cluster: the cluster name, which prefixes every instance name; without it only the
            node names themselves are checked.
    """
    opts = node_set.gcp
    if opts is None:
        return [f"{where}.gcp: required for a node set of a 'gcp' provider"]
    problems = _name_problems(node_set, where, cluster)
    region = provider_settings.region
    for i, zone in enumerate(opts.zones):
        if zone.rsplit("-", 1)[0] != region:
            problems.append(f"{where}.gcp.zones.{i}: zone {zone!r} is not in the provider's "
                            f"region {region!r}")
    if opts.preemptible and node_set.market == "spot":
        problems.append(f"{where}.gcp.preemptible: a node set is either Spot (market: spot) "
                        "or legacy preemptible, not both")
    if opts.termination_action == "STOP" and opts.local_ssds > 0:
        problems.append(f"{where}.gcp.termination_action: STOP is not allowed with local "
                        f"SSDs (local_ssds: {opts.local_ssds}); use DELETE")
    if not opts.instance_template and not (opts.machine_type and opts.image):
        missing = [f for f in ("machine_type", "image") if not getattr(opts, f)]
        problems.append(f"{where}.gcp.{missing[0]}: set instance_template, or machine_type and "
                        f"image (missing: {', '.join(missing)})")
    return problems


def _name_problems(node_set: NodeSetConfig, where: str, cluster: str | None) -> list[str]:
    """One line for the node set if any of its instance names is invalid (the longest
    name is the last node's)."""
    last = node_set.node_names[-1]
    name = instance_name(cluster, last) if cluster else last
    if is_valid_instance_name(name):
        return []
    length = f"{len(name)} characters, at most {MAX_NAME_LEN}" if len(name) > MAX_NAME_LEN \
        else "only lowercase letters, digits and '-', starting with a letter"
    return [f"{where}.name: instance name {name!r} (cluster-node) is not a valid GCE name "
            f"({length})"]
