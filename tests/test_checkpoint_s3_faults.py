"""S3 checkpoints under faults (issue 25, "Nothing lost, nobody in"), against moto's server.

Faults are injected with botocore's ``before-send`` event on the store's own client: the hook
can forward the real request to moto first and then answer 500 or drop the connection, which
is what S3 does when it stored an object but the answer is lost. botocore's own retries run as
they would against S3 (the store's client: standard mode, 5 attempts).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import boto3
import pytest
from botocore.awsrequest import AWSResponse
from botocore.config import Config
from botocore.exceptions import ConnectionClosedError
from botocore.httpsession import URLLib3Session

from slurm_spot.checkpoint import Checkpointer, CheckpointError
from slurm_spot.checkpoint.s3 import S3Store
from tests.fakes.s3_server import client, keys, moto_s3, new_bucket, s3_error_response
from tests.test_checkpoint import _state

PREFIX = "job 25/"


@pytest.fixture(scope="module")
def endpoint() -> Iterator[str]:
    with moto_s3() as url:
        yield url



def _error(request: Any, status: int, code: str) -> AWSResponse:
    return s3_error_response(request.url, status, code)


class Faults:
    """``before-send`` hooks on one store's client; ``sent`` counts the requests that matched."""

    def __init__(self, store: S3Store) -> None:
        self.store = store
        self.sent: list[str] = []
        self._forward = URLLib3Session()

    def on(self, method: str, key_suffix: str,
           answer: Callable[[Any], Any], times: int = 1_000, after: str = "") -> None:
        """For the next ``times`` ``method`` requests whose key ends with ``key_suffix``, call
        ``answer(request)`` instead of sending; with ``after``, only once a request labelled
        ``after`` (``"PUT <suffix>"``) met its fault."""
        left = [times]

        def hook(request: Any, **_: Any) -> Any:
            if request.method != method or not request.url.split("?")[0].endswith(key_suffix) \
                    or left[0] <= 0 or (after and after not in self.sent):
                return None
            left[0] -= 1
            self.sent.append(f"{method} {key_suffix}")
            return answer(request)

        self.store.client.meta.events.register("before-send.s3", hook)

    def stored_then(self, status: int, code: str) -> Callable[[Any], Any]:
        """S3 stores the request, the client gets ``status``."""
        def answer(request: Any) -> Any:
            self._forward.send(request)
            return _error(request, status, code)
        return answer

    def stored_then_dropped(self, request: Any) -> Any:
        """S3 stores the request, the connection drops before the answer."""
        self._forward.send(request)
        raise ConnectionClosedError(endpoint_url=request.url)


def _store(endpoint: str, bucket: str, tmp_path: Path, **kw: Any) -> S3Store:
    return S3Store(f"s3://{bucket}/{PREFIX}", endpoint_url=endpoint, addressing_style="path",
                   staging_dir=str(tmp_path / "staging"), **kw)


def _two_attempts_client(endpoint: str) -> Any:
    """An S3 client that tries each call twice (botocore's standard retry mode), so that
    back-off on injected errors that never stop stays short."""
    return boto3.session.Session().client(
        "s3", endpoint_url=endpoint, region_name="us-east-1",
        config=Config(s3={"addressing_style": "path"},  # type: ignore[typeddict-item]
                      retries={"total_max_attempts": 2, "mode": "standard"}))


def _restored_step(endpoint: str, bucket: str, tmp_path: Path) -> int | None:
    fresh = _state(0)
    found = Checkpointer(_store(endpoint, bucket, tmp_path)).restore(fresh)
    return None if found is None else fresh.step


def _data_keys(endpoint: str, bucket: str, step: int) -> list[str]:
    return [k for k in keys(endpoint, bucket)
            if f"step_{step:09d}/" in k and not k.endswith("manifest.json")]


