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
"""

from __future__ import annotations

import base64
import json
import socket
import struct
import subprocess
from dataclasses import dataclass
from typing import Any, Protocol

from slurm_spot.errors import SlurmSpotError

PROTOCOL = "slurm-spot-rendezvous/1"
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


def send_frame(sock: socket.socket, message: dict[str, Any]) -> None:
    """Send ``message`` as one frame.

    Raises:
        OSError: the connection failed.
    """
    body = json.dumps(message, separators=(",", ":")).encode()
    sock.sendall(struct.pack(">I", len(body)) + body)


def _recv_exactly(sock: socket.socket, size: int) -> bytes:
    chunks, left = [], size
    while left:
        chunk = sock.recv(min(left, 1 << 20))
        if not chunk:
            raise WireError("connection closed")
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


def recv_frame(sock: socket.socket, max_bytes: int = MAX_FRAME_BYTES) -> dict[str, Any]:
    """Read one frame (a JSON object of at most ``max_bytes`` bytes).

    Raises:
        WireError: closed connection, a frame over ``max_bytes``, not a JSON object.
        OSError: the connection failed (``socket.timeout`` included).
    """
    (size,) = struct.unpack(">I", _recv_exactly(sock, 4))
    if size > max_bytes:
        raise WireError(f"a frame of {size} bytes, over the limit of {max_bytes}")
    try:
        message = json.loads(_recv_exactly(sock, size))
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


def credential_payload(nonce: str, job: str) -> bytes:
    """What a client's credential says: this protocol, the server's nonce, the job."""
    return f"{PROTOCOL} {nonce} {job}".encode()


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
        """Decode ``credential`` with ``unmunge`` (``-N``: numeric uid).

        Raises:
            RendezvousAuthError: unmunge refused it (invalid, expired, replayed, ...)."""
        done = self._run([self.unmunge, "-N", "-k", "UID", "-m", "/dev/stderr"],
                         credential.encode())
        if done.returncode != 0:
            raise RendezvousAuthError("invalid credential: "
                                      f"{done.stderr.decode(errors='replace').strip()}")
        fields = dict(line.split(":", 1) for line in done.stderr.decode().splitlines()
                      if ":" in line)
        uid_text = fields.get("UID", "").strip()
        if not uid_text.isdigit():
            raise RendezvousAuthError("unmunge gave no uid")
        return Credential(int(uid_text), done.stdout)
