"""The ``gcp`` provider: Compute Engine Spot VMs through google-cloud-compute.

Launch (one node set, one batch):

1. list the node set's instances (``instances.aggregatedList``, label filter): nodes with an
   alive instance are returned as launched; ended instances of requested nodes are deleted
   first (their names are needed again);
2. one ``bulkInsert`` for all the other nodes: regional with a location policy
   (``ANY_SINGLE_ZONE``) when the node set has several zones, zonal otherwise; names via
   ``perInstanceProperties``; Spot (``instanceTerminationAction`` DELETE by default) or
   standard VMs; a request id derived from the batch;
3. wait on the zone/region operation, read ``error.errors[*].code``, list again: what exists
   is launched; for the rest the most specific code decides (:mod:`.errors`):
   capacity -> the same request without the failed zone, then the next machine type, then
   the fallback market; a machine or accelerator type not offered in a zone (permanent) ->
   the pair is remembered in ``<state_dir>/gcp/<provider>-unoffered.json``, never asked
   again by any later launch, and the other zones and types are tried, with no cooldown;
   quota -> the next machine type / market; throttle and unknown ->
   the same attempt again after a jittered back-off (bounded); config and auth -> stop.
   Every failed ``<machine type>/<zone>/<market>`` is in ``LaunchResult.failed_pools``.
   Machine types are tried cheapest per GPU first and zones cooling down after a capacity
   failure are left out (``gcp.type_order``; :mod:`slurm_spot.providers.pool_order`).

Nodes left without an instance come back as :class:`LaunchFailure` (``(Code:X)...``
reasons); the resume hook sets them DOWN then POWER_DOWN, so none stays in plain DOWN.

Instances are named ``<cluster>-<node>`` and labelled with cluster, node set and market
(``perInstanceProperties`` cannot carry a per-node label; see :mod:`.requests`).

Modules: this facade; :mod:`.launch` (the launch state machine); :mod:`.requests` (pure
request builders and response parsers); :mod:`.errors` (the error table);
:mod:`.api` (the only code touching google-cloud-compute, imported on first use).
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from datetime import datetime, timezone

from slurm_spot.config import GcpProviderConfig, NodeSetConfig, SpotConfig
from slurm_spot.errors import ProviderError
from slurm_spot.providers.base import (
    TAG_CLUSTER,
    TAG_NODE_SET,
    ErrorClass,
    Instance,
    InstanceState,
    LaunchRequest,
    LaunchResult,
)
from slurm_spot.providers.gcp.api import ComputeApi, GceCallError, OperationStatus
from slurm_spot.providers.gcp.errors import GceError
from slurm_spot.providers.gcp.launch import LaunchRun
from slurm_spot.providers.gcp.requests import (
    instance_from_resource,
    label_filter,
    label_value,
)
from slurm_spot.providers.gcp.shapes import gce_machine_shape
from slurm_spot.providers.ledger import PoolCooldowns, UnofferedPairs
from slurm_spot.providers.pool_order import PoolRanker
from slurm_spot.providers.prices import Price, price_of

log = logging.getLogger(__name__)


def _utcnow() -> datetime:
    return datetime.now(timezone.utc)


class GcpProvider:
    """Compute Engine instances for the node sets of one ``gcp`` provider.

    Args:
        config: the whole configuration (cluster name, node sets).
        name: the provider's name under ``providers:``.
        settings: project, region, ``api_endpoint``, ``credentials_file``.
        api: a ready :class:`ComputeApi` (tests); built on first use otherwise.
        sleep, now, monotonic, rng: injectable clock and randomness.
        operation_timeout_s: how long one launch waits for one operation, seconds.
        max_attempts: tries of one attempt on throttle/unknown errors (HTTP or operation).
        backoff_s: first back-off, seconds (doubles, jittered to 50-100 %, capped at 30 s).
        replay_window_s: an operation returned already DONE and older than the launch by
            more than this (seconds) is a replay of an earlier request id: sent again anew.
        delete_workers: ``instances.delete`` calls in flight at once (the API has no bulk
            delete for standalone instances; under the HTTP client's pool of 10 connections).

    Reference: Compute Engine API v1 ``instances.bulkInsert``, ``regionInstances.bulkInsert``,
    ``instances.aggregatedList``, ``instances.delete``, ``zoneOperations.wait``,
    ``regionOperations.wait``.
    """

    def __init__(
        self, config: SpotConfig, name: str, settings: GcpProviderConfig, *,
        api: ComputeApi | None = None, sleep: Callable[[float], None] = time.sleep,
        now: Callable[[], datetime] = _utcnow, monotonic: Callable[[], float] = time.monotonic,
        rng: Callable[[], float] = random.random, operation_timeout_s: float = 240.0,
        max_attempts: int = 3, backoff_s: float = 2.0, replay_window_s: float = 60.0,
        delete_workers: int = 8,
    ) -> None:
        self.config = config
        self.name = name
        self.settings = settings
        self._api = api
        self.sleep, self.now, self.monotonic, self.rng = sleep, now, monotonic, rng
        self.operation_timeout_s = operation_timeout_s
        self.max_attempts = max_attempts
        self.backoff_s = backoff_s
        self.replay_window_s = replay_window_s
        self.unoffered: UnofferedPairs | None = UnofferedPairs(
            config.state_dir / "gcp" / f"{name}-unoffered.json")
        self._ranker: PoolRanker | None = None
        self.delete_workers = delete_workers
        # instance name -> instance, from this object's listings (a name's zone never changes)
        self._seen: dict[str, Instance] = {}

    @property
    def api(self) -> ComputeApi:
        """The Compute API adapter (imports google-cloud-compute on first use).

        Raises:
            ProviderError: the credentials file cannot be loaded.
        """
        if self._api is None:
            self._api = ComputeApi(self.settings)
        return self._api

    @property
    def pool_ranker(self) -> PoolRanker:
        """Prices (spot.yaml ``cost``, then the shipped catalogue), machine shapes and pool
        cooldowns for ordering a node set's machine types
        (:mod:`slurm_spot.providers.pool_order`); built once, no I/O until used."""
        if self._ranker is None:
            from slurm_spot.providers.gcp.prices import price_source

            source = price_source(self.config, self.name)

            def price(market: str, machine_type: str, zone: str) -> Price:
                return price_of(self.config.cost, source,
                                "spot" if market == "spot" else "on-demand", machine_type,
                                zone or None)

            path = self.config.state_dir / "gcp" / f"{self.name}-pool-cooldowns.json"
            self._ranker = PoolRanker(price, gce_machine_shape, PoolCooldowns(path),
                                      self.config.reconcile.cooldown_s, self.config.log_dir,
                                      self.now)
        return self._ranker

    @property
    def api_calls(self) -> int:
        """Compute API calls made so far by this provider (each list page counts)."""
        return self._api.calls if self._api is not None else 0

    def _listed(self, labels: dict[str, str]) -> list[Instance]:
        cluster = self.config.cluster
        found = [instance_from_resource(r, cluster)
                 for r in self.api.list_instances(label_filter(labels))]
        self._seen.update((i.instance_id, i) for i in found)
        return found

    def list_instances(self) -> list[Instance]:
        """Every instance labelled with this cluster, in every zone, alive or ended (one
        ``aggregatedList`` call per 500 instances).

        Raises:
            ProviderError: the API refused the listing or could not be reached.
        """
        return self._listed({TAG_CLUSTER: label_value(self.config.cluster)})

    def node_set_instances(self, node_set: NodeSetConfig) -> dict[str, list[Instance]]:
        """The node set's instances by node (several when a name exists in several zones).

        Raises:
            ProviderError: as :meth:`list_instances`.
        """
        labels = {TAG_CLUSTER: label_value(self.config.cluster),
                  TAG_NODE_SET: label_value(node_set.name)}
        found: dict[str, list[Instance]] = {}
        for inst in self._listed(labels):
            if inst.node:
                found.setdefault(inst.node, []).append(inst)
        return found

    def launch(self, request: LaunchRequest) -> LaunchResult:
        """Start an instance for each of ``request.nodes`` (see the module docstring).

        Raises:
            ProviderError: the node set has no ``gcp`` section (config), or the first listing
                failed (credentials, endpoint): nothing was attempted.
        """
        if request.node_set.gcp is None:
            raise ProviderError("INVALID", f"node set {request.node_set.name!r} has no 'gcp' "
                                "section", ErrorClass.CONFIG.value)
        calls = self.api_calls
        run = LaunchRun(self, request, started=self.now())
        run.execute()
        return run.result(self.api_calls - calls)

    def terminate(self, nodes: Sequence[str]) -> list[Instance]:
        """Delete every instance of ``nodes`` (all zones, duplicates too); gone ones are
        skipped. Does not wait for the deletions. Returns what was deleted.

        Raises:
            ProviderError: the listing failed (a failed delete is logged, the rest go on).
        """
        wanted = set(nodes)
        return self.delete([i for i in self.list_instances() if i.node in wanted])

    def terminate_instances(self, instance_ids: Sequence[str]) -> None:
        """Delete instances by name (this cluster's only); unknown or gone ones are ignored.

        ``instances.delete`` needs each instance's zone: it comes from this provider's last
        listing (the reconciler lists before it terminates), so only names it has not seen
        cost one more listing, whatever the number of names.

        Raises:
            ProviderError: that listing failed.
        """
        wanted = set(instance_ids)
        if wanted - set(self._seen):
            self.list_instances()
        # Every listed instance carries this cluster's label: names seen nowhere are not ours.
        self.delete([self._seen[name] for name in sorted(wanted) if name in self._seen])

    def delete(self, instances: Sequence[Instance], wait: bool = False) -> list[Instance]:
        """``instances.delete`` each instance (404 ignored), up to ``delete_workers`` calls at
        once, optionally waiting (bounded) for the operations. A failure is logged and does not
        stop the others.

        Compute Engine has no bulk delete for instances outside a managed group, and its HTTP
        batch endpoint still counts one request per call against the quota (Compute Engine
        "Batching requests"), which google-cloud-compute does not offer: the calls go out
        concurrently instead, so 1000 deletions take the time of ~1000 / ``delete_workers``.
        """
        from concurrent.futures import ThreadPoolExecutor

        def one(inst: Instance) -> OperationStatus | None:
            try:
                return self.api.delete(inst.zone, inst.instance_id)
            except GceCallError as exc:
                log.error("cannot delete %s in %s: %s", inst.instance_id, inst.zone, exc)
                return None

        if not instances:
            return []
        self.api  # noqa: B018 - build the client once, before the threads share it
        workers = max(1, min(self.delete_workers, len(instances)))
        with ThreadPoolExecutor(max_workers=workers) as pool:
            answers = list(pool.map(one, instances))
        ended, ops = [], []
        for inst, op in zip(instances, answers, strict=True):
            if op is None:
                continue
            ops.append(op)
            ended.append(replace(inst, state=InstanceState.STOPPING,
                                 state_reason="Deleted by slurm-spot"))
        for op in ops if wait else []:
            done = self.wait(op)
            if done.errors:
                log.error("delete %s failed: %s", op.name, done.errors[0].code)
        return ended

    def wait(self, op: OperationStatus) -> OperationStatus:
        """Wait (bounded by ``operation_timeout_s``) until ``op`` is DONE. Not DONE in time:
        returned with an ``OPERATION_TIMEOUT`` error; a failed wait call: with its error."""
        deadline = self.monotonic() + self.operation_timeout_s
        while not op.done:
            remaining = deadline - self.monotonic()
            if remaining <= 0:
                error = GceError("OPERATION_TIMEOUT", f"{op.name} not done after "
                                 f"{self.operation_timeout_s:.0f} s")
                return replace(op, errors=(error,))
            asked = self.monotonic()
            try:
                op = self.api.wait(op, min(remaining, 120.0))
            except GceCallError as exc:
                return replace(op, errors=exc.errors or (GceError(exc.code, str(exc)),))
            if not op.done and self.monotonic() - asked < 1.0:
                self.sleep(min(1.0, max(0.0, deadline - self.monotonic())))
        return op

    def backoff(self, attempt: int) -> None:
        """Sleep before retry number ``attempt`` (1, 2, ...): jittered exponential."""
        delay = min(30.0, self.backoff_s * 2 ** (attempt - 1))
        self.sleep(delay * (0.5 + self.rng() / 2))
