"""What every command shares: the lazily loaded config, the Slurm client, output helpers."""

from __future__ import annotations

import json
import logging
import os
import stat
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import click

from slurm_spot.config import SpotConfig, load_config
from slurm_spot.errors import BadInputError
from slurm_spot.events import EVENTS_FILE
from slurm_spot.jsonenvelope import envelope
from slurm_spot.rawtext import escaped_all
from slurm_spot.slurm.client import SlurmClient

F = TypeVar("F", bound=Callable[..., Any])


class AppContext:
    """Built once per invocation by the group; loads the config on first use."""

    def __init__(self, config_path: str | None, verbose: int = 0) -> None:
        self.config_path = config_path
        self.verbose = verbose  # -v count given before the command
        self._config: SpotConfig | None = None

    def use_config(self, config_path: str) -> None:
        """Read ``config_path`` instead (``--config`` given after the command name)."""
        self.config_path = config_path
        self._config = None

    @property
    def config(self) -> SpotConfig:
        """The validated config (raises ConfigError -> exit 2)."""
        if self._config is None:
            self._config = load_config(self.config_path)
        return self._config

    def slurm(self) -> SlurmClient:
        """A Slurm client using the config's ``slurm_bin_dir``."""
        return SlurmClient(self.config.slurm_bin_dir)


pass_app = click.make_pass_decorator(AppContext)


def require_dir(config: SpotConfig, key: str) -> Path:
    """``config``'s directory setting ``key`` (``log_dir``, ``state_dir``), checked before a
    command reads it: a missing directory is fine (nothing recorded yet), but one that is a
    file, or under a file, would read as empty and print nothing.

    Raises:
        BadInputError: the path exists and is not a directory, or cannot be looked at
            (exit 2, naming the setting, the path and the config file).
    """
    path = Path(getattr(config, key))
    where = f"{key} {path} (set in {config.source_path})"
    try:
        info = os.stat(path)
    except FileNotFoundError:
        return path
    except NotADirectoryError:
        raise BadInputError(f"{where}: a part of the path is a file, not a directory") from None
    except OSError as exc:
        raise BadInputError(f"{where}: {exc.strerror}") from None
    if not stat.S_ISDIR(info.st_mode):
        raise BadInputError(f"{where} is not a directory")
    return path


def require_events_file(config: SpotConfig) -> Path:
    """``<log_dir>/events.jsonl``, checked as :func:`require_dir` (missing: no events yet).

    Raises:
        BadInputError: the log dir is not a directory, or the events file is not a regular
            file or cannot be read.
    """
    path = require_dir(config, "log_dir") / EVENTS_FILE
    try:
        info = os.stat(path)
    except FileNotFoundError:
        return path
    except OSError as exc:
        raise BadInputError(f"events file {path}: {exc.strerror}") from None
    if not stat.S_ISREG(info.st_mode):
        raise BadInputError(f"events file {path} is not a regular file; move it away: "
                            f"slurm-spot appends its events there")
    if not os.access(path, os.R_OK):
        raise BadInputError(f"events file {path}: cannot read it (permission denied)")
    return path


def optional_config(app: AppContext) -> SpotConfig | None:
    """The site config if one is named or exists (``plan`` and ``simulate`` work without one).

    Raises:
        ConfigError: the config exists but is invalid."""
    from slurm_spot.config import config_path

    if app.config_path is None and not config_path().exists():
        return None
    return app.config


def site_events(app: AppContext) -> Callable[[], list[dict[str, Any]]]:
    """Returns the site's recorded events when called (``--interruption-rate observed``),
    the events file checked as :func:`require_events_file` first."""
    def events() -> list[dict[str, Any]]:
        from slurm_spot.events import read_events

        require_events_file(app.config)
        return list(read_events(app.config.log_dir))

    return events


def check_config_path(value: str | None) -> str | None:
    """``--config`` must name a file: an empty value would silently mean the default one.

    Raises:
        click.BadParameter: ``value`` is empty (exit 2).
    """
    if value is not None and not value.strip():
        raise click.BadParameter("empty path (leave --config out for the default file)")
    return value


def _set_config(ctx: click.Context, _param: click.Parameter, value: str | None) -> None:
    path = check_config_path(value)
    app = ctx.find_object(AppContext)
    if path is not None and app is not None:
        app.use_config(path)


def log_level(verbose: int) -> int:
    """The logging level of ``-v`` given ``verbose`` times: WARNING, INFO, DEBUG (-vv)."""
    return logging.WARNING - 10 * min(verbose, 2)


def _add_verbose(ctx: click.Context, _param: click.Parameter, value: int) -> None:
    app = ctx.find_object(AppContext)
    if value and app is not None:
        app.verbose += value
        logging.getLogger().setLevel(log_level(app.verbose))


def add_shared_options(command: click.Command) -> None:
    """``--config F`` and ``-v/--verbose`` on ``command`` (a group too) and its subcommands,
    same meaning as before the command name (``--config``: the later one wins; ``-v``: the
    counts add up). Not on commands that pass unknown options through (``sbatch``: options
    after the script belong to the training script, and ``-v`` is sbatch's own)."""
    if isinstance(command, click.Group):
        for sub in command.commands.values():
            add_shared_options(sub)
    if command.context_settings.get("ignore_unknown_options"):
        return
    taken = {opt for param in command.params for opt in param.opts}
    if "--config" not in taken:
        command.params.append(click.Option(
            ["--config"], type=click.Path(dir_okay=False), expose_value=False, is_eager=True,
            callback=_set_config, allow_from_autoenv=False,
            help="spot.yaml to use (same as 'slurm-spot --config F COMMAND')."))
    if not taken & {"-v", "--verbose"}:
        command.params.append(click.Option(
            ["-v", "--verbose"], count=True, expose_value=False, allow_from_autoenv=False,
            callback=_add_verbose,
            help="More log output (-vv for debug); same as 'slurm-spot -v COMMAND'."))


def json_option(func: F) -> F:
    """Add ``--json``: machine-readable output on stdout, in the envelope of
    :mod:`slurm_spot.jsonenvelope`."""
    return click.option("--json", "as_json", is_flag=True,
                        help="Print JSON: {\"meta\": {schema, version, command}, \"data\": ...} "
                             "(docs/cli.md).")(func)


def command_name(ctx: click.Context | None = None) -> str:
    """The command being run without the program name: ``plan``, ``local status``; empty
    outside a click command."""
    ctx = ctx or click.get_current_context(silent=True)
    names = []
    while ctx is not None and ctx.parent is not None:
        names.append(ctx.info_name or "")
        ctx = ctx.parent
    return " ".join(reversed(names))


def print_json(data: object, one_line: bool = False) -> None:
    """Print ``data`` in the JSON envelope (:func:`slurm_spot.jsonenvelope.envelope`, for the
    command being run), as indented JSON (``one_line``: one document per line, JSON Lines,
    for a stream such as ``status --watch --json``), valid UTF-8 whatever text it holds (an
    undecodable byte of a job name or reason as ``\\xff``: :func:`slurm_spot.rawtext.escaped_all`)."""
    doc = escaped_all(envelope(data, command_name()))
    click.echo(json.dumps(doc, indent=None if one_line else 2, sort_keys=True, default=str))
