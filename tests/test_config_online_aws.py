"""``slurm-spot config check --online`` against moto (in-process EC2, STS, Service Quotas,
IAM): a missing subnet, launch template (or version) or instance type is named with its
spot.yaml line and exit code 2; a correct setup passes. moto has no EC2 vCPU quotas
(GetServiceQuota answers NoSuchResource) and no IAM policy simulation (NotImplemented): both
are warnings there, as for an account whose credentials may not read them. The quota
arithmetic is tested with a real Service Quotas reply (botocore parses it) in place of moto's."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import boto3
import pytest
from click.testing import CliRunner

from slurm_spot.cli import cli
from slurm_spot.config import SLURM_COMMANDS
from slurm_spot.jsonenvelope import read_envelope
from tests.fakes.aws_harness import moto_world
from tests.fakes.ec2 import REGION, World


@pytest.fixture
def aws(monkeypatch: pytest.MonkeyPatch) -> Iterator[World]:
    with moto_world(monkeypatch) as (_, world):
        yield world


def write(tmp_path: Path, world: World, *, subnets: list[str] | None = None,
          template: str | None = None, version: str = "$Default",
          types: tuple[str, ...] = ("g5.xlarge", "p4d.24xlarge"), count: int = 4,
          shape: bool = False) -> Path:
    """spot.yaml with one AWS node set; its lines are fixed (the tests name them). Types of
    different shapes get a written shape that fits them all (else ``config check`` refuses
    them before it asks AWS); ``shape``: the one written for types AWS may not know."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    for command in SLURM_COMMANDS:
        (bin_dir / command).write_text("#!/bin/sh\n")
        (bin_dir / command).chmod(0o755)
    subnet_lines = "".join(f"        - {s}\n" for s in (subnets or world.subnets))
    type_lines = "".join(f"      - {t}\n" for t in types)
    path = tmp_path / "spot.yaml"
    path.write_text(
        "cluster: c1\n"                                             # 1
        f"state_dir: {tmp_path}/state\n"                             # 2
        f"log_dir: {tmp_path}/log\n"                                 # 3
        f"slurm_bin_dir: {bin_dir}\n"                                # 4
        "providers:\n"                                               # 5
        f"  aws: {{type: aws, region: {REGION}}}\n"                  # 6
        "node_sets:\n"                                               # 7
        "  - name: gpu\n"                                            # 8
        "    provider: aws\n"                                        # 9
        f"    count: {count}\n"                                      # 10
        "    fallback: on-demand\n"                                  # 11
        "    aws:\n"                                                 # 12
        f"      launch_template: {template or world.template_name}\n"  # 13
        f"      launch_template_version: '{version}'\n"              # 14
        "      subnets:\n"                                           # 15
        + subnet_lines                                               # 16, 17
        + "    instance_types:\n"                                    # 18
        + type_lines                                                 # 19, 20
        + ("    cpus: 4\n    memory_mib: 1000\n    gpus: {type: a100, count: 8}\n"
           if shape else "    cpus: 4\n    memory_mib: 1000\n    gpus: {type: gpu, count: 1}\n"
           if len(set(types)) > 1 else "")
        + "partitions: [{name: gpu, node_sets: [gpu]}]\n")
    return path


def check(path: Path, *extra: str) -> Any:
    return CliRunner().invoke(cli, ["--config", str(path), "config", "check", "--online", *extra])


def test_a_correct_setup_passes_with_warnings_for_what_moto_cannot_say(aws, tmp_path) -> None:
    result = check(write(tmp_path, aws, types=("g5.xlarge",)))
    assert result.exit_code == 0, result.output
    assert "OK checked online (4 nodes in 1 node set(s), partitions: gpu)" in result.stdout
    # no EC2 quotas and no policy simulation in moto: said, not failed
    assert "line 19: node_sets.0.instance_types.0: cannot read the spot vCPU quota L-3819A6DF" \
        in result.stderr
    assert "line 6: providers.aws: cannot check the permissions of " \
           "arn:aws:sts::123456789012:user/moto" in result.stderr


def test_json_lists_the_warnings(aws, tmp_path) -> None:
    result = check(write(tmp_path, aws, types=("g5.xlarge",)), "--json")
    assert result.exit_code == 0, result.output
    data = read_envelope(result.stdout, "config check")
    assert data["ok"] is True and data["online"] is True
    assert any(w.startswith("line 6: providers.aws: cannot check the permissions")
               for w in data["warnings"])


def test_a_missing_subnet_is_named_with_its_line(aws, tmp_path) -> None:
    result = check(write(tmp_path, aws, subnets=[aws.subnets[0], "subnet-0badbadbadbadbad0"]))
    assert result.exit_code == 2
    assert ("line 17: node_sets.0.aws.subnets.1: subnet subnet-0badbadbadbadbad0 does not "
            f"exist in region {REGION}") in result.stderr


def test_a_missing_launch_template_or_version_is_named_with_its_line(aws, tmp_path) -> None:
    result = check(write(tmp_path, aws, template="no-such-template"))
    assert result.exit_code == 2
    assert ("line 13: node_sets.0.aws.launch_template: launch template 'no-such-template' does "
            f"not exist in region {REGION}") in result.stderr
    result = check(write(tmp_path, aws, version="7"))
    assert result.exit_code == 2
    assert (f"line 14: node_sets.0.aws.launch_template_version: launch template "
            f"'{aws.template_name}' has no version '7'") in result.stderr


