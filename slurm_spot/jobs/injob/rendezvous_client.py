"""The client of ``slurm-spot rendezvous``: a ``torch.distributed.Store`` whose keys live in
the service, in the key space of one job, reached after a MUNGE handshake
(:mod:`slurm_spot.jobs.rendezvous_wire`), and the torchrun rendezvous backend ``slurm-spot`` built on it
(torchrun's own c10d backend, with this store in place of a TCPStore).
"""

from __future__ import annotations

import socket
import threading
import time
from datetime import timedelta
from typing import Any

import torch.distributed as dist

from slurm_spot.jobs.rendezvous_wire import (
    Authenticator,
    MungeAuthenticator,
    WireError,
    client_handshake,
    decode_bytes,
    encode_bytes,
    recv_frame,
    send_frame,
)

#: The name torchrun knows the backend by (``--rdzv-backend``).
BACKEND = "slurm-spot"
CONNECT_TIMEOUT_S = 30.0
POLL_INTERVAL_S = 0.05


class RendezvousStoreError(RuntimeError):
    """The service refused a request (a limit, a bad request); the message says which."""


def _as_bytes(value: str | bytes) -> bytes:
    return value.encode() if isinstance(value, str) else bytes(value)


class RendezvousStore(dist.Store):
    """Job ``job``'s keys in the service at ``host:port``.

    Connects (and authenticates) on first use and again after a lost connection.

    Raises (from each operation):
        RendezvousAuthError: the service refused the handshake (not the job's owner, bad
            credential).
        RendezvousStoreError: the service refused the request (over a limit, ...).
        torch.distributed.DistStoreError: ``get``/``wait`` timed out.
        OSError: the service cannot be reached.
    """

    def __init__(self, host: str, port: int, job: str,
                 authenticator: Authenticator | None = None,
                 timeout: timedelta = timedelta(seconds=CONNECT_TIMEOUT_S)) -> None:
        super().__init__()
        self.host, self.port, self.job = host, port, job
        self.authenticator = authenticator or MungeAuthenticator()
        self.set_timeout(timeout)
        self._sock: socket.socket | None = None
        self._lock = threading.Lock()

    def _connect(self) -> socket.socket:
        sock = socket.create_connection((self.host, self.port), timeout=CONNECT_TIMEOUT_S)
        try:
            client_handshake(sock, self.job, self.authenticator, f"{self.host}:{self.port}")
            sock.settimeout(None)
            return sock
        except BaseException:
            sock.close()
            raise

    def request(self, op: str, **args: Any) -> Any:
        """One request on the job's keys; returns the answer's value (one reconnect on a
        lost connection).

        Raises:
            KeyError: ``get`` of a missing key. See the class for the others."""
        with self._lock:
            for attempt in (1, 2):
                if self._sock is None:
                    self._sock = self._connect()
                try:
                    send_frame(self._sock, {"op": op, **args})
                    answer = recv_frame(self._sock)
                    break
                except (OSError, WireError):
                    self._sock.close()
                    self._sock = None
                    if attempt == 2:
                        raise
        if answer.get("ok") is True:
            return answer.get("value")
        if answer.get("kind") == "missing":
            raise KeyError(args.get("key"))
        raise RendezvousStoreError(f"rendezvous service: {answer.get('error')}")

    # -- torch.distributed.Store -----------------------------------------------------------
    def set(self, key: str, value: str | bytes) -> None:
        self.request("set", key=key, value=encode_bytes(_as_bytes(value)))

    def get(self, key: str) -> bytes:
        self.wait([key])
        return decode_bytes(self.request("get", key=key))

    def add(self, key: str, amount: int) -> int:
        return int(self.request("add", key=key, amount=int(amount)))

    def compare_set(self, key: str, expected: str | bytes, desired: str | bytes) -> bytes:
        return decode_bytes(self.request("compare_set", key=key,
                                         expected=encode_bytes(_as_bytes(expected)),
                                         desired=encode_bytes(_as_bytes(desired))))

    def check(self, keys: list[str]) -> bool:
        return bool(self.request("check", keys=list(keys)))

    def delete_key(self, key: str) -> bool:
        return bool(self.request("delete", key=key))

    def num_keys(self) -> int:
        return int(self.request("num_keys"))

    def wait(self, keys: list[str], timeout: timedelta | None = None) -> None:
        limit = (timeout or self.timeout).total_seconds()  # type: ignore[attr-defined]
        deadline = time.monotonic() + limit
        while not self.check(keys):
            if time.monotonic() >= deadline:
                raise dist.DistStoreError(f"wait for {keys} timed out after {limit:.0f} s")
            time.sleep(POLL_INTERVAL_S)


def job_of_run(run_id: str) -> str:
    """The job of a rendezvous id ``<job>-<restart count>`` (``11_1-0`` -> ``11_1``)."""
    return run_id.rsplit("-", 1)[0] if "-" in run_id else run_id


def create_handler(params: Any) -> Any:
    """torchrun's rendezvous handler for ``--rdzv-backend=slurm-spot``: torch's dynamic
    rendezvous and c10d backend on a :class:`RendezvousStore` of the run's job.

    Raises:
        BadInputError: a malformed ``--rdzv-endpoint``."""
    from torch.distributed.elastic.rendezvous.c10d_rendezvous_backend import (
        C10dRendezvousBackend,
    )
    from torch.distributed.elastic.rendezvous.dynamic_rendezvous import (
        create_handler as dynamic_handler,
    )

    from slurm_spot.jobs.services.rendezvous import parse_endpoint

    host, port = parse_endpoint(params.endpoint, "--rdzv-endpoint")
    timeout = timedelta(seconds=float(params.get("read_timeout", CONNECT_TIMEOUT_S)))
    store = RendezvousStore(host, port, job_of_run(params.run_id), timeout=timeout)
    class Backend(C10dRendezvousBackend):
        """torch's c10d backend under this backend's name (torchrun checks the name)."""

        @property
        def name(self) -> str:
            return BACKEND

    backend = Backend(store, params.run_id)
    return dynamic_handler(store, backend, params)


def register_backend() -> None:
    """Make ``--rdzv-backend=slurm-spot`` known to torchrun in this process."""
    from torch.distributed.elastic.rendezvous.registry import handler_registry

    try:
        handler_registry.register(BACKEND, create_handler)
    except ValueError:
        pass  # already registered (a second torchrun run in this process)
