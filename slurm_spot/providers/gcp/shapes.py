"""Compute Engine machine types' shapes as their names tell them (Compute Engine "GPU machine
types"), for ordering a node set's machine types per GPU (:mod:`slurm_spot.providers.pool_order`).
"""

from __future__ import annotations

import re

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
