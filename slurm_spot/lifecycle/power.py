"""Slurm's power-saving hooks: resume, suspend and resume-fail (slurm.conf(5): ResumeProgram,
SuspendProgram, ResumeFailProgram).

- :func:`resume` groups the nodes by node set, launches through each node set's provider in
  one request per node set, records NodeAddr/NodeHostName in Slurm, and sets every node it
  could not launch DOWN with a ``(Code:<code>)<message>`` reason, then POWER_DOWN, so slurmctld
  requeues the node's job at once instead of waiting out ResumeTimeout.
- :func:`suspend` and :func:`resume_fail` terminate every instance behind the nodes
  (duplicates too); both are idempotent.

Nodes are validated before anything is done: an unknown name changes nothing.
"""

from __future__ import annotations

import fcntl
import hashlib
import logging
import re
import time
from collections import defaultdict
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime, timezone

from slurm_spot import events
from slurm_spot.config import NodeSetConfig, SpotConfig
from slurm_spot.errors import PartialTerminationError, ProviderError, SlurmCommandError
from slurm_spot.hostlist import group_by_node_set
from slurm_spot.providers import get_provider
from slurm_spot.providers.base import (
    ErrorClass,
    Instance,
    LaunchFailure,
    LaunchRequest,
    Provider,
)
from slurm_spot.slurm.client import SlurmClient
from slurm_spot.slurm.reasons import launch_failure_reason

log = logging.getLogger(__name__)

ProviderFactory = Callable[[SpotConfig, str], Provider]


def provider_cache(factory: ProviderFactory) -> ProviderFactory:
    """``factory``, building each named provider once: one provider object (so one boto3
    session and its clients, one Compute API client) for a whole hook call or reconciler
    pass, instead of one per node set or per action (~0.2-0.4 s of CPU each for boto3)."""
    made: dict[tuple[int, str], Provider] = {}

    def get(config: SpotConfig, name: str) -> Provider:
        key = (id(config), name)
        if key not in made:
            made[key] = factory(config, name)
        return made[key]

    return get


@dataclass
class PowerResult:
    """What a hook did: instances launched or terminated, failures, and Slurm errors."""

    launched: list[Instance] = field(default_factory=list)
    terminated: list[Instance] = field(default_factory=list)
    failed: list[LaunchFailure] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, object]:
        return {
            "launched": [i.to_json() for i in self.launched],
            "terminated": [i.to_json() for i in self.terminated],
            "failed": [
                {"nodes": list(f.nodes), "code": f.code, "class": f.error_class.value,
                 "reason": f.reason}
                for f in self.failed
            ],
            "errors": self.errors,
        }


def client_token(cluster: str, nodes: list[str]) -> str:
    """A stable idempotency token for launching ``nodes`` (EC2 allows 64 ASCII chars)."""
    digest = hashlib.sha256(f"{cluster}:{','.join(sorted(nodes))}".encode()).hexdigest()
    return f"slurm-spot-{digest[:48]}"


def resume(
    config: SpotConfig,
    hostlist: str,
    slurm: SlurmClient,
    providers: ProviderFactory = get_provider,
    lock_timeout_s: float = 300.0,
    sleep: Callable[[float], None] = time.sleep,
    jobs: Mapping[int, Sequence[str]] | None = None,
) -> PowerResult:
    """Launch instances for ``hostlist`` (see the module docstring).

    Launches for one node set are serialized across processes (:func:`node_set_lock`).

    Args:
        jobs: job id -> the job's allocated nodes (``SLURM_RESUME_FILE``,
            :func:`slurm_spot.slurm.resume_file.read_resume_file`). With
            ``power.all_or_nothing``, a job with a node that got no instance gets its launched
            nodes given back at once (:func:`give_back_incomplete_jobs`).

    A failure for one node set (provider error, Slurm refusing an update) is recorded and the
    other node sets still proceed.

    Raises:
        HostlistError, UnknownNodeError: bad input; nothing was launched.
    """
    groups = group_by_node_set(config, hostlist)
    result = PowerResult()
    providers = provider_cache(providers)
    for set_name, nodes in groups.items():
        node_set = config.node_set(set_name)
        try:
            with node_set_lock(config, set_name, timeout_s=lock_timeout_s):
                _resume_node_set(config, node_set, nodes, slurm, providers, result, sleep)
        except TimeoutError as exc:
            # Another hook holds the set for longer than a launch takes: it is stuck. Leave
            # these nodes to it and to ResumeTimeout rather than risk a second instance.
            result.errors.append(str(exc))
    if jobs:
        flag_jobs_beyond_quota(config, jobs, slurm, result)
    if jobs and config.power.all_or_nothing:
        give_back_incomplete_jobs(config, jobs, slurm, providers, result)
    return result


