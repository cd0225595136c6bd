"""A fake of the Slurm command line for :class:`~slurm_spot.slurm.client.SlurmClient`.

It parses the argv the client builds (``scontrol -o show node``, ``scontrol update``,
``squeue --json`` ...) and keeps node and job state the way Slurm 22.05.8 was observed to
(see slurm_spot/reconcile/rules.py for the transitions), so tests assert on the resulting
states instead of on calls.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

from slurm_spot.hostlist import compress, expand
from slurm_spot.slurm.client import CommandResult, SlurmClient


@dataclass
class FakeNode:
    name: str
    base: str = "IDLE"
    flags: set[str] = field(default_factory=lambda: {"CLOUD", "POWERED_DOWN"})
    reason: str = ""
    addr: str = ""
    hostname: str = ""
    boot_time: str = "None"
    instance_id: str = ""
    instance_type: str = ""
    slurmd_start_time: int = 0  # Unix seconds, as sinfo --json gives it (0: not registered)
    weight: int | None = None  # scheduling Weight (None: not shown, as before weights mattered)

    @property
    def state(self) -> str:
        return "+".join([self.base, *sorted(self.flags)])


@dataclass
class FakeJob:
    job_id: int
    state: str = "RUNNING"
    nodes: list[str] = field(default_factory=list)
    reason: str = "None"
    restarts: int = 0
    requeue: bool = True
    admin_comment: str = ""
    exit_code: str = "0:0"
    end_time: str = "Unknown"  # scontrol's local time, e.g. 2026-03-01T11:59:50
    submit_time: int = 0  # Unix seconds, as squeue --json gives them (0: unset)
    start_time: int = 0
    batch_host: str = ""  # "" : the first of its nodes
    script: str = ""  # its batch script ("": none to show, e.g. srun/salloc)
    no_kill: bool = False  # sbatch --no-kill: a DOWN node is removed from it, not requeued
    eligible_time: int = 0  # Unix seconds (0: unknown); after a requeue, submit_time + 121
    partition: str = "spot"
    # sbatch -J / scontrol update comment=: any bytes but NUL, kept as Slurm prints them (a
    # str with surrogates for bytes that are not UTF-8, see FakeSlurm.through_process)
    name: str = "wrap"
    comment: str = ""
    features: str = ""  # sbatch --constraint
    # an array task: squeue's %F and %K; scontrol/scancel name it <array job id>_<task id>
    array_job_id: int | None = None
    array_task_id: int | None = None
    # scontrol listpids <job> <node>: (pid, step id) of its processes there; None: no step
    # daemon answers (scontrol exits 1)
    pids: list[tuple[int, str]] | None = None

    @property
    def ref(self) -> str:
        """Slurm's name for it in scontrol/scancel: ``<array job id>_<task id>``, or its id."""
        if self.array_job_id is not None and self.array_task_id is not None:
            return f"{self.array_job_id}_{self.array_task_id}"
        return str(self.job_id)


