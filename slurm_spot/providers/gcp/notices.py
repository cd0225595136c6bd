"""Interruption notices of a Compute Engine VM, from its metadata server (standard library).

GCE metadata reference ("Instance metadata", "Detect whether a VM was preempted", "Host
maintenance notifications"):

- ``GET /computeMetadata/v1/instance/preempted`` with header ``Metadata-Flavor: Google``
  returns ``TRUE`` once the VM is being preempted (Spot VMs get ~30 s);
  ``?wait_for_change=true&last_etag=E&timeout_sec=N`` blocks until the value differs from the
  one whose ``ETag`` was ``E`` (at once if it already does) or ``N`` seconds pass;
- ``GET /computeMetadata/v1/instance/maintenance-event`` returns ``NONE`` or, ahead of host
  maintenance, ``TERMINATE_ON_HOST_MAINTENANCE`` (VMs that cannot migrate: Spot, GPUs) or
  ``MIGRATE_ON_HOST_MAINTENANCE`` (not a notice: the VM stays).

The host is ``GCE_METADATA_HOST`` (as google-auth reads it) or ``metadata.google.internal``.
"""

from __future__ import annotations

import logging
import os
import urllib.error
import urllib.request
from collections.abc import Callable
from datetime import datetime, timedelta, timezone
from urllib.parse import urlencode

from slurm_spot.providers.notices import Notice

log = logging.getLogger(__name__)

DEFAULT_HOST = "metadata.google.internal"
PREEMPT_NOTICE_S = 30.0
MAINTENANCE_NOTICE_S = 60.0
TERMINATE_EVENTS = ("TERMINATE_ON_HOST_MAINTENANCE",)


class GceMetadataNoticeSource:
    """Polls ``instance/preempted`` (blocking with ``wait_for_change``) and
    ``instance/maintenance-event`` of this VM.

    Args:
        host: ``host[:port]`` of the metadata server; default ``$GCE_METADATA_HOST`` or
            ``metadata.google.internal``.
        wait_s: longest a poll blocks waiting for a change, seconds (the server's
            ``timeout_sec``); a maintenance event is seen within this time.
        error_backoff_s: :attr:`interval_s` after a failed poll, seconds.
        now: the clock (aware UTC), for deadlines.
    """

    name = "gce-metadata"

    def __init__(self, host: str | None = None, wait_s: int = 10, error_backoff_s: float = 1.0,
                 now: Callable[[], datetime] | None = None) -> None:
        self.host = host or os.environ.get("GCE_METADATA_HOST") or DEFAULT_HOST
        self.wait_s = max(1, int(wait_s))
        self.error_backoff_s = error_backoff_s
        self._now = now or (lambda: datetime.now(timezone.utc))
        self._etag: str | None = None
        self._failed = False

    @property
    def interval_s(self) -> float:
        """0 while polls block on the server; ``error_backoff_s`` after a failed poll."""
        return self.error_backoff_s if self._failed else 0.0

    def poll(self) -> Notice | None:
        """A notice if the VM is being preempted or faces terminating host maintenance, else
        None. Blocks up to ``wait_s`` (+5 s) seconds; never raises for an unreachable server,
        a timeout, a 404 or a 5xx (that is "no notice yet")."""
        event = self._get("instance/maintenance-event", {}, timeout_s=5.0)
        if event is not None and event[0].strip() in TERMINATE_EVENTS:
            return self._notice("maintenance", MAINTENANCE_NOTICE_S)
        query: dict[str, str] = {}
        if self._etag:
            query = {"wait_for_change": "true", "last_etag": self._etag,
                     "timeout_sec": str(self.wait_s)}
        got = self._get("instance/preempted", query, timeout_s=self.wait_s + 5.0)
        if got is None:
            return None
        value, etag = got
        self._etag = etag or None
        if value.strip().upper() == "TRUE":
            return self._notice("preempt", PREEMPT_NOTICE_S)
        return None

    def _notice(self, action: str, lead_s: float) -> Notice:
        deadline = self._now() + timedelta(seconds=lead_s)
        return Notice(action=action, deadline=deadline, source=self.name)

    def _get(self, path: str, query: dict[str, str], timeout_s: float) -> tuple[str, str] | None:
        url = f"http://{self.host}/computeMetadata/v1/{path}"
        if query:
            url += "?" + urlencode(query)
        request = urllib.request.Request(url, headers={"Metadata-Flavor": "Google"})
        try:
            with urllib.request.urlopen(request, timeout=timeout_s) as response:
                body = response.read(4096).decode("utf-8", "replace")
                self._failed = False
                return body, response.headers.get("ETag", "")
        except urllib.error.HTTPError as exc:
            self._failed = exc.code != 404
            if exc.code != 404:
                log.debug("metadata %s: HTTP %s", path, exc.code)
        except (urllib.error.URLError, OSError, TimeoutError) as exc:
            self._failed = True
            log.debug("metadata %s unreachable: %s", path, exc)
        return None


def instance_identity(host: str | None = None, timeout_s: float = 5.0) -> tuple[str, str]:
    """``(instance name, machine type)`` of this VM from the metadata server
    (``instance/name``; ``instance/machine-type``, ``projects/<n>/machineTypes/<type>``,
    shortened to ``<type>``). The host is ``host``, ``$GCE_METADATA_HOST`` or
    ``metadata.google.internal``.

    Raises:
        ProviderError: the metadata server cannot be reached or has no instance name.
    """
    from slurm_spot.errors import ProviderError

    base = f"http://{host or os.environ.get('GCE_METADATA_HOST') or DEFAULT_HOST}"
    values = []
    for path in ("instance/name", "instance/machine-type"):
        request = urllib.request.Request(f"{base}/computeMetadata/v1/{path}",
                                         headers={"Metadata-Flavor": "Google"})
        try:
            with urllib.request.urlopen(request, timeout=timeout_s) as response:
                values.append(response.read(4096).decode("utf-8", "replace").strip())
        except urllib.error.HTTPError as exc:
            if exc.code != 404:
                raise ProviderError("METADATA_UNREADABLE", f"{path}: HTTP {exc.code}") from None
            values.append("")
        except (urllib.error.URLError, OSError, TimeoutError) as exc:
            raise ProviderError("METADATA_UNREACHABLE", f"{base}: {exc}") from None
    if not values[0]:
        raise ProviderError("METADATA_UNREADABLE", "the metadata server has no instance/name")
    return values[0], values[1].rsplit("/", 1)[-1]
