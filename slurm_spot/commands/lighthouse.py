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
@click.option("--port-tries", type=click.IntRange(1, 100), default=1, show_default=True,
              help="With --job: take the first free port of PORT .. PORT+N-1 (another job's "
                   "lighthouse may hold PORT on this node); relays started with the same "
                   "--port-tries find the one that serves their job.")
@click.option("--min-replicas", type=click.IntRange(1, None), default=1, show_default=True,
              help="Fewest replica groups a quorum needs.")
@click.option("--join-timeout-ms", type=click.IntRange(1, None),
              default=1000, show_default=True,
              help="How long a quorum waits for groups that heartbeat but have not joined "
                   "(a replacement still starting).")
@click.option("--heartbeat-timeout-ms", type=click.IntRange(1, None),
              default=500, show_default=True,
              help="A group silent this long is counted gone: the survivors' pause after a "
                   "group leaves (notice) or dies (no notice), when below --join-timeout-ms. "
                   "Groups heartbeat every 100 ms; too low, and a group whose heartbeats "
                   "stall that long is left out of one quorum and heals from a peer.")
@click.option("--job", "job", default=None, metavar="JOBID",
              help="The Slurm job this lighthouse serves: only its owner gets in (a MUNGE "
                   "handshake at the front door on --listen/--port; the lighthouse itself "
                   "listens on 127.0.0.1). Replicas reach it through 'slurm-spot "
                   "lighthouse-relay --lighthouse HOST:PORT --job JOBID'.")
@click.option("--slurm-bin-dir", type=click.Path(file_okay=False), default=None,
              help="Directory of squeue (--job's owner) [default: where squeue is on PATH, "
                   "else /usr/bin].")
@click.option("--unauthenticated", is_flag=True,
              help="Instead of --job: torchft's lighthouse directly on --listen, letting in "
                   "anyone who can reach that address; say so only on a network closed to "
                   "those who should not.")
def lighthouse_command(listen: str | None, port: int, port_tries: int, min_replicas: int,
                       join_timeout_ms: int,
                       heartbeat_timeout_ms: int, job: str | None, slurm_bin_dir: str | None,
                       unauthenticated: bool) -> None:
    """Host the torchft lighthouse of a fault-tolerant job until stopped.

    Run it where no reclaim takes it (an on-demand node, the controller). With --job JOBID
    (authenticated) it listens on 127.0.0.1 behind a front door on --listen:--port that lets
    in only the owner of JOBID, proved by MUNGE as for 'slurm-spot rendezvous'; each
    replica runs 'slurm-spot lighthouse-relay --lighthouse HOST:PORT --job JOBID -- python
    train.py', which sets $TORCHFT_LIGHTHOUSE. With --unauthenticated torchft's lighthouse
    listens on --listen itself (no secret) and replicas use http://HOST:PORT directly.
    Either way it listens on one address only, never every interface
    (docs/ml-engineer.md, "Fault-tolerant training").
    Needs torchft: pip install 'slurm-spot[ft]'."""
    from slurm_spot.errors import BadInputError
    from slurm_spot.jobs.services.ft_lighthouse import (
        LighthouseTimeouts,
        serve,
        serve_authenticated,
    )

    if job is None and not unauthenticated:  # secure by default: nobody gets in unasked
        raise BadInputError(
            "give --job JOBID: the lighthouse lets in only that job's owner (MUNGE); or "
            "--unauthenticated to let in anyone who reaches its address "
            "(docs/ml-engineer.md, 'Fault-tolerant training')")
    if job is not None and unauthenticated:
        raise BadInputError("--job and --unauthenticated contradict each other: --job admits "
                            "only the job's owner, --unauthenticated anyone")
    import os
    import shutil

    from slurm_spot.jobs.services.rendezvous import default_listen_host
    from slurm_spot.slurm.client import SlurmClient

    found = shutil.which("squeue")
    client = SlurmClient(slurm_bin_dir or (os.path.dirname(found) if found else "/usr/bin"))
    host = listen if listen is not None else default_listen_host(client)
    timeouts = LighthouseTimeouts(join_timeout_ms=join_timeout_ms,
                                  heartbeat_timeout_ms=heartbeat_timeout_ms)
    if job is not None:
        from slurm_spot.jobs.injob.lighthouse_relay import parse_job_id

        job = parse_job_id(job, "--job")

        def ready_authenticated(endpoint: str, owner: int) -> None:
            click.echo(f"slurm-spot lighthouse: front door listening on {endpoint} for job "
                       f"{job} (only uid {owner}, its owner, gets in; min replicas "
                       f"{min_replicas}); replicas: slurm-spot lighthouse-relay --lighthouse "
                       f"{endpoint} --job {job}", err=True)

        serve_authenticated(host, port, job, min_replicas, timeouts, ready_authenticated,
                            owner_of=client.job_owner_uid, port_tries=port_tries)
        return

    def ready(address: str) -> None:
        click.echo(f"slurm-spot lighthouse: torchft lighthouse listening on {address} "
                   f"(min replicas {min_replicas}; no authentication: this address only)",
                   err=True)

    serve(host, port, min_replicas, timeouts, ready)  # BadInputError names host:port


