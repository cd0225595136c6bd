"""Node shapes (CPUs, memory, GPUs) of EC2 instance types, so an admin does not type them.

Looked up, in order: the shipped catalogue ``slurm_spot/data/aws_instance_types.yaml`` (common
GPU types: g4dn, g5, g6, p3, p4d, p5 families), a per-process cache, then EC2
DescribeInstanceTypes (EC2 API reference) when a client or provider settings are given. No
boto3 import happens unless the API is needed.

``render`` calls :func:`resolve_node_set_shape` to fill ``cpus``, ``memory_mib`` and ``gpus`` of
an AWS node set the admin left unset.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Mapping
from importlib import resources
from typing import Any

import yaml

from slurm_spot.config import AwsProviderConfig, NodeSetConfig
from slurm_spot.errors import BadInputError, ConfigError
from slurm_spot.providers.shapes import DEFAULT_MEMORY_FRACTION, NodeShape, fill_node_set_shape


class UnknownInstanceTypeError(BadInputError):
    """An instance type is neither in the catalogue nor known to DescribeInstanceTypes.

    Attributes:
        instance_type: the type asked for.
    """

    def __init__(self, instance_type: str, detail: str) -> None:
        self.instance_type = instance_type
        super().__init__(f"unknown EC2 instance type {instance_type!r}: {detail}")


@functools.lru_cache(maxsize=1)
def catalogue() -> Mapping[str, NodeShape]:
    """The shipped catalogue, instance type -> shape (read once per process).

    Raises:
        ValueError: the data file is malformed (a packaging bug).
    """
    text = resources.files("slurm_spot.providers.aws").joinpath("instance_types.yaml").read_text()
    data = yaml.safe_load(text) or {}
    shapes = {}
    for name, row in data.items():
        try:
            shapes[name] = NodeShape(
                instance_type=name,
                vcpus=int(row["vcpus"]),
                memory_mib=int(row["memory_mib"]),
                gpu_type=row.get("gpu"),
                gpu_count=int(row.get("gpus", 0)),
                gpu_memory_mib=int(row.get("gpu_memory_mib", 0)),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise ValueError(f"aws_instance_types.yaml: bad entry {name!r}: {exc}") from exc
    return shapes


def gres_type(gpu_name: str) -> str:
    """A GPU model as EC2 names it (``A10G``, ``H100``) as a Gres type (``a10g``)."""
    return re.sub(r"[^a-z0-9_]", "_", gpu_name.strip().lower())


def shape_from_api(record: Mapping[str, Any]) -> NodeShape:
    """A shape from one DescribeInstanceTypes ``InstanceTypes[]`` record (EC2 API reference,
    InstanceTypeInfo: VCpuInfo, MemoryInfo, GpuInfo)."""
    gpus = (record.get("GpuInfo") or {}).get("Gpus") or []
    return NodeShape(
        instance_type=str(record["InstanceType"]),
        vcpus=int(record["VCpuInfo"]["DefaultVCpus"]),
        memory_mib=int(record["MemoryInfo"]["SizeInMiB"]),
        gpu_type=gres_type(str(gpus[0]["Name"])) if gpus else None,
        gpu_count=sum(int(g.get("Count", 0)) for g in gpus),
        gpu_memory_mib=int((gpus[0].get("MemoryInfo") or {}).get("SizeInMiB", 0)) if gpus else 0,
        source="api",
    )


class ShapeResolver:
    """Catalogue first, then DescribeInstanceTypes, with an in-memory cache of API answers.

    Args:
        ec2_client: a boto3 EC2 client to ask; or
        settings: provider settings to build one from (region, endpoint, profile) on first need.
            With neither, only the catalogue is used.
    """

    def __init__(self, ec2_client: Any = None, settings: AwsProviderConfig | None = None) -> None:
        self._client = ec2_client
        self._settings = settings
        self._cache: dict[str, NodeShape] = {}

    def shape(self, instance_type: str) -> NodeShape:
        """The shape of ``instance_type``.

        Raises:
            UnknownInstanceTypeError: not in the catalogue and the API does not know it (or no
                API was given).
        """
        known = catalogue().get(instance_type) or self._cache.get(instance_type)
        if known:
            return known
        client = self._ec2()
        if client is None:
            raise UnknownInstanceTypeError(
                instance_type, "not in the shipped catalogue and no AWS API to ask"
            )
        from botocore.exceptions import BotoCoreError, ClientError

        try:
            reply = client.describe_instance_types(InstanceTypes=[instance_type])
        except ClientError as exc:
            code = exc.response.get("Error", {}).get("Code", "Unknown")
            raise UnknownInstanceTypeError(instance_type, f"DescribeInstanceTypes: {code}") from exc
        except BotoCoreError as exc:
            raise UnknownInstanceTypeError(instance_type, f"DescribeInstanceTypes: {exc}") from exc
        records = reply.get("InstanceTypes") or []
        if not records:
            raise UnknownInstanceTypeError(instance_type, "DescribeInstanceTypes does not know it")
        self._cache[instance_type] = shape_from_api(records[0])
        return self._cache[instance_type]

    def _ec2(self) -> Any:
        if self._client is None and self._settings is not None:
            from slurm_spot.providers.aws.session import boto_session

            session = boto_session(self._settings)
            self._client = session.client(
                "ec2", region_name=self._settings.region,
                endpoint_url=self._settings.endpoint_url or None,
            )
        return self._client


def node_shape(instance_type: str, *, ec2_client: Any = None,
               settings: AwsProviderConfig | None = None) -> NodeShape:
    """The shape of one instance type: catalogue, else DescribeInstanceTypes through
    ``ec2_client`` or a client built from ``settings``. Use a :class:`ShapeResolver` to keep
    API answers cached across calls.

    Raises:
        UnknownInstanceTypeError: see :meth:`ShapeResolver.shape`.
    """
    return ShapeResolver(ec2_client, settings).shape(instance_type)


def resolve_node_set_shape(
    node_set: NodeSetConfig,
    *,
    where: str = "",
    path: str = "<config>",
    resolver: ShapeResolver | None = None,
    memory_fraction: float = DEFAULT_MEMORY_FRACTION,
) -> NodeSetConfig:
    """``node_set`` with ``cpus``, ``memory_mib`` and ``gpus`` filled from its instance types
    wherever the admin left them unset, by the rule of :mod:`slurm_spot.providers.shapes`
    (types that differ in a field left unset are refused; a written field must fit every
    type). Memory is Slurm RealMemory: ``memory_fraction`` of the instance memory (MiB).

    Args:
        node_set: the node set as configured.
        where: its field path for messages, e.g. ``node_sets.0`` (default ``node_sets[<name>]``).
        path: the config file, for the error.
        resolver: where shapes come from (default: the catalogue only).
        memory_fraction: RealMemory / instance memory.

    Raises:
        ConfigError: an instance type is unknown (and a shape field is unset), the types'
            shapes differ, or a written field exceeds a type's; each problem names the field.
    """
    where = where or f"node_sets[{node_set.name}]"
    explicit = node_set.model_fields_set
    if not node_set.instance_types:
        return node_set
    resolver = resolver or ShapeResolver()
    shapes, problems = [], []
    for k, instance_type in enumerate(node_set.instance_types):
        try:
            shapes.append(resolver.shape(instance_type))
        except UnknownInstanceTypeError as exc:
            problems.append(
                f"{where}.instance_types.{k}: {exc}; set cpus, memory_mib and gpus explicitly"
            )
    if problems and {"cpus", "memory_mib", "gpus"} <= explicit:
        return node_set  # a written shape of types nobody knows: the admin's word
    if problems:
        raise ConfigError(path, problems)
    return fill_node_set_shape(node_set, shapes, where=where, path=path,
                               memory_fraction=memory_fraction)
