"""Prometheus metrics of the reconciler (prometheus-client).

Exposed as a node-exporter textfile-collector file (``reconcile.metrics_file``, rewritten
atomically after every pass) and/or an HTTP endpoint (``reconcile.metrics_port`` /
``slurm-spot reconcile --metrics-port``, on ``reconcile.metrics_addr`` / ``--metrics-addr``,
127.0.0.1 unless set).
Every metric is in its own registry, so tests and several reconcilers in one process do not
collide. Names follow Prometheus conventions (``_total`` counters, ``_seconds`` units):

- ``slurm_spot_nodes{node_set,state}``: cloud nodes by Slurm state (sinfo form: ``idle~``);
- ``slurm_spot_instances{provider,market}``: alive instances by market;
- ``slurm_spot_interruptions_total{node_set}``: instances the provider took back under a node;
- ``slurm_spot_orphans_terminated_total{provider}``: instances terminated with no node;
- ``slurm_spot_launch_failures_total{node_set,code}``: failed launches seen in the events;
- ``slurm_spot_failovers_total{node_set,reason}``: jobs moved off a node set without
  capacity, by that node set and the provider's code (InsufficientInstanceCapacity,
  ZONE_RESOURCE_POOL_EXHAUSTED, ...), one per ``failover`` event the resume hook's worker
  wrote (:mod:`slurm_spot.lifecycle.failover`; counted from the events file, as the hooks run no server);
- ``slurm_spot_reconcile_actions_total{action,outcome}``: actions, ``ok`` or ``error``;
- ``slurm_spot_reconcile_pass_duration_seconds``: histogram of pass durations;
- ``slurm_spot_reconcile_last_pass_timestamp_seconds``: end of the last complete pass;
- ``slurm_spot_launch_latency_seconds{node_set}``: histogram, resume request -> slurmd up;
- ``slurm_spot_time_to_running_seconds{partition}``: histogram, submission -> start, once per job;
- ``slurm_spot_recovery_seconds{node_set}``: histogram, interruption -> job running again
  (the three are measured as :mod:`slurm_spot.reconcile.latency` says);
- ``slurm_spot_events_total{source,action}``: events written by the hooks (resume, suspend,
  epilog...), the watchers (watch) and the reconciler, read from the events file (the watchers'
  count when ``log_dir`` is shared with the compute nodes, as the notice history needs).

:data:`METRIC_NAMES` lists every family (the names Prometheus shows, with ``_total`` for
counters); the example Grafana dashboard uses only these (tests/test_metrics_latency.py).
"""

from __future__ import annotations

import time
from collections import Counter as Tally
from collections.abc import Callable, Iterable
from pathlib import Path

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, write_to_textfile

from slurm_spot.errors import SlurmCommandError
from slurm_spot.providers.base import Instance
from slurm_spot.reconcile.latency import (
    LAUNCH,
    RECOVERY,
    TIME_TO_RUNNING,
    LatencyTracker,
    Observation,
)
from slurm_spot.slurm.client import Node
from slurm_spot.slurm.reasons import short_state

PASS_BUCKETS_S = (0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120)
# Cloud instances take ~30 s to several minutes to boot and register; ResumeTimeout caps it.
LAUNCH_BUCKETS_S = (5, 10, 20, 30, 45, 60, 90, 120, 180, 300, 600, 900)
# Includes queueing behind other jobs: from seconds (node up) to hours.
RUNNING_BUCKETS_S = (5, 15, 30, 60, 120, 300, 600, 1800, 3600, 4 * 3600, 12 * 3600)
# The figure to beat without notice is ~700 s (plain Slurm; docs/local-slurm.md).
RECOVERY_BUCKETS_S = (10, 20, 30, 45, 60, 90, 120, 180, 300, 600, 900, 1800, 3600)
METRIC_NAMES = (
    "slurm_spot_nodes", "slurm_spot_instances", "slurm_spot_interruptions_total",
    "slurm_spot_orphans_terminated_total", "slurm_spot_launch_failures_total",
    "slurm_spot_reconcile_actions_total", "slurm_spot_reconcile_pass_duration_seconds",
    "slurm_spot_reconcile_last_pass_timestamp_seconds", "slurm_spot_launch_latency_seconds",
    "slurm_spot_time_to_running_seconds", "slurm_spot_recovery_seconds", "slurm_spot_events_total",
    "slurm_spot_failovers_total",
)


