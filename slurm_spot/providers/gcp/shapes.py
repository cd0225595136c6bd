"""Compute Engine machine types' shapes: from the shipped catalogue (:func:`catalogue`), what
``render`` writes for a node set (:func:`resolve_node_set_shape`); from their names
(:func:`gce_machine_shape`), for ordering a node set's machine types per GPU
(:mod:`slurm_spot.providers.pool_order`).
"""

from __future__ import annotations

import functools
import re
from collections.abc import Mapping, Sequence
from importlib import resources

import yaml

from slurm_spot.config import NodeSetConfig
from slurm_spot.errors import ConfigError
from slurm_spot.providers.shapes import NodeShape, fill_node_set_shape

_GCE_BUNDLED = re.compile(r"^a\d+-[a-z]+gpu-(\d+)g(?:-|$)")
#: G2 machine type vCPUs -> attached L4 GPUs (Compute Engine "GPU machine types").
_G2_GPUS = {4: 1, 8: 1, 12: 1, 16: 1, 32: 1, 24: 2, 48: 4, 96: 8}


def gce_machine_shape(machine_type: str) -> tuple[int | None, int | None]:
    """(GPUs, vCPUs) of a Compute Engine machine type, from its name where the name tells
    (Compute Engine "GPU machine types": ``a2-highgpu-4g`` has 4 A100s, ``a2-megagpu-16g``
    16, ``g2-standard-24`` 2 L4s; ``n1-standard-8`` 8 vCPUs and no bundled GPU), else None."""
    gpus: int | None = None
    bundled = _GCE_BUNDLED.match(machine_type)
    if bundled:
        gpus = int(bundled.group(1))
    size = re.search(r"-(\d+)$", machine_type)
    vcpus = int(size.group(1)) if size and not bundled else None
    if machine_type.startswith("g2-standard-") and vcpus in _G2_GPUS:
        gpus = _G2_GPUS[vcpus]
    return gpus, vcpus


#: Families whose GPUs are attached to the machine type from the node set's ``gpus``
#: (``guestAccelerators``), not bundled with it (:func:`slurm_spot.providers.gcp.requests.
#: attaches_gpus`).
_ATTACHED_FAMILIES = ("n1-",)


@functools.lru_cache(maxsize=1)
def catalogue() -> Mapping[str, NodeShape]:
    """The shipped machine-type catalogue (``machine_types.yaml`` of this package: the GPU
    families a2, a3, g2 and N1), machine type -> shape, read once per process.

    Raises:
        ValueError: the data file is malformed (a packaging bug).
    """
    text = resources.files("slurm_spot.providers.gcp").joinpath("machine_types.yaml").read_text()
    shapes = {}
    for name, row in (yaml.safe_load(text) or {}).items():
        try:
            shapes[name] = NodeShape(
                instance_type=name, vcpus=int(row["vcpus"]), memory_mib=int(row["memory_mib"]),
                gpu_type=row.get("gpu"), gpu_count=int(row.get("gpus", 0)),
                gpus_attached=name.startswith(_ATTACHED_FAMILIES))
        except (KeyError, TypeError, ValueError) as exc:
            raise ValueError(f"machine_types.yaml: bad entry {name!r}: {exc}") from exc
    return shapes


def resolve_node_set_shape(node_set: NodeSetConfig, machine_types: Sequence[str], *,
                           where: str, path: str) -> NodeSetConfig:
    """``node_set`` with ``cpus``, ``memory_mib`` and ``gpus`` from its machine types (the
    catalogue, :func:`catalogue`) where spot.yaml left them unset, by the rule of
    :mod:`slurm_spot.providers.shapes`: an ``a2-highgpu-1g`` node set written with only its
    machine type renders 12 CPUs, 95 % of 85 GiB and ``gpu:a100:1``. An N1 machine type's
    GPUs are the node set's ``gpus`` (attached), so only its CPUs and memory come from here.

    Args:
        node_set: the node set as configured.
        machine_types: its machine types (``gcp.machine_type`` first, then ``instance_types``;
            empty with only an instance template: the node set is returned as written).
        where: its field path for messages (``node_sets.0``).
        path: the config file, for the error.

    Raises:
        ConfigError: a machine type is not in the catalogue while a shape field is unset, the
            types' shapes differ, or a written field exceeds what a type has.
    """
    if not machine_types:
        return node_set
    known = catalogue()
    unknown = [t for t in machine_types if t not in known]
    if unknown:
        if {"cpus", "memory_mib"} <= node_set.model_fields_set:
            return node_set  # the admin's word for a type the catalogue lacks
        raise ConfigError(path, [
            f"{where}.gcp.machine_type: Compute Engine machine type {t!r} is not in the "
            f"shipped catalogue (slurm_spot/providers/gcp/machine_types.yaml: the a2, a3, g2 "
            f"and n1 families); set cpus and memory_mib (and gpus) explicitly" for t in unknown])
    return fill_node_set_shape(node_set, [known[t] for t in machine_types], where=where,
                               path=path, field="gcp.machine_type and instance_types")
