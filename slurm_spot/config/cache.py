"""The validated-config cache: a hook that finds ``spot.yaml`` unchanged since it was last
validated gets it without YAML parsing, pydantic or the models (issue 26: a hook's CPU was
mostly pydantic building the models, 0.33-0.46 s per call).

How a hook loads its config (:func:`load_hook_config`):

1. read the file's bytes and ``fstat`` from one descriptor (:func:`.source.read_config_bytes`:
   regular file, size bound, writable by its owner only, owned by root when run as root);
2. compute the key (:func:`cache_key`): the file's absolute path, device, inode, size,
   ``st_mtime_ns``, the SHA-256 of *the bytes just read*, and a stamp of this code (package
   version plus size and mtime of the schema modules);
3. look in ``<state_dir>/config-cache/<sha256 of the path>.json`` (``state_dir`` is read from
   the same bytes with PyYAML's C loader; nothing else of them is parsed) for an entry with
   exactly that key; on a hit, return a read-only view of the stored validated config;
4. on a miss, validate as ``load_config`` does and store the result for the next hook.

A stale entry is never used: the key holds the hash of the bytes this process read, so a file
edited at any time (even within one mtime tick, or while the hook runs) gives another key. What
the hook acts on is always the validated form of the bytes it read.

Trust: the directory ``config-cache`` is opened without following a symlink and, like each
entry (opened ``O_NOFOLLOW`` relative to it), must be owned by root (or by the user running
the hook, when that is not root) and writable by its owner only; otherwise the cache is not
used (nor written), and the hook validates the file itself. Entries are written to a temporary
name and renamed into place (atomic), with the config file's read bits (at most 0644). A cache
that cannot be read or written only costs time: it never fails a hook.

The view (:class:`SpotConfigView`) answers every field of :class:`~.models.SpotConfig` and the
methods a hook uses before it detaches (``node_set``, ``node_set_of``, ``all_nodes``,
``node_names``, ``hostlist``, ``is_s3``, ``source_path``); :func:`as_model` turns it into the
real model (validated again, with the credentials-file checks) for the work that needs more.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import stat
import time
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import slurm_spot
from slurm_spot.config.plain import (
    DEFAULT_STATE_DIR,
    find_node_set,
    hostlist_of,
    node_names,
    node_set_for,
)
from slurm_spot.config.source import ConfigBytes, config_path, read_config_bytes

if TYPE_CHECKING:
    from slurm_spot.config.models import SpotConfig

log = logging.getLogger(__name__)

CACHE_DIR = "config-cache"
FORMAT = 1
MAX_ENTRY_BYTES = 4 * 1024 * 1024
_SCHEMA_MODULES = ("models.py", "provider_models.py", "base.py", "plain.py", "cache.py", "loader.py",
                   "yamlfile.py", "source.py")


def load_hook_config(path: str | os.PathLike[str] | None = None) -> SpotConfig:
    """The validated config for a hook: from the cache when it holds these very bytes, else
    validated (and stored). The result may be a :class:`SpotConfigView` (typed as the model
    it stands for; see the module docstring for what it answers).

    Args:
        path: explicit file; ``None`` applies :func:`~.source.config_path`.

    Raises:
        ConfigError: as :func:`~slurm_spot.config.load_config` (never for a cache problem).
    """
    source = read_config_bytes(config_path(path))
    key = cache_key(source)
    entry = entry_path(source)
    if entry is not None:
        view = read_entry(entry, key)
        if view is not None:
            return cast("SpotConfig", view)
    from slurm_spot.config.loader import validate_config_bytes

    config = validate_config_bytes(source)
    if entry is not None and entry.parent.parent == config.state_dir:
        store_entry(entry, key, config, source)
    return config


def as_model(config: SpotConfig) -> SpotConfig:
    """``config`` as the pydantic model: a :class:`SpotConfigView` is validated again from its
    stored fields (and its credentials files checked, as at load); a model is returned as is.

    Raises:
        ConfigError: the stored config no longer validates (a credentials file became
            writable by others, say), naming the config file.
    """
    view = cast(object, config)
    return view.to_model() if isinstance(view, SpotConfigView) else config


def cache_key(source: ConfigBytes) -> dict[str, object]:
    """The key of one read of the config file (see the module docstring): JSON-ready."""
    info = source.info
    return {"format": FORMAT, "path": str(source.path.absolute()), "dev": info.st_dev,
            "ino": info.st_ino, "size": info.st_size, "mtime_ns": info.st_mtime_ns,
            "sha256": hashlib.sha256(source.raw).hexdigest(), "code": _code_stamp()}


def _code_stamp() -> list[object]:
    """This code's version and the (size, mtime) of the modules that shape a stored config,
    so an upgrade or an edit of the schema never reads an entry written by older code."""
    here = Path(__file__).parent
    stamp: list[object] = [slurm_spot.__version__]
    for name in _SCHEMA_MODULES:
        try:
            info = os.stat(here / name)
        except OSError:
            stamp.append(None)
        else:
            stamp.append([info.st_size, info.st_mtime_ns])
    return stamp


def entry_path(source: ConfigBytes) -> Path | None:
    """``<state_dir>/config-cache/<sha256 of the absolute path>.json`` for ``source``, with
    ``state_dir`` read from its top-level mapping (default ``/var/lib/slurm-spot``), or None
    when the bytes do not give one plainly (full validation will say what is wrong)."""
    try:
        import yaml

        loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
        data = yaml.load(source.raw, Loader=loader)
    except Exception:  # any problem is validation's to report, with its line
        return None
    if not isinstance(data, dict):
        return None
    state_dir = data.get("state_dir", str(DEFAULT_STATE_DIR))
    if not isinstance(state_dir, str) or not os.path.isabs(state_dir):
        return None
    name = hashlib.sha256(str(source.path.absolute()).encode("utf-8", "surrogateescape"))
    return Path(state_dir) / CACHE_DIR / f"{name.hexdigest()[:32]}.json"


def _trusted(info: os.stat_result) -> bool:
    """Owned by root (or by this user when not root) and writable by its owner only."""
    euid = os.geteuid()
    owner_ok = info.st_uid == 0 or (euid != 0 and info.st_uid == euid)
    return owner_ok and not stat.S_IMODE(info.st_mode) & (stat.S_IWGRP | stat.S_IWOTH)


def _open_cache_dir(entry: Path) -> int | None:
    """The cache directory's descriptor if it is a trusted directory (not a symlink)."""
    try:
        fd = os.open(entry.parent, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    except OSError:
        return None
    if _trusted(os.fstat(fd)):
        return fd
    log.debug("config cache %s: not trusted (owner or mode); not used", entry.parent)
    os.close(fd)
    return None


def read_entry(entry: Path, key: Mapping[str, object]) -> SpotConfigView | None:
    """The view stored in ``entry`` if its key is ``key`` and the directory and the file are
    trusted (see the module docstring); None otherwise, never an error."""
    dir_fd = _open_cache_dir(entry)
    if dir_fd is None:
        return None
    try:
        fd = os.open(entry.name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK, dir_fd=dir_fd)
        with open(fd, "rb") as fh:
            info = os.fstat(fh.fileno())
            if not stat.S_ISREG(info.st_mode) or not _trusted(info):
                return None
            raw = fh.read(MAX_ENTRY_BYTES + 1)
        if len(raw) > MAX_ENTRY_BYTES:
            return None
        stored = json.loads(raw)
        if not isinstance(stored, dict) or stored.get("key") != key:
            return None
        lines = {tuple(where): line for where, line in stored["lines"]}
        view = decode(stored["config"])
        if not isinstance(view, SpotConfigView):
            return None
        object.__setattr__(view, "_source_path", Path(stored["source_path"]))
        object.__setattr__(view, "_lines", lines)
        return view
    except (OSError, ValueError, KeyError, TypeError):
        return None
    finally:
        os.close(dir_fd)


def store_entry(entry: Path, key: Mapping[str, object], config: SpotConfig,
                source: ConfigBytes) -> bool:
    """Write ``config`` (validated from ``source``) under ``key`` to ``entry``, atomically.
    Creates ``config-cache`` (mode 0755) in an existing ``state_dir``. Returns whether it was
    written; a failure is logged at debug level only."""
    try:
        os.mkdir(entry.parent, 0o755)
    except FileExistsError:
        pass
    except OSError as exc:
        log.debug("config cache %s: %s", entry.parent, exc)
        return False
    dir_fd = _open_cache_dir(entry)
    if dir_fd is None:
        return False
    body = json.dumps({
        "key": dict(key), "source_path": str(config.source_path), "config": encode(config),
        "lines": [[list(where), line] for where, line in config._lines.items()],
    }, separators=(",", ":")).encode()
    tmp = f".{entry.name}.{os.getpid()}.{time.monotonic_ns()}.tmp"
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600,
                     dir_fd=dir_fd)
        try:
            os.fchmod(fd, stat.S_IMODE(source.info.st_mode) & 0o644)
            os.write(fd, body)
        finally:
            os.close(fd)
        os.replace(tmp, entry.name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
        return True
    except OSError as exc:
        log.debug("config cache %s: %s", entry, exc)
        try:
            os.unlink(tmp, dir_fd=dir_fd)
        except OSError:
            pass
        return False
    finally:
        os.close(dir_fd)


def encode(value: object) -> object:
    """A validated model as JSON-ready data that keeps each value's type: a model is
    ``{"__model__": class name, "fields": {...}}``, a ``Path`` ``{"__path__": text}``, a dict
    ``{"__dict__": {...}}``. Raises ``TypeError`` for a value of another type."""
    if value is None or isinstance(value, bool | int | float | str):
        return value
    if isinstance(value, Path):
        return {"__path__": str(value)}
    if isinstance(value, list | tuple):
        return [encode(v) for v in value]
    if isinstance(value, dict):
        if not all(isinstance(k, str) for k in value):
            raise TypeError("config dict with a key that is not text")
        return {"__dict__": {k: encode(v) for k, v in value.items()}}
    fields = getattr(type(value), "model_fields", None)
    if isinstance(fields, dict):
        return {"__model__": type(value).__name__,
                "fields": {name: encode(getattr(value, name)) for name in fields}}
    raise TypeError(f"cannot store a {type(value).__name__} in the config cache")


def decode(data: object) -> Any:
    """What :func:`encode` wrote, as read-only records (:class:`ConfigRecord` and its kinds)."""
    if isinstance(data, list):
        return [decode(v) for v in data]
    if not isinstance(data, dict):
        return data
    if "__path__" in data:
        return Path(data["__path__"])
    if "__dict__" in data:
        return {k: decode(v) for k, v in data["__dict__"].items()}
    kind = _VIEWS.get(data["__model__"], ConfigRecord)
    return kind(data["__model__"], {k: decode(v) for k, v in data["fields"].items()},
                data)


def plain(data: object) -> object:
    """What :func:`encode` wrote, as the plain data the models validate (types dropped)."""
    if isinstance(data, list):
        return [plain(v) for v in data]
    if not isinstance(data, dict):
        return data
    if "__path__" in data:
        return data["__path__"]
    if "__dict__" in data:
        return {k: plain(v) for k, v in data["__dict__"].items()}
    return {k: plain(v) for k, v in data["fields"].items()}


class ConfigRecord:
    """A read-only record of one validated model of the config (its fields as attributes),
    from the cache. Assigning a field raises ``AttributeError``, as on the frozen models."""

    def __init__(self, model: str, fields: dict[str, Any], encoded: object) -> None:
        self.__dict__.update(fields)
        self.__dict__["_model"] = model
        self.__dict__["_encoded"] = encoded

    def __setattr__(self, name: str, value: object) -> None:
        raise AttributeError(f"{self._model} is read-only (a cached, validated config)")

    def __getattr__(self, name: str) -> Any:
        """Only called for a name that is not a field: the model has no such attribute."""
        raise AttributeError(f"{self.__dict__.get('_model', 'config')} has no field {name!r}")

    def __repr__(self) -> str:
        fields = ", ".join(f"{k}={v!r}" for k, v in self.__dict__.items() if not k.startswith("_"))
        return f"{self._model}View({fields})"


class NodeSetView(ConfigRecord):
    """A cached :class:`~.models.NodeSetConfig`."""

    @property
    def node_names(self) -> list[str]:
        """All node names of the set, in order (``gpu-1``, ``gpu-2``, ...)."""
        return node_names(self.name, self.count)

    @property
    def hostlist(self) -> str:
        """The node names as one Slurm hostlist expression (``gpu-[1-8]``)."""
        return hostlist_of(self.name, self.count)


class CheckpointView(ConfigRecord):
    """A cached :class:`~.models.CheckpointConfig`."""

    @property
    def is_s3(self) -> bool:
        """True when ``root`` is an ``s3://`` URL (:func:`slurm_spot.contract.location.is_s3`,
        as :attr:`~.models.CheckpointConfig.is_s3` answers it)."""
        from slurm_spot.contract.location import is_s3

        return is_s3(self.root)


class SpotConfigView(ConfigRecord):
    """A cached :class:`~.models.SpotConfig` (see the module docstring)."""

    @property
    def source_path(self) -> Path:
        """The file this configuration was read from (absolute), for child processes."""
        return cast(Path, self.__dict__["_source_path"])

    def node_set(self, name: str) -> NodeSetView:
        """The node set called ``name``. Raises ``KeyError`` if there is none."""
        return find_node_set(self.node_sets, name)

    def node_set_of(self, node: str) -> NodeSetView | None:
        """The node set that produces node name ``node`` (``gpu-3`` -> ``gpu``), or None."""
        return node_set_for(self.node_sets, node)

    def all_nodes(self) -> list[str]:
        """Every cloud node name of every node set."""
        return [n for ns in self.node_sets for n in ns.node_names]

    def to_model(self) -> SpotConfig:
        """The pydantic model of this config (see :func:`as_model`).

        Raises:
            ConfigError: it does not validate, or a credentials file named in it is not to
                be trusted, naming the config file.
        """
        from slurm_spot.config.loader import credential_problems, parse_config
        from slurm_spot.errors import ConfigError

        lines = self.__dict__["_lines"]
        where = str(self.source_path)
        config = parse_config(plain(self._encoded), where, lines)
        problems = credential_problems(config, lines)
        if problems:
            raise ConfigError(where, problems)
        config._source_path = self.source_path
        config._lines = lines
        return config


_VIEWS: dict[str, type[ConfigRecord]] = {
    "NodeSetConfig": NodeSetView, "CheckpointConfig": CheckpointView, "SpotConfig": SpotConfigView}
