"""Reading the cluster: nodes (``scontrol show node`` / ``sinfo --json``), jobs (``squeue``,
``scontrol show job``, ``sacct``), job names, pids, ping; and the records they are read into
(:class:`Node`, :class:`Job`, :class:`JobRecord`). Nothing here changes Slurm's state: that is
:mod:`slurm_spot.slurm.actions`.
"""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from slurm_spot.errors import (
    BadInputError,
    HostlistError,
    SlurmCommandError,
    SlurmOutputError,
)
from slurm_spot.hostlist import compress, expand
from slurm_spot.slurm.jobtext import job_fields_text, split_job_records
from slurm_spot.slurm.output import (
    ReportedErrors,
    job_fields_json,
    load_json,
    local_time,
    node_fields_text,
    nodes_json,
    reported_errors,
)
from slurm_spot.slurm.runner import DEFAULT_TIMEOUT_S, CommandResult, CommandRunner, run_command
from slurm_spot.slurm.states import JobState, NodeState, parse_job_state
from slurm_spot.slurm.version import OLDEST_SUPPORTED, SlurmVersion

log = logging.getLogger(__name__)

# Where node records come from, tried in this order (see slurm_spot.slurm.output).
_NODE_SOURCES: dict[str, tuple[str, ...]] = {
    "scontrol-json": ("scontrol", "--json", "show", "node"),
    "sinfo-json": ("sinfo", "--json"),
    "text": (),
}


