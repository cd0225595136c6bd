"""``slurm-spot node-name``: which Slurm node this host is (see :mod:`slurm_spot.lifecycle.node_identity`)."""

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
from slurm_spot.lifecycle.node_identity import resolve_node_name, slurmd_instance_args

#: What a value in the env file may not hold: it is read by systemd (EnvironmentFile=) and may
#: be sourced by a shell, and a value is written in double quotes when it holds spaces.
_UNSAFE = frozenset('"\\$`') | {chr(c) for c in range(32)} | {chr(127)}


@click.command("node-name")
@click.option("--node", default=None, shell_complete=complete_nodes,
              help="Take this name (checked against the config).")
@click.option("--wait", "wait_s", type=float, default=0, show_default=True,
              help="Seconds to wait for the resume hook to record this host's address.")
@click.option("--env-file", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="Also write SLURM_SPOT_NODE=<name> to this file (a systemd EnvironmentFile "
                   "for slurmd's -N and the watcher's --node).")
@click.option("--slurmd", "slurmd", default=None, metavar="PATH",
              help="With --env-file: also write SLURM_SPOT_SLURMD_ARGS, the --instance-id/"
                   "--instance-type options this instance's slurmd registers with (from the "
                   "cloud's metadata service; empty when the slurmd at PATH is older than "
                   "23.11 or the node is not a cloud instance).")
@json_option
@pass_app
def node_name_command(app: AppContext, node: str | None, wait_s: float, env_file: Path | None,
                      slurmd: str | None, as_json: bool) -> None:
    """Print this host's Slurm node name: --node, $SLURMD_NODENAME, the hostname, or the
    node whose NodeAddr is one of this host's addresses. Exit 2 when none is."""
    if slurmd is not None and env_file is None:
        raise BadInputError("--slurmd needs --env-file (the file slurmd's drop-in reads)")
    with waiting(f"node-name: waiting up to {wait_s:g} s for this host's address in Slurm"
                 ) if wait_s > 0 else nullcontext():
        name = resolve_node_name(app.config, app.slurm(), explicit=node, wait_s=wait_s)
    values = {"SLURM_SPOT_NODE": name}
    if slurmd is not None:
        values["SLURM_SPOT_SLURMD_ARGS"] = " ".join(slurmd_instance_args(app.config, name, slurmd))
    if env_file is not None:
        write_env_file(env_file, values)
    if as_json:
        print_json({"node": name, **({"slurmd_args": values["SLURM_SPOT_SLURMD_ARGS"].split()}
                                     if slurmd is not None else {})})
    else:
        click.echo(name)


def write_env_file(path: Path, values: dict[str, str]) -> None:
    """Write ``KEY=value`` lines to ``path`` atomically (temp file + rename), mode 0644; its
    directory is created if missing. A value with spaces is written in double quotes, which
    systemd's EnvironmentFile= (systemd.exec(5)) and a shell both read as one value.

    Raises:
        BadInputError: ``path`` is empty, a directory, or cannot be written (names the path
            and the reason; no temporary file is left behind); a value holds a quote, ``$``,
            a backslash, a backquote or a control character.
    """
    if not str(path) or str(path) == "." or path.is_dir():
        raise BadInputError(f"--env-file: {str(path)!r} is not a file path")
    for key, value in values.items():
        if _UNSAFE & set(value):
            raise BadInputError(f"--env-file {path}: {key} value {value[:80]!r} holds a quote, "
                                "$, backslash, backquote or control character")
    tmp: str | None = None
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
        with os.fdopen(fd, "w") as fh:
            fh.write("".join(f'{key}="{value}"\n' if " " in value else f"{key}={value}\n"
                             for key, value in values.items()))
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
        tmp = None
    except OSError as exc:
        raise BadInputError(f"--env-file {path}: {exc.strerror or exc}") from None
    finally:
        if tmp is not None:
            Path(tmp).unlink(missing_ok=True)


COMMANDS = [node_name_command]
