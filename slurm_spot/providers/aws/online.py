"""``config check --online`` for AWS: ask EC2, Service Quotas and IAM about each node set,
with read-only calls and a DryRun of the launch.

Per node set of the provider (every finding names its spot.yaml field):

- ``DescribeSubnets`` (filtered by id: a missing subnet is absent, not an error of the whole
  call): each subnet exists, its zone is what ``aws.subnet_zones`` says, one subnet per zone
  (one EC2 Fleet request cannot use two subnets of a zone: EC2 User Guide, "EC2 Fleet
  limitations");
- ``DescribeLaunchTemplates`` / ``DescribeLaunchTemplateVersions``: the template and its version;
- ``DescribeInstanceTypeOfferings`` (location type ``availability-zone``): each instance type is
  offered in the subnets' zones; in none is an error, in some a warning;
- Service Quotas ``GetServiceQuota``: the vCPU limit of the instance family's bucket for the
  market (and the fallback's) holds one node (else error) and all nodes (else warning);
- ``CreateFleet`` with ``DryRun``: EC2 answers ``DryRunOperation`` when the request is valid and
  allowed, ``UnauthorizedOperation`` when the credentials may not launch (EC2 API Reference,
  "DryRun" and "Common client error codes").

Once per provider: ``sts:GetCallerIdentity`` (fails: the credentials are refused, and nothing
else is asked), then ``iam:SimulatePrincipalPolicy`` of the controller's actions
(:mod:`.iam`) for the caller; a refused or unavailable simulation, like a refused quota read,
is a warning. moto (the tests' EC2) has no EC2 quotas and no policy simulation: both give
warnings there (tests/test_config_online_aws.py).
"""

from __future__ import annotations

import logging
import re
from collections import defaultdict
from collections.abc import Callable
from typing import Any

from slurm_spot.config import AwsProviderConfig, NodeSetConfig, SpotConfig
from slurm_spot.providers.aws.catalog import catalogue
from slurm_spot.providers.aws.fleet import FleetSpec, Pool, build_create_fleet_params
from slurm_spot.providers.aws.iam import actions
from slurm_spot.providers.base import TAG_CLUSTER, Finding, expect_settings

log = logging.getLogger(__name__)

#: Service Quotas codes (service ``ec2``) of the vCPU-based instance limits, by instance
#: family bucket: (on-demand, spot). From the Service Quotas console, Amazon EC2, "Running
#: On-Demand <bucket> instances" and "All <bucket> Spot Instance Requests".
VCPU_QUOTAS: dict[str, tuple[str, str]] = {
    "standard": ("L-1216C47A", "L-34B43A08"),  # A, C, D, H, I, M, R, T, Z
    "g": ("L-DB2E81BA", "L-3819A6DF"),  # G and VT
    "p": ("L-417A185B", "L-7212CCBC"),
    "f": ("L-74FC7D96", "L-88CF9481"),
    "x": ("L-7295265B", "L-E3A00192"),
    "inf": ("L-1945791B", "L-B5D1601B"),
}
_STANDARD = set("acdhimrtz")


def quota_bucket(instance_type: str) -> str | None:
    """The vCPU quota bucket of ``instance_type`` (``g5.xlarge`` -> ``g``, ``m7i.large`` ->
    ``standard``, ``vt1.3xlarge`` -> ``g``), or None when unknown (``trn1``, ``dl1``)."""
    family = instance_type.split(".", 1)[0]
    if family.startswith("inf"):
        return "inf"
    if family.startswith("vt"):
        return "g"
    letters = re.match(r"[a-z]+", family)
    if letters is None:
        return None
    if letters.group() in ("g", "p", "f", "x"):
        return letters.group()
    if len(letters.group()) == 1 and letters.group() in _STANDARD:
        return "standard"
    if letters.group() in ("u",):  # high memory u-* count as standard
        return "standard"
    return None