@pytest.mark.parametrize("fault", ["500", "dropped"])
def test_a_manifest_s3_stored_but_answered_badly_is_a_committed_save(
        fault: str, endpoint: str, tmp_path: Path) -> None:
    """The manifest PUT reached S3 but the client saw a 500 / a dropped connection (botocore
    retried with If-None-Match and got 412): the save reads the manifest back, finds its own,
    and reports success; the data stays and restore loads that step."""
    bucket = new_bucket(endpoint)
    store = _store(endpoint, bucket, tmp_path)
    ckpt = Checkpointer(store, keep=2)
    ckpt.save(_state(1))
    faults = Faults(store)
    answer = faults.stored_then(500, "InternalError") if fault == "500" \
        else faults.stored_then_dropped
    faults.on("PUT", "step_000000002/manifest.json", answer, times=1 if fault == "500" else 99)
    saved = ckpt.save(_state(2))
    assert faults.sent  # the fault did happen
    assert str(saved).endswith("step_000000002")
    assert _data_keys(endpoint, bucket, 2)  # the data the manifest names is still there
    assert _restored_step(endpoint, bucket, tmp_path) == 2


def test_a_manifest_whose_fate_is_unknown_keeps_its_data(endpoint: str, tmp_path: Path,
                                                         ) -> None:
    """The manifest PUT was stored, answered 500, and S3 cannot be read back either: the save
    fails as "outcome unknown" and deletes nothing, so the stored manifest stays loadable."""
    bucket = new_bucket(endpoint)
    store = _store(endpoint, bucket, tmp_path, client=_two_attempts_client(endpoint))
    ckpt = Checkpointer(store, keep=2)
    ckpt.save(_state(1))
    faults = Faults(store)
    faults.on("PUT", "step_000000002/manifest.json", faults.stored_then(500, "InternalError"))
    put = "PUT step_000000002/manifest.json"
    for method in ("GET", "HEAD"):
        faults.on(method, "step_000000002/manifest.json",
                  lambda request: _error(request, 503, "ServiceUnavailable"), after=put)
    with pytest.raises(CheckpointError, match="failed, commit outcome unknown") as failed:
        ckpt.save(_state(2))
    assert "nothing committed" not in str(failed.value)
    assert _data_keys(endpoint, bucket, 2)
    assert _restored_step(endpoint, bucket, tmp_path) == 2
    # a retry of the step finds it committed and loadable: reported saved, not rewritten
    assert str(Checkpointer(_store(endpoint, bucket, tmp_path)).save(_state(2))).endswith(
        "step_000000002")


def test_a_manifest_put_that_never_reached_s3_commits_nothing(endpoint: str,
                                                               tmp_path: Path) -> None:
    """The connection drops before S3 stored the manifest: read back, nothing is there, so the
    save fails as "nothing committed" and its upload is deleted."""
    bucket = new_bucket(endpoint)
    store = _store(endpoint, bucket, tmp_path, client=_two_attempts_client(endpoint))
    ckpt = Checkpointer(store, keep=2)
    ckpt.save(_state(1))

    def dropped(request: Any) -> Any:
        raise ConnectionClosedError(endpoint_url=request.url)

    Faults(store).on("PUT", "step_000000002/manifest.json", dropped)
    with pytest.raises(CheckpointError, match="failed, nothing committed"):
        ckpt.save(_state(2))
    assert not [k for k in keys(endpoint, bucket) if "step_000000002/" in k]
    assert _restored_step(endpoint, bucket, tmp_path) == 1


def _dangling(endpoint: str, bucket: str, step: int) -> None:
    """What main left after an ambiguous commit: the manifest of ``step`` without its data."""
    s3 = client(endpoint)
    for key in _data_keys(endpoint, bucket, step):
        s3.delete_object(Bucket=bucket, Key=key)


