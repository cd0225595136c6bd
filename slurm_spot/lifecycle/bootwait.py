"""``slurm-spot-prolog-slurmctld`` (PrologSlurmctld): hold a job's launch until its nodes that
were powered up have registered, so slurmctld launches the batch script at once instead of on
its next periodic check (up to 30 s later on every Slurm release slurm-spot supports).

Why (Slurm's source, read at the tags ``slurm-22-05-8-1``, ``slurm-24-11-5-1`` and
``slurm-26-05-3-1``; the same at every release tag in between):

- ``select_nodes()`` (``src/slurmctld/node_scheduler.c``) marks a job whose nodes must be
  powered up ``JOB_CONFIGURING``, and ``_schedule()`` (``job_scheduler.c``) then does not call
  ``launch_job()`` for it.
- Only three places call ``launch_job()`` for a configuring batch job: ``job_time_limit()``
  (``job_mgr.c``, "Configuration for JobId=N complete"), which the background thread of
  ``controller.c`` runs every ``PERIODIC_TIMEOUT`` = 30 s (a compile-time constant of
  ``slurmctld.h``); ``prolog_running_decr()`` (``job_scheduler.c``, "Configuration for
  JobId=N is complete"), run when the job's PrologSlurmctld ends; and burst buffers. A node's
  registration launches nothing: the job waits for the next 30 s tick, on average 15 s.
- ``prolog_running_decr()`` launches the job only if ``test_job_nodes_ready()`` holds: none
  of the job's nodes is powered down or powering up (``select_p_job_ready()`` of cons_tres).

So this program, run by slurmctld as the PrologSlurmctld at allocation, waits (polling
``scontrol -o show node``, :data:`POLL_S`) until none of the job's nodes has ``POWERED_DOWN``
or ``POWERING_UP`` in its state and exits 0; slurmctld then launches the job within the same
call. slurm.conf(5) (22.05 and 24.11): "While this program is running, the nodes associated
with the job will be have a POWER_UP/CONFIGURING flag set ... Once the program completes with
an exit code of zero, the nodes will be considered ready for use".

It always exits 0: a non-zero exit requeues or kills the job (slurm.conf(5)). When it cannot
tell (no config, Slurm does not answer, the job left CONFIGURING, ResumeTimeout passed) it
stops waiting and slurmctld's own path (the 30 s check, or ResumeTimeout's requeue) takes
over, as without it. A job on nodes that are already up costs one ``scontrol`` call; a job
on none of spot.yaml's nodes (another partition of the site), none.

Slurm starts a PrologSlurmctld with the job's variables only (``job_common_env_vars()`` of
``job_mgr.c``: ``SLURM_JOB_ID``, ``SLURM_JOB_NODELIST``...; no ``SLURM_CONF``, unlike the
ResumeProgram, whose environment ``power_save.c`` gives ``SLURM_CONF``), so without
``SLURM_CONF`` it takes the one of its parent, slurmctld's script process (slurmscriptd), which
has slurmctld's environment, or slurmctld's ``-f FILE``: :func:`slurm_conf_from_parent`.
"""

from __future__ import annotations

import itertools
import math
import os
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

POLL_S = 0.5
"""Seconds between two looks at the job's nodes: the launch comes at most this late after the
last node registered (one ``scontrol show node`` per waiting job per poll)."""
JOB_CHECK_EVERY = 10
"""Every this many polls the job itself is looked at: waiting stops when it left
CONFIGURING/RUNNING (cancelled, requeued)."""
MARGIN_S = 10.0
"""Waited beyond ResumeTimeout, by when slurmctld has given up on the nodes itself."""
NOT_READY = ("POWERED_DOWN", "POWERING_UP")
"""A node with one of these state flags makes ``test_job_nodes_ready()`` false."""
GIVEN_UP = ("DOWN", "FAIL", "DRAIN")
"""A node in one of these (without POWERING_UP) will not come up for this allocation."""


@dataclass(frozen=True)
class WaitResult:
    """How the wait ended: ``outcome`` is ``ready`` (every node is up; slurmctld launches the
    job now), ``up`` (nothing to wait for at the first look), ``gone`` (the job left
    CONFIGURING), ``failed`` (a node went DOWN/FAIL/DRAIN), ``timeout`` or ``error`` (Slurm
    did not answer; ``detail`` says what); ``waited_s`` seconds; ``polls`` node queries."""

    outcome: str
    waited_s: float
    polls: int
    detail: str = ""


def node_flags(scontrol_out: str) -> dict[str, set[str]]:
    """``scontrol -o show node`` output -> node name -> its state words
    (``State=ALLOCATED+CLOUD+POWERING_UP`` -> ``{"ALLOCATED", "CLOUD", "POWERING_UP"}``;
    the ``*`` of a node not responding is dropped)."""
    from slurm_spot.slurm.output import split_reason
    from slurm_spot.slurm.states import parse_oneline

    found: dict[str, set[str]] = {}
    for line in scontrol_out.splitlines():
        if not line.startswith("NodeName="):
            continue
        fields = parse_oneline(split_reason(line)[0], ("NodeName", "State"))
        words = (w.rstrip("*") for w in fields.get("State", "").split("+"))
        found[fields.get("NodeName", "")] = {w for w in words if w}
    return found


