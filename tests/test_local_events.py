"""The local provider's events file and the source the reconciler follows (issue 26): a local
instance ended without notice is news within a fraction of a second, as an EC2 state-change
notification is through SQS. The instances here are real processes (``sleep``) ended by the
provider's own reclaim; the e2e on a real slurmctld is tests/test_spares_e2e.py."""

from __future__ import annotations

import json
import subprocess
import threading
import time
from collections.abc import Iterator
from datetime import datetime, timezone
from pathlib import Path

import pytest

from slurm_spot.config import SpotConfig, parse_config
from slurm_spot.events import UnsafeEventsFile
from slurm_spot.providers.base import InstanceState
from slurm_spot.providers.events import event_sources
from slurm_spot.providers.local.events import (
    MAX_BYTES,
    MAX_READ_BYTES,
    LocalEventSource,
    events_path,
    parse_line,
    publish,
)
from slurm_spot.providers.local.provider import RECLAIM_REASON, LocalProvider
from slurm_spot.reconcile.loop import ConfigSource, Loop
from tests.cluster import base_config
from tests.fakes.local_instance import INSTANCE_ID, sleeping_instance


@pytest.fixture
def config(tmp_path: Path) -> SpotConfig:
    return parse_config(base_config(tmp_path))


@pytest.fixture
def instance(config: SpotConfig) -> Iterator[tuple[LocalProvider, str, subprocess.Popen[bytes]]]:
    """A local instance record whose process is a real ``sleep`` in a session of its own."""
    provider = LocalProvider(config, "local", config.providers["local"])  # type: ignore[arg-type]
    with sleeping_instance(provider) as proc:
        yield provider, INSTANCE_ID, proc


def test_a_reclaim_without_notice_is_read_while_the_source_waits(instance, config) -> None:
    provider, instance_id, proc = instance
    source = event_sources(config)
    assert [type(s) for s in source] == [LocalEventSource]
    threading.Timer(0.3, provider.reclaim, args=("spot-1",)).start()
    started = time.monotonic()
    events = source[0].receive(5.0)
    waited = time.monotonic() - started
    assert proc.wait(timeout=5) != 0  # the process really ended
    assert [(e.provider, e.instance_id, e.state, e.ended) for e in events] == [
        ("local", instance_id, InstanceState.TERMINATED, True)]
    assert RECLAIM_REASON in events[0].detail
    # the reconciler reads the event's reason as a spot interruption
    assert "Server.SpotInstanceTermination" in events[0].reason
    assert waited < 2.0, f"the wait did not end at the event ({waited:.2f} s)"
    assert source[0].receive(0) == []  # each event once


def test_events_before_the_source_opened_are_the_passes_to_find(instance, config) -> None:
    provider, _, _ = instance
    provider.reclaim("spot-1")
    source = LocalEventSource("local", events_path(config.state_dir))
    assert source.receive(0.2) == []


def test_ending_an_ended_instance_again_publishes_nothing(instance, config) -> None:
    provider, _, _ = instance
    provider.reclaim("spot-1")
    source = LocalEventSource("local", events_path(config.state_dir))
    provider.terminate(["spot-1"])
    assert source.receive(0) == []


def test_a_half_written_line_waits_and_bad_lines_are_skipped(tmp_path: Path) -> None:
    path = tmp_path / "events.jsonl"
    source = LocalEventSource("local", path)
    good = json.dumps({"time": "2026-01-01T00:00:00+00:00", "instance_id": "loc-1",
                       "node": "spot-1", "state": "terminated", "reason": "r"})
    path.write_text("not json\n" + '{"state": "exploded", "instance_id": "x"}\n' + good[:20])
    assert source.receive(0) == []
    with open(path, "a") as fh:
        fh.write(good[20:] + "\n")
    events = source.receive(0)
    assert [e.instance_id for e in events] == ["loc-1"]
    assert events[0].time == datetime(2026, 1, 1, tzinfo=timezone.utc)


def test_a_file_started_afresh_is_read_from_its_start(tmp_path: Path) -> None:
    path = tmp_path / "local" / "events.jsonl"
    path.parent.mkdir()
    path.write_bytes(b"x" * (MAX_BYTES + 1) + b"\n")
    source = LocalEventSource("local", path)
    publish(path, "loc-2", "spot-2", InstanceState.TERMINATED, "Terminated by slurm-spot")
    assert path.stat().st_size < 1000
    assert [e.instance_id for e in source.receive(0)] == ["loc-2"]


