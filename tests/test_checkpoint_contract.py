"""The checkpoint contract (issue 12, section 3), for the POSIX store and the S3 store: each a
bug found by trying bad input."""

from __future__ import annotations

import datetime
import decimal
import enum
import logging
import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from torch import nn

from slurm_spot.checkpoint import Checkpointer, CheckpointError, TrainState
from slurm_spot.checkpoint.s3 import S3Store
from slurm_spot.checkpoint.store import CheckpointStore, LocalStore
from tests.fakes.s3_server import client, keys, moto_s3, new_bucket
from tests.test_checkpoint import _state


class Colour(enum.Enum):
    RED = 1


@pytest.fixture(scope="module")
def endpoint() -> Iterator[str]:
    with moto_s3() as url:
        yield url


@pytest.fixture(params=["posix", "s3"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> CheckpointStore:
    if request.param == "posix":
        return LocalStore(tmp_path / "ckpt")
    ep = request.getfixturevalue("endpoint")
    return S3Store(f"s3://{new_bucket(ep)}/job 1+2=ß/", endpoint_url=ep,
                   addressing_style="path", staging_dir=str(tmp_path / "staging"))


@pytest.mark.parametrize("value", [
    np.float32(1.5), np.arange(3), datetime.datetime(2026, 12, 1), Colour.RED,
    Path("/data"), decimal.Decimal("1.5"), uuid.UUID(int=7), lambda: 1,
], ids=["numpy-scalar", "numpy-array", "datetime", "enum", "path", "decimal", "uuid", "lambda"])
def test_unrestorable_extra_is_refused_at_save_naming_the_key(store: CheckpointStore,
                                                              value: Any) -> None:
    state = _state(3)
    state.extra = {"ok": [1, 2.0, "x"], "nested": {"when": value}}
    ckpt = Checkpointer(store)
    with pytest.raises(CheckpointError, match=r"TrainState.extra\['nested'\]\['when'\]"):
        ckpt.save(state)
    assert store.latest() is None  # nothing was written
    state.extra = {"nested": {"when": "2026-12-01"}}
    assert ckpt.save(state)  # the fixed state saves and restores
    fresh = _state(0)
    Checkpointer(store).restore(fresh)
    assert fresh.extra == {"nested": {"when": "2026-12-01"}}


_DISK_FULL = """
import resource, signal, sys, torch
from slurm_spot.checkpoint import Checkpointer, TrainState, CheckpointError
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)   # a write past the limit fails with EFBIG
ckpt = Checkpointer(sys.argv[1])
small, big = torch.nn.Linear(4, 4), torch.nn.Linear(1024, 1024)
ckpt.save(TrainState(small, step=1))
resource.setrlimit(resource.RLIMIT_FSIZE, (1 << 20, resource.RLIM_INFINITY))
try:
    ckpt.save(TrainState(big, step=2))
    print("saved?!")
except CheckpointError as exc:
    print("failed:", exc)
resource.setrlimit(resource.RLIMIT_FSIZE, (resource.RLIM_INFINITY, resource.RLIM_INFINITY))
print("then:", ckpt.save(TrainState(big, step=3)))
"""


def test_a_failed_save_cleans_up_and_the_next_one_works(tmp_path: Path) -> None:
    """A file-size limit makes the 4 MB save fail mid-write (EFBIG, as a full disk's ENOSPC):
    no staging directory is left, and the next save succeeds."""
    out = subprocess.run([sys.executable, "-c", _DISK_FULL, str(tmp_path)], capture_output=True,
                         text=True, timeout=120, check=False)
    assert out.returncode == 0, out.stderr
    assert "failed:" in out.stdout and "nothing committed" in out.stdout, out.stdout
    assert "then:" in out.stdout
    assert sorted(os.listdir(tmp_path)) == ["step_000000001", "step_000000003"]


def test_a_failed_upload_leaves_nothing_in_the_bucket(endpoint: str, tmp_path: Path) -> None:
    bucket = new_bucket(endpoint)
    store = S3Store(f"s3://{bucket}/p", endpoint_url=endpoint, addressing_style="path",
                    staging_dir=str(tmp_path))
    Checkpointer(store).save(_state(1))
    before = keys(endpoint, bucket)

    def refuse_data(params: dict[str, Any], **_: Any) -> None:
        if params.get("Key", "").endswith("state.pt"):  # the data upload fails, not the rest
            raise OSError(28, "No space left on device")

    store.client.meta.events.register("before-parameter-build.s3.PutObject", refuse_data)
    with pytest.raises(CheckpointError, match="No space left on device"):
        Checkpointer(store).save(_state(2))
    assert keys(endpoint, bucket) == before
    assert [p for p in tmp_path.iterdir() if ".tmp-" in p.name] == []


def _corrupt_all(store: CheckpointStore, endpoint: str | None) -> None:
    if isinstance(store, LocalStore):
        for path in store.directory.glob("step_*/state.pt"):
            data = bytearray(path.read_bytes())
            data[100] ^= 0xFF
            path.write_bytes(bytes(data))
        return
    assert isinstance(store, S3Store) and endpoint
    s3 = client(endpoint)
    for key in keys(endpoint, store.bucket):
        if key.endswith("state.pt"):
            body = bytearray(s3.get_object(Bucket=store.bucket, Key=key)["Body"].read())
            body[100] ^= 0xFF
            s3.put_object(Bucket=store.bucket, Key=key, Body=bytes(body))


def test_none_valid_refuses_to_start_from_zero(store: CheckpointStore,
                                               request: pytest.FixtureRequest,
                                               caplog: pytest.LogCaptureFixture) -> None:
    endpoint = request.getfixturevalue("endpoint") if isinstance(store, S3Store) else None
    Checkpointer(store).save(_state(4))
    _corrupt_all(store, endpoint)
    fresh = _state(0)
    with pytest.raises(CheckpointError, match=r"none is valid.*refusing to start from step 0"):
        Checkpointer(store).restore(fresh)
    assert fresh.step == 0
    with caplog.at_level(logging.ERROR):
        assert Checkpointer(store, start_fresh_if_invalid=True).restore(fresh) is None
    assert "starting from step 0 as configured" in caplog.text


def test_a_different_shape_fails_before_any_tensor_is_overwritten(
        store: CheckpointStore) -> None:
    torch.manual_seed(0)
    saved = nn.Sequential(nn.Linear(4, 8), nn.Linear(8, 2))
    Checkpointer(store).save(TrainState(saved, step=2))
    other = nn.Sequential(nn.Linear(4, 8), nn.Linear(8, 3))  # first layer fits, second not
    before = {k: v.clone() for k, v in other.state_dict().items()}
    with pytest.raises(CheckpointError, match=r"does not fit this model.*1.weight"):
        Checkpointer(store).restore(TrainState(other))
    for name, tensor in before.items():
        assert torch.equal(other.state_dict()[name], tensor), f"{name} was overwritten"


def test_explicit_resume_path_wins_first_then_newest_after_requeue(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    pretrained = Checkpointer(tmp_path / "pretrained").save(_state(100))
    job = Checkpointer(tmp_path / "job")
    job.save(_state(7))  # the job's own progress
    monkeypatch.delenv("SLURM_RESTART_COUNT", raising=False)
    first = _state(0)
    with caplog.at_level(logging.INFO):
        found = job.restore(first, resume_from=pretrained)
    assert found is not None and found.step == 100 and first.step == 100
    assert "given on the command line; first run" in caplog.text
    monkeypatch.setenv("SLURM_RESTART_COUNT", "1")
    caplog.clear()
    again = _state(0)
    with caplog.at_level(logging.INFO):
        found = job.restore(again, resume_from=pretrained)
    assert found is not None and found.step == 7 and again.step == 7
    assert "restart 1: resuming from the newest valid checkpoint" in caplog.text
    monkeypatch.delenv("SLURM_RESTART_COUNT")
    with pytest.raises(CheckpointError, match="cannot resume from"):
        job.restore(_state(0), resume_from=tmp_path / "nope")
