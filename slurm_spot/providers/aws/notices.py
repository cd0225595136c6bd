"""AWS interruption notices from the instance metadata service (IMDSv2), standard library only.

Protocol (EC2 User Guide, "Use IMDSv2" and "Spot Instance interruption notices"):

- ``PUT /latest/api/token`` with ``X-aws-ec2-metadata-token-ttl-seconds: <1..21600>`` returns a
  session token; every ``GET`` carries it in ``X-aws-ec2-metadata-token``. An expired or unknown
  token gets ``401``: fetch a new token and ask again.
- ``GET /latest/meta-data/spot/instance-action``: ``404`` while there is no notice; ``200`` with
  ``{"action": "terminate"|"stop"|"hibernate", "time": "2026-03-01T08:22:00Z"}`` about two
  minutes before the instance goes.
- ``GET /latest/meta-data/events/recommendations/rebalance``: ``404``, or ``200`` with
  ``{"noticeTime": "..."}`` when the instance is at elevated risk.

Only a ``200`` body is ever parsed. Timeouts, refused connections and 5xx are "no notice yet"
(:meth:`ImdsNoticeSource.poll` never raises). The endpoint is the constructor's, else
``AWS_EC2_METADATA_SERVICE_ENDPOINT`` (what botocore honours too), else
``http://169.254.169.254``; proxies from the environment are never used for it.
"""

from __future__ import annotations

import http.client
import json
import logging
import os
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone

from slurm_spot.providers.notices import Notice

log = logging.getLogger(__name__)

DEFAULT_ENDPOINT = "http://169.254.169.254"
TOKEN_PATH = "/latest/api/token"
ACTION_PATH = "/latest/meta-data/spot/instance-action"
REBALANCE_PATH = "/latest/meta-data/events/recommendations/rebalance"
#: AWS announces an interruption two minutes ahead; used when a 200 body cannot be read.
NOTICE_LEAD_S = 120.0


class ImdsError(Exception):
    """The metadata service could not be reached or refused (internal; poll() never raises)."""


@dataclass(frozen=True)
class ImdsReply:
    """One HTTP answer: status code and body (text)."""

    status: int
    body: str


class ImdsClient:
    """A minimal IMDSv2 client: tokens (fetched on demand, renewed before expiry and on 401)
    and GETs of metadata paths.

    Args:
        endpoint: base URL; default as in the module docstring.
        token_ttl_s: lifetime asked for each token, seconds (1..21600).
        timeout_s: connect + read timeout of each request, seconds.
        clock: monotonic seconds, for token expiry.
    """

    def __init__(
        self,
        endpoint: str | None = None,
        *,
        token_ttl_s: int = 21600,
        timeout_s: float = 1.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        base = endpoint or os.environ.get("AWS_EC2_METADATA_SERVICE_ENDPOINT") or DEFAULT_ENDPOINT
        self.endpoint = base.rstrip("/")
        self.token_ttl_s = token_ttl_s
        self.timeout_s = timeout_s
        self._clock = clock
        self._token: str | None = None
        self._token_expires = 0.0
        self._opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))

    def get(self, path: str) -> ImdsReply:
        """GET ``path`` with a valid token; on 401 renews the token once and asks again.

        Raises:
            ImdsError: the service cannot be reached, or a token cannot be had.
        """
        reply = self._request("GET", path, {"X-aws-ec2-metadata-token": self._valid_token()})
        if reply.status == 401:
            self._token = None
            reply = self._request("GET", path, {"X-aws-ec2-metadata-token": self._valid_token()})
        return reply

    def get_text(self, path: str) -> str | None:
        """The body of ``path`` if the answer is 200, else None (other bodies are never read).

        Raises:
            ImdsError: see :meth:`get`.
        """
        reply = self.get(path)
        return reply.body if reply.status == 200 else None

    def _valid_token(self) -> str:
        """The current token, or a new one when there is none or it has under a tenth of its
        lifetime (at most 60 s) left."""
        margin = min(60.0, self.token_ttl_s / 10)
        if self._token is None or self._clock() >= self._token_expires - margin:
            started = self._clock()
            reply = self._request(
                "PUT", TOKEN_PATH, {"X-aws-ec2-metadata-token-ttl-seconds": str(self.token_ttl_s)}
            )
            if reply.status != 200 or not reply.body.strip():
                raise ImdsError(f"token request answered HTTP {reply.status}")
            self._token = reply.body.strip()
            self._token_expires = started + self.token_ttl_s
        return self._token

    def _request(self, method: str, path: str, headers: dict[str, str]) -> ImdsReply:
        request = urllib.request.Request(self.endpoint + path, method=method, headers=headers)
        try:
            with self._opener.open(request, timeout=self.timeout_s) as resp:
                return ImdsReply(resp.status, resp.read().decode("utf-8", "replace"))
        except urllib.error.HTTPError as exc:
            exc.close()
            return ImdsReply(exc.code, "")
        except (urllib.error.URLError, OSError, ValueError, http.client.HTTPException) as exc:
            raise ImdsError(f"{method} {path}: {exc}") from exc


