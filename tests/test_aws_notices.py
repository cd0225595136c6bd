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
from slurm_spot.lifecycle.watch import Watcher, source_for
from slurm_spot.providers.aws.notices import (
    ACTION_PATH,
    ImdsClient,
    ImdsError,
    ImdsNoticeSource,
    instance_identity,
    parse_time,
)
from tests.fakes.fake_slurm import FakeSlurm
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


def test_the_notice_time_written_with_z_is_that_utc_instant(imds):
    """IMDS writes the instance action's ``time`` with ``Z`` (tests/data/notices.yaml); Python
    3.11's fromisoformat reads it: the deadline the watcher works to is that UTC instant."""
    imds.set_instance_action(200, '{"action": "stop", "time": "2026-03-01T08:22:00Z"}')
    notice = source(imds).poll()
    assert notice is not None
    assert notice.deadline == datetime(2026, 3, 1, 8, 22, tzinfo=timezone.utc)
    assert parse_time("2026-03-01T09:22:00+01:00") == notice.deadline


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
def _slurm() -> FakeSlurm:
    """Node gpu-2 runs job 42 (requeueable; its step 0 is process 4242, whose
    /proc/4242/status the test writes)."""
    fake = FakeSlurm()
    fake.add_node("gpu-2", "MIXED+CLOUD")
    job = fake.add_job(42, ["gpu-2"])
    job.script, job.pids = "#!/bin/bash\n#SBATCH --requeue\nsrun python train.py\n", [(4242, "0")]
    return fake


def test_a_notice_drains_the_node_and_requeues_its_job(imds, tmp_path):
    config = parse_config({
        "cluster": "c1", "providers": {"aws": {"type": "aws", "region": "us-east-1"}},
        "node_sets": [{"name": "gpu", "provider": "aws", "count": 2,
                       "instance_types": ["g5.xlarge"],
                       "aws": {"launch_template": "t", "subnets": ["subnet-a"]}}],
        "partitions": [{"name": "gpu", "node_sets": ["gpu"]}], "log_dir": str(tmp_path),
    })
    assert isinstance(source_for(config, "gpu-2"), ImdsNoticeSource)
    slurm = _slurm()
    clock = [NOW.timestamp()]

    def sleep(seconds: float) -> None:
        clock[0] += seconds

    watcher = Watcher(config, "gpu-2", slurm.client(), source(imds),
                      clock=lambda: clock[0], sleep=sleep)
    (tmp_path / "proc" / "4242").mkdir(parents=True)  # step 0's task catches SIGUSR2
    (tmp_path / "proc" / "4242" / "status").write_text("Name:\tpython\nSigCgt:\t800\n")
    watcher.signaller.proc_root = tmp_path / "proc"
    assert watcher.run(once=True) is None
    imds.set_instance_action(200, '{"action": "terminate", "time": "2026-03-01T08:22:00Z"}')
    outcome = watcher.run(once=True)
    assert outcome is not None and outcome.requeued == [42]
    reason = "spot-interruption:terminate@2026-03-01T08:22:00Z"
    # Slurm's record shows job 42 still running its interrupted run on gpu-2 alone: the
    # watcher requeues it before the power-down (watch.py, step 6), then expedites it
    assert slurm.changes() == [
        ["scontrol", "update", "nodename=gpu-2", "state=DRAIN", f"reason={reason}"],
        ["scancel", "-s", "USR2", "42.0"],
        ["scontrol", "requeue", "42"],
        ["scontrol", "update", "jobid=42", "StartTime=now"],
        # on the record sacct shows, before the power-down (which ends this instance, and the
        # watcher with it, seconds later)
        ["scontrol", "update", "jobid=42", f"AdminComment=requeued: {reason}"],
        ["scontrol", "update", "nodename=gpu-2", "state=POWER_DOWN_FORCE", f"reason={reason}"],
    ]
    job, node = slurm.jobs[42], slurm.nodes["gpu-2"]
    assert (job.state, job.restarts, job.admin_comment) == ("PENDING", 1, f"requeued: {reason}")
    assert {"DRAIN", "POWERING_DOWN"} <= node.flags and node.reason == reason
