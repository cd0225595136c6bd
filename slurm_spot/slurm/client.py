"""The only code that runs Slurm commands (``scontrol``, ``sinfo``, ``squeue``, ``sbatch``).

Every call is an argv list with a timeout, through one :class:`CommandRunner`, so tests can
substitute a fake runner. A failing command raises :class:`~slurm_spot.errors.SlurmCommandError`
carrying its stderr; nothing is swallowed.
"""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from slurm_spot.errors import SlurmCommandError
from slurm_spot.hostlist import compress
from slurm_spot.slurm.states import (
    JobState,
    NodeState,
    parse_job_state,
    parse_node_state,
    parse_oneline,
)

DEFAULT_TIMEOUT_S = 30.0
# scontrol accepts a hostlist of any length, but keep each argv well under ARG_MAX.
_MAX_NODES_PER_UPDATE = 2000


@dataclass(frozen=True)
class CommandResult:
    """What a command printed and returned."""

    argv: list[str]
    returncode: int
    stdout: str
    stderr: str


class CommandRunner(Protocol):
    """Runs one argv list; raises SlurmCommandError on timeout or a missing program."""

    def __call__(self, argv: list[str], timeout_s: float) -> CommandResult: ...


def run_command(argv: list[str], timeout_s: float,
                env: Mapping[str, str] | None = None) -> CommandResult:
    """Run ``argv`` (no shell, stdin closed), capture its output: the one runner of every
    command slurm-spot runs to completion (Slurm's, ``sbatch``, ``slurmctld -V``, ``ip``, the
    demo's own CLI calls). ``env`` replaces the environment when given. (Daemons that outlive
    the call, the local provider's instances and the local slurmctld's reconciler, are started
    detached with ``subprocess.Popen`` where they are managed.)

    Raises:
        SlurmCommandError: no answer within ``timeout_s`` seconds, or the program cannot run
            (missing, not executable). A non-zero exit is returned, not raised.
    """
    try:
        proc = subprocess.run(  # noqa: S603 - argv list, no shell
            argv, capture_output=True, text=True, timeout=timeout_s, check=False,
            stdin=subprocess.DEVNULL, env=None if env is None else dict(env),
        )
    except subprocess.TimeoutExpired as exc:
        raise SlurmCommandError(argv, None, f"no answer within {timeout_s:g} s") from exc
    except OSError as exc:
        raise SlurmCommandError(argv, None, f"cannot run {argv[0]}: {exc.strerror}") from exc
    return CommandResult(argv, proc.returncode, proc.stdout, proc.stderr)


@dataclass(frozen=True)
class Node:
    """One node as ``scontrol show node`` reports it.

    ``addr``/``hostname`` are NodeAddr/NodeHostName; ``reason`` is the free text without the
    ``[user@time]`` suffix Slurm appends; ``jobs`` is filled by :meth:`SlurmClient.nodes` from
    squeue (running and completing jobs only); ``weight`` is the scheduling Weight slurmctld
    uses now (slurm.conf(5) Weight; ``scontrol update nodename=N weight=W`` changes it until
    slurmctld restarts or reconfigures, scontrol(1) of Slurm 22.05), None if not shown.
    """

    name: str
    state: NodeState
    reason: str = ""
    addr: str = ""
    hostname: str = ""
    partitions: tuple[str, ...] = ()
    jobs: tuple[int, ...] = ()
    boot_time: str = ""
    weight: int | None = None


@dataclass(frozen=True)
class Job:
    """One job as ``squeue --json`` reports it. ``nodes`` is the allocated hostlist."""

    job_id: int
    state: JobState
    name: str = ""
    reason: str = ""
    nodes: str = ""
    partition: str = ""
    restarts: int = 0
    array_job_id: int | None = None
    array_task_id: int | None = None
    user: str = ""
    flags: frozenset[str] = field(default_factory=frozenset)