def test_a_save_of_a_step_whose_manifest_dangles_writes_a_loadable_checkpoint(
        endpoint: str, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    bucket = new_bucket(endpoint)
    store = _store(endpoint, bucket, tmp_path)
    ckpt = Checkpointer(store, keep=3)
    ckpt.save(_state(1))
    ckpt.save(_state(2))
    _dangling(endpoint, bucket, 2)
    with caplog.at_level(logging.WARNING):
        saved = ckpt.save(_state(2))
    assert str(saved).endswith("step_000000002")
    assert "not usable" in caplog.text and "step_000000002" in caplog.text
    assert _restored_step(endpoint, bucket, tmp_path) == 2


def test_retention_counts_only_checkpoints_that_verify(endpoint: str, tmp_path: Path) -> None:
    """keep=2 with a dangling manifest at step 3: retention keeps 4 (new) and 2 (the newest
    older one that verifies), deletes the dangling 3 and the old 1."""
    bucket = new_bucket(endpoint)
    store = _store(endpoint, bucket, tmp_path)
    ckpt = Checkpointer(store, keep=3)
    for step in (1, 2, 3):
        ckpt.save(_state(step))
    _dangling(endpoint, bucket, 3)
    Checkpointer(store, keep=2).save(_state(4))
    assert store.steps() == [4, 2]
    assert [s for s, _ in store.committed()] == [4, 2]
    s3 = client(endpoint)
    s3.delete_object(Bucket=bucket, Key=f"{PREFIX}step_000000004/manifest.json")
    assert _restored_step(endpoint, bucket, tmp_path) == 2  # the older valid one is there


class _Clock:
    def __init__(self) -> None:
        import time

        self.offset_s = 0.0
        self._time = time.time

    def __call__(self) -> float:
        return self._time() + self.offset_s


def _killed_save(endpoint: str, bucket: str, store: S3Store, step: int) -> str:
    """What a save killed mid-upload leaves: its in-flight marker and a multipart upload with
    one part under its attempt. Returns the upload id."""
    plan = store.stage(step)
    assert plan[0] == "write"
    attempt = plan[1].split(":")[1]
    key = f"{PREFIX}step_{step:09d}/{attempt}/state.pt"
    s3 = client(endpoint)
    upload_id = s3.create_multipart_upload(Bucket=bucket, Key=key)["UploadId"]
    s3.upload_part(Bucket=bucket, Key=key, UploadId=upload_id, PartNumber=1,
                   Body=b"x" * (5 << 20))
    return str(upload_id)


def test_a_killed_save_holds_retention_back_for_minutes_not_hours(endpoint: str,
                                                                  tmp_path: Path) -> None:
    clock = _Clock()
    bucket = new_bucket(endpoint)
    store = _store(endpoint, bucket, tmp_path, clock=clock)
    ckpt = Checkpointer(store, keep=2)
    for step in (1, 2):
        ckpt.save(_state(step))
    _killed_save(endpoint, bucket, store, 50)
    s3 = client(endpoint)
    ckpt.save(_state(3))  # the dead writer may still be alive: retention waits
    assert [s for s, _ in store.committed()] == [3, 2, 1]
    clock.offset_s = 16 * 60.0  # no progress for 16 minutes: the writer is dead
    ckpt.save(_state(4))
    assert [s for s, _ in store.committed()] == [4, 3]
    assert not s3.list_multipart_uploads(Bucket=bucket, Prefix=PREFIX).get("Uploads")
    assert not [k for k in keys(endpoint, bucket) if "_inflight/" in k]


def test_progress_keeps_a_slow_save_alive(endpoint: str, tmp_path: Path) -> None:
    """An old marker whose attempt still makes progress (a part uploaded recently) is live."""
    clock = _Clock()
    bucket = new_bucket(endpoint)
    store = _store(endpoint, bucket, tmp_path, clock=clock)
    upload_id = _killed_save(endpoint, bucket, store, 50)
    assert store.inflight()
    clock.offset_s = 9 * 60.0
    assert store.inflight()  # 9 minutes without progress: still live
    clock.offset_s = 16 * 60.0
    assert store.inflight() == []
    assert upload_id


def test_every_manifest_unreadable_refuses_to_start_from_step_0(endpoint: str,
                                                                tmp_path: Path) -> None:
    bucket = new_bucket(endpoint)
    store = _store(endpoint, bucket, tmp_path)
    ckpt = Checkpointer(store, keep=3)
    for step in (1, 2):
        ckpt.save(_state(step))
    s3 = client(endpoint)
    for step in (1, 2):
        s3.put_object(Bucket=bucket, Key=f"{PREFIX}step_{step:09d}/manifest.json",
                      Body=b"{truncated")
    fresh = _state(0)
    with pytest.raises(CheckpointError,
                       match=r"holds checkpoints but none is valid .*refusing to start from "
                             r"step 0"):
        Checkpointer(_store(endpoint, bucket, tmp_path)).restore(fresh)
    assert fresh.step == 0
    # the escape hatch works as with the local store
    assert Checkpointer(_store(endpoint, bucket, tmp_path),
                        start_fresh_if_invalid=True).restore(fresh) is None


def test_a_failed_async_save_is_logged_once_and_the_next_save_writes_its_own(
        endpoint: str, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    bucket = new_bucket(endpoint)
    store = _store(endpoint, bucket, tmp_path)
    faults = Faults(store)
    faults.on("PUT", "state.pt", lambda request: _error(request, 403, "AccessDenied"),
              times=1)
    ckpt = Checkpointer(store, keep=2)
    with caplog.at_level(logging.ERROR):
        ckpt.save_async(_state(1))
        saved = ckpt.save(_state(2))
    assert str(saved).endswith("step_000000002")
    failures = [r for r in caplog.records if "step 1" in r.getMessage()]
    assert len(failures) == 1, [r.getMessage() for r in failures]
    assert "AccessDenied" in failures[0].getMessage()
    assert _restored_step(endpoint, bucket, tmp_path) == 2
    assert [s for s, _ in store.committed()] == [2]


def test_a_failed_async_save_still_raises_to_whoever_waits_on_it(endpoint: str,
                                                                  tmp_path: Path) -> None:
    bucket = new_bucket(endpoint)
    store = _store(endpoint, bucket, tmp_path)
    faults = Faults(store)
    faults.on("PUT", "state.pt", lambda request: _error(request, 403, "AccessDenied"),
              times=1)
    ckpt = Checkpointer(store, keep=2)
    handle = ckpt.save_async(_state(1))
    with pytest.raises(CheckpointError, match="AccessDenied"):
        handle.wait(60)
    assert str(ckpt.save(_state(2))).endswith("step_000000002")
    manifest = json.loads(client(endpoint).get_object(
        Bucket=bucket, Key=f"{PREFIX}step_000000002/manifest.json")["Body"].read())
    assert manifest["step"] == 2


def test_an_uploading_save_refreshes_its_marker_at_most_every_interval() -> None:
    """The transfer callback re-puts the marker once ``every_s`` passed, not per chunk."""
    from slurm_spot.checkpoint.s3inflight import Heartbeat

    class Recorder:
        def __init__(self) -> None:
            self.puts: list[str] = []

        def put_object(self, **kwargs: Any) -> None:
            self.puts.append(kwargs["Key"])

    now = [1000.0]
    recorder = Recorder()
    beat = Heartbeat(recorder, "b", "p/_inflight/step_000000001.ab", 300.0, lambda: now[0])
    for _ in range(50):  # many chunks within the interval: no refresh
        beat(8192)
    assert recorder.puts == []
    now[0] += 301.0
    beat(8192)
    beat(8192)
    assert recorder.puts == ["p/_inflight/step_000000001.ab"]


def test_the_final_save_after_a_failed_async_save_reports_that_failure_once(
        endpoint: str, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """On a preemption the in-flight save had failed: the final save still commits and the
    old failure is in the log once (its writer's line), not again from the final save."""
    bucket = new_bucket(endpoint)
    store = _store(endpoint, bucket, tmp_path)
    Faults(store).on("PUT", "state.pt", lambda request: _error(request, 403, "AccessDenied"),
                     times=1)
    ckpt = Checkpointer(store, keep=2)
    with caplog.at_level(logging.ERROR):
        ckpt.save_async(_state(1))
        final = ckpt.save_final(_state(2), within_s=60)
    assert str(final).endswith("step_000000002")
    assert len([r for r in caplog.records if "step 1" in r.getMessage()]) == 1
