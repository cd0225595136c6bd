"""The wire of ``slurm-spot rendezvous``: frames, the handshake, and MUNGE credentials.

A frame is a 4-byte big-endian length and that many bytes of JSON (values in base64). The
handshake, before anything else on a connection:

1. server -> client ``{"hello": PROTOCOL, "nonce": <32 hex digits, fresh per connection>}``;
2. client -> server ``{"job": <job>, "credential": <MUNGE credential>}``, the credential's
   payload being :func:`credential_payload` (protocol, nonce, job): MUNGE (what Slurm itself
   authenticates users with) says which uid made it, on which cluster (the MUNGE key), that
   it is fresh (its TTL) and used once (munged's replay cache);
3. server -> client ``{"ok": true}``, or ``{"ok": false, "error": ...}`` and the connection
   closes. The server accepts only when the credential's uid owns ``job`` in Slurm.

Every later request concerns that job's keys only.

The same handshake opens every connection to the front door of an authenticated torchft
lighthouse (:mod:`slurm_spot.jobs.services.ft_front_door`), with :data:`LIGHTHOUSE_PROTOCOL`
in place of :data:`PROTOCOL` (so neither service takes the other's client for its own), after
which the front door relays the connection's bytes to the lighthouse (:func:`relay`). There
the server proves itself too (``prove``/``server_uids``): a process of another account that
took the lighthouse's port (it is known from the job id) would otherwise be told the
replicas' quorum requests and could name itself the peer they heal from. So in step 2 the
client adds ``"client_nonce"`` (fresh), and in step 3 the server adds ``"credential"``, a
MUNGE credential of its own uid whose payload is :func:`server_payload` (protocol, that nonce,
the job); the client accepts only the uids it was told (its own, and root's).
"""

from __future__ import annotations

import base64
import json
import re
import secrets
import socket
import struct
import subprocess
import threading
import time
from collections.abc import Callable, Collection
from dataclasses import dataclass
from typing import Any, Protocol

from slurm_spot.errors import SlurmSpotError

PROTOCOL = "slurm-spot-rendezvous/1"
#: The protocol of the torchft lighthouse's front door (same handshake, then a byte relay).
LIGHTHOUSE_PROTOCOL = "slurm-spot-lighthouse/2"
#: The largest frame either side reads (a value of at most MAX_VALUE_BYTES in base64 fits).
MAX_FRAME_BYTES = 4 * 1024 * 1024
#: The largest frame read before the handshake is done (a MUNGE credential is ~200 bytes).
MAX_HANDSHAKE_FRAME_BYTES = 8 * 1024
MUNGE_TIMEOUT_S = 10.0


class RendezvousAuthError(SlurmSpotError):
    """The rendezvous service refused a client, or a client could not make its credential."""


class WireError(SlurmSpotError):
    """The peer sent something that is not a frame of this protocol, or closed the
    connection."""


class ClosedBeforeFrame(WireError):
    """The peer closed the connection without sending a byte of the frame awaited (a check
    that the port is open, such as a replica group's wait for the lighthouse's door)."""


def send_frame(sock: socket.socket, message: dict[str, Any]) -> None:
    """Send ``message`` as one frame.

    Raises:
        OSError: the connection failed.
    """
    body = json.dumps(message, separators=(",", ":")).encode()
    sock.sendall(struct.pack(">I", len(body)) + body)


def _recv_exactly(sock: socket.socket, size: int, deadline: float | None = None,
                  frame_start: bool = False) -> bytes:
    """``size`` bytes from ``sock``; with ``deadline`` (``time.monotonic()``), all of them by
    then (TimeoutError otherwise: a socket timeout bounds each ``recv`` only, so a client
    sending a byte now and then would hold the connection for ever). A close before the
    first byte where a frame starts (``frame_start``) is :class:`ClosedBeforeFrame`, a reset
    there too (a peer that closes with bytes of ours unread makes its kernel answer them with
    a reset, so a quick port check can end either way)."""
    chunks, left = [], size
    while left:
        if deadline is not None:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError("timed out")
            sock.settimeout(remaining)
        try:
            chunk = sock.recv(min(left, 1 << 20))
        except ConnectionResetError:  # closed with our hello unread: the kernel sent a reset
            if frame_start and left == size:
                raise ClosedBeforeFrame("connection reset") from None
            raise
        if not chunk:
            raise (ClosedBeforeFrame if frame_start and left == size else WireError)(
                "connection closed")
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