def _strip_reason(reason: str) -> str:
    """Drop the ``[user@2026-01-01T00:00:00]`` suffix that scontrol appends to a reason."""
    text = reason.strip()
    if text.endswith("]") and " [" in text:
        text = text[: text.rindex(" [")]
    return "" if text == "none" else text


class SlurmClient:
    """Access to a Slurm cluster through its command-line tools.

    Args:
        bin_dir: directory of scontrol/sinfo/squeue/sbatch (absolute: hooks run with no PATH).
        runner: how to run a command (default: :func:`run_command`).
        timeout_s: per-command timeout in seconds.
    """

    def __init__(
        self,
        bin_dir: str | os.PathLike[str] = "/usr/bin",
        runner: CommandRunner = run_command,
        timeout_s: float = DEFAULT_TIMEOUT_S,
    ) -> None:
        self.bin_dir = Path(bin_dir)
        self._run = runner
        self.timeout_s = timeout_s
        self._refs: dict[int, str] = {}

    # -- plumbing ---------------------------------------------------------------------------
    def run(self, tool: str, *args: str, check: bool = True) -> CommandResult:
        """Run Slurm tool ``tool`` with ``args``.

        Raises:
            SlurmCommandError: non-zero exit (when ``check``), timeout, or missing program.
        """
        argv = [str(self.bin_dir / tool), *args]
        result = self._run(argv, self.timeout_s)
        if check and result.returncode != 0:
            raise SlurmCommandError(argv, result.returncode, result.stderr or result.stdout)
        return result

    # -- nodes ------------------------------------------------------------------------------
    def nodes(self, names: Iterable[str] | None = None, with_jobs: bool = True) -> list[Node]:
        """Nodes as ``scontrol -o show node`` reports them (all nodes, or ``names``).

        Raises:
            SlurmCommandError: scontrol failed (slurmctld down, unknown node name, ...).
        """
        args = ["-o", "show", "node"]
        wanted = list(names) if names is not None else None
        if wanted is not None:
            if not wanted:
                return []
            args.append(compress(wanted))
        out = self.run("scontrol", *args).stdout
        job_map = self._jobs_by_node() if with_jobs else {}
        nodes = []
        for line in out.splitlines():
            if not line.startswith("NodeName="):
                continue
            fields = parse_oneline(line)
            name = fields["NodeName"]
            nodes.append(
                Node(
                    name=name,
                    state=parse_node_state(fields.get("State", "UNKNOWN")),
                    reason=_strip_reason(fields.get("Reason", "")),
                    addr=fields.get("NodeAddr", ""),
                    hostname=fields.get("NodeHostName", ""),
                    partitions=tuple(p for p in fields.get("Partitions", "").split(",") if p),
                    jobs=tuple(job_map.get(name, ())),
                    boot_time=fields.get("BootTime", ""),
                    weight=int(fields["Weight"]) if fields.get("Weight", "").isdigit() else None,
                )
            )
        return nodes

    def _jobs_by_node(self) -> dict[str, list[int]]:
        out = self.run("squeue", "-h", "-t", "RUNNING,COMPLETING,CONFIGURING",
                       "-o", "%A %F %K %N").stdout
        from slurm_spot.hostlist import expand

        result: dict[str, list[int]] = {}
        for line in out.splitlines():
            parts = line.split()
            if len(parts) != 4 or not parts[0].isdigit():
                continue
            self._remember_ref(parts[0], parts[1], parts[2])
            for node in expand(parts[3]):
                result.setdefault(node, []).append(int(parts[0]))
        return result

    def _remember_ref(self, job_id: str, array_id: str, task_id: str) -> None:
        if task_id.isdigit() and array_id.isdigit():
            self._refs[int(job_id)] = f"{array_id}_{task_id}"
        else:
            self._refs[int(job_id)] = job_id

    def job_ref(self, job_id: int | str) -> str:
        """Slurm's name for a job in scontrol/scancel: ``<array job id>_<task id>`` for an
        array task, else the id. Job ids here are squeue's unique ids (``%A``), and a task's
        unique id can equal its array's id, which scancel/scontrol would read as the whole
        array (squeue(1): ``%A``, ``%F``, ``%K``). A string is taken as Slurm's name as is."""
        if isinstance(job_id, str):
            return job_id  # already Slurm's name for it (e.g. from SLURM_ARRAY_* variables)
        text = str(job_id)
        if job_id not in self._refs:
            out = self.run("squeue", "-h", "-j", text, "-o", "%A %F %K", check=False).stdout
            for line in out.splitlines():
                parts = line.split()
                if len(parts) == 3 and parts[0] == text:
                    self._remember_ref(*parts)
        return self._refs.get(int(text), text)

    def update_nodes(self, names: Sequence[str], **settings: str) -> None:
        """``scontrol update nodename=<hostlist> key=value ...`` in as few calls as possible.

        Keys are scontrol's (``state``, ``reason``, ``nodeaddr``, ``nodehostname``, ...).
        ``nodeaddr``/``nodehostname`` are per node, so those go one node per call unless all
        values are lists given through :meth:`set_addresses`.

        Raises:
            SlurmCommandError: scontrol refused; its stderr is in the message.
        """
        names = list(names)
        for i in range(0, len(names), _MAX_NODES_PER_UPDATE):
            chunk = names[i : i + _MAX_NODES_PER_UPDATE]
            args = ["update", f"nodename={compress(chunk)}"]
            args += [f"{key}={value}" for key, value in settings.items()]
            self.run("scontrol", *args)

    def set_addresses(self, addresses: dict[str, tuple[str, str]]) -> None:
        """Record NodeAddr and NodeHostName: ``{node: (addr, hostname)}``.

        scontrol takes comma lists matched to the hostlist's order, so this is one call per
        chunk of nodes, not one per node.
        """
        names = sorted(addresses, key=_natural_key)
        for i in range(0, len(names), _MAX_NODES_PER_UPDATE):
            chunk = names[i : i + _MAX_NODES_PER_UPDATE]
            self.run(
                "scontrol", "update", f"nodename={','.join(chunk)}",
                f"nodeaddr={','.join(addresses[n][0] for n in chunk)}",
                f"nodehostname={','.join(addresses[n][1] for n in chunk)}",
            )

    def set_state(self, names: Sequence[str], state: str, reason: str | None = None) -> None:
        """Set ``state`` (DOWN, DRAIN, RESUME, POWER_DOWN, POWER_DOWN_FORCE, IDLE, ...).

        DOWN and DRAIN require a reason in Slurm; it is passed as one argv element, so it may
        hold spaces.
        """
        settings = {"state": state}
        if reason is not None:
            settings["reason"] = reason
        self.update_nodes(names, **settings)

    # -- jobs -------------------------------------------------------------------------------
    def jobs(self, job_ids: Iterable[int] | None = None) -> list[Job]:
        """Jobs from ``squeue --json`` (all, or ``job_ids``); finished jobs drop out.

        ``job_ids`` are also applied here: Slurm 22.05's ``squeue --json`` ignores ``--jobs``
        and lists every job it still holds (finished ones within MinJobAge too), so without
        this a caller asking for one job could read another's state. An array job id matches
        no other task.

        Raises:
            SlurmCommandError: squeue failed.
        """
        args = ["--json"]
        wanted: set[int] | None = None
        if job_ids is not None:
            wanted = {int(j) for j in job_ids}
            if not wanted:
                return []
            args += ["--jobs", ",".join(str(j) for j in sorted(wanted))]
        data = json.loads(self.run("squeue", *args).stdout or "{}")
        found = [_job_from_json(obj) for obj in data.get("jobs", [])]
        if wanted is None:
            return found
        # Unique ids only: an array task's id can equal its array's id (see job_ref).
        return [j for j in found if j.job_id in wanted]

    def requeue(self, job_id: int | str) -> bool:
        """``scontrol requeue <job>``. Returns False if the job was already pending/requeued.

        Raises:
            SlurmCommandError: any other refusal.
        """
        result = self.run("scontrol", "requeue", self.job_ref(job_id), check=False)
        if result.returncode == 0:
            return True
        text = (result.stderr + result.stdout).lower()
        if "pending" in text or "already" in text:
            return False
        raise SlurmCommandError(result.argv, result.returncode, result.stderr)

    def expedite(self, job_id: int | str) -> None:
        """Clear a requeued job's ~121 s requeue delay: ``scontrol update jobid=N StartTime=now``."""
        self.run("scontrol", "update", f"jobid={self.job_ref(job_id)}", "StartTime=now")

    def power_up(self, names: Sequence[str]) -> None:
        """Ask slurmctld to power ``names`` up now: ``scontrol update nodename=<hostlist>
        state=POWER_UP`` (scontrol(1) of Slurm 22.05 through 26.05; 24.05+ also spells it
        ``scontrol power up``). slurmctld runs ResumeProgram for them on the controller, so
        the caller needs no cloud credentials.

        Raises:
            SlurmCommandError: scontrol refused (unknown node, node not powered down, ...).
        """
        self.update_nodes(names, state="POWER_UP")

    def set_weight(self, names: Sequence[str], weight: int) -> None:
        """``scontrol update nodename=<hostlist> weight=<weight>``: slurmctld schedules with it
        until it restarts without ``-R`` or reconfigures (scontrol(1), Weight, Slurm 22.05).

        Raises:
            SlurmCommandError: scontrol refused.
        """
        self.update_nodes(names, weight=str(weight))

    def job_record(self, job_id: int | str) -> JobRecord | None:
        """One job as ``scontrol -o show job <job>`` reports it, finished jobs included (they
        stay in slurmctld's memory for MinJobAge, 300 s by default; slurm.conf(5), 22.05).
        None when slurmctld no longer knows the job.

        Raises:
            SlurmCommandError: scontrol failed for another reason (slurmctld down, ...).
        """
        result = self.run("scontrol", "-o", "show", "job", self.job_ref(job_id), check=False)
        if result.returncode != 0:
            text = (result.stderr + result.stdout).lower()
            if "invalid job id" in text:
                return None
            raise SlurmCommandError(result.argv, result.returncode, result.stderr)
        records = [parse_job_record(line) for line in result.stdout.splitlines()
                   if line.startswith("JobId=")]
        return records[0] if records else None

    def job_records(self) -> list[JobRecord]:
        """Every job slurmctld holds (``scontrol -o show job``), finished ones included.

        Raises:
            SlurmCommandError: scontrol failed.
        """
        out = self.run("scontrol", "-o", "show", "job").stdout
        return [parse_job_record(line) for line in out.splitlines() if line.startswith("JobId=")]

    def batch_script(self, job_id: int | str) -> str | None:
        """The job's batch script (``scontrol write batch_script <job> -``; root, an operator
        or the job's owner only, scontrol(1) 22.05). None when Slurm has none to give (not a
        batch job, job gone, no permission).

        Raises:
            SlurmCommandError: scontrol could not be run or did not answer.
        """
        result = self.run("scontrol", "write", "batch_script", self.job_ref(job_id), "-",
                          check=False)
        return result.stdout if result.returncode == 0 else None

    def list_pids(self, job_id: int, node: str) -> list[tuple[int, str]] | None:
        """``(pid, step)`` of the job's processes on ``node``, which must be the host this runs
        on: ``scontrol listpids <job> <node>`` (scontrol(1) 22.05: only processes spawned by
        Slurm on the local node and their descendants; the node name picks the slurmd when
        several run on one host). ``step`` is Slurm's step id: ``batch``, ``extern``, ``0``...
        None when scontrol cannot tell (no slurmd step daemon answered).

        Raises:
            SlurmCommandError: scontrol could not be run or did not answer.
        """
        result = self.run("scontrol", "listpids", str(job_id), node, check=False)
        if result.returncode != 0:
            return None
        found = []
        for line in result.stdout.splitlines():
            parts = line.split()
            if len(parts) >= 3 and parts[0].isdigit():
                found.append((int(parts[0]), parts[2]))
        return found

    def signal_step(self, job_id: int, step: str | None, signal: str) -> None:
        """``scancel -s SIG <job>[.<step>]``: every task of that step (all steps without one)
        on every node of the job; the batch shell is not signalled (scancel(1) 22.05).

        Raises:
            SlurmCommandError: scancel refused.
        """
        ref = self.job_ref(job_id)
        self.run("scancel", "-s", signal, f"{ref}.{step}" if step is not None else ref)

    def ping(self) -> bool:
        """True if slurmctld answers ``scontrol ping``."""
        result = self.run("scontrol", "ping", check=False)
        return result.returncode == 0 and "UP" in result.stdout


