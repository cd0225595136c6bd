"""``slurm-spot rendezvous``: host the store elastic torchrun jobs rendezvous through."""

from __future__ import annotations

import os
import shutil

import click

from slurm_spot.errors import BadInputError


@click.command("rendezvous")
@click.option("--listen", default=None,
              help="Address (or name) to listen on, and only there [default: this machine's "
                   "address on the cluster network: its NodeAddr on a Slurm node, else what "
                   "its hostname resolves to]. Every interface (0.0.0.0, '::') is refused.")
@click.option("--port", type=click.IntRange(1, 65535), default=None,
              help="TCP port [default: 29390].")
@click.option("--slurm-bin-dir", type=click.Path(file_okay=False), default=None,
              help="Directory of squeue/scontrol [default: where squeue is on PATH, else "
                   "/usr/bin].")
def rendezvous_command(listen: str | None, port: int | None,
                       slurm_bin_dir: str | None) -> None:
    """Host the rendezvous store of elastic jobs until stopped.

    Run it on the controller, or any machine that is not a spot node; jobs submitted with
    'slurm-spot sbatch --torchrun --elastic MIN:MAX' reach it at --rendezvous HOST:PORT
    (default: the controller, port 29390). A client reaches a job's keys only as the job's
    owner (a MUNGE credential, checked against squeue), so munged and squeue must work here."""
    from slurm_spot.jobs.services.rendezvous import DEFAULT_PORT, default_listen_host, format_endpoint, serve
    from slurm_spot.slurm.client import SlurmClient

    found = shutil.which("squeue")
    client = SlurmClient(slurm_bin_dir or (os.path.dirname(found) if found else "/usr/bin"))
    host = listen if listen is not None else default_listen_host(client)

    def ready(bound: int) -> None:
        click.echo("slurm-spot rendezvous: c10d store listening on "
                   f"{format_endpoint(host, bound)} (clients: job owners, MUNGE)", err=True)

    try:
        serve(host, port or DEFAULT_PORT, ready, client=client)  # BadInputError names host:port
    except RuntimeError as exc:
        raise BadInputError(f"cannot listen on {host}:{port or DEFAULT_PORT}: {exc}") from None


COMMANDS = [rendezvous_command]
