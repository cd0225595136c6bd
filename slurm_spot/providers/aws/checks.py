"""Offline checks of an AWS node set for ``slurm-spot config check``.

Each problem is one line that starts with the field path (``node_sets.0.aws.subnets: ...``),
like every other configuration error. No AWS call is made: zones come from ``aws.subnet_zones``
and shapes from the shipped catalogue.

Facts checked (EC2 User Guide): an EC2 Fleet request cannot use two subnets of one
Availability Zone ("EC2 Fleet limitations"); stop and hibernate interruption behaviours need a
fleet of type ``maintain`` ("Behavior of Spot Instance interruptions"), while slurm-spot launches
``instant`` fleets; a spot MaxPrice must be above USD 0.001 (SpotMarketOptions).
"""

from __future__ import annotations

from collections import defaultdict

from slurm_spot.config import NodeSetConfig
from slurm_spot.providers.aws.catalog import catalogue

#: Above this a max price is a typo (the dearest GPU instances cost under USD 100/h on demand).
ABSURD_PRICE_USD_PER_HOUR = 1000.0
MIN_PRICE_USD_PER_HOUR = 0.001


def check_aws_node_set(node_set: NodeSetConfig, where: str) -> list[str]:
    """Problems of ``node_set``'s AWS settings, each naming its field under ``where``
    (``node_sets.0``). Empty when there is nothing to say or no ``aws`` section."""
    opts = node_set.aws
    if opts is None:
        return []
    problems: list[str] = []
    field = f"{where}.aws"
    seen: set[str] = set()
    for k, subnet in enumerate(opts.subnets):
        if subnet in seen:
            problems.append(f"{field}.subnets.{k}: subnet {subnet} is listed twice")
        seen.add(subnet)
    by_zone: dict[str, list[str]] = defaultdict(list)
    for subnet in dict.fromkeys(opts.subnets):
        if subnet in opts.subnet_zones:
            by_zone[opts.subnet_zones[subnet]].append(subnet)
    for zone, subnets in sorted(by_zone.items()):
        if len(subnets) > 1:
            problems.append(
                f"{field}.subnets: {' and '.join(subnets)} are both in availability zone {zone}; "
                "one EC2 Fleet request cannot use two subnets of one zone: keep one per zone"
            )
    for subnet in opts.subnet_zones:
        if subnet not in opts.subnets:
            problems.append(f"{field}.subnet_zones: {subnet} is not one of aws.subnets")
    if opts.interruption_behavior != "terminate":
        problems.append(
            f"{field}.interruption_behavior: {opts.interruption_behavior!r} needs an EC2 Fleet "
            "of type 'maintain'; slurm-spot launches 'instant' fleets, which only terminate: "
            "use 'terminate' (jobs are requeued and resume from their checkpoint)"
        )
    price = opts.max_price_usd_per_hour
    if price is not None and price <= MIN_PRICE_USD_PER_HOUR:
        problems.append(
            f"{field}.max_price_usd_per_hour: {price} USD/h is not above the EC2 minimum of "
            f"{MIN_PRICE_USD_PER_HOUR}; remove it to pay the current spot price"
        )
    elif price is not None and price > ABSURD_PRICE_USD_PER_HOUR:
        problems.append(
            f"{field}.max_price_usd_per_hour: {price} USD/h per instance is absurd (more than "
            f"{ABSURD_PRICE_USD_PER_HOUR:g}); a typo? it is per instance-hour, not a budget"
        )
    if node_set.market == "on-demand" and price is not None:
        problems.append(f"{field}.max_price_usd_per_hour: only applies to spot node sets")
    problems.extend(_instance_type_problems(node_set, where))
    return problems


def _instance_type_problems(node_set: NodeSetConfig, where: str) -> list[str]:
    if not node_set.instance_types:
        return [f"{where}.instance_types: an AWS node set needs at least one instance type"]
    known = catalogue()
    problems = []
    shape_set = {"cpus", "memory_mib", "gpus"} <= node_set.model_fields_set
    for k, instance_type in enumerate(node_set.instance_types):
        if instance_type not in known and not shape_set:
            problems.append(
                f"{where}.instance_types.{k}: {instance_type!r} is not in the instance-type "
                "catalogue (slurm_spot/data/aws_instance_types.yaml): check the name, or set "
                "cpus, memory_mib and gpus of the node set explicitly"
            )
    return problems
