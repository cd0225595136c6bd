"""The replica's side of an authenticated torchft lighthouse: a node-local relay that torchft's
client (``torchft.Manager(lighthouse_addr=...)``, ``$TORCHFT_LIGHTHOUSE``) talks to unchanged.

The lighthouse of a fault-tolerant job sits behind a front door that admits only the owner of
the lighthouse's job (:mod:`slurm_spot.jobs.services.ft_front_door`). torchft's Rust gRPC
client knows nothing of that handshake, so the replica's batch script starts this relay: it
listens on ``127.0.0.1`` (a port the kernel picks) and, for each connection torchft opens,
opens one to the front door, makes the MUNGE handshake with a fresh credential of this
process's uid bound to the front door's nonce and the lighthouse's job, checks the front
door's own credential (it runs as this uid, or root: not another account's process that took
the lighthouse's port), and then relays the bytes both ways.

Why TCP on 127.0.0.1 and not a unix socket: torchft 0.2.0 connects with tonic's
``Endpoint::new(addr).connect()`` (src/net.rs), whose connector takes ``http://HOST:PORT``
only; a ``unix://`` address is refused (tested in tests/test_ft_lighthouse_auth.py). So that
another account on the same node cannot borrow the relay (and with it this user's identity),
each accepted connection's other end must belong to this process's uid: the kernel's table
of TCP sockets (``/proc/net/tcp``, its ``uid`` column) says whose it is; any other uid is
refused and logged.

Use it from Python (:func:`relay_lighthouse`, in the process that starts torchft) or as
``slurm-spot lighthouse-relay --lighthouse HOST:PORT --job JOB [-- COMMAND ...]``.

torch and torchft are not imported here.
"""

from __future__ import annotations

import logging
import os
import socket
import struct
import threading
import time
from pathlib import Path

from slurm_spot.errors import SlurmSpotError
from slurm_spot.jobs.rendezvous_wire import (
    LIGHTHOUSE_PROTOCOL,
    Authenticator,
    MungeAuthenticator,
    RendezvousAuthError,
    WireError,
    client_handshake,
    relay,
)
from slurm_spot.jobs.services.accept_loop import AcceptLoop

log = logging.getLogger(__name__)

#: The lighthouse's port when an endpoint names none (``slurm-spot lighthouse --port``).
DEFAULT_LIGHTHOUSE_PORT = 29510
#: How long connecting to the front door and its handshake may take (seconds).
CONNECT_TIMEOUT_S = 10.0
LOOPBACK = "127.0.0.1"


class LighthouseRelayError(SlurmSpotError):
    """The relay could not reach the lighthouse: the message names the front door and what
    failed (connecting, no slurm-spot lighthouse there, no credential, refused and why)."""


def _proc_tcp_address(host: str, port: int) -> str:
    """``host:port`` (IPv4) as /proc/net/tcp writes it: the address as the kernel's 32-bit
    word in hex, native byte order (``127.0.0.1:80`` -> ``0100007F:0050`` on x86)."""
    (word,) = struct.unpack("=I", socket.inet_aton(host))
    return f"{word:08X}:{port:04X}"


def loopback_peer_uid(conn: socket.socket, table: Path = Path("/proc/net/tcp")) -> int | None:
    """The uid owning the other end of ``conn``, an IPv4 TCP connection accepted on this
    machine from this machine: the row of ``table`` (proc(5), ``/proc/net/tcp``) whose local
    address is ``conn``'s peer and whose remote address is ``conn``'s own. None when no such
    row exists (the other end is already closed, or is not on this machine)."""
    peer_host, peer_port = conn.getpeername()[:2]
    own_host, own_port = conn.getsockname()[:2]
    local, remote = _proc_tcp_address(peer_host, peer_port), _proc_tcp_address(own_host,
                                                                                own_port)
    try:
        lines = table.read_text().splitlines()[1:]
    except OSError:
        return None
    for line in lines:
        fields = line.split()
        if len(fields) > 7 and fields[1] == local and fields[2] == remote:
            return int(fields[7])
    return None


