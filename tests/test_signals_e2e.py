"""Jobs of any framework survive an interruption with notice, on a real local Slurm: each gets
the signal it handles (or none it would die of), and none ends FAILED."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
from collections.abc import Iterable, Iterator
from pathlib import Path

import pytest

from slurm_spot.jsonenvelope import read_envelope
from tests.cluster import Cluster, base_config, wait_for

pytestmark = pytest.mark.e2e

JOB = Path(__file__).parent / "data" / "handler_job.py"
PY = sys.executable
# 50 s of steps: each notice (one ``slurm-spot local preempt`` after the other, seconds each
# on a loaded machine) must reach its job while it still trains.
LONG = "--steps 200"


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    """Eight one-CPU nodes: four jobs at once, and room for them to come back elsewhere."""
    root = tmp_path_factory.mktemp("signals")
    config = base_config(root)
    config["node_sets"][0]["count"] = 8
    c = Cluster(root, config)
    c.start()
    try:
        yield c
    finally:
        c.stop()


def job_events(work: Path) -> list[dict]:
    path = work / "events.jsonl"
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.startswith("{")]


def last(work: Path, name: str) -> dict | None:
    found = [e for e in job_events(work) if e["event"] == name]
    return found[-1] if found else None


def step(work: Path) -> int:
    steps = [e["step"] for e in job_events(work) if e["event"] in ("step", "start")]
    return max(steps) if steps else -1


def script(cluster: Cluster, name: str, body: str, directives: str = "") -> Path:
    path = cluster.root / f"{name}.sh"
    path.write_text(f"#!/bin/bash\n{directives}{body}\n")
    return path


def watch_events(cluster: Cluster, action: str, job: int) -> list[dict]:
    return [e for e in cluster.events()
            if e["source"] == "watch" and e["action"] == action and job in e["job_ids"]]


def completed(cluster: Cluster, jobs: Iterable[int]) -> bool:
    """True once every job is COMPLETED (the done line comes before the epilog ends)."""
    return all(cluster.job(job).get("JobState") == "COMPLETED" for job in jobs)


def preempt(cluster: Cluster, node: str, notice_s: int) -> None:
    cluster.spot("local", "preempt", node, "--notice", str(notice_s),
                 "--conf-dir", str(cluster.conf_dir))


def test_each_job_gets_the_signal_it_handles_and_none_ends_failed(cluster: Cluster) -> None:
    """Four jobs, four conventions, one notice each (20 s):

    - plain sbatch ``--signal=USR1@60 --requeue``, code handling only SIGUSR1 under srun
      (the way Lightning's users submit): gets SIGUSR1, saves, exits 138, resumes;
    - plain sbatch ``--requeue``, code handling only SIGTERM, run by the script itself (no
      srun): gets SIGTERM (its own process, not the shell), saves, exits 143, resumes;
    - code handling nothing: gets no signal; it then dies of a SIGTERM from the node's
      shutdown (sent here by the test, as Google Cloud's ACPI shutdown would) and is requeued;
    - submitted with ``slurm-spot sbatch``, handling SIGUSR2: exits with the requeue code.
    """
    root = cluster.root
    work = {name: root / name for name in ("usr1", "term", "none", "spot")}
    jobs = {
        "usr1": cluster.sbatch("-p", "spot", "-N", "1", "-o", str(root / "usr1.out"), str(script(
            cluster, "usr1", f"srun {PY} {JOB} --handle USR1 {LONG} --dir {work['usr1']}",
            "#SBATCH --signal=USR1@60\n#SBATCH --requeue\n#SBATCH --open-mode=append\n"))),
        "term": cluster.sbatch("-p", "spot", "-N", "1", "--requeue", "-o", str(root / "t.out"),
                               str(script(cluster, "term",
                                          f"{PY} {JOB} --handle TERM {LONG} --dir {work['term']}"))),
        "none": cluster.sbatch("-p", "spot", "-N", "1", "--requeue", "-o", str(root / "n.out"),
                               str(script(cluster, "none",
                                          f"{PY} {JOB} --handle none {LONG} --dir {work['none']}"))),
    }
    spot_script = script(cluster, "spot", f"srun {PY} {JOB} --handle USR2 --exit-code 85 {LONG} "
                                          f"--dir {work['spot']}")
    jobs["spot"] = int(read_envelope(cluster.spot(
        "sbatch", "--json", "-p", "spot", "-N", "1", "-o", str(root / "s.out"),
        str(spot_script)).stdout)["job_id"])
    wait_for(lambda: all(step(w) >= 4 for w in work.values()), timeout=180,
             what="all four jobs stepping")
    for job in jobs.values():
        preempt(cluster, cluster.job(job)["NodeList"], 20)

    # The job that handles nothing gets nothing from the watcher; the shutdown then kills it.
    wait_for(lambda: watch_events(cluster, "signal_withheld", jobs["none"]), timeout=30,
             what="the watcher withholding the signal from the job that handles none")
    start = last(work["none"], "start")
    assert start is not None
    os.kill(int(start["pid"]), signal.SIGTERM)

    wait_for(lambda: all(last(w, "done") for w in work.values()), timeout=300,
             what="all four jobs done after the interruption")
    wait_for(lambda: completed(cluster, jobs.values()), timeout=60, what="all four COMPLETED")
    for name, job in jobs.items():
        record = cluster.job(job)
        assert record["JobState"] == "COMPLETED", (name, record)
        assert int(record["Restarts"]) >= 1, (name, record)

    expected = {"usr1": (10, "its own --signal=USR1@60"), "term": (15, "catch SIGTERM"),
                "spot": (12, "its own --signal=USR2@90")}  # the wrapper's directive
    for name, (signum, why) in expected.items():
        preempted = [e for e in job_events(work[name]) if e["event"] == "preempted"]
        starts = [e for e in job_events(work[name]) if e["event"] == "start"]
        assert [e["signal"] for e in preempted] == [signum], name
        assert starts[1]["step"] == preempted[0]["step"] >= 4, name  # its own checkpoint
        sent = watch_events(cluster, "signalled", jobs[name])
        assert len(sent) == 1 and why in sent[0]["reason"], (name, sent)
    assert watch_events(cluster, "signalled", jobs["none"]) == []
    # The job that died of the signal was requeued by the watcher, not left FAILED.
    requeued = watch_events(cluster, "requeue_ended", jobs["none"])
    assert requeued and "FAILED" in requeued[0]["reason"], requeued
    # term's own process got SIGTERM; its batch shell (which would have died) did not.
    term_sent = watch_events(cluster, "signalled", jobs["term"])[0]["extra"]
    assert term_sent["steps"] == [] and term_sent["pids"] == [first_start_pid(work["term"])]
    assert watch_events(cluster, "signalled", jobs["usr1"])[0]["extra"]["steps"] == ["0"]


def first_start_pid(work: Path) -> int:
    starts = [e for e in job_events(work) if e["event"] == "start"]
    return int(starts[0]["pid"])


def test_notice_while_the_job_starts_then_a_second_notice(cluster: Cluster) -> None:
    """The notice comes while the job is still starting (its script's 6 s of setup before
    ``srun``, as a prolog or a slow import would be): nothing of the job can catch a signal
    yet, so the watcher waits and signals the job as soon as its handler is installed. The
    same job is then interrupted a second time on its new node. It finishes, never FAILED,
    resuming from its own checkpoint both times.

    (A slow Prolog swapped in by ``scontrol reconfigure`` is not used: the slurmds already
    up kept running the old Prolog, so the job never sat in the slow one.)"""
    work = cluster.root / "prolog"
    started = cluster.root / "prolog-started"
    job = cluster.sbatch("-p", "spot", "-N", "1", "-o", str(cluster.root / "p.out"), str(script(
        cluster, "prolog",
        f"touch {started}; sleep 6\nsrun {PY} {JOB} --handle USR1 --steps 60 --dir {work}",
        "#SBATCH --signal=USR1@60\n#SBATCH --requeue\n#SBATCH --open-mode=append\n")))
    wait_for(started.exists, timeout=120, what="the job's script starting")
    node = cluster.job(job)["NodeList"]
    assert job_events(work) == []  # its handler is not installed yet
    preempt(cluster, node, 25)
    wait_for(lambda: watch_events(cluster, "signal_withheld", job), timeout=20,
             what="the watcher finding nothing to signal while the job starts")
    wait_for(lambda: len([e for e in job_events(work) if e["event"] == "start"]) == 2,
             timeout=180, what="the job back after the first notice")
    second = cluster.job(job)["NodeList"]  # a fresh instance (perhaps under the same name)
    wait_for(lambda: step(work) >= last(work, "start")["step"] + 4,  # type: ignore[index]
             timeout=60, what="the job stepping again")
    preempt(cluster, second, 20)
    wait_for(lambda: last(work, "done"), timeout=240, what="the job done after two notices")
    wait_for(lambda: completed(cluster, [job]), timeout=60, what="the job COMPLETED")
    record = cluster.job(job)
    assert record["JobState"] == "COMPLETED" and int(record["Restarts"]) >= 2, record
    events = job_events(work)
    preempted = [e for e in events if e["event"] == "preempted"]
    starts = [e for e in events if e["event"] == "start"]
    assert [e["signal"] for e in preempted] == [10, 10]
    assert [s["step"] for s in starts[1:]] == [p["step"] for p in preempted]
    assert len(watch_events(cluster, "signalled", job)) == 2


FRAMEWORKS = Path(__file__).parent / "data" / "frameworks"


def test_submitit_and_lightning_jobs_finish_after_an_interruption(cluster: Cluster) -> None:
    """Jobs from the real packages, each with its own checkpoint/requeue protocol, interrupted
    with notice at the same time: submitit's ``Checkpointable`` (its script asks for
    ``--signal=USR2@90``) and Lightning's default ``SLURMEnvironment(auto_requeue=True)``
    (``--signal=SIGUSR1@90``, run under srun). Both requeue themselves and finish, and the
    Lightning job resumes from the hpc checkpoint its handler saved.

    Each job's node gets its notice as soon as that job trains: the submitit job starts
    training well before Lightning has imported, and one waiting for the other could find it
    finished (its node then powered down, with nothing left to interrupt)."""
    pytest.importorskip("submitit")
    pytest.importorskip("lightning")
    import torch
    root = cluster.root
    sub_work, light_work = root / "submitit-work", root / "lightning-work"
    sub_work.mkdir()
    light_work.mkdir()
    env = {**cluster.env, "PYTHONPATH": str(FRAMEWORKS)}
    proc = subprocess.run([PY, str(FRAMEWORKS / "submitit_job.py"), str(root / "submitit"),
                           str(sub_work), "120"], env=env, capture_output=True, text=True,
                          timeout=120, check=False)
    assert proc.returncode == 0, proc.stderr
    sub_job = int(proc.stdout.split()[-1])
    light_job = cluster.sbatch("-p", "spot", "-N", "1", "--ntasks-per-node=1",
                               "-o", str(root / "lightning.out"), str(script(
                                   cluster, "lightning",
                                   f"srun {PY} {FRAMEWORKS / 'lightning_job.py'} {light_work} 120",
                                   "#SBATCH --signal=SIGUSR1@90\n#SBATCH --open-mode=append\n")))
    works = {sub_job: sub_work, light_job: light_work}
    nodes: dict[int, str] = {}

    def preempt_those_training() -> bool:
        for job, work in works.items():
            if job not in nodes and step(work) >= 6:
                nodes[job] = cluster.job(job)["NodeList"]
                preempt(cluster, nodes[job], 20)
        return len(nodes) == len(works)

    wait_for(preempt_those_training, timeout=240,
             what="submitit and Lightning jobs training, each then interrupted")
    wait_for(lambda: all(last(w, "done") for w in works.values()), timeout=300,
             what="both jobs done after the interruption")
    wait_for(lambda: completed(cluster, works), timeout=60, what="both COMPLETED")
    for job, work in works.items():
        record = cluster.job(job)
        assert record["JobState"] == "COMPLETED" and int(record["Restarts"]) >= 1, record
        starts = [e for e in job_events(work) if e["event"] == "start"]
        assert len(starts) == 2 and starts[1]["step"] >= 6, starts  # resumed, not restarted
        sent = watch_events(cluster, "signalled", job)
        assert len(sent) == 1, sent
    assert watch_events(cluster, "signalled", sub_job)[0]["extra"]["signal"] == "USR2"
    assert watch_events(cluster, "signalled", light_job)[0]["extra"]["signal"] == "USR1"
    assert [e["slurm"] for e in job_events(light_work) if e["event"] == "start"] == [
        "SLURMEnvironment"] * 2
    # Lightning's handler saved an hpc checkpoint; the requeued job restored it and went on
    # from its step, as its output tells the user.
    hpc = light_work / "hpc_ckpt_1.ckpt"
    saved = torch.load(hpc, map_location="cpu", weights_only=False)
    resumed = [e for e in job_events(light_work) if e["event"] == "start"][1]
    assert resumed["step"] == saved["global_step"] >= 6, (resumed, saved["global_step"])
    out = (root / "lightning.out").read_text()
    assert f"Restored all states from the checkpoint at {hpc}" in out, out[-3000:]
    assert re.findall(r"training from step (\d+) \(epoch (\d+)\)", out) == [
        ("0", "0"), (str(saved["global_step"]), str(saved["epoch"]))], out[-3000:]