class FakeSlurm:
    """Node and job state plus a runner for SlurmClient.

    ``dead`` holds nodes whose slurmd is gone (POWER_DOWN_FORCE alone then leaves their job
    COMPLETING, as on a real cluster). ``refuse`` maps a node to an error scontrol prints when
    asked to update it. ``on_show`` runs before each ``show node`` (to change state between a
    snapshot and an action); ``on_command`` runs before every command with its argv (to
    change state between two commands of the code under test, as another actor would).
    ``fail`` maps an argv prefix (the tool's name, then leading arguments, e.g.
    ``("scontrol", "requeue")``) to the exit status and error text every matching command
    answers with (slurmctld away, a refused step), after it is recorded in ``calls``.
    """

    def __init__(self, version: str = "22.05.8") -> None:
        self.version = version  # what ``scontrol -V`` answers; 23.11+ has node instance fields
        self.nodes: dict[str, FakeNode] = {}
        self.jobs: dict[int, FakeJob] = {}
        self.dead: set[str] = set()
        self.refuse: dict[str, str] = {}
        self.expedited: list[int] = []
        self.released: list[int] = []  # scontrol release, in order
        self.on_show: Callable[[int], None] | None = None
        self.show_calls = 0
        self.signals: list[list[str]] = []  # scancel's arguments, in order
        self.calls: list[list[str]] = []  # every argv run, in order (what an admin's ps sees)
        # Like Slurm 22.05: sinfo --json lists nodes, scontrol has no --json. False: neither
        # (the text fallback); "warn": sinfo prints a warning line before its JSON.
        self.json_nodes: bool | str = True
        self.refuse_show: str = ""  # scontrol show node fails with this (slurmctld away)
        # Like Slurm 22.05.8 when slurmctld cannot be asked (MUNGE down, a restart): sinfo
        # --json and squeue --json exit 0 printing what tests/data/slurm-json/22.05.8/
        # *-controller-unreachable.json recorded (empty lists, the failure in "errors").
        self.controller_unreachable = False
        # Like Slurm 22.05 (job_mgr.c _job_requeue_op/batch_requeue_fini): ``scontrol requeue``
        # of a running job leaves it REQUEUED (completing) on its nodes until
        # :meth:`finish_requeues`, which makes it PENDING with Restarts + 1. False: at once.
        self.requeue_leaves_later = False
        # Like the 22.05.8 test clusters (test_failover_e2e's events): ``state=IDLE`` on a
        # powered-down node flagged NOT_RESPONDING (``idle~*``) is accepted and changes nothing.
        self.idle_keeps_not_responding = False
        self.on_command: Callable[[list[str]], None] | None = None
        self.fail: dict[tuple[str, ...], tuple[int, str]] = {}
        self.suspend_exc_nodes = ""  # the run-time SuspendExcNodes (scontrol update, 23.02+)

    def through_process(self, out_dir: Path) -> Callable[[list[str], float], CommandResult]:
        """A runner that answers as this fake does, but whose output reaches the client as
        a real command's does: its bytes (text with surrogates from ``name="bad\\udcff"``
        written as the byte ``\\xff``, as Slurm prints a user's bytes) are printed by a
        process that the production runner (``run_command``) runs and reads."""
        from slurm_spot.slurm.runner import run_command

        out_dir.mkdir(parents=True, exist_ok=True)

        def run(argv: list[str], timeout_s: float) -> CommandResult:
            answer = self(argv, timeout_s)
            out, err = out_dir / "stdout", out_dir / "stderr"
            out.write_bytes(answer.stdout.encode("utf-8", "surrogateescape"))
            err.write_bytes(answer.stderr.encode("utf-8", "surrogateescape"))
            printed = run_command(["/bin/sh", "-c", 'cat "$1"; cat "$2" >&2; exit "$3"', "sh",
                                   str(out), str(err), str(answer.returncode)], timeout_s)
            return CommandResult(argv, printed.returncode, printed.stdout, printed.stderr)

        return run

    # -- setup ----------------------------------------------------------------------------
    def add_node(self, name: str, state: str = "IDLE+CLOUD+POWERED_DOWN", **kw: str) -> FakeNode:
        base, *flags = state.split("+")
        node = FakeNode(name, base, set(flags), addr=kw.pop("addr", name),
                        hostname=kw.pop("hostname", name), **kw)
        self.nodes[name] = node
        return node

    def add_job(self, job_id: int, nodes: list[str], state: str = "RUNNING",
                reason: str = "None") -> FakeJob:
        job = FakeJob(job_id, state, nodes, reason)
        self.jobs[job_id] = job
        return job

    def job(self, ref: str) -> FakeJob:
        """The job Slurm names ``ref``: its id (``12``, an array task's own id too) or
        ``<array job id>_<task id>`` (``11_1``).

        Raises:
            KeyError: no such job.
        """
        for job in self.jobs.values():
            if ref in (job.ref, str(job.job_id)):
                return job
        raise KeyError(ref)

    def tools(self) -> list[list[str]]:
        """Every command run, in order, with the tool's name instead of its path."""
        return [[Path(a[0]).name, *a[1:]] for a in self.calls]

    def changes(self) -> list[list[str]]:
        """The commands that changed something (scontrol update, requeue, release, power;
        scancel), in order, as :meth:`tools` shows them."""
        return [c for c in self.tools() if c[0] == "scancel" or (
            c[0] == "scontrol" and c[1:2] and c[1] in ("update", "requeue", "release", "power"))]

    def client(self) -> SlurmClient:
        return SlurmClient("/usr/bin", runner=self)

    def finish_requeues(self) -> None:
        """The REQUEUED jobs' processes and epilogs are done: PENDING, Restarts + 1."""
        for job in self.jobs.values():
            if job.state == "REQUEUED":
                job.restarts += 1
                job.state, job.reason, job.nodes = "PENDING", "BeginTime", []

    def finish_power_downs(self) -> None:
        """SuspendTimeout passes: powering-down nodes become idle~ with a reset address."""
        for node in self.nodes.values():
            if node.flags & {"POWER_DOWN", "POWERING_DOWN"} and "COMPLETING" not in node.flags:
                node.base = "IDLE"
                node.flags = (node.flags - {"POWER_DOWN", "POWERING_DOWN", "NOT_RESPONDING"}
                              | {"POWERED_DOWN"})
                node.addr = node.hostname = node.name

    # -- the runner -----------------------------------------------------------------------
    def __call__(self, argv: list[str], timeout_s: float) -> CommandResult:
        tool, args = Path(argv[0]).name, argv[1:]
        self.calls.append(list(argv))
        if self.on_command is not None:
            self.on_command(list(argv))
        for prefix, (returncode, error) in self.fail.items():
            if (tool, *args)[:len(prefix)] == prefix:
                return CommandResult(argv, returncode, "", error)
        if self.controller_unreachable and "--json" not in args and args[:1] != ["-V"]:
            return CommandResult(argv, 1, "", f"{tool}: error: Unable to contact slurm "
                                 "controller (connect failure)")
        try:
            out = getattr(self, f"_{tool}")(args)
        except _Refused as exc:
            return CommandResult(argv, 1, "", str(exc))
        return CommandResult(argv, 0, out, "")

    def _sinfo(self, args: list[str]) -> str:
        if args != ["--json"] or not self.json_nodes:
            raise _Refused(f"sinfo: unrecognized option {args}")
        self.show_calls += 1
        if self.on_show:
            self.on_show(self.show_calls)
        if self.controller_unreachable:
            return _UNREACHABLE["sinfo"]
        data = {"meta": {"plugin": {"type": "openapi/v0.0.38"}}, "nodes": [
            {"name": n.name, "address": n.addr, "hostname": n.hostname,
             "state": n.base.lower(), "state_flags": sorted(n.flags), "reason": n.reason,
             "partitions": ["spot"], "boot_time": _epoch(n.boot_time),
             "slurmd_start_time": n.slurmd_start_time,
             **({"weight": n.weight} if n.weight is not None else {}),
             **({"instance_id": n.instance_id, "instance_type": n.instance_type}
                if self._at_least(23, 11) else {})}
            for n in self.nodes.values()]}
        warning = "sinfo: warning: plugin said something\n" if self.json_nodes == "warn" else ""
        return warning + json.dumps(data, indent=2, ensure_ascii=False)  # bytes as they are

    def _scontrol(self, args: list[str]) -> str:
        if args and args[0] == "--json":
            raise _Refused("scontrol: unrecognized option '--json'")
        if args[:3] == ["-o", "show", "node"]:
            if self.refuse_show:
                raise _Refused(self.refuse_show)
            self.show_calls += 1
            if self.on_show:
                self.on_show(self.show_calls)
            names = expand(args[3]) if len(args) > 3 else list(self.nodes)
            return "".join(self._show(n) for n in names)
        if args[0] == "update" and args[1].lower().startswith("jobid="):
            # scontrol(1): JobId=<job_list>, comma separated; each job is updated on its own
            # and a refused one makes the exit status non-zero.
            refused = []
            for job_id in args[1].split("=", 1)[1].split(","):
                try:
                    self._update_job(int(job_id), args[2:])
                except _Refused as exc:
                    refused.append(str(exc))
            if refused:
                raise _Refused("\n".join(refused))
            return ""
        if args[0] == "update" and args[1].startswith("nodename="):
            return self._update_nodes(args[1].split("=", 1)[1], args[2:])
        if args[0] == "update" and args[1].startswith("SuspendExcNodes="):
            # scontrol(1) 23.02+: update SuspendExc*; 22.05's scontrol has no such update
            if not self._at_least(23, 2):
                raise _Refused("No valid entity in update command")
            self.suspend_exc_nodes = args[1].split("=", 1)[1]
            return ""
        if args[:3] == ["-o", "show", "job"]:
            jobs = [self.jobs[int(args[3])]] if len(args) > 3 and int(args[3]) in self.jobs \
                else list(self.jobs.values()) if len(args) == 3 else []
            if not jobs:
                raise _Refused("slurm_load_jobs error: Invalid job id specified")
            return "".join(self._show_job(j) for j in jobs)
        if args[:2] == ["write", "batch_script"]:
            try:
                job = self.job(args[2])
            except KeyError:
                job = None
            if job is None or not job.script:
                raise _Refused(f"No batch script for job {args[2]}")
            return job.script
        if args[0] == "listpids":
            job = self.job(args[1])
            if job.pids is None:
                raise _Refused(f"slurm_pid2jobid: no step of job {job.ref} on {args[2]}")
            return "PID      JOBID    STEPID   LOCALID GLOBALID\n" + "".join(
                f"{pid} {job.job_id} {step} 0 0\n" for pid, step in job.pids)
        if args[0] == "requeue":
            try:
                job = self.job(args[1])
            except KeyError:
                raise _Refused("Invalid job id specified") from None
            if job.state in ("PENDING", "REQUEUED"):
                raise _Refused(f"Job is pending execution for job {job.job_id}")
            if self.requeue_leaves_later and job.state == "RUNNING":
                job.state = "REQUEUED"
                return ""
            job.restarts += 1
            job.state, job.reason, job.nodes, job.end_time = "PENDING", "BeginTime", [], "Unknown"
            return ""
        if args[0] == "release":
            job = self.jobs[int(args[1])]
            if job.state != "PENDING" or "held" not in job.reason:
                raise _Refused(f"Job is not held for job {job.job_id}")
            job.reason = "None"
            self.released.append(job.job_id)
            return ""
        if args[0] == "hold":
            # scontrol(1) hold: a pending job gets priority 0 and reason JobHeldAdmin; an
            # unknown id is refused, as scontrol does ("Invalid job id specified")
            job_id = int(args[1])
            if job_id not in self.jobs:
                raise _Refused("Invalid job id specified")
            self.jobs[job_id].reason = "JobHeldAdmin"
            return ""
        if args[0] == "ping":
            return "Slurmctld(primary) at localhost is UP\n"
        if args == ["-V"]:
            return f"slurm {self.version}\n"
        if args[:3] == ["power", "down", "force"] and self._at_least(24, 5):
            for name in expand(args[3]):
                self._to_power_down_force(self.nodes[name])
            return ""
        raise _Refused(f"fake scontrol: unsupported {args}")

    def _show_job(self, j: FakeJob) -> str:
        """Job ``j`` as scontrol 22.05 prints it with ``-o``: its keys in scontrol's order
        (tests/data/slurm-text/22.05.8/), the name and comments as the user wrote them."""
        nodes = compress(j.nodes) if j.nodes else "(null)"
        batch_host = j.batch_host or (j.nodes[0] if j.nodes else "")
        admin = f" AdminComment={j.admin_comment}" if j.admin_comment else ""
        comment = f" Comment={j.comment}" if j.comment else ""
        return (f"JobId={j.job_id} JobName={j.name} UserId=alice(1000) GroupId=alice(1000) "
                f"MCS_label=N/A Priority=1 Nice=0 Account=(null) QOS=(null) "
                f"JobState={j.state} Reason={j.reason} Dependency=(null) "
                f"Requeue={int(j.requeue)} Restarts={j.restarts} BatchFlag=1 Reboot=0 "
                f"ExitCode={j.exit_code} RunTime=00:00:00 TimeLimit=UNLIMITED TimeMin=N/A "
                f"SubmitTime={_local(j.submit_time)} EligibleTime={_local(j.eligible_time)} "
                f"EndTime={j.end_time} Deadline=N/A Partition={j.partition} "
                f"AllocNode:Sid=localhost:1 ReqNodeList=(null) ExcNodeList=(null) "
                f"NodeList={nodes}{f' BatchHost={batch_host}' if batch_host else ''} "
                f"NumNodes={max(len(j.nodes), 1)} Features=(null) Command=(null) "
                f"WorkDir=/home/alice{admin}{comment} StdErr=/home/alice/slurm-{j.job_id}.out "
                f"StdIn=/dev/null StdOut=/home/alice/slurm-{j.job_id}.out Power=\n")

    def _show(self, name: str) -> str:
        if name not in self.nodes:
            raise _Refused(f"Node {name} not found")
        n = self.nodes[name]
        reason = f" Reason={n.reason} [root@2026-03-01T11:00:00]" if n.reason else ""
        instance = (f" InstanceId={n.instance_id or '(null)'} "
                    f"InstanceType={n.instance_type or '(null)'}") if self._at_least(23, 11) else ""
        weight = f" Weight={n.weight}" if n.weight is not None else ""
        return (f"NodeName={n.name} Arch=x86_64 CoresPerSocket=1 NodeAddr={n.addr} "
                f"NodeHostName={n.hostname} State={n.state}{weight} BootTime={n.boot_time} "
                f"Partitions=spot{instance}{reason}\n")

    def _at_least(self, major: int, minor: int) -> bool:
        return tuple(int(p) for p in self.version.split(".")[:2]) >= (major, minor)

    def _update_nodes(self, hostlist: str, args: list[str]) -> str:
        settings = dict(a.split("=", 1) for a in args)
        names = expand(hostlist) if "," not in hostlist else hostlist.split(",")
        for name in names:
            if name in self.refuse:
                raise _Refused(self.refuse[name])
        if "nodeaddr" in settings:
            for name, addr, host in zip(names, settings["nodeaddr"].split(","),
                                        settings["nodehostname"].split(","), strict=True):
                self.nodes[name].addr, self.nodes[name].hostname = addr, host
        if "instanceid" in settings or "instancetype" in settings:
            if not self._at_least(23, 11):
                raise _Refused("Update of this parameter is not supported: instanceid")
            for name in names:
                self.nodes[name].instance_id = settings.get("instanceid", "")
                self.nodes[name].instance_type = settings.get("instancetype", "")
        state = settings.get("state", "").upper()
        if state in ("DOWN", "DRAIN") and not settings.get("reason"):
            raise _Refused("You must specify a reason when DOWNING or DRAINING a node")
        if "weight" in settings:  # scontrol(1): Weight=<weight>, any node state
            for name in names:
                self.nodes[name].weight = int(settings["weight"])
        for name in names:
            if state:
                getattr(self, f"_to_{state.lower()}")(self.nodes[name])
            if settings.get("reason"):
                self.nodes[name].reason = settings["reason"]
        return ""

    # -- node transitions (as observed on Slurm 22.05.8) ----------------------------------
    def _to_down(self, node: FakeNode) -> None:
        # Slurm 22.05 (job_mgr.c, kill_running_job_by_node_name): a running --no-kill job of
        # several nodes loses the DOWN node and keeps running, even its batch host.
        for job in self._jobs_on(node.name):
            if job.no_kill and job.state == "RUNNING" and len(job.nodes) > 1:
                job.nodes = [n for n in job.nodes if n != node.name]
        self._requeue_jobs_of(node.name)
        node.base = "DOWN"
        node.flags -= {"COMPLETING", "POWERING_UP"}

    def _to_power_down_force(self, node: FakeNode) -> None:
        jobs = self._jobs_on(node.name)
        if jobs and node.name in self.dead:
            for job in jobs:
                job.state, job.restarts = "COMPLETING", job.restarts + 1
            node.base, node.flags = "IDLE", node.flags | {"COMPLETING", "POWER_DOWN"}
            return
        self._requeue_jobs_of(node.name)
        if "POWERED_DOWN" in node.flags:
            return
        node.flags = (node.flags - {"POWERING_UP"}) | (
            {"POWER_DOWN"} if node.base == "DOWN" else {"POWERING_DOWN"})
        if node.base != "DOWN":
            node.base = "IDLE"

    def _to_power_down(self, node: FakeNode) -> None:
        # scontrol(1) state=POWER_DOWN: powered down once its jobs ended, none is requeued;
        # a DOWN node shows DOWN+POWER_DOWN until SuspendTimeout (finish_power_downs)
        if "POWERED_DOWN" in node.flags:
            return
        node.flags = (node.flags - {"POWERING_UP"}) | (
            {"POWER_DOWN"} if node.base == "DOWN" else {"POWERING_DOWN"})

    def _to_power_up(self, node: FakeNode) -> None:
        # scontrol(1) state=POWER_UP: slurmctld runs ResumeProgram; the node is POWERING_UP
        # (idle#) until its slurmd registers, or DOWN if the resume hook marks it so.
        if "POWERED_DOWN" in node.flags:
            node.flags = (node.flags - {"POWERED_DOWN"}) | {"POWERING_UP"}

    def _to_idle(self, node: FakeNode) -> None:
        if (self.idle_keeps_not_responding and node.base == "IDLE"
                and {"POWERED_DOWN", "NOT_RESPONDING"} <= node.flags):
            return
        node.base, node.reason = "IDLE", ""
        node.flags.discard("NOT_RESPONDING")

    def _to_resume(self, node: FakeNode) -> None:
        node.flags.discard("DRAIN")
        if node.base == "DOWN":
            node.base = "IDLE"
        if "POWERED_DOWN" in node.flags:
            node.flags.add("NOT_RESPONDING")
        node.reason = ""

    def _to_drain(self, node: FakeNode) -> None:
        node.flags.add("DRAIN")

    # -- jobs -----------------------------------------------------------------------------
    def _jobs_on(self, node: str) -> list[FakeJob]:
        return [j for j in self.jobs.values() if node in j.nodes
                and j.state in ("RUNNING", "CONFIGURING", "COMPLETING", "REQUEUED")]

    def _requeue_jobs_of(self, node: str) -> None:
        for job in self._jobs_on(node):
            if job.state == "REQUEUED":  # its node went down before it left
                # Issue 25's report: its run's record read NODE_FAIL (measured here on 22.05
                # with slurmdbd: sacct lost that run's record instead); never REQUEUED.
                job.state = "NODE_FAIL"
            elif job.requeue:
                job.restarts += 0 if job.state == "COMPLETING" else 1
                job.state, job.reason, job.nodes = "PENDING", "BeginTime", []
            else:
                job.state = "NODE_FAIL"
        for n in self.nodes.values():
            if not any(n.name in j.nodes for j in self.jobs.values() if j.state == "RUNNING"):
                if n.base in ("ALLOCATED", "MIXED"):
                    n.base = "IDLE"

    def _update_job(self, job_id: int, args: list[str]) -> str:
        if job_id not in self.jobs:
            raise _Refused(f"Invalid job id specified for job {job_id}")
        if len(args) == 1 and args[0].lower().startswith("nodelist="):
            self.jobs[job_id].nodes = expand(args[0].split("=", 1)[1])
        if len(args) == 1 and args[0].startswith("AdminComment="):
            self.jobs[job_id].admin_comment = args[0].split("=", 1)[1]
        if args == ["StartTime=now"]:
            job = self.jobs[job_id]
            if job.state == "PENDING" and job.reason == "BeginTime":
                job.reason = "None"
                job.eligible_time = job.submit_time
            self.expedited.append(job_id)
        return ""

    def _scancel(self, args: list[str]) -> str:
        """``scancel -s SIG <job>[.<step>]``: recorded in :attr:`signals`."""
        self.signals.append(list(args))
        return ""

    def _squeue(self, args: list[str]) -> str:
        if "--json" in args and self.controller_unreachable:
            return _UNREACHABLE["squeue"]
        if "--json" in args:
            wanted = None
            if "--jobs" in args:
                wanted = {int(j) for j in args[args.index("--jobs") + 1].split(",")}
            jobs = [j for j in self.jobs.values() if wanted is None or j.job_id in wanted]
            return json.dumps({"jobs": [
                {"job_id": j.job_id, "job_state": j.state, "state_reason": j.reason,
                 "nodes": compress(j.nodes) if j.nodes else "", "restart_cnt": j.restarts,
                 "partition": j.partition, "name": j.name, "comment": j.comment,
                 "submit_time": j.submit_time, "start_time": j.start_time,
                 "features": j.features}
                for j in jobs if j.state not in ("COMPLETED", "NODE_FAIL", "CANCELLED")]},
                ensure_ascii=False)  # a user's bytes as they are, as Slurm prints them
        # squeue -h [-j ids] [-t states] -o "%A %F %K [%N|%U]": unique id, array job id (the
        # id itself when not an array task), task id (N/A), nodes or owner's uid.
        fields = args[args.index("-o") + 1].split() if "-o" in args else ["%A", "%F", "%K", "%N"]
        jobs = list(self.jobs.values())
        if "-j" in args:
            refs = args[args.index("-j") + 1].split(",")
            jobs = [j for j in jobs if str(j.job_id) in refs or j.ref in refs]
        if "-t" in args:
            states = args[args.index("-t") + 1].split(",")
            jobs = [j for j in jobs if j.state in states or
                    (j.state == "REQUEUED" and "COMPLETING" in states)]
            jobs = [j for j in jobs if j.nodes]
        def cell(j: FakeJob, field: str) -> str:
            return {"%A": str(j.job_id),
                    "%F": str(j.array_job_id if j.array_job_id is not None else j.job_id),
                    "%K": str(j.array_task_id) if j.array_task_id is not None else "N/A",
                    "%N": compress(j.nodes) if j.nodes else "", "%U": "1000"}[field]
        return "".join(" ".join(cell(j, f) for f in fields) + "\n" for j in jobs
                       if j.state not in ("COMPLETED", "NODE_FAIL", "CANCELLED"))


