"""The torchft lighthouse of a fault-tolerant job: where its replica groups form each step's
quorum, bound to one address, never every interface.

torchft (``pip install 'slurm-spot[ft]'``) keeps surviving replica groups training while one
is lost: at every step each group's manager asks the lighthouse for a quorum (who takes part,
who is behind and heals from whom). The lighthouse is a Rust gRPC server inside torchft's wheel
(``torchft._torchft.LighthouseServer``); it must run where no reclaim takes it, so on the job's
on-demand coordinator, never on a spot node (docs/ml-engineer.md, "Fault-tolerant training").

torchft's lighthouse has no authentication of its own: :func:`serve_authenticated` (what
``slurm-spot lighthouse --job JOB`` runs) binds it to 127.0.0.1 and puts a front door on the
cluster address that admits only the owner of the job (a MUNGE handshake,
:mod:`slurm_spot.jobs.services.ft_front_door`); the replicas reach it through a node-local
relay (:mod:`slurm_spot.jobs.injob.lighthouse_relay`). :func:`serve` is the unauthenticated
lighthouse of ``--unauthenticated``.

torchft is imported here only, when a lighthouse is started (the rest of slurm-spot runs
without it installed).

How long a lost replica holds the others up is :class:`LighthouseTimeouts`. torchft's lighthouse
(``quorum_compute`` in its src/lighthouse.rs) forms the next quorum at once when every
*healthy* replica (last heartbeat younger than ``heartbeat_timeout_ms``; a quorum request
counts as one) has asked to join; otherwise it waits up to ``join_timeout_ms`` from the first
joiner for the rest. A group that left at a notice or died stops heartbeating at once but
counts as healthy until its last heartbeat is ``heartbeat_timeout_ms`` old, so the survivors
wait min(``heartbeat_timeout_ms``, ``join_timeout_ms``) after a loss, with notice or without:
the heartbeat timeout (500 ms) is below the join timeout (1000 ms) here, so a loss costs the
survivors ~0.5 s plus their step, while a replacement that heartbeats but is still starting
is still waited for up to 1 s.
"""

from __future__ import annotations

import os
import socket
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from slurm_spot.errors import BadInputError
from slurm_spot.jobs.rendezvous_wire import Authenticator
from slurm_spot.jobs.services.rendezvous import (
    ALL_INTERFACES,
    format_endpoint,
    parse_host,
    resolves_to_every_interface,
)


class TorchftMissingError(BadInputError):
    """torchft is not installed where a fault-tolerant job needs it."""


def import_torchft_lighthouse() -> Any:
    """``torchft._torchft.LighthouseServer``.

    Raises:
        TorchftMissingError: torchft is not importable (the ``ft`` extra is not installed).
    """
    try:
        from torchft._torchft import LighthouseServer
    except ImportError as exc:
        raise TorchftMissingError(
            f"torchft is not installed here ({exc}); install slurm-spot's ft extra: "
            "pip install 'slurm-spot[ft]'") from None
    return LighthouseServer