@dataclass(frozen=True)
class Node:
    """One node as ``scontrol show node`` reports it.

    ``addr``/``hostname`` are NodeAddr/NodeHostName; ``reason`` is the free text without the
    ``[user@time]`` suffix Slurm appends; ``jobs`` is filled by :meth:`SlurmClient.nodes` from
    squeue (running and completing jobs only); ``weight`` is the scheduling Weight slurmctld
    uses now (slurm.conf(5) Weight; ``scontrol update nodename=N weight=W`` changes it until
    slurmctld restarts or reconfigures, scontrol(1) of Slurm 22.05), None if not shown.
    ``instance_id``/``instance_type`` are the node's InstanceId/InstanceType (Slurm 23.11+,
    set by the resume hook; empty before 23.11 or when unset, which scontrol shows as
    ``(null)`` or ``N/A``). ``slurmd_start_time`` is SlurmdStartTime in Unix seconds: when the
    node's slurmd started, which slurmctld learns when it registers (None before that).
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
    instance_id: str = ""
    instance_type: str = ""
    slurmd_start_time: float | None = None


@dataclass(frozen=True)
class Job:
    """One job as ``squeue --json`` reports it. ``nodes`` is the allocated hostlist;
    ``submit_time``/``start_time`` are Unix seconds (squeue's ``submit_time``/``start_time``;
    a requeued job's start is its latest run's; None when unset or not yet known);
    ``features`` is its ``--constraint`` (squeue's ``features``, "" when none)."""

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
    submit_time: float | None = None
    start_time: float | None = None
    features: str = ""


class SlurmQueries:
    """The reads of :class:`~slurm_spot.slurm.client.SlurmClient` (its constructor arguments
    are described there), and the plumbing every call goes through (:meth:`run`,
    :attr:`version`, :meth:`job_ref`)."""

    def __init__(
        self,
        bin_dir: str | os.PathLike[str] = "/usr/bin",
        runner: CommandRunner = run_command,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        version: SlurmVersion | None = None,
    ) -> None:
        self.bin_dir = Path(bin_dir)
        self._run = runner
        self.timeout_s = timeout_s
        self._refs: dict[int, str] = {}
        self._node_source: str | None = None
        self._version = version

    @property
    def version(self) -> SlurmVersion:
        """The Slurm release of ``scontrol -V``, else of ``slurmctld -V`` (26.05's scontrol
        exits with "Could not establish a configuration source" when no slurm.conf is found,
        even for ``-V``); the oldest supported one (22.05, whose ways work everywhere) if
        neither says."""
        if self._version is None:
            try:
                out = self.run("scontrol", "-V", check=False).stdout
                self._version = SlurmVersion.parse(out)
            except (SlurmCommandError, BadInputError):
                sbin = self.bin_dir.parent / "sbin"
                found = SlurmVersion.detect(sbin_dir=str(sbin), bin_dir=str(self.bin_dir)) \
                    if self._run is run_command else None
                self._version = found or OLDEST_SUPPORTED
        return self._version

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
        """Nodes of the cluster (all nodes, or those of ``names`` that exist).

        Read from JSON where this Slurm has it (``scontrol --json show node``, 23.02+; else
        ``sinfo --json``, 22.05), else from ``scontrol -o show node`` text; see
        :mod:`slurm_spot.slurm.output`. The first call finds out which works and later calls
        use it. A node whose record cannot be read is logged and left out: one odd node never
        hides the others.

        Raises:
            SlurmCommandError: no source could be read (slurmctld down, ...).
        """
        wanted = list(names) if names is not None else None
        if wanted is not None and not wanted:
            return []
        records = self._node_records(wanted)
        if wanted is not None:
            keep = set(wanted)
            records = [r for r in records if r["name"] in keep]
        job_map = self._jobs_by_node() if with_jobs else {}
        return [Node(**r, jobs=tuple(job_map.get(r["name"], ()))) for r in records]

    def _node_records(self, wanted: list[str] | None) -> list[dict[str, Any]]:
        for source in ([self._node_source] if self._node_source else list(_NODE_SOURCES)):
            if source == "text":
                records = self._node_records_text(wanted)
                self._node_source = source  # only once it answered (slurmctld may be away)
                return records
            argv = _NODE_SOURCES[source]
            result = self.run(argv[0], *argv[1:], check=False)
            try:
                found = nodes_json(result.stdout) if result.returncode == 0 else None
            except ReportedErrors as exc:  # 22.05: exit 0, no nodes, the failure in "errors"
                raise self._reported_failure(result, str(exc)) from None
            if found is not None:
                self._node_source = source
                return found
            if self._node_source == source:  # it worked before: a real failure now
                raise SlurmCommandError([str(self.bin_dir / argv[0]), *argv[1:]],
                                        result.returncode, result.stderr or "no JSON nodes")
        raise AssertionError("unreachable: the text source always answers or raises")

    def _reported_failure(self, out: CommandResult, reported: str) -> SlurmCommandError:
        """The error for a JSON listing that exited 0 with only ``errors`` in it. Slurm 22.05
        says no more than "Unspecified error" (tests/data/slurm-json/22.05.8/*-controller-
        unreachable.json) and nothing on stderr, so ``scontrol ping`` is asked whether
        slurmctld answers; its words ("Slurmctld(primary) at HOST is DOWN") go into the
        error, where :func:`slurm_spot.lifecycle.power.controller_unreachable` and the status command
        find them."""
        detail = f"Slurm reported: {reported}"
        ping = self.run("scontrol", "ping", check=False)
        if ping.returncode != 0:
            lines = [ln.strip() for ln in (ping.stdout + "\n" + ping.stderr).splitlines()
                     if ln.strip() and not ln.startswith("*")]
            detail += f"; scontrol ping: {lines[0] if lines else f'exited {ping.returncode}'}"
        return SlurmCommandError(out.argv, out.returncode, detail)

    def _node_records_text(self, wanted: list[str] | None) -> list[dict[str, Any]]:
        args = ["-o", "show", "node"]
        if wanted is not None:
            args.append(compress(wanted))
        records = []
        for line in self.run("scontrol", *args).stdout.splitlines():
            if not line.startswith("NodeName="):
                continue
            try:
                records.append(node_fields_text(line))
            except ValueError as exc:
                log.error("skipping a node scontrol printed: %s", exc)
        return records

    def _jobs_by_node(self) -> dict[str, list[int]]:
        out = self.run("squeue", "-h", "-t", "RUNNING,COMPLETING,CONFIGURING",
                       "-o", "%A %F %K %N").stdout
        result: dict[str, list[int]] = {}
        for line in out.splitlines():
            parts = line.split()
            if len(parts) != 4 or not parts[0].isdigit():
                continue
            self._remember_ref(parts[0], parts[1], parts[2])
            try:
                names = expand(parts[3], allow_duplicates=True)
            except HostlistError as exc:  # one job's odd node list never stops the others
                log.error("job %s: cannot read its nodes: %s", parts[0], exc)
                continue
            for node in names:
                result.setdefault(node, []).append(int(parts[0]))
        return result

    def _remember_ref(self, job_id: str, array_id: str, task_id: str) -> None:
        if task_id.isdigit() and array_id.isdigit():
            self._refs[int(job_id)] = f"{array_id}_{task_id}"
        else:
            self._refs[int(job_id)] = job_id

    def known_refs(self, job_ids: Iterable[int]) -> dict[str, str]:
        """``{"12": "11_1"}`` for those of ``job_ids`` this client has seen to be array tasks
        (from its squeue reads; runs nothing), for events to show jobs as Slurm names them."""
        return {str(j): self._refs[j] for j in job_ids
                if j in self._refs and self._refs[j] != str(j)}

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
        out = self.run("squeue", *args)
        try:
            data = load_json(out.stdout) if out.stdout.strip() else {}
        except ValueError as exc:
            raise SlurmCommandError(out.argv, out.returncode, f"unreadable JSON: {exc}") from None
        errors = reported_errors(data)
        if errors:  # 22.05: exit 0 and no jobs when slurmctld cannot be asked
            raise self._reported_failure(out, "; ".join(errors))
        found = []
        for obj in data.get("jobs", []) if isinstance(data, dict) else []:
            try:
                found.append(_job_from_json(obj))
            except (KeyError, TypeError, ValueError) as exc:
                log.error("skipping a job squeue printed: %s", exc)
        if wanted is None:
            return found
        # Unique ids only: an array task's id can equal its array's id (see job_ref).
        return [j for j in found if j.job_id in wanted]

    def _learn_refs(self, job_ids: Sequence[int]) -> None:
        """One ``squeue -j <ids> -o "%A %F %K"`` for the Slurm names of ``job_ids``."""
        if not job_ids:
            return
        out = self.run("squeue", "-h", "-j", ",".join(str(j) for j in job_ids),
                       "-o", "%A %F %K", check=False).stdout
        for line in out.splitlines():
            parts = line.split()
            if len(parts) == 3 and parts[0].isdigit():
                self._remember_ref(*parts)
        for job in job_ids:  # not listed (ended): its own id is its name
            self._refs.setdefault(job, str(job))

    def sacct_runs(self, job_id: int) -> list[dict[str, str]] | None:
        """Every run of ``job_id`` as ``sacct -X -D`` reports it (one row per requeue):
        dicts with JobIDRaw, JobID (``<array job>_<task>`` for an array task), User, Start,
        End, NodeList, State and AdminComment.
        Returns None when accounting is not available (sacct fails: no slurmdbd).

        Raises:
            SlurmCommandError: sacct could not be run at all (missing, timeout)."""
        fields = ("JobIDRaw", "JobID", "User", "Start", "End", "NodeList", "State",
                  "AdminComment")
        result = self.run("sacct", "-j", str(job_id), "-X", "-D", "-n", "-P",
                          f"--format={','.join(fields)}", check=False)
        if result.returncode != 0:
            return None
        rows = []
        for line in result.stdout.splitlines():
            values = line.split("|", len(fields) - 1)
            if len(values) == len(fields):
                rows.append(dict(zip(fields, values, strict=True)))
        return rows

    def job_record(self, job_id: int | str) -> JobRecord | None:
        """One job as ``scontrol -o show job <job>`` reports it, finished jobs included (they
        stay in slurmctld's memory for MinJobAge, 300 s by default; slurm.conf(5), 22.05).
        None when slurmctld no longer knows the job. The first record is the job's own (an
        array's or a heterogeneous job's others follow; a user's text cannot come first).

        Raises:
            SlurmCommandError: scontrol failed for another reason (slurmctld down, ...), or
                the job's name and other text copy Slurm's own fields so that they cannot be
                told apart (:func:`~slurm_spot.slurm.jobtext.job_fields_text`).
        """
        result = self.run("scontrol", "-o", "show", "job", self.job_ref(job_id), check=False)
        if result.returncode != 0:
            text = (result.stderr + result.stdout).lower()
            if "invalid job id" in text:
                return None
            raise SlurmCommandError(result.argv, result.returncode, result.stderr)
        records = split_job_records(result.stdout)
        try:
            return parse_job_record(records[0]) if records else None
        except ValueError as exc:  # read as a failed scontrol: callers skip the job
            raise SlurmOutputError(result.argv, result.returncode, str(exc)) from None

    def job_owner_uid(self, job: str) -> int | None:
        """The uid owning ``job`` (``42``, an array task ``11_1``) as ``squeue -o %U`` says;
        None when Slurm does not know the job (ended, never was) or ``job`` is no job id.

        Raises:
            SlurmCommandError: squeue failed for another reason (slurmctld down, ...).
        """
        if not re.fullmatch(r"[0-9]+(_[0-9]+)?", job):
            return None
        result = self.run("squeue", "-h", "-j", job, "-o", "%U", check=False)
        if result.returncode != 0:
            if "invalid job id" in (result.stderr + result.stdout).lower():
                return None
            raise SlurmCommandError(result.argv, result.returncode, result.stderr)
        owners = result.stdout.split()
        return int(owners[0]) if owners and owners[0].isdigit() else None

    def job_records(self) -> list[JobRecord]:
        """Every job slurmctld holds (``scontrol -o show job``), finished ones included.

        A record that cannot be read (:func:`parse_job_record`) is logged and left out, so one
        user's name cannot hide every other job. A job id met twice means a name with a
        newline forged a record: that job is read again on its own (``scontrol show job N``
        prints only job N's records, its own first).

        Raises:
            SlurmCommandError: scontrol failed.
        """
        out = self.run("scontrol", "-o", "show", "job").stdout
        records: dict[int, JobRecord] = {}
        forged: set[int] = set()
        for text in split_job_records(out):
            try:
                record = parse_job_record(text)
            except ValueError as exc:
                log.error("skipping a job scontrol printed: %s", exc)
                continue
            if record.job_id in records:
                forged.add(record.job_id)
            records[record.job_id] = record
        for job_id in forged:
            again = self._job_record_or_none(job_id)
            if again is None or again.job_id != job_id:
                del records[job_id]
            else:
                records[job_id] = again
        return list(records.values())

    def _job_record_or_none(self, job_id: int) -> JobRecord | None:
        """:meth:`job_record`, None (logged) where its record cannot be read."""
        try:
            return self.job_record(job_id)
        except SlurmOutputError as exc:
            log.error("skipping job %d: %s", job_id, exc.stderr)
            return None

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

    def has_command(self, tool: str) -> bool:
        """True if Slurm tool ``tool`` (``scontrol``, ``sbatch``...) is an executable file in
        :attr:`bin_dir` (a machine without Slurm's client commands has none)."""
        return os.access(self.bin_dir / tool, os.X_OK)

    def partition_exists(self, name: str) -> bool:
        """True if Slurm knows partition ``name`` (``scontrol -o show partition NAME``, whose
        record starts ``PartitionName=NAME``; scontrol(1) 22.05-26.05).

        Raises:
            SlurmCommandError: scontrol could not be run or did not answer.
        """
        result = self.run("scontrol", "-o", "show", "partition", name, check=False)
        return result.returncode == 0 and f"PartitionName={name} " in result.stdout + " "

    def controller_host(self) -> str | None:
        """Where slurmctld runs: the address of ``SlurmctldHost[0]`` in ``scontrol show
        config`` (``SlurmctldHost[0] = name(addr)``), else its name; None when scontrol
        fails or shows none (slurm.conf(5) SlurmctldHost, 22.05-26.05).

        Raises:
            SlurmCommandError: scontrol could not be run or did not answer.
        """
        result = self.run("scontrol", "show", "config", check=False)
        found = re.search(r"^SlurmctldHost\[0\]\s*=\s*([^\s(]+)(?:\(([^)]+)\))?",
                          result.stdout, re.MULTILINE) if result.returncode == 0 else None
        return (found.group(2) or found.group(1)) if found else None

    def ping(self) -> bool:
        """True if slurmctld answers ``scontrol ping``."""
        result = self.run("scontrol", "ping", check=False)
        return result.returncode == 0 and "UP" in result.stdout


def _job_from_json(obj: dict) -> Job:
    return Job(**job_fields_json(obj))


@dataclass(frozen=True)
class JobRecord:
    """One job as ``scontrol -o show job`` reports it (finished jobs too, unlike squeue).

    ``exit_code`` is Slurm's ``<exit status>:<signal>`` (``0:0`` is success); ``requeue`` is
    False for a job submitted ``--no-requeue``; ``batch`` is False for salloc/srun jobs;
    ``end_time``, ``submit_time`` (a requeued job's is the requeue's) and ``eligible_time``
    (the earliest start: a requeued job's is ~121 s after its requeue on 22.05) are seconds
    since the epoch, None while unknown. ``het_job_id`` is the
    leader's job id (``HetJobId``) for a component of a heterogeneous job, whose batch script
    and BatchHost are the leader's (Slurm 22.05.8: ``scontrol write batch_script`` of
    component 1 prints a stub of that component's directives); None for any other job.
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
    het_job_id: int | None = None
    submit_time: float | None = None
    eligible_time: float | None = None


def parse_job_record(line: str) -> JobRecord:
    """One ``scontrol -o show job`` record (a line, or lines where a name holds newlines:
    :func:`~slurm_spot.slurm.jobtext.split_job_records`) as a :class:`JobRecord`, every
    field read from Slurm's own keys, never from what a job's name or comment repeats
    (:func:`~slurm_spot.slurm.jobtext.job_fields_text`).

    Raises:
        ValueError: no JobId, no known JobState, or a record whose user text copies Slurm's
            ``UserId=... GroupId=...`` section.
    """
    fields = job_fields_text(line)
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
        end_time=local_time(fields.get("EndTime", "")),
        het_job_id=int(fields["HetJobId"]) if fields.get("HetJobId", "").isdigit() else None,
        submit_time=local_time(fields.get("SubmitTime", "")),
        eligible_time=local_time(fields.get("EligibleTime", "")),
    )


def parse_job_json(obj: dict) -> Job:
    """One job object of ``squeue --json`` (22.05 or 23.02+) as a :class:`Job`."""
    return _job_from_json(obj)
