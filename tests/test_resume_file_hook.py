"""The resume hook reads ``SLURM_RESUME_FILE`` as slurmctld hands it over (issue 11, section 2:
all-or-nothing per job).

The hook runs as slurmctld runs it: ``slurm-spot-resume <hostlist>`` (the installed entry point) in a fresh
interpreter with an almost empty environment, ``SLURM_CONF`` (spot.yaml beside it) and
``SLURM_RESUME_FILE`` a ``/proc/<pid>/fd/<n>`` path of a file the caller holds open, in the
format of slurm.conf(5) (22.05), ResumeProgram. The cloud is the fake Compute API (the real
google-cloud-compute client talks to it over HTTP), Slurm is the project's fake scontrol
(tests/fakes/fake_slurm.py) behind executables that keep its state between calls. What is
asserted is what a user sees: which instances exist, node states and reasons, job states.
"""

from __future__ import annotations

import json
import os
import pickle
import stat
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.fakes.fake_slurm import FakeSlurm
from tests.fakes.gce_api import FakeCompute

ROOT = Path(__file__).resolve().parent.parent
ZONE = "us-central1-a"

# The tools the hook runs from slurm_bin_dir: each call loads the fake Slurm, runs the argv
# through it, and saves it back (under a lock), so state carries across the hook's calls.
TOOL = """#!{python}
import fcntl, pickle, sys
sys.path.insert(0, {root!r})
from pathlib import Path
state = Path({state!r})
with open(str(state) + ".lock", "a") as lock:
    fcntl.flock(lock, fcntl.LOCK_EX)
    fake = pickle.loads(state.read_bytes())
    result = fake(sys.argv, 10.0)
    state.write_bytes(pickle.dumps(fake))
sys.stdout.write(result.stdout)
sys.stderr.write(result.stderr)
sys.exit(result.returncode)
"""


class Site:
    """spot.yaml (one gcp node set gpu-[1-4] in one zone) beside slurm.conf, the fake Slurm's
    tools, and the fake Compute API."""

    def __init__(self, root: Path, cloud: FakeCompute) -> None:
        self.root, self.cloud = root, cloud
        self.state = root / "slurm.pickle"
        slurm = FakeSlurm()
        for i in range(1, 5):  # slurmctld sets a node POWERING_UP before it runs the hook
            slurm.add_node(f"gpu-{i}", "IDLE+CLOUD+POWERING_UP")
        self.save(slurm)
        bin_dir = root / "bin"
        bin_dir.mkdir()
        for tool in ("scontrol", "squeue", "sinfo"):
            path = bin_dir / tool
            path.write_text(TOOL.format(python=sys.executable, root=str(ROOT),
                                        state=str(self.state)))
            path.chmod(path.stat().st_mode | stat.S_IXUSR)
        (root / "slurm.conf").write_text("")
        (root / "spot.yaml").write_text(json.dumps({
            "cluster": "demo",
            "providers": {"gcp": {"type": "gcp", "project": cloud.project,
                                  "region": "us-central1", "api_endpoint": cloud.endpoint}},
            "node_sets": [{"name": "gpu", "provider": "gcp", "count": 4, "gcp": {
                "zones": [ZONE], "machine_type": "n1-standard-4", "image": "debian-12"}}],
            "partitions": [{"name": "cloud", "node_sets": ["gpu"]}],
            "state_dir": str(root / "state"), "log_dir": str(root / "log"),
            "slurm_bin_dir": str(bin_dir),
        }))

    def load(self) -> FakeSlurm:
        loaded: FakeSlurm = pickle.loads(self.state.read_bytes())
        return loaded

    def save(self, slurm: FakeSlurm) -> None:
        self.state.write_bytes(pickle.dumps(slurm))

    def add_jobs(self, jobs: dict[int, list[str]]) -> None:
        slurm = self.load()
        for job_id, nodes in jobs.items():
            slurm.add_job(job_id, nodes, state="CONFIGURING")
        self.save(slurm)

    def resume(self, hostlist: str, resume_file: str | None) -> subprocess.CompletedProcess[str]:
        """Run the hook as slurmctld does and wait for its detached worker to finish."""
        env = {"PATH": "/usr/bin:/bin", "SLURM_CONF": str(self.root / "slurm.conf"),
               "PYTHONPATH": str(ROOT)}
        if resume_file is not None:
            env["SLURM_RESUME_FILE"] = resume_file
        # The installed entry point slurm.conf's ResumeProgram names (pyproject's scripts).
        proc = subprocess.run([str(Path(sys.executable).parent / "slurm-spot-resume"),
                               hostlist], env=env, capture_output=True, text=True, timeout=120,
                              check=False)
        log = self.root / "log" / "hooks.log"
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:
            if log.exists() and f"resume {hostlist} done" in log.read_text():
                return proc
            time.sleep(0.2)
        raise AssertionError(f"the hook's worker did not finish: {proc.stderr}\n"
                             f"{log.read_text() if log.exists() else '(no hooks.log)'}")

    def instances(self) -> list[str]:
        """The nodes that have an instance in the cloud now."""
        return sorted(i["name"].removeprefix("demo-") for i in self.cloud.all_instances())


