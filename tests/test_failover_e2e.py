"""Failover across the node sets of one partition (issue 24) on a real slurmctld: partition
``spot`` of three node sets, ``cheap`` (Weight 1), ``middle`` (Weight 5) and ``other``
(Weight 10), two one-CPU local nodes each; ``slurm-spot local capacity SET 0`` takes a node
set's capacity away.

- A 1-node ``--requeue`` job with ``cheap`` out of capacity runs on ``middle`` within 30 s of
  the capacity error (goal 10 s) instead of waiting out Slurm's ~121 s requeue hold (211 s
  from submission before), not FAILED; the events, the job's AdminComment and ``slurm-spot
  status`` say where it went and why. The measured seconds are printed and written to
  ``<cluster root>/failover-seconds.json`` (benchmarks/capacity_failover.py keeps the method
  for BENCHMARKS.md).
- With ``cheap`` and ``middle`` out of capacity it runs on ``other``, each failed node set
  tried once.
- A 2-node job with ``cheap`` out of capacity gets both its nodes from one other node set.
- A running job whose node gets an interruption notice while its own node set has no
  capacity: the replacement comes from another node set and the requeued job runs there.
- A PrologSlurmctld that starts late (a busy controller) does not hold the failover up: the
  job slurmctld keeps in ``Reason=Cleaning`` after it is placed on ``middle`` within seconds.
- Capacity returning: once the cooldown is ended, a new job runs on ``cheap`` again and
  status shows its capacity ``ok`` (and the last failovers).

One cluster for the module (reconciler running, as ``local up`` starts it); each test gives
back the capacity it took, cancels its jobs and ends the cooldowns it caused
(:func:`_settle`, what docs/admin.md tells an admin to do when capacity is back), so the
tests pass in any order.
"""

from __future__ import annotations

import json
import re
import subprocess
import time
from collections.abc import Iterator
from datetime import datetime

import pytest

from slurm_spot.hostlist import expand
from slurm_spot.jsonenvelope import read_envelope
from tests.cluster import Cluster, base_config, wait_for
from tests.conftest import _slurm_available

pytestmark = pytest.mark.e2e
COOLDOWN_S = 120  # longer than a test: a failed node set must stay skipped while jobs start
SETS = {"cheap": 1, "middle": 5, "other": 10}  # node set -> Weight
NODES = [f"{name}-{i}" for name in SETS for i in (1, 2)]
#: What slurm-spot controls: the hold cleared and the job allocated on the next node set
#: (goal 10 s; measured 1.7 s).
ALLOCATED_WITHIN_S = 10.0
#: Error -> RUNNING: boot of the local instance (~8 s), then the job is CONFIGURING until
#: slurm-spot-prolog-slurmctld sees its node registered (docs/admin.md, "Batch launch on
#: powered-up nodes"); without that prolog slurmctld launches it on its next periodic
#: job_time_limit pass (every 30 s, PERIODIC_TIMEOUT): measured 25.7-26.1 s then. The bound
#: stays boot + 30 s.
RUNNING_WITHIN_S = 40.0
#: The module's PrologSlurmctld first sleeps the seconds this file in the cluster's root holds
#: (:func:`_delayable_prolog_slurmctld`); no file: no sleep.
PROLOG_DELAY_FILE = "prolog-slurmctld-delay"

# The step exits 85 (RequeueExit) on SIGUSR2, its "checkpoint" instant; the batch script says
# where each run started.
NOTICE_SCRIPT = """#!/bin/bash
echo "run ${SLURM_RESTART_COUNT:-0} on ${SLURM_JOB_NODELIST}"
srun --kill-on-bad-exit=0 bash -c 'trap "exit 85" USR2; while true; do sleep 0.2; done'
exit $?
"""


