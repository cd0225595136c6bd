"""``slurm-spot rendezvous``: the store elastic torchrun jobs rendezvous through, hosted on the
controller (or another node that is not reclaimed), not on a spot node.

torchrun's c10d rendezvous backend keeps its state in a ``torch.distributed.TCPStore``. Left to
itself, torchrun hosts that store inside the agent of the node named in ``--rdzv-endpoint``:
when that node is a spot node and is reclaimed, the store and every survivor's rendezvous go
with it. This service hosts the store on a machine that stays, and each agent is told it is a
client (``--rdzv-conf is_host=false``).

Why the c10d store and not etcd: the c10d backend is part of torch itself (nothing else to
install or run on the nodes: the ``etcd``/``etcd-v2`` backends need the ``python-etcd``
client on every node and an etcd server), it is what torchrun's documentation recommends for
new jobs, and a rendezvous is a few small keys for a few seconds per round, which needs no
replicated store. One service serves every job, each in a key space of its own.

Who may use a job's keys (issue 25): the service listens on one address, this machine's
on the cluster network (:func:`default_listen_host`; every interface is refused), and a
client reaches a job's keys only after proving, with a MUNGE credential bound to a fresh
nonce and the job, that its uid owns the job in Slurm
(:mod:`slurm_spot.jobs.rendezvous_wire`). So a client that knows only host, port and job id
(public in squeue) reads, writes and deletes nothing. Each job's keys are bounded
(:class:`~.rendezvous_store.StoreLimits`), and the keys of jobs Slurm no longer knows are
dropped. The agents use it through torchrun's c10d backend logic on a store of ours
(``--rdzv-backend=slurm-spot``, :mod:`slurm_spot.jobs.injob.rendezvous_client`): a TCPStore
server cannot authenticate nor separate its clients.

What it costs: the store keeps its keys in memory only; if the service restarts, running
elastic jobs keep training (the workers' process group is already formed), but the next
re-rendezvous fails and those jobs fall back to requeue.
"""

from __future__ import annotations

import ipaddress
import logging
import os
import re
import socket
import threading
from collections.abc import Callable, Mapping

from slurm_spot.jobs.services.rendezvous_store import RendezvousServer, StoreLimits
from slurm_spot.slurm.client import SlurmClient
from slurm_spot.stopsignals import StopWait

log = logging.getLogger(__name__)

#: The service's port unless told otherwise (torchrun's own default c10d port is 29400; the
#: per-job agents of non-elastic jobs use 29400 + job id % 1000, see torchrun_agent).
DEFAULT_PORT = 29390

#: The store of a job with an on-demand coordinator (``slurm-spot sbatch --coordinator-partition``)
#: listens on the coordinator node at this port + job id % 1000: off torchrun's (29400 + job id
#: % 1000 for non-elastic jobs) and below Linux's ephemeral ports (32768+), so two such jobs
#: on one node, or one of them next to plain torchrun jobs, do not collide.
HETJOB_PORT_BASE = 30400


#: A hostname as RFC 1123 (section 2.1) allows it: dot-separated labels of 1-63 letters, digits
#: and hyphens, neither starting nor ending with a hyphen; 253 characters at most.
_LABEL = r"(?!-)[A-Za-z0-9-]{1,63}(?<!-)"
_HOSTNAME = re.compile(rf"{_LABEL}(?:\.{_LABEL})*")


def _host_problem(text: str) -> str | None:
    """What is wrong with ``text`` as a host (see :func:`parse_host`); None if nothing."""
    if ":" in text:
        try:
            ipaddress.IPv6Address(text)
        except ValueError:
            return "not an IPv6 address"
        return None
    if len(text) <= 253 and _HOSTNAME.fullmatch(text):
        if not text.rsplit(".", 1)[-1].isdigit():
            return None
        try:  # all-digit last label: it has to be an IPv4 address, not 1.2.3.999
            ipaddress.IPv4Address(text)
            return None
        except ValueError:
            pass
    return "expected a hostname (RFC 1123), an IPv4 address or [IPv6]"


def parse_host(text: str, where: str = "--rendezvous") -> str:
    """Check one host: an RFC 1123 hostname, an IPv4 address, or an IPv6 address (without the
    brackets); returns it unchanged.

    Raises:
        BadInputError: anything else (names ``where`` and the value).
    """
    from slurm_spot.errors import BadInputError

    problem = _host_problem(text)
    if problem:
        raise BadInputError(f"{where}={text!r}: {problem}")
    return text


