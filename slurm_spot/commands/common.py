"""What every command shares: the lazily loaded config, the Slurm client, output helpers."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any, TypeVar

import click
from rich.console import Console

from slurm_spot.config import SpotConfig, load_config
from slurm_spot.slurm.client import SlurmClient

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


def json_option(func: F) -> F:
    """Add ``--json``: machine-readable output on stdout."""
    return click.option("--json", "as_json", is_flag=True, help="Print JSON.")(func)  # type: ignore[return-value]


def print_json(data: object) -> None:
    """Print ``data`` as indented JSON."""
    click.echo(json.dumps(data, indent=2, sort_keys=True, default=str))


def console() -> Console:
    """A rich console for tables: the terminal's width on a terminal; piped or redirected
    (``slurm-spot status | grep gpu``), wide enough that no column is cut or wrapped."""
    terminal = Console()
    return terminal if terminal.is_terminal else Console(width=1000)
