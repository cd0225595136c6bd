"""A node set's shape (CPUs, memory, GPUs) from its machine types, for every provider.

A provider knows what each of its instance types offers (:class:`NodeShape`: the EC2 catalogue
and DescribeInstanceTypes, :mod:`slurm_spot.providers.aws.catalog`; the Compute Engine
machine-type catalogue, :mod:`slurm_spot.providers.gcp.shapes`). :func:`fill_node_set_shape`
turns those into the node set ``render`` writes (``CPUs``, ``RealMemory``, ``Gres``), one rule
for all providers:

- a field spot.yaml leaves unset comes from the types, which must agree on it: every type of
  the node set has the same vCPUs, the same GPUs (model and count) and memory within
  :data:`MEMORY_SPREAD` of each other. Types that differ are refused with each type's shape,
  never rendered with the smallest: Slurm has one line per node set, so a ``g5.12xlarge``
  launched on a line written for a ``g5.xlarge`` would show 1 of its 4 GPUs. Split such a node
  set (one per shape; the cost order and the failover move jobs between them) or write the
  field;
- a field spot.yaml writes must fit every type: no more CPUs, memory or GPUs than a type has
  (slurmd registers what it finds, and slurmctld drains a node short of its line,
  slurm.conf(5) NodeName). A smaller value is the admin's choice and is kept.

``RealMemory`` is :data:`DEFAULT_MEMORY_FRACTION` of the type's memory: the kernel and firmware
keep some of it (ParallelCluster's SchedulableMemory default is the same 95 %).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from slurm_spot.config import GpuSpec, NodeSetConfig
from slurm_spot.errors import ConfigError

#: Slurm RealMemory as a fraction of an instance type's memory.
DEFAULT_MEMORY_FRACTION = 0.95
#: How far the memory of a node set's types may differ (largest / smallest - 1) before they
#: count as different shapes: within it the smallest times the fraction fits all of them.
MEMORY_SPREAD = 0.05


@dataclass(frozen=True)
class NodeShape:
    """What one instance of a type offers.

    Attributes:
        instance_type: ``g5.xlarge``, ``a2-highgpu-1g``.
        vcpus: vCPUs (Slurm CPUs).
        memory_mib: instance memory, MiB (EC2 ``MemoryInfo.SizeInMiB``, GCE ``memoryMb``),
            not Slurm RealMemory.
        gpu_type: lower-case GPU model for ``Gres=gpu:<type>:<n>`` (``a10g``), None without GPUs.
        gpu_count: GPUs per instance (0 without).
        gpu_memory_mib: memory of one GPU, MiB (0 if unknown).
        source: ``catalogue`` or ``api``.
        gpus_attached: the type's GPUs are not its own but attached from the node set's
            ``gpus`` (Compute Engine N1 ``guestAccelerators``): its GPU fields say nothing.
    """

    instance_type: str
    vcpus: int
    memory_mib: int
    gpu_type: str | None = None
    gpu_count: int = 0
    gpu_memory_mib: int = 0
    source: str = "catalogue"
    gpus_attached: bool = False

    def real_memory_mib(self, fraction: float = DEFAULT_MEMORY_FRACTION) -> int:
        """Slurm RealMemory (MiB) for this type: ``fraction`` of the instance memory."""
        return max(1, int(self.memory_mib * fraction))

    def describe(self) -> str:
        """``g5.xlarge (4 CPUs, 16384 MiB, 1 a10g)`` for messages."""
        gpus = ("GPUs attached" if self.gpus_attached else
                f"{self.gpu_count} {self.gpu_type}" if self.gpu_count else "no GPU")
        return f"{self.instance_type} ({self.vcpus} CPUs, {self.memory_mib} MiB, {gpus})"


def fill_node_set_shape(node_set: NodeSetConfig, shapes: Sequence[NodeShape], *,
                        where: str, path: str, field: str = "instance_types",
                        memory_fraction: float = DEFAULT_MEMORY_FRACTION) -> NodeSetConfig:
    """``node_set`` with ``cpus``, ``memory_mib`` and ``gpus`` taken from ``shapes`` (one per
    machine type of the node set) where spot.yaml left them unset, after checking the rule of
    the module docstring.

    Args:
        node_set: the node set as configured.
        shapes: the shape of each of its machine types, in the order written (not empty).
        where: its field path for messages (``node_sets.0``).
        path: the config file, for the error.
        field: the field that names the types, for messages (``instance_types``,
            ``gcp.machine_type``).
        memory_fraction: RealMemory / instance memory.

    Raises:
        ConfigError: the types differ in a field spot.yaml leaves unset, or a written field
            exceeds what a type has; each problem names the field and the types' shapes.
    """
    explicit = node_set.model_fields_set
    names = ", ".join(s.instance_type for s in shapes)
    listed = "; ".join(s.describe() for s in shapes)
    problems: list[str] = []
    update: dict[str, Any] = {}
    split = f"split the node set (one per shape) or set {{}} explicitly ({field}: {listed})"
    if "cpus" in explicit:
        short = [s for s in shapes if s.vcpus < node_set.cpus]
        if short:
            problems.append(f"{where}.cpus: {node_set.cpus} is more than "
                            f"{', '.join(s.describe() for s in short)} has")
    elif len({s.vcpus for s in shapes}) > 1:
        problems.append(f"{where}.cpus: {names} have different vCPUs; " + split.format("cpus"))
    else:
        update["cpus"] = shapes[0].vcpus
    if "memory_mib" in explicit:
        short = [s for s in shapes if s.memory_mib < node_set.memory_mib]
        if short:
            problems.append(f"{where}.memory_mib: {node_set.memory_mib} MiB is more than "
                            f"{', '.join(s.describe() for s in short)} has")
    elif max(s.memory_mib for s in shapes) > min(s.memory_mib for s in shapes) * (1 + MEMORY_SPREAD):
        problems.append(f"{where}.memory_mib: {names} differ in memory by more than "
                        f"{MEMORY_SPREAD:.0%}; " + split.format("memory_mib"))
    else:
        update["memory_mib"] = min(s.real_memory_mib(memory_fraction) for s in shapes)
    own = [s for s in shapes if not s.gpus_attached]
    if "gpus" in explicit:
        wanted = node_set.gpus.count if node_set.gpus else 0
        short = [s for s in own if s.gpu_count < wanted]
        if short:
            problems.append(f"{where}.gpus: {wanted} GPUs are more than "
                            f"{', '.join(s.describe() for s in short)} has")
    elif own and len({(s.gpu_type, s.gpu_count) for s in own}) > 1:
        problems.append(f"{where}.gpus: {', '.join(s.instance_type for s in own)} have different "
                        "GPUs; " + split.format("gpus"))
    elif own and len(own) < len(shapes) and any(s.gpu_count for s in own):
        problems.append(f"{where}.gpus: {names} mix GPUs of the machine type and attached ones; "
                        + split.format("gpus"))
    elif own and len(own) == len(shapes):
        gpu_type, count = own[0].gpu_type, own[0].gpu_count
        update["gpus"] = GpuSpec(type=gpu_type, count=count) if gpu_type and count else None
    if problems:
        raise ConfigError(path, problems)
    return node_set.model_copy(update=update)