def parse_endpoint(text: str, where: str = "--rendezvous",
                   default_port: int = DEFAULT_PORT) -> tuple[str, int]:
    """``HOST:PORT``, ``[IPv6]:PORT``, or either without ``:PORT`` (port ``default_port``)
    -> (host, port); the host is an RFC 1123 hostname, an IPv4 address, or an IPv6 address
    (returned without brackets). torchrun reads ``--rdzv-endpoint`` the same way
    (torch/distributed/elastic/rendezvous/utils.py, ``parse_rendezvous_endpoint``).

    Raises:
        BadInputError: anything else: an empty or malformed host (``h;x``, a bare IPv6
            address such as ``::1``, ``h:1:2``), a port that is no number in 1..65535; the
            message names ``where`` and the value.
    """
    from slurm_spot.errors import BadInputError

    value = text.strip()
    bracketed = re.fullmatch(r"\[([^\]]*)\](?::(.*))?", value, re.DOTALL)
    if bracketed:
        host, port_text = bracketed.group(1), bracketed.group(2)
        if ":" not in host:
            raise BadInputError(f"{where}={text!r}: [...] is for IPv6 addresses")
    elif value.count(":") > 1:
        raise BadInputError(f"{where}={text!r}: expected HOST:PORT (an IPv6 address goes in "
                            "brackets: [::1]:29390)")
    else:
        host, sep, port_text = value.partition(":")
        port_text = port_text if sep else None
    if not host:
        raise BadInputError(f"{where}={text!r}: expected HOST:PORT")
    problem = _host_problem(host)
    if problem:
        raise BadInputError(f"{where}={text!r}: {problem}")
    if port_text is None:
        return host, default_port
    if not (port_text.isascii() and port_text.isdigit()) or not 1 <= int(port_text) <= 65535:
        raise BadInputError(f"{where}={text!r}: the port must be a number in 1..65535")
    return host, int(port_text)


