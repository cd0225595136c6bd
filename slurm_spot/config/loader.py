"""Reading ``spot.yaml``: where it is, loading it safely, and problems named by file, field
and line.

Where the file is looked for: :func:`~slurm_spot.config.source.config_path`.

Every validation error names the file, the field (as a dotted path such as
``node_sets.0.count``) and the reason; see :class:`~slurm_spot.errors.ConfigError`.
"""

from __future__ import annotations

import os
from pathlib import Path

import yaml
from pydantic import ValidationError

from slurm_spot.config.models import SpotConfig
from slurm_spot.config.provider_models import PROVIDER_TYPE_NAMES
from slurm_spot.config.source import (
    ConfigBytes,
    check_trusted_file,
    config_path,
    read_config_bytes,
)
from slurm_spot.config.yamlfile import (
    MAX_DEPTH,
    Path_,
    YamlShapeError,
    line_of,
    read_yaml,
    with_line,
)
from slurm_spot.errors import ConfigError


def parse_config(data: object, path: str = "<config>",
                 lines: dict[Path_, int] | None = None) -> SpotConfig:
    """Validate already-parsed YAML data.

    Args:
        lines: where each key was in the file (:func:`slurm_spot.config.yamlfile.read_yaml`), so
            each problem can start with ``line N:``.

    Raises:
        ConfigError: naming ``path``, each bad field (with its line when known) and the reason.
    """
    if not isinstance(data, dict):
        raise ConfigError(path, ["line 1: (top level): expected a mapping of settings"])
    try:
        return SpotConfig.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(path, _describe(exc, lines or {})) from None


def load_config(path: str | os.PathLike[str] | None = None) -> SpotConfig:
    """Read and validate ``spot.yaml``.

    Args:
        path: explicit file; ``None`` applies :func:`config_path`.

    Raises:
        ConfigError: the file is missing, is not YAML (the message gives the line), has a
            recursive alias, nests too deep or expands too large
            (:func:`~slurm_spot.config.yamlfile.check_shape`, with the line), or fails
            validation (the message gives every bad field).
    """
    return validate_config_bytes(read_config_bytes(config_path(path)))


