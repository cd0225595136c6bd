"""EC2 test helpers around moto: a world (VPC, subnets, launch template), request counting, and
:class:`FleetMarket`, a capacity / quota / price model in front of moto's CreateFleet.

moto launches whatever CreateFleet asks for and never returns ``Errors``. :class:`FleetMarket`
hooks the botocore event system of one client to behave like EC2 instead:

- ``before-parameter-build``: decides what EC2 would do with the request: pools without
  capacity (:attr:`no_capacity`), a market with only N instances left (:attr:`capacity`), a vCPU
  limit per market (:attr:`vcpu_limit`, counted over the alive instances in moto), a spot price
  above the request's MaxPrice (:attr:`spot_price`). It rewrites the parameters so moto launches
  exactly what EC2 would (from the first usable pool);
- ``before-call``: answers with a real EC2 XML reply, parsed by botocore's own EC2 parser, when
  EC2 would launch nothing: a ``CreateFleetResponse`` with only an ``errorSet``, or a whole-call
  error (:meth:`fail_next`, e.g. RequestLimitExceeded as HTTP 503). ``before-call`` and not
  ``before-send``: botocore calls every ``before-send`` handler, so moto would still launch;
- ``after-call``: adds the ``Errors`` entries (one per failed override) to moto's reply.
"""

from __future__ import annotations

import copy
import uuid
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any
from xml.sax.saxutils import escape

import boto3
from botocore.awsrequest import AWSResponse, HTTPHeaders
from botocore.parsers import create_parser

from slurm_spot.providers.aws.catalog import catalogue

REGION = "us-east-1"
ZONES = ("us-east-1a", "us-east-1b")
#: A second region, for node sets of one partition in two regions (issue 24, part 4).
WEST_REGION = "us-west-2"
WEST_ZONES = ("us-west-2a", "us-west-2b")
TEMPLATE = "slurm-spot-gpu"
AWS_ENV = {
    "AWS_ACCESS_KEY_ID": "testing",
    "AWS_SECRET_ACCESS_KEY": "testing",
    "AWS_SESSION_TOKEN": "testing",
    "AWS_DEFAULT_REGION": REGION,
    "AWS_EC2_METADATA_DISABLED": "true",
    "MOTO_EC2_LOAD_DEFAULT_AMIS": "false",
}

ERROR_MESSAGES = {
    "InsufficientInstanceCapacity": "We currently do not have sufficient {type} capacity in the "
    "Availability Zone you requested ({zone}).",
    "SpotMaxPriceTooLow": "Your Spot request price of {max_price} is lower than the minimum "
    "required Spot request fulfillment price of {price}.",
    "VcpuLimitExceeded": "You have requested more vCPU capacity than your current vCPU limit of "
    "{limit} allows for the instance bucket that the specified instance type belongs to.",
    "RequestLimitExceeded": "Request limit exceeded.",
}


@dataclass
class World:
    """What :func:`make_world` created in moto."""

    subnets: list[str]
    zones: dict[str, str]
    template_id: str
    template_name: str = TEMPLATE


def make_world(ec2: Any, zones_: tuple[str, ...] = ZONES) -> World:
    """A VPC with one subnet per zone of ``zones_`` and a launch template, in moto, in the
    region of the client ``ec2`` (moto keeps one backend per region)."""
    vpc = ec2.create_vpc(CidrBlock="10.0.0.0/16")["Vpc"]["VpcId"]
    subnets, zones = [], {}
    for i, zone in enumerate(zones_):
        subnet = ec2.create_subnet(VpcId=vpc, CidrBlock=f"10.0.{i * 64}.0/18",
                                   AvailabilityZone=zone)["Subnet"]["SubnetId"]
        subnets.append(subnet)
        zones[subnet] = zone
    template = ec2.create_launch_template(
        LaunchTemplateName=TEMPLATE, LaunchTemplateData={"ImageId": "ami-0123456789abcdef0"}
    )["LaunchTemplate"]["LaunchTemplateId"]
    return World(subnets, zones, template)


def count_requests(*clients: Any, order: list[str] | None = None) -> Counter[str]:
    """A counter of API calls by operation name, fed by the clients'
    ``before-parameter-build`` events (calls answered by a canned reply count too;
    botocore-internal retries do not, and the launch client makes none). ``order`` collects
    the operation names in call order."""
    counts: Counter[str] = Counter()

    def seen(event_name: str, **_: Any) -> None:
        name = event_name.rsplit(".", 1)[-1]
        counts[name] += 1
        if order is not None:
            order.append(name)

    for client in clients:
        client.meta.events.register("before-parameter-build.ec2", seen)
    return counts


class _Raw:
    """The raw body botocore reads from an AWSResponse."""

    def __init__(self, body: bytes) -> None:
        self._body = body

    def stream(self, **_: Any) -> Iterator[bytes]:
        yield self._body