def format_endpoint(host: str, port: int) -> str:
    """(host, port) -> ``HOST:PORT``, an IPv6 address in brackets (``[::1]:29390``), as
    torchrun's ``--rdzv-endpoint`` reads it."""
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def listen_socket(host: str, port: int) -> socket.socket:
    """A TCP socket bound to ``host:port`` (``0.0.0.0``/``::``: every interface) and listening.

    Raises:
        BadInputError: ``host`` does not resolve, or the address cannot be bound (an address
            of no interface here); the message names ``host:port``.
        PortTakenError: (a BadInputError) another socket holds the port.
    """
    import errno

    from slurm_spot.errors import BadInputError, PortTakenError

    where = f"{format_endpoint(host, port)}"
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM,
                                   flags=socket.AI_PASSIVE)
    except (socket.gaierror, UnicodeError) as exc:
        raise BadInputError(f"cannot listen on {where}: {exc}") from None
    family, kind, proto, _name, address = infos[0]
    sock = socket.socket(family, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if family == socket.AF_INET6 and host in ("::", "[::]"):
            sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
        sock.bind(address)
        sock.listen(512)
    except OSError as exc:
        sock.close()
        error = PortTakenError if exc.errno == errno.EADDRINUSE else BadInputError
        raise error(f"cannot listen on {where}: {exc.strerror or exc}") from None
    return sock


ALL_INTERFACES = ("0.0.0.0", "::", "[::]", "")


def is_every_interface(address: str) -> bool:
    """True when binding ``address`` (an IP address as ``getaddrinfo``/``getsockname`` give
    it) listens on every interface: ``0.0.0.0``, ``::``, and the IPv4-mapped ``::ffff:0.0.0.0``,
    which an IPv6 socket on Linux (``net.ipv6.bindv6only`` 0, the default) turns into every
    IPv4 interface (ipv6(7)); False for anything else, names included."""
    try:
        ip = ipaddress.ip_address(address.split("%", 1)[0])
    except ValueError:
        return False
    mapped = getattr(ip, "ipv4_mapped", None)
    return ip.is_unspecified or (mapped is not None and mapped.is_unspecified)


def resolves_to_every_interface(host: str) -> str | None:
    """The address ``host`` resolves to for listening (``getaddrinfo`` with ``AI_PASSIVE``,
    as :func:`listen_socket` binds) when it means every interface (:func:`is_every_interface`:
    forms such as ``0x0`` or ``::ffff:0.0.0.0``, or a name in /etc/hosts for ``0.0.0.0``),
    else None (None too when it does not resolve: binding it then says so)."""
    try:
        infos = socket.getaddrinfo(host, 0, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except (socket.gaierror, UnicodeError, OSError):
        return None
    for *_rest, address in infos:
        if is_every_interface(str(address[0])):
            return str(address[0])
    return None


def refuse_all_interfaces(host: str) -> str:
    """``host`` unless it means every interface; returns it unchanged.

    Raises:
        BadInputError: ``0.0.0.0``, ``::`` or empty: the store would answer every network
            this machine is on, not only the cluster's.
    """
    from slurm_spot.errors import BadInputError

    if host.strip() in ALL_INTERFACES:
        raise BadInputError(f"--listen={host!r} is every interface: the rendezvous store "
                            "would answer every network this machine is on; give this "
                            "machine's address on the cluster network (its NodeAddr)")
    return host


def default_listen_host(client: SlurmClient | None = None,
                        env: Mapping[str, str] | None = None) -> str:
    """The address to listen on when none is given: this machine's address on the cluster
    network, never every interface. On a Slurm node (``SLURMD_NODENAME`` set, as in a job)
    its NodeAddr; elsewhere (the controller) the address this machine's hostname resolves to
    (a loopback address where that is what it resolves to).

    Raises:
        BadInputError: the hostname does not resolve.
    """
    from slurm_spot.errors import BadInputError, SlurmSpotError

    env = os.environ if env is None else env
    node = env.get("SLURMD_NODENAME")
    if node:
        try:
            nodes = (client or SlurmClient()).nodes([node], with_jobs=False)
            if nodes and nodes[0].addr:
                return nodes[0].addr
        except SlurmSpotError:
            pass
    name = socket.gethostname()
    try:
        return str(socket.getaddrinfo(name, None, type=socket.SOCK_STREAM)[0][4][0])
    except (socket.gaierror, UnicodeError) as exc:
        raise BadInputError(f"this machine's name {name!r} does not resolve ({exc}); "
                            "give --listen ADDRESS") from None


def open_server(host: str, port: int, limits: StoreLimits | None = None,
                client: SlurmClient | None = None) -> RendezvousServer:
    """A :class:`RendezvousServer` on ``host:port`` only, authenticating clients with MUNGE
    and asking Slurm (``squeue``) who owns a job.

    Raises:
        BadInputError: ``host`` is every interface, does not resolve, the port is taken, or
            the address is not this machine's.
    """
    from slurm_spot.errors import BadInputError
    from slurm_spot.jobs.rendezvous_wire import MungeAuthenticator

    sock = listen_socket(refuse_all_interfaces(host), port)
    bound = str(sock.getsockname()[0])
    if is_every_interface(bound):  # a name or form such as "0x0" or ::ffff:0.0.0.0 that means it
        sock.close()
        raise BadInputError(f"--listen={host!r} is every interface ({bound}): give this "
                            "machine's address on the cluster network (its NodeAddr)")
    slurm = client or SlurmClient()
    return RendezvousServer(sock, MungeAuthenticator(), slurm.job_owner_uid, limits)


#: How often the service forgets the keys of jobs that ended (seconds).
DROP_ENDED_EVERY_S = 600.0


def serve(host: str, port: int, ready: Callable[[int], None] | None = None,
          stop: threading.Event | None = None, limits: StoreLimits | None = None,
          client: SlurmClient | None = None) -> None:
    """Host the store until SIGTERM/SIGINT (in the main thread) or ``stop`` is set (in another
    thread); calls ``ready(port)`` once it accepts connections. Every
    :data:`DROP_ENDED_EVERY_S` the keys of ended jobs go.

    Raises:
        BadInputError: see :func:`open_server`.
    """
    # In the main thread the signals are blocked before the accept thread starts, so SIGTERM
    # waits for the main thread, which takes it at once (slurm_spot.stopsignals: a handler
    # ran only after the 600 s wait when the kernel chose the accept thread).
    with StopWait(stop) as stopped:
        server = open_server(host, port, limits, client)
        try:
            threading.Thread(target=server.serve_forever, daemon=True).start()
            if ready is not None:
                ready(server.port)
            while not stopped.wait(DROP_ENDED_EVERY_S):
                try:
                    server.drop_ended_jobs()
                except Exception as exc:
                    log.warning("slurm-spot rendezvous: cannot drop ended jobs: %s", exc)
        finally:
            server.close()