def test_an_instance_type_offered_in_no_zone_is_an_error_in_some_a_warning(aws, tmp_path,
                                                                             ) -> None:
    # moto's offerings are EC2's: p4d.24xlarge is in us-east-1a but not us-east-1f;
    # "g9.nothing" exists nowhere.
    ec2 = boto3.client("ec2", region_name=REGION)
    vpc = ec2.describe_subnets(SubnetIds=[aws.subnets[0]])["Subnets"][0]["VpcId"]
    in_f = ec2.create_subnet(VpcId=vpc, CidrBlock="10.0.128.0/18",
                             AvailabilityZone="us-east-1f")["Subnet"]["SubnetId"]
    result = check(write(tmp_path, aws, subnets=[aws.subnets[0], in_f],
                         types=("p4d.24xlarge", "g9.nothing"), shape=True))
    assert result.exit_code == 2
    assert ("line 19: node_sets.0.instance_types.0: 'p4d.24xlarge' is not offered in "
            "us-east-1f: those pools are skipped") in result.stderr
    assert ("line 20: node_sets.0.instance_types.1: 'g9.nothing' is not offered in any zone "
            "of the node set's subnets (us-east-1a, us-east-1f)") in result.stderr


def _quota_reply(value: float) -> Any:
    """A ``before-call`` handler answering GetServiceQuota as Service Quotas does (JSON),
    parsed by botocore, with ``value`` vCPUs."""
    from botocore.awsrequest import AWSResponse, HTTPHeaders
    from botocore.parsers import create_parser

    def answer(model: Any, params: Any, **_: Any) -> Any:
        code = json.loads(params["body"])["QuotaCode"]
        body = json.dumps({"Quota": {"ServiceCode": "ec2", "QuotaCode": code,
                                     "QuotaName": "vCPUs", "Value": value}}).encode()
        headers = HTTPHeaders()
        headers["Content-Type"] = "application/x-amz-json-1.1"
        parsed = create_parser("json").parse(
            {"body": body, "headers": headers, "status_code": 200}, model.output_shape)

        class Raw:
            def stream(self, **_: Any) -> Iterator[bytes]:
                yield body

        return AWSResponse("https://servicequotas.us-east-1.amazonaws.com/", 200, headers,
                           Raw()), parsed

    return answer


def test_vcpu_quotas_below_one_node_fail_below_all_nodes_warn(aws, tmp_path, monkeypatch) -> None:
    real_client = boto3.session.Session.client

    def client(self: Any, service: str, *args: Any, **kwargs: Any) -> Any:
        made = real_client(self, service, *args, **kwargs)
        if service == "service-quotas":
            made.meta.events.register("before-call.service-quotas.GetServiceQuota",
                                      _quota_reply(quota[0]))
        return made

    monkeypatch.setattr(boto3.session.Session, "client", client)
    quota = [2.0]  # g5.xlarge has 4 vCPUs
    result = check(write(tmp_path, aws, types=("g5.xlarge",)))
    assert result.exit_code == 2
    assert ("line 19: node_sets.0.instance_types.0: the spot vCPU quota L-3819A6DF is 2, below "
            "one g5.xlarge (4 vCPUs): no node can start") in result.stderr
    assert "the on-demand vCPU quota L-DB2E81BA is 2" in result.stderr  # the fallback's
    quota[0] = 8.0
    result = check(write(tmp_path, aws, types=("g5.xlarge",)))
    assert result.exit_code == 0, result.output
    assert ("line 10: node_sets.0.count: the spot vCPU quota L-3819A6DF (8) holds 2 of the 4 "
            "g5.xlarge nodes at once") in result.stderr


def test_refused_credentials_stop_at_once(aws, tmp_path, monkeypatch) -> None:
    from botocore.exceptions import NoCredentialsError

    def no_credentials(*_: Any, **__: Any) -> Any:
        raise NoCredentialsError()

    monkeypatch.setattr("botocore.auth.SigV4Auth.add_auth", no_credentials)
    result = check(write(tmp_path, aws))
    assert result.exit_code == 2
    assert "line 6: providers.aws: cannot use the AWS credentials in region us-east-1" \
        in result.stderr
    assert "nothing else was checked" in result.stderr


def test_a_denied_launch_names_the_provider(aws, tmp_path, monkeypatch) -> None:
    from tests.fakes.ec2 import canned

    def unauthorized(model: Any, **_: Any) -> Any:
        if model.name != "CreateFleet":
            return None
        return canned(model, 403, b"<Response><Errors><Error><Code>UnauthorizedOperation</Code>"
                      b"<Message>You are not authorized to perform this operation.</Message>"
                      b"</Error></Errors><RequestID>x</RequestID></Response>")

    real_client = boto3.session.Session.client

    def client(self: Any, service: str, *args: Any, **kwargs: Any) -> Any:
        made = real_client(self, service, *args, **kwargs)
        if service == "ec2":
            made.meta.events.register("before-call.ec2.CreateFleet", unauthorized)
        return made

    monkeypatch.setattr(boto3.session.Session, "client", client)
    result = check(write(tmp_path, aws, types=("g5.xlarge",)))
    assert result.exit_code == 2
    assert ("line 6: providers.aws: these credentials may not launch node set 'gpu' "
            "(CreateFleet DryRun: UnauthorizedOperation)") in result.stderr