def recv_frame(sock: socket.socket, max_bytes: int = MAX_FRAME_BYTES,
               deadline: float | None = None) -> dict[str, Any]:
    """Read one frame (a JSON object of at most ``max_bytes`` bytes), whole by ``deadline``
    (``time.monotonic()``) when one is given.

    Raises:
        WireError: closed connection (:class:`ClosedBeforeFrame` before its first byte), a
            frame over ``max_bytes``, not a JSON object.
        OSError: the connection failed (``socket.timeout`` included; TimeoutError at
            ``deadline``).
    """
    (size,) = struct.unpack(">I", _recv_exactly(sock, 4, deadline, frame_start=True))
    if size > max_bytes:
        raise WireError(f"a frame of {size} bytes, over the limit of {max_bytes}")
    try:
        message = json.loads(_recv_exactly(sock, size, deadline))
    except (UnicodeDecodeError, ValueError):
        raise WireError("a frame that is not JSON") from None
    if not isinstance(message, dict):
        raise WireError("a frame that is not a JSON object")
    return message


def encode_bytes(value: bytes) -> str:
    """Bytes as they travel in a frame (base64)."""
    return base64.b64encode(value).decode()


def decode_bytes(text: object) -> bytes:
    """Inverse of :func:`encode_bytes`.

    Raises:
        WireError: not base64 text.
    """
    if not isinstance(text, str):
        raise WireError("expected base64 text")
    try:
        return base64.b64decode(text, validate=True)
    except ValueError:
        raise WireError("expected base64 text") from None


def credential_payload(nonce: str, job: str, protocol: str = PROTOCOL) -> bytes:
    """What a client's credential says: the protocol, the server's nonce, the job."""
    return f"{protocol} {nonce} {job}".encode()


def server_payload(client_nonce: str, job: str, protocol: str) -> bytes:
    """What a server's credential says when it proves itself (module docstring): the protocol,
    the client's nonce, the job; worded unlike :func:`credential_payload`, so that neither
    side's credential passes for the other's."""
    return f"{protocol} server {client_nonce} {job}".encode()


@dataclass(frozen=True)
class Credential:
    """A decoded credential: who made it (``uid``) and what it says (``payload``)."""

    uid: int
    payload: bytes


class Authenticator(Protocol):
    """Makes (client side) and checks (server side) credentials."""

    def make(self, payload: bytes) -> str:
        """A credential carrying ``payload``. Raises RendezvousAuthError when none can be
        made."""

    def check(self, credential: str) -> Credential:
        """The uid and payload of a valid ``credential``. Raises RendezvousAuthError when it
        is invalid, expired, replayed, or from another cluster."""


