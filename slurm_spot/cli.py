"""The ``slurm-spot`` command line: a click group; each command lives in ``commands/`` and is
imported only when it runs (:class:`~slurm_spot.commands.LazyGroup`).

Exit codes: 0 success, 1 an operation failed (provider, Slurm), 2 bad input (a malformed
hostlist, an unknown node, an invalid config, a usage error). Messages name what is wrong.
"""

from __future__ import annotations

import logging
import sys
from typing import Any

import click

from slurm_spot.commands import LazyGroup
from slurm_spot.commands.common import AppContext, check_config_path, log_level
from slurm_spot.errors import BadInputError, SlurmSpotError
from slurm_spot.rawtext import use_escaped_output


class _Group(LazyGroup):
    """Maps slurm-spot errors to exit codes and one-line messages (no tracebacks)."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except BadInputError as exc:
            click.echo(f"slurm-spot: error: {exc}", err=True)
            ctx.exit(2)
        except SlurmSpotError as exc:
            click.echo(f"slurm-spot: failed: {exc}", err=True)
            ctx.exit(1)


def _print_version(ctx: click.Context, _param: click.Parameter, value: bool) -> None:
    if not value or ctx.resilient_parsing:
        return
    from slurm_spot.commands.about import version_text

    click.echo(version_text())
    ctx.exit(0)


@click.group(cls=_Group, context_settings={"auto_envvar_prefix": "SLURM_SPOT",
                                           "help_option_names": ["-h", "--help"]})
@click.option("--version", is_flag=True, expose_value=False, is_eager=True,
              callback=_print_version,
              help="Show the version, the Slurm found and the installed extras, and exit.")
@click.option("--config", "config_path", type=click.Path(dir_okay=False), default=None,
              callback=lambda _ctx, _param, value: check_config_path(value),
              help="spot.yaml to use (default: $SLURM_SPOT_CONFIG, spot.yaml beside "
                   "$SLURM_CONF, /etc/slurm/spot.yaml).")
@click.option("-v", "--verbose", count=True,
              help="More log output (-vv for debug); also after the command.")
@click.pass_context
def cli(ctx: click.Context, config_path: str | None, verbose: int) -> None:
    """Spot GPU instances as a Slurm cloud partition, with jobs that survive interruptions."""
    use_escaped_output()  # a user's invalid UTF-8 byte in a job name prints as \xff
    logging.basicConfig(level=log_level(verbose),
                        format="%(asctime)s %(name)s %(levelname)s %(message)s")
    ctx.obj = AppContext(config_path, verbose)



def main(argv: list[str] | None = None) -> None:
    """Console-script entry point."""
    cli.main(args=argv, prog_name="slurm-spot")


if __name__ == "__main__":  # pragma: no cover
    main(sys.argv[1:])