def flag_jobs_beyond_quota(config: SpotConfig, jobs: Mapping[int, Sequence[str]],
                           slurm: SlurmClient, result: PowerResult) -> None:
    """A job that needs more of a quota than the quota is (3 nodes x 16 vCPU under a 32 vCPU
    quota) can never start, however long the back-off: its nodes get a reason naming the quota
    and the job, and the job is held (``scontrol hold``: it would only power nodes up, fail
    and be requeued for ever). The admin raises the quota and releases the job."""
    for failure in result.failed:
        if failure.error_class is not ErrorClass.QUOTA or not failure.quota_limit \
                or not failure.quota_per_node:
            continue
        failed = set(failure.nodes)
        for job_id, nodes in sorted(jobs.items()):
            if not failed & set(nodes):
                continue
            node_set = config.node_set_of(next(iter(failed & set(nodes))))
            same_set = [n for n in nodes if node_set is not None and config.node_set_of(n) is node_set]
            need = len(same_set) * failure.quota_per_node
            if need <= failure.quota_limit:
                continue
            unit = failure.quota_unit or "units"
            reason = launch_failure_reason(
                failure.code, f"quota: job {job_id} needs {need} {unit} ({len(same_set)} nodes "
                f"x {failure.quota_per_node}), more than the {failure.quota_limit} {unit} "
                "quota; job held until the quota is raised")
            mine = sorted(failed & set(nodes))
            events.record(config.log_dir, "resume", events.Action.LAUNCH_FAILED, mine,
                          reason=reason, job_ids=(job_id,),
                          extra={"code": failure.code, "class": "quota", "beyond_quota": True})
            try:
                slurm.set_state(mine, "DOWN", reason)
                slurm.set_state(mine, "POWER_DOWN", reason)
                slurm.run("scontrol", "hold", slurm.job_ref(job_id))
            except SlurmCommandError as exc:
                result.errors.append(f"job {job_id} beyond quota: {exc}")


def give_back_incomplete_jobs(
    config: SpotConfig, jobs: Mapping[int, Sequence[str]], slurm: SlurmClient,
    providers: ProviderFactory, result: PowerResult,
) -> None:
    """All-or-nothing per job: for each job with a node that got no instance (slurmctld
    requeues it when that node goes DOWN), terminate the instances just launched for the
    job's other nodes and power those nodes down (``POWER_DOWN_FORCE``) now, instead of
    leaving them to boot and idle until SuspendTime. Nodes shared with a job that got all its
    nodes are kept. Each step's failure is recorded in ``result.errors``; the rest proceeds.
    """
    failed = {n for f in result.failed for n in f.nodes}
    complete = {n for nodes in jobs.values() if not failed & set(nodes) for n in nodes}
    launched = {i.node: i for i in result.launched if i.node}
    victims: dict[str, int] = {}
    for job_id, nodes in sorted(jobs.items()):
        lost = sorted(failed & set(nodes))
        if not lost:
            continue
        for node in nodes:
            if node in launched and node not in complete:
                victims.setdefault(node, job_id)
    if not victims:
        return
    by_set: dict[str, list[Instance]] = defaultdict(list)
    for node in victims:
        node_set = config.node_set_of(node)
        if node_set is not None:
            by_set[node_set.name].append(launched[node])

    def why(inst: Instance) -> tuple[tuple[int, ...], str]:
        job = victims[inst.node or ""]
        return (job,), (f"all-or-nothing: job {job} could not get all its nodes "
                        f"({','.join(sorted(failed & set(jobs[job])))} failed)")

    for set_name, instances in by_set.items():
        if not _give_back(config, config.node_set(set_name), providers, instances, result,
                          why=why, failed="all-or-nothing: could not terminate {ids}: {exc}"):
            continue
        names = [i.node for i in instances if i.node]
        try:
            slurm.set_state(names, "POWER_DOWN_FORCE")
        except SlurmCommandError as exc:
            result.errors.append(f"all-or-nothing: {exc}")


