"""Which preemption signal each job on a node under notice gets, and which processes get it.

A job written for another framework listens for another signal than spot.yaml's (Lightning's
``SLURMEnvironment(auto_requeue=True)`` for SIGUSR1, submitit for SIGUSR2, many stacks only for
SIGTERM), and a signal nobody catches kills the process it reaches (signal(7): the default
action of SIGHUP, SIGINT, SIGQUIT, SIGTERM, SIGUSR1 and SIGUSR2 ends the process). So, per job:

**Which signal** (first that applies):

1. the job's own ``--signal`` where Slurm shows it: the ``#SBATCH --signal=`` directives of its
   batch script (``scontrol write batch_script <job> -``; Slurm 22.05 records the submit line
   nowhere the watcher can read: ``scontrol show job`` and ``squeue --json`` omit ``--signal``);
2. else a signal its processes on this node catch (``SigCgt`` in ``/proc/<pid>/status``, proc(5)),
   tried in the order spot.yaml's ``preemption.signal``, SIGUSR1, SIGUSR2, SIGTERM. SIGINT is
   never probed: every Python process "catches" it with the handler that raises
   KeyboardInterrupt, which ends the program. ``srun`` is not counted: it catches these signals
   only to forward them to its step;
3. else spot.yaml's ``preemption.signal``.

**Who gets it** (the watcher runs as root on the node). The job's processes on this node come
from ``scontrol listpids <job> <node>`` (pid and step), else from ``/proc/*/environ``
(``SLURM_JOB_ID`` and ``SLURMD_NODENAME``, ``SLURM_STEP_ID`` for the step). Then:

- a job step (``srun``) is signalled with ``scancel -s SIG <job>.<step>``, which reaches every
  process of the step on every node of the job, if none of its processes here would die of
  the signal and at least one catches it. If one would (a DataLoader worker, a helper tool:
  Slurm signals every process of a step), only the step's processes here that catch it get it,
  by ``kill(2)``, and the event names the ones spared;
- in the batch step (the script and what it runs directly, without ``srun``) exactly the
  processes that catch the signal get it, by ``kill(2)``: ``scancel --full`` would also reach a
  shell that does not trap it, whose death ends the job;
- a job none of whose processes here catches the signal gets nothing now (it may still be in
  its prolog, or importing its libraries); :class:`JobSignaller` tries again on its next call.
  Such a job keeps running until the node is powered down, and Slurm requeues it then.

Every decision is an event (source ``watch``): ``signalled`` (signal, why, steps and pids) or
``signal_withheld`` (why), once per job and outcome. When ``scancel`` fails for a step (it
exits non-zero), a ``signal_failed`` event records its error and the step's processes on this
node that catch the signal get it by ``kill(2)`` instead (listed in ``signalled``'s ``pids``);
the step's processes on the job's other nodes are not reached this way: the collective stop
of the training loop (docs/DESIGN.md flow 4) carries the flag from this node's ranks to them.
"""

from __future__ import annotations

import logging
import os
import signal as signal_module
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from slurm_spot.config import SIGNAL_NAMES
from slurm_spot.contract.directives import option_values, read_directives
from slurm_spot.contract.jobenv import JobEnvError, SignalSpec, parse_signal
from slurm_spot.errors import BadInputError, SlurmCommandError
from slurm_spot.events import Action
from slurm_spot.rawtext import decode
from slurm_spot.slurm.client import SlurmClient

log = logging.getLogger(__name__)

# Signals whose default action ends the process (signal(7), "Term" and "Core").
_FATAL_BY_DEFAULT = frozenset(
    int(s) for s in (signal_module.SIGHUP, signal_module.SIGINT, signal_module.SIGQUIT,
                     signal_module.SIGTERM, signal_module.SIGUSR1, signal_module.SIGUSR2,
                     signal_module.SIGALRM, signal_module.SIGPIPE, signal_module.SIGABRT))
