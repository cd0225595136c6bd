"""A stand-in for the Slurm command line in the scale benchmarks: answers the reads a pass or a
hook makes with canned output of the size under test (rendered before the clock starts), takes
every update as done, and counts the commands by tool and subcommand.

With ``spawn=True`` each command also starts ``/bin/true`` (no shell), so what the process
start itself costs (fork/exec of a small program; ``scontrol`` costs more, then slurmctld does
the work) is paid as on a real controller; the benchmarks read it from ``RUSAGE_CHILDREN``.
Works with any tree's :class:`slurm_spot.slurm.client.SlurmClient` (it only needs
``CommandResult``).
"""

from __future__ import annotations

import json
import subprocess
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any


@dataclass
class CannedNode:
    """One node: name, base state, flags, address, reason, jobs on it."""

    name: str
    base: str = "IDLE"
    flags: tuple[str, ...] = ("CLOUD", "POWERED_DOWN")
    addr: str = ""
    reason: str = ""
    jobs: tuple[int, ...] = ()


class CannedSlurm:
    """A CommandRunner: ``sinfo --json`` (Slurm 22.05's node listing), ``squeue`` (text and
    ``--json``), ``scontrol -o show job`` (the jobs on the nodes, running), ``scontrol -V``;
    every other command succeeds and prints nothing."""

    def __init__(self, nodes: Sequence[CannedNode], pending_jobs: Sequence[int] = (),
                 spawn: bool = False, version: str = "22.05.8") -> None:
        from slurm_spot.slurm.client import CommandResult

        self._result = CommandResult
        self.spawn = spawn
        self.version = version
        self.calls: Counter[str] = Counter()
        self.sinfo = json.dumps({"meta": {"plugin": {"type": "openapi/v0.0.38"}}, "nodes": [
            {"name": n.name, "address": n.addr or n.name, "hostname": n.addr or n.name,
             "state": n.base.lower(), "state_flags": list(n.flags), "reason": n.reason,
             "partitions": ["spot"], "boot_time": 0} for n in nodes]}, indent=2)
        self.squeue_text = "".join(
            f"{j} {j} N/A {n.name}\n" for n in nodes for j in n.jobs)
        self.job_lines = {
            # scontrol 22.05's key order: the name, then Slurm's own section from UserId to
            # Features, then the user's text (slurm_spot/slurm/jobtext.py reads it so).
            j: f"JobId={j} JobName=train UserId=root(0) GroupId=root(0) MCS_label=N/A "
               f"JobState=RUNNING Reason=None Requeue=1 Restarts=0 BatchFlag=1 ExitCode=0:0 "
               f"EndTime=Unknown NodeList={n.name} Features=(null) AdminComment=(null)\n"
            for n in nodes for j in n.jobs}
        self.squeue_json = json.dumps({"jobs": [
            {"job_id": j, "job_state": "PENDING", "state_reason": "BeginTime", "nodes": "",
             "restart_cnt": 1, "partition": "spot", "name": "train"} for j in pending_jobs]})

    def __call__(self, argv: list[str], timeout_s: float) -> Any:
        tool = argv[0].rsplit("/", 1)[-1]
        args = argv[1:]
        key = tool + " " + next((a for a in args if not a.startswith("-")), args[0] if args else "")
        self.calls[key] += 1
        if self.spawn:
            subprocess.run(["/bin/true"], check=True, timeout=timeout_s)
        out = ""
        if tool == "scontrol" and args == ["-V"]:
            out = f"slurm {self.version}\n"
        elif tool == "sinfo" and args == ["--json"]:
            out = self.sinfo
        elif tool == "scontrol" and args[:1] == ["--json"]:
            return self._result(argv, 1, "", "scontrol: unrecognized option '--json'")
        elif tool == "scontrol" and args[:3] == ["-o", "show", "job"]:
            out = "".join(self.job_lines.values()) if len(args) == 3 else \
                self.job_lines.get(int(args[3]) if args[3].isdigit() else -1, "")
        elif tool == "squeue" and "--json" in args:
            out = self.squeue_json
        elif tool == "squeue":
            out = self.squeue_text
        return self._result(argv, 0, out, "")

    @property
    def commands(self) -> int:
        """Commands run so far."""
        return sum(self.calls.values())
