"""``slurm-spot node-name``: which Slurm node this host is (see :mod:`slurm_spot.node_identity`)."""

from __future__ import annotations

import os
import tempfile
from contextlib import nullcontext
from pathlib import Path

import click

from slurm_spot.commands.common import AppContext, json_option, pass_app, print_json
from slurm_spot.commands.completion import complete_nodes
from slurm_spot.commands.progress import waiting
from slurm_spot.errors import BadInputError
from slurm_spot.node_identity import resolve_node_name


@click.command("node-name")
@click.option("--node", default=None, shell_complete=complete_nodes,
              help="Take this name (checked against the config).")
@click.option("--wait", "wait_s", type=float, default=0, show_default=True,
              help="Seconds to wait for the resume hook to record this host's address.")
@click.option("--env-file", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="Also write SLURM_SPOT_NODE=<name> to this file (a systemd EnvironmentFile "
                   "for slurmd's -N and the watcher's --node).")
@json_option
@pass_app
def node_name_command(app: AppContext, node: str | None, wait_s: float, env_file: Path | None,
                      as_json: bool) -> None:
    """Print this host's Slurm node name: --node, $SLURMD_NODENAME, the hostname, or the
    node whose NodeAddr is one of this host's addresses. Exit 2 when none is."""
    with waiting(f"node-name: waiting up to {wait_s:g} s for this host's address in Slurm"
                 ) if wait_s > 0 else nullcontext():
        name = resolve_node_name(app.config, app.slurm(), explicit=node, wait_s=wait_s)
    if env_file is not None:
        write_env_file(env_file, {"SLURM_SPOT_NODE": name})
    if as_json:
        print_json({"node": name})
    else:
        click.echo(name)


def write_env_file(path: Path, values: dict[str, str]) -> None:
    """Write ``KEY=value`` lines to ``path`` atomically (temp file + rename), mode 0644; its
    directory is created if missing.

    Raises:
        BadInputError: ``path`` is empty, a directory, or cannot be written (names the path
            and the reason; no temporary file is left behind).
    """
    if not str(path) or str(path) == "." or path.is_dir():
        raise BadInputError(f"--env-file: {str(path)!r} is not a file path")
    tmp: str | None = None
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
        with os.fdopen(fd, "w") as fh:
            fh.write("".join(f"{key}={value}\n" for key, value in values.items()))
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
        tmp = None
    except OSError as exc:
        raise BadInputError(f"--env-file {path}: {exc.strerror or exc}") from None
    finally:
        if tmp is not None:
            Path(tmp).unlink(missing_ok=True)


COMMANDS = [node_name_command]