@contextmanager
def node_set_lock(config: SpotConfig, node_set: str, timeout_s: float = 300.0) -> Iterator[None]:
    """Hold ``<state_dir>/locks/resume-<node set>.lock`` (``flock``, exclusive) while a hook
    launches for the node set.

    Two resume hooks for the same nodes at once (slurmctld runs ResumeProgram for every
    power-up request, and an admin may run ``slurm-spot power up``) then launch one after the
    other: the second one's provider lookup sees the first one's instances and starts nothing
    for them (providers launch only for nodes without an alive instance).

    Raises:
        TimeoutError: not acquired within ``timeout_s`` seconds (names the lock file).
    """
    path = config.state_dir / "locks" / f"resume-{node_set}.lock"
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as fh:
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    raise TimeoutError(
                        f"node set {node_set}: another resume still holds {path} after "
                        f"{timeout_s:g} s") from None
                time.sleep(0.1)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def _resume_node_set(
    config: SpotConfig,
    node_set: NodeSetConfig,
    nodes: list[str],
    slurm: SlurmClient,
    providers: ProviderFactory,
    result: PowerResult,
    sleep: Callable[[float], None] = time.sleep,
) -> None:
    request = LaunchRequest(config.cluster, node_set, tuple(nodes), client_token(config.cluster, nodes))
    # the start of the launch latency the reconciler measures (reconcile/latency.py)
    requested = datetime.now(timezone.utc).isoformat()
    try:
        outcome = providers(config, node_set.provider).launch(request)
        failures = list(outcome.failed)
        launched = list(outcome.launched)
    except ProviderError as exc:
        launched = []
        failures = [LaunchFailure(tuple(nodes), exc.code, str(exc).split(": ", 1)[-1],
                                  ErrorClass(exc.error_class))]
    result.launched.extend(launched)
    result.failed.extend(failures)
    for inst in launched:
        events.emit(config.log_dir, events.Event(
            events.Action.LAUNCHED, "resume", node=inst.node, instance=inst.instance_id,
            extra={"market": inst.market, "type": inst.instance_type, "zone": inst.zone,
                   "requested": requested}))
    addresses = {
        i.node: (i.private_ip, i.hostname or i.node)
        for i in launched
        if i.node and i.private_ip
    }
    if addresses:
        try:
            _record_addresses(slurm, addresses, sleep)
        except SlurmCommandError as exc:
            # An instance Slurm cannot reach is a leak: give it back now, tell the caller.
            result.errors.append(f"{exc}; terminating the instances just launched")
            _give_back(config, node_set, providers, launched, result,
                       why=lambda _: ((), "Slurm did not accept the node's address"),
                       failed="could not terminate {ids}: {exc}; the reconciler will")
    _record_instances(slurm, [i for i in launched if i in result.launched], result)
    for failure in failures:
        mark_launch_failed(config, slurm, failure, result)


# slurmctld restarting (systemctl restart, a failover) answers "Unable to contact slurm
# controller" for some seconds: retry the address update for up to ~60 s, well inside any
# ResumeTimeout, rather than give the instances back.
ADDRESS_RETRY_WAIT_S = (1.0, 2.0, 4.0, 8.0, 15.0, 30.0)


def _record_addresses(slurm: SlurmClient, addresses: dict[str, tuple[str, str]],
                      sleep: Callable[[float], None] = time.sleep) -> None:
    """``scontrol update nodeaddr=...`` with retries while slurmctld cannot be reached.

    Raises:
        SlurmCommandError: still failing after :data:`ADDRESS_RETRY_WAIT_S`, or refused for a
            reason other than an unreachable controller.
    """
    for wait_s in (*ADDRESS_RETRY_WAIT_S, None):
        try:
            slurm.set_addresses(addresses)
            return
        except SlurmCommandError as exc:
            if wait_s is None or not controller_unreachable(exc):
                raise
            log.warning("recording node addresses: %s; retrying in %g s", exc, wait_s)
            sleep(wait_s)


def controller_unreachable(exc: SlurmCommandError) -> bool:
    """scontrol could not talk to slurmctld at all (down, restarting, timed out): Slurm 22.05
    prints "Unable to contact slurm controller (connect failure)" or "Socket timed out";
    ``scontrol ping`` "Slurmctld(primary) at HOST is DOWN" (quoted by
    :meth:`SlurmClient.nodes` when a JSON listing held only errors)."""
    text = str(exc).lower()
    return exc.returncode is None or any(m in text for m in (
        "unable to contact slurm controller", "socket timed out", "connection refused",
        "connect failure", "zero bytes were transmitted")) \
        or re.search(r"slurmctld\(\w+\) at \S+ is down", text) is not None


def _record_instances(slurm: SlurmClient, launched: list[Instance], result: PowerResult) -> None:
    """Each node's InstanceId/InstanceType in Slurm (23.11+; a no-op before): the reconciler
    matches a node to its instance by id, which a cloud never reuses, where an address may be
    recycled or reported late. A refusal is only an error line: the node works without it."""
    ids = {i.node: (i.instance_id, i.instance_type or "") for i in launched if i.node}
    if not ids:
        return
    try:
        slurm.set_instances(ids)
    except SlurmCommandError as exc:
        result.errors.append(f"recording instance ids: {exc}")


