"""The chaos market's daemon: applies a seeded schedule (:mod:`.market`) to the running local
cluster, so that a job can be soaked there before it meets a real spot market.

``slurm-spot local market start`` writes the plan (markets, seed, start time, duration, and
the capacity limits the node sets had before) to ``<state_dir>/local/market/plan.json`` and
starts ``python -m slurm_spot.localcluster.marketd --config F``, detached; its pid and start
time go into the plan and into ``local up``'s record, so ``local market stop`` and ``local
down`` stop exactly that process (never one that merely reuses its pid). At each event the
daemon:

- interruption: publishes a notice for the node and reclaims its instance when the notice
  runs out, or kills it at once without notice (:meth:`LocalProvider.preempt`, what ``local
  preempt`` does); a node with no running instance, or whose notice is already pending, is
  left alone and the event is logged as not applied;
- capacity gone: limits the node set to 0 instances (launches fail with
  ``InsufficientInstanceCapacity``, what ``local capacity NODE_SET 0`` does); back: restores
  the limit it had before the market.

Each event is logged, applied or not, with the jobs that ran on the node, as one JSON line of
``<state_dir>/local/market/log.jsonl`` (:mod:`.market_report` reads it). When the duration
is over, or on SIGTERM, the daemon restores every limit it changed and exits.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from types import FrameType

from slurm_spot.config import LocalProviderConfig, SpotConfig, load_config
from slurm_spot.errors import BadInputError, SlurmCommandError, SlurmSpotError
from slurm_spot.localcluster import cluster as localcluster
from slurm_spot.localcluster.daemons import Under, terminate
from slurm_spot.localcluster.market import CAPACITY, MarketEvent, NodeSetMarket, events
from slurm_spot.providers.local.provider import (
    LocalProvider,
    _proc_start_ticks,
    provider_for_node,
)


@dataclass(frozen=True)
class MarketPaths:
    """Files of the market of one local cluster (under ``<state_dir>/local/market``)."""

    root: Path

    plan = Under("root", "plan.json")
    log = Under("root", "log.jsonl")

    @classmethod
    def of(cls, config: SpotConfig) -> MarketPaths:
        return cls(config.state_dir / "local" / "market")


def read_plan(config: SpotConfig) -> dict:
    """The current (or last) market's plan; ``{}`` when none was started."""
    try:
        return dict(json.loads(MarketPaths.of(config).plan.read_text()))
    except (OSError, ValueError):
        return {}


def running(plan: dict) -> bool:
    """Whether the daemon of ``plan`` is alive: its pid runs and started when it did."""
    pid, ticks = plan.get("pid"), plan.get("start_ticks")
    return isinstance(pid, int) and ticks is not None and _proc_start_ticks(pid) == ticks


def _provider_of_set(config: SpotConfig, node_set: str) -> LocalProvider:
    return provider_for_node(config, config.node_set(node_set).node_names[0])


def start(config: SpotConfig, markets: Sequence[NodeSetMarket], seed: int,
          duration_s: float | None, slurm_conf: Path) -> dict:
    """Start the daemon for ``markets`` (seeded by ``seed``; ``duration_s`` seconds, None:
    until stopped) on the local cluster of ``config``. Returns the plan it writes.

    Raises:
        BadInputError: the local cluster is not up, a market is already running, a market
            names a node set that is not defined or not a local one, or a bad duration.
        SlurmSpotError: the daemon exited at once (its log says why).
    """
    record = localcluster.read_record(config)
    if not localcluster.alive(record.get("slurmctld_pid")):
        raise BadInputError(f"the local cluster of {config.source_path} is not up: run "
                            "'slurm-spot local up' first")
    if running(read_plan(config)):
        raise BadInputError("a market is already running on this cluster: 'slurm-spot local "
                            "market stop' first")
    if duration_s is not None and not 0 < duration_s <= 30 * 86400:
        raise BadInputError(f"--duration {duration_s!r}: must be > 0 and at most 30 days")
    nodes = {ns.name: ns.node_names for ns in config.node_sets}
    for market in markets:
        if market.node_set not in nodes:
            raise BadInputError(f"market of node set {market.node_set!r}: not defined in "
                                f"{config.source_path} (node sets: {', '.join(nodes)})")
        settings = config.providers[config.node_set(market.node_set).provider]
        if not isinstance(settings, LocalProviderConfig):
            raise BadInputError(f"market of node set {market.node_set!r}: the market runs on "
                                "local-provider node sets only")
    next(iter(events(markets, nodes, seed)), None)  # names twice etc.: raise before starting
    limits = {m.node_set: _provider_of_set(config, m.node_set).capacity().get(m.node_set)
              for m in markets}
    paths = MarketPaths.of(config)
    paths.root.mkdir(parents=True, exist_ok=True)
    paths.log.unlink(missing_ok=True)
    plan: dict = {"seed": seed, "duration_s": duration_s, "started": time.time() + 0.5,
                  "markets": [m.to_json() for m in markets], "limits_before": limits,
                  "slurm_conf": str(slurm_conf)}
    _write(paths.plan, plan)
    log = open(config.log_dir / "market.log", "ab")
    proc = subprocess.Popen(  # noqa: S603 - argv list
        [sys.executable, "-m", "slurm_spot.localcluster.marketd", "--config",
         str(config.source_path)],
        stdin=subprocess.DEVNULL, stdout=log, stderr=log, start_new_session=True,
        env={**os.environ, "SLURM_CONF": str(slurm_conf)},
    )
    plan.update(pid=proc.pid, start_ticks=_proc_start_ticks(proc.pid))
    _write(paths.plan, plan)
    localcluster.update_record(config, market_pid=proc.pid,
                               market_start_ticks=plan["start_ticks"])
    time.sleep(0.3)
    if proc.poll() is not None:
        raise SlurmSpotError(f"the market daemon exited at start; see "
                             f"{config.log_dir / 'market.log'}")
    return plan