@pytest.fixture
def site(tmp_path: Path) -> Iterator[Site]:
    with FakeCompute() as cloud:
        cloud.capacity[ZONE] = 2  # room for two of the three nodes asked for
        yield Site(tmp_path, cloud)


def _resume_file(jobs: dict[int, str]) -> dict[str, Any]:
    """The JSON slurmctld writes (slurm.conf(5) 22.05, ResumeProgram)."""
    return {"all_nodes_resume": "gpu-[1-3]", "jobs": [
        {"job_id": job_id, "nodes_alloc": nodes, "nodes_resume": nodes, "partition": "cloud",
         "features": "", "extra": "", "oversubscribe": "OK", "reservation": ""}
        for job_id, nodes in jobs.items()]}


@pytest.fixture
def held_open(tmp_path: Path) -> Iterator[Any]:
    """Write a resume file and hand it over as slurmctld does: a /proc/<pid>/fd/<n> path of a
    file this process keeps open while the hook reads it."""
    opened: list[int] = []

    def hand_over(content: str) -> str:
        path = tmp_path / f"resume-{len(opened)}.json"
        path.write_text(content)
        fd = os.open(path, os.O_RDONLY)
        opened.append(fd)
        return f"/proc/{os.getpid()}/fd/{fd}"

    yield hand_over
    for fd in opened:
        os.close(fd)


def test_a_job_that_could_not_get_all_its_nodes_gives_its_launched_nodes_back(
    site: Site, held_open: Any
) -> None:
    """Job 7 needs gpu-1, job 8 needs gpu-[2-3]; the zone has room for two instances. gpu-3
    gets none, so job 8 cannot start: gpu-2's instance is deleted at once and gpu-2 powers
    down, instead of idling until SuspendTime. Job 7's gpu-1 is untouched."""
    site.add_jobs({7: ["gpu-1"], 8: ["gpu-2", "gpu-3"]})
    proc = site.resume("gpu-[1-3]", held_open(json.dumps(_resume_file({7: "gpu-1",
                                                                       8: "gpu-[2-3]"}))))
    assert proc.returncode == 0, proc.stderr

    assert site.instances() == ["gpu-1"]
    slurm = site.load()
    gpu1, gpu2, gpu3 = (slurm.nodes[f"gpu-{i}"] for i in (1, 2, 3))
    assert gpu1.addr.startswith("10.128.") and gpu1.reason == ""
    assert "POWERING_DOWN" not in gpu1.flags and slurm.jobs[7].state == "CONFIGURING"
    assert gpu2.flags & {"POWERING_DOWN", "POWER_DOWN"}  # given back now
    assert gpu3.base == "DOWN" and gpu3.reason.startswith("(Code:ZONE_RESOURCE_POOL_EXHAUSTED)")
    assert slurm.jobs[8].state == "PENDING"  # requeued by Slurm when gpu-3 went down
    given_back = [e for e in _events(site) if e["action"] == "terminated"]
    assert [(e["node"], e["job_ids"]) for e in given_back] == [("gpu-2", [8])]
    assert "all-or-nothing: job 8" in given_back[0]["reason"]
    # the file vanishes with the hook: a copy is kept for the admin
    (kept,) = (site.root / "log" / "resume-files").iterdir()
    assert json.loads(kept.read_text())["jobs"][1]["job_id"] == 8