def canned(model: Any, status: int, body: bytes) -> tuple[AWSResponse, dict[str, Any]]:
    """What a ``before-call`` handler returns to answer ``model``'s operation without sending
    it: the HTTP response and botocore's parse of the EC2 XML ``body`` (for status >= 300 the
    client raises ClientError from it, as for a real reply)."""
    headers = HTTPHeaders()
    headers["Content-Type"] = "text/xml"
    parsed = create_parser("ec2").parse(
        {"body": body, "headers": headers, "status_code": status}, model.output_shape
    )
    return AWSResponse("https://ec2.us-east-1.amazonaws.com/", status, headers, _Raw(body)), parsed


def xml_error(status: int, code: str, message: str) -> bytes:
    """An EC2 error reply body (EC2 API reference, "Error responses")."""
    body = (
        '<?xml version="1.0" encoding="UTF-8"?>\n<Response><Errors><Error>'
        f"<Code>{escape(code)}</Code><Message>{escape(message)}</Message>"
        f"</Error></Errors><RequestID>{uuid.uuid4()}</RequestID></Response>"
    )
    return body.encode()


def xml_fleet_errors(errors: list[dict[str, Any]]) -> bytes:
    """A 200 CreateFleetResponse body that launched nothing and lists ``errors``
    (EC2 API reference, CreateFleet response elements and CreateFleetError)."""
    items = "".join(
        "<item><launchTemplateAndOverrides><launchTemplateSpecification>"
        f"<launchTemplateName>{escape(TEMPLATE)}</launchTemplateName><version>1</version>"
        "</launchTemplateSpecification><overrides>"
        f"<instanceType>{escape(e['InstanceType'])}</instanceType>"
        f"<subnetId>{escape(e['SubnetId'])}</subnetId></overrides></launchTemplateAndOverrides>"
        f"<lifecycle>{escape(e['Lifecycle'])}</lifecycle><errorCode>{escape(e['ErrorCode'])}"
        f"</errorCode><errorMessage>{escape(e['ErrorMessage'])}</errorMessage></item>"
        for e in errors
    )
    body = (
        '<?xml version="1.0" encoding="UTF-8"?>\n'
        '<CreateFleetResponse xmlns="http://ec2.amazonaws.com/doc/2016-11-15/">'
        f"<requestId>{uuid.uuid4()}</requestId><fleetId>fleet-{uuid.uuid4()}</fleetId>"
        f"<errorSet>{items}</errorSet><fleetInstanceSet/></CreateFleetResponse>"
    )
    return body.encode()


@dataclass
class _Plan:
    errors: list[dict[str, Any]] = field(default_factory=list)
    launch: int = 0
    whole_call: tuple[int, str, str] | None = None