@pytest.fixture(scope="module")
def three_sets(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    """``spot`` = ``cheap`` + ``middle`` + ``other`` (:data:`SETS`), 2 nodes each."""
    if not _slurm_available():
        pytest.fail("slurmctld is not installed: run 'make test', which installs slurm-wlm")
    root = tmp_path_factory.mktemp("failover")
    # A job without saves is assumed to checkpoint in 5 s: on a notice of 40 s it is
    # signalled when its replacement is up, not at once (tests/test_prewarm_e2e.py).
    config = base_config(root, preemption={"default_checkpoint_s": 5})
    config["node_sets"] = [{"name": name, "provider": "local", "count": 2, "cpus": 1,
                            "weight": weight} for name, weight in SETS.items()]
    config["partitions"] = [{"name": "spot", "node_sets": list(SETS), "default": True}]
    config["reconcile"] = {"interval_s": 5, "orphan_grace_s": 20, "cooldown_s": COOLDOWN_S}
    # A node powered down between tests is idle~ again 5 s later (a local instance stops at
    # once), not 10 s.
    config["power"]["suspend_timeout_s"] = 5
    c = Cluster(root, config, reconcile=True)
    c.start()
    try:
        _delayable_prolog_slurmctld(c)
        yield c
    finally:
        c.stop()


@pytest.fixture
def spot(three_sets: Cluster) -> Iterator[Cluster]:
    """The module's cluster, every node set with capacity, no cooldown and every node
    ``idle~`` before and after the test (:func:`_settle`)."""
    _settle(three_sets)
    try:
        yield three_sets
    finally:
        _settle(three_sets)


def _delayable_prolog_slurmctld(c: Cluster) -> None:
    """Put a wrapper in front of slurm-spot-prolog-slurmctld in the cluster's slurm.conf
    fragment (``scontrol reconfigure``: slurmctld runs that program, the slurmds do not) that
    first sleeps the seconds :data:`PROLOG_DELAY_FILE` holds: how a busy controller starts the
    program, seconds late."""
    fragment = c.conf_dir / "slurm-spot.conf"
    text = fragment.read_text()
    found = re.search(r"^PrologSlurmctld=(\S+)$", text, re.MULTILINE)
    assert found, f"no PrologSlurmctld line in {fragment}"
    delay = c.root / PROLOG_DELAY_FILE
    wrapper = c.root / "prolog-slurmctld-delayable"
    wrapper.write_text(f"#!/bin/sh\nif [ -r {delay} ]; then sleep \"$(cat {delay})\"; fi\n"
                       f"exec {found.group(1)} \"$@\"\n")
    wrapper.chmod(0o755)
    fragment.write_text(text.replace(found.group(0), f"PrologSlurmctld={wrapper}"))
    c.slurm("scontrol", "reconfigure")
    wait_for(lambda: str(wrapper) in c.slurm("scontrol", "show", "config"), timeout=30,
             what="slurmctld running the delayable PrologSlurmctld")


def _capacity(c: Cluster, node_set: str, count: str | None = None) -> None:
    """``slurm-spot local capacity NODE_SET [COUNT]`` (no COUNT: no limit)."""
    c.spot("local", "capacity", node_set, *([count] if count is not None else []),
           "--conf-dir", str(c.conf_dir))


def _settle(c: Cluster) -> None:
    """Give every node set its capacity back, cancel every job, end every capacity cooldown
    and power every node down, until each is ``idle~`` with its node set's Weight of
    slurm.conf: Slurm prefers a node that is up over any powered-down one whatever their
    Weights (slurm.conf(5), Weight, NOTE), so a node a test left up would take the next
    test's job. Cooldowns are ended until none is left: a failed node still powering down
    when they were ended can be cooled again by a reconciler pass that read the nodes
    before."""
    from slurm_spot.config import load_config
    from slurm_spot.lifecycle.weights import static_weights

    subprocess.run(["scancel", "-u", "root"], env=c.env, check=False, timeout=30)
    for name in SETS:
        _capacity(c, name)
    weights = static_weights(load_config(c.spot_yaml))

    unsettled: dict[str, str] = {}

    def settled() -> bool:
        c.end_cooldowns()
        unsettled.clear()
        for name in NODES:
            node = c.node(name)
            flags = set(node["State"].split("+"))
            if flags & {"IDLE"} and not flags & {"POWERED_DOWN", "POWERING_DOWN",
                                                   "POWERING_UP", "DOWN", "DRAIN"}:
                c.slurm("scontrol", "update", f"nodename={name}", "state=POWER_DOWN",
                        check=False)
            # NOT_RESPONDING stays on a powered-down node whose cooldown was ended (the
            # admin's RESUME) until it boots; slurmctld allocates it all the same.
            if not {"IDLE", "POWERED_DOWN"} <= flags or flags & {
                    "DOWN", "DRAIN", "POWERING_DOWN", "POWERING_UP"} or \
                    node.get("Weight") != str(weights[_set_of(name)]):
                unsettled[name] = (f"{node['State']} Weight={node.get('Weight')} "
                                   f"Reason={node.get('Reason', '')}")
        return not unsettled

    try:
        wait_for(settled, timeout=90, interval=1.0, what="every node idle~ with its Weight")
    except AssertionError as exc:
        raise AssertionError(f"{exc}: {unsettled} (slurm.conf's: {weights})") from None


def _file_events(c: Cluster, since: float = 0.0) -> list[dict]:
    """The events file's events (no earlier than ``since``, epoch seconds: this test's)."""
    path = c.log_dir / "events.jsonl"
    if not path.exists():
        return []
    found = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return [e for e in found if datetime.fromisoformat(e["time"]).timestamp() >= since]


def _job_events(c: Cluster, job: int, action: str) -> list[dict]:
    return [e for e in _file_events(c) if e["action"] == action and job in (e["job_ids"] or [])]


def _set_of(node: str) -> str:
    return node.rsplit("-", 1)[0]


def _running(c: Cluster, job: int, timeout: float = 120) -> dict[str, str]:
    found = wait_for(lambda: c.job(job).get("JobState") == "RUNNING" and c.job(job),
                     timeout=timeout, interval=0.25, what=f"job {job} RUNNING")
    return found  # type: ignore[return-value]


def _status(c: Cluster) -> dict:
    return read_envelope(c.spot("status", "--json").stdout, "status")


def test_no_capacity_on_cheap_runs_the_job_on_the_next_node_set_within_seconds(
        spot: Cluster) -> None:
    c = spot
    t0 = time.time()
    _capacity(c, "cheap", "0")
    job = c.sbatch("-p", "spot", "-N", "1", "--requeue", "-o", "/dev/null",
                   "--wrap", "sleep 120")
    submitted = time.time()
    info = _running(c, job, timeout=90)
    running_at = time.time()
    failed = [e for e in _file_events(c, t0)
              if e["action"] == "launch_failed" and e["node"].startswith("cheap-")]
    assert failed, "the job never met the capacity error on cheap"
    error_at = datetime.fromisoformat(failed[0]["time"]).timestamp()
    seconds = running_at - error_at
    record = {"job": job, "error_to_running_s": round(seconds, 2),
              "submit_to_running_s": round(running_at - submitted, 2),
              "nodes": info["NodeList"]}
    (c.root / "failover-seconds.json").write_text(json.dumps(record))
    print(f"\nfailover: capacity error -> RUNNING on {info['NodeList']}: {seconds:.1f} s "
          f"(submission -> RUNNING {running_at - submitted:.1f} s)")
    assert info["NodeList"].startswith("middle-"), info["NodeList"]  # the next by Weight
    assert info["Restarts"] == "1"  # requeued once by the failed launch, nothing more
    assert len(failed) == 1, "cheap was tried again during its cooldown"
    assert seconds < RUNNING_WITHIN_S, f"{record}\n{c.diagnosis(40)}"
    # where it went and why: events, then the job's AdminComment
    moved = wait_for(lambda: _job_events(c, job, "failover_started"), timeout=10,
                     what="failover_started event")
    started = moved[0]  # type: ignore[index]
    record["error_to_allocated_s"] = started["extra"]["seconds_from_error"]
    (c.root / "failover-seconds.json").write_text(json.dumps(record))
    print(f"failover: capacity error -> allocated on middle: "
          f"{record['error_to_allocated_s']} s")
    assert record["error_to_allocated_s"] < ALLOCATED_WITHIN_S, f"{record}\n{c.diagnosis(40)}"
    assert started["extra"]["from_node_set"] == "cheap"
    assert started["extra"]["node_set"] == "middle"
    assert started["extra"]["code"] == "InsufficientInstanceCapacity"
    (failover,) = _job_events(c, job, "failover")
    assert failover["extra"]["expedited"] is True
    assert failover["extra"]["candidates"] == ["middle", "other"]  # lowest Weight first
    assert "no capacity on node set cheap" in failover["reason"]
    comment = wait_for(lambda: c.job(job).get("AdminComment", ""), timeout=10,
                       what="AdminComment")
    assert "failover: no capacity on node set cheap" in comment  # type: ignore[operator]
    assert "started on node set middle" in comment  # type: ignore[operator]
    # cheap stays skipped while its cooldown lasts; status says so, and where the job went
    for name in ("cheap-1", "cheap-2"):
        assert "Temporarily disabled until" in c.node(name).get("Reason", "") \
            or "POWER" in c.node(name)["State"]
    status = _status(c)
    sets = {s["node_set"]: s for s in status["node_sets"]}
    assert sets["cheap"]["capacity"] == "cooldown" and sets["cheap"]["until"]
    assert sets["middle"]["capacity"] == "ok" and sets["other"]["capacity"] == "ok"
    last = status["failovers"][0]
    assert (last["job"], last["from_node_set"], last["to_node_set"]) == (job, "cheap", "middle")
    assert last["nodes"] == [info["NodeList"]] and last["code"] == "InsufficientInstanceCapacity"
    assert c.job(job)["JobState"] in ("RUNNING", "COMPLETING", "COMPLETED")


def test_a_prolog_slurmctld_that_starts_late_does_not_hold_the_failover_up(
        spot: Cluster) -> None:
    """slurmctld 22.05 requeues a job whose node is set DOWN while its PrologSlurmctld still
    runs as PENDING, Reason=Cleaning, and keeps it so after that program ends (the failed node
    sends no epilog): the failover worker sets the failed node DOWN again, so the job is
    allocated on ``middle`` seconds after the error, not at the reconciler's next cooldown
    write (12-17 s with the program 4 s late; 16.7 s in a fresh-clone CI run)."""
    c = spot
    _capacity(c, "cheap", "0")
    (c.root / PROLOG_DELAY_FILE).write_text("2\n")
    try:
        job = c.sbatch("-p", "spot", "-N", "1", "--requeue", "-o", "/dev/null",
                       "--wrap", "sleep 120")
        moved = wait_for(lambda: _job_events(c, job, "failover_started"), timeout=90,
                         what="failover_started event")
    finally:
        (c.root / PROLOG_DELAY_FILE).unlink(missing_ok=True)
    started = moved[0]  # type: ignore[index]
    print(f"\nfailover, PrologSlurmctld 2 s late: capacity error -> allocated on "
          f"{started['extra']['node_set']}: {started['extra']['seconds_from_error']} s")
    assert started["extra"]["node_set"] == "middle"
    assert started["extra"]["seconds_from_error"] < ALLOCATED_WITHIN_S, \
        f"{started}\n{c.diagnosis(40)}"
    info = _running(c, job, timeout=60)
    assert info["NodeList"].startswith("middle-") and info["Restarts"] == "1", info


def test_two_node_sets_without_capacity_the_job_runs_on_the_third(spot: Cluster) -> None:
    """Each failed node set is tried once, in Weight order, and the events and AdminComment
    say both moves."""
    c = spot
    t0 = time.time()
    _capacity(c, "cheap", "0")
    _capacity(c, "middle", "0")
    job = c.sbatch("-p", "spot", "-N", "1", "--requeue", "-o", "/dev/null",
                   "--wrap", "sleep 120")
    info = _running(c, job, timeout=150)
    assert _set_of(info["NodeList"]) == "other", info["NodeList"]
    assert info["Restarts"] == "2"  # one requeue per node set without capacity
    failed = [e["node"] for e in _file_events(c, t0) if e["action"] == "launch_failed"]
    assert [_set_of(n) for n in failed] == ["cheap", "middle"], failed  # each tried once
    moves = [(e["extra"]["from_node_set"], e["extra"]["candidates"])
             for e in _job_events(c, job, "failover")]
    assert moves == [("cheap", ["middle", "other"]), ("middle", ["other"])], moves
    started = wait_for(lambda: {e["extra"]["from_node_set"]: e["extra"]["node_set"]
                                for e in _job_events(c, job, "failover_started")
                                if e["extra"]["from_node_set"] == "middle"}, timeout=10,
                       what="failover_started event of the move off middle")
    assert started == {"middle": "other"}
    comment = wait_for(lambda: "started on node set other" in c.job(job).get(
        "AdminComment", "") and c.job(job)["AdminComment"], timeout=10, what="AdminComment")
    assert "no capacity on node set cheap" in comment  # type: ignore[operator]
    assert "no capacity on node set middle" in comment  # type: ignore[operator]
    sets = {s["node_set"]: s["capacity"] for s in _status(c)["node_sets"]}
    assert sets == {"cheap": "cooldown", "middle": "cooldown", "other": "ok"}


def test_a_two_node_job_gets_both_nodes_from_another_node_set(spot: Cluster) -> None:
    c = spot
    t0 = time.time()
    _capacity(c, "cheap", "0")
    job = c.sbatch("-p", "spot", "-N", "2", "--requeue", "-o", "/dev/null",
                   "--wrap", "srun sleep 120")
    info = _running(c, job, timeout=150)
    nodes = expand(info["NodeList"])
    assert len(nodes) == 2 and {_set_of(n) for n in nodes} == {"middle"}, nodes
    assert info["Restarts"] == "1"
    failed = [e["node"] for e in _file_events(c, t0) if e["action"] == "launch_failed"]
    assert sorted(failed) == ["cheap-1", "cheap-2"], failed  # both at once, once
    started = wait_for(lambda: _job_events(c, job, "failover_started"), timeout=10,
                       what="failover_started event")
    (move,) = started  # type: ignore[misc]
    assert (move["extra"]["from_node_set"], move["extra"]["node_set"]) == ("cheap", "middle")
    assert sorted(move["extra"]["nodes"]) == sorted(nodes)


def test_capacity_back_a_new_job_runs_on_cheap_again(spot: Cluster) -> None:
    """After a failover, capacity returns and the cooldown ends: status says ``ok`` and
    still shows where the last failover went; the next job runs on ``cheap``."""
    c = spot
    _capacity(c, "cheap", "0")
    moved = c.sbatch("-p", "spot", "-N", "1", "--requeue", "-o", "/dev/null",
                     "--wrap", "sleep 120")
    assert _set_of(_running(c, moved, timeout=90)["NodeList"]) == "middle"
    c.slurm("scancel", str(moved))
    _capacity(c, "cheap")  # capacity is back, the cooldown still runs
    sets = {s["node_set"]: s for s in _status(c)["node_sets"]}
    assert sets["cheap"]["capacity"] == "cooldown"
    _settle(c)  # the admin ends it (docs/admin.md)
    status = _status(c)
    sets = {s["node_set"]: s for s in status["node_sets"]}
    assert [sets[n]["capacity"] for n in SETS] == ["ok", "ok", "ok"], sets
    assert sets["cheap"]["until"] is None
    last = status["failovers"][0]
    assert (last["job"], last["from_node_set"], last["to_node_set"]) == (moved, "cheap", "middle")
    job = c.sbatch("-p", "spot", "-N", "1", "--requeue", "-o", "/dev/null",
                   "--wrap", "sleep 120")
    info = _running(c, job, timeout=90)
    assert _set_of(info["NodeList"]) == "cheap", info["NodeList"]
    assert info["Restarts"] == "0"
    assert _job_events(c, job, "failover") == []
    # and the table a person reads says the same
    text = c.spot("status", "--capacity").stdout
    assert "last failovers" in text, text
    (row,) = [line for line in text.splitlines() if line.split()[:1] == ["cheap"]]
    assert row.split()[3] == "ok", row


def test_notice_while_its_node_set_has_no_capacity_the_replacement_comes_from_another(
        spot: Cluster) -> None:
    """A job on ``cheap`` gets a 40 s notice after ``cheap`` lost its capacity: the watcher's
    replacement on ``cheap`` fails to launch, the next one comes from ``middle``, and the
    requeued job runs there (not FAILED)."""
    c = spot
    t0 = time.time()
    script = c.root / "notice-job.sh"
    script.write_text(NOTICE_SCRIPT)
    out = c.root / "notice-job.out"
    out.unlink(missing_ok=True)
    job = c.sbatch("-p", "spot", "-N", "1", "--requeue", "-o", str(out), str(script))
    wait_for(lambda: out.exists() and "run 0" in out.read_text(), timeout=120,
             what="the job running")
    victim = c.job(job)["NodeList"]
    assert _set_of(victim) == "cheap", victim
    _capacity(c, "cheap", "0")
    c.spot("local", "preempt", victim, "--notice", "40", "--conf-dir", str(c.conf_dir))
    wait_for(lambda: "run 1 on" in out.read_text(), timeout=150,
             what="the requeued job running again")
    after = c.job(job)
    assert after["JobState"] == "RUNNING", after
    assert _set_of(after["NodeList"]) == "middle", after["NodeList"]
    assert after["Restarts"] == "1"
    assert f"run 1 on {after['NodeList']}" in out.read_text()
    prewarms = [e for e in c.events() if e.get("source") == "watch"
                and e["action"] == "prewarm" and job in (e.get("job_ids") or [])]
    assert len(prewarms) == 2, prewarms
    first, again = prewarms
    (tried,) = first["extra"]["power_up"]
    assert _set_of(tried) == "cheap", first  # cheap had no cooldown yet: tried first
    assert again["extra"]["failed"] == [tried]
    assert again["extra"]["power_up"] == [after["NodeList"]]  # the job is on the replacement
    failed = [e for e in _file_events(c, t0) if e["action"] == "launch_failed"]
    assert [e["node"] for e in failed] == [tried]
    signalled = [e for e in c.events() if e.get("source") == "watch"
                 and e["action"] == "signalled" and job in (e.get("job_ids") or [])]
    assert signalled and signalled[0]["extra"]["when"] == "replacement up", signalled
