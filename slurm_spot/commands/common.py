"""What every command shares: the lazily loaded config, the Slurm client, output helpers."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar

import click

from slurm_spot.config import SpotConfig, load_config
from slurm_spot.slurm.client import SlurmClient

if TYPE_CHECKING:
    from rich.console import Console

F = TypeVar("F", bound=Callable[..., Any])


class AppContext:
    """Built once per invocation by the group; loads the config on first use."""

    def __init__(self, config_path: str | None) -> None:
        self.config_path = config_path
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


def add_config_option(command: click.Command) -> None:
    """``--config F`` on ``command`` (a group too) and its subcommands, same meaning as before
    the command name (the later one wins). Not on commands that pass unknown options through
    (``sbatch``: ``--config`` after the script belongs to the training script)."""
    if isinstance(command, click.Group):
        for sub in command.commands.values():
            add_config_option(sub)
    if command.context_settings.get("ignore_unknown_options"):
        return
    if any("--config" in param.opts for param in command.params):
        return
    command.params.append(click.Option(
        ["--config"], type=click.Path(dir_okay=False), expose_value=False, is_eager=True,
        callback=_set_config, allow_from_autoenv=False,
        help="spot.yaml to use (same as 'slurm-spot --config F COMMAND')."))


def json_option(func: F) -> F:
    """Add ``--json``: machine-readable output on stdout."""
    return click.option("--json", "as_json", is_flag=True, help="Print JSON.")(func)  # type: ignore[return-value]


def print_json(data: object) -> None:
    """Print ``data`` as indented JSON."""
    click.echo(json.dumps(data, indent=2, sort_keys=True, default=str))


def console() -> Console:
    """A rich console for tables: the terminal's width on a terminal; piped or redirected
    (``slurm-spot status | grep gpu``), wide enough that no column is cut or wrapped."""
    from rich.console import Console  # here: only table output needs rich

    terminal = Console()
    return terminal if terminal.is_terminal else Console(width=1000)