_PROBED = ("USR1", "USR2", "TERM")
# Processes that catch signals only to pass them on to a step we signal ourselves.
_FORWARDERS = frozenset({"srun"})


@dataclass(frozen=True)
class ProcInfo:
    """One process of a job on this node.

    Attributes:
        pid: process id.
        step: Slurm step id as text (``batch``, ``extern``, ``0``, ...).
        name: the command name (``Name:`` in /proc/<pid>/status, at most 15 characters).
        caught: signal numbers with a handler installed (``SigCgt``).
        ignored: signal numbers set to SIG_IGN (``SigIgn``).
    """

    pid: int
    step: str
    name: str
    caught: frozenset[int] = frozenset()
    ignored: frozenset[int] = frozenset()

    @property
    def forwards(self) -> bool:
        """True for ``srun``: it catches signals to forward them to its step's tasks."""
        return self.name in _FORWARDERS

    def catches(self, signum: int) -> bool:
        return signum in self.caught

    def survives(self, signum: int) -> bool:
        """False if ``signum`` would end this process (not caught, not ignored, fatal default)."""
        return signum in self.caught or signum in self.ignored or signum not in _FATAL_BY_DEFAULT


@dataclass(frozen=True)
class SignalPlan:
    """What one job gets.

    Attributes:
        job_id: the job (squeue's unique id).
        signal: Slurm's name without ``SIG`` (``USR1``), or None when nothing is sent.
        why: where the signal came from, in words (for the event log).
        steps: step ids to signal with ``scancel -s SIG <job>.<step>``.
        pids: processes to signal with kill(2): the batch step's that catch it, and those of a
            step that also has processes that would die of it.
        spared: processes not signalled because they would die of it, per step
            (``"0: pid 12 (python)"``); their step's catchers on this node got it by kill(2).
    """

    job_id: int
    signal: str | None
    why: str
    steps: tuple[str, ...] = ()
    pids: tuple[int, ...] = ()
    spared: tuple[str, ...] = ()

    @property
    def delivers(self) -> bool:
        return self.signal is not None and bool(self.steps or self.pids)


def _mask(hex_text: str) -> frozenset[int]:
    value = int(hex_text, 16)
    return frozenset(n for n in range(1, 65) if value >> (n - 1) & 1)


def parse_status(text: str, pid: int, step: str) -> ProcInfo:
    """A :class:`ProcInfo` from the text of ``/proc/<pid>/status`` (proc(5)).

    Raises:
        ValueError: the text has no ``SigCgt`` line.
    """
    fields = dict(line.split(":", 1) for line in text.splitlines() if ":" in line)
    if "SigCgt" not in fields:
        raise ValueError(f"/proc/{pid}/status has no SigCgt line")
    return ProcInfo(pid, step, fields.get("Name", "").strip(), _mask(fields["SigCgt"].strip()),
                    _mask(fields.get("SigIgn", "0").strip()))


def requested_signal(script: str | None) -> SignalSpec | None:
    """The last ``--signal`` among the batch script's ``#SBATCH`` directives (sbatch keeps the
    last of a repeated option), or None when it has none or it cannot be read."""
    if not script:
        return None
    try:
        values = option_values(read_directives(script).options(), "--signal")
        return parse_signal(values[-1]) if values else None
    except (BadInputError, JobEnvError):
        return None


def choose_signal(requested: SignalSpec | None, procs: Sequence[ProcInfo],
                  default: str) -> tuple[str, str]:
    """The signal for one job and why, as ``(name without SIG, reason)``; see the module
    docstring for the order. ``default`` is spot.yaml's ``preemption.signal``."""
    if requested is not None:
        return requested.name, f"its own --signal={requested.sbatch_value()} (batch script)"
    order = [default, *(s for s in _PROBED if s != default)]
    for name in order:
        number = SIGNAL_NAMES[name]
        catchers = [p for p in procs if not p.forwards and p.catches(number)]
        if catchers:
            who = ", ".join(f"{p.pid} ({p.name})" for p in catchers[:3])
            return name, f"its processes catch SIG{name}: {who}"
    return default, "spot.yaml preemption.signal (no process of the job catches another)"