def check_aws_online(config: SpotConfig, name: str, session: Any = None) -> list[Finding]:
    """The findings for provider ``name`` (see the module docstring).

    Args:
        config: the configuration.
        name: the provider's key under ``providers:``.
        session: a ``boto3.session.Session`` (tests); default: the provider's own
            (:func:`~.session.boto_session`: profile, credentials file).
    """
    from botocore.config import Config

    from slurm_spot.providers.aws.session import boto_session

    settings = expect_settings(config.providers[name], AwsProviderConfig, name)
    session = session or boto_session(settings)
    retries = Config(retries={"mode": "standard", "total_max_attempts": 3}, connect_timeout=5,
                     read_timeout=30)

    def client(service: str) -> Any:
        endpoint = settings.endpoint_url if service == "ec2" else None
        return session.client(service, region_name=settings.region, endpoint_url=endpoint or None,
                              config=retries)

    checker = _Checker(config, name, settings, client)
    return checker.run()


class _Checker:
    def __init__(self, config: SpotConfig, name: str, settings: AwsProviderConfig,
                 client: Any) -> None:
        self.config = config
        self.name = name
        self.settings = settings
        self.client = client
        self.ec2 = client("ec2")
        self.findings: list[Finding] = []

    def error(self, field: str, message: str) -> None:
        self.findings.append(Finding(field, message, "error"))

    def warn(self, field: str, message: str) -> None:
        self.findings.append(Finding(field, message, "warning"))

    def run(self) -> list[Finding]:
        from botocore.exceptions import BotoCoreError, ClientError

        where = f"providers.{self.name}"
        try:
            arn = self.client("sts").get_caller_identity()["Arn"]
        except (ClientError, BotoCoreError) as exc:
            self.error(where, f"cannot use the AWS credentials in region {self.settings.region}: "
                       f"{_describe(exc)}; nothing else was checked")
            return self.findings
        for index, ns in enumerate(self.config.node_sets):
            if ns.provider == self.name and ns.aws is not None:
                self.node_set(index, ns)
        self.permissions(arn, where)
        return self.findings

    # -- one node set ------------------------------------------------------------------------
    def node_set(self, index: int, ns: NodeSetConfig) -> None:
        from botocore.exceptions import BotoCoreError, ClientError

        assert ns.aws is not None
        where = f"node_sets.{index}"
        try:
            zones = self.subnets(where, ns)
            template_ok = self.template(where, ns)
            self.offerings(where, ns, sorted(set(zones.values())))
            self.quotas(where, ns)
            if zones and len(zones) == len(set(ns.aws.subnets)) and template_ok:
                self.dry_run(where, ns, zones)
        except (ClientError, BotoCoreError) as exc:
            self.error(f"{where}.aws", f"EC2 refused a read-only call: {_describe(exc)}")

    def subnets(self, where: str, ns: NodeSetConfig) -> dict[str, str]:
        """subnet -> zone of the node set's subnets that exist."""
        assert ns.aws is not None
        reply = self.ec2.describe_subnets(
            Filters=[{"Name": "subnet-id", "Values": list(dict.fromkeys(ns.aws.subnets))}])
        zones = {s["SubnetId"]: s["AvailabilityZone"] for s in reply.get("Subnets", [])}
        for k, subnet in enumerate(ns.aws.subnets):
            if subnet not in zones:
                self.error(f"{where}.aws.subnets.{k}", f"subnet {subnet} does not exist in "
                           f"region {self.settings.region} (or these credentials cannot see it)")
        for subnet, said in ns.aws.subnet_zones.items():
            if subnet in zones and zones[subnet] != said:
                self.error(f"{where}.aws.subnet_zones.{subnet}", f"says {said}, but EC2 has "
                           f"{subnet} in {zones[subnet]}")
        by_zone: dict[str, list[str]] = defaultdict(list)
        for subnet, zone in zones.items():
            by_zone[zone].append(subnet)
        for zone, subnets in sorted(by_zone.items()):
            if len(subnets) > 1 and not ns.aws.subnet_zones:  # else the offline check says it
                self.error(f"{where}.aws.subnets", f"{' and '.join(subnets)} are both in "
                           f"{zone}; one EC2 Fleet request cannot use two subnets of one zone")
        return zones

    def template(self, where: str, ns: NodeSetConfig) -> bool:
        """True if the launch template and its version exist."""
        assert ns.aws is not None
        name = ns.aws.launch_template
        by_id = re.fullmatch(r"lt-[0-9a-f]+", name) is not None
        key = {"LaunchTemplateIds": [name]} if by_id else {"LaunchTemplateNames": [name]}
        found = _described(lambda: self.ec2.describe_launch_templates(**key),
                           "LaunchTemplates", ("NotFound", "Malformed"))
        if not found:
            self.error(f"{where}.aws.launch_template", f"launch template {name!r} does not exist "
                       f"in region {self.settings.region}")
            return False
        version = ns.aws.launch_template_version
        versions = _described(lambda: self.ec2.describe_launch_template_versions(
            LaunchTemplateId=found[0]["LaunchTemplateId"], Versions=[version]),
            "LaunchTemplateVersions", ("NotFound",))
        if not versions:
            self.error(f"{where}.aws.launch_template_version", f"launch template {name!r} has "
                       f"no version {version!r}")
            return False
        return True

    def offerings(self, where: str, ns: NodeSetConfig, zones: list[str]) -> None:
        if not zones or not ns.instance_types:
            return
        offered: dict[str, set[str]] = defaultdict(set)
        paginator = self.ec2.get_paginator("describe_instance_type_offerings")
        for page in paginator.paginate(
                LocationType="availability-zone",
                Filters=[{"Name": "instance-type", "Values": list(dict.fromkeys(ns.instance_types))},
                         {"Name": "location", "Values": zones}]):
            for offer in page.get("InstanceTypeOfferings", []):
                offered[offer["InstanceType"]].add(offer["Location"])
        for k, instance_type in enumerate(ns.instance_types):
            missing = [z for z in zones if z not in offered[instance_type]]
            if len(missing) == len(zones):
                self.error(f"{where}.instance_types.{k}", f"{instance_type!r} is not offered in "
                           f"any zone of the node set's subnets ({', '.join(zones)})")
            elif missing:
                self.warn(f"{where}.instance_types.{k}", f"{instance_type!r} is not offered in "
                          f"{', '.join(missing)}: those pools are skipped")

    def quotas(self, where: str, ns: NodeSetConfig) -> None:
        from botocore.exceptions import BotoCoreError, ClientError

        markets = [ns.market] + (["on-demand"] if ns.fallback == "on-demand" else [])
        known = catalogue()
        for k, instance_type in enumerate(ns.instance_types):
            bucket = quota_bucket(instance_type)
            shape = known.get(instance_type)
            if bucket is None or shape is None:
                continue
            for market in markets:
                code = VCPU_QUOTAS[bucket][1 if market == "spot" else 0]
                try:
                    limit = float(self.client("service-quotas").get_service_quota(
                        ServiceCode="ec2", QuotaCode=code)["Quota"]["Value"])
                except (ClientError, BotoCoreError) as exc:
                    self.warn(f"{where}.instance_types.{k}", f"cannot read the {market} vCPU "
                              f"quota {code} of {instance_type!r} (not checked): "
                              f"{_describe(exc)}")
                    continue
                field = f"{where}.instance_types.{k}"
                if limit < shape.vcpus:
                    self.error(field, f"the {market} vCPU quota {code} is {limit:g}, below one "
                               f"{instance_type} ({shape.vcpus} vCPUs): no node can start; ask "
                               f"for a higher limit in Service Quotas")
                elif limit < shape.vcpus * ns.count:
                    self.warn(f"{where}.count", f"the {market} vCPU quota {code} ({limit:g}) "
                              f"holds {int(limit // shape.vcpus)} of the {ns.count} "
                              f"{instance_type} nodes at once")

    def dry_run(self, where: str, ns: NodeSetConfig, zones: dict[str, str]) -> None:
        from botocore.exceptions import ClientError

        assert ns.aws is not None
        spec = FleetSpec(
            template=ns.aws.launch_template, template_version=ns.aws.launch_template_version,
            pools=tuple(Pool(t, s, zones.get(s, "")) for t in ns.instance_types
                        for s in dict.fromkeys(ns.aws.subnets)),
            market=ns.market, count=1, allocation_strategy=ns.aws.allocation_strategy,
            max_price_usd_per_hour=ns.aws.max_price_usd_per_hour)
        if not spec.pools:
            return
        params = build_create_fleet_params(spec, [(TAG_CLUSTER, self.config.cluster)],
                                           "slurm-spot-config-check")
        try:
            self.ec2.create_fleet(DryRun=True, **params)
        except ClientError as exc:
            code = _code(exc)
            if code == "DryRunOperation":
                return
            if code == "UnauthorizedOperation":
                self.error(f"providers.{self.name}", f"these credentials may not launch node set "
                           f"{ns.name!r} (CreateFleet DryRun: UnauthorizedOperation); "
                           f"'slurm-spot config iam' prints the policy they need")
                return
            self.error(f"{where}.aws", f"a DryRun launch of node set {ns.name!r} was refused: "
                       f"{_describe(exc)}")
            return
        self.warn(f"{where}.aws", "the DryRun launch returned no DryRunOperation answer "
                  "(an endpoint that ignores DryRun?): launch not checked")

    # -- permissions ---------------------------------------------------------------------------
    def permissions(self, arn: str, where: str) -> None:
        needed = actions("controller", include_optional=False)
        principal = self.principal(arn)
        try:
            reply = self.client("iam").simulate_principal_policy(
                PolicySourceArn=principal, ActionNames=needed)
        except Exception as exc:  # refused, or an endpoint without it (moto: NotImplemented)
            self.warn(where, f"cannot check the permissions of {principal} "
                      f"(iam:SimulatePrincipalPolicy: {_describe(exc)}); compare them with "
                      "'slurm-spot config iam'")
            return
        denied = sorted(r["EvalActionName"] for r in reply.get("EvaluationResults", [])
                        if r.get("EvalDecision") != "allowed")
        if denied:
            self.error(where, f"{principal} is not allowed {', '.join(denied)}; 'slurm-spot "
                       "config iam' prints the policy it needs")

    def principal(self, arn: str) -> str:
        """The IAM user or role behind ``arn`` (an assumed-role session ARN names the role,
        whose path only ``iam:GetRole`` knows)."""
        match = re.fullmatch(r"arn:([^:]+):sts::(\d+):assumed-role/([^/]+)/.+", arn)
        if match is None:
            return arn
        partition, account, role = match.groups()
        try:
            return str(self.client("iam").get_role(RoleName=role)["Role"]["Arn"])
        except Exception:  # no iam:GetRole: the path is usually "/"
            return f"arn:{partition}:iam::{account}:role/{role}"


def _code(exc: Any) -> str:
    return str(getattr(exc, "response", {}).get("Error", {}).get("Code", type(exc).__name__))


def _described(describe: Callable[[], dict[str, Any]], key: str,
               missing: tuple[str, ...]) -> list[Any]:
    """The list ``key`` of the answer of ``describe`` (an EC2 ``Describe*`` call), ``[]``
    when the answer lacks it or EC2 refuses with an error code holding one of ``missing``
    (``NotFound``: what was asked for does not exist).

    Raises:
        botocore.exceptions.ClientError: any other refusal.
    """
    from botocore.exceptions import ClientError

    try:
        return list(describe().get(key, []))
    except ClientError as exc:
        if not any(part in _code(exc) for part in missing):
            raise
        return []


def _describe(exc: BaseException) -> str:
    response = getattr(exc, "response", None)
    if isinstance(response, dict) and "Error" in response:
        error = response["Error"]
        return f"{error.get('Code', '?')}: {error.get('Message', '')}".strip()
    return f"{type(exc).__name__}: {exc}"