def nodes_ready(flags: Mapping[str, set[str]], wanted: list[str]) -> bool:
    """True when every node of ``wanted`` is known and none has a :data:`NOT_READY` flag
    (``test_job_nodes_ready()`` of slurmctld for a job that powered nodes up)."""
    return all(name in flags and not flags[name] & set(NOT_READY) for name in wanted)


def nodes_given_up(flags: Mapping[str, set[str]]) -> list[str]:
    """Nodes that are DOWN/FAIL/DRAIN and not powering up: they will not register for this
    allocation (slurmctld requeues the job at ResumeTimeout)."""
    return sorted(name for name, words in flags.items()
                  if words & set(GIVEN_UP) and "POWERING_UP" not in words)


def wait_for_nodes(job_id: str, nodes: list[str], query_nodes: Callable[[], str | None],
                   query_job_state: Callable[[], str | None], timeout_s: float,
                   poll_s: float = POLL_S, clock: Callable[[], float] = time.monotonic,
                   sleep: Callable[[float], None] = time.sleep) -> WaitResult:
    """Wait until none of ``nodes`` (job ``job_id``'s) is powered down or powering up.

    Args:
        query_nodes: ``scontrol -o show node <nodes>`` output, None when it failed.
        query_job_state: the job's ``JobState`` (``CONFIGURING``), None when unknown.
        timeout_s: give up after this many seconds (ResumeTimeout + :data:`MARGIN_S`).
    """
    start = clock()
    polls = 0
    while True:
        out = query_nodes()
        polls += 1
        if out is None:
            return WaitResult("error", clock() - start, polls, "scontrol show node failed")
        flags = node_flags(out)
        if nodes_ready(flags, nodes):
            return WaitResult("up" if polls == 1 else "ready", clock() - start, polls)
        down = nodes_given_up({n: flags[n] for n in nodes if n in flags})
        if down:
            return WaitResult("failed", clock() - start, polls, ",".join(down))
        if polls % JOB_CHECK_EVERY == 0:
            state = query_job_state()
            if state is not None and state not in ("CONFIGURING", "RUNNING"):
                return WaitResult("gone", clock() - start, polls, f"JobState={state}")
        if clock() - start + poll_s > timeout_s:
            return WaitResult("timeout", clock() - start, polls, f"after {timeout_s:g} s")
        sleep(poll_s)


def credential_wait_s(fields: Mapping[str, str], now: float) -> float:
    """How long a restarted job's launch must still wait so that its new batch credential is
    newer than the revocation of its last run's (seconds; 0 for a first run or an old release).

    When a job is requeued, slurmd revokes the job id's credentials, and refuses a later one
    unless its creation second is past the revocation's ("Job credential revoked"; slurmctld
    then logs "Killing non-startable batch JobId=N" and the job ends with exit 1, not requeued).
    Slurm's own requeue hold (~121 s) keeps a restart clear of that; ``scontrol update
    StartTime=now`` (the watcher's release, an admin's) does not, and with an immediate
    allocation on a node of the last run the launch could fall in the revocation's second (a
    fresh-clone test run: revoked at 16:14:54, relaunched at 16:14:54.56). The revocation
    comes before the requeue completes and so before the release: the launch is safe from
    the second after ``EligibleTime``. slurmctld creates the credential when it launches the
    job, after this program ends (``launch_job()`` from ``prolog_running_decr()``).

    ``fields``: ``scontrol -o show job`` fields (``Restarts``, ``EligibleTime`` in local time).
    Never more than 1 s: an ``EligibleTime`` still ahead (the job was requeued while this
    program ran, and is held again) is no launch to protect, and gives 0.
    """
    if fields.get("Restarts", "0") in ("", "0"):
        return 0.0
    try:
        eligible = datetime.fromisoformat(fields.get("EligibleTime", "")).timestamp()
    except ValueError:
        return 0.0
    if eligible > now:
        return 0.0
    return min(1.0, max(0.0, math.floor(eligible) + 1.0 - now))


def slurm_conf_from_parent(ppid: int | None = None) -> str | None:
    """The slurm.conf of the slurmctld that started this program: ``SLURM_CONF`` of the parent
    process (slurmscriptd, with slurmctld's environment), else the ``-f FILE`` of the parent's
    or grandparent's command line (slurmscriptd renames itself, slurmctld keeps its
    arguments); None when neither says (slurmctld then reads its default slurm.conf)."""
    parent = os.getppid() if ppid is None else ppid
    try:
        raw = Path(f"/proc/{parent}/environ").read_bytes()
    except OSError:
        raw = b""
    for item in raw.split(b"\0"):
        if item.startswith(b"SLURM_CONF=") and len(item) > len(b"SLURM_CONF="):
            return item[len(b"SLURM_CONF="):].decode(errors="replace")
    for pid in (parent, _parent_of(parent)):
        try:
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        for flag, value in itertools.pairwise(argv):
            if flag == b"-f" and value:
                return value.decode(errors="replace")
    return None