class FleetMarket:
    """EC2-like CreateFleet outcomes on top of moto (see the module docstring).

    Attributes:
        pool_errors: ``(instance type, subnet, market)`` -> EC2 error code for that pool; any
            part may be ``"*"`` (see :meth:`fail_pools`).
        capacity: market -> instances still available (absent: unlimited).
        vcpu_limit: market -> vCPU quota of the account (absent: unlimited).
        spot_price: current spot price; a spot override with a lower MaxPrice fails.
        requests: the parameters of every CreateFleet call, as sent by the code under test.
    """

    def __init__(self, client: Any) -> None:
        self.pool_errors: dict[tuple[str, str, str], str] = {}
        self.capacity: dict[str, int] = {}
        self.vcpu_limit: dict[str, int] = {}
        self.spot_price: float | None = None
        self.requests: list[dict[str, Any]] = []
        self._next_errors: list[tuple[int, str, str]] = []
        self._plan = _Plan()
        self._describe = boto3.client("ec2", region_name=REGION)
        events = client.meta.events
        events.register("before-parameter-build.ec2.CreateFleet", self._before_build)
        events.register_first("before-call.ec2.CreateFleet", self._before_call)
        events.register("after-call.ec2.CreateFleet", self._after_call)

    def fail_pools(self, code: str = "InsufficientInstanceCapacity", instance_type: str = "*",
                   subnet: str = "*", market: str = "*") -> None:
        """Every override matching the pattern fails with ``code`` in the ``Errors``."""
        self.pool_errors[(instance_type, subnet, market)] = code

    def price_answers(self, client: Any) -> None:
        """DescribeSpotPriceHistory through ``client`` reports :attr:`spot_price` (moto's
        history has a fixed placeholder price)."""
        def rewrite(parsed: dict[str, Any], **_: Any) -> None:
            if self.spot_price is not None:
                for row in parsed.get("SpotPriceHistory", []):
                    row["SpotPrice"] = f"{self.spot_price:.4f}"

        client.meta.events.register("after-call.ec2.DescribeSpotPriceHistory", rewrite)

    def fail_next(self, status: int, code: str, times: int = 1, message: str = "") -> None:
        """The next ``times`` CreateFleet calls fail as a whole with this EC2 error."""
        text = message or ERROR_MESSAGES.get(code, f"{code} (injected)")
        self._next_errors.extend([(status, code, text)] * times)

    # ---- hooks --------------------------------------------------------------------------
    def _before_build(self, params: dict[str, Any], **_: Any) -> None:
        self.requests.append(copy.deepcopy(params))
        if self._next_errors:
            self._plan = _Plan(whole_call=self._next_errors.pop(0))
            return
        market = params["TargetCapacitySpecification"]["DefaultTargetCapacityType"]
        wanted = params["TargetCapacitySpecification"]["TotalTargetCapacity"]
        config = params["LaunchTemplateConfigs"][0]
        plan, usable = _Plan(), []
        for override in config["Overrides"]:
            code = self._pool_error(override, market)
            if code:
                plan.errors.append(self._error(override, market, code))
            else:
                usable.append(override)
        launch = wanted if usable else 0
        if market in self.capacity:
            launch = min(launch, self.capacity[market])
            if launch < wanted:
                ice = "InsufficientInstanceCapacity"
                plan.errors += [self._error(o, market, ice) for o in usable]
        if usable and market in self.vcpu_limit:
            per_node = catalogue()[usable[0]["InstanceType"]].vcpus
            headroom = max(0, self.vcpu_limit[market] - self._vcpus_in_use(market)) // per_node
            if launch > headroom:
                launch = headroom
                plan.errors.append(self._error(usable[0], market, "VcpuLimitExceeded"))
        plan.launch = launch
        self._plan = plan
        if launch:
            if market in self.capacity:
                self.capacity[market] -= launch
            params["LaunchTemplateConfigs"] = [{**config, "Overrides": [usable[0]]}]
            params["TargetCapacitySpecification"] = {
                **params["TargetCapacitySpecification"], "TotalTargetCapacity": launch
            }

    def _before_call(self, model: Any, **_: Any) -> tuple[AWSResponse, dict[str, Any]] | None:
        plan = self._plan
        if plan.whole_call:
            status, code, message = plan.whole_call
            return canned(model, status, xml_error(status, code, message))
        if plan.launch == 0:
            return canned(model, 200, xml_fleet_errors(plan.errors))
        return None

    def _after_call(self, parsed: dict[str, Any], **_: Any) -> None:
        if self._plan.launch and self._plan.errors:
            parsed["Errors"] = list(parsed.get("Errors") or []) + [
                {
                    "LaunchTemplateAndOverrides": {
                        "LaunchTemplateSpecification": {"LaunchTemplateName": TEMPLATE},
                        "Overrides": {"InstanceType": e["InstanceType"], "SubnetId": e["SubnetId"]},
                    },
                    "Lifecycle": e["Lifecycle"],
                    "ErrorCode": e["ErrorCode"],
                    "ErrorMessage": e["ErrorMessage"],
                }
                for e in self._plan.errors
            ]

    # ---- the model ----------------------------------------------------------------------
    def _pool_error(self, override: dict[str, Any], market: str) -> str:
        itype, subnet = override["InstanceType"], override["SubnetId"]
        for (p_type, p_subnet, p_market), code in self.pool_errors.items():
            if p_type in ("*", itype) and p_subnet in ("*", subnet) and p_market in ("*", market):
                return code
        max_price = override.get("MaxPrice")
        if market == "spot" and self.spot_price is not None and max_price is not None:
            if float(max_price) < self.spot_price:
                return "SpotMaxPriceTooLow"
        return ""

    def _error(self, override: dict[str, Any], market: str, code: str) -> dict[str, Any]:
        text = ERROR_MESSAGES.get(code, code).format(
            type=override["InstanceType"], zone=override["SubnetId"],
            max_price=override.get("MaxPrice"), price=self.spot_price,
            limit=self.vcpu_limit.get(market),
        )
        return {"InstanceType": override["InstanceType"], "SubnetId": override["SubnetId"],
                "Lifecycle": market, "ErrorCode": code, "ErrorMessage": text}

    def _vcpus_in_use(self, market: str) -> int:
        used = 0
        for page in self._describe.get_paginator("describe_instances").paginate(
            Filters=[{"Name": "instance-state-name", "Values": ["pending", "running"]}]
        ):
            for res in page["Reservations"]:
                for inst in res["Instances"]:
                    lifecycle = "spot" if inst.get("InstanceLifecycle") == "spot" else "on-demand"
                    if lifecycle == market:
                        used += catalogue()[inst["InstanceType"]].vcpus
        return used
