"""The store behind ``slurm-spot rendezvous``: one key space per job, reached only by the
job's owner (a MUNGE-authenticated handshake, :mod:`.rendezvous_wire`), bounded in keys and
bytes per job.

It answers what torchrun's c10d rendezvous backend and elastic agent ask of a
``torch.distributed.Store`` (set, get, add, compare_set, check, delete, num_keys), with
TCPStore's meaning; the client side is :class:`slurm_spot.jobs.injob.rendezvous_client.RendezvousStore`.
One thread per connection; a connection that has not finished its handshake within
:data:`HANDSHAKE_TIMEOUT_S` is closed, and at most :data:`MAX_CONNECTIONS` are open at once.
"""

from __future__ import annotations

import logging
import socket
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from slurm_spot.jobs.rendezvous_wire import (
    Authenticator,
    RendezvousAuthError,
    WireError,
    decode_bytes,
    encode_bytes,
    recv_frame,
    send_frame,
    server_handshake,
)
from slurm_spot.jobs.services.accept_loop import AcceptLoop

log = logging.getLogger(__name__)

HANDSHAKE_TIMEOUT_S = 10.0
MAX_CONNECTIONS = 1024


@dataclass(frozen=True)
class StoreLimits:
    """What one job may keep: ``max_keys`` keys, ``max_value_bytes`` per value,
    ``max_key_bytes`` per key, ``max_job_bytes`` for keys and values together. A rendezvous
    of a few hundred nodes keeps tens of keys and well under 1 MiB."""

    max_keys: int = 4096
    max_key_bytes: int = 1024
    max_value_bytes: int = 1024 * 1024
    max_job_bytes: int = 16 * 1024 * 1024


class LimitExceeded(ValueError):
    """A write would take a job's key space over its :class:`StoreLimits`."""


@dataclass
class JobKeys:
    """One job's keys and the bytes they take (keys + values)."""

    values: dict[str, bytes] = field(default_factory=dict)
    size_bytes: int = 0


class KeySpaces:
    """Every job's keys, each bounded by ``limits``; thread-safe."""

    def __init__(self, limits: StoreLimits) -> None:
        self.limits = limits
        self._jobs: dict[str, JobKeys] = {}
        self._lock = threading.Lock()

    def _put(self, job: str, key: str, value: bytes) -> None:
        space = self._jobs.setdefault(job, JobKeys())
        key_bytes = len(key.encode())
        if key_bytes > self.limits.max_key_bytes:
            raise LimitExceeded(f"job {job}: a key of {key_bytes} bytes, over the limit of "
                                f"{self.limits.max_key_bytes}")
        if len(value) > self.limits.max_value_bytes:
            raise LimitExceeded(f"job {job}: a value of {len(value)} bytes for {key!r}, over "
                                f"the limit of {self.limits.max_value_bytes}")
        old = space.values.get(key)
        if old is None and len(space.values) >= self.limits.max_keys:
            raise LimitExceeded(f"job {job}: {len(space.values) + 1} keys, over the limit of "
                                f"{self.limits.max_keys}")
        size = space.size_bytes + len(value) - (len(old) if old is not None
                                                else -key_bytes)
        if size > self.limits.max_job_bytes:
            raise LimitExceeded(f"job {job}: {size} bytes of keys and values, over the "
                                f"limit of {self.limits.max_job_bytes}")
        space.values[key] = value
        space.size_bytes = size

    def apply(self, job: str, request: dict[str, Any]) -> Any:
        """Carry out one request on ``job``'s keys; returns the answer's ``value``.

        Raises:
            LimitExceeded: the write would go over the limits (nothing is changed).
            KeyError: ``get`` of a missing key.
            WireError: an unknown operation or malformed arguments.
        """
        op = request.get("op")
        with self._lock:
            values = self._jobs.get(job, JobKeys()).values
            if op == "set":
                self._put(job, _key(request), decode_bytes(request.get("value")))
                return None
            if op == "get":
                return encode_bytes(values[_key(request)])
            if op == "add":
                amount = request.get("amount")
                if not isinstance(amount, int):
                    raise WireError("add: amount must be an integer")
                total = int(values.get(_key(request), b"0")) + amount
                self._put(job, _key(request), str(total).encode())
                return total
            if op == "compare_set":
                key = _key(request)
                expected = decode_bytes(request.get("expected"))
                desired = decode_bytes(request.get("desired"))
                current = values.get(key)
                if (current is None and expected == b"") or current == expected:
                    self._put(job, key, desired)
                    return encode_bytes(desired)
                return encode_bytes(current if current is not None else expected)
            if op == "check":
                keys = request.get("keys")
                if not isinstance(keys, list) or not all(isinstance(k, str) for k in keys):
                    raise WireError("check: keys must be a list of strings")
                return all(k in values for k in keys)
            if op == "delete":
                key = _key(request)
                space = self._jobs.get(job)
                if space is None or key not in space.values:
                    return False
                space.size_bytes -= len(key.encode()) + len(space.values.pop(key))
                return True
            if op == "num_keys":
                return len(values)
        raise WireError(f"unknown operation {op!r}")

    def jobs(self) -> list[str]:
        """The jobs that have keys here."""
        with self._lock:
            return list(self._jobs)

    def drop(self, job: str) -> None:
        """Forget ``job``'s keys (it ended)."""
        with self._lock:
            self._jobs.pop(job, None)


