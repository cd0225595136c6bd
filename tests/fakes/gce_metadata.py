"""A fake GCE metadata server (``/computeMetadata/v1/...``) with ``wait_for_change``.

Serves on 127.0.0.1 (random port) from a thread; point clients at ``fake.host`` (the value
for ``GCE_METADATA_HOST``). Requests without ``Metadata-Flavor: Google`` get 403, as on GCE.

- :meth:`FakeMetadata.set` changes a value (``instance/preempted`` -> ``TRUE``) and wakes
  every request waiting for a change;
- ``?wait_for_change=true[&last_etag=E][&timeout_sec=N]`` blocks until the value's ETag
  differs from ``E`` (from the current one when no ``last_etag``) or ``N`` seconds pass;
- :meth:`FakeMetadata.respond` makes a path answer with a fixed status and body.
"""

from __future__ import annotations

import hashlib
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlparse

PREFIX = "/computeMetadata/v1/"


@dataclass
class FakeMetadata:
    """Metadata values by path (relative to ``/computeMetadata/v1/``)."""

    values: dict[str, str] = field(default_factory=lambda: {
        "instance/preempted": "FALSE", "instance/maintenance-event": "NONE",
        "instance/name": "demo-gpu-1"})
    overrides: dict[str, tuple[int, str]] = field(default_factory=dict)
    requests: list[tuple[str, dict[str, str]]] = field(default_factory=list)
    _changed: threading.Condition = field(default_factory=threading.Condition)
    _server: ThreadingHTTPServer | None = None
    _closing: bool = False

    def __enter__(self) -> FakeMetadata:
        handler = type("Handler", (_Handler,), {"fake": self})
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self._server.daemon_threads = True
        threading.Thread(target=self._server.serve_forever, args=(0.05,), daemon=True).start()
        return self

    def __exit__(self, *exc: object) -> None:
        assert self._server is not None
        with self._changed:
            self._closing = True
            self._changed.notify_all()
        self._server.shutdown()
        self._server.server_close()

    @property
    def host(self) -> str:
        """``127.0.0.1:PORT``."""
        assert self._server is not None
        return f"127.0.0.1:{self._server.server_address[1]}"

    def set(self, path: str, value: str) -> None:
        """Change ``path`` to ``value`` and wake the waiters."""
        with self._changed:
            self.values[path] = value
            self._changed.notify_all()

    def respond(self, path: str, status: int, body: str) -> None:
        """Answer ``path`` with ``status`` and ``body`` from now on (no waiting)."""
        self.overrides[path] = (status, body)

    @staticmethod
    def etag(value: str) -> str:
        return hashlib.sha1(value.encode()).hexdigest()[:16]

    def wait(self, path: str, last_etag: str | None, timeout_s: float) -> str | None:
        deadline = time.monotonic() + timeout_s
        with self._changed:
            current = self.values.get(path)
            last = last_etag or (self.etag(current) if current is not None else None)
            while True:
                current = self.values.get(path)
                if current is None or self.etag(current) != last:
                    return current
                remaining = deadline - time.monotonic()
                if remaining <= 0 or self._closing:
                    return current
                self._changed.wait(min(remaining, 0.5))


class _Handler(BaseHTTPRequestHandler):
    fake: FakeMetadata

    def log_message(self, *args: object) -> None:
        pass

    def do_GET(self) -> None:
        url = urlparse(self.path)
        query = {k: v[-1] for k, v in parse_qs(url.query).items()}
        path = url.path.removeprefix(PREFIX)
        self.fake.requests.append((path, query))
        if self.headers.get("Metadata-Flavor") != "Google":
            return self._send(403, "Missing Metadata-Flavor:Google header.")
        if path in self.fake.overrides:
            return self._send(*self.fake.overrides[path])
        if query.get("wait_for_change") == "true":
            timeout = float(query.get("timeout_sec") or 60)
            value = self.fake.wait(path, query.get("last_etag"), timeout)
        else:
            value = self.fake.values.get(path)
        if value is None:
            return self._send(404, "<html><body>404 - Not Found</body></html>")
        self._send(200, value, self.fake.etag(value))

    def _send(self, status: int, body: str, etag: str | None = None) -> None:
        data = body.encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/text")
        self.send_header("Metadata-Flavor", "Google")
        if etag:
            self.send_header("ETag", etag)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)