@click.command("lighthouse-relay", context_settings={"ignore_unknown_options": True})
@click.option("--lighthouse", "endpoint", required=True, metavar="HOST:PORT",
              help="The lighthouse's front door ('slurm-spot lighthouse --job' prints it; "
                   "port 29510 when none is given).")
@click.option("--job", "job", required=True, metavar="JOBID",
              help="The job the lighthouse serves ('slurm-spot lighthouse --job'); you must "
                   "own it.")
@click.option("--port-tries", type=click.IntRange(1, 100), default=1, show_default=True,
              help="Look for the front door at PORT .. PORT+N-1 (the lighthouse's "
                   "--port-tries) and keep the one that admits you for JOBID.")
@click.option("--wait", "wait_s", type=click.FloatRange(0, 3600), default=0.0,
              show_default=True,
              help="Seconds to keep looking while the lighthouse is still starting (a port "
                   "nobody listens on yet, or another job's door there).")
@click.argument("command", nargs=-1, type=click.UNPROCESSED)
def lighthouse_relay_command(endpoint: str, job: str, port_tries: int, wait_s: float,
                             command: tuple[str, ...]) -> None:
    """Relay torchft's lighthouse connections from this node to an authenticated lighthouse.

    Listens on 127.0.0.1 (a port the kernel picks; only your uid's connections are relayed)
    and, for each connection, makes the MUNGE handshake with the front door and relays the
    bytes. One handshake is made at start, so a wrong address, job or user fails at once
    (exit 1, naming what failed).

    With a COMMAND (after --) it runs it with TORCHFT_LIGHTHOUSE set to the relay's URL,
    passes it SIGTERM, SIGINT, SIGHUP, SIGUSR1 and SIGUSR2, and exits with its exit code
    (128 + N when a signal N killed it, as a shell does):
    slurm-spot lighthouse-relay --lighthouse ctl:29510 --job 42 -- python train_ft.py.
    Without, it prints the URL (http://127.0.0.1:PORT) as the first line on stdout and
    relays until SIGTERM/SIGINT."""
    import signal
    import subprocess
    import sys

    from slurm_spot.jobs.injob.lighthouse_relay import (
        DEFAULT_LIGHTHOUSE_PORT,
        LighthouseRelay,
        parse_job_id,
    )
    from slurm_spot.jobs.services.rendezvous import parse_endpoint

    argv = list(command[1:] if command[:1] == ("--",) else command)
    host, port = parse_endpoint(endpoint, "--lighthouse", DEFAULT_LIGHTHOUSE_PORT)
    relay = LighthouseRelay(host, port, parse_job_id(job, "--job"), port_tries=port_tries)
    forwarded = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2)
    try:
        relay.find_front_door(wait_s)  # LighthouseRelayError: exit 1 with what failed
        if relay.port != port:
            click.echo(f"slurm-spot lighthouse-relay: job {relay.job}'s front door is at "
                       f"{relay.where} (port {port} is not it)", err=True)
        # The relay's threads block the signals (they inherit this mask), so each comes to
        # the main thread, which forwards it or stops (slurm_spot.stopsignals).
        mask = signal.pthread_sigmask(signal.SIG_BLOCK, forwarded)
        relay.start()
        if not argv:
            from slurm_spot.stopsignals import STOP_SIGNALS, SignalWait

            signals = SignalWait(STOP_SIGNALS)
            try:
                click.echo(relay.url)
                sys.stdout.flush()
                while signals.wait(60.0) is None:
                    pass
            finally:
                signals.close()
            return
        import os

        from slurm_spot.errors import BadInputError

        env = {**os.environ, "TORCHFT_LIGHTHOUSE": relay.url}
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)
        try:
            child = subprocess.Popen(argv, env=env)  # noqa: S603 - the user's command
        except OSError as exc:
            raise BadInputError(f"cannot run {argv[0]!r}: {exc.strerror or exc}") from None
        for number in forwarded:
            signal.signal(number, lambda signum, _frame: child.send_signal(signum))
        code = child.wait()
        sys.exit(128 - code if code < 0 else code)  # killed by signal N: 128 + N, as sh
    finally:
        relay.close()


COMMANDS = [lighthouse_command, lighthouse_relay_command]
