"""The chaos market's schedule (pure): per node set, capacity that comes and goes and
interruptions at a rate, drawn from a seed, so that the same seed gives the same events.

A node set's market is written ``NAME:key=value,...`` (:func:`parse_market`), e.g.
``cheap:rate=10,notice=0.5,notice_s=30,up=300,down=60``:

- ``rate``: interruptions per node-hour (``10`` or ``10/h``), as ``slurm-spot simulate``'s
  node rate (``--mtbf-h`` is ``1/rate``): each node of the set has its own Poisson process; an
  event on a node with no running instance changes nothing (a powered-down node cannot be
  reclaimed), so a job of N nodes sees ``N * rate`` per hour while it runs;
- ``notice``: the share of interruptions that come with a notice (``0.5`` or ``50%``); the
  rest kill the instance without one; ``notice_s``: the notice's length in seconds;
- ``up``/``down``: capacity is there for ``up`` seconds, then gone (launches fail with the
  local provider's ``InsufficientInstanceCapacity``) for ``down`` seconds (each 0 or at
  least :data:`MIN_PERIOD_S`), and so on;
  ``start=down`` starts with the outage; ``cycle=random`` draws each period from an
  exponential distribution with those means instead. No ``down``: capacity never goes.

Every stream has its own generator, ``random.Random(f"{seed}:{node set}:{node}")`` for a
node's interruptions and ``...:{node set}:capacity`` for the capacity, so adding a node set
or a node changes no other stream's events.
"""

from __future__ import annotations

import heapq
import itertools
import math
import random
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass

from slurm_spot.errors import BadInputError

INTERRUPT = "interrupt"
CAPACITY = "capacity"
#: Longest period or notice accepted (seconds): a week.
MAX_SECONDS = 7 * 86400.0
#: Highest interruption rate accepted, per node-hour (one a second).
MAX_RATE_PER_H = 3600.0
#: Shortest capacity period accepted (seconds; ``up``/``down`` when not 0, the means with
#: ``cycle=random``): the daemon changes a node set's capacity at most about this often. A
#: shorter one (``up=1e-9``) made ``local market plan`` run without end and the daemon
#: change the capacity and log it in a loop without sleeping; a period too small for the
#: running time to advance (``1e-300``) never moved the clock at all.
MIN_PERIOD_S = 1.0


@dataclass(frozen=True)
class NodeSetMarket:
    """One node set's market.

    Attributes:
        node_set: the node set's name in spot.yaml.
        rate_per_h: interruptions per node-hour (0: none).
        notice_share: share of interruptions with a notice, 0 to 1.
        notice_s: seconds of notice of those.
        up_s, down_s: seconds capacity is there, then gone (``down_s`` 0: never gone).
        start: ``up`` or ``down``, the period the cycle starts with.
        cycle: ``fixed`` periods, or ``random`` (exponential, ``up_s``/``down_s`` the means).
    """

    node_set: str
    rate_per_h: float = 0.0
    notice_share: float = 1.0
    notice_s: float = 30.0
    up_s: float = 0.0
    down_s: float = 0.0
    start: str = "up"
    cycle: str = "fixed"

    def check(self) -> None:
        """Raises BadInputError naming the node set and the first bad setting."""
        where = f"market of node set {self.node_set!r}"
        for name, value, high in (("rate", self.rate_per_h, MAX_RATE_PER_H),
                                  ("notice_s", self.notice_s, MAX_SECONDS),
                                  ("up", self.up_s, MAX_SECONDS),
                                  ("down", self.down_s, MAX_SECONDS)):
            if not (math.isfinite(value) and 0 <= value <= high):
                raise BadInputError(f"{where}: {name}={value!r} must be between 0 and {high:g}")
        if not 0 <= self.notice_share <= 1:
            raise BadInputError(f"{where}: notice={self.notice_share!r} must be a share "
                                "between 0 and 1 (or 0% to 100%)")
        if self.start not in ("up", "down"):
            raise BadInputError(f"{where}: start={self.start!r} must be up or down")
        if self.cycle not in ("fixed", "random"):
            raise BadInputError(f"{where}: cycle={self.cycle!r} must be fixed or random")
        for name, value in (("up", self.up_s), ("down", self.down_s)):
            if 0 < value < MIN_PERIOD_S:
                raise BadInputError(f"{where}: {name}={value:g} must be 0 or at least "
                                    f"{MIN_PERIOD_S:g} s (how long capacity is there or gone)")
        if self.down_s > 0 and self.up_s <= 0:
            raise BadInputError(f"{where}: down={self.down_s:g} needs up > 0 (how long "
                                "capacity is there between outages)")
        if self.start == "down" and self.down_s <= 0:
            raise BadInputError(f"{where}: start=down needs down > 0")

    def to_json(self) -> dict[str, object]:
        return asdict(self)


@dataclass(frozen=True)
class MarketEvent:
    """One event of the schedule, ``at_s`` seconds after the market starts.

    ``kind`` :data:`INTERRUPT`: ``node`` is reclaimed, after ``notice_s`` seconds of notice
    (0: without notice). ``kind`` :data:`CAPACITY`: ``node_set``'s capacity is gone
    (``available`` False) or back (True).
    """

    at_s: float
    kind: str
    node_set: str
    node: str | None = None
    notice_s: float = 0.0
    available: bool | None = None

    def to_json(self) -> dict[str, object]:
        return {k: v for k, v in asdict(self).items() if v is not None}


