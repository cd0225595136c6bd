"""The CheckpointStore seam: a store whose staging is not where checkpoints are published (the
shape object storage has: write locally, upload the data files, the manifest last) works with
the unchanged Checkpointer, bit-exact on resume, and an upload cut before its manifest is
never resumed from."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any, Literal

import torch

from slurm_spot.checkpoint import Checkpointer, files
from slurm_spot.checkpoint import commit as commit_protocol
from slurm_spot.checkpoint.store import LocalStore, StagePlan
from tests.test_checkpoint import _state, _train


class CopyStore:
    """Publishes by copying a finished staging directory into ``remote``, manifest last."""

    def __init__(self, remote: Path, staging_root: Path) -> None:
        self.remote, self.staging_root = remote, staging_root

    @property
    def location(self) -> str:
        return str(self.remote)

    def latest(self, verify_checksums: bool = True) -> files.Checkpoint | None:
        return files.find_latest_valid(self.remote, verify_checksums)

    def stage(self, step: int) -> StagePlan:
        final = self.remote / files.step_dir_name(step)
        if final.exists() and not files.validate(files.Candidate(final, step, "dir"), False):
            return ("skip", str(final), f"{final} exists")
        return ("write", str(commit_protocol.new_temp_dir(self.staging_root, step)), "")

    def commit(self, staging: Path, step: int, kind: Literal["torch", "dcp"], world_size: int,
               meta: dict[str, Any], started_s: float | None = None) -> str:
        commit_protocol.write_manifest(staging, step, kind, world_size, meta, started_s=started_s)
        target = self.remote / files.step_dir_name(step)
        data = [p for p in sorted(staging.rglob("*")) if p.is_file() and p.name != files.MANIFEST_NAME]
        for path in [*data, staging / files.MANIFEST_NAME]:
            (target / path.relative_to(staging)).parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(path, target / path.relative_to(staging))
        shutil.rmtree(staging)
        return str(target)

    def prune(self, keep: int, newest: str) -> list[str]:
        return [str(p) for p in commit_protocol.prune(self.remote, keep, Path(newest))]

    # one writer, staging shared by the ranks: the token is the staging path
    def local_staging(self, token: str) -> Path:
        return Path(token)

    def upload(self, staging: Path, token: str,
               known: dict[str, dict[str, Any]] | None = None) -> dict[str, dict[str, Any]]:
        return {}

    def commit_manifest(self, token: str, kind: Literal["torch", "dcp"], world_size: int,
                        meta: dict[str, Any], files_: dict[str, dict[str, Any]],
                        started_s: float | None = None) -> str:
        step = int(Path(token).name.split(".")[0].removeprefix("step_"))
        return self.commit(Path(token), step, kind, world_size, meta, started_s)

    def abort(self, token: str) -> None:
        shutil.rmtree(token, ignore_errors=True)

    def discard_staging(self, staging: Path) -> None:
        return None

    def fetch(self, checkpoint: files.Checkpoint) -> files.Checkpoint:
        return checkpoint

    def has_committed(self) -> bool:
        return bool(files.list_candidates(self.remote))

    def release(self, checkpoint: files.Checkpoint) -> None:
        return None

    def committed(self) -> list[tuple[int, dict[str, Any]]]:
        return LocalStore(self.remote).committed()


def test_a_second_store_saves_and_resumes_bit_exact(tmp_path: Path) -> None:
    remote = tmp_path / "remote"
    reference = _train(None, total=23)
    first = CopyStore(remote, tmp_path / "staging-a")
    assert _train(first, total=23, stop_at=13) is None  # type: ignore[arg-type]
    assert [p.name for p in remote.iterdir()] == ["step_000000013"]
    assert list((tmp_path / "staging-a").iterdir()) == []  # nothing left behind locally
    resumed = _train(CopyStore(remote, tmp_path / "staging-b"), total=23)  # type: ignore[arg-type]
    assert reference is not None and resumed is not None
    for name, tensor in reference.items():
        assert torch.equal(tensor, resumed[name]), name


def test_an_upload_cut_before_its_manifest_is_not_resumed_from(tmp_path: Path) -> None:
    store = CopyStore(tmp_path / "remote", tmp_path / "staging")
    ckpt = Checkpointer(store, keep=2)
    assert ckpt.save(_state(5)) == tmp_path / "remote" / "step_000000005"
    cut = tmp_path / "remote" / "step_000000009"
    cut.mkdir()
    shutil.copyfile(tmp_path / "remote" / "step_000000005" / "state.pt", cut / "state.pt")
    found = ckpt.latest()
    assert found is not None and found.step == 5


def test_a_directory_means_the_local_store(tmp_path: Path) -> None:
    ckpt = Checkpointer(tmp_path / "ckpt")
    assert isinstance(ckpt.store, LocalStore) and ckpt.directory == tmp_path / "ckpt"
    assert ckpt.save(_state(3)) == tmp_path / "ckpt" / "step_000000003"
    found = Checkpointer(LocalStore(tmp_path / "ckpt")).latest()
    assert found is not None and found.step == 3 and found.kind == "torch"


def test_the_facade_keeps_its_names_and_its_torch_free_parts_stay_torch_free() -> None:
    import subprocess
    import sys

    code = ("import sys, slurm_spot.checkpoint.files, slurm_spot.checkpoint.store; "
            "assert 'torch' not in sys.modules, 'torch imported'; "
            "from slurm_spot.checkpoint import (Checkpointer, TrainState, PreemptionHandler, "
            "SkipSampler, CheckpointStore, LocalStore, find_latest_valid); "
            "import slurm_spot.checkpoint as c; "
            "print(all(hasattr(c, name) for name in c.__all__))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                         check=False)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "True"
