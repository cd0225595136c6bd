"""sacct on the local cluster (private MariaDB + slurmdbd) after an interrupted job, and
``slurm-spot cost`` reading its runs from there."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path

import pytest

from slurm_spot.hostlist import expand
from slurm_spot.jsonenvelope import read_envelope
from tests.cluster import Cluster, base_config, wait_for
from tests.conftest import _slurm_available

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def acct(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    if not _slurm_available():
        pytest.fail("slurmctld is not installed: run 'make test', which installs slurm-wlm")
    if not Path("/usr/sbin/slurmdbd").exists() or not Path("/usr/sbin/mariadbd").exists():
        pytest.fail("slurmdbd / mariadb-server are not installed: run 'make setup'")
    root = tmp_path_factory.mktemp("acct")
    config = base_config(root, cost={"spot_usd_per_hour": {"local": 0.25},
                                     "on_demand_usd_per_hour": {"local": 1.0}})
    c = Cluster(root, config, reconcile=True, accounting=True)
    c.start()
    try:
        yield c
    finally:
        c.stop()


def sacct(c: Cluster, job: int) -> list[dict[str, str]]:
    fields = ["JobIDRaw", "State", "NodeList", "Start", "End", "AdminComment"]
    out = c.slurm("sacct", "-j", str(job), "-X", "-D", "-n", "-P", f"--format={','.join(fields)}")
    return [dict(zip(fields, line.split("|", len(fields) - 1), strict=True))
            for line in out.splitlines() if line]


def test_sacct_shows_the_interrupted_run_and_its_requeue(acct: Cluster) -> None:
    record = json.loads((acct.state_dir / "local" / "cluster.json").read_text())
    assert record["mysqld_pid"] and record["slurmdbd_pid"]
    job = acct.sbatch("-p", "spot", "-N", "1", "--requeue", "-o", "/dev/null",
                      "--wrap", "sleep 20")
    wait_for(lambda: acct.job(job).get("JobState") == "RUNNING", timeout=90, what="job running")
    victim = expand(acct.job(job)["NodeList"])[0]
    acct.spot("local", "preempt", victim, "--notice", "0", "--conf-dir", str(acct.conf_dir))
    wait_for(lambda: acct.job(job).get("Restarts", "0") != "0", timeout=60, interval=0.25,
             what="job requeued")
    wait_for(lambda: acct.job(job).get("JobState") == "COMPLETED", timeout=180,
             what="job completed after its requeue")
    runs = wait_for(lambda: (rows := sacct(acct, job)) and len(rows) == 2
                    and rows[-1]["State"] == "COMPLETED" and rows, timeout=30,
                    what="sacct to show both runs")
    first, second = runs
    assert first["State"] in ("REQUEUED", "NODE_FAIL") and first["NodeList"] == victim
    assert "requeued: spot-interruption:reclaimed@" in second["AdminComment"]
    report = read_envelope(acct.spot("cost", "--job", str(job), "--json").stdout)[0]
    assert report["source"] == "sacct" and report["interruptions"] == 1
    (line,) = report["lines"]
    assert line["market"] == "spot" and line["instance_type"] == "local"
    # two runs on one node: the first until the kill (sacct's whole seconds: it can be 0),
    # the second the full 20 s sleep; the report bills exactly what sacct shows
    seconds = [(datetime.fromisoformat(r["End"]) - datetime.fromisoformat(r["Start"]))
               .total_seconds() for r in runs]
    assert seconds[0] >= 0 and seconds[1] >= 20
    assert line["node_hours"] == pytest.approx(sum(seconds) / 3600)
    assert line["node_hours"] < 0.1
    assert report["compute_usd"] == pytest.approx(line["node_hours"] * 0.25)
    assert report["saving_percent"] == pytest.approx(75.0)
    subprocess.run(["scancel", str(job)], env=acct.env, check=False)


FRAMEWORKS = Path(__file__).parent / "data" / "frameworks"


@pytest.mark.parametrize("spare", [False, True], ids=["no-spare-capacity", "spare-capacity"])
def test_a_submitit_job_given_a_notice_is_requeued_once_and_its_client_sees_success(
        acct: Cluster, spare: bool) -> None:
    """Issue 25: a submitit ``Checkpointable`` job requeues itself on the watcher's signal
    (USR2), with no spare node for a replacement (the others drained), and with one (the
    replacement is powered up during the notice). Its save takes 11 s
    of the 20 s notice and its process leaves 4 s after its ``scontrol requeue``: still on
    the node (REQUEUED, completing) when the watcher's power-down is due (deadline - 5 s).
    The watcher must then only wait for it to leave and clear its requeue delay: one requeue
    for one notice, and no NODE_FAIL record (which submitit's ``job.result()``, reading sacct,
    takes for the job's end: ``UncompletedJobError (state: NODE_FAIL)`` while the job goes
    on)."""
    pytest.importorskip("submitit")
    work = acct.root / f"submitit-work-{spare}"
    work.mkdir()
    env = {**acct.env, "PYTHONPATH": str(FRAMEWORKS)}
    script = str(FRAMEWORKS / "submitit_job.py")
    folder = str(acct.root / f"submitit-{spare}")
    proc = subprocess.run([sys.executable, script, folder, str(work), "60",
                           "11", "4"],
                          env=env, capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 0, proc.stderr
    job = int(proc.stdout.split()[-1])
    client = subprocess.Popen([sys.executable, script, "result", folder,
                               str(job), "2"], env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True)
    others: list[str] = []
    try:
        wait_for(lambda: any('"step"' in line for line in _lines(work / "events.jsonl")),
                 timeout=120, what="the submitit job training")
        victim = acct.job(job)["NodeList"]
        others = [] if spare else _drain_all_but(acct, victim)
        acct.spot("local", "preempt", victim, "--notice", "20", "--conf-dir",
                  str(acct.conf_dir))
        wait_for(lambda: acct.job(job).get("Restarts", "0") != "0"
                 or acct.job(job).get("JobState") == "PENDING", timeout=60, interval=0.25,
                 what="the job requeued")
        out, err = client.communicate(timeout=300)
    finally:
        client.kill()
        if others:
            acct.slurm("scontrol", "update", f"nodename={','.join(others)}", "state=RESUME")
    wait_for(lambda: acct.job(job).get("JobState") == "COMPLETED", timeout=120,
             what="the job completed")
    runs = wait_for(lambda: (rows := sacct(acct, job)) and rows[-1]["State"] == "COMPLETED"
                    and rows, timeout=30, what="sacct to show the last run")
    states = [r["State"].split()[0] for r in runs]
    record = acct.job(job)
    assert client.returncode == 0 and out.split()[-1] == "60", (err[-3000:], states, record)
    assert record["Restarts"] == "1", (states, record)
    # Before the fix the power-down came while the job was leaving: sacct showed only the
    # COMPLETED run (the interrupted one's record lost), or NODE_FAIL (the report).
    assert states in (["REQUEUED", "COMPLETED"], ["PREEMPTED", "COMPLETED"]), runs
    assert not [e for e in acct.events() if e["action"] == "requeue_ended"
                and job in e["job_ids"]]  # the watcher never requeued it a second time


@pytest.mark.parametrize(("requeue_signal", "spare"), [("USR1", True), ("USR2", False)],
                         ids=["usr1-spare-capacity", "usr2-no-spare-capacity"])
def test_a_lightning_job_given_a_notice_is_requeued_once_and_resumes(
        acct: Cluster, requeue_signal: str, spare: bool) -> None:
    """Issue 25: a Lightning job (``SLURMEnvironment(auto_requeue=True)``, SIGUSR1 by default,
    or the SIGUSR2 its user chose) on a cluster with slurmdbd, given a 20 s notice with a
    spare node for the replacement and without one. Lightning saves its hpc checkpoint and
    runs ``scontrol requeue`` itself; the watcher must not requeue it again: one requeue for
    one notice, no NODE_FAIL or FAILED record, and the job resumes from its checkpoint."""
    pytest.importorskip("lightning")
    from tests.test_signals_e2e import job_events, last, script, step

    work = acct.root / f"lightning-{requeue_signal}"
    work.mkdir()
    job = acct.sbatch("-p", "spot", "-N", "1", "--ntasks-per-node=1", "-o",
                      str(work / "job.out"), str(script(
                          acct, f"lightning-{requeue_signal}",
                          f"srun {sys.executable} {FRAMEWORKS / 'lightning_job.py'} {work} 100"
                          + (" USR2" if requeue_signal == "USR2" else ""),  # USR1: the default
                          f"#SBATCH --signal=SIG{requeue_signal}@90\n#SBATCH --requeue\n")))
    others: list[str] = []
    try:
        wait_for(lambda: step(work) >= 6, timeout=180, what="the Lightning job training")
        victim = acct.job(job)["NodeList"]
        others = [] if spare else _drain_all_but(acct, victim)
        acct.spot("local", "preempt", victim, "--notice", "20", "--conf-dir",
                  str(acct.conf_dir))
        wait_for(lambda: acct.job(job).get("Restarts", "0") != "0", timeout=90, interval=0.25,
                 what="the job requeued")
        if others:  # capacity comes back once the job has left: it runs again
            acct.slurm("scontrol", "update", f"nodename={','.join(others)}", "state=RESUME")
            others = []
        wait_for(lambda: last(work, "done"), timeout=240, what="the job done after its requeue")
        wait_for(lambda: acct.job(job).get("JobState") == "COMPLETED", timeout=60,
                 what="the job COMPLETED")
    finally:
        if others:
            acct.slurm("scontrol", "update", f"nodename={','.join(others)}", "state=RESUME")
        subprocess.run(["scancel", str(job)], env=acct.env, check=False)
    runs = wait_for(lambda: (rows := sacct(acct, job)) and rows[-1]["State"] == "COMPLETED"
                    and rows, timeout=30, what="sacct to show the last run")
    states = [r["State"].split()[0] for r in runs]
    assert acct.job(job)["Restarts"] == "1", states
    assert states in (["REQUEUED", "COMPLETED"], ["PREEMPTED", "COMPLETED"]), runs
    assert not [e for e in acct.events() if e["action"] == "requeue_ended"
                and job in e["job_ids"]]  # the watcher never requeued it a second time
    signalled = [e for e in acct.events() if e["source"] == "watch"
                 and e["action"] == "signalled" and job in e["job_ids"]]
    assert [e["extra"]["signal"] for e in signalled] == [requeue_signal]
    starts = [e for e in job_events(work) if e["event"] == "start"]
    assert len(starts) == 2 and starts[1]["step"] >= 6, starts  # resumed, not restarted
    assert "Restored all states from the checkpoint at" in (work / "job.out").read_text()


def _drain_all_but(acct: Cluster, victim: str) -> list[str]:
    """Drain every node of the partition but ``victim``: no spare capacity for a replacement;
    returns the drained nodes (to resume afterwards)."""
    others = [n for n in expand(acct.slurm("sinfo", "-h", "-p", "spot", "-o", "%N").strip())
              if n != victim]
    acct.slurm("scontrol", "update", f"nodename={','.join(others)}", "state=DRAIN",
               "reason=test: no spare capacity")
    return others


def _lines(path: Path) -> list[str]:
    return path.read_text().splitlines() if path.exists() else []


def test_local_down_stops_the_database_daemons(tmp_path: Path, acct: Cluster) -> None:
    record = json.loads((acct.state_dir / "local" / "cluster.json").read_text())
    status = read_envelope(acct.spot("local", "status", "--json", "--conf-dir",
                                  str(acct.conf_dir)).stdout)
    assert status["up"]
    for pid in (record["mysqld_pid"], record["slurmdbd_pid"]):
        assert Path(f"/proc/{pid}").exists()
    acct.stop()
    for pid in (record["mysqld_pid"], record["slurmdbd_pid"]):
        wait_for(lambda pid=pid: not Path(f"/proc/{pid}").exists()
                 or "zombie" in Path(f"/proc/{pid}/status").read_text().lower(),
                 timeout=30, what=f"pid {pid} gone")
    acct.start()  # the module fixture stops it again; a restart must work too
    assert read_envelope(acct.spot("local", "status", "--json", "--conf-dir",
                                str(acct.conf_dir)).stdout)["up"]