def signal_number(name: str) -> int:
    """The number of signal ``name`` as :class:`~slurm_spot.contract.jobenv.SignalSpec`
    names it: a name without ``SIG`` (``USR1``, and every one sbatch's ``--signal`` takes:
    ``ALRM``, ``XCPU``, ...) or a number as text (``40``, a real-time signal).

    Raises:
        ValueError: neither a signal name nor a number.
    """
    if name in SIGNAL_NAMES:
        return SIGNAL_NAMES[name]
    if name.isdecimal():
        return int(name)
    try:
        return int(signal_module.Signals[f"SIG{name}"])
    except KeyError:
        raise ValueError(f"unknown signal {name!r}") from None


def plan_delivery(job_id: int, name: str, why: str, procs: Sequence[ProcInfo]) -> SignalPlan:
    """Which steps and batch processes of ``job_id`` get signal ``name`` (module docstring).

    Raises:
        ValueError: ``name`` is no signal (:func:`signal_number`)."""
    number = signal_number(name)
    steps: list[str] = []
    spared: list[str] = []
    by_step: dict[str, list[ProcInfo]] = {}
    for proc in procs:
        by_step.setdefault(proc.step, []).append(proc)
    pids = [p.pid for p in by_step.pop("batch", []) if not p.forwards and p.catches(number)]
    by_step.pop("extern", None)  # Slurm's own placeholder step (PrologFlags=contain)
    for step, members in sorted(by_step.items()):
        own = [p for p in members if not p.forwards]
        dying = [p for p in own if not p.survives(number)]
        if dying:
            spared.append(f"{step}: " + ", ".join(f"pid {p.pid} ({p.name})" for p in dying[:3]))
            pids += [p.pid for p in own if p.catches(number)]
        elif any(p.catches(number) for p in own):
            steps.append(step)
    if not steps and not pids:
        why = f"{why}; no process of the job on this node catches SIG{name} (yet)"
    return SignalPlan(job_id, name, why, tuple(steps), tuple(pids), tuple(spared))


def plan_signal(job_id: int, script: str | None, procs: Sequence[ProcInfo],
                default: str) -> SignalPlan:
    """:func:`choose_signal` then :func:`plan_delivery` for one job (pure)."""
    name, why = choose_signal(requested_signal(script), procs, default)
    return plan_delivery(job_id, name, why, procs)


def read_processes(job_id: int, node: str, listed: Iterable[tuple[int, str]] | None,
                   proc_root: Path = Path("/proc")) -> list[ProcInfo]:
    """The job's processes on this node with their signal dispositions.

    ``listed`` is ``scontrol listpids`` output as ``(pid, step)``; when None (scontrol could not
    tell) the processes are found by their environment. Processes that end meanwhile or
    cannot be read are left out.
    """
    pairs = list(listed) if listed is not None else _scan_environ(job_id, node, proc_root)
    found = []
    for pid, step in pairs:
        try:
            # Name: is the process's name, which its user sets (any bytes but NUL).
            text = decode((proc_root / str(pid) / "status").read_bytes())
            found.append(parse_status(text, pid, step))
        except (OSError, ValueError):
            continue
    return found


def _scan_environ(job_id: int, node: str, proc_root: Path) -> list[tuple[int, str]]:
    """``(pid, step)`` of processes whose environment says they belong to ``job_id`` on
    ``node`` (slurmstepd sets SLURM_JOB_ID, SLURMD_NODENAME and, for steps, SLURM_STEP_ID)."""
    found = []
    for entry in os.listdir(proc_root):
        if not entry.isdigit():
            continue
        try:
            raw = (proc_root / entry / "environ").read_bytes()
        except OSError:
            continue
        env = dict(item.split(b"=", 1) for item in raw.split(b"\0") if b"=" in item)
        if (env.get(b"SLURM_JOB_ID") == str(job_id).encode()
                and env.get(b"SLURMD_NODENAME", node.encode()) == node.encode()):
            found.append((int(entry), decode(env.get(b"SLURM_STEP_ID", b"batch"))))
    return found


