"""Changing the cluster: node updates (state, reason, addresses, instances, weight, power up
and down), job requeue/expedite/AdminComment, and signals to job steps (``scontrol update``,
``scontrol requeue``, ``scontrol power``, ``scancel``). Built on the reads of
:class:`~slurm_spot.slurm.queries.SlurmQueries`.
"""

from __future__ import annotations

import re
import tempfile
from collections.abc import Iterable, Sequence
from pathlib import Path

from slurm_spot.errors import SlurmCommandError
from slurm_spot.hostlist import compress
from slurm_spot.rawtext import DECODE_ERRORS
from slurm_spot.slurm.jobtext import admin_comment_text, split_job_records
from slurm_spot.slurm.queries import SlurmQueries
from slurm_spot.slurm.runner import CommandResult

# scontrol accepts a hostlist of any length, but keep each argv well under ARG_MAX.
_MAX_NODES_PER_UPDATE = 2000
# Job ids per ``scontrol update jobid=<list>`` (well under ARG_MAX too).
_MAX_JOBS_PER_UPDATE = 1000


class SlurmActions(SlurmQueries):
    """The actions of :class:`~slurm_spot.slurm.client.SlurmClient`: every call that changes
    a node or a job. Each raises :class:`~slurm_spot.errors.SlurmCommandError` on a refusal
    unless its docstring says otherwise."""

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

    def submit_batch(self, script: str, options: Sequence[str], script_args: Sequence[str],
                     timeout_s: float = 60) -> CommandResult:
        """``sbatch [options] SCRIPT [script_args]`` with ``script`` (the batch script's text)
        written to a private temporary file for the call (sbatch(1) copies the script into
        the job, so the file may go once sbatch returned). Waits at most ``timeout_s`` seconds.

        Returns:
            sbatch's result; its ``stdout`` is ``Submitted batch job <id>`` (``<id>;<cluster>``
            with ``--parsable``).

        Raises:
            SlurmCommandError: sbatch could not be run, did not answer, or refused the job
                (its message).
        """
        with tempfile.TemporaryDirectory(prefix="slurm-spot-sbatch-") as folder:
            path = Path(folder) / "batch.sh"
            # the script's own bytes: one sbatch took holds any (read with surrogateescape)
            path.write_bytes(script.encode("utf-8", DECODE_ERRORS))
            argv = [str(self.bin_dir / "sbatch"), *options, str(path), *script_args]
            result = self._run(argv, timeout_s)
        if result.returncode != 0:
            raise SlurmCommandError(argv, result.returncode, result.stderr or result.stdout)
        return result

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

    def release(self, job_id: int | str) -> None:
        """``scontrol release <job>``: let a held job be scheduled again (scontrol(1)
        22.05-26.05; a job requeued held after a failed launch waits for this).

        Raises:
            SlurmCommandError: scontrol refused (the job ended, or is not held).
        """
        self.run("scontrol", "release", self.job_ref(job_id))

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
        forged: set[int] = set()  # ids met twice: a name with a newline forged a record
        if len({job for job, _ in notes}) > 1:
            try:
                shown = {}
                for record in split_job_records(self.run("scontrol", "-o", "show", "job").stdout):
                    found = re.match(r"JobId=(\d+)\s", record)
                    if found:
                        forged |= {int(found.group(1))} & shown.keys()
                        shown[int(found.group(1))] = record
            except SlurmCommandError as exc:
                return [f"job {job}: AdminComment not recorded: {exc}" for job, _ in notes]
        written: dict[int, str] = {}  # a job noted twice: its comment as written here
        for job, text in notes:
            try:
                ref = self.job_ref(job)
                if job in written:
                    line = ""
                elif shown is None or job in forged:  # its own record comes first
                    line = next(iter(split_job_records(
                        self.run("scontrol", "-o", "show", "job", ref).stdout)), "")
                elif job in shown:
                    line = shown[job]
                else:
                    errors.append(f"job {job}: AdminComment not recorded: slurmctld does not "
                                  "know the job")
                    continue
                try:
                    # No record printed (a job scontrol has just forgotten): nothing to extend.
                    previous = (written[job] if job in written
                                else admin_comment_text(line) if line.strip() else "")
                except ValueError as exc:
                    errors.append(f"job {job}: AdminComment not recorded: {exc}")
                    continue
                comment = f"{previous}; {text}" if previous else text
                self.run("scontrol", "update", f"jobid={ref}", f"AdminComment={comment[-1000:]}")
                written[job] = comment[-1000:]
            except SlurmCommandError as exc:
                errors.append(f"job {job}: AdminComment not recorded: {exc}")
        return errors

    def power_up(self, names: Sequence[str]) -> None:
        """Ask slurmctld to power ``names`` up now: ``scontrol update nodename=<hostlist>
        state=POWER_UP`` (scontrol(1) of Slurm 22.05 through 26.05; 24.05+ also spells it
        ``scontrol power up``). slurmctld runs ResumeProgram for them on the controller, so
        the caller needs no cloud credentials.

        Raises:
            SlurmCommandError: scontrol refused (unknown node, node not powered down, ...).
        """
        self.update_nodes(names, state="POWER_UP")

    def set_suspend_exc_nodes(self, value: str) -> None:
        """``scontrol update SuspendExcNodes=<value>`` (scontrol(1) 23.02+: "direct assignment
        "=" is always supported", also with the ``:<count>`` form): in effect until the next
        ``scontrol reconfigure`` or restart, which go back to slurm.conf's value.

        Raises:
            SlurmCommandError: scontrol refused.
        """
        self.run("scontrol", "update", f"SuspendExcNodes={value}")

    def set_weight(self, names: Sequence[str], weight: int) -> None:
        """``scontrol update nodename=<hostlist> weight=<weight>``: slurmctld schedules with it
        until it restarts without ``-R`` or reconfigures (scontrol(1), Weight, Slurm 22.05).

        Raises:
            SlurmCommandError: scontrol refused.
        """
        self.update_nodes(names, weight=str(weight))

    def signal_step(self, job_id: int, step: str | None, signal: str) -> None:
        """``scancel -s SIG <job>[.<step>]``: every task of that step (all steps without one)
        on every node of the job; the batch shell is not signalled (scancel(1) 22.05).

        Raises:
            SlurmCommandError: scancel refused.
        """
        ref = self.job_ref(job_id)
        self.run("scancel", "-s", signal, f"{ref}.{step}" if step is not None else ref)


def _natural_key(name: str) -> tuple[str, int]:
    head = name.rstrip("0123456789")
    tail = name[len(head):]
    return head, int(tail) if tail else -1
