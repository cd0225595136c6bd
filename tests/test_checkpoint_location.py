"""Where checkpoints live (slurm_spot/contract/location.py): which store a root names and
the per-job layout, the one home the prolog, the job environment, the Checkpointer and
``cost`` share (issue 23)."""

from __future__ import annotations

from pathlib import Path

import pytest

from slurm_spot.contract.jobenv import checkpoint_dir
from slurm_spot.contract.location import as_location, is_job_key, is_s3, job_directory, job_key


def test_an_s3_url_stays_a_url_and_a_directory_becomes_a_path() -> None:
    assert as_location("s3://bucket//a b/") == "s3://bucket//a b/"  # no folding of '//'
    assert as_location("/ckpt/alice/12") == Path("/ckpt/alice/12")
    assert is_s3("s3://b/p") and is_s3(as_location("s3://b")) and not is_s3(Path("/s3:/b"))
    # the job's side reads the same answer from its environment
    assert checkpoint_dir({"SLURM_SPOT_CHECKPOINT_DIR": "s3://b/x/alice/7"}) == "s3://b/x/alice/7"
    assert checkpoint_dir({"SLURM_SPOT_CHECKPOINT_DIR": "/c/alice/7"}) == Path("/c/alice/7")
    assert checkpoint_dir({}) is None


def test_the_per_job_layout_for_both_stores_and_array_tasks() -> None:
    assert job_directory(Path("/ckpt"), "alice", "12") == Path("/ckpt/alice/12")
    assert job_directory("s3://b/prefix/", "alice", job_key(12, 10, 2)) == \
        "s3://b/prefix/alice/10_2"
    assert job_key("12") == "12" and is_job_key("10_2") and not is_job_key("10_")


@pytest.mark.parametrize("args", [("12", "10", None), ("1 2",), ("12", "x", "2")])
def test_a_key_that_is_not_a_job_id_is_refused(args: tuple) -> None:
    with pytest.raises(ValueError):
        job_key(*args)


def test_a_checkpointer_on_an_s3_root_keeps_its_url(tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """Checkpointer.directory turned ``s3://bucket/prefix`` into ``Path('s3:/bucket/prefix')``."""
    from slurm_spot.checkpoint import Checkpointer

    monkeypatch.setenv("SLURM_SPOT_STAGING_DIR", str(tmp_path))  # as the TaskProlog exports it
    ckpt = Checkpointer("s3://bucket/runs//alice/7")
    assert ckpt.directory == "s3://bucket/runs//alice/7"
    assert Checkpointer(tmp_path / "c").directory == tmp_path / "c"


def test_a_new_url_scheme_is_one_line_in_location(monkeypatch: pytest.MonkeyPatch) -> None:
    """docs/DESIGN.md, "Adding a checkpoint store": a store with a URL scheme is registered in
    URL_SCHEMES; its roots stay strings and join with '/' (a Path would fold 'gs://')."""
    from slurm_spot.contract import location

    monkeypatch.setattr(location, "URL_SCHEMES", (*location.URL_SCHEMES, "gs://"))
    assert location.as_location("gs://bucket/ckpt") == "gs://bucket/ckpt"
    assert location.job_directory(location.as_location("gs://bucket/ckpt/"), "alice", "7") \
        == "gs://bucket/ckpt/alice/7"
    assert not location.is_s3("gs://bucket/ckpt")
    assert location.as_location("/data/gs:/x") == Path("/data/gs:/x")