def test_nodes_shared_with_a_complete_job_are_kept(site: Site, held_open: Any) -> None:
    """gpu-2 belongs to job 8 (incomplete: gpu-3 failed) and to job 9 (gpu-2 alone, complete):
    it stays for job 9."""
    site.add_jobs({8: ["gpu-2", "gpu-3"], 9: ["gpu-2"]})
    site.resume("gpu-[1-3]", held_open(json.dumps(_resume_file({8: "gpu-[2-3]", 9: "gpu-2"}))))
    assert site.instances() == ["gpu-1", "gpu-2"]
    assert not site.load().nodes["gpu-2"].flags & {"POWERING_DOWN", "POWER_DOWN"}


@pytest.mark.parametrize("content", [
    None,  # the path does not exist (slurmctld closed it already)
    "",
    "{not json",
    '{"jobs": "gpu-[2-3]"}',
    json.dumps({"all_nodes_resume": "gpu-[1-3]"}),
], ids=["missing", "empty", "not-json", "jobs-not-a-list", "no-jobs"])
def test_an_unreadable_resume_file_keeps_every_launched_node(
    site: Site, held_open: Any, tmp_path: Path, content: str | None
) -> None:
    """Safe fallback: without knowing the jobs, nothing launched is given back (the pass is not
    lost, the hook exits 0); slurmctld's log (the hook's stderr) says why."""
    site.add_jobs({8: ["gpu-2", "gpu-3"]})
    handed = str(tmp_path / "gone.json") if content is None else held_open(content)
    proc = site.resume("gpu-[1-3]", handed)
    assert proc.returncode == 0, proc.stderr
    assert "SLURM_RESUME_FILE" in proc.stderr and "unreadable" in proc.stderr
    assert site.instances() == ["gpu-1", "gpu-2"]
    slurm = site.load()
    assert not slurm.nodes["gpu-2"].flags & {"POWERING_DOWN", "POWER_DOWN"}
    assert slurm.nodes["gpu-3"].reason.startswith("(Code:ZONE_RESOURCE_POOL_EXHAUSTED)")


def test_one_unreadable_job_entry_does_not_hide_the_others(site: Site, held_open: Any) -> None:
    """A job entry whose node list cannot be read is skipped (logged); job 8's is still used."""
    site.add_jobs({8: ["gpu-2", "gpu-3"]})
    data = _resume_file({8: "gpu-[2-3]"})
    data["jobs"].insert(0, {"job_id": 5, "nodes_alloc": "gpu-[3-"})
    data["jobs"].insert(0, {"nodes_alloc": "gpu-1"})
    proc = site.resume("gpu-[1-3]", held_open(json.dumps(data)))
    assert proc.returncode == 0 and "skipping job entry" in proc.stderr
    assert site.instances() == ["gpu-1"]


def test_without_a_resume_file_nothing_is_given_back(site: Site) -> None:
    """Slurm before 22.05 (or a manual run) sets no SLURM_RESUME_FILE: every launch is kept."""
    site.add_jobs({8: ["gpu-2", "gpu-3"]})
    proc = site.resume("gpu-[1-3]", None)
    assert proc.returncode == 0 and proc.stderr == ""
    assert site.instances() == ["gpu-1", "gpu-2"]


def _events(site: Site) -> list[dict[str, Any]]:
    path = site.root / "log" / "events.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()]