_KEYS = {"rate": "rate_per_h", "notice": "notice_share", "notice_s": "notice_s", "up": "up_s",
         "down": "down_s", "start": "start", "cycle": "cycle"}


def _number(text: str, what: str, suffixes: tuple[str, ...]) -> float:
    for suffix in suffixes:
        text = text.removesuffix(suffix)
    try:
        return float(text)
    except ValueError:
        raise BadInputError(f"{what}: {text!r} is not a number") from None


def parse_market(spec: str) -> NodeSetMarket:
    """``NAME:key=value,...`` (module docstring) as a checked :class:`NodeSetMarket`.

    Raises:
        BadInputError: no ``NAME:``, an unknown or repeated key, a value that is not a number
            or is out of range; the message quotes the spec and names the key.
    """
    name, sep, rest = spec.partition(":")
    if not sep or not name.strip():
        raise BadInputError(f"market {spec!r}: expected NODE_SET:key=value,... "
                            "(e.g. cheap:rate=10,notice=0.5,up=300,down=60)")
    fields: dict[str, object] = {}
    seen: set[str] = set()
    for item in filter(None, (part.strip() for part in rest.split(","))):
        key, eq, value = item.partition("=")
        if not eq or key.strip() not in _KEYS:
            raise BadInputError(f"market {spec!r}: {item!r} is not key=value with a key of "
                                f"{', '.join(_KEYS)}")
        key, value = key.strip(), value.strip()
        what = f"market {spec!r}, {key}"
        if key in seen:  # the last would silently win: say which one is meant
            raise BadInputError(f"{what}: given twice")
        seen.add(key)
        if key in ("start", "cycle"):
            fields[_KEYS[key]] = value
        elif key == "rate":
            fields["rate_per_h"] = _number(value, what, ("/h",))
        elif key == "notice":
            share = _number(value, what, ("%",))
            fields["notice_share"] = share / 100 if value.endswith("%") else share
        else:
            fields[_KEYS[key]] = _number(value, what, ("s",))
    market = NodeSetMarket(name.strip(), **fields)  # type: ignore[arg-type]
    market.check()
    return market


def _interruptions(market: NodeSetMarket, node: str, seed: int) -> Iterator[MarketEvent]:
    rng = random.Random(f"{seed}:{market.node_set}:{node}")
    if market.rate_per_h <= 0:
        return
    t = 0.0
    while True:
        t += rng.expovariate(market.rate_per_h / 3600.0)
        notice = market.notice_s if rng.random() < market.notice_share else 0.0
        yield MarketEvent(t, INTERRUPT, market.node_set, node=node, notice_s=notice)


def _capacity(market: NodeSetMarket, seed: int) -> Iterator[MarketEvent]:
    if market.down_s <= 0:
        return
    rng = random.Random(f"{seed}:{market.node_set}:capacity")

    def period(mean: float) -> float:
        return rng.expovariate(1 / mean) if market.cycle == "random" else mean

    t = 0.0
    available = market.start == "up"
    if not available:
        yield MarketEvent(0.0, CAPACITY, market.node_set, available=False)
    while True:
        t += period(market.up_s if available else market.down_s)
        available = not available
        yield MarketEvent(t, CAPACITY, market.node_set, available=available)


def events(markets: Sequence[NodeSetMarket], nodes: Mapping[str, Sequence[str]],
           seed: int) -> Iterator[MarketEvent]:
    """Every event of the market, in time order, without end (module docstring).

    ``nodes`` maps each node set to its node names. At the same instant a capacity event
    comes before an interruption, and streams keep the order of ``markets`` and ``nodes``.

    Raises:
        BadInputError: a market's node set is not in ``nodes``, or named twice.
    """
    seen: set[str] = set()
    streams: list[Iterator[MarketEvent]] = []
    for market in markets:
        if market.node_set not in nodes:
            raise BadInputError(f"market of node set {market.node_set!r}: no such node set "
                                f"(defined: {', '.join(nodes) or 'none'})")
        if market.node_set in seen:
            raise BadInputError(f"node set {market.node_set!r} has two markets: give one")
        seen.add(market.node_set)
        market.check()
        streams.append(_capacity(market, seed))
        streams += [_interruptions(market, node, seed) for node in nodes[market.node_set]]
    merged = heapq.merge(*(_keyed(i, stream) for i, stream in enumerate(streams)))
    for _key, event in merged:
        yield event


def _keyed(index: int, stream: Iterator[MarketEvent]
           ) -> Iterator[tuple[tuple[float, bool, int], MarketEvent]]:
    """``stream``'s events keyed for the merge: time, capacity first, then stream order."""
    for event in stream:
        yield (event.at_s, event.kind != CAPACITY, index), event


def schedule(markets: Sequence[NodeSetMarket], nodes: Mapping[str, Sequence[str]], seed: int,
             until_s: float) -> list[MarketEvent]:
    """The events of :func:`events` in the first ``until_s`` seconds.

    Raises:
        BadInputError: see :func:`events`; ``until_s`` negative or not finite.
    """
    if not (math.isfinite(until_s) and until_s >= 0):
        raise BadInputError(f"market duration {until_s!r}: must be >= 0 seconds")
    return list(itertools.takewhile(lambda e: e.at_s < until_s, events(markets, nodes, seed)))
