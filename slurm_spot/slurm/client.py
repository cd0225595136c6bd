"""The only code that runs Slurm commands (``scontrol``, ``sinfo``, ``squeue``, ``sbatch``).

Every call is an argv list with a timeout, through one :class:`CommandRunner`, so tests can
substitute a fake runner. A failing command raises :class:`~slurm_spot.errors.SlurmCommandError`
carrying its stderr; nothing is swallowed.
"""

from __future__ import annotations

import logging
import os
import re
import subprocess
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from slurm_spot.errors import BadInputError, HostlistError, SlurmCommandError
from slurm_spot.hostlist import compress, expand
from slurm_spot.slurm.output import job_fields_json, load_json, node_fields_text, nodes_json
from slurm_spot.slurm.states import JobState, NodeState, parse_job_state, parse_oneline
from slurm_spot.slurm.version import OLDEST_SUPPORTED, SlurmVersion

log = logging.getLogger(__name__)

DEFAULT_TIMEOUT_S = 30.0
# scontrol accepts a hostlist of any length, but keep each argv well under ARG_MAX.
_MAX_NODES_PER_UPDATE = 2000
# Job ids per ``scontrol update jobid=<list>`` (well under ARG_MAX too).
_MAX_JOBS_PER_UPDATE = 1000
# Where node records come from, tried in this order (see slurm_spot.slurm.output).
_NODE_SOURCES: dict[str, tuple[str, ...]] = {
    "scontrol-json": ("scontrol", "--json", "show", "node"),
    "sinfo-json": ("sinfo", "--json"),
    "text": (),
}


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
    a requeued job's start is its latest run's; None when unset or not yet known)."""

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


class SlurmClient:
    """Access to a Slurm cluster through its command-line tools.

    Args:
        bin_dir: directory of scontrol/sinfo/squeue/sbatch (absolute: hooks run with no PATH).
        runner: how to run a command (default: :func:`run_command`).
        timeout_s: per-command timeout in seconds.
        version: the Slurm release this talks to; None: asked once from ``scontrol -V``
            (which needs no slurmctld) when a version-dependent call first needs it.
    """

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
            found = nodes_json(result.stdout) if result.returncode == 0 else None
            if found is not None:
                self._node_source = source
                return found
            if self._node_source == source:  # it worked before: a real failure now
                raise SlurmCommandError([str(self.bin_dir / argv[0]), *argv[1:]],
                                        result.returncode, result.stderr or "no JSON nodes")
        raise AssertionError("unreachable: the text source always answers or raises")

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

    def set_instances(self, instances: dict[str, tuple[str, str]]) -> bool:
        """Record each node's cloud instance: ``{node: (instance id, instance type)}`` as the
        node's InstanceId/InstanceType (Slurm 23.11+, scontrol(1) 24.11: ``update
        NodeName=N InstanceId=I InstanceType=T``). The values are per node and scontrol takes
        one value per call, so the calls run up to 16 at a time.

        Returns False, doing nothing, on a Slurm older than 23.11, which has no such fields
        (the reconciler then matches by NodeAddr, as before).

        Raises:
            SlurmCommandError: scontrol refused for a node (the first failure; the other
                nodes were still updated).
        """
        if not self.version.instance_fields:
            return False
        if not instances:
            return True

        def one(node: str) -> None:
            instance_id, instance_type = instances[node]
            args = ["update", f"nodename={node}", f"instanceid={instance_id}"]
            if instance_type:
                args.append(f"instancetype={instance_type}")
            self.run("scontrol", *args)

        from concurrent.futures import ThreadPoolExecutor

        names = sorted(instances, key=_natural_key)
        with ThreadPoolExecutor(max_workers=min(16, len(names))) as pool:
            errors = [f.exception() for f in [pool.submit(one, n) for n in names]]
        failed = [e for e in errors if e is not None]
        if failed:
            raise failed[0]
        return True

    def power_down_force(self, names: Sequence[str], reason: str) -> None:
        """Power the nodes down now; their batch jobs are requeued (``--requeue``) or
        cancelled; the node returns to ``idle~`` after SuspendTimeout.

        Slurm 24.05+: ``scontrol power down force <nodes>`` (scontrol(1) 24.11: it "obsoletes"
        ``update State=POWER_DOWN_FORCE``), which takes no reason, so ``reason`` is set by a
        ``update nodename=<nodes> reason=<reason>`` first (if that is refused, the nodes are
        still powered down, then the refusal is raised). Older releases: ``update
        nodename=<nodes> state=POWER_DOWN_FORCE reason=<reason>``. See
        :attr:`~slurm_spot.slurm.version.SlurmVersion.power_down_force_command`.

        Raises:
            SlurmCommandError: scontrol refused.
        """
        names = list(names)
        if not self.version.power_down_force_command:
            self.set_state(names, "POWER_DOWN_FORCE", reason)
            return
        refused: SlurmCommandError | None = None
        try:
            self.update_nodes(names, reason=reason)
        except SlurmCommandError as exc:  # the power down matters more than its reason
            refused = exc
        for i in range(0, len(names), _MAX_NODES_PER_UPDATE):
            self.run("scontrol", "power", "down", "force",
                     compress(names[i : i + _MAX_NODES_PER_UPDATE]))
        if refused is not None:
            raise refused

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
        out = self.run("squeue", *args)
        try:
            data = load_json(out.stdout) if out.stdout.strip() else {}
        except ValueError as exc:
            raise SlurmCommandError(out.argv, out.returncode, f"unreadable JSON: {exc}") from None
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

    def expedite(self, job_id: int | str) -> str:
        """Make a requeued job eligible now instead of after the ~121 s requeue delay.

        Returns how: ``"start_time"`` (``scontrol update jobid=N StartTime=now``, every
        release) or ``"expedited"`` (Slurm 25.11+, the job was submitted with
        ``--requeue=expedite`` and Slurm already made it eligible: pending for another
        reason than BeginTime; nothing to do).

        Raises:
            SlurmCommandError: scontrol refused.
        """
        if self.version.expedited_requeue and isinstance(job_id, int):
            found = self.jobs([job_id])
            if found and found[0].state.is_pending and found[0].reason != "BeginTime":
                return "expedited"
        self.run("scontrol", "update", f"jobid={self.job_ref(job_id)}", "StartTime=now")
        return "start_time"

    def expedite_many(self, job_ids: Iterable[int]) -> tuple[list[int], list[str]]:
        """:meth:`expedite` for many jobs in one ``scontrol update jobid=<id>,<id>,...
        StartTime=now`` per :data:`_MAX_JOBS_PER_UPDATE` jobs (scontrol(1): "JobId=<job_list>
        ... may be a comma separated list of job IDs"), with one ``squeue`` for the array
        names of jobs not seen yet. If a batch is refused (a job ended meanwhile), its jobs
        are sent one by one so the others still get through.

        Returns (the jobs now eligible or already expedited by Slurm, one message per job that
        could not be expedited). Never raises for a refusal.
        """
        ids = sorted({int(j) for j in job_ids})
        if not ids:
            return [], []
        done: list[int] = []
        if self.version.expedited_requeue:
            try:
                found = {j.job_id: j for j in self.jobs(ids)}
            except SlurmCommandError:
                found = {}
            skip = {i for i, j in found.items()
                    if j.state.is_pending and j.reason != "BeginTime"}
            done += sorted(skip)
            ids = [i for i in ids if i not in skip]
        self._learn_refs([i for i in ids if i not in self._refs])
        errors: list[str] = []
        for start in range(0, len(ids), _MAX_JOBS_PER_UPDATE):
            chunk = ids[start : start + _MAX_JOBS_PER_UPDATE]
            refs = ",".join(self.job_ref(j) for j in chunk)
            try:
                self.run("scontrol", "update", f"jobid={refs}", "StartTime=now")
                done += chunk
                continue
            except SlurmCommandError as exc:
                if len(chunk) == 1:
                    errors.append(str(exc))
                    continue
            for job in chunk:
                try:
                    self.run("scontrol", "update", f"jobid={self.job_ref(job)}", "StartTime=now")
                    done.append(job)
                except SlurmCommandError as exc:
                    errors.append(str(exc))
        return done, errors

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

    def record_interruption(self, job_ids: Iterable[int], text: str) -> list[str]:
        """Append ``text`` to each job's AdminComment (``scontrol update jobid=N
        AdminComment=...``), where ``sacct --format=AdminComment`` shows it once slurmdbd has
        the job (scontrol(1), sacct(1), Slurm 22.05): an interruption requeue is then on the
        site's own record, not only in slurm-spot's events. Earlier notes are kept,
        ``; ``-separated, cut to the newest 1000 characters.

        Never raises: a job that cannot be read or updated (it ended meanwhile) does not stop
        the others. Returns one message per failure, for the caller's log or result.
        """
        return self.record_interruptions([(job, text) for job in job_ids])

    def record_interruptions(self, notes: Sequence[tuple[int, str]]) -> list[str]:
        """:meth:`record_interruption` for many ``(job id, text)`` pairs: the earlier
        comments of several jobs come from one ``scontrol -o show job`` (every job slurmctld
        holds), then one update per job (each job's comment is its own). Never raises;
        returns one message per job that could not be noted."""
        errors: list[str] = []
        shown: dict[int, str] | None = None
        if len({job for job, _ in notes}) > 1:
            try:
                shown = {}
                for line in self.run("scontrol", "-o", "show", "job").stdout.splitlines():
                    found = re.match(r"JobId=(\d+)\s", line)
                    if found:
                        shown[int(found.group(1))] = line
            except SlurmCommandError as exc:
                return [f"job {job}: AdminComment not recorded: {exc}" for job, _ in notes]
        for job, text in notes:
            try:
                ref = self.job_ref(job)
                if shown is None:
                    line = self.run("scontrol", "-o", "show", "job", ref).stdout
                elif job in shown:
                    line = shown[job]
                else:
                    errors.append(f"job {job}: AdminComment not recorded: slurmctld does not "
                                  "know the job")
                    continue
                old = re.search(r"(?:^|\s)AdminComment=(.*?)(?=\s[A-Za-z:]+=|$)", line.strip())
                previous = old.group(1) if old and old.group(1) not in ("", "(null)") else ""
                comment = f"{previous}; {text}" if previous else text
                self.run("scontrol", "update", f"jobid={ref}", f"AdminComment={comment[-1000:]}")
                if shown is not None:
                    shown[job] = f"JobId={job} AdminComment={comment[-1000:]}"
            except SlurmCommandError as exc:
                errors.append(f"job {job}: AdminComment not recorded: {exc}")
        return errors

    def sacct_runs(self, job_id: int) -> list[dict[str, str]] | None:
        """Every run of ``job_id`` as ``sacct -X -D`` reports it (one row per requeue):
        dicts with JobIDRaw, User, Start, End, NodeList, State and AdminComment.
        Returns None when accounting is not available (sacct fails: no slurmdbd).

        Raises:
            SlurmCommandError: sacct could not be run at all (missing, timeout)."""
        fields = ("JobIDRaw", "User", "Start", "End", "NodeList", "State", "AdminComment")
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


def _job_from_json(obj: dict) -> Job:
    return Job(**job_fields_json(obj))


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