def _natural_key(name: str) -> tuple[str, int]:
    head = name.rstrip("0123456789")
    tail = name[len(head):]
    return head, int(tail) if tail else -1


def _number(value: object) -> int | None:
    """squeue --json numbers: plain ints (22.05) or ``{"set": true, "number": N}`` (23.02+)."""
    if isinstance(value, dict):
        return int(value["number"]) if value.get("set") else None
    if value is None or value == "":
        return None
    return int(value)  # type: ignore[call-overload]


def _job_from_json(obj: dict) -> Job:
    state = parse_job_state(obj.get("job_state", "UNKNOWN") or "PENDING")
    return Job(
        job_id=int(obj["job_id"]),
        state=state,
        name=str(obj.get("name", "")),
        reason=str(obj.get("state_reason", "")),
        nodes=str(obj.get("nodes", "")),
        partition=str(obj.get("partition", "")),
        restarts=_number(obj.get("restart_cnt")) or 0,
        array_job_id=_number(obj.get("array_job_id")) or None,
        array_task_id=_number(obj.get("array_task_id")),
        user=str(obj.get("user_name", "")),
        flags=state.flags,
    )


@dataclass(frozen=True)
class JobRecord:
    """One job as ``scontrol -o show job`` reports it (finished jobs too, unlike squeue).

    ``exit_code`` is Slurm's ``<exit status>:<signal>`` (``0:0`` is success); ``requeue`` is
    False for a job submitted ``--no-requeue``; ``batch`` is False for salloc/srun jobs;
    ``end_time`` is seconds since the epoch, None while unknown.
    """

    job_id: int
    state: JobState
    exit_code: str = "0:0"
    requeue: bool = True
    batch: bool = True
    restarts: int = 0
    nodes: str = ""
    batch_host: str = ""
    end_time: float | None = None


