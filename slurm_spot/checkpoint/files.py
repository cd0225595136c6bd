"""The on-disk side of checkpoints: layout, manifests, validation and resolving (the commit
protocol that writes them is :mod:`slurm_spot.checkpoint.commit`).

No torch here, so the prologue, the CLI and tests can resolve checkpoints without it.

Layout of a checkpoint directory (one per job, ``<root>/<user>/<key>``:
:mod:`slurm_spot.contract.location`)::

    step_000000500/            a committed checkpoint of step 500
        state.pt               everything, one torch.save archive (non-sharded save), or
        meta.pt + .metadata + __<rank>_0.distcp   a torch.distributed.checkpoint save + meta
        manifest.json          written last: step, kind, world size, time, size+sha256 per file
    step_000000750.tmp-1a2b3c4d/   a save in progress (or killed): never a candidate

Commit protocol (:mod:`slurm_spot.checkpoint.commit`): write the data
files into a temporary directory, fsync them, write ``manifest.json`` (itself through a
temporary name) as the last file, fsync the directory, rename it to ``step_<9 digits>`` and
fsync the parent. The rename is the commit point; a checkpoint counts only if its manifest is
present and every listed file has the recorded size and sha256.

Plain single-file checkpoints written by other code (``ckpt_000750.pt``: a name ending in a
step number and ``.pt``/``.pth``/``.ckpt``) are candidates too; such a file is valid only if it is
a complete zip archive (what ``torch.save`` writes) whose members all lie inside the file and,
with checksum verification, pass their CRC check. A truncated archive lacks the end record.

Resolving (:func:`find_latest_valid`, :func:`scan`) only reads: it never creates, renames or
deletes anything, and it never follows symlinks (a ``last.ckpt`` pointer is not trusted).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import stat
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from slurm_spot.errors import CheckpointError

MANIFEST_NAME = "manifest.json"
#: The payload of a non-sharded checkpoint (``torch.save`` by rank 0: model, optimizer, ...).
STATE_FILE = "state.pt"
#: Beside the DCP shards of a sharded checkpoint: step, scheduler, RNG states (rank 0).
META_FILE = "meta.pt"
FORMAT = "slurm-spot-checkpoint/1"
_DIR_RE = re.compile(r"^step_(?P<step>\d+)$")
#: A staging directory of :func:`~slurm_spot.checkpoint.commit.new_temp_dir`, never a checkpoint.
TEMP_DIR_RE = re.compile(r"^step_\d+\.tmp-[0-9a-f]+$")
_FILE_RE = re.compile(r"^(?!\.)(?P<stem>.*?)(?P<step>\d+)\.(?:pt|pth|ckpt)$")
_TEMP_MARKERS = (".tmp", ".partial", ".incomplete", "~")
_CHUNK = 1 << 20


@dataclass(frozen=True)
class Candidate:
    """A directory entry that looks like a checkpoint: ``kind`` is ``dir`` (``step_N/``) or
    ``file`` (a single ``*<N>.pt`` archive). ``step`` is parsed from the name."""

    path: Path
    step: int
    kind: Literal["dir", "file"]


@dataclass(frozen=True)
class Checkpoint:
    """A validated checkpoint.

    Attributes:
        path: the ``step_N`` directory or the single archive file.
        step: its step number (from the name; equal to the manifest's for a directory).
        kind: ``torch`` (``state.pt``), ``dcp`` (torch.distributed.checkpoint + ``meta.pt``)
            or ``file`` (a single foreign archive).
        manifest: the parsed manifest (``None`` for a single file).
    """

    path: Path
    step: int
    kind: Literal["torch", "dcp", "file"]
    manifest: dict[str, Any] | None = None


@dataclass(frozen=True)
class Verdict:
    """The result of validating one candidate: ``reason`` is empty when it is valid."""

    candidate: Candidate
    reason: str

    @property
    def valid(self) -> bool:
        return not self.reason


def step_dir_name(step: int) -> str:
    """``step_000000500`` for 500 (nine digits, so names sort like steps up to 10**9)."""
    if step < 0:
        raise ValueError(f"checkpoint step must be >= 0, got {step}")
    return f"step_{step:09d}"


_KINDS = {stat.S_IFREG: "a regular file", stat.S_IFIFO: "a FIFO", stat.S_IFSOCK: "a socket",
          stat.S_IFCHR: "a character device", stat.S_IFBLK: "a block device",
          stat.S_IFDIR: "a directory", stat.S_IFLNK: "a symlink"}


def _kind(mode: int) -> str:
    return _KINDS.get(stat.S_IFMT(mode), "not a directory")


def root_problem(directory: str | os.PathLike[str]) -> str:
    """Why ``directory`` cannot be a checkpoint directory, or ``""``. Reads only.

    A missing directory is fine (the first save creates it); so is a symlink to a directory
    (the job's own choice of where its checkpoints live, e.g. a link to scratch). Refused: an
    existing entry that is not a directory (a regular file, a symlink to one, a dangling
    symlink, a FIFO, ...), a path under such an entry, and an empty or blank path (``Path("")``
    is the current directory: an unset ``$SLURM_SPOT_CHECKPOINT_DIR`` would checkpoint into
    wherever the job was started). The message starts with the path.
    """
    if not os.fspath(directory).strip():
        return (f"{os.fspath(directory)!r} is an empty path: give the directory to keep "
                "checkpoints in (an empty path would mean the current directory)")
    path = Path(directory)
    try:
        info = os.stat(path)
    except FileNotFoundError:
        if os.path.islink(path):
            return f"{path} is a symlink to {os.readlink(path)}, which does not exist"
        return ""
    except NotADirectoryError:
        for parent in reversed(path.absolute().parents):
            try:
                mode = os.stat(parent).st_mode
            except OSError:
                break
            if not stat.S_ISDIR(mode):
                return (f"{path}: {parent} is "
                        f"{_kind(mode)}, not a directory")
        return f"{path}: a part of it is not a directory"
    except OSError:
        return ""  # e.g. no permission to look: the save reports its own error then
    if stat.S_ISDIR(info.st_mode):
        return ""
    if os.path.islink(path):
        return (f"{path} is a symlink to {os.readlink(path)}, which is {_kind(info.st_mode)}, "
                "not a directory")
    return f"{path} is {_kind(info.st_mode)}, not a directory"


def _is_temp_name(name: str) -> bool:
    return name.startswith(".") or any(marker in name for marker in _TEMP_MARKERS)


def list_candidates(directory: str | os.PathLike[str]) -> list[Candidate]:
    """Checkpoint-like entries of ``directory``, newest step first (a directory before a file
    of the same step). Temp names, dotfiles and symlinks are never candidates. A missing
    directory gives ``[]``. Reads only the directory listing."""
    found: list[Candidate] = []
    try:
        entries = list(os.scandir(directory))
    except (FileNotFoundError, NotADirectoryError):
        return []
    except PermissionError as exc:
        raise CheckpointError(f"{directory}: cannot list the checkpoint directory: "
                              f"{exc.strerror}") from None
    for entry in entries:
        if entry.is_symlink() or _is_temp_name(entry.name):
            continue
        dir_match = _DIR_RE.match(entry.name)
        if dir_match and entry.is_dir(follow_symlinks=False):
            found.append(Candidate(Path(entry.path), int(dir_match["step"]), "dir"))
            continue
        file_match = _FILE_RE.match(entry.name)
        if file_match and entry.is_file(follow_symlinks=False):
            found.append(Candidate(Path(entry.path), int(file_match["step"]), "file"))
    found.sort(key=lambda c: (-c.step, c.kind != "dir", c.path.name))
    return found


def symlinked_steps(directory: str | os.PathLike[str]) -> list[Candidate]:
    """``step_N`` entries of ``directory`` that are symlinks, newest first (a missing directory
    gives ``[]``). They are never candidates (:func:`list_candidates`) and never followed: the
    same listing is read by code running as root on the node (the manifest reader of the
    interruption watcher, ``docs/DESIGN.md``: "no symlink following"), pruning would delete
    through them, and a step directory this library wrote is never a symlink. A store counts
    them as checkpoints that exist but are not valid. Reads only the directory listing."""
    try:
        entries = list(os.scandir(directory))
    except OSError:
        return []
    found = [Candidate(Path(e.path), int(m["step"]), "dir") for e in entries
             if (m := _DIR_RE.match(e.name)) and e.is_symlink()]
    return sorted(found, key=lambda c: -c.step)


def file_digest(path: str | os.PathLike[str]) -> tuple[int, str]:
    """``(size in bytes, sha256 hex)`` of a regular file, read in 1 MiB chunks."""
    digest = hashlib.sha256()
    size = 0
    with open(path, "rb") as fh:
        while chunk := fh.read(_CHUNK):
            digest.update(chunk)
            size += len(chunk)
    return size, digest.hexdigest()


def known_digest(path: Path, entry: Any) -> tuple[int, str] | None:
    """``(size, sha256)`` of a manifest entry computed while ``path`` was written, if it is
    one (a dict with an int ``size`` and a str ``sha256``) and ``path`` still has that size;
    None means: hash the file (:func:`file_digest`)."""
    if not isinstance(entry, dict) or not isinstance(entry.get("sha256"), str) \
            or not isinstance(entry.get("size"), int):
        return None
    return (entry["size"], entry["sha256"]) if path.stat().st_size == entry["size"] else None


def read_manifest(directory: Path) -> dict[str, Any]:
    """The parsed ``manifest.json`` of a checkpoint directory (not followed if a symlink).

    Raises:
        CheckpointError: missing, not a regular file, not JSON, or not a slurm-spot manifest.
    """
    path = directory / MANIFEST_NAME
    try:
        if not stat.S_ISREG(os.lstat(path).st_mode):
            raise CheckpointError(f"{path}: not a regular file")
        data = json.loads(path.read_text())
    except FileNotFoundError:
        raise CheckpointError(f"{path}: no manifest (the save did not finish)") from None
    except (OSError, ValueError) as exc:
        raise CheckpointError(f"{path}: unreadable manifest: {exc}") from None
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise CheckpointError(f"{path}: not a {FORMAT} manifest")
    if not isinstance(data.get("files"), dict) or not data["files"]:
        raise CheckpointError(f"{path}: the manifest lists no files")
    return data


def _check_dir(candidate: Candidate, verify_checksums: bool) -> str:
    try:
        manifest = read_manifest(candidate.path)
    except CheckpointError as exc:
        return str(exc)
    if manifest.get("step") != candidate.step:
        return f"manifest step {manifest.get('step')!r} does not match the name's {candidate.step}"
    for rel, expected in manifest["files"].items():
        problem = _check_listed_file(candidate.path, rel, expected, verify_checksums)
        if problem:
            return problem
    return ""


def _check_listed_file(root: Path, rel: str, expected: Any, verify_checksums: bool) -> str:
    parts = Path(rel).parts
    if not parts or Path(rel).is_absolute() or ".." in parts or not isinstance(expected, dict):
        return f"manifest entry {rel!r} is not a plain relative path with size and sha256"
    path = root / rel
    try:
        info = os.lstat(path)
    except OSError:
        return f"{rel}: listed in the manifest but missing"
    if not stat.S_ISREG(info.st_mode):
        return f"{rel}: not a regular file"
    if info.st_size != expected.get("size"):
        return f"{rel}: {info.st_size} bytes, the manifest says {expected.get('size')}"
    if verify_checksums and file_digest(path)[1] != expected.get("sha256"):
        return f"{rel}: sha256 does not match the manifest"
    return ""


def _check_archive(path: Path, verify_checksums: bool) -> str:
    """Why a single ``torch.save`` archive is unusable, or ``""``."""
    try:
        size = os.lstat(path).st_size
        with zipfile.ZipFile(path) as archive:
            members = archive.infolist()
            if not any(m.filename.endswith("data.pkl") for m in members):
                return "a zip archive but not a torch.save one (no data.pkl)"
            for m in members:
                if m.header_offset + 30 + len(m.filename) + m.compress_size > size:
                    return f"member {m.filename} extends past the end of the file (truncated)"
            if verify_checksums and (bad := archive.testzip()) is not None:
                return f"member {bad} fails its CRC check"
    except zipfile.BadZipFile as exc:
        return f"not a complete zip archive ({exc}): truncated, or torch's legacy format"
    except (OSError, EOFError, ValueError, RuntimeError) as exc:
        return f"unreadable archive: {exc}"
    return ""


def validate(candidate: Candidate, verify_checksums: bool = True) -> str:
    """Why ``candidate`` is not a usable checkpoint, or ``""`` if it is. Reads only.

    Args:
        candidate: from :func:`list_candidates`.
        verify_checksums: also hash every file (directories) or CRC-check every member
            (archives); without it only presence, sizes and structure are checked.
    """
    try:
        if candidate.kind == "dir":
            return _check_dir(candidate, verify_checksums)
        return _check_archive(candidate.path, verify_checksums)
    except OSError as exc:  # unreadable file or directory: not usable, try an older one
        return f"cannot read it: {exc.strerror or exc}"


def scan(directory: str | os.PathLike[str], verify_checksums: bool = True) -> list[Verdict]:
    """Every candidate of ``directory`` with its verdict, newest first (for logs and the CLI)."""
    return [Verdict(c, validate(c, verify_checksums)) for c in list_candidates(directory)]


def as_checkpoint(candidate: Candidate) -> Checkpoint:
    """The :class:`Checkpoint` of a candidate that passed :func:`validate`: a ``file``
    candidate as it is, a directory with its manifest read (kind ``dcp`` or ``torch``).

    Raises:
        CheckpointError: the directory's manifest is missing or malformed (it changed since it
            was validated).
    """
    if candidate.kind == "file":
        return Checkpoint(candidate.path, candidate.step, "file")
    manifest = read_manifest(candidate.path)
    if manifest.get("kind") == "dcp":
        return Checkpoint(candidate.path, candidate.step, "dcp", manifest)
    return Checkpoint(candidate.path, candidate.step, "torch", manifest)


def iter_valid(
    directory: str | os.PathLike[str], verify_checksums: bool = True
) -> Iterator[Checkpoint]:
    """Valid checkpoints of ``directory``, newest step first, validated lazily. Reads only."""
    for candidate in list_candidates(directory):
        if not validate(candidate, verify_checksums):
            yield as_checkpoint(candidate)


def find_latest_valid(
    directory: str | os.PathLike[str], verify_checksums: bool = True
) -> Checkpoint | None:
    """The valid checkpoint with the highest step number in ``directory``, or ``None``.

    Ordered by the step in the name (never by mtime); temp files, symlinks (``last.ckpt``) and
    invalid candidates (no or bad manifest, size or checksum mismatch, truncated archive) are
    skipped. Writes nothing.
    """
    return next(iter_valid(directory, verify_checksums), None)


@dataclass(frozen=True)
class SaveCost:
    """What a job's recent saves cost, from their manifests (:func:`save_costs`).

    Attributes:
        save_s: the longest ``save_s`` of the recent checkpoints (seconds), None if none
            recorded one.
        size_bytes: the newest checkpoint's total size (bytes), None without a checkpoint.
        step_s: seconds per training step between the two newest checkpoints (their
            ``created_unix_s`` and steps), None with fewer than two.
        checkpoints: how many manifests were read.
    """

    save_s: float | None = None
    size_bytes: int | None = None
    step_s: float | None = None
    checkpoints: int = 0


def save_costs(directory: str | os.PathLike[str], newest: int = 3) -> SaveCost:
    """Read the manifests of the ``newest`` committed ``step_N`` directories of ``directory``
    (no checksums, no symlinks followed, nothing written) and summarise what saving costs:
    ``save_s``/``size_bytes`` from each manifest's ``meta`` (what :class:`Checkpointer` writes)
    or its top level (:func:`~slurm_spot.checkpoint.commit.write_manifest` with ``started_s``).

    Unreadable or foreign entries are skipped; a missing directory gives ``SaveCost()``.
    Values outside plausible ranges (negative, over a day) are ignored: the manifest is written
    by the job, and its reader may run as root.
    """
    manifests: list[dict[str, Any]] = []
    try:
        candidates = [c for c in list_candidates(directory) if c.kind == "dir"]
    except CheckpointError:
        return SaveCost()
    for cand in candidates[:newest]:
        try:
            manifests.append(read_manifest(cand.path))
        except CheckpointError:
            continue
    if not manifests:
        return SaveCost()
    def field(manifest: dict[str, Any], name: str) -> Any:
        meta = manifest.get("meta")
        value = manifest.get(name)
        return meta.get(name, value) if isinstance(meta, dict) else value

    saves = [float(v) for m in manifests
             if isinstance(v := field(m, "save_s"), (int, float)) and 0 <= v < 86400]
    size = field(manifests[0], "size_bytes")
    step_s = None
    if len(manifests) >= 2:
        (a, b) = manifests[0], manifests[1]
        try:
            dt = float(a["created_unix_s"]) - float(b["created_unix_s"])
            ds = int(a["step"]) - int(b["step"])
            if ds > 0 and 0 <= dt < 86400:
                step_s = dt / ds
        except (KeyError, TypeError, ValueError):
            step_s = None
    return SaveCost(save_s=max(saves) if saves else None,
                    size_bytes=int(size) if isinstance(size, int) and size >= 0 else None,
                    step_s=step_s, checkpoints=len(manifests))
