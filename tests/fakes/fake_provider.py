"""An in-memory provider that implements the Provider protocol, for reconciler tests."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from datetime import datetime, timedelta

from slurm_spot.providers.base import (
    Instance,
    InstanceState,
    LaunchRequest,
    LaunchResult,
)


class FakeProvider:
    """Instances in a dict; ``fail_listing`` makes :meth:`list_instances` raise."""

    def __init__(self, name: str = "local") -> None:
        self.name = name
        self.instances: dict[str, Instance] = {}
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
        ids = [i.instance_id for i in self.instances.values() if i.node in set(nodes)]
        self.terminate_instances(ids)
        return [self.instances[i] for i in ids]

    def launch(self, request: LaunchRequest) -> LaunchResult:
        raise NotImplementedError("the reconciler never launches")
