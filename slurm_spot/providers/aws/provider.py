"""The ``aws`` provider: EC2 spot (fallback on-demand) instances launched with EC2 Fleet.

- Launch: :class:`~slurm_spot.providers.aws.launch.FleetLauncher` (one CreateFleet of type
  ``instant`` per node set and batch, error classes as data, node mapping by tags).
- State of record: tags on the instances (cluster, node set, market, launch, node mapping);
  every listing is one paginated DescribeInstances filtered by the cluster tag.
- Clients: boto3 is imported on first use only (``import boto3`` plus a client costs ~0.4 s in a
  short-lived hook). Credentials come from the standard boto3 chain (instance profile on the
  controller, ``profile`` and ``credentials_file`` from the config if set) and are never
  logged. The endpoint is the config's ``endpoint_url``, else whatever boto3 reads from
  ``AWS_ENDPOINT_URL_EC2`` / ``AWS_ENDPOINT_URL`` (tests point these at moto).
- Retries: two clients. CreateFleet goes through one with ``total_max_attempts=1`` (botocore
  would otherwise repeat InsufficientInstanceCapacity, an HTTP 500, twice in standard mode);
  the launcher retries throttling itself with the same ClientToken. Every other call uses
  botocore's standard mode (5 attempts in all), which retries throttling and 5xx with jittered
  back-off; those calls are idempotent.

API reference: Amazon EC2 API Reference (CreateFleet, DescribeInstances, CreateTags,
TerminateInstances, DescribeSubnets, DescribeSpotPriceHistory).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from datetime import datetime, timezone
from typing import Any

from slurm_spot.config import AwsProviderConfig, SpotConfig
from slurm_spot.errors import PartialTerminationError, ProviderError
from slurm_spot.providers.aws.catalog import catalogue as instance_catalogue
from slurm_spot.providers.aws.errors import FleetError, error_kind, fleet_errors, from_client_error
from slurm_spot.providers.aws.fleet import TAG_LAUNCH, fleet_instance_ids, instance_from_ec2
from slurm_spot.providers.aws.launch import Attempt, FleetLauncher
from slurm_spot.providers.aws.session import boto_session
from slurm_spot.providers.base import (
    TAG_CLUSTER,
    TAG_NODE_SET,
    ErrorClass,
    Instance,
    InstanceState,
    LaunchRequest,
    LaunchResult,
    normalize_code,
)
from slurm_spot.providers.ledger import PoolCooldowns, TokenLedger, UnofferedPairs
from slurm_spot.providers.pool_order import PoolRanker
from slurm_spot.providers.prices import Price, UnknownPriceError, price_of

log = logging.getLogger(__name__)

_CHUNK = 1000  # ids per DescribeInstances / TerminateInstances / CreateTags call
_NOT_FOUND = {normalize_code("InvalidInstanceID.NotFound")}
_GONE = _NOT_FOUND | {normalize_code("InvalidInstanceID.Malformed")}
# Error classes of a whole request, not of one instance in it: a smaller batch fails alike.
_WHOLE_REQUEST = {ErrorClass.AUTH, ErrorClass.THROTTLE}


class AwsProvider:
    """EC2 implementation of :class:`~slurm_spot.providers.base.Provider`.

    Args:
        config: the whole configuration (cluster name, node sets).
        name: this provider's key under ``providers:``.
        settings: its :class:`~slurm_spot.config.AwsProviderConfig` (region, endpoint, profile).
        session: a ``boto3.session.Session`` to use instead of building one (tests); else one
            is built on first use and shared by both clients.
        sleep: waits between retries (seconds); tests pass a recorder.
        now: wall clock, seconds since the epoch.

    Attributes:
        api_calls: EC2 API calls made so far by this object (a call botocore retried counts
            once; every CreateFleet attempt is its own call).
    """

    def __init__(
        self,
        config: SpotConfig,
        name: str,
        settings: AwsProviderConfig,
        *,
        session: Any = None,
        sleep: Callable[[float], None] = time.sleep,
        now: Callable[[], float] = time.time,
    ) -> None:
        self.config = config
        self.name = name
        self.settings = settings
        self.api_calls = 0
        self._session = session
        self._sleep = sleep
        self._now = now
        self._clients: dict[str, Any] = {}
        self._zones: dict[str, str] = {
            subnet: zone
            for ns in config.node_sets
            if ns.provider == name and ns.aws is not None
            for subnet, zone in ns.aws.subnet_zones.items()
        }
        self._zones_looked_up = False

    # ---- clients ------------------------------------------------------------------------
    @property
    def client(self) -> Any:
        """EC2 client for everything but CreateFleet (botocore standard retries, 5 attempts)."""
        return self._client("general", {"mode": "standard", "total_max_attempts": 5}, 30)

    @property
    def launch_client(self) -> Any:
        """EC2 client for CreateFleet only: botocore makes exactly one attempt."""
        return self._client("launch", {"mode": "standard", "total_max_attempts": 1}, 120)

    def _client(self, kind: str, retries: Any, read_timeout_s: int) -> Any:
        if kind not in self._clients:
            from botocore.config import Config

            if self._session is None:  # one session for both clients (~0.2 s each)
                self._session = boto_session(self.settings)
            client = self._session.client(
                "ec2",
                region_name=self.settings.region,
                endpoint_url=self.settings.endpoint_url or None,
                config=Config(retries=retries, connect_timeout=5, read_timeout=read_timeout_s),
            )
            client.meta.events.register("before-parameter-build.ec2", self._count_call)
            self._clients[kind] = client
        return self._clients[kind]

    def _count_call(self, **_: Any) -> None:
        self.api_calls += 1

    # ---- Provider -----------------------------------------------------------------------
    def launch(self, request: LaunchRequest) -> LaunchResult:
        """Start an instance for each node of ``request`` that has no alive one.

        See :mod:`slurm_spot.providers.aws.launch` for the steps and the error handling.

        Raises:
            ProviderError: the lookup before launching failed (endpoint, credentials), or
                credentials were refused before anything was launched.
        """
        state = self.config.state_dir / "aws"
        launcher = FleetLauncher(
            self, request, now=self._now, sleep=self._sleep,
            ledger=TokenLedger(state / f"{self.name}-launch-tokens.json"),
            unoffered=UnofferedPairs(state / f"{self.name}-unoffered.json"),
            ranker=self.pool_ranker())
        return launcher.run()

    def pool_ranker(self) -> PoolRanker:
        """Prices, shapes and pool cooldowns for ordering a ``lowest-price`` node set's pools
        (:mod:`slurm_spot.providers.pool_order`). Spot prices come from
        DescribeSpotPriceHistory through this provider's client (cached in
        ``<state_dir>/cost/spot-prices.json`` for ``cost.spot_price_max_age_s``), unless
        spot.yaml's ``cost.spot_usd_per_hour`` names the type; on-demand prices from spot.yaml
        or the shipped catalogue. Nothing is asked of EC2 until a price is needed."""
        from slurm_spot.providers.aws.prices import AwsPrices, AwsSpotPrices

        source = AwsPrices(region=self.settings.region, spot=AwsSpotPrices(
            lambda: self.client, self.settings.region,
            self.config.state_dir / "cost" / "spot-prices.json",
            self.config.cost.spot_price_max_age_s))

        def price(market: str, instance_type: str, zone: str) -> Price:
            from botocore.exceptions import BotoCoreError, ClientError

            try:
                return price_of(self.config.cost, source,
                                "spot" if market == "spot" else "on-demand", instance_type,
                                zone if zone.startswith(self.settings.region) else None)
            except (BotoCoreError, ClientError) as exc:
                raise UnknownPriceError(f"no {market} price for {instance_type} in {zone}: "
                                        f"DescribeSpotPriceHistory failed ({exc})") from exc

        def shape(instance_type: str) -> tuple[int | None, int | None]:
            known = instance_catalogue().get(instance_type)
            return (known.gpu_count, known.vcpus) if known else (None, None)

        return PoolRanker(
            price, shape,
            PoolCooldowns(self.config.state_dir / "aws" / f"{self.name}-pool-cooldowns.json"),
            self.config.reconcile.cooldown_s, self.config.log_dir,
            lambda: datetime.fromtimestamp(self._now(), timezone.utc))

    def list_instances(self) -> list[Instance]:
        """Every instance tagged with this cluster, any state (EC2 keeps terminated ones about
        an hour), sorted by node then launch time. One paginated DescribeInstances.

        Raises:
            ProviderError: the call failed.
        """
        records = self.describe({f"tag:{TAG_CLUSTER}": [self.config.cluster]})
        instances = [instance_from_ec2(r) for r in records]
        return sorted(instances, key=lambda i: (i.node or "", i.launch_time, i.instance_id))

    def terminate(self, nodes: Sequence[str]) -> list[Instance]:
        """Terminate every not yet terminated instance mapped to one of ``nodes`` (duplicates
        too). Idempotent; unknown node names are ignored. Returns the instances it terminated
        (as they were before). One DescribeInstances + one TerminateInstances per 1000 (more
        only when a batch fails: see :meth:`terminate_instances`).

        Raises:
            PartialTerminationError: some instances could not be terminated; every other one
                was (``terminated`` holds those instances, the message names the nodes).
            ProviderError: the listing failed, or a failure that no smaller batch can avoid
                (credentials, throttling, the endpoint).
        """
        wanted = set(nodes)
        node_sets = sorted({ns.name for n in wanted if (ns := self.config.node_set_of(n))})
        if not node_sets:
            return []
        records = self.describe(
            {f"tag:{TAG_CLUSTER}": [self.config.cluster], f"tag:{TAG_NODE_SET}": node_sets}
        )
        targets = [
            inst for inst in map(instance_from_ec2, records)
            if inst.node in wanted and inst.state is not InstanceState.TERMINATED
        ]
        try:
            self.terminate_instances([i.instance_id for i in targets])
        except PartialTerminationError as exc:
            raise PartialTerminationError(
                exc.failed, [i for i in targets if i.instance_id not in exc.failed],
                len(targets), {i.instance_id: i.node or "no node" for i in targets}) from exc
        return targets

    def terminate_instances(self, instance_ids: Sequence[str]) -> None:
        """TerminateInstances for ``instance_ids``, 1000 per call.

        EC2 fails a whole TerminateInstances when one of its ids cannot be terminated (an
        unknown id, termination protection in that zone: Amazon EC2 API Reference,
        TerminateInstances), so one bad instance would keep up to 999 others alive. A failed
        batch is therefore split in halves and each half sent again, down to single
        instances: every other instance is terminated, and the ones that fail alone are
        reported together at the end (k bad ids among n cost about 2 k log2(n) more calls).
        Ids EC2 does not know (gone long ago, malformed) are skipped: a batch refused with
        ``InvalidInstanceID.NotFound`` is first narrowed by a DescribeInstances
        ``instance-id`` filter (which ignores unknown ids). Errors that no smaller batch
        avoids (credentials, throttling after botocore's retries, no connection) are raised
        at once.

        Raises:
            PartialTerminationError: these ids could not be terminated; the rest were.
            ProviderError: a failure of the whole request (see above).
        """
        ids = list(dict.fromkeys(instance_ids))
        failed: dict[str, str] = {}
        for start in range(0, len(ids), _CHUNK):
            self._terminate_batch(ids[start : start + _CHUNK], failed, narrowed=False)
        if failed:
            raise PartialTerminationError(failed, [i for i in ids if i not in failed], len(ids))

    def _terminate_batch(self, ids: list[str], failed: dict[str, str], *, narrowed: bool) -> None:
        """One TerminateInstances for ``ids``; on an error of some instance, the halves again
        (ids that fail alone go into ``failed``). See :meth:`terminate_instances`."""
        from botocore.exceptions import ClientError

        if not ids:
            return
        try:
            self._call_raw(self.client.terminate_instances, InstanceIds=ids)
            return
        except ClientError as exc:
            error = from_client_error(exc)
            if error_kind(error.code).error_class in _WHOLE_REQUEST:
                raise _provider_error(exc) from exc
            if normalize_code(error.code) in _GONE and not narrowed:
                known = [r["InstanceId"] for r in self.describe({"instance-id": ids})]
                self._terminate_batch(known, failed, narrowed=True)
                return
            if normalize_code(error.code) in _GONE and len(ids) == 1:
                return  # gone: nothing to terminate
            if len(ids) == 1:
                failed[ids[0]] = f"{error.code}: {error.message}"
                log.error("cannot terminate %s: %s: %s", ids[0], error.code, error.message)
                return
            log.warning("TerminateInstances of %d instances failed (%s); halves again",
                        len(ids), error.code)
        half = len(ids) // 2
        self._terminate_batch(ids[:half], failed, narrowed=narrowed)
        self._terminate_batch(ids[half:], failed, narrowed=narrowed)

    # ---- Ec2Ops (used by FleetLauncher) -------------------------------------------------
    def describe(self, filters: dict[str, list[str]]) -> list[dict[str, Any]]:
        """DescribeInstances records matching ``filters`` (name -> values), all pages of up to
        1000 records.

        Raises:
            ProviderError: the call failed.
        """
        api_filters = [{"Name": k, "Values": v} for k, v in filters.items()]
        paginator = self.client.get_paginator("describe_instances")
        paging = {"PageSize": 1000}
        pages = self._call(
            lambda: list(paginator.paginate(Filters=api_filters, PaginationConfig=paging))
        )
        return [i for page in pages for r in page.get("Reservations", []) for i in r["Instances"]]

    def describe_launched(
        self, tokens: Sequence[str], instance_ids: Sequence[str]
    ) -> list[dict[str, Any]]:
        """DescribeInstances of the instances tagged with one of the launch ``tokens`` (one call
        per 1000 instances; a lookup by id would page). EC2 is eventually consistent: a new
        instance may be missing or lack its private IP for a moment, so this asks again (up to
        6 times, 0.2 s doubling) until every id in ``instance_ids`` is complete, and returns
        what it has then.

        Raises:
            ProviderError: the call failed.
        """
        found: dict[str, dict[str, Any]] = {}
        for attempt in range(6):
            for record in self.describe({f"tag:{TAG_LAUNCH}": list(tokens)}):
                found[record["InstanceId"]] = record
            if all(_complete(found.get(i)) for i in instance_ids) or attempt == 5:
                break
            self._sleep(0.2 * 2**attempt)
        return list(found.values())

    def create_fleet(self, params: dict[str, Any]) -> Attempt:
        """One CreateFleet call (one HTTP attempt); what it launched and its errors, including
        a whole-call failure as a single error. Never raises."""
        from botocore.exceptions import BotoCoreError, ClientError

        try:
            response = self.launch_client.create_fleet(**params)
        except ClientError as exc:
            return [], [from_client_error(exc)]
        except BotoCoreError as exc:
            return [], [_botocore_error(exc)]
        return fleet_instance_ids(response), fleet_errors(response)

    def create_tags(self, instance_ids: Sequence[str], tags: Sequence[tuple[str, str]]) -> None:
        """CreateTags on up to 1000 resources (retried while EC2 does not know the new ids yet).

        Raises:
            ProviderError: the call failed.
        """
        from botocore.exceptions import ClientError

        api_tags = [{"Key": k, "Value": v} for k, v in tags]
        for attempt in range(5):
            try:
                self._call_raw(self.client.create_tags, Resources=list(instance_ids), Tags=api_tags)
                return
            except ClientError as exc:
                if normalize_code(from_client_error(exc).code) not in _NOT_FOUND or attempt == 4:
                    raise _provider_error(exc) from exc
                self._sleep(0.2 * 2**attempt)

    def zone_of(self, subnet: str) -> str:
        """Availability zone of ``subnet``: from ``aws.subnet_zones``, else one DescribeSubnets
        for all of this provider's subnets (once per process); "" if that fails."""
        if subnet not in self._zones and not self._zones_looked_up:
            self._zones_looked_up = True
            subnets = sorted(
                {s for ns in self.config.node_sets if ns.provider == self.name and ns.aws
                 for s in ns.aws.subnets} - set(self._zones)
            )
            try:
                reply = self._call(self.client.describe_subnets, SubnetIds=subnets or [subnet])
                self._zones.update({s["SubnetId"]: s["AvailabilityZone"] for s in reply["Subnets"]})
            except ProviderError as exc:
                log.warning("cannot look up subnet zones: %s", exc)
        return self._zones.get(subnet, "")

    def spot_price(self, instance_type: str, zone: str) -> float | None:
        """Latest spot price (USD per hour) of ``instance_type`` in ``zone`` for Linux, from
        DescribeSpotPriceHistory; None when EC2 has none or the call fails."""
        try:
            reply = self._call(
                self.client.describe_spot_price_history,
                InstanceTypes=[instance_type], AvailabilityZone=zone,
                ProductDescriptions=["Linux/UNIX", "Linux/UNIX (Amazon VPC)"],
                StartTime=datetime.now(timezone.utc), MaxResults=10,
            )
        except ProviderError:
            return None
        prices = sorted(reply.get("SpotPriceHistory", []), key=lambda p: p["Timestamp"])
        return float(prices[-1]["SpotPrice"]) if prices else None

    # ---- helpers ------------------------------------------------------------------------
    def _call(self, fn: Callable[..., Any], **kwargs: Any) -> Any:
        """``fn(**kwargs)`` with every botocore error turned into ProviderError."""
        from botocore.exceptions import BotoCoreError, ClientError

        try:
            return fn(**kwargs)
        except (ClientError, BotoCoreError) as exc:
            raise _provider_error(exc) from exc

    def _call_raw(self, fn: Callable[..., Any], **kwargs: Any) -> Any:
        """``fn(**kwargs)``; ClientError passes through (the caller looks at its code),
        other botocore errors become ProviderError."""
        from botocore.exceptions import BotoCoreError

        try:
            return fn(**kwargs)
        except BotoCoreError as exc:
            raise _provider_error(exc) from exc


def _complete(record: dict[str, Any] | None) -> bool:
    """A launched instance's record is usable once it has a private IP (or has ended)."""
    if record is None:
        return False
    state = (record.get("State") or {}).get("Name")
    return bool(record.get("PrivateIpAddress")) or state in ("shutting-down", "terminated")


def _botocore_error(exc: Exception) -> FleetError:
    """A FleetError for a botocore error that is not an EC2 reply (no credentials, timeout)."""
    name = type(exc).__name__
    code = "NoCredentials" if name in ("NoCredentialsError", "PartialCredentialsError") else name
    return FleetError(code, str(exc))


def _provider_error(exc: Exception) -> ProviderError:
    """ProviderError (code, class) for a ClientError or another botocore error."""
    from botocore.exceptions import ClientError

    error = from_client_error(exc) if isinstance(exc, ClientError) else _botocore_error(exc)
    return ProviderError(error.code, error.message, error_kind(error.code).error_class.value)