def test_a_planted_symlink_is_refused_not_appended_to(tmp_path: Path) -> None:
    """The provider runs as root: a symlink at events.jsonl (planted where another account
    can write) made root append the event line to the file it named."""
    victim = tmp_path / "victim"
    victim.write_text("root's own file\n")
    path = tmp_path / "local" / "events.jsonl"
    path.parent.mkdir()
    path.symlink_to(victim)
    with pytest.raises(UnsafeEventsFile, match="is a symlink"):
        publish(path, "loc-3", "spot-3", InstanceState.TERMINATED, "r")
    assert victim.read_text() == "root's own file\n"
    path.unlink()
    path.hardlink_to(victim)
    with pytest.raises(UnsafeEventsFile, match="hard links"):
        publish(path, "loc-3", "spot-3", InstanceState.TERMINATED, "r")
    assert victim.read_text() == "root's own file\n"


def test_the_source_does_not_read_through_a_link_and_warns_once(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    secret = tmp_path / "secret"
    secret.write_text(json.dumps({"time": "2026-01-01T00:00:00+00:00", "instance_id": "loc-9",
                                  "node": "spot-9", "state": "terminated"}) + "\n")
    path = tmp_path / "events.jsonl"
    source = LocalEventSource("local", path, poll_s=0.01)
    path.symlink_to(secret)
    assert source.receive(0.05) == []
    assert sum("reading" in r.getMessage() for r in caplog.records) == 1


def test_odd_bytes_and_a_huge_line_are_skipped_and_later_lines_read(tmp_path: Path) -> None:
    """Non-UTF-8 bytes, a NUL-filled hole (a crash mid-write) and one line longer than a read
    are skipped; the event after them is read, and no read takes the whole line at once."""
    path = tmp_path / "events.jsonl"
    source = LocalEventSource("local", path)
    good = json.dumps({"time": "2026-01-01T00:00:00+00:00", "instance_id": "loc-1",
                       "node": "spot-1", "state": "terminated", "reason": "r\udcff"})
    path.write_bytes(b"\xff\xfe{\n" + b"\0" * 100 + b"\n" + b"x" * (2 * MAX_READ_BYTES + 5)
                     + b"\n" + good.encode() + b"\n")
    found = []
    for _ in range(5):
        found += source.receive(0)
    assert [e.instance_id for e in found] == ["loc-1"]


def test_a_missing_file_gives_no_events_and_no_error(tmp_path: Path) -> None:
    source = LocalEventSource("local", tmp_path / "nowhere" / "events.jsonl", poll_s=0.05)
    assert source.receive(0.1) == []
    assert parse_line("local", b"[]") is None


def test_the_loop_acts_on_an_instance_it_has_not_listed_yet_only_from_a_cluster_only_source(
        instance, config) -> None:
    """An instance launched after the last pass and killed before the next: the local file
    names only this cluster's instances, so its end starts a pass; the same event from a
    source without ``cluster_only`` (an account-wide queue) does not."""
    provider, instance_id, _ = instance
    own = LocalEventSource("local", events_path(config.state_dir))

    class AccountWide:
        provider = "local"

        def __init__(self) -> None:
            self.inner = LocalEventSource("local", events_path(config.state_dir))

        def receive(self, wait_s: float) -> list:
            return self.inner.receive(wait_s)

        def close(self) -> None:
            pass

    loop = Loop(ConfigSource(config), lambda cfg: None)  # type: ignore[arg-type,return-value]
    loop._sources = [AccountWide()]
    provider.reclaim("spot-1")
    assert loop._receive(0.5, known=set()) == []
    loop._sources = [own]
    assert [e.instance_id for e in loop._receive(0.5, known=set())] == [instance_id]


def test_an_instance_slurm_spot_terminated_is_not_read_as_reclaimed(instance) -> None:
    """'Terminated by slurm-spot' holds the word 'spot': a power-down's end must not count as
    a spot interruption (only the provider's reclaim does)."""
    provider, instance_id, proc = instance
    provider.terminate(["spot-1"])
    assert proc.wait(timeout=5) != 0
    (ended,) = [i for i in provider.list_instances() if i.instance_id == instance_id]
    assert not ended.state.is_alive
    assert "slurm-spot" in ended.state_reason and not ended.was_reclaimed


def test_an_instance_the_provider_reclaimed_is_read_as_reclaimed(instance) -> None:
    provider, instance_id, proc = instance
    provider.reclaim("spot-1")
    assert proc.wait(timeout=5) != 0
    (ended,) = [i for i in provider.list_instances() if i.instance_id == instance_id]
    assert ended.was_reclaimed
