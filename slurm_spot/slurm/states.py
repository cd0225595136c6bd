"""Slurm node and job states, parsed once into a base state plus a set of flags.

Slurm prints a node state in several forms (see the scontrol, sinfo and squeue man pages):

- ``scontrol show node``: ``State=IDLE+CLOUD+POWERED_DOWN`` (base first, flags joined by ``+``);
- ``sinfo -o %t``: ``idle~``, with one-character suffixes ``*`` NOT_RESPONDING, ``~`` POWERED_DOWN,
  ``#`` POWERING_UP, ``!`` POWER_DOWN, ``%`` POWERING_DOWN, ``$`` MAINTENANCE, ``@`` REBOOT_REQUESTED,
  ``^`` REBOOT_ISSUED, ``-`` PLANNED; and short bases (``alloc``, ``mix``, ``drain``, ``drng``);
- ``sinfo --json`` of Slurm 22.05 (data_parser v0.0.38): ``state: "idle"`` plus
  ``state_flags: ["CLOUD", "POWERED_DOWN"]``;
- ``scontrol show node --json`` / ``sinfo --json`` of 23.02+: ``state: ["IDLE", "CLOUD", ...]``.

Decisions are taken on flags (predicates below), never on whole state strings: new flags appear
with every Slurm release.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

NODE_BASES = frozenset(
    {"IDLE", "ALLOCATED", "MIXED", "DOWN", "ERROR", "FUTURE", "UNKNOWN", "COMPLETING"}
)

_SHORT_BASES = {
    "idle": "IDLE",
    "alloc": "ALLOCATED",
    "allocated": "ALLOCATED",
    "mix": "MIXED",
    "mixed": "MIXED",
    "down": "DOWN",
    "err": "ERROR",
    "error": "ERROR",
    "fut": "FUTURE",
    "future": "FUTURE",
    "unk": "UNKNOWN",
    "unknown": "UNKNOWN",
    "comp": "COMPLETING",
    "completing": "COMPLETING",
    # DRAIN-ed and DRAINING nodes print a drain base in sinfo's short form.
    "drain": "IDLE",
    "drained": "IDLE",
    "drng": "ALLOCATED",
    "draining": "ALLOCATED",
    "resv": "IDLE",
    "maint": "IDLE",
    "boot": "IDLE",
    "inval": "UNKNOWN",
    "plnd": "IDLE",
    "pow_up": "IDLE",
    "powering_up": "IDLE",
    "npc": "IDLE",
    "blocked": "IDLE",
}
_SHORT_BASE_FLAGS = {
    "drain": {"DRAIN"},
    "drained": {"DRAIN"},
    "drng": {"DRAIN"},
    "draining": {"DRAIN"},
    "resv": {"RESERVED"},
    "maint": {"MAINTENANCE"},
    "boot": {"REBOOT_ISSUED"},
    "plnd": {"PLANNED"},
    "pow_up": {"POWERING_UP"},
    "powering_up": {"POWERING_UP"},
    "comp": set(),
    "inval": {"INVALID"},
}
_SUFFIX_FLAGS = {
    "*": "NOT_RESPONDING",
    "~": "POWERED_DOWN",
    "#": "POWERING_UP",
    "!": "POWER_DOWN",
    "%": "POWERING_DOWN",
    "$": "MAINTENANCE",
    "@": "REBOOT_REQUESTED",
    "^": "REBOOT_ISSUED",
    "-": "PLANNED",
}


@dataclass(frozen=True)
class NodeState:
    """A node state: ``base`` (``IDLE``, ``ALLOCATED``, ``MIXED``, ``DOWN``, ...) and ``flags``.

    The predicates are pure functions of the two fields.
    """

    base: str
    flags: frozenset[str] = field(default_factory=frozenset)

    def has(self, *flags: str) -> bool:
        """True if every flag in ``flags`` is set."""
        return all(f in self.flags for f in flags)

    @property
    def is_cloud(self) -> bool:
        return "CLOUD" in self.flags

    @property
    def is_powered_down(self) -> bool:
        """Powered down (``idle~``), including a node still flagged POWER_DOWN."""
        return "POWERED_DOWN" in self.flags

    @property
    def is_powering_up(self) -> bool:
        return "POWERING_UP" in self.flags

    @property
    def is_powering_down(self) -> bool:
        return "POWERING_DOWN" in self.flags or (
            "POWER_DOWN" in self.flags and "POWERED_DOWN" not in self.flags
        )

    @property
    def is_down(self) -> bool:
        return self.base == "DOWN"

    @property
    def is_drained(self) -> bool:
        return "DRAIN" in self.flags or "DRAINED" in self.flags or "DRAINING" in self.flags

    @property
    def is_responding(self) -> bool:
        return "NOT_RESPONDING" not in self.flags

    @property
    def has_jobs(self) -> bool:
        return self.base in {"ALLOCATED", "MIXED", "COMPLETING"} or "COMPLETING" in self.flags

    @property
    def wants_instance(self) -> bool:
        """Slurm expects a running instance behind this node (up, booting or busy)."""
        if self.is_powered_down or self.is_powering_down:
            return False
        return not self.is_down or self.is_powering_up

    def __str__(self) -> str:
        return "+".join([self.base, *sorted(self.flags)])


# Older spellings of flags (Slurm before 20.11 and some sinfo/scontrol forms) -> today's names.
# slurm.conf(5)/sinfo(1) 20.02: "POWER" (NODE_STATE_POWER_SAVE) is today's POWERED_DOWN;
# POWER_SAVE and POWER_UP are the long forms of the same two flags.
FLAG_ALIASES = {
    "POWER": "POWERED_DOWN",
    "POWER_SAVE": "POWERED_DOWN",
    "POWERED_OFF": "POWERED_DOWN",
    "POWER_UP": "POWERING_UP",
    "NO_RESPOND": "NOT_RESPONDING",
}


def _flag_words(parts: Iterable[str]) -> set[str]:
    """Flags from ``+``-joined words, each possibly with sinfo's one-character suffixes
    (``IDLE#``, ``CLOUD*``), old spellings mapped by :data:`FLAG_ALIASES`."""
    flags: set[str] = set()
    for part in parts:
        word = part.rstrip("".join(_SUFFIX_FLAGS))
        flags.update(_SUFFIX_FLAGS[c] for c in part[len(word):])
        if word:
            flags.add(FLAG_ALIASES.get(word, word))
    return flags


def parse_node_state(text: str) -> NodeState:
    """Parse ``scontrol show node`` ``State=`` text, or a ``sinfo %t``/``%T`` short form.

    Raises:
        ValueError: empty text or an unknown base state.
    """
    value = text.strip()
    if not value:
        raise ValueError("empty node state")
    if "+" in value or value.upper() == value:
        parts = value.upper().split("+")
        base = parts[0].rstrip("".join(_SUFFIX_FLAGS))
        flags = _flag_words([parts[0][len(base):], *parts[1:]])
        if base in NODE_BASES:
            return NodeState(base, frozenset(flags))
        if base.lower() in _SHORT_BASES:
            return _short(base.lower(), flags)
        raise ValueError(f"unknown node state {text!r}")
    return parse_sinfo_short(value)


def parse_sinfo_short(text: str) -> NodeState:
    """Parse sinfo's compact state (``idle~``, ``mix#``, ``down*``, ``drng``).

    Raises:
        ValueError: an unknown base.
    """
    value = text.strip()
    flags: set[str] = set()
    while value and value[-1] in _SUFFIX_FLAGS:
        flags.add(_SUFFIX_FLAGS[value[-1]])
        value = value[:-1]
    key = value.lower()
    if key not in _SHORT_BASES:
        raise ValueError(f"unknown sinfo node state {text!r}")
    return _short(key, flags)


def _short(key: str, flags: set[str]) -> NodeState:
    return NodeState(_SHORT_BASES[key], frozenset(flags | _SHORT_BASE_FLAGS.get(key, set())))


def parse_node_state_json(node: Mapping[str, Any]) -> NodeState:
    """Parse the state of one node object of ``sinfo --json`` / ``scontrol show node --json``.

    Accepts 22.05's ``state`` string with ``state_flags`` and 23.02+'s ``state`` list.

    Raises:
        ValueError: no ``state`` key or no known base in it.
    """
    raw = node.get("state")
    if raw is None:
        raise ValueError(f"node object without 'state': {dict(node)!r}")
    words = [raw] if isinstance(raw, str) else list(raw)
    words = [str(w).upper() for w in words] + [
        str(f).upper() for f in node.get("state_flags") or []]
    bases = [w.rstrip("".join(_SUFFIX_FLAGS)) for w in words
             if w.rstrip("".join(_SUFFIX_FLAGS)) in NODE_BASES]
    if not bases:
        raise ValueError(f"no base state in {raw!r}")
    first = next(w for w in words if w.rstrip("".join(_SUFFIX_FLAGS)) == bases[0])
    rest = [w for w in words if w is not first]
    return NodeState(bases[0], frozenset(_flag_words([first[len(bases[0]):], *rest])))


@dataclass(frozen=True)
class JobState:
    """A job state (``PENDING``, ``RUNNING``, ...) plus flags such as ``REQUEUED``."""

    base: str
    flags: frozenset[str] = field(default_factory=frozenset)

    @property
    def is_pending(self) -> bool:
        return self.base == "PENDING"

    @property
    def is_active(self) -> bool:
        return self.base in {"PENDING", "RUNNING", "CONFIGURING", "COMPLETING", "REQUEUED",
                             "SUSPENDED", "REQUEUE_HOLD", "REQUEUE_FED", "RESIZING", "SIGNALING",
                             "STAGE_OUT"}

    @property
    def is_finished(self) -> bool:
        return not self.is_active


JOB_BASES = frozenset(
    {"PENDING", "RUNNING", "SUSPENDED", "COMPLETED", "CANCELLED", "FAILED", "TIMEOUT", "NODE_FAIL",
     "PREEMPTED", "BOOT_FAIL", "DEADLINE", "OUT_OF_MEMORY", "COMPLETING", "CONFIGURING",
     "REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED", "RESIZING", "SIGNALING", "STAGE_OUT",
     "SPECIAL_EXIT", "REVOKED", "STOPPED", "RESV_DEL_HOLD"}
)


def parse_job_state(raw: str | Iterable[str]) -> JobState:
    """Parse a job state: a string (``PENDING``, ``CANCELLED by 0``) or 23.02+'s list form.

    Raises:
        ValueError: no known job state.
    """
    words = raw.replace("+", " ").split() if isinstance(raw, str) else list(raw)
    words = [w.upper() for w in words]
    bases = [w for w in words if w in JOB_BASES]
    if not bases:
        raise ValueError(f"unknown job state {raw!r}")
    return JobState(bases[0], frozenset(w for w in bases[1:]))


def parse_oneline(line: str, keys: Iterable[str] | None = None) -> dict[str, str]:
    """Parse one ``scontrol -o show node|job`` line into ``{key: value}``.

    Values may hold spaces and ``=`` (``Reason=Scheduler health check failed [root@...]``,
    ``CfgTRES=cpu=96,mem=1150000M``): a new key starts only where a space is followed by a word
    of the form ``Key=`` with a capitalised key. ``keys`` optionally restricts the result.
    A repeated key keeps its first value, so text a user wrote before a key (a job's name)
    can pose as it: read jobs with :mod:`slurm_spot.slurm.jobtext`, node lines through
    :func:`~slurm_spot.slurm.output.node_fields_text` (an admin's reason cut out first).
    """
    import re

    result: dict[str, str] = {}
    starts = [m.start() for m in re.finditer(r"(?:^|(?<= ))[A-Z][A-Za-z0-9_/:]*=", line)]
    for i, start in enumerate(starts):
        end = starts[i + 1] - 1 if i + 1 < len(starts) else len(line)
        key, _, value = line[start:end].partition("=")
        result.setdefault(key, value.strip())  # a repeated key is text of a value
    if keys is not None:
        wanted = set(keys)
        result = {k: v for k, v in result.items() if k in wanted}
    return result


def parse_gres_gpus(gres: str) -> tuple[str | None, int]:
    """The GPU type and count of a node's ``Gres=`` value (``gpu:a100:8(S:0-1)`` -> (a100, 8)).

    Returns ``(None, 0)`` when the node has no GPUs.
    """
    for item in gres.split(","):
        spec = item.split("(")[0]
        parts = spec.split(":")
        if parts[0] != "gpu":
            continue
        if len(parts) == 3:
            return parts[1], int(parts[2])
        if len(parts) == 2:
            return None, int(parts[1]) if parts[1].isdigit() else 1
    return None, 0