def _parent_of(pid: int) -> int:
    """The parent pid of ``pid`` (``/proc/<pid>/stat``), or 0 when unknown."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text(errors="replace")
        return int(stat.rsplit(")", 1)[1].split()[1])
    except (OSError, IndexError, ValueError):
        return 0


def run(env: Mapping[str, str]) -> tuple[WaitResult | None, str]:
    """The PrologSlurmctld's work with the job's environment ``env``: returns the wait's
    result (None when it did not wait) and a one-line message for slurmctld's log. Never
    raises for a problem of the job, the config or Slurm: the job must not be requeued by it.
    """
    from slurm_spot.errors import SlurmSpotError
    from slurm_spot.hostlist import expand

    job_id = env.get("SLURM_JOB_ID", "")
    nodelist = env.get("SLURM_JOB_NODELIST", "")
    if not (job_id.isascii() and job_id.isdigit()) or not nodelist:
        return None, (f"slurm-spot prolog-slurmctld: SLURM_JOB_ID={job_id!r}, "
                      f"SLURM_JOB_NODELIST={nodelist!r}: not a job's PrologSlurmctld; not waiting")
    if "SLURM_CONF" not in os.environ:
        found = slurm_conf_from_parent()
        if found:
            os.environ["SLURM_CONF"] = found
    try:
        from slurm_spot.config.cache import load_hook_config

        config = load_hook_config(None)
        nodes = expand(nodelist)
    except (SlurmSpotError, ValueError) as exc:
        return None, f"slurm-spot prolog-slurmctld: job {job_id}: {exc}; not waiting"
    if not any(config.node_set_of(node) for node in nodes):
        return None, f"slurm-spot prolog-slurmctld: job {job_id} on {nodelist}: no node of spot.yaml"
    bin_dir = Path(config.slurm_bin_dir)
    timeout_s = float(config.power.resume_timeout_s) + MARGIN_S

    def query_nodes() -> str | None:
        return _scontrol(bin_dir, "-o", "show", "node", nodelist)

    def query_job() -> dict[str, str] | None:
        from slurm_spot.slurm.jobtext import job_fields_text, split_job_records

        out = _scontrol(bin_dir, "-o", "show", "job", job_id)
        records = split_job_records(out) if out else []
        return job_fields_text(records[0]) if records else None

    def query_job_state() -> str | None:
        fields = query_job()
        return fields.get("JobState") if fields else None

    result = wait_for_nodes(job_id, nodes, query_nodes, query_job_state, timeout_s)
    detail = f" ({result.detail})" if result.detail else ""
    held = ""
    # Only a launch that goes ahead needs it (a job requeued meanwhile, its node failed, waits
    # in "Cleaning" until this program ends); a first run has no revoked credential.
    if result.outcome in ("up", "ready") and env.get("SLURM_RESTART_COUNT", "1") != "0":
        fields = query_job()
        wait_s = credential_wait_s(fields, time.time()) if fields else 0.0
        if wait_s > 0:
            time.sleep(wait_s)
            held = f"; launch held {wait_s:.2f} s past the last run's credential revocation"
    return result, (f"slurm-spot prolog-slurmctld: job {job_id} on {nodelist}: {result.outcome}"
                    f"{detail} after {result.waited_s:.1f} s, {result.polls} look(s){held}")


def _scontrol(bin_dir: Path, *args: str) -> str | None:
    from slurm_spot.errors import SlurmCommandError
    from slurm_spot.slurm.runner import run_command

    try:
        result = run_command([str(bin_dir / "scontrol"), *args], timeout_s=10)
    except SlurmCommandError:
        return None
    return result.stdout if result.returncode == 0 else None


def main(env: Mapping[str, str] | None = None) -> int:
    """Run :func:`run` and print its message on stderr (slurmctld logs a PrologSlurmctld's
    output). Always returns 0, and the process exits 0 even where the message cannot be
    written (stderr a pipe nobody reads any more: Python would exit 120 at its last flush)."""
    try:
        _, message = run(os.environ if env is None else env)
    except Exception as exc:  # a PrologSlurmctld failing would requeue the job
        message = f"slurm-spot prolog-slurmctld: unexpected {type(exc).__name__}: {exc}; not waiting"
    try:
        print(message, file=sys.stderr, flush=True)
    except (OSError, ValueError):  # closed or broken: the message is lost, the job is not
        _quiet_exit_streams()
    return 0


def _quiet_exit_streams() -> None:
    """Point stdout and stderr at /dev/null, so that the interpreter's flush at exit cannot
    fail (it turns the exit code into 120)."""
    try:
        null = os.open(os.devnull, os.O_WRONLY)
    except OSError:
        return
    for stream, fd in ((sys.stdout, 1), (sys.stderr, 2)):
        try:
            os.dup2(null, fd)
            if stream is not None:
                stream.flush()
        except (OSError, ValueError):
            pass
    os.close(null)