def validate_config_bytes(source: ConfigBytes) -> SpotConfig:
    """Validate one read of the config file (:func:`load_config`'s work after reading).

    Raises:
        ConfigError: as :func:`load_config`, for everything after reading the bytes.
    """
    file, raw = source.path, source.raw
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = raw[: exc.start].count(b"\n") + 1
        raise ConfigError(str(file), [f"line {line}: byte {exc.start}: not UTF-8 text"]) from None
    try:
        data, lines, problems = read_yaml(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"line {mark.line + 1}, column {mark.column + 1}" if mark else "line ?"
        problem = getattr(exc, "problem", None) or str(exc)
        raise ConfigError(str(file), [f"{where}: not valid YAML: {problem}"]) from None
    except YamlShapeError as exc:
        raise ConfigError(str(file), [str(exc)]) from None
    except RecursionError:  # check_shape bounds the nesting; never a traceback all the same
        raise ConfigError(str(file), [f"nested too deeply to read (more than {MAX_DEPTH} "
                                      "levels, aliases expanded)"]) from None
    if problems:
        raise ConfigError(str(file), problems)
    config = parse_config(data, str(file), lines)
    problems = credential_problems(config, lines)
    if problems:
        raise ConfigError(str(file), problems)
    config._source_path = file.absolute()
    config._lines = lines
    return config


def credential_problems(config: SpotConfig, lines: dict[Path_, int]) -> list[str]:
    """Credentials files named in the config that root must not trust (see
    :func:`~slurm_spot.config.yamlfile.check_trusted_file`). A missing file is the provider's
    error to report when it is used, and ``config check``'s
    (:func:`credentials_file_problems`)."""
    problems = []
    for name, provider in config.providers.items():
        file = getattr(provider, "credentials_file", None)
        if file is None:
            continue
        try:
            info = os.stat(file)
        except OSError:
            continue
        problem = check_trusted_file(Path(file), info, "credentials file")
        if problem:
            line = line_of(lines, ("providers", name, "credentials_file"))
            problems.append(f"line {line}: providers.{name}.credentials_file: {problem}"
                            if line else f"providers.{name}.credentials_file: {problem}")
    return problems


def _describe(exc: ValidationError, lines: dict[Path_, int]) -> list[str]:
    """One line per problem: ``line N: dotted.path: reason`` (``line N:`` when known)."""
    problems: list[str] = []
    for err in exc.errors():
        msg = err["msg"].removeprefix("Value error, ")
        loc = _model_loc(err["loc"])
        if err["type"] == "extra_forbidden":
            msg = "unknown key"
        if err["type"] in ("union_tag_invalid", "union_tag_not_found"):  # providers.<name>.type
            loc = (*loc, "type")
            known = ", ".join(repr(t) for t in PROVIDER_TYPE_NAMES)
            given = err["input"].get("type") if isinstance(err["input"], dict) else None
            msg = (f"unknown provider type {given!r}" if given is not None else "missing") + \
                f"; known types: {known}"
        if err["type"] == "value_error" and not err["loc"]:
            problems.extend(with_line(p, lines) for p in msg.split("; "))
            continue
        where = ".".join(str(part) for part in loc) or "(top level)"
        line = line_of(lines, loc) if lines else None
        problems.append(f"line {line}: {where}: {msg}" if line else f"{where}: {msg}")
    return problems


def _model_loc(loc: tuple[int | str, ...]) -> Path_:
    """pydantic's location without the union tag it adds after a provider's name
    (``providers.ec2.aws.region`` -> ``providers.ec2.region``)."""
    if len(loc) >= 3 and loc[0] == "providers" and loc[2] in PROVIDER_TYPE_NAMES:
        return (*loc[:2], *loc[3:])
    return tuple(loc)


SLURM_COMMANDS = ("scontrol", "sinfo", "squeue", "scancel", "sbatch")


def slurm_bin_problems(config: SpotConfig) -> list[str]:
    """``slurm_bin_dir`` problems for ``config check``: each Slurm command slurm-spot runs
    (:data:`SLURM_COMMANDS`) must be an executable there. Not checked at load: a compute
    image may be built before Slurm is installed."""
    where = config.slurm_bin_dir
    if not where.is_dir():
        return [f"slurm_bin_dir: {where} is not a directory (where scontrol, squeue, ... are; "
                f"'command -v scontrol' shows it)"]
    missing = [c for c in SLURM_COMMANDS if not os.access(where / c, os.X_OK)
               or not (where / c).is_file()]
    if missing:
        return [f"slurm_bin_dir: {where} has no executable {', '.join(missing)} "
                f"('command -v scontrol' shows where Slurm's commands are)"]
    return []


def credentials_file_problems(config: SpotConfig) -> list[str]:
    """``providers.<name>.credentials_file`` problems for ``config check``: a file named there
    must exist and be a readable file (the hooks run with an empty environment and find no
    other credentials, so a missing one fails every launch). One line each, naming the field
    (``line N:`` is added by :meth:`SpotConfig.with_lines`) and the file. Not checked at load:
    a compute node's watcher reads the same spot.yaml without the controller's credentials."""
    problems = []
    for name, provider in config.providers.items():
        file = getattr(provider, "credentials_file", None)
        if file is None:
            continue
        where = f"providers.{name}.credentials_file: {file}"
        if not os.path.lexists(file):
            problems.append(f"{where}: no such file (write the provider's credentials there, "
                            f"or remove the setting to use the provider's default chain)")
        elif not os.path.isfile(file):
            problems.append(f"{where}: not a regular file")
        elif not os.access(file, os.R_OK):
            problems.append(f"{where}: not readable by this user (uid {os.geteuid()})")
    return problems