def _key(request: dict[str, Any]) -> str:
    key = request.get("key")
    if not isinstance(key, str):
        raise WireError("key must be a string")
    return key


#: ``job`` -> the uid that owns it in Slurm, None when Slurm does not know the job.
OwnerLookup = Callable[[str], "int | None"]


class RendezvousServer(AcceptLoop):
    """Serves :class:`KeySpaces` on a listening socket to authenticated job owners.

    Args:
        sock: a bound, listening TCP socket (:func:`slurm_spot.jobs.services.rendezvous.listen_socket`).
        authenticator: checks the clients' credentials (MUNGE in production).
        owner_of: the uid owning a job (squeue), None for a job Slurm does not know.
        limits: per-job bounds.
    """

    def __init__(self, sock: socket.socket, authenticator: Authenticator,
                 owner_of: OwnerLookup, limits: StoreLimits | None = None) -> None:
        super().__init__(sock, MAX_CONNECTIONS)  # beyond: refused rather than queued
        self.authenticator = authenticator
        self.owner_of = owner_of
        self.keys = KeySpaces(limits or StoreLimits())

    @property
    def port(self) -> int:
        """The port the server listens on."""
        return int(self.sock.getsockname()[1])

    def drop_ended_jobs(self) -> list[str]:
        """Forget the keys of jobs Slurm no longer knows; returns them."""
        ended = [job for job in self.keys.jobs() if self.owner_of(job) is None]
        for job in ended:
            self.keys.drop(job)
        return ended

    def serve_connection(self, conn: socket.socket, peer: object) -> None:
        try:
            with conn:
                conn.settimeout(HANDSHAKE_TIMEOUT_S)
                job = self._handshake(conn)
                if job is None:
                    return
                conn.settimeout(None)
                while True:
                    request = recv_frame(conn)
                    send_frame(conn, self._answer(job, request))
        except (OSError, WireError):
            pass

    def _handshake(self, conn: socket.socket) -> str | None:
        """The job the client proved it owns, or None (it was told why, and is dropped)."""
        def admit(job: str, uid: int) -> None:
            owner = self.owner_of(job)  # SlurmSpotError when squeue fails: refused
            if owner is None or owner != uid:
                raise RendezvousAuthError(f"uid {uid} does not own job {job}")

        try:
            job, _uid = server_handshake(conn, self.authenticator, admit,
                                         timeout_s=HANDSHAKE_TIMEOUT_S)
        except RendezvousAuthError as exc:
            log.warning("slurm-spot rendezvous: refused a client: %s", exc)
            return None
        return job

    def _answer(self, job: str, request: dict[str, Any]) -> dict[str, Any]:
        try:
            return {"ok": True, "value": self.keys.apply(job, request)}
        except LimitExceeded as exc:
            return {"ok": False, "error": str(exc), "kind": "limit"}
        except KeyError:
            return {"ok": False, "error": "no such key", "kind": "missing"}
        except (WireError, ValueError) as exc:
            return {"ok": False, "error": str(exc), "kind": "bad_request"}