def _give_back(config: SpotConfig, node_set: NodeSetConfig, providers: ProviderFactory,
               launched: list[Instance], result: PowerResult, *,
               why: Callable[[Instance], tuple[tuple[int, ...], str]],
               failed: str) -> bool:
    """Terminate the instances ``launched`` for ``node_set`` just now: they leave
    ``result.launched`` for ``result.terminated``, each with a ``terminated`` event whose job
    ids and reason are ``why(instance)``.

    Args:
        failed: the line added to ``result.errors`` when the provider refuses, a
            :meth:`str.format` template of ``{ids}`` (the instance ids) and ``{exc}``.

    Returns:
        True if terminated; False if the provider raised :class:`ProviderError` (caught: one
        line in ``result.errors``, ``result`` otherwise unchanged, no event).
    """
    ids = [i.instance_id for i in launched]
    try:
        providers(config, node_set.provider).terminate_instances(ids)
    except ProviderError as exc:
        result.errors.append(failed.format(ids=", ".join(ids), exc=exc))
        return False
    result.launched = [i for i in result.launched if i.instance_id not in set(ids)]
    result.terminated.extend(launched)
    for inst in launched:
        job_ids, reason = why(inst)
        events.emit(config.log_dir, events.Event(
            events.Action.TERMINATED, "resume", node=inst.node, instance=inst.instance_id,
            job_ids=job_ids, reason=reason))
    return True


def mark_launch_failed(
    config: SpotConfig, slurm: SlurmClient, failure: LaunchFailure, result: PowerResult
) -> None:
    """DOWN with ``(Code:X)...`` (slurmctld requeues the jobs at once), then POWER_DOWN so the
    node returns to ``idle~`` instead of staying in plain DOWN."""
    nodes = list(failure.nodes)
    events.record(config.log_dir, "resume", events.Action.LAUNCH_FAILED, nodes, reason=failure.reason,
                  extra={"code": failure.code, "class": failure.error_class.value,
                         "pool": failure.pool})
    try:
        slurm.set_state(nodes, "DOWN", failure.reason)
        slurm.set_state(nodes, "POWER_DOWN", failure.reason)
    except SlurmCommandError as exc:
        log.error("could not mark %s down: %s", ",".join(nodes), exc)
        result.errors.append(str(exc))


def terminate_nodes(
    config: SpotConfig,
    hostlist: str,
    source: str,
    providers: ProviderFactory = get_provider,
) -> PowerResult:
    """Terminate every instance behind ``hostlist`` (suspend and resume-fail).

    Idempotent: nodes without instances are fine. A provider error for one node set is
    recorded in ``errors`` and the others proceed; an instance the provider could not terminate
    is named in ``errors`` while the rest are terminated and recorded.

    Raises:
        HostlistError, UnknownNodeError: bad input; nothing was terminated.
    """
    groups = group_by_node_set(config, hostlist)
    by_provider: dict[str, list[str]] = defaultdict(list)
    for set_name, nodes in groups.items():
        by_provider[config.node_set(set_name).provider].extend(nodes)
    result = PowerResult()
    providers = provider_cache(providers)
    for provider_name, nodes in by_provider.items():
        try:
            ended = providers(config, provider_name).terminate(nodes)
        except PartialTerminationError as exc:  # the others were terminated: record them
            result.errors.append(f"{provider_name}: {exc}")
            ended = [i for i in exc.terminated if isinstance(i, Instance)]
        except ProviderError as exc:
            result.errors.append(f"{provider_name}: {exc}")
            continue
        result.terminated.extend(ended)
        for inst in ended:
            events.emit(config.log_dir, events.Event(
                events.Action.TERMINATED, source, node=inst.node, instance=inst.instance_id))
    return result


def suspend(config: SpotConfig, hostlist: str, providers: ProviderFactory = get_provider) -> PowerResult:
    """SuspendProgram: terminate the instances of nodes Slurm powers down."""
    return terminate_nodes(config, hostlist, "suspend", providers)


def resume_fail(
    config: SpotConfig, hostlist: str, providers: ProviderFactory = get_provider
) -> PowerResult:
    """ResumeFailProgram: nodes that did not register within ResumeTimeout. Terminate what is
    behind them; the reconciler returns the nodes to ``idle~``."""
    return terminate_nodes(config, hostlist, "resume-fail", providers)