_UNREACHABLE = {tool: (Path(__file__).parent.parent / "data" / "slurm-json" / "22.05.8"
                       / f"{tool}-controller-unreachable.json").read_text()
                for tool in ("sinfo", "squeue")}


def _epoch(text: str) -> int:
    """sinfo --json gives Unix seconds where scontrol prints local time (0: none)."""
    return 0 if text in ("None", "") else int(datetime.fromisoformat(text).timestamp())


def _local(epoch: int) -> str:
    """scontrol prints times as local time (``Unknown`` when unset)."""
    return datetime.fromtimestamp(epoch).isoformat(timespec="seconds") if epoch else "Unknown"


class _Refused(Exception):
    pass


def resuming_slurm(nodes: list[str], pending_jobs: tuple[int, ...] = (),
                   version: str = "22.05.8") -> FakeSlurm:
    """Slurm while it runs ResumeProgram for ``nodes``: each is idle# (POWERING_UP) until the
    resume hook records its address or gives it up; ``pending_jobs`` wait for them (PENDING,
    so the hook may hold one: scontrol hold)."""
    fake = FakeSlurm(version)
    for name in nodes:
        fake.add_node(name, "IDLE+CLOUD+POWERING_UP")
    for job_id in pending_jobs:
        fake.add_job(job_id, [], state="PENDING")
    return fake
