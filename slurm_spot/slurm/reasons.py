"""Node reasons slurm-spot writes and reads back, and the small time helpers they need: the
one home of their shapes. Each reason has its builder here, next to the parser that reads it
back (tests/test_reasons.py checks that every builder's reason parses back).

Every reason slurm-spot writes starts with a fixed tag, so the reconciler can tell its own
reasons from an admin's (docs/DESIGN.md, "Contract"): ``spot-interruption:<action>@<time>``
(watcher, reconciler: :func:`interruption_reason`), ``(Code:<provider code>)<message>``
(resume, cooldowns: :func:`launch_failure_reason`, :func:`cooldown_reason`) and
``slurm-spot:...`` (reconciler: :func:`lost_while_booting_reason`, :func:`breaker_reason`,
:func:`kill_task_failed_reason`). Times in reasons are UTC, ``2026-03-01T08:00:00Z``.
"""

from __future__ import annotations

import re
from datetime import datetime, timezone

from slurm_spot.slurm.states import NodeState

OUR_PREFIXES = ("spot-interruption:", "(Code:", "slurm-spot:")
_STAMP = r"\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}Z"
_STAMP_FORMAT = "%Y-%m-%dT%H:%M:%SZ"
_INTERRUPTION_RE = re.compile(rf"spot-interruption:(?P<action>[a-z][a-z_-]*)@(?P<when>{_STAMP})")
#: Slurm keeps a node reason of any length, but slurm-spot keeps its own to one line of at most
#: this many characters, so that ``sinfo -R`` and the status table stay readable.
MAX_REASON_CHARS = 200
# The exact shapes of the reasons slurm-spot writes: a reason an admin typed that merely starts
# like one (``slurm-spot: keep drained``, ``spot-interruption: check GPU 3``) is not ours.
OUR_REASONS = re.compile(
    rf"spot-interruption:[a-z][a-z_-]*@{_STAMP}"            # watcher, reconciler
    rf"|\(Code:[A-Za-z0-9_.:/-]+\)(\S.*)?"                    # resume failures, cooldowns
    rf"|slurm-spot:circuit-breaker: \d+ resume failures .*"    # reconciler breaker
    rf"|slurm-spot:instance lost while booting@{_STAMP}"      # reconciler
    rf"|slurm-spot:kill task failed, instance replaced@{_STAMP}",  # reconciler
    re.DOTALL,
)
# slurmctld's own reasons, exactly as Slurm 22.05 writes them (src/slurmctld/node_mgr.c,
# power_save.c); "Not responding, NIC swapped (ticket 42)" is an admin's.
SLURM_REASONS = re.compile(
    r"ResumeTimeout reached|Not responding"
    r"|Node unexpectedly rebooted( boot_time=\d+ last response=\d+)?"
)
#: slurmctld's reason when a step outlived UnkillableStepTimeout (slurm.conf(5) 22.05-26.05;
#: src/slurmctld/step_mgr.c drains the node with exactly this text).
KILL_TASK_FAILED = "Kill task failed"
#: slurmctld's reason for a node that registered less memory than its RealMemory
#: (node_mgr.c validate_node_specs, 22.05-26.05): "Low RealMemory (reported:15000 < 100.00% of
#: configured:16000)".
LOW_REAL_MEMORY = re.compile(
    r"Low RealMemory \(reported:(?P<reported>\d+) < [\d.]+% of configured:(?P<configured>\d+)\)")
BREAKER_PREFIX = "slurm-spot:circuit-breaker"
COOLDOWN_TEXT = "Temporarily disabled until "
_CODE_RE = re.compile(r"^\(Code:(?P<code>[^)]*)\)")
_COOLDOWN_RE = re.compile(r"^\(Code:(?P<code>[^)]*)\)Temporarily disabled until (?P<until>\S+)")


def utc_stamp(when: datetime) -> str:
    """``2026-03-01T08:00:00Z``: the time format of every reason slurm-spot writes."""
    return when.astimezone(timezone.utc).strftime(_STAMP_FORMAT)


def _parse_stamp(text: str) -> datetime | None:
    """The aware UTC time of a :func:`utc_stamp`, None if ``text`` is none."""
    try:
        return datetime.strptime(text, _STAMP_FORMAT).replace(tzinfo=timezone.utc)
    except ValueError:
        return None


def interruption_reason(action: str, when: datetime) -> str:
    """``spot-interruption:<action>@<UTC time>``: a node drained under a provider's notice
    (the watcher; ``action`` is the notice's: ``terminate``, ``stop``, ``rebalance``...) or
    found reclaimed without one (the reconciler: ``reclaimed``).

    Raises:
        ValueError: ``action`` is not a lowercase word (``[a-z][a-z_-]*``): the reason would
            not read back as slurm-spot's (:func:`parse_interruption`).
    """
    if not re.fullmatch(r"[a-z][a-z_-]*", action):
        raise ValueError(f"interruption action {action!r}: expected a lowercase word")
    return f"spot-interruption:{action}@{utc_stamp(when)}"