class MungeAuthenticator:
    """Credentials from the local munged (``munge``/``unmunge``; argv lists, a timeout)."""

    def __init__(self, munge: str = "munge", unmunge: str = "unmunge",
                 timeout_s: float = MUNGE_TIMEOUT_S) -> None:
        self.munge, self.unmunge, self.timeout_s = munge, unmunge, timeout_s

    def _run(self, argv: list[str], data: bytes) -> subprocess.CompletedProcess[bytes]:
        try:
            return subprocess.run(  # noqa: S603 - argv list
                argv, input=data, capture_output=True, timeout=self.timeout_s, check=False)
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise RendezvousAuthError(f"{argv[0]}: {exc}") from None

    def make(self, payload: bytes) -> str:
        """A MUNGE credential of this process's uid carrying ``payload``.

        Raises:
            RendezvousAuthError: ``munge`` is missing or munged does not answer."""
        done = self._run([self.munge], payload)
        if done.returncode != 0:
            raise RendezvousAuthError(f"munge failed: {done.stderr.decode().strip()}")
        return done.stdout.decode().strip()

    def check(self, credential: str) -> Credential:
        """Decode ``credential`` with ``unmunge`` (metadata keys STATUS and UID, written as
        ``UID: name (uid)``; the uid is the number in parentheses).

        Raises:
            RendezvousAuthError: unmunge refused it; the message carries MUNGE's reason
                ("Replayed credential", "Expired credential", "Failed to base64-decode
                credential", ...)."""
        done = self._run([self.unmunge, "-k", "STATUS,UID", "-m", "/dev/stderr"],
                         credential.encode())
        text = done.stderr.decode(errors="replace")
        fields = dict((key.strip(), value.strip()) for key, value in
                      (line.split(":", 1) for line in text.splitlines() if ":" in line))
        if done.returncode != 0:
            why = fields.get("STATUS") if "STATUS" in fields else text.strip()
            raise RendezvousAuthError(f"invalid credential: {why}")
        found = re.search(r"(?:^|\()(\d+)\)?$", fields.get("UID", ""))
        if not found:
            raise RendezvousAuthError("unmunge gave no uid")
        return Credential(int(found.group(1)), done.stdout)


#: ``admit(job, uid)`` returns when ``uid`` may use ``job`` and raises RendezvousAuthError
#: (or another SlurmSpotError, such as a failed squeue) naming why not.
Admit = Callable[[str, int], None]


def server_handshake(conn: socket.socket, authenticator: Authenticator, admit: Admit,
                     protocol: str = PROTOCOL, timeout_s: float | None = None,
                     prove: bool = False) -> tuple[str, int]:
    """The server's side of the handshake (module docstring): sends a fresh nonce, checks the
    client's credential (valid, made for this nonce and the job it names) and ``admit``.
    With ``timeout_s`` the client's frame must have come whole within that many seconds of
    the start (a slow drip of bytes does not hold a connection slot past it). With ``prove``
    the client must send a ``client_nonce`` and the acceptance carries this process's own
    credential for it (:func:`server_payload`).

    Returns:
        (job, uid): the job the client named and the uid its credential proved.

    Raises:
        RendezvousAuthError: the client is refused; it was sent ``{"ok": false, "error":
            "refused: <why>"}`` and the message says why.
        WireError: the client sent no frame of this protocol (garbage, closed connection).
        OSError: the connection failed (``socket.timeout`` included).
    """
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    nonce = secrets.token_hex(16)
    try:
        send_frame(conn, {"hello": protocol, "nonce": nonce})
    except (BrokenPipeError, ConnectionResetError):  # gone before our first word
        raise ClosedBeforeFrame("connection closed before the hello") from None
    reply = recv_frame(conn, MAX_HANDSHAKE_FRAME_BYTES, deadline)
    job, credential = reply.get("job"), reply.get("credential")
    client_nonce = reply.get("client_nonce")
    accepted: dict[str, Any] = {"ok": True}
    try:
        if not isinstance(job, str) or not job or not isinstance(credential, str):
            raise RendezvousAuthError("expected a job and a credential")
        decoded = authenticator.check(credential)
        if decoded.payload != credential_payload(nonce, job, protocol):
            raise RendezvousAuthError("the credential was not made for this connection "
                                      "and job")
        admit(job, decoded.uid)
        if prove:
            if not (isinstance(client_nonce, str) and 16 <= len(client_nonce) <= 64):
                raise RendezvousAuthError("expected a client_nonce (this server proves who "
                                          f"runs it; {protocol})")
            accepted["credential"] = authenticator.make(
                server_payload(str(client_nonce), job, protocol))
    except SlurmSpotError as exc:  # RendezvousAuthError, or squeue failed in admit
        send_frame(conn, {"ok": False, "error": f"refused: {exc}"})
        raise RendezvousAuthError(str(exc)) from None
    send_frame(conn, accepted)
    return job, decoded.uid