class ReconcileMetrics:
    """The reconciler's metrics in a private registry.

    Args:
        registry: where to register (default: a new one).

    ``latency`` is the process's :class:`~slurm_spot.reconcile.latency.LatencyTracker`: what
    the histograms already counted survives a configuration reload (a new Reconciler).
    """

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        self.latency = LatencyTracker(started=time.time())
        r = self.registry
        self.nodes = Gauge("slurm_spot_nodes", "Cloud nodes by node set and Slurm state",
                           ["node_set", "state"], registry=r)
        self.instances = Gauge("slurm_spot_instances", "Alive instances by provider and market",
                               ["provider", "market"], registry=r)
        self.interruptions = Counter("slurm_spot_interruptions",
                                     "Instances the provider took back under a node",
                                     ["node_set"], registry=r)
        self.orphans = Counter("slurm_spot_orphans_terminated",
                               "Instances terminated because no node wanted them",
                               ["provider"], registry=r)
        self.launch_failures = Counter("slurm_spot_launch_failures",
                                       "Failed launches by node set and provider code",
                                       ["node_set", "code"], registry=r)
        self.failovers = Counter("slurm_spot_failovers",
                                 "Jobs moved off a node set without capacity, by that node set "
                                 "and the provider's code", ["node_set", "reason"], registry=r)
        self.actions = Counter("slurm_spot_reconcile_actions", "Reconciler actions by outcome",
                               ["action", "outcome"], registry=r)
        self.pass_duration = Histogram("slurm_spot_reconcile_pass_duration_seconds",
                                       "Duration of one reconcile pass", buckets=PASS_BUCKETS_S,
                                       registry=r)
        self.last_pass = Gauge("slurm_spot_reconcile_last_pass_timestamp_seconds",
                               "Unix time at which the last complete pass ended", registry=r)
        self.launch_latency = Histogram(
            "slurm_spot_launch_latency_seconds",
            "Resume request to the node's slurmd registered (SlurmdStartTime)",
            ["node_set"], buckets=LAUNCH_BUCKETS_S, registry=r)
        self.time_to_running = Histogram(
            "slurm_spot_time_to_running_seconds", "Job submission to its start (once per job)",
            ["partition"], buckets=RUNNING_BUCKETS_S, registry=r)
        self.recovery = Histogram(
            "slurm_spot_recovery_seconds",
            "Interruption (notice or reclaim) to the job running again",
            ["node_set"], buckets=RECOVERY_BUCKETS_S, registry=r)
        self.events = Counter("slurm_spot_events", "Events written by hooks, watchers and the "
                              "reconciler", ["source", "action"], registry=r)

    def observe_snapshot(
        self,
        nodes: Iterable[tuple[str, Node]],
        instances: Iterable[tuple[str, Instance]],
    ) -> None:
        """Set the gauges from one pass's view: ``(node set, node)`` and
        ``(provider, instance)`` pairs. Label values not seen this time drop to absent."""
        self.nodes.clear()
        for (set_name, state), count in Tally((s, short_state(n.state)) for s, n in nodes).items():
            self.nodes.labels(set_name, state).set(count)
        self.instances.clear()
        alive = Tally((p, i.market) for p, i in instances if i.state.is_alive)
        for (provider, market), count in alive.items():
            self.instances.labels(provider, market).set(count)

    def action(self, action: str, ok: bool) -> None:
        """Count one action and its outcome."""
        self.actions.labels(action, "ok" if ok else "error").inc()

    def slurm_action(self, action: str, errors: list[str], what: str,
                     call: Callable[..., object], *args: object) -> bool:
        """Run ``call(*args)`` (a Slurm command of one action) and count ``action``'s outcome.

        Returns:
            True if it ran; False if it raised :class:`~slurm_spot.errors.SlurmCommandError`
            (caught: counted as an error, ``"<what>: <the error>"`` added to ``errors``).
        """
        try:
            call(*args)
        except SlurmCommandError as exc:
            errors.append(f"{what}: {exc}")
            self.action(action, ok=False)
            return False
        self.action(action, ok=True)
        return True

    def write_textfile(self, path: Path) -> None:
        """Write the registry for node-exporter's textfile collector, atomically (a temp file
        in the same directory, then rename).

        Raises:
            OSError: the directory cannot be created or written.
        """
        path.parent.mkdir(parents=True, exist_ok=True)
        write_to_textfile(str(path), self.registry)

    def observe(self, observations: Iterable[Observation]) -> None:
        """Put measured latencies (:class:`~slurm_spot.reconcile.latency.Observation`) into
        their histograms."""
        histograms = {LAUNCH: self.launch_latency, TIME_TO_RUNNING: self.time_to_running,
                      RECOVERY: self.recovery}
        for o in observations:
            histograms[o.kind].labels(o.label).observe(o.seconds)

    def serve(self, port: int, addr: str = "127.0.0.1") -> None:
        """Serve ``/metrics`` over HTTP on ``addr:port`` (an IPv4 or IPv6 address; ``0.0.0.0``
        or ``::`` for every interface) from a daemon thread.

        Raises:
            OSError: the port is taken, or the address is not one of this host's.
        """
        from prometheus_client import start_http_server

        start_http_server(port, addr=addr, registry=self.registry)