class LighthouseRelay(AcceptLoop):
    """A relay on ``127.0.0.1`` to the lighthouse front door at ``host:port`` for ``job``.

    Args:
        host, port: the front door (``slurm-spot lighthouse --listen HOST --port PORT``).
        job: the Slurm job id the lighthouse serves (``slurm-spot lighthouse --job``); this
            process's uid must own it.
        authenticator: makes the credentials (MUNGE by default).
        listen_port: the local port (0: one the kernel picks).
        timeout_s: how long connecting to the front door and the handshake may take.
        port_tries: the front door may be on any of ``port`` .. ``port + port_tries - 1``
            (``slurm-spot lighthouse --port-tries``): :meth:`find_front_door` keeps the
            first that admits this relay for ``job``.

    Raises:
        BadInputError: the local port cannot be bound.
    """

    def __init__(self, host: str, port: int, job: str,
                 authenticator: Authenticator | None = None, listen_port: int = 0,
                 timeout_s: float = CONNECT_TIMEOUT_S, port_tries: int = 1) -> None:
        from slurm_spot.jobs.services.rendezvous import format_endpoint, listen_socket

        self.host, self.port, self.job = host, port, job
        self.ports = list(range(port, min(port + max(port_tries, 1), 65536)))
        self.where = format_endpoint(host, port)
        self.authenticator = authenticator or MungeAuthenticator()
        super().__init__(listen_socket(LOOPBACK, listen_port))
        self.uid = os.getuid()
        self.timeout_s = timeout_s
        #: Local connections refused because another uid opened them.
        self.refused_local = 0

    @property
    def url(self) -> str:
        """``http://127.0.0.1:PORT``: what torchft is given (``TORCHFT_LIGHTHOUSE``,
        ``Manager(lighthouse_addr=...)``)."""
        return f"http://{LOOPBACK}:{self.sock.getsockname()[1]}"

    def open_upstream(self) -> socket.socket:
        """A connection to the front door, handshake done, ready to carry torchft's bytes.

        Raises:
            LighthouseRelayError: the front door cannot be reached, is no slurm-spot
                lighthouse, no credential can be made, or it refused (its reason included).
        """
        try:
            sock = socket.create_connection((self.host, self.port), timeout=self.timeout_s)
        except OSError as exc:
            raise LighthouseRelayError(f"cannot reach the lighthouse front door {self.where}: "
                                       f"{exc.strerror or exc}") from None
        try:
            client_handshake(sock, self.job, self.authenticator, self.where,
                             LIGHTHOUSE_PROTOCOL, "lighthouse front door",
                             server_uids={self.uid, 0})
        except RendezvousAuthError as exc:
            sock.close()
            raise LighthouseRelayError(f"lighthouse relay for job {self.job}: {exc}") from None
        except WireError as exc:
            sock.close()
            raise LighthouseRelayError(
                f"{self.where} is no slurm-spot lighthouse front door ({exc}): is it "
                "'slurm-spot lighthouse --job' (not --unauthenticated), and this its port?"
            ) from None
        except OSError as exc:
            sock.close()
            why = (f"no answer within {self.timeout_s:g} s (a slurm-spot lighthouse front door "
                   "speaks first; torchft's own port does not)") \
                if isinstance(exc, TimeoutError) else (exc.strerror or str(exc))
            raise LighthouseRelayError(f"lighthouse front door {self.where}: the handshake "
                                       f"failed: {why}") from None
        return sock

    def check(self) -> None:
        """Make one handshake now, so that a wrong address, job or user fails at once rather
        than as torchft's connect timeout.

        Raises:
            LighthouseRelayError: see :meth:`open_upstream`.
        """
        self.open_upstream().close()

    def find_front_door(self, wait_s: float = 0.0, poll_s: float = 1.0) -> None:
        """Make one handshake at each port of :attr:`ports` in turn and keep the first
        that admits this relay for its job (another job's lighthouse on the same node
        refuses it: "this lighthouse serves job N"); with ``wait_s``, look again every
        ``poll_s`` seconds until that many seconds have passed (the lighthouse may still
        be starting).

        Raises:
            LighthouseRelayError: no port admitted it; the message has each port's answer.
        """
        from slurm_spot.jobs.services.rendezvous import format_endpoint

        deadline = time.monotonic() + wait_s
        while True:
            answers = []
            for port in self.ports:
                self.port, self.where = port, format_endpoint(self.host, port)
                try:
                    self.check()
                    return
                except LighthouseRelayError as exc:
                    answers.append(str(exc))
            if time.monotonic() + poll_s > deadline:
                self.port, self.where = self.ports[0], format_endpoint(self.host, self.ports[0])
                if len(answers) == 1:
                    raise LighthouseRelayError(answers[0])
                raise LighthouseRelayError(
                    f"no lighthouse front door for job {self.job} at "
                    f"{format_endpoint(self.host, self.ports[0])} or the next "
                    f"{len(self.ports) - 1} port(s)"
                    + (f" (looked for {wait_s:g} s)" if wait_s else "") + ": "
                    + "; ".join(answers))
            time.sleep(poll_s)

    def start(self) -> LighthouseRelay:
        """Serve in a daemon thread; returns self."""
        threading.Thread(target=self.serve_forever, daemon=True,
                         name=f"lighthouse-relay-{self.job}").start()
        return self

    def serve_connection(self, conn: socket.socket, peer: object) -> None:
        with conn:
            uid = loopback_peer_uid(conn)
            if uid != self.uid:
                self.refused_local += 1
                log.warning("slurm-spot lighthouse-relay: refused a local connection of uid "
                            "%s: only uid %d (this job's user) is relayed", uid, self.uid)
                return
            try:
                upstream = self.open_upstream()
            except LighthouseRelayError as exc:
                log.error("slurm-spot lighthouse-relay: %s", exc)
                return
            relay(conn, upstream)