@dataclass(frozen=True)
class LighthouseTimeouts:
    """The lighthouse's timing, in milliseconds (torchft's ``LighthouseServer`` arguments).

    Attributes:
        join_timeout_ms: how long a quorum waits for replicas that heartbeat but have not
            asked to join (a replacement still starting, a group slow to finish its step)
            before it forms without them.
        heartbeat_timeout_ms: a replica whose last heartbeat is older is counted gone, and the
            next quorum forms without it: the survivors' pause after a group leaves (notice)
            or dies (no notice), when below ``join_timeout_ms``. torchft's Manager heartbeats
            every 100 ms (its ``heartbeat_interval``) from a Rust thread that needs no GIL,
            so 500 ms is 5 missed heartbeats. The trade-off: a group whose heartbeats stall
            longer than this (its process frozen, a CPU starved that long, a network hiccup
            to the lighthouse) is left out of the quorum that forms meanwhile, and it heals
            from a peer in the next (that group's step lost, ~0.1-0.4 s of healing for the
            example's model; the others do not wait). Measured: BENCHMARKS.md (four-modes)
            and docs/ml-engineer.md.
        quorum_tick_ms: how often the lighthouse checks whether a quorum can form.
    """

    join_timeout_ms: int = 1000
    heartbeat_timeout_ms: int = 500
    quorum_tick_ms: int = 50

    def __post_init__(self) -> None:
        for name in ("join_timeout_ms", "heartbeat_timeout_ms", "quorum_tick_ms"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise BadInputError(f"lighthouse {name} must be an integer >= 1 (ms), "
                                    f"got {value!r}")


def refuse_every_interface(host: str, where: str) -> str:
    """``host`` checked (:func:`~.rendezvous.parse_host`) unless it means every interface;
    returns it. What it resolves to for binding is checked too
    (:func:`~.rendezvous.resolves_to_every_interface`): ``0x0`` and ``::ffff:0.0.0.0`` pass
    as a hostname and an IPv6 address but bind every IPv4 interface.

    Raises:
        BadInputError: ``0.0.0.0``, ``::``, empty, another form or a name that binds every
            interface, or a malformed host (names ``where``).
    """
    every = host.strip() in ALL_INTERFACES
    if not every:
        host = parse_host(host, where)
        resolved = resolves_to_every_interface(host)
        if resolved is not None:
            raise BadInputError(f"{where} {host!r} binds {resolved}, every interface: the "
                                "lighthouse must answer the cluster network only; give this "
                                "machine's address on the cluster network (its NodeAddr)")
    if every:
        raise BadInputError(f"{where} {host!r} is every interface: the lighthouse must "
                            "answer the cluster network only; give this machine's address "
                            "on the cluster network (its NodeAddr)")
    return host


class Lighthouse:
    """A running torchft lighthouse on ``host:port`` (``port`` 0: one the kernel picks).

    Args:
        host: the address to bind, this machine's on the cluster network (a hostname, IPv4,
            or IPv6 address); ``0.0.0.0``/``::`` are refused.
        port: TCP port, 0..65535.
        min_replicas: fewest replica groups a quorum needs (>= 1).
        timeouts: see :class:`LighthouseTimeouts`.

    Raises:
        BadInputError: ``host`` is every interface or malformed, ``port`` or ``min_replicas``
            out of range, or the address cannot be bound (the message names it).
        TorchftMissingError: torchft is not installed.
    """

    def __init__(self, host: str, port: int = 0, min_replicas: int = 1,
                 timeouts: LighthouseTimeouts | None = None) -> None:
        host = refuse_every_interface(host, "lighthouse address")
        if isinstance(port, bool) or not isinstance(port, int) or not 0 <= port <= 65535:
            raise BadInputError(f"lighthouse port must be 0..65535, got {port!r}")
        if isinstance(min_replicas, bool) or not isinstance(min_replicas, int) \
                or min_replicas < 1:
            raise BadInputError(f"lighthouse min_replicas must be an integer >= 1, got "
                                f"{min_replicas!r}")
        timeouts = timeouts or LighthouseTimeouts()
        server_class = import_torchft_lighthouse()
        bind = format_endpoint(host, port)
        try:
            self._server = server_class(
                bind=bind, min_replicas=min_replicas,
                join_timeout_ms=timeouts.join_timeout_ms,
                quorum_tick_ms=timeouts.quorum_tick_ms,
                heartbeat_timeout_ms=timeouts.heartbeat_timeout_ms)
        except Exception as exc:  # the Rust side raises RuntimeError/OSError-like errors
            raise BadInputError(f"cannot start the lighthouse on {bind}: {exc}") from None
        self.host = host
        self.timeouts = timeouts
        self.min_replicas = min_replicas

    @property
    def address(self) -> str:
        """``http://HOST:PORT``, what replicas get in ``TORCHFT_LIGHTHOUSE`` (torchft's
        lighthouse answers on the host it was bound to; the port is the one bound)."""
        reported = str(self._server.address())  # http://<hostname>:<port>
        port = int(reported.rsplit(":", 1)[1].rstrip("/"))
        return f"http://{format_endpoint(self.host, port)}"

    def shutdown(self) -> None:
        """Stop serving (idempotent)."""
        self._server.shutdown()


def serve(host: str, port: int, min_replicas: int, timeouts: LighthouseTimeouts,
          ready: Callable[[str], None] | None = None,
          stop: threading.Event | None = None) -> None:
    """Run a lighthouse until SIGTERM/SIGINT (main thread) or ``stop`` is set; calls
    ``ready(address)`` once it listens.

    Raises:
        BadInputError, TorchftMissingError: see :class:`Lighthouse`.
    """
    from slurm_spot.stopsignals import StopWait

    with StopWait(stop) as stopped:
        lighthouse = Lighthouse(host, port, min_replicas, timeouts)
        try:
            if ready is not None:
                ready(lighthouse.address)
            while not stopped.wait(1.0):
                pass
        finally:
            lighthouse.shutdown()


def listen_free_port(host: str, port: int, tries: int = 1) -> socket.socket:
    """A socket listening on ``host`` at the first free port of ``port`` ..
    ``port + tries - 1`` (port 0: one the kernel picks).

    Raises:
        PortTakenError: every one of them is taken (the message names them).
        BadInputError: ``host`` does not resolve or is no address of this machine.
    """
    from slurm_spot.errors import PortTakenError
    from slurm_spot.jobs.services.rendezvous import listen_socket

    if port == 0 or tries <= 1:
        return listen_socket(host, port)
    for candidate in range(port, min(port + tries, 65536)):
        try:
            return listen_socket(host, candidate)
        except PortTakenError:
            continue
    raise PortTakenError(f"cannot listen on {format_endpoint(host, port)}: it and the next "
                         f"{tries - 1} port(s) are taken")


def serve_authenticated(host: str, port: int, job: str, min_replicas: int,
                        timeouts: LighthouseTimeouts,
                        ready: Callable[[str, int], None] | None = None,
                        stop: threading.Event | None = None,
                        owner_of: Callable[[str], int | None] | None = None,
                        authenticator: Authenticator | None = None,
                        port_tries: int = 1) -> None:
    """Run a lighthouse on 127.0.0.1 (a port the kernel picks) behind a front door on
    ``host:port`` that admits only the owner of ``job``
    (:class:`~.ft_front_door.LighthouseFrontDoor`), until SIGTERM/SIGINT (main thread) or
    ``stop`` is set; calls ``ready(front_door_endpoint, owner_uid)`` once both listen.

    Args:
        owner_of: the uid owning a job, None when Slurm does not know it (default: squeue,
            :meth:`SlurmClient.job_owner_uid`); asked once, at start.
        authenticator: checks credentials (default: MUNGE).
        port_tries: the front door takes the first free port of ``port`` ..
            ``port + port_tries - 1`` (another job's lighthouse may hold ``port`` on this
            node); the replicas' relays look at the same ports (``LighthouseRelay``'s
            ``port_tries``) and keep the one whose door admits them for ``job``.

    Raises:
        BadInputError: ``host`` is every interface or malformed, every port tried is taken, ``job``
            is not a job Slurm knows or not this user's (root may serve any), or see
            :class:`Lighthouse`.
        SlurmCommandError: squeue failed.
        TorchftMissingError: torchft is not installed.
    """
    from slurm_spot.jobs.rendezvous_wire import MungeAuthenticator
    from slurm_spot.jobs.services.ft_front_door import LighthouseFrontDoor
    from slurm_spot.stopsignals import StopWait

    host = refuse_every_interface(host, "lighthouse address")
    if owner_of is None:
        from slurm_spot.slurm.client import SlurmClient

        owner_of = SlurmClient().job_owner_uid
    owner = owner_of(job)
    if owner is None:
        raise BadInputError(f"--job {job}: Slurm does not know this job (squeue -j {job}); "
                            "the lighthouse admits its owner only, so the job must be "
                            "pending or running")
    me = os.getuid()
    if me not in (owner, 0):
        raise BadInputError(f"--job {job}: the job is uid {owner}'s, not yours (uid {me}): only "
                            "its owner (or root) hosts its lighthouse, and its replicas accept "
                            "no other")
    with StopWait(stop) as stopped:
        sock = listen_free_port(host, port, port_tries)
        try:
            lighthouse = Lighthouse("127.0.0.1", 0, min_replicas, timeouts)
        except BaseException:
            sock.close()
            raise
        door = LighthouseFrontDoor(sock, ("127.0.0.1", int(lighthouse.address.rsplit(":", 1)[1])),
                                   job, owner, authenticator or MungeAuthenticator())
        try:
            threading.Thread(target=door.serve_forever, daemon=True).start()
            if ready is not None:
                ready(format_endpoint(host, door.port), owner)
            while not stopped.wait(1.0):
                pass
        finally:
            door.close()
            lighthouse.shutdown()
