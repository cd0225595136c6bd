"""Back in seconds (issue 26) on a real slurmctld: a hot spare, and a loss without notice found
from the local provider's own events.

One cluster for both tests (file order): node set spot-[1-4] with ``spares: 1``, SuspendTime
10 s, and the reconciler running with a 60 s interval: its first pass powers the spare up,
and after that only a provider event can explain a reaction within seconds (SlurmdTimeout is
300 s, so Slurm itself notices a dead slurmd only after minutes). The measured seconds are
printed (``pytest -s``) and written to ``<root>/measured.json``; the targets live in
benchmarks/, not here.
"""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Iterator

import pytest

from slurm_spot.hostlist import expand
from tests.cluster import Cluster, base_config, wait_for
from tests.conftest import _slurm_available

pytestmark = pytest.mark.e2e
INTERVAL_S = 60  # reconcile.interval_s: a pass within seconds of a kill can only be an early one
SUSPEND_TIME_S = 10
NODES = [f"spot-{i}" for i in range(1, 5)]


@pytest.fixture(scope="module")
def hot(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    if not _slurm_available():
        pytest.fail("slurmctld is not installed: run 'make test', which installs slurm-wlm")
    root = tmp_path_factory.mktemp("spares")
    config = base_config(root)
    config["node_sets"][0]["spares"] = 1
    config["reconcile"] = {"interval_s": INTERVAL_S, "orphan_grace_s": 20, "cooldown_s": 60}
    config["power"]["suspend_time_s"] = SUSPEND_TIME_S
    c = Cluster(root, config, reconcile=True)
    c.start()
    try:
        yield c
    finally:
        subprocess.run(["scancel", "-u", "root"], env=c.env, check=False)
        c.stop()


def record(c: Cluster, **measured: float) -> None:
    path = c.root / "measured.json"
    data = json.loads(path.read_text()) if path.exists() else {}
    data.update(measured)
    path.write_text(json.dumps(data, indent=1))
    print(f"measured: {measured}")


def up_idle(c: Cluster, node: str) -> bool:
    """Idle, powered up, no job: ``idle`` in sinfo, no suffix."""
    fields = c.node(node)
    state = fields["State"]
    return state in ("IDLE+CLOUD", "IDLE") and fields.get("AllocTRES", "") == ""


def powered_down_or_going(c: Cluster, node: str) -> bool:
    state = c.node(node)["State"]
    return any(flag in state for flag in ("POWER_DOWN", "POWERING_DOWN", "POWERED_DOWN"))


def test_a_spare_is_up_without_a_job_and_a_job_starts_on_it_without_a_boot(hot: Cluster) -> None:
    assert "SuspendExcNodes=spot-[1-4]:1" in (hot.conf_dir / "slurm-spot.conf").read_text()
    spare = wait_for(lambda: next((n for n in NODES if up_idle(hot, n)), None), timeout=60,
                     what="the reconciler's first pass to power a spare up")
    assert not hot.slurm("squeue", "-h")  # no job asked for it
    [event] = [e for e in hot.events() if e["action"] == "spares_powered_up"]
    assert event["extra"]["nodes"] == [spare]
    # Slurm's SuspendExcNodes keeps it up past SuspendTime; the other nodes stay powered down
    time.sleep(SUSPEND_TIME_S + 5)
    assert up_idle(hot, spare)
    assert all("POWERED_DOWN" in hot.node(n)["State"] for n in NODES if n != spare)

    launches_before = len([e for e in hot.events() if e["action"] == "launched"])
    submitted = time.monotonic()
    job = hot.sbatch("-p", "spot", "-N", "1", "--requeue", "-o", "/dev/null",
                     "--wrap", "srun sleep 600")
    wait_for(lambda: hot.job(job).get("JobState") == "RUNNING", timeout=60, interval=0.1,
             what="job running")
    start_s = time.monotonic() - submitted
    record(hot, submit_to_running_on_spare_s=round(start_s, 2))
    assert expand(hot.job(job)["NodeList"]) == [spare]
    # nothing was booted for it: no launch, and the job never waited in CONFIGURING
    assert len([e for e in hot.events() if e["action"] == "launched"]) == launches_before
    assert start_s < 10, f"{start_s:.1f} s: the job waited as for a boot"


def test_a_node_killed_without_notice_is_handled_from_the_providers_event(hot: Cluster) -> None:
    [job] = [int(j) for j in hot.slurm("squeue", "-h", "-o", "%A", "-t", "RUNNING").split()]
    [victim] = expand(hot.job(job)["NodeList"])
    killed = time.monotonic()
    hot.spot("local", "preempt", victim, "--notice", "0", "--conf-dir", str(hot.conf_dir))
    wait_for(lambda: hot.job(job).get("Restarts", "0") != "0"
             and powered_down_or_going(hot, victim), timeout=INTERVAL_S, interval=0.1,
             what="job requeued and node powered down")
    handled_s = time.monotonic() - killed
    record(hot, kill_to_requeued_and_powering_down_s=round(handled_s, 2))
    events = hot.events()
    [reclaimed] = [e for e in events if e["action"] == "reclaimed" and e.get("node") == victim]
    assert reclaimed["extra"]["detected_by"] == "provider event"
    assert any(e["action"] == "provider_event" and e.get("node") == victim for e in events)
    assert handled_s < 15, f"{handled_s:.1f} s: not the event (the passes come every 60 s)"
    # requeued once, never FAILED; still once after the next early pass could have acted
    time.sleep(3)
    fields = hot.job(job)
    assert fields["JobState"] in ("PENDING", "CONFIGURING", "RUNNING"), fields["JobState"]
    assert fields["Restarts"] == "1"
    assert len([e for e in hot.events() if e["action"] == "reclaimed"
                and e.get("node") == victim]) == 1