def client_handshake(sock: socket.socket, job: str, authenticator: Authenticator, where: str,
                     protocol: str = PROTOCOL, what: str = "rendezvous service",
                     server_uids: Collection[int] | None = None) -> None:
    """The client's side of the handshake: proves, with a fresh credential bound to the
    server's nonce and ``job``, that this process's uid may use ``job``.

    Args:
        where: ``HOST:PORT`` of the server, for messages.
        what: what the server is, for messages ("rendezvous service").
        server_uids: when given, the server must prove it runs as one of these uids (its
            credential for a fresh nonce of this client: :func:`server_payload`).

    Raises:
        WireError: the server does not speak ``protocol`` (it is some other service).
        RendezvousAuthError: no credential could be made (munged), or the server refused it
            (the message carries the server's reason).
        OSError: the connection failed (``socket.timeout`` included).
    """
    hello = recv_frame(sock, MAX_HANDSHAKE_FRAME_BYTES)
    nonce = hello.get("nonce")
    if hello.get("hello") != protocol or not isinstance(nonce, str):
        raise WireError(f"{where} is no slurm-spot {what}")
    request = {"job": job, "credential": authenticator.make(
        credential_payload(nonce, job, protocol))}
    client_nonce = secrets.token_hex(16)
    if server_uids is not None:
        request["client_nonce"] = client_nonce
    send_frame(sock, request)
    answer = recv_frame(sock, MAX_HANDSHAKE_FRAME_BYTES)
    if answer.get("ok") is not True:
        raise RendezvousAuthError(f"{what} {where}: {answer.get('error', 'refused')}")
    if server_uids is None:
        return
    proof = answer.get("credential")
    if not isinstance(proof, str):
        raise RendezvousAuthError(f"{what} {where} did not prove who runs it (no credential)")
    try:
        decoded = authenticator.check(proof)
    except RendezvousAuthError as exc:
        raise RendezvousAuthError(f"{what} {where} did not prove who runs it ({exc})") from None
    if decoded.payload != server_payload(client_nonce, job, protocol):
        raise RendezvousAuthError(f"{what} {where} did not prove who runs it (its credential "
                                  "was not made for this connection and job)")
    if decoded.uid not in server_uids:
        raise RendezvousAuthError(
            f"{what} {where} runs as uid {decoded.uid}, not as "
            f"{' or '.join(str(u) for u in sorted(set(server_uids)))}: another account's "
            "process holds that port")


#: Bytes read at once by :func:`relay`.
RELAY_CHUNK_BYTES = 256 * 1024


def relay(a: socket.socket, b: socket.socket) -> None:
    """Copy bytes both ways between two connected sockets until both directions have ended,
    then close both. An end of file is passed on as a half-close (``shutdown(SHUT_WR)``), so
    either side may finish sending first; an error on either side (a reset) ends both
    directions at once. Sets ``TCP_NODELAY`` where it applies (a relayed HTTP/2 frame is
    sent at once, not held back by Nagle's algorithm). Blocks the calling thread; the other
    direction runs in a thread of its own."""
    for sock in (a, b):
        sock.settimeout(None)
        if sock.family in (socket.AF_INET, socket.AF_INET6):
            try:
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            except OSError:
                pass

    def one_way(src: socket.socket, dst: socket.socket) -> None:
        try:
            while True:
                data = src.recv(RELAY_CHUNK_BYTES)
                if not data:
                    dst.shutdown(socket.SHUT_WR)
                    return
                dst.sendall(data)
        except OSError:
            for sock in (src, dst):  # wakes the other direction up
                try:
                    sock.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    back = threading.Thread(target=one_way, args=(b, a), daemon=True)
    back.start()
    one_way(a, b)
    back.join()
    a.close()
    b.close()