def parse_interruption(reason: str) -> tuple[str, datetime] | None:
    """``(action, when)`` of a reason written by :func:`interruption_reason`, else None (an
    admin's ``spot-interruption: check GPU 3`` included)."""
    found = _INTERRUPTION_RE.fullmatch(reason)
    when = _parse_stamp(found.group("when")) if found else None
    return (found.group("action"), when) if found and when else None


def lost_while_booting_reason(when: datetime) -> str:
    """``slurm-spot:instance lost while booting@<UTC time>``: the reconciler's reason for a
    node whose instance went away before its slurmd registered."""
    return f"slurm-spot:instance lost while booting@{utc_stamp(when)}"


def breaker_reason(failures: int, window_s: float, last: str) -> str:
    """``slurm-spot:circuit-breaker: <n> resume failures within <s> s, last: <reason>``: the
    reconciler's reason for a node it stops resuming, cut to :data:`MAX_REASON_CHARS`."""
    return (f"{BREAKER_PREFIX}: {failures} resume failures within {window_s:g} s, "
            f"last: {last or 'no reason'}")[:MAX_REASON_CHARS]


def launch_failure_reason(code: str, message: str) -> str:
    """``(Code:<code>)<message>``: the reason of a node whose instance could not be launched,
    ``code`` being the provider's error code; one line (runs of white space, newlines
    included, become one space) of at most :data:`MAX_REASON_CHARS` characters."""
    return " ".join(f"(Code:{code}){message}".split())[:MAX_REASON_CHARS]


def is_ours(reason: str) -> bool:
    """True if slurm-spot wrote ``reason``: it has the whole shape of one of slurm-spot's
    reasons (:data:`OUR_REASONS`), not just its first word."""
    return OUR_REASONS.fullmatch(reason) is not None


def is_clearable(reason: str) -> bool:
    """True if the reconciler may replace or clear ``reason``: empty, ours, or one of
    slurmctld's own power-saving reasons. Anything else is an admin's."""
    return not reason or is_ours(reason) or SLURM_REASONS.fullmatch(reason) is not None


def reason_code(reason: str) -> str | None:
    """The provider code of a ``(Code:X)...`` reason, else None."""
    match = _CODE_RE.match(reason)
    return match.group("code") if match else None


def kill_task_failed_reason(when: datetime) -> str:
    """``slurm-spot:kill task failed, instance replaced@<UTC time>``: the reason written on
    a node drained ``Kill task failed`` whose instance the reconciler powers down."""
    return f"slurm-spot:kill task failed, instance replaced@{utc_stamp(when)}"


def low_memory_of(reason: str) -> tuple[int, int] | None:
    """``(reported, configured)`` MiB of slurmctld's ``Low RealMemory`` reason, else None."""
    found = LOW_REAL_MEMORY.fullmatch(reason)
    return (int(found.group("reported")), int(found.group("configured"))) if found else None


def low_memory_reason(reported_mib: int, configured_mib: int) -> str:
    """The reason written on a node powered down for ``Low RealMemory``: what to do. It is
    deliberately not one of :data:`OUR_REASONS`, so the node stays drained (an admin's
    reason) until the config is fixed: powering it up again would only repeat the drain."""
    return (f"slurm-spot:low RealMemory {reported_mib} < {configured_mib} MiB: set memory_mib"
            f" <= {reported_mib} for its node set in spot.yaml, render, scontrol reconfigure,"
            f" then resume")


def cooldown_reason(code: str, until: datetime) -> str:
    """``(Code:<code>)Temporarily disabled until <UTC time>``."""
    return f"(Code:{code}){COOLDOWN_TEXT}{utc_stamp(until)}"


def parse_cooldown(reason: str) -> tuple[str, datetime] | None:
    """``(code, until)`` of a reason written by :func:`cooldown_reason`, else None."""
    match = _COOLDOWN_RE.match(reason)
    until = _parse_stamp(match.group("until")) if match else None
    return (match.group("code"), until) if match and until else None


def parse_slurm_time(text: str) -> datetime | None:
    """A Slurm timestamp (``2026-03-01T08:00:00``, local time of slurmctld) as aware UTC;
    None for ``None``/``Unknown``/empty."""
    try:
        return datetime.fromisoformat(text).astimezone(timezone.utc)
    except ValueError:
        return None


def short_state(state: NodeState) -> str:
    """sinfo's compact form of a state (``idle~``, ``mix#``, ``down*``, ``drain~``), for
    metrics labels and the status table."""
    base = {"ALLOCATED": "alloc", "MIXED": "mix", "COMPLETING": "comp"}.get(
        state.base, state.base.lower())
    if state.is_drained:
        base = {"idle": "drain", "alloc": "drng", "mix": "drng"}.get(base, f"{base}+drain")
    for flag, suffix in (("POWERED_DOWN", "~"), ("POWERING_UP", "#"), ("POWERING_DOWN", "%"),
                         ("POWER_DOWN", "!"), ("NOT_RESPONDING", "*")):
        if flag in state.flags:
            return base + suffix
    return base
