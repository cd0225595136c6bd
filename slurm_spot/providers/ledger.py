"""Launch tokens whose request got an answer: the memory that lets idempotency tokens be stable.

A launch's idempotency token (EC2 CreateFleet ``ClientToken``; EC2 API reference, "Ensuring
idempotency") is derived from what is launched, never from the time, so a hook killed
mid-launch is adopted by any later run: EC2 answers the repeated token with the first call's
instances. A token whose call *was answered* (instances placed, or an error such as no
capacity) must not be sent again, or EC2 would repeat that old answer; this ledger remembers
those tokens, and the launcher then moves to the token's next generation.

The ledger is one small JSON file (``{token: ISO time}``) under the state dir, changed under
an exclusive ``flock`` and replaced atomically; entries older than :data:`KEEP_S` are dropped
(EC2 keeps a token at least 24 hours after the instances it launched end). A ledger that
cannot be read or written degrades to "nothing finished" (logged): a token is then reused,
which at worst repeats an old answer once, never launches twice.
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
from collections.abc import Callable, Iterable
from datetime import datetime, timedelta, timezone
from pathlib import Path

KEEP_S = 7 * 86400
log = logging.getLogger(__name__)


def _load_json(path: Path, otherwise: str) -> object:
    """The JSON document in ``path``; None when the file is missing, or unreadable or not
    JSON (then logged as a warning ending with ``otherwise``: what the caller does instead)."""
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        log.warning("%s unreadable (%s); %s", path, exc, otherwise)
        return None


def _replace_json(path: Path, build: Callable[[], object]) -> None:
    """Rewrite ``path`` with the JSON of ``build()``, called under an exclusive ``flock`` of
    ``<path>.lock`` (so concurrent hooks never lose each other's entries) and written to a
    temporary file that replaces ``path`` atomically.

    Raises:
        OSError: the directory, the lock or the file cannot be written.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path.with_suffix(".lock"), "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        tmp = path.with_suffix(f".tmp{os.getpid()}")
        tmp.write_text(json.dumps(build(), sort_keys=True))
        os.replace(tmp, path)


class TokenLedger:
    """Finished launch tokens of one provider, in ``path`` (created on first write)."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def _read(self) -> dict[str, str]:
        data = _load_json(self.path, "starting afresh")
        return {str(k): str(v) for k, v in data.items()} if isinstance(data, dict) else {}

    def finished(self, token: str) -> bool:
        """True if a call with ``token`` was answered before."""
        return token in self._read()

    def finish(self, tokens: Iterable[str], now: datetime | None = None) -> None:
        """Record ``tokens`` as answered (and forget entries older than :data:`KEEP_S`)."""
        tokens = list(tokens)
        if not tokens:
            return
        now = now or datetime.now(timezone.utc)
        oldest = (now - timedelta(seconds=KEEP_S)).isoformat()
        stamp = now.isoformat()

        def build() -> dict[str, str]:
            data = {k: v for k, v in self._read().items() if v >= oldest}
            data.update(dict.fromkeys(tokens, stamp))
            return data

        try:
            _replace_json(self.path, build)
        except OSError as exc:
            log.warning("cannot record launch tokens in %s: %s", self.path, exc)


class UnofferedPairs:
    """(instance type, zone) pairs a provider answered with a permanent error (EC2
    ``Unsupported``; GCE ``invalid``/``notFound`` on a zone's machine or accelerator type: the
    type is not offered in that zone), in ``path``; never tried again.

    Kept until the file is removed (the offering changes rarely; ``rm`` the file to retry).
    Unreadable or unwritable: logged, and treated as empty (the pair is tried and fails again).
    """

    def __init__(self, path: Path) -> None:
        self.path = path

    def pairs(self) -> frozenset[tuple[str, str]]:
        """Every remembered ``(instance type, zone)``."""
        data = _load_json(self.path, "trying every pair")
        if not isinstance(data, list):
            return frozenset()
        return frozenset((str(p[0]), str(p[1])) for p in data
                         if isinstance(p, list) and len(p) == 2)

    def remember(self, pairs: Iterable[tuple[str, str]]) -> None:
        """Add ``pairs`` (under an exclusive flock, replaced atomically)."""
        new = set(pairs)
        if not new:
            return
        try:
            _replace_json(self.path, lambda: [list(p) for p in sorted(self.pairs() | new)])
        except OSError as exc:
            log.warning("cannot remember %s in %s: %s", sorted(new), self.path, exc)


class PoolCooldowns:
    """Pools (``<instance type>/<zone>/<market>``) that answered "no capacity", each with the
    end of its cooldown, in ``path`` (JSON ``{pool: ISO 8601 end}``); a launch that chooses its
    own pool order skips them until then (:mod:`slurm_spot.providers.pool_order`).

    Changed under an exclusive ``flock`` and replaced atomically; expired entries are dropped
    on each write. Unreadable or unwritable: logged and treated as empty (the pool is asked
    again, which costs one fast-failing call, never a wrong launch).
    """

    def __init__(self, path: Path) -> None:
        self.path = path

    def _read(self) -> dict[str, datetime]:
        data = _load_json(self.path, "no pool is cooling down")
        found: dict[str, datetime] = {}
        for pool, end in (data.items() if isinstance(data, dict) else ()):
            try:
                when = datetime.fromisoformat(str(end))
            except ValueError:
                continue
            if when.tzinfo is not None:
                found[str(pool)] = when
        return found

    def active(self, now: datetime) -> dict[str, datetime]:
        """Pool -> end of its cooldown, for the cooldowns still running at ``now`` (aware)."""
        return {pool: end for pool, end in self._read().items() if end > now}

    def remember(self, pools: Iterable[str], until: datetime, now: datetime | None = None) -> None:
        """Cool ``pools`` down until ``until`` (aware UTC); a later end already recorded wins;
        entries ended before ``now`` (default: the wall clock) are dropped."""
        new = set(pools)
        if not new:
            return
        def build() -> dict[str, str]:
            data = self.active(now or datetime.now(timezone.utc))
            for pool in new:
                data[pool] = max(until, data.get(pool, until))
            return {p: e.isoformat() for p, e in data.items()}

        try:
            _replace_json(self.path, build)
        except OSError as exc:
            log.warning("cannot remember the cooldown of %s in %s: %s", sorted(new), self.path,
                        exc)
