"""An in-memory provider that implements the Provider protocol, for the reconciler, the power
hooks, status and the other tests that need a cloud without one."""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import replace
from datetime import datetime, timedelta, timezone

from slurm_spot.providers.base import (
    ErrorClass,
    Instance,
    InstanceState,
    LaunchFailure,
    LaunchRequest,
    LaunchResult,
)


class FakeProvider:
    """Instances in a dict (instance id -> :class:`Instance`).

    Args:
        name: the provider's name (``Provider.name``).
        capacity: how many alive instances it can hold; a launch beyond it fails for the
            nodes left over with ``InsufficientInstanceCapacity`` (a capacity error, as a
            cloud answers). None: the test expects no launch at all (the reconciler never
            launches), and :meth:`launch` raises AssertionError naming the request.
        launch_delay_s: seconds between a launch's look-up of alive instances and its
            creating the missing ones (an API round trip): two unserialised launches of the
            same nodes then both create.

    ``fail_listing`` makes :meth:`list_instances` raise; ``fail_terminate`` holds instance
    ids whose termination fails; ``requests`` holds every launch request, in order.
    """

    def __init__(self, name: str = "local", capacity: int | None = None,
                 launch_delay_s: float = 0.0) -> None:
        self.name = name
        self.capacity = capacity
        self.launch_delay_s = launch_delay_s
        self.instances: dict[str, Instance] = {}
        self.requests: list[LaunchRequest] = []
        self.fail_listing: Exception | None = None
        self.fail_terminate: set[str] = set()
        self.listings = 0

    def add(self, node: str | None, age_s: float, now: datetime,
            state: InstanceState = InstanceState.RUNNING, instance_id: str | None = None,
            ip: str = "10.0.0.1", reason: str = "", market: str = "spot") -> Instance:
        instance_id = instance_id or f"i-{len(self.instances) + 1:04d}"
        inst = Instance(instance_id, node, node.rsplit("-", 1)[0] if node else None, state,
                        market, "g5.xlarge", "us-east-1a", now - timedelta(seconds=age_s),
                        private_ip=ip, hostname=node, state_reason=reason)
        self.instances[instance_id] = inst
        return inst

    def alive(self, node: str | None = None) -> list[str]:
        return sorted(i.instance_id for i in self.instances.values()
                      if i.state.is_alive and node in (None, i.node))

    def list_instances(self) -> list[Instance]:
        self.listings += 1
        if self.fail_listing is not None:
            raise self.fail_listing
        return list(self.instances.values())

    def terminate_instances(self, instance_ids: Sequence[str]) -> None:
        for instance_id in instance_ids:
            if instance_id in self.fail_terminate:
                raise RuntimeError(f"terminate {instance_id}: RequestLimitExceeded")
            inst = self.instances.get(instance_id)
            if inst is not None and inst.state.is_alive:
                self.instances[instance_id] = replace(
                    inst, state=InstanceState.TERMINATED, state_reason="Terminated by slurm-spot")

    def terminate(self, nodes: Sequence[str]) -> list[Instance]:
        """As the Provider contract says: every alive instance of ``nodes`` is terminated and
        returned; already-gone ones are skipped (a second call returns [])."""
        ids = [i.instance_id for i in self.instances.values()
               if i.node in set(nodes) and i.state.is_alive]
        self.terminate_instances(ids)
        return [self.instances[i] for i in ids]

    def launch(self, request: LaunchRequest) -> LaunchResult:
        """One instance per node of ``request`` that has no alive one (a node that has one
        gets it back), PENDING, with private IP ``10.0.0.<n>`` (n: instances so far, from 1)
        and hostname ``ip-<node>``, while ``capacity`` allows.

        Raises:
            AssertionError: ``capacity`` is None (the test expects no launch).
        """
        if self.capacity is None:
            raise AssertionError(f"unexpected launch of {list(request.nodes)} on {self.name}")
        self.requests.append(request)
        alive = {i.node: i for i in self.instances.values() if i.state.is_alive}
        if self.launch_delay_s:
            time.sleep(self.launch_delay_s)
        launched, short = [], []
        for node in request.nodes:
            if node in alive:
                launched.append(alive[node])
            elif len(self.alive()) >= self.capacity:
                short.append(node)
            else:
                count = len(self.instances) + 1
                inst = Instance(f"i-{count:04d}", node, request.node_set.name,
                                InstanceState.PENDING, "spot", "g5.xlarge", "us-east-1a",
                                datetime.now(timezone.utc), f"10.0.0.{count}", f"ip-{node}")
                self.instances[inst.instance_id] = inst
                launched.append(inst)
        failed = (LaunchFailure(tuple(short), "InsufficientInstanceCapacity",
                                "no g5 in us-east-1a", ErrorClass.CAPACITY),) if short else ()
        return LaunchResult(tuple(launched), failed)
