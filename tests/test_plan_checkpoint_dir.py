"""``slurm-spot plan --checkpoint-dir``: the checkpoint cost C from the save times the
checkpoint library recorded, for checkpoints written by the library itself (local and S3)."""

from __future__ import annotations

import json
import math
import statistics
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner

from slurm_spot.checkpoint import Checkpointer
from slurm_spot.checkpoint import commit as commit_protocol
from slurm_spot.cli import cli
from slurm_spot.jsonenvelope import read_envelope
from tests.fakes.s3_server import moto_s3, new_bucket
from tests.test_checkpoint import _state


def run(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(cli, list(args))
    return result.exit_code, result.output


@pytest.fixture(autouse=True)
def _no_site_config(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("SLURM_SPOT_CONFIG", str(tmp_path / "absent.yaml"))


def _saved(directory: str | Path, steps: list[int]) -> None:
    ckpt = Checkpointer(directory, keep=len(steps))
    for step in steps:
        ckpt.save(_state(step))


def _recorded(directory: Path) -> dict[int, float]:
    return {int(p.name.removeprefix("step_")): json.loads((p / "manifest.json").read_text())
            ["save_s"] for p in directory.glob("step_*")}


def test_plan_takes_the_median_recorded_save_time(tmp_path: Path) -> None:
    job = tmp_path / "alice" / "4711"
    _saved(job, [100, 200, 300])
    recorded = _recorded(job)
    assert sorted(recorded) == [100, 200, 300] and all(v >= 0 for v in recorded.values())
    median = statistics.median(recorded.values())

    code, out = run("plan", "--checkpoint-dir", str(job), "--mtbf-h", "24", "--json")
    assert code == 0, out
    data = read_envelope(out)
    assert data["checkpoint_s"] == median
    source = data["checkpoint_source"]
    assert source["location"] == str(job) and source["median_save_s"] == median
    assert [(c["step"], c["save_s"]) for c in source["checkpoints"]] == [
        (s, recorded[s]) for s in (300, 200, 100)]
    assert all(c["size_bytes"] > 0 for c in source["checkpoints"])
    # the same plan as with C given by hand
    code, given = run("plan", "--checkpoint-s", repr(median), "--mtbf-h", "24", "--json")
    assert read_envelope(given)["daly_interval_s"] == data["daly_interval_s"]
    assert data["young_interval_s"] == pytest.approx(math.sqrt(2 * median * 86400))

    code, text = run("plan", "--checkpoint-dir", str(job), "--mtbf-h", "24")
    assert code == 0, text
    assert (f"median save_s of 3 checkpoint(s) in {job} (steps 300, 200, 100)"
            in text.splitlines()[0])


def test_plan_compare_says_which_checkpoints_it_read(tmp_path: Path) -> None:
    _saved(tmp_path / "job", [5])
    code, out = run("plan", "--compare", "--checkpoint-dir", str(tmp_path / "job"),
                    "--work-steps", "1000", "--candidate", "a2-highgpu-1g:1:<5%")
    assert code == 0, out
    assert "median save_s of 1 checkpoint(s)" in out and "(steps 5)" in out


def test_no_recorded_save_time_is_exit_2_saying_what_to_do(tmp_path: Path) -> None:
    code, out = run("plan", "--checkpoint-dir", str(tmp_path / "absent"), "--mtbf-h", "24")
    assert code == 2 and "no such directory" in out
    empty = tmp_path / "empty"
    empty.mkdir()
    code, out = run("plan", "--checkpoint-dir", str(empty), "--mtbf-h", "24")
    assert code == 2
    assert "no committed checkpoint there records its save time" in out
    assert "give --checkpoint-s instead" in out
    # a committed checkpoint whose manifest has no save_s (written without a start time)
    staging = commit_protocol.new_temp_dir(empty, 7)
    (staging / "state.pt").write_bytes(b"x")
    commit_protocol.write_manifest(staging, 7, "torch", 1)
    commit_protocol.commit(staging, 7)
    code, out = run("plan", "--checkpoint-dir", str(empty), "--mtbf-h", "24")
    assert code == 2 and "records its save time" in out


@pytest.mark.parametrize("args", [
    [], ["--checkpoint-s", "60", "--checkpoint-dir", "/tmp"]])
def test_exactly_one_checkpoint_cost_option(args: list[str]) -> None:
    code, out = run("plan", *args, "--mtbf-h", "24")
    assert code == 2
    assert "give exactly one of --checkpoint-s" in out


@pytest.fixture(scope="module")
def endpoint() -> Iterator[str]:
    with moto_s3() as url:
        yield url


def test_plan_reads_the_save_times_of_checkpoints_on_s3(endpoint: str, tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    bucket = new_bucket(endpoint)
    monkeypatch.setenv("SLURM_SPOT_S3_ENDPOINT_URL", endpoint)
    monkeypatch.setenv("SLURM_SPOT_S3_ADDRESSING_STYLE", "path")
    monkeypatch.setenv("SLURM_SPOT_STAGING_DIR", str(tmp_path / "staging"))
    url = f"s3://{bucket}/bob/99/"
    _saved(url, [10, 20])
    code, out = run("plan", "--checkpoint-dir", url, "--mtbf-h", "24", "--json")
    assert code == 0, out
    data = read_envelope(out)
    saves = data["checkpoint_source"]["checkpoints"]
    assert [c["step"] for c in saves] == [20, 10]
    assert data["checkpoint_s"] == statistics.median(c["save_s"] for c in saves)

    code, out = run("plan", "--checkpoint-dir", f"s3://{bucket}/nobody/", "--mtbf-h", "24")
    assert code == 2 and "records its save time" in out