EventSink = Callable[..., None]


@dataclass
class JobSignaller:
    """Delivers each job on a node under notice the signal it handles (module docstring).

    Args:
        slurm: the Slurm client (listpids, batch script, scancel).
        node: this node's Slurm name (the watcher runs on it, as root).
        default: spot.yaml's ``preemption.signal`` (name without ``SIG``).
        emit: ``emit(action, job_ids=..., reason=..., extra=...)`` records an event.
        proc_root: where /proc is (tests point it at a directory of their own).
        kill: ``os.kill``-like, for the batch-step processes.
    """

    slurm: SlurmClient
    node: str
    default: str
    emit: EventSink
    proc_root: Path = Path("/proc")
    kill: Callable[[int, int], None] = os.kill
    plans: dict[int, SignalPlan] = field(default_factory=dict)
    _scripts: dict[int, str | None] = field(default_factory=dict)

    def signalled(self, job_id: int) -> bool:
        """True once ``job_id`` got its signal."""
        plan = self.plans.get(job_id)
        return plan is not None and plan.delivers

    def deliver(self, jobs: Iterable[int],
                context: Mapping[str, object] | None = None) -> list[str]:
        """Signal every job of ``jobs`` not signalled yet; returns errors (one job's trouble
        never stops the others). Call again later for the jobs that had nothing to catch it.

        ``context`` (the caller's facts about the delivery, e.g. the watcher's ``when``,
        ``prewarmed`` and ``replacements``) is added to each ``signalled`` event's ``extra``,
        so one event per delivery says which signal, why, and when."""
        errors = []
        for job in jobs:
            if self.signalled(job):
                continue
            try:
                self._deliver_one(job, context or {})
            except SlurmCommandError as exc:
                log.error("signalling job %s: %s", job, exc)
                errors.append(str(exc))
        return errors

    def _deliver_one(self, job: int, context: Mapping[str, object]) -> None:
        if job not in self._scripts:
            self._scripts[job] = self.slurm.batch_script(job)
        procs = read_processes(job, self.node, self.slurm.list_pids(job, self.node),
                               self.proc_root)
        plan = plan_signal(job, self._scripts[job], procs, self.default)
        previous = self.plans.get(job)
        self.plans[job] = plan
        if not plan.delivers:
            if previous is None:
                self.emit(Action.SIGNAL_WITHHELD, job_ids=(job,), reason=plan.why,
                          extra={"signal": plan.signal, "spared": list(plan.spared)})
            return
        assert plan.signal is not None
        number = signal_number(plan.signal)
        steps, pids = list(plan.steps), list(plan.pids)
        for step in plan.steps:
            try:
                self.slurm.signal_step(job, step, plan.signal)
            except SlurmCommandError as exc:
                # Slurm could not deliver it (22.05 finds no step on a node whose name holds
                # a regex character, see config.NODE_SET_PATTERN): the step's processes here
                # that catch it get it by kill(2) instead, and the event says so.
                log.error("signalling job %s step %s: %s; using kill(2)", job, step, exc)
                fallback = [p.pid for p in procs
                            if p.step == step and not p.forwards and p.catches(number)]
                self.emit(Action.SIGNAL_FAILED, job_ids=(job,), reason=str(exc),
                          extra={"signal": plan.signal, "step": step, "fallback_pids": fallback})
                steps.remove(step)
                pids += fallback
        failed = []
        for pid in pids:
            try:
                self.kill(pid, number)
            except OSError as exc:
                failed.append(f"pid {pid}: {exc.strerror}")
        self.emit(Action.SIGNALLED, job_ids=(job,), reason=plan.why,
                  extra={**context, "signal": plan.signal, "steps": steps,
                         "pids": pids, "spared": list(plan.spared),
                         "kill_failed": failed})
