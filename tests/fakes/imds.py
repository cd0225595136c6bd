"""A small fake of the EC2 instance metadata service, version 2 (tokens required).

Serves on 127.0.0.1 (random port) from a thread; point a client at ``fake.url`` (or set
``AWS_EC2_METADATA_SERVICE_ENDPOINT`` to it).

- ``PUT /latest/api/token`` with ``X-aws-ec2-metadata-token-ttl-seconds`` (1..21600) returns a
  token; without the header or out of range: 400.
- Every ``GET`` needs a live token in ``X-aws-ec2-metadata-token``: missing, unknown or expired
  is 401 (IMDSv2 only, like an instance with ``HttpTokens=required``).
- ``GET`` of a path set with :meth:`FakeImds.set` answers that status and body; any other path
  is 404 with the HTML body the real service sends.

:meth:`FakeImds.expire_tokens` invalidates every token handed out (the next GET is 401);
:attr:`FakeImds.log` records ``(method, path, status)`` of every request.
"""

from __future__ import annotations

import secrets
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import TracebackType

NOT_FOUND_BODY = (
    '<?xml version="1.0" encoding="iso-8859-1"?>\n'
    "<html><head><title>404 - Not Found</title></head>"
    "<body><h1>404 - Not Found</h1></body></html>\n"
)
ACTION = "/latest/meta-data/spot/instance-action"
REBALANCE = "/latest/meta-data/events/recommendations/rebalance"


class FakeImds:
    """The fake service; use as a context manager or call :meth:`start` / :meth:`stop`."""

    def __init__(self, instance_id: str = "i-0123456789abcdef0", local_ipv4: str = "10.0.3.7"):
        self.lock = threading.Lock()
        self.tokens: dict[str, float] = {}  # token -> monotonic expiry
        self.log: list[tuple[str, str, int]] = []
        self.paths: dict[str, tuple[int, str]] = {
            "/latest/meta-data/instance-id": (200, instance_id),
            "/latest/meta-data/local-ipv4": (200, local_ipv4),
            "/latest/meta-data/instance-type": (200, "g5.xlarge"),
            "/latest/meta-data/placement/availability-zone": (200, "us-east-1a"),
        }
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    # ---- control from the test ----------------------------------------------------------
    def set(self, path: str, status: int, body: str = "") -> None:
        """Answer GET ``path`` with ``status`` and ``body`` from now on."""
        with self.lock:
            self.paths[path] = (status, body)

    def clear(self, path: str) -> None:
        """GET ``path`` is 404 again."""
        with self.lock:
            self.paths.pop(path, None)

    def set_instance_action(self, status: int, body: str = "") -> None:
        """Publish (or answer oddly on) ``spot/instance-action``."""
        self.set(ACTION, status, body)

    def set_rebalance(self, status: int, body: str = "") -> None:
        """Publish (or answer oddly on) ``events/recommendations/rebalance``."""
        self.set(REBALANCE, status, body)

    def expire_tokens(self) -> None:
        """Every token handed out so far is invalid from now on."""
        with self.lock:
            self.tokens.clear()

    def count(self, method: str, path: str | None = None, status: int | None = None) -> int:
        """How many requests matched."""
        with self.lock:
            return sum(
                1 for m, p, s in self.log
                if m == method and path in (None, p) and status in (None, s)
            )

    @property
    def url(self) -> str:
        """``http://127.0.0.1:<port>``."""
        assert self._server is not None, "not started"
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    # ---- life cycle ---------------------------------------------------------------------
    def start(self) -> FakeImds:
        """Start serving in a daemon thread."""
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def do_PUT(self) -> None:
                fake._put(self)

            def do_GET(self) -> None:
                fake._get(self)

            def log_message(self, *args: object) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._thread = threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop serving."""
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    def __enter__(self) -> FakeImds:
        return self.start()

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()

    # ---- the service --------------------------------------------------------------------
    def _put(self, handler: BaseHTTPRequestHandler) -> None:
        if handler.path != "/latest/api/token":
            return self._answer(handler, "PUT", 404, NOT_FOUND_BODY)
        ttl = handler.headers.get("X-aws-ec2-metadata-token-ttl-seconds", "")
        if not ttl.isdigit() or not 1 <= int(ttl) <= 21600:
            return self._answer(handler, "PUT", 400, "")
        token = secrets.token_urlsafe(24)
        with self.lock:
            self.tokens[token] = time.monotonic() + int(ttl)
        return self._answer(handler, "PUT", 200, token)

    def _get(self, handler: BaseHTTPRequestHandler) -> None:
        token = handler.headers.get("X-aws-ec2-metadata-token", "")
        with self.lock:
            valid = self.tokens.get(token, 0.0) > time.monotonic()
            status, body = self.paths.get(handler.path, (404, NOT_FOUND_BODY))
        if not valid:
            status, body = 401, ""
        return self._answer(handler, "GET", status, body)

    def _answer(self, handler: BaseHTTPRequestHandler, method: str, status: int, body: str) -> None:
        data = body.encode()
        with self.lock:
            self.log.append((method, handler.path, status))
        handler.send_response(status)
        handler.send_header("Content-Type", "text/plain" if status == 200 else "text/html")
        handler.send_header("Content-Length", str(len(data)))
        handler.end_headers()
        handler.wfile.write(data)
