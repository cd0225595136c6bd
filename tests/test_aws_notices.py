"""IMDSv2 interruption notices against a fake metadata service (tests/fakes/imds.py): every
``aws_imdsv2`` row of tests/data/notices.yaml, token handling, and the
watcher draining its node and requeueing its job on a notice."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest
import yaml

from slurm_spot.config import parse_config
from slurm_spot.providers.aws.notices import (
    ACTION_PATH,
    ImdsClient,
    ImdsError,
    ImdsNoticeSource,
    instance_identity,
    parse_time,
)
from slurm_spot.slurm.client import Job, Node
from slurm_spot.slurm.states import parse_job_state, parse_node_state
from slurm_spot.watch import Watcher, source_for
from tests.fakes.imds import FakeImds

ROWS = yaml.safe_load((Path(__file__).parent / "data" / "notices.yaml").read_text())["aws_imdsv2"]
NOW = datetime(2026, 3, 1, 8, 20, tzinfo=timezone.utc)


@pytest.fixture
def imds() -> Iterator[FakeImds]:
    with FakeImds() as fake:
        yield fake


def source(fake: FakeImds, **kwargs: Any) -> ImdsNoticeSource:
    return ImdsNoticeSource(fake.url, now=lambda: NOW, **kwargs)


# ---- the cases file -----------------------------------------------------------------------------
@pytest.mark.parametrize("row", ROWS, ids=[f"{r['status']}-{r['expect'][:20]}" for r in ROWS])
def test_cases_file_row(imds, row):
    imds.set_instance_action(row["status"], row["body"])
    notice = source(imds).poll()
    if row["status"] == 200:
        body = yaml.safe_load(row["body"])
        assert notice is not None and notice.kind == "interruption"
        assert (notice.action, notice.source) == (body["action"], "aws-imds")
        assert notice.reason == f"spot-interruption:{body['action']}@{body['time']}"
        assert notice.deadline == parse_time(body["time"])
    else:
        assert notice is None
    if row["status"] == 401:  # a fresh token was fetched and the GET asked again
        assert imds.count("PUT", status=200) == 2
        assert imds.count("GET", ACTION_PATH) == 2


def test_expired_token_is_renewed_and_the_notice_still_read(imds):
    src = source(imds)
    assert src.poll() is None
    imds.expire_tokens()
    imds.set_instance_action(200, '{"action": "terminate", "time": "2026-03-01T08:22:00Z"}')
    notice = src.poll()
    assert notice is not None and notice.action == "terminate"
    assert imds.count("PUT", status=200) == 2
    assert imds.count("GET", ACTION_PATH, 401) == 1


def test_token_is_renewed_before_it_expires(imds):
    clock = [1000.0]
    client = ImdsClient(imds.url, token_ttl_s=100, clock=lambda: clock[0])
    src = ImdsNoticeSource(client=client, rebalance=False)
    src.poll()
    src.poll()
    assert imds.count("PUT") == 1  # reused
    clock[0] += 95  # 5 s left, under the 10 % margin
    src.poll()
    assert imds.count("PUT") == 2
    assert imds.count("GET", status=401) == 0


def test_a_token_is_sent_with_every_get(imds):
    source(imds).poll()
    assert imds.count("GET", status=401) == 0 and imds.count("GET") == 2  # action + rebalance


def test_non_200_bodies_are_never_parsed(imds):
    notice_like = '{"action": "terminate", "time": "2026-03-01T08:22:00Z"}'
    for status in (403, 500, 503):
        imds.set_instance_action(status, notice_like)
        imds.set_rebalance(status, '{"noticeTime": "2026-03-01T08:00:00Z"}')
        assert source(imds).poll() is None


def test_unreadable_200_is_taken_as_a_terminate_notice(imds):
    imds.set_instance_action(200, "not json")
    notice = source(imds).poll()
    assert notice is not None and notice.action == "terminate"
    assert notice.deadline == NOW + timedelta(seconds=120)


def test_hibernate_is_a_notice_too(imds):
    imds.set_instance_action(200, '{"action": "hibernate", "time": "2026-03-01T08:22:00Z"}')
    notice = source(imds).poll()
    assert notice is not None
    assert notice.reason == "spot-interruption:hibernate@2026-03-01T08:22:00Z"


def test_rebalance_recommendation(imds):
    imds.set_rebalance(200, '{"noticeTime": "2026-03-01T08:10:00Z"}')
    notice = source(imds).poll()
    assert notice is not None and notice.kind == "rebalance" and notice.action == "rebalance"
    assert notice.deadline == datetime(2026, 3, 1, 8, 10, tzinfo=timezone.utc)
    assert source(imds, rebalance=False).poll() is None
    imds.set_instance_action(200, '{"action": "stop", "time": "2026-03-01T08:22:00Z"}')
    interruption = source(imds).poll()
    assert interruption is not None and interruption.kind == "interruption"  # wins


def test_unreachable_service_is_no_notice():
    with FakeImds() as fake:
        url = fake.url
    src = ImdsNoticeSource(url)
    assert src.poll() is None
    assert src.interval_s == 5.0


def test_endpoint_from_environment_and_proxies_ignored(imds, monkeypatch):
    monkeypatch.setenv("AWS_EC2_METADATA_SERVICE_ENDPOINT", imds.url + "/")
    monkeypatch.setenv("HTTP_PROXY", "http://127.0.0.1:9")
    monkeypatch.setenv("http_proxy", "http://127.0.0.1:9")
    imds.set_instance_action(200, '{"action": "terminate", "time": "2026-03-01T08:22:00Z"}')
    notice = ImdsNoticeSource().poll()
    assert notice is not None and notice.action == "terminate"


def test_instance_identity(imds):
    identity = instance_identity(imds.url)
    assert (identity.instance_id, identity.local_ipv4) == ("i-0123456789abcdef0", "10.0.3.7")
    assert (identity.instance_type, identity.zone) == ("g5.xlarge", "us-east-1a")
    imds.clear("/latest/meta-data/instance-id")
    with pytest.raises(ImdsError):
        instance_identity(imds.url)


# ---- the watcher on top -------------------------------------------------------------------------
class FakeSlurm:
    """What the watcher asks of Slurm, recorded: node gpu-2 runs job 42, which is pending
    (requeued) once the node is powered down."""

    def __init__(self) -> None:
        self.calls: list[tuple[Any, ...]] = []
        self.powered_down = False

    def set_state(self, names: list[str], state: str, reason: str | None = None) -> None:
        self.calls.append(("state", tuple(names), state, reason))
        self.powered_down |= state == "POWER_DOWN_FORCE"

    def power_down_force(self, names: list[str], reason: str) -> None:
        self.set_state(names, "POWER_DOWN_FORCE", reason)  # the client picks the release's form

    def nodes(self, names: list[str] | None = None, with_jobs: bool = True) -> list[Node]:
        jobs = () if self.powered_down else (42,)
        return [Node("gpu-2", parse_node_state("MIXED+DRAIN"), jobs=jobs)]

    def batch_script(self, job_id: int) -> str:
        return "#!/bin/bash\n#SBATCH --requeue\nsrun python train.py\n"

    def list_pids(self, job_id: int, node: str) -> list[tuple[int, str]]:
        return [(4242, "0")]  # its /proc/4242/status is written by the test

    def signal_step(self, job_id: int, step: str | None, signal: str) -> None:
        self.calls.append(("signal", job_id, step, signal))

    def job_record(self, job_id: int) -> None:
        return None

    def jobs(self, job_ids: list[int] | None = None) -> list[Job]:
        return [Job(42, parse_job_state("PENDING" if self.powered_down else "RUNNING"))]

    def expedite(self, job_id: int) -> None:
        self.calls.append(("expedite", job_id))

    def known_refs(self, job_ids: list[int]) -> dict[str, str]:
        return {}  # job 42 is no array task

    def record_interruption(self, job_ids: list[int], text: str) -> list[str]:
        if job_ids:
            self.calls.append(("admin_comment", tuple(job_ids), text))
        return []


def test_a_notice_drains_the_node_and_requeues_its_job(imds, tmp_path):
    config = parse_config({
        "cluster": "c1", "providers": {"aws": {"type": "aws", "region": "us-east-1"}},
        "node_sets": [{"name": "gpu", "provider": "aws", "count": 2,
                       "instance_types": ["g5.xlarge"],
                       "aws": {"launch_template": "t", "subnets": ["subnet-a"]}}],
        "partitions": [{"name": "gpu", "node_sets": ["gpu"]}], "log_dir": str(tmp_path),
    })
    assert isinstance(source_for(config, "gpu-2"), ImdsNoticeSource)
    slurm = FakeSlurm()
    clock = [NOW.timestamp()]

    def sleep(seconds: float) -> None:
        clock[0] += seconds

    watcher = Watcher(config, "gpu-2", slurm, source(imds),  # type: ignore[arg-type]
                      clock=lambda: clock[0], sleep=sleep)
    (tmp_path / "proc" / "4242").mkdir(parents=True)  # step 0's task catches SIGUSR2
    (tmp_path / "proc" / "4242" / "status").write_text("Name:\tpython\nSigCgt:\t800\n")
    watcher.signaller.proc_root = tmp_path / "proc"
    assert watcher.run(once=True) is None
    imds.set_instance_action(200, '{"action": "terminate", "time": "2026-03-01T08:22:00Z"}')
    outcome = watcher.run(once=True)
    assert outcome is not None and outcome.requeued == [42]
    reason = "spot-interruption:terminate@2026-03-01T08:22:00Z"
    assert slurm.calls == [
        ("state", ("gpu-2",), "DRAIN", reason),
        ("signal", 42, "0", "USR2"),
        ("state", ("gpu-2",), "POWER_DOWN_FORCE", reason),
        ("expedite", 42),
        ("admin_comment", (42,), f"requeued: {reason}"),  # on the record sacct shows
    ]