def _slurm_time(text: str) -> float | None:
    """scontrol's local ``2026-03-01T08:22:00`` as epoch seconds; None for Unknown/None."""
    from datetime import datetime

    try:
        return datetime.fromisoformat(text).timestamp()
    except ValueError:
        return None


def parse_job_record(line: str) -> JobRecord:
    """One ``scontrol -o show job`` line as a :class:`JobRecord`.

    Raises:
        ValueError: no JobId or no known JobState in the line.
    """
    fields = parse_oneline(line)
    restarts = fields.get("Restarts", "0")
    return JobRecord(
        job_id=int(fields["JobId"]),
        state=parse_job_state(fields.get("JobState", "")),
        exit_code=fields.get("ExitCode", "0:0"),
        requeue=fields.get("Requeue", "1") != "0",
        batch=fields.get("BatchFlag", "1") != "0",
        restarts=int(restarts) if restarts.isdigit() else 0,
        nodes="" if fields.get("NodeList", "(null)") == "(null)" else fields.get("NodeList", ""),
        batch_host=fields.get("BatchHost", ""),
        end_time=_slurm_time(fields.get("EndTime", "")),
    )


def parse_job_json(obj: dict) -> Job:
    """One job object of ``squeue --json`` (22.05 or 23.02+) as a :class:`Job`."""
    return _job_from_json(obj)
