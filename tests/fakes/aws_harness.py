"""Shared pieces of the AWS tests: moto world, a config for it, and a provider harness wired to
:class:`~tests.fakes.ec2.FleetMarket` that counts API calls and records back-off sleeps."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime, timezone
from typing import Any

import boto3
import pytest
from moto import mock_aws

from slurm_spot.config import SpotConfig, parse_config
from slurm_spot.providers.aws.fleet import decode_node
from slurm_spot.providers.aws.provider import AwsProvider
from slurm_spot.providers.base import LaunchRequest, LaunchResult
from tests.fakes.ec2 import AWS_ENV, REGION, FleetMarket, World, count_requests, make_world

NOW = datetime(2026, 3, 1, 8, 0, tzinfo=timezone.utc).timestamp()
SESSION = boto3.session.Session(region_name=REGION)  # shared: loads the EC2 model once


@contextmanager
def moto_world(monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[Any, World]]:
    """moto (in-process) with a VPC, two subnets in two zones and a launch template; dummy
    credentials, no instance metadata, no default AMIs (fast)."""
    for key, value in AWS_ENV.items():
        monkeypatch.setenv(key, value)
    for key in ("AWS_PROFILE", "AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_EC2"):
        monkeypatch.delenv(key, raising=False)
    with mock_aws():
        ec2 = boto3.client("ec2", region_name=REGION)
        yield ec2, make_world(ec2)


def make_config(world: World, **node_set: Any) -> SpotConfig:
    """One AWS node set ``gpu`` (g5.xlarge, g6.xlarge over both subnets) of cluster ``c1``;
    keyword arguments override node-set fields, ``aws=`` merges into its aws section."""
    aws = {"launch_template": world.template_name, "subnets": world.subnets}
    aws.update(node_set.pop("aws", {}))
    spec = {"name": "gpu", "provider": "aws", "count": 1000,
            "instance_types": ["g5.xlarge", "g6.xlarge"], "aws": aws, **node_set}
    return parse_config({
        "cluster": "c1",
        "providers": {"aws": {"type": "aws", "region": REGION}},
        "node_sets": [spec],
        "partitions": [{"name": "gpu", "node_sets": ["gpu"]}],
    })


class Harness:
    """A provider wired to a FleetMarket, counting API calls and recording back-off sleeps."""

    def __init__(self, config: SpotConfig) -> None:
        self.config = config
        self.sleeps: list[float] = []
        settings = config.providers["aws"]
        assert settings.type == "aws"
        self.provider = AwsProvider(config, "aws", settings, session=SESSION,
                                    sleep=self.sleeps.append, now=lambda: NOW)
        self.market = FleetMarket(self.provider.launch_client)
        self.market.price_answers(self.provider.client)
        self.calls = count_requests(self.provider.client, self.provider.launch_client)

    def launch(self, *nodes: str, token: str = "t") -> LaunchResult:
        """Launch ``nodes`` of the first node set."""
        ns = self.config.node_sets[0]
        return self.provider.launch(LaunchRequest("c1", ns, nodes, token))


def tags_of(ec2: Any, state: str = "running") -> dict[str, dict[str, str]]:
    """instance id -> tags, for instances in ``state``, read straight from moto."""
    out = {}
    pages = ec2.get_paginator("describe_instances").paginate(
        Filters=[{"Name": "instance-state-name", "Values": [state]}])
    for page in pages:
        for res in page["Reservations"]:
            for inst in res["Instances"]:
                out[inst["InstanceId"]] = {t["Key"]: t["Value"] for t in inst.get("Tags", [])}
    return out


def nodes_in_ec2(ec2: Any) -> list[str]:
    """The nodes the running instances in moto are mapped to, by their tags ("?" if none)."""
    return sorted((decode_node(t) or "?") for t in tags_of(ec2).values())