def stop(config: SpotConfig, timeout_s: float = 10.0) -> bool:
    """Stop the market's daemon (SIGTERM, then SIGKILL after ``timeout_s``) if it runs, and
    restore the capacity limits the node sets had before it. Returns whether it ran."""
    plan = read_plan(config)
    was_running = running(plan)
    if was_running:
        terminate(int(plan["pid"]), lambda: running(plan), timeout_s)
    _restore(config, read_plan(config))  # unless the daemon did: a SIGKILL leaves it to us
    return was_running


def _restore(config: SpotConfig, plan: dict) -> None:
    """Give the market's node sets back the capacity limits they had before it, once: the
    plan is marked ``restored``, so a later ``local down`` leaves limits an admin set after
    the market alone."""
    if not plan or plan.get("restored"):
        return
    for node_set, limit in dict(plan.get("limits_before") or {}).items():
        try:
            _provider_of_set(config, node_set).set_capacity(node_set, limit)
        except (KeyError, BadInputError):
            continue  # the node set is gone from spot.yaml: nothing to restore
    _write(MarketPaths.of(config).plan, {**plan, "restored": True})


def _write(path: Path, data: dict) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(data, indent=2, sort_keys=True))
    os.replace(tmp, path)


def _log(path: Path, **fields: object) -> None:
    line = {"time": datetime.now(timezone.utc).isoformat(), **fields}
    with open(path, "a") as fh:
        fh.write(json.dumps(line, sort_keys=True) + "\n")


def apply(config: SpotConfig, event: MarketEvent, limits_before: dict) -> dict[str, object]:
    """Apply one event to the cluster now (module docstring); returns what happened:
    ``applied`` and, if not, ``why``; for an interruption the ``instance`` and the
    ``job_ids`` that ran on the node."""
    if event.kind == CAPACITY:
        limit = limits_before.get(event.node_set) if event.available else 0
        _provider_of_set(config, event.node_set).set_capacity(event.node_set, limit)
        return {"applied": True, "limit": limit}
    assert event.node is not None
    provider = provider_for_node(config, event.node)
    alive = [i for i in provider.list_instances() if i.node == event.node and i.state.is_alive]
    if not alive:
        return {"applied": False, "why": "no running instance"}
    if provider.notice_path(event.node).exists():
        return {"applied": False, "why": "a notice is already pending",
                "instance": alive[0].instance_id}
    from slurm_spot.slurm.client import SlurmClient

    try:
        found = SlurmClient(config.slurm_bin_dir).nodes([event.node])
        job_ids = list(found[0].jobs) if found else []
    except SlurmCommandError:
        job_ids = []
    try:
        provider.preempt(event.node, event.notice_s)
    except BadInputError as exc:  # its instance ended in between
        return {"applied": False, "why": str(exc)}
    return {"applied": True, "instance": alive[0].instance_id, "job_ids": job_ids}


#: The longest single sleep of the daemon (seconds).
SLEEP_STEP_S = 3600.0


def sleep_until(when: float, sleep: Callable[[float], None] = time.sleep) -> None:
    """Sleep until ``when`` (epoch seconds; ``inf``: for ever, until SIGTERM) in steps of at
    most :data:`SLEEP_STEP_S`. One ``time.sleep`` of the whole delay raised OverflowError past
    about 292 years, which a low rate draws (``rate=1e-6``: a mean of 3.6e9 s; ``rate=1e-320``:
    ``inf``), and the daemon died at its first event."""
    while (left := when - time.time()) > 0:
        sleep(min(left, SLEEP_STEP_S))


def run(config_path: str) -> None:
    """The daemon's loop (module docstring)."""
    config = load_config(config_path)
    paths = MarketPaths.of(config)
    plan = read_plan(config)
    markets = [NodeSetMarket(**m) for m in plan["markets"]]
    nodes = {ns.name: ns.node_names for ns in config.node_sets}
    limits = dict(plan.get("limits_before") or {})
    started, duration = float(plan["started"]), plan.get("duration_s")

    def on_term(_signum: int, _frame: FrameType | None) -> None:
        raise SystemExit(0)

    signal.signal(signal.SIGTERM, on_term)
    _log(paths.log, kind="started", seed=plan["seed"], duration_s=duration)
    end = "ended"
    try:
        for event in events(markets, nodes, int(plan["seed"])):
            if duration is not None and event.at_s >= float(duration):
                break
            sleep_until(started + event.at_s)
            try:
                outcome = apply(config, event, limits)
            except (OSError, SlurmSpotError) as exc:
                outcome = {"applied": False, "why": f"{type(exc).__name__}: {exc}"}
            _log(paths.log, **event.to_json(), **outcome)
        if duration is not None:
            sleep_until(started + float(duration))
    except SystemExit:
        end = "stopped"
    finally:
        _restore(config, read_plan(config))
        _log(paths.log, kind=end)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="slurm_spot.localcluster.marketd")
    parser.add_argument("--config", required=True)
    args = parser.parse_args(argv)
    run(args.config)


if __name__ == "__main__":
    main()