_relays: list[LighthouseRelay] = []


def relay_lighthouse(endpoint: str, job_id: str) -> str:
    """Start a relay to the lighthouse front door ``endpoint`` (``HOST:PORT``, ``[IPv6]:PORT``;
    port 29510 when none is given) for job ``job_id`` in this process (a daemon thread, for
    the life of the process) and return the URL to give torchft
    (``TORCHFT_LIGHTHOUSE``/``Manager(lighthouse_addr=...)``), ``http://127.0.0.1:PORT``.
    One handshake is made first, so that a wrong endpoint, job or user raises here. The relay's
    threads need this process's GIL to move each message: where the training loop keeps
    Python busy, ``slurm-spot lighthouse-relay`` (a process of its own) is the better choice.

    Raises:
        BadInputError: ``endpoint`` or ``job_id`` is malformed (the message names it).
        LighthouseRelayError: the front door cannot be reached, or refused (its reason).
    """
    from slurm_spot.jobs.services.rendezvous import parse_endpoint

    host, port = parse_endpoint(endpoint, "lighthouse endpoint", DEFAULT_LIGHTHOUSE_PORT)
    job = parse_job_id(job_id)
    relay_ = LighthouseRelay(host, port, job)
    try:
        relay_.check()
    except BaseException:
        relay_.close()
        raise
    _relays.append(relay_.start())
    return relay_.url


def parse_job_id(text: str, where: str = "job id") -> str:
    """A Slurm job id as squeue takes it (``42``, an array task ``11_1``); returns it.

    Raises:
        BadInputError: anything else (names ``where`` and the value).
    """
    import re

    from slurm_spot.errors import BadInputError

    value = str(text).strip()
    if not re.fullmatch(r"[0-9]+(_[0-9]+)?", value):
        raise BadInputError(f"{where} {text!r}: expected a Slurm job id such as 42 or 11_1")
    return value
