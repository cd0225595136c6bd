"""EC2 API calls to launch 1000 nodes of one AWS node set, and to re-run that launch.

Method:

1. moto (in-process, ``mock_aws``) with a VPC, two subnets in two zones and a launch template
   (tests/fakes/ec2.py ``make_world``); one node set ``gpu`` of 1000 nodes with two instance
   types (g5.xlarge, g6.xlarge) over both subnets, spot, fallback on-demand.
2. ``AwsProvider.launch`` for ``gpu-[1-1000]`` (what one ``slurm-spot resume gpu-[1-1000]``
   asks of the provider), then the same launch again (a re-run of the hook).
3. Every EC2 API call is counted by operation through botocore's ``before-parameter-build``
   event on the provider's clients; the provider's own ``LaunchResult.api_calls`` must agree.

The count does not depend on moto: lookup (1 DescribeInstances page of up to 1000), CreateFleet
(1 per 1000 nodes), DescribeInstances by launch tag (1 page), CreateTags for the node mapping
(one per bit of the largest node index, 10 for 1000, plus the completion mark). moto's wall time
is reported but says nothing about EC2's (benchmarks/fast_moto.py makes moto's tag lookups
per instance cheaper; the answers are the same).

Run from the repository root: ``python benchmarks/aws_launch_calls.py [--nodes N] [--no-write]
[--smoke]`` (``--smoke``: 10 nodes, nothing written).
Results go to stdout (JSON) and into BENCHMARKS.md between the aws-launch-calls markers.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from report import write_section  # noqa: E402 - benchmarks/report.py, beside this script

from tests.fakes.ec2 import AWS_ENV, REGION, make_world  # noqa: E402

BEGIN, END = "<!-- aws-launch-calls:begin -->", "<!-- aws-launch-calls:end -->"


def measure(nodes: int) -> dict[str, Any]:
    """Launch ``nodes`` nodes on moto, then again; the calls of each, by operation."""
    os.environ.update(AWS_ENV)
    import boto3
    import fast_moto
    from moto import mock_aws

    fast_moto.patch()  # moto's own speed only (benchmarks/fast_moto.py)

    from slurm_spot.config import AwsProviderConfig, parse_config
    from slurm_spot.providers.aws.provider import AwsProvider
    from slurm_spot.providers.base import LaunchRequest

    with mock_aws():
        world = make_world(boto3.client("ec2", region_name=REGION))
        config = parse_config({
            "cluster": "bench",
            "providers": {"aws": {"type": "aws", "region": REGION}},
            "node_sets": [{"name": "gpu", "provider": "aws", "count": nodes,
                           "instance_types": ["g5.xlarge", "g6.xlarge"], "fallback": "on-demand",
                           "aws": {"launch_template": world.template_name,
                                   "subnets": world.subnets}}],
            "partitions": [{"name": "gpu", "node_sets": ["gpu"]}],
        })
        settings = config.providers["aws"]
        assert isinstance(settings, AwsProviderConfig)
        provider = AwsProvider(config, "aws", settings)
        counts: Counter[str] = Counter()

        def seen(event_name: str, **_: Any) -> None:
            counts[event_name.rsplit(".", 1)[-1]] += 1

        for client in (provider.client, provider.launch_client):
            client.meta.events.register("before-parameter-build.ec2", seen)
        ns = config.node_sets[0]
        request = LaunchRequest("bench", ns, tuple(ns.node_names), "bench")
        runs = []
        for label in ("launch", "re-run"):
            counts.clear()
            started = time.monotonic()
            result = provider.launch(request)
            runs.append({
                "run": label,
                "nodes": nodes,
                "launched": len(result.launched),
                "failed": sum(len(f.nodes) for f in result.failed),
                "api_calls": sum(counts.values()),
                "reported_api_calls": result.api_calls,
                "by_operation": dict(sorted(counts.items())),
                "moto_wall_s": round(time.monotonic() - started, 1),
            })
    return {"nodes": nodes, "runs": runs}


def section(result: dict[str, Any]) -> str:
    """The BENCHMARKS.md section for ``result``."""
    rows = "\n".join(
        f"| {r['run']} | {r['nodes']} | {r['launched']} | **{r['api_calls']}** | "
        + ", ".join(f"{op} {n}" for op, n in r["by_operation"].items()) + " |"
        for r in result["runs"]
    )
    return f"""{BEGIN}
## AWS: EC2 API calls to launch 1000 nodes of one node set

`python benchmarks/aws_launch_calls.py` (method in its docstring): moto in-process, one node set
of {result['nodes']} nodes (2 instance types x 2 subnets, spot with on-demand fallback),
`AwsProvider.launch` for all nodes, then the same launch again; every EC2 API call counted by
operation.

| run | nodes | launched | API calls | by operation |
|---|---|---|---|---|
{rows}

Why these numbers: one DescribeInstances by cluster + node-set tag finds what exists (a re-run
stops there); one CreateFleet (type instant) asks for all missing nodes over every pool; one
DescribeInstances by launch tag reads private IPs and host names; the node mapping is one
CreateTags per bit of the largest node index plus a completion mark (instances of one fleet
call share their tags, so N readable node-name tags would cost N CreateTags calls). Capacity
errors add one CreateFleet per fallback (at most 3 per market); throttling retries the same
CreateFleet (at most 5 attempts).
{END}"""


def main(argv: list[str] | None = None) -> None:
    """Measure, print JSON, update BENCHMARKS.md."""
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--no-write", action="store_true", help="do not update BENCHMARKS.md")
    parser.add_argument("--output", type=Path, default=ROOT / "BENCHMARKS.md")
    parser.add_argument("--smoke", action="store_true", help="10 nodes, no BENCHMARKS.md update")
    args = parser.parse_args(argv)
    if args.smoke:
        args.nodes, args.no_write = 10, True
    result = measure(args.nodes)
    print(json.dumps(result, indent=2))
    if not args.no_write:
        write_section(args.output, BEGIN, END, section(result))


if __name__ == "__main__":
    main()
