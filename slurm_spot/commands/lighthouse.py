"""``slurm-spot lighthouse``: host torchft's lighthouse for fault-tolerant jobs."""

from __future__ import annotations

import click


@click.command("lighthouse")
@click.option("--listen", default=None,
              help="Address (or name) to listen on, and only there [default: this machine's "
                   "address on the cluster network: its NodeAddr on a Slurm node, else what "
                   "its hostname resolves to]. Every interface (0.0.0.0, '::') is refused.")
@click.option("--port", type=click.IntRange(0, 65535), default=29510, show_default=True,
              help="TCP port (0: one the kernel picks).")
@click.option("--min-replicas", type=click.IntRange(1, None), default=1, show_default=True,
              help="Fewest replica groups a quorum needs.")
@click.option("--join-timeout-ms", type=click.IntRange(1, None), default=1000,
              show_default=True,
              help="How long a quorum waits for groups that heartbeat but have not joined.")
@click.option("--heartbeat-timeout-ms", type=click.IntRange(1, None), default=1000,
              show_default=True,
              help="A group silent this long is counted lost: the survivors' longest pause "
                   "after a loss without notice; too low drops groups that stall.")
@click.option("--unauthenticated", is_flag=True,
              help="Required: say that you know torchft's lighthouse lets in anyone who can "
                   "reach its address (no secret, unlike the rendezvous service), and that "
                   "this network is closed to those who should not.")
def lighthouse_command(listen: str | None, port: int, min_replicas: int, join_timeout_ms: int,
                       heartbeat_timeout_ms: int, unauthenticated: bool) -> None:
    """Host the torchft lighthouse of fault-tolerant jobs until stopped.

    Run it where no reclaim takes it (an on-demand node, the controller); replica groups of
    examples/train_ft.py reach it at $TORCHFT_LIGHTHOUSE (http://HOST:PORT, printed on
    stderr once it listens). torchft's lighthouse has no authentication: it listens on one
    address only, never every interface, and starts only with --unauthenticated
    (docs/ml-engineer.md, "Fault-tolerant training").
    Needs torchft: pip install 'slurm-spot[ft]'."""
    from slurm_spot.errors import BadInputError
    from slurm_spot.jobs.services.ft_lighthouse import LighthouseTimeouts, serve

    if not unauthenticated:  # secure by default: nothing we start lets anyone in unasked
        raise BadInputError(
            "torchft's lighthouse has no authentication: anyone who reaches its address can "
            "join or disturb a job's quorum. Run it only on a closed cluster network, and say "
            "so with --unauthenticated (docs/ml-engineer.md, 'Fault-tolerant training').")
    from slurm_spot.jobs.services.rendezvous import default_listen_host

    host = listen if listen is not None else default_listen_host()
    timeouts = LighthouseTimeouts(join_timeout_ms=join_timeout_ms,
                                  heartbeat_timeout_ms=heartbeat_timeout_ms)

    def ready(address: str) -> None:
        click.echo(f"slurm-spot lighthouse: torchft lighthouse listening on {address} "
                   f"(min replicas {min_replicas}; no authentication: this address only)",
                   err=True)

    serve(host, port, min_replicas, timeouts, ready)  # BadInputError names host:port


COMMANDS = [lighthouse_command]
