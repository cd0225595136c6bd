"""``slurm-spot rendezvous``: host the c10d store elastic torchrun jobs rendezvous through."""

from __future__ import annotations

import click

from slurm_spot.errors import BadInputError


@click.command("rendezvous")
@click.option("--listen", default="0.0.0.0", show_default=True,
              help="Address (or name) to listen on, and only there (0.0.0.0: every IPv4 "
                   "interface; '::': every interface).")
@click.option("--port", type=click.IntRange(1, 65535), default=None,
              help="TCP port [default: 29390].")
def rendezvous_command(listen: str, port: int | None) -> None:
    """Host the rendezvous store of elastic jobs (torch's c10d TCPStore) until stopped.

    Run it on the controller, or any machine that is not a spot node; jobs submitted with
    'slurm-spot sbatch --torchrun --elastic MIN:MAX' reach it at --rendezvous HOST:PORT
    (default: the controller, port 29390). Needs torch on this machine."""
    from slurm_spot.jobs.rendezvous import DEFAULT_PORT, format_endpoint, serve

    try:
        import torch.distributed  # noqa: F401
    except ImportError:
        raise BadInputError("slurm-spot rendezvous needs torch on this machine: "
                            "pip install 'slurm-spot[train]'") from None

    def ready(bound: int) -> None:
        click.echo("slurm-spot rendezvous: c10d store listening on "
                   f"{format_endpoint(listen, bound)}", err=True)

    try:
        serve(listen, port or DEFAULT_PORT, ready)  # BadInputError names listen:port
    except RuntimeError as exc:
        raise BadInputError(f"cannot listen on {listen}:{port or DEFAULT_PORT}: {exc}") from None


COMMANDS = [rendezvous_command]
