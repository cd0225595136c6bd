"""The parts of the ``spot.yaml`` schema that need no pydantic: the name patterns and the
node-set arithmetic that both the pydantic models (:mod:`.models`) and the cached view of a
validated config (:mod:`.cache`) use, so a hook that finds its config in the cache imports
neither pydantic nor the models, and both answer alike.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import Path
from typing import Protocol, TypeVar

from slurm_spot.errors import BadInputError

DEFAULT_CONFIG_PATH = Path("/etc/slurm/spot.yaml")
DEFAULT_STATE_DIR = Path("/var/lib/slurm-spot")
NAME_PATTERN = r"^[a-z][a-z0-9-]{0,40}$"
# Node set names become node names (<name>-<i>): slurmctld takes any string there (slurm.conf(5)
# NodeName), so "." and "_" are allowed too; GCE instance names are checked by its provider.
# Not "+": slurmd 22.05 finds a job step's slurmstepd socket ("<node>_<job>.<step>" in its spool
# dir) with a regular expression built from the node name unescaped, so on a node named
# "a+b-1" `scancel -s USR2 <job>.<step>` fails with "Invalid job id specified" and the job never
# gets its preemption signal ("." happens to match itself; "+" means "one or more").
NODE_SET_PATTERN = r"^[a-z][a-z0-9._-]{0,40}$"
# slurm.conf(5) MaxTime: minutes, [days-]hours[:minutes[:seconds]], or INFINITE/UNLIMITED.
MAX_TIME_PATTERN = r"^(INFINITE|UNLIMITED|[0-9]+(-[0-9]{1,2})?(:[0-9]{1,2}){0,2})$"
SIGNAL_NAMES = {"USR1": 10, "USR2": 12, "TERM": 15, "INT": 2, "HUP": 1, "QUIT": 3, "URG": 23}
S3_ROOT_PATTERN = r"^s3://[a-z0-9][a-z0-9.-]{1,61}[a-z0-9](/.*)?$"
# AWS Spot Advisor bands -> the monthly interruption fraction each stands for (its midpoint;
# the open-ended top band is taken as 25 %).
BANDS: dict[str, float] = {
    "<5%": 0.025, "5-10%": 0.075, "10-15%": 0.125, "15-20%": 0.175, ">20%": 0.25,
}


def band_fraction(band: str) -> float:
    """The monthly interruption fraction (0-1) an AWS Spot Advisor band such as ``<5%`` or
    ``10-15%`` stands for (see :data:`BANDS`; spaces and a missing ``%`` are accepted).

    Raises:
        BadInputError: not one of the five bands.
    """
    key = re.sub(r"\s+", "", band)
    if key and not key.endswith("%"):
        key += "%"
    if key not in BANDS:
        raise BadInputError(f"interruption band {band!r}: use one of {', '.join(BANDS)}")
    return BANDS[key]


class NamedSet(Protocol):
    """What the node-set functions read of a node set (a model or its cached view)."""

    @property
    def name(self) -> str: ...

    @property
    def count(self) -> int: ...


NodeSetT = TypeVar("NodeSetT", bound=NamedSet)


def node_names(name: str, count: int) -> list[str]:
    """All node names of node set ``name`` with ``count`` nodes (``gpu-1``, ``gpu-2``, ...)."""
    return [f"{name}-{i}" for i in range(1, count + 1)]


def hostlist_of(name: str, count: int) -> str:
    """The node names as one Slurm hostlist expression (``gpu-[1-8]``)."""
    return f"{name}-[1-{count}]" if count > 1 else f"{name}-1"


def find_node_set(node_sets: Sequence[NodeSetT], name: str) -> NodeSetT:
    """The node set called ``name``. Raises ``KeyError`` if there is none."""
    for ns in node_sets:
        if ns.name == name:
            return ns
    raise KeyError(name)


def node_set_for(node_sets: Sequence[NodeSetT], node: str) -> NodeSetT | None:
    """The node set that produces node name ``node`` (``gpu-3`` -> ``gpu``), or None; ``gpu-03``
    is no node of ``gpu`` (Slurm's node names carry no leading zeros here)."""
    match = re.fullmatch(r"(.+)-(\d+)", node)
    if not match:
        return None
    for ns in node_sets:
        if ns.name == match.group(1) and 1 <= int(match.group(2)) <= ns.count:
            if str(int(match.group(2))) == match.group(2):
                return ns
    return None
