"""Checkpoints on S3 (moto in server mode, a real HTTP endpoint): save, list, resume, retention,
a writer killed mid-upload, a corrupted object, throttling on one rank, odd keys; and the async
save (field cases async-dcp-deadlock, async-pinned-memory-fork, async-writer-hang)."""

from __future__ import annotations

import json
import logging
import multiprocessing as mp
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

from slurm_spot.checkpoint import Checkpointer, CheckpointError, TrainState
from slurm_spot.checkpoint.s3 import S3Store, parse_s3_url
from slurm_spot.checkpoint.store import LocalStore, open_store
from tests.fakes.s3_server import client, keys, moto_s3, new_bucket, s3_error_response
from tests.test_checkpoint import _free_port, _state, _train

ODD = "team runs/job+1=ä ö ü/"  # a space, +, = and non-ASCII characters in the prefix


@pytest.fixture(scope="module")
def endpoint() -> Iterator[str]:
    with moto_s3() as url:
        yield url


def _store(endpoint: str, bucket: str, prefix: str = ODD, **kw: Any) -> S3Store:
    return S3Store(f"s3://{bucket}/{prefix}", endpoint_url=endpoint, addressing_style="path",
                   **kw)


def test_url_parsing_and_store_choice(tmp_path: Path) -> None:
    assert parse_s3_url("s3://b/a b/c+d=é/") == ("b", "a b/c+d=é/")
    assert parse_s3_url("s3://b") == ("b", "")
    with pytest.raises(CheckpointError, match="not an s3://bucket/prefix"):
        parse_s3_url("s3:///nobucket")
    assert isinstance(open_store("s3://b/p", endpoint_url="http://x"), S3Store)
    assert isinstance(open_store(tmp_path), LocalStore)
    with pytest.raises(CheckpointError, match="addressing style"):
        S3Store("s3://b/p", addressing_style="sideways")