class ImdsNoticeSource:
    """:class:`~slurm_spot.providers.notices.NoticeSource` for EC2 spot instances.

    :meth:`poll` returns the interruption notice while one is published (every poll, until the
    instance goes; the watcher acts once), else a ``kind="rebalance"`` notice while a rebalance
    recommendation is published and ``rebalance`` is on, else None.

    Args:
        endpoint: IMDS base URL (default as in the module docstring).
        interval_s: seconds between polls (AWS recommends every 5 s).
        rebalance: also read ``events/recommendations/rebalance``.
        client: an :class:`ImdsClient` to use instead of building one.
        now: wall clock for the fallback deadline (timezone-aware UTC).
    """

    name = "aws-imds"

    def __init__(
        self,
        endpoint: str | None = None,
        *,
        interval_s: float = 5.0,
        rebalance: bool = True,
        client: ImdsClient | None = None,
        now: Callable[[], datetime] = lambda: datetime.now(timezone.utc),
    ) -> None:
        self.client = client or ImdsClient(endpoint)
        #: Seconds between polls.
        self.interval_s = interval_s
        self.rebalance = rebalance
        self._now = now

    def poll(self) -> Notice | None:
        """The published notice, or None; never raises (an unreachable IMDS is "no notice")."""
        try:
            body = self.client.get_text(ACTION_PATH)
            if body is not None:
                return self._interruption(body)
            if self.rebalance:
                body = self.client.get_text(REBALANCE_PATH)
                if body is not None:
                    return self._rebalance(body)
        except ImdsError as exc:
            log.debug("IMDS not answering: %s", exc)
        return None

    def _interruption(self, body: str) -> Notice:
        try:
            data = json.loads(body)
            return Notice(str(data["action"]), parse_time(str(data["time"])), self.name)
        except (ValueError, KeyError, TypeError):
            # A 200 on instance-action means the instance is leaving, even if we cannot read how.
            log.warning("unreadable spot/instance-action body %r; assuming terminate", body[:200])
            deadline = self._now() + timedelta(seconds=NOTICE_LEAD_S)
            return Notice("terminate", deadline, self.name)

    def _rebalance(self, body: str) -> Notice:
        try:
            when = parse_time(str(json.loads(body)["noticeTime"]))
        except (ValueError, KeyError, TypeError):
            when = self._now()
        return Notice("rebalance", when, self.name, kind="rebalance")


def parse_time(text: str) -> datetime:
    """An IMDS timestamp (``2026-03-01T08:22:00Z``) as an aware UTC datetime.

    Raises:
        ValueError: not ISO 8601.
    """
    parsed = datetime.fromisoformat(text)  # Python 3.11 reads the final Z
    if parsed.tzinfo is None:
        parsed = parsed.replace(tzinfo=timezone.utc)
    return parsed.astimezone(timezone.utc)


@dataclass(frozen=True)
class InstanceIdentity:
    """Who this instance is: id, private IPv4, type and zone (empty when unknown)."""

    instance_id: str
    local_ipv4: str
    instance_type: str = ""
    zone: str = ""


def instance_identity(
    endpoint: str | None = None, client: ImdsClient | None = None
) -> InstanceIdentity:
    """This instance's identity from IMDS (``meta-data/instance-id``, ``local-ipv4``,
    ``instance-type``, ``placement/availability-zone``).

    Raises:
        ImdsError: IMDS cannot be reached or has no instance id.
    """
    client = client or ImdsClient(endpoint)
    values = {}
    for key in ("instance-id", "local-ipv4", "instance-type", "placement/availability-zone"):
        values[key] = (client.get_text(f"/latest/meta-data/{key}") or "").strip()
    if not values["instance-id"]:
        raise ImdsError("IMDS has no instance-id")
    return InstanceIdentity(
        values["instance-id"], values["local-ipv4"], values["instance-type"],
        values["placement/availability-zone"],
    )
