"""The front door of an authenticated torchft lighthouse: the only address on the cluster
network where the lighthouse can be reached, letting in only the owner of the job it serves.

torchft's lighthouse (``torchft._torchft.LighthouseServer``, a Rust gRPC server) has no
authentication of its own. ``slurm-spot lighthouse --job JOB`` therefore binds it to
``127.0.0.1`` on a port the kernel picks and puts this front door on the cluster address.
Each connection to the front door starts with the rendezvous service's MUNGE handshake
(:mod:`slurm_spot.jobs.rendezvous_wire`, protocol :data:`~.rendezvous_wire.LIGHTHOUSE_PROTOCOL`):
a fresh nonce, a credential bound to it and to the job, decoded by ``unmunge`` (valid, this
cluster's key, not expired, not replayed). The front door admits the connection only if the
job the client names is the one it serves and the credential's uid owns that job in Slurm;
then it relays the connection's bytes (torchft's HTTP/2) to the lighthouse, both ways,
untouched. Its acceptance carries a MUNGE credential of its own uid for the client's
nonce, so that the relay knows the front door is its user's (or root's), not another
account's process on the lighthouse's port. On the replicas' side
:mod:`slurm_spot.jobs.injob.lighthouse_relay` makes the handshake for torchft's client, which
is not changed.

Who is "the owner" for a fault-tolerant job made of several Slurm jobs (one per replica
group, plus the lighthouse's): every connection names the lighthouse's job (``--job``), and
its owner, looked up once when the front door starts (a job's owner never changes), is the
only uid let in. The replica groups' jobs belong to the same user, so their credentials
prove that uid; another user's job, even on the same nodes, is refused.

Every refusal is logged (``slurm-spot lighthouse: refused PEER: <why>``) and closes the
connection: a wrong uid, another job, no or a forged credential, a replayed one, garbage
(anything that is not the handshake: torchft pointed at the front door without the relay),
nothing within :data:`HANDSHAKE_TIMEOUT_S`. A client that closes without sending a byte (the
replica groups' check that the door is open) is logged at INFO, not as a refusal.
"""

from __future__ import annotations

import logging
import socket

from slurm_spot.jobs.rendezvous_wire import (
    LIGHTHOUSE_PROTOCOL,
    Authenticator,
    ClosedBeforeFrame,
    RendezvousAuthError,
    WireError,
    relay,
    server_handshake,
)
from slurm_spot.jobs.services.accept_loop import AcceptLoop

log = logging.getLogger(__name__)

#: A connection that has not finished its handshake within this many seconds is closed.
HANDSHAKE_TIMEOUT_S = 10.0
#: At most this many connections at once (a replica group's manager holds one).
MAX_CONNECTIONS = 1024
#: How long the front door tries to reach the lighthouse behind it (seconds).
UPSTREAM_CONNECT_TIMEOUT_S = 10.0


class LighthouseFrontDoor(AcceptLoop):
    """Admits the owner of ``job`` on a listening socket and relays to ``upstream``.

    Args:
        sock: a bound, listening TCP socket on the cluster address
            (:func:`slurm_spot.jobs.services.rendezvous.listen_socket`).
        upstream: (host, port) of the torchft lighthouse, on ``127.0.0.1``.
        job: the Slurm job id the lighthouse serves (``42``, an array task ``11_1``).
        owner_uid: the uid owning ``job`` in Slurm (``squeue -j JOB -o %U``).
        authenticator: checks credentials (:class:`~.rendezvous_wire.MungeAuthenticator`).
    """

    def __init__(self, sock: socket.socket, upstream: tuple[str, int], job: str,
                 owner_uid: int, authenticator: Authenticator) -> None:
        super().__init__(sock, MAX_CONNECTIONS)
        self.upstream, self.job = upstream, job
        self.owner_uid, self.authenticator = owner_uid, authenticator
        #: Connections admitted and refused so far (for logs and tests).
        self.admitted = 0
        self.refused = 0

    @property
    def port(self) -> int:
        """The port the front door listens on."""
        return int(self.sock.getsockname()[1])

    def refuse_busy(self, peer: object) -> None:
        log.warning("slurm-spot lighthouse: refused %s: %d connections are open already",
                    _peer_text(peer), MAX_CONNECTIONS)

    def _admit(self, job: str, uid: int) -> None:
        if job != self.job:
            raise RendezvousAuthError(f"this lighthouse serves job {self.job}, not job {job}")
        if uid != self.owner_uid:
            raise RendezvousAuthError(f"uid {uid} does not own job {job}")

    def _refuse(self, peer: object, why: str) -> None:
        log.warning("slurm-spot lighthouse: refused %s: %s", _peer_text(peer), why)
        self.refused += 1

    def serve_connection(self, conn: socket.socket, peer: object) -> None:
        try:
            with conn:
                conn.settimeout(HANDSHAKE_TIMEOUT_S)
                try:
                    _job, uid = server_handshake(conn, self.authenticator, self._admit,
                                                 LIGHTHOUSE_PROTOCOL, HANDSHAKE_TIMEOUT_S,
                                                 prove=True)
                except RendezvousAuthError as exc:
                    self._refuse(peer, str(exc))
                    return
                except ClosedBeforeFrame:  # a port check (the replica groups' wait for it)
                    log.info("slurm-spot lighthouse: %s closed without a word (a check that "
                             "the port is open)", _peer_text(peer))
                    return
                except WireError as exc:
                    self._refuse(peer, f"no slurm-spot lighthouse handshake ({exc}); a torchft "
                                       "client reaches this lighthouse through "
                                       "'slurm-spot lighthouse-relay', not directly")
                    return
                except TimeoutError:
                    self._refuse(peer, f"no handshake within {HANDSHAKE_TIMEOUT_S:g} s")
                    return
                try:
                    upstream = socket.create_connection(self.upstream,
                                                        timeout=UPSTREAM_CONNECT_TIMEOUT_S)
                except OSError as exc:
                    log.error("slurm-spot lighthouse: cannot reach the torchft lighthouse at "
                              "%s:%d for %s: %s", *self.upstream, _peer_text(peer), exc)
                    return
                self.admitted += 1
                log.info("slurm-spot lighthouse: admitted %s (uid %d, job %s)",
                         _peer_text(peer), uid, self.job)
                relay(conn, upstream)
        except OSError:
            pass  # the client went away during the handshake


def _peer_text(peer: object) -> str:
    if isinstance(peer, tuple) and len(peer) >= 2:
        host, port = peer[0], peer[1]
        return f"[{host}]:{port}" if ":" in str(host) else f"{host}:{port}"
    return str(peer)