def test_save_list_resume_bit_exact_with_odd_keys(endpoint: str, tmp_path: Path,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    bucket = new_bucket(endpoint)
    monkeypatch.setenv("SLURM_SPOT_S3_ENDPOINT_URL", endpoint)  # as the TaskProlog exports it
    monkeypatch.setenv("SLURM_SPOT_S3_ADDRESSING_STYLE", "path")
    monkeypatch.setenv("SLURM_SPOT_STAGING_DIR", str(tmp_path / "staging"))
    url = f"s3://{bucket}/{ODD}"
    reference = _train(None, total=23)
    assert _train(url, total=23, stop_at=13) is None  # type: ignore[arg-type]
    listed = keys(endpoint, bucket)
    manifest_key = f"{ODD}step_000000013/manifest.json"
    assert manifest_key in listed
    data = [k for k in listed if k.endswith("/state.pt")]
    assert len(data) == 1 and data[0].startswith(f"{ODD}step_000000013/")
    assert not [k for k in listed if "_inflight" in k]  # the marker went with the commit
    manifest = json.loads(client(endpoint).get_object(Bucket=bucket, Key=manifest_key)["Body"]
                          .read())
    entry = manifest["files"]["state.pt"]
    assert manifest["size_bytes"] == entry["size"] and manifest["save_s"] >= 0
    resumed = _train(url, total=23)  # type: ignore[arg-type]
    assert reference is not None and resumed is not None
    for name, tensor in reference.items():
        assert torch.equal(tensor, resumed[name]), name
    assert list((tmp_path / "staging").glob("*.tmp-*")) == []  # staging cleaned up


def test_retention_keeps_k_committed_and_waits_for_uploads_in_flight(endpoint: str,
                                                                     tmp_path: Path) -> None:
    bucket = new_bucket(endpoint)
    store = _store(endpoint, bucket, staging_dir=str(tmp_path))
    ckpt = Checkpointer(store, keep=2)
    for step in (1, 2, 3):
        ckpt.save(_state(step))
    assert store.steps() == [3, 2]
    # another writer's upload of step 4 is in flight: retention must not run
    plan = store.stage(4)
    assert plan[0] == "write"
    ckpt.save(_state(5))
    assert [s for s, _ in store.committed()] == [5, 3, 2]
    store.abort(plan[1])  # that writer gave up: its marker is gone, the next save prunes
    ckpt.save(_state(6))
    assert [s for s, _ in store.committed()] == [6, 5]
    assert not [k for k in keys(endpoint, bucket) if "step_000000004" in k]


def test_a_step_is_never_written_twice(endpoint: str, tmp_path: Path,
                                       caplog: pytest.LogCaptureFixture) -> None:
    bucket = new_bucket(endpoint)
    store = _store(endpoint, bucket, staging_dir=str(tmp_path))
    ckpt = Checkpointer(store)
    first = ckpt.save(_state(7))
    before = {k: client(endpoint).head_object(Bucket=bucket, Key=k)["ETag"]
              for k in keys(endpoint, bucket)}
    changed = _state(7)
    with torch.no_grad():
        changed.model.weight.add_(1.0)
    with caplog.at_level(logging.WARNING):
        assert ckpt.save(changed) == first
    assert "already exists; not overwriting it" in caplog.text
    after = {k: client(endpoint).head_object(Bucket=bucket, Key=k)["ETag"]
             for k in keys(endpoint, bucket)}
    assert after == before


def test_corrupted_object_is_skipped_with_a_warning(endpoint: str, tmp_path: Path,
                                                    caplog: pytest.LogCaptureFixture) -> None:
    bucket = new_bucket(endpoint)
    store = _store(endpoint, bucket, staging_dir=str(tmp_path))
    ckpt = Checkpointer(store, keep=3)
    ckpt.save(_state(1))
    ckpt.save(_state(2))
    key = next(k for k in keys(endpoint, bucket) if "step_000000002/" in k
               and k.endswith("state.pt"))
    body = bytearray(client(endpoint).get_object(Bucket=bucket, Key=key)["Body"].read())
    body[len(body) // 2] ^= 0xFF  # same size, one flipped byte
    client(endpoint).put_object(Bucket=bucket, Key=key, Body=bytes(body))
    fresh = _state(0)
    with caplog.at_level(logging.WARNING):
        found = Checkpointer(_store(endpoint, bucket, staging_dir=str(tmp_path))).restore(fresh)
    assert found is not None and found.step == 1 and fresh.step == 1
    assert "step_000000002" in caplog.text and "sha256 does not match" in caplog.text


_KILL_CHILD = """
import sys, torch
from slurm_spot.checkpoint.s3 import S3Store
from slurm_spot.checkpoint import Checkpointer, TrainState
store = S3Store(sys.argv[1], endpoint_url=sys.argv[2], addressing_style="path",
                staging_dir=sys.argv[3], part_size=5 << 20, max_concurrency=1)
model = torch.nn.Linear(4096, 4096)  # 64 MiB of weights: 13 parts, one at a time
print("saving", flush=True)
Checkpointer(store).save(TrainState(model, step=9))
print("committed", flush=True)
"""


def test_writer_killed_mid_upload_resume_uses_the_previous_checkpoint(endpoint: str,
                                                                      tmp_path: Path) -> None:
    bucket = new_bucket(endpoint)
    url = f"s3://{bucket}/{ODD}"
    store = _store(endpoint, bucket, staging_dir=str(tmp_path))
    Checkpointer(store).save(_state(5))
    s3 = client(endpoint)
    child = subprocess.Popen([sys.executable, "-c", _KILL_CHILD, url, endpoint, str(tmp_path)],
                             stdout=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:  # kill it once a multipart upload is under way
            if s3.list_multipart_uploads(Bucket=bucket).get("Uploads"):
                break
            assert child.poll() is None, "the writer finished before it could be killed"
            time.sleep(0.02)
        else:
            pytest.fail("no multipart upload started")
        child.send_signal(signal.SIGKILL)
    finally:
        child.wait(timeout=30)
    assert child.returncode == -signal.SIGKILL
    assert store.manifest(9) is None  # parts uploaded, no manifest: step 9 does not exist
    assert s3.list_multipart_uploads(Bucket=bucket).get("Uploads")
    assert [k for k in keys(endpoint, bucket) if "_inflight/step_000000009" in k]
    fresh = _state(0)
    found = Checkpointer(_store(endpoint, bucket, staging_dir=str(tmp_path))).restore(fresh)
    assert found is not None and found.step == 5 and fresh.step == 5
    # a new save of step 9 goes into a fresh attempt and commits
    again = Checkpointer(_store(endpoint, bucket, staging_dir=str(tmp_path),
                                inflight_stale_s=0.0)).save(_state(9))
    assert str(again).endswith("step_000000009")
    assert not s3.list_multipart_uploads(Bucket=bucket).get("Uploads")  # the dead one aborted
    assert store.latest() is not None and store.latest().step == 9  # type: ignore[union-attr]


# -- several ranks ---------------------------------------------------------------------------


def _rank(rank: int, world: int, port: int, scenario: str, args: dict[str, Any],
          out: Any) -> None:
    import torch.distributed as dist

    logging.basicConfig(level=logging.WARNING)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        out.put((rank, globals()[f"_scenario_{scenario}"](rank, args)))
    except BaseException as exc:  # report, do not hang the parent
        out.put((rank, {"crash": f"{type(exc).__name__}: {exc}"}))
    finally:
        dist.destroy_process_group()


def _scenario_throttled(rank: int, args: dict[str, Any]) -> dict[str, Any]:
    """Rank 1's S3 answers every PUT with 503 SlowDown (after botocore's retries): no rank
    may count the checkpoint, and the store still resumes from the previous one."""

    store = S3Store(args["url"], endpoint_url=args["endpoint"], addressing_style="path",
                    staging_dir=args["staging"])
    model = nn.Linear(8, 4)
    ckpt = Checkpointer(store, writer_timeout_s=120)
    first = ckpt.save(TrainState(model, step=1), sharded=True)
    if rank == 1:
        def throttle(request: Any, **_: Any) -> Any:
            if request.method in ("PUT", "POST"):
                return s3_error_response(request.url, 503, "SlowDown",
                                         "Please reduce your request rate.")
            return None
        store.client.meta.events.register("before-send.s3", throttle)
    error = ""
    try:
        ckpt.save(TrainState(model, step=2), sharded=True)
    except CheckpointError as exc:
        error = str(exc)
    found = ckpt.latest()
    return {"first": str(first), "error": error, "latest": found.step if found else None}



def _scenario_async_barrier(rank: int, args: dict[str, Any]) -> dict[str, Any]:
    """async-dcp-deadlock: two async DCP saves one step apart with a dist.barrier() on the
    default group in between, while the writers' collectives run."""
    import torch.distributed as dist

    torch.manual_seed(0)  # the same weights on every rank, as data parallel training keeps them
    model = nn.Linear(64, 64)
    ckpt = Checkpointer(open_store(args["root"], endpoint_url=args.get("endpoint"),
                                   addressing_style="path", staging_dir=args["staging"])
                        if args["root"].startswith("s3://") else args["root"],
                        writer_timeout_s=60)
    steps = []
    for step in (1, 2):
        with torch.no_grad():
            model.weight.add_(1.0)
        ckpt.save_async(TrainState(model, step=step), sharded=True)
        dist.barrier()  # the training loop's collective, concurrently with the writer's
        dist.all_reduce(torch.ones(4))
        steps.append(step)
    ckpt.wait(60)
    expected = model.weight.detach().clone()
    fresh = nn.Linear(64, 64)
    found = ckpt.restore(TrainState(fresh))
    return {"steps": steps, "latest": found.step if found else None,
            "restored": torch.equal(fresh.weight, expected)}


def _scenario_unpicklable(rank: int, args: dict[str, Any]) -> dict[str, Any]:
    """Only rank 0's extra holds a lambda: every rank refuses the save (no rank hangs)."""
    model = nn.Linear(4, 4)
    ckpt = Checkpointer(args["root"], writer_timeout_s=60)
    extra = {"fn": (lambda x: x)} if rank == 0 else {"fn": "identity"}
    started = time.monotonic()
    try:
        ckpt.save(TrainState(model, step=3, extra=extra))
        error = ""
    except CheckpointError as exc:
        error = str(exc)
    return {"error": error, "seconds": time.monotonic() - started,
            "latest": ckpt.latest() is not None}


def _spawn(world: int, scenario: str, args: dict[str, Any], timeout_s: float = 180) -> dict[
        int, Any]:
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    port = _free_port()
    procs = [ctx.Process(target=_rank, args=(r, world, port, scenario, args, out))
             for r in range(world)]
    for p in procs:
        p.start()
    results: dict[int, Any] = {}
    try:
        for _ in procs:
            rank, value = out.get(timeout=timeout_s)
            results[rank] = value
    finally:
        for p in procs:
            p.join(timeout=30)
            if p.is_alive():
                p.kill()
                p.join(timeout=10)
    return results


def test_throttling_on_one_rank_means_no_rank_advances(endpoint: str, tmp_path: Path) -> None:
    bucket = new_bucket(endpoint)
    url = f"s3://{bucket}/{ODD}"
    results = _spawn(2, "throttled", {"url": url, "endpoint": endpoint,
                                      "staging": str(tmp_path)})
    for rank in (0, 1):
        assert "crash" not in results[rank], results[rank]
        assert "rank 1" in results[rank]["error"] and "nothing committed" in results[rank]["error"]
        assert results[rank]["latest"] == 1, results[rank]
    store = _store(endpoint, bucket, staging_dir=str(tmp_path))
    assert store.manifest(2) is None
    assert not [k for k in keys(endpoint, bucket) if "step_000000002" in k]  # cleaned up


def test_a_non_picklable_extra_on_one_rank_fails_every_rank_without_hanging(
        tmp_path: Path) -> None:
    results = _spawn(2, "unpicklable", {"root": str(tmp_path)}, timeout_s=120)
    for rank in (0, 1):
        assert "rank 0" in results[rank]["error"], results[rank]
        assert "TrainState.extra['fn']" in results[rank]["error"]
        assert results[rank]["latest"] is False
    assert not list(tmp_path.iterdir())  # nothing staged, nothing committed


@pytest.mark.parametrize("where", ["posix", "s3"])
def test_async_saves_with_a_barrier_on_the_training_group_do_not_deadlock(
        where: str, endpoint: str, tmp_path: Path) -> None:
    args: dict[str, Any] = {"root": str(tmp_path / "ckpt"), "staging": str(tmp_path / "st")}
    if where == "s3":
        args.update(root=f"s3://{new_bucket(endpoint)}/{ODD}", endpoint=endpoint)
    results = _spawn(2, "async_barrier", args, timeout_s=240)
    for rank in (0, 1):
        assert results[rank] == {"steps": [1, 2], "latest": 2, "restored": True}, results[rank]


# -- async save, one process -----------------------------------------------------------------


def test_async_snapshot_is_not_the_trainers_memory(endpoint: str, tmp_path: Path) -> None:
    """async-pinned-memory-fork: the trainer changes its tensors in place right after the
    hand-off; the checkpoint holds the values at the hand-off."""
    for root in (str(tmp_path / "posix"), f"s3://{new_bucket(endpoint)}/{ODD}"):
        store = open_store(root, endpoint_url=endpoint, addressing_style="path",
                           staging_dir=str(tmp_path / "st")) if root.startswith("s3") \
            else LocalStore(root)
        state = _state(3)
        expected = {k: v.clone() for k, v in state.model.state_dict().items()}
        ckpt = Checkpointer(store)
        handle = ckpt.save_async(state)
        with torch.no_grad():
            for p in state.model.parameters():
                p.mul_(0).add_(42.0)  # the trainer reuses its memory at once
        handle.wait(60)
        fresh = _state(0)
        found = Checkpointer(store).restore(fresh)
        assert found is not None and found.step == 3
        for name, tensor in expected.items():
            assert torch.equal(fresh.model.state_dict()[name], tensor), (root, name)


class _HangingStore(LocalStore):
    """A store whose upload never returns until ``release`` is set (a dead writer)."""

    def __init__(self, directory: Path) -> None:
        super().__init__(directory)
        self.release = threading.Event()

    def upload(self, staging: Path, token: str,
               known: dict[str, dict[str, Any]] | None = None) -> dict[str, dict[str, Any]]:
        self.release.wait(60)
        return super().upload(staging, token, known)


def test_a_hung_writer_times_out_naming_the_checkpoint(tmp_path: Path) -> None:
    """async-writer-hang: every wait on a writer has a timeout and names the checkpoint; no
    second writer starts while the first is alive."""
    store = _HangingStore(tmp_path)
    ckpt = Checkpointer(store, writer_timeout_s=0.5)
    started = time.monotonic()
    handle = ckpt.save_async(_state(4))
    assert time.monotonic() - started < 5  # training goes on
    with pytest.raises(CheckpointError, match=r"step 4 .*did not finish within 0.5 s"):
        handle.wait()
    with pytest.raises(CheckpointError, match="step 4"):
        ckpt.save(_state(5))  # at most one in flight: the hung one blocks a second writer
    store.release.set()
    assert ckpt.wait(10) == tmp_path / "step_000000004"
    assert ckpt.save(_state(5)) == tmp_path / "step_000000005"


def test_final_save_on_preemption_waits_for_the_inflight_one(endpoint: str,
                                                             tmp_path: Path) -> None:
    store = _store(endpoint, new_bucket(endpoint), staging_dir=str(tmp_path))
    ckpt = Checkpointer(store, keep=3)
    ckpt.save_async(_state(10))
    final = ckpt.save_final(_state(11), within_s=60)
    assert str(final).endswith("step_000000011")
    assert [s for s, _ in store.committed()] == [11, 10]


def test_preemption_waits_for_the_inflight_save_then_saves_the_final_state(
        endpoint: str, tmp_path: Path) -> None:
    """A real SIGUSR2 while an async save is uploading: the handler lets it commit within the
    notice (``@90``), saves the final step and exits with the requeue code."""
    from slurm_spot.checkpoint.preemption import PreemptionHandler

    store = _store(endpoint, new_bucket(endpoint), staging_dir=str(tmp_path))
    ckpt = Checkpointer(store, keep=3)
    handler = PreemptionHandler(env={"SLURM_SPOT_PREEMPT_SIGNAL": "USR2@90"}).install()
    try:
        ckpt.save_async(_state(20))
        os.kill(os.getpid(), signal.SIGUSR2)
        assert handler.should_stop()
        assert 0 < handler.notice_left_s() <= 90
        with pytest.raises(SystemExit) as stopped:
            handler.checkpoint_and_exit(ckpt, _state(21))
    finally:
        handler.uninstall()  # restores the handlers from before install()
    assert stopped.value.code == 85
    assert [s for s, _ in store.committed()] == [21, 20]
