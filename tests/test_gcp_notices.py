"""The GCE metadata notice source against a fake metadata server with wait_for_change; every
row of the gce_metadata part of the field cases (tests/data/gce_metadata_notices.yaml)."""

from __future__ import annotations

import threading
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest
import yaml

from slurm_spot.providers.gcp.notices import GceMetadataNoticeSource
from tests.fakes.gce_metadata import FakeMetadata

ROWS = yaml.safe_load(
    (Path(__file__).parent / "data" / "gce_metadata_notices.yaml").read_text())["gce_metadata"]
NOW = datetime(2026, 3, 1, 8, 21, 30, tzinfo=timezone.utc)


@pytest.fixture
def metadata():
    with FakeMetadata() as server:
        yield server


def _source(metadata: FakeMetadata, **kwargs: object) -> GceMetadataNoticeSource:
    return GceMetadataNoticeSource(metadata.host, now=lambda: NOW, **kwargs)  # type: ignore[arg-type]


@pytest.mark.parametrize("row", ROWS, ids=lambda r: r["body"])
def test_each_case_row(metadata: FakeMetadata, row: dict) -> None:
    metadata.respond("instance/preempted", row["status"], row["body"])
    notice = _source(metadata).poll()
    if row["expect"] == "no notice":
        assert notice is None
    else:
        assert notice is not None
        assert (notice.action, notice.source, notice.kind) == ("preempt", "gce-metadata",
                                                               "interruption")
        assert notice.deadline == NOW + timedelta(seconds=30)
        assert notice.reason == "spot-interruption:preempt@2026-03-01T08:22:00Z"


def test_every_request_carries_the_metadata_flavor_header(metadata: FakeMetadata) -> None:
    source = _source(metadata)
    source.poll()
    assert not source.interval_s  # no 403: the header was sent
    assert [p for p, _ in metadata.requests] == ["instance/maintenance-event",
                                                 "instance/preempted"]


def test_poll_blocks_with_wait_for_change_and_returns_as_soon_as_preempted(
    metadata: FakeMetadata,
) -> None:
    source = _source(metadata, wait_s=20)
    assert source.poll() is None  # first poll reads the value and its ETag
    threading.Timer(0.3, metadata.set, ("instance/preempted", "TRUE")).start()
    started = time.monotonic()
    notice = source.poll()
    assert notice is not None and notice.action == "preempt"
    assert time.monotonic() - started < 5  # woken by the change, not by timeout_sec
    path, query = metadata.requests[-1]
    assert path == "instance/preempted"
    assert query["wait_for_change"] == "true" and query["timeout_sec"] == "20"
    assert query["last_etag"]


def test_a_change_between_polls_is_not_missed(metadata: FakeMetadata) -> None:
    source = _source(metadata, wait_s=20)
    assert source.poll() is None
    metadata.set("instance/preempted", "TRUE")  # while nobody was waiting
    started = time.monotonic()
    assert source.poll() is not None
    assert time.monotonic() - started < 5  # last_etag differs: answered at once


def test_poll_returns_after_timeout_sec_without_a_change(metadata: FakeMetadata) -> None:
    source = _source(metadata, wait_s=1)
    source.poll()
    started = time.monotonic()
    assert source.poll() is None
    assert 0.8 < time.monotonic() - started < 5


@pytest.mark.parametrize(("event", "noticed"), [
    ("NONE", False), ("MIGRATE_ON_HOST_MAINTENANCE", False),
    ("TERMINATE_ON_HOST_MAINTENANCE", True),
])
def test_terminating_host_maintenance_is_a_notice(
    metadata: FakeMetadata, event: str, noticed: bool
) -> None:
    metadata.set("instance/maintenance-event", event)
    notice = _source(metadata).poll()
    assert (notice is not None) is noticed
    if notice is not None:
        assert notice.action == "maintenance"
        assert notice.reason.startswith("spot-interruption:maintenance@")


@pytest.mark.parametrize("status", [404, 403, 500, 503])
def test_an_error_status_is_no_notice_whatever_its_body(
    metadata: FakeMetadata, status: int
) -> None:
    metadata.respond("instance/preempted", status, "TRUE")
    assert _source(metadata).poll() is None


def test_an_unreachable_server_is_no_notice_and_backs_off() -> None:
    source = GceMetadataNoticeSource("127.0.0.1:9", error_backoff_s=2.5)
    assert source.poll() is None
    assert source.interval_s == 2.5


def test_the_host_comes_from_gce_metadata_host(
    metadata: FakeMetadata, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("GCE_METADATA_HOST", metadata.host)
    metadata.set("instance/preempted", "TRUE")
    source = GceMetadataNoticeSource()
    assert source.host == metadata.host
    assert source.poll() is not None
    monkeypatch.delenv("GCE_METADATA_HOST")
    assert GceMetadataNoticeSource().host == "metadata.google.internal"
