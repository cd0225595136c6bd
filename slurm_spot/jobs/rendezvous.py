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
replicated store. One store serves every job: torchrun prefixes all its keys with the
rendezvous id (the job id), so jobs do not see each other's keys. What it costs: the store
keeps its keys in memory only; if the service restarts, running elastic jobs keep training
(the workers' process group is already formed), but the next re-rendezvous fails and those
jobs fall back to requeue.

The service is ``TCPStore(host, port, is_master=True, wait_for_workers=False,
multi_tenant=True, master_listen_fd=...)`` (torch.distributed's TCPStore documentation) on a
socket bound to ``host`` only; it runs until SIGTERM or SIGINT.
"""

from __future__ import annotations

import ipaddress
import re
import signal
import socket
import threading
from collections.abc import Callable
from datetime import timedelta
from types import FrameType
from typing import Any

#: The line that marks an elastic job's batch script: the watcher releases a departing node
#: from such a job instead of requeueing it (slurm_spot.watch).
ELASTIC_MARK = "# slurm-spot: elastic job (one job step per node)"

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


def parse_endpoint(text: str, where: str = "--rendezvous") -> tuple[str, int]:
    """``HOST:PORT``, ``[IPv6]:PORT``, or either without ``:PORT`` (port :data:`DEFAULT_PORT`)
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
        return host, DEFAULT_PORT
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
        BadInputError: ``host`` does not resolve, or the address cannot be bound (taken port,
            an address of no interface here); the message names ``host:port``.
    """
    from slurm_spot.errors import BadInputError

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
        raise BadInputError(f"cannot listen on {where}: {exc.strerror or exc}") from None
    return sock


def open_store(host: str, port: int) -> Any:
    """Start hosting a TCPStore on ``host:port`` only (``0.0.0.0`` for every interface);
    returns it. ``TCPStore(host, is_master=True)`` alone would listen on every address
    whatever ``host`` says, so the socket is bound here (:func:`listen_socket`) and handed to
    the store as ``master_listen_fd`` (torch 2.13's TCPStore signature); the store owns it.

    Raises:
        BadInputError: ``host`` does not resolve, the port is taken, or the address is not
            this machine's.
    """
    from torch.distributed import TCPStore

    sock = listen_socket(host, port)
    bound = sock.getsockname()[1]
    return TCPStore(host, bound, is_master=True, wait_for_workers=False, multi_tenant=True,
                    timeout=timedelta(seconds=30), master_listen_fd=sock.detach())


def serve(host: str, port: int, ready: Callable[[int], None] | None = None,
          stop: threading.Event | None = None) -> None:
    """Host the store until SIGTERM/SIGINT (or ``stop`` is set); calls ``ready(port)`` once
    the store accepts connections.

    Raises:
        BadInputError: see :func:`open_store`.
    """
    stop = stop or threading.Event()

    def _stop(_signum: int, _frame: FrameType | None) -> None:
        stop.set()

    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, _stop)
        signal.signal(signal.SIGINT, _stop)
    store = open_store(host, port)
    if ready is not None:
        ready(store.port)
    while not stop.wait(1.0):
        pass
    del store
