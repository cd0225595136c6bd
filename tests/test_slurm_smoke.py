"""The per-version smoke: what every Slurm of the matrix must do with slurm-spot.

Runs on the host's Slurm as part of the suite, and inside each Debian root of the matrix
(tests/test_slurm_matrix.py runs this module there, with the root's slurmctld/slurmd/scontrol).
One cluster with the reconciler: start-up log free of unknown/defunct/deprecated parameters, a
2-node job, one interruption with notice and one without on the same job, the ``--json``
outputs parsed live, then ``local down`` leaves no daemon behind.

``SLURM_SPOT_CAPTURE_JSON=<dir>`` also writes the live ``scontrol show node --json``, ``sinfo
--json`` and ``squeue --json`` there (how tests/data/slurm-json/<version>/ was captured).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from slurm_spot.hostlist import expand
from slurm_spot.jsonenvelope import read_envelope
from slurm_spot.slurm.output import jobs_from_json, nodes_from_json
from slurm_spot.slurm.version import SlurmVersion
from tests.cluster import Cluster, base_config, wait_for
from tests.conftest import _slurm_available

pytestmark = pytest.mark.e2e

# What slurmctld logs for a slurm.conf parameter it does not know, no longer knows, or is
# about to drop (read_config.c / parse_config.c wording in 22.05-26.05).
BAD_CONF = re.compile(
    r"(unknown|unrecognized|invalid) (parameter|option|key|line)|is defunct|deprecated|"
    r"no longer (supported|valid)|has been removed|Parse error|Configured MailProg is invalid",
    re.IGNORECASE)


@pytest.fixture(scope="module")
def smoke(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    if not _slurm_available():
        pytest.fail("slurmctld is not installed: run 'make test', which installs slurm-wlm")
    root = tmp_path_factory.mktemp("smoke")
    config = base_config(root)
    config["reconcile"] = {"interval_s": 5, "orphan_grace_s": 20, "cooldown_s": 20}
    c = Cluster(root, config, reconcile=True)
    c.start()
    record = json.loads((c.state_dir / "local" / "cluster.json").read_text())
    try:
        yield c
    finally:
        c.stop()
        for key in ("slurmctld_pid", "munge_pid", "reconciler_pid"):
            pid = record.get(key)
            if pid:
                wait_for(lambda pid=pid: not _alive(pid), timeout=15, what=f"{key} {pid} gone")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return not Path(f"/proc/{pid}/stat").read_text().split()[2] == "Z"


def version(c: Cluster) -> SlurmVersion:
    return SlurmVersion.parse(c.slurm("scontrol", "-V"))


def test_cluster_starts_where_other_releases_left_their_state(tmp_path: Path) -> None:
    """One state_dir for every Slurm of the matrix (/tmp is shared with the roots): each
    release keeps slurmctld's state in its own slurmctld-<series>, so none reads another's
    (22.05 after 24.11/26.05 would die: "Can not recover assoc_usage state, incompatible
    version"). The matrix runs the roots first, then the host's suite."""
    config = base_config(tmp_path, state_dir=str(SHARED_STATE))
    c = Cluster(tmp_path, config)
    c.start()
    try:
        v = version(c)
        assert c.slurm("scontrol", "ping").count("UP") == 1
    finally:
        c.stop()
    mine = SHARED_STATE / f"slurmctld-{v.series[0]}.{v.series[1]:02d}"
    wait_for(lambda: (mine / "node_state").exists(), timeout=15,
             what=f"slurmctld's state saved in {mine}")
    others = sorted(p.name for p in SHARED_STATE.glob("slurmctld-*") if p != mine)
    print(f"\nSlurm {v}: started beside the state of {others or 'no other release'}")


def test_slurmctld_starts_without_complaint_about_the_config(smoke: Cluster) -> None:
    """The rendered slurm.conf uses only what this Slurm knows (issue 15, item 2)."""
    v = version(smoke)
    conf = (smoke.conf_dir / "slurm-spot.conf").read_text()
    assert f"# For Slurm {v}" in conf
    assert ("NoAddrCache" in conf) == (not v.at_least(23, 11))
    log = (smoke.log_dir / "slurmctld.log").read_text()
    bad = [line for line in log.splitlines() if BAD_CONF.search(line)]
    assert not bad, f"Slurm {v}: slurmctld complained about the config:\n" + "\n".join(bad)


def test_two_node_job_runs_and_records_the_instances(smoke: Cluster) -> None:
    out = smoke.root / "hostname.out"
    job = smoke.slurm("sbatch", "--parsable", "--wait", "-p", "spot", "-N", "2", "-o", str(out),
                      "--wrap", "srun hostname | sort", timeout=150).split(";")[0].strip()
    hosts = out.read_text().split()
    assert len(hosts) == 2 and len(set(hosts)) == 2 and all(h.startswith("spot-") for h in hosts)
    # Launched when slurm-spot-prolog-slurmctld saw its nodes up (prolog_running_decr: "...
    # is complete"), not by slurmctld's 30 s job_time_limit pass ("... complete"): docs/admin.md,
    # "Batch launch on powered-up nodes".
    log = (smoke.log_dir / "slurmctld.log").read_text()
    assert f"Configuration for JobId={job} is complete" in log, f"Slurm {version(smoke)}"
    assert f"job_time_limit: Configuration for JobId={job} complete" not in log


def test_interruption_with_notice_then_without(smoke: Cluster, tmp_path: Path) -> None:
    """One 2-node job: a notice (the watcher requeues it), then a kill without notice (the
    reconciler does); it runs again after each."""
    v = version(smoke)
    script = tmp_path / "sleeper.sh"
    script.write_text("#!/bin/bash\nsrun sleep 600\n")
    # Through slurm-spot sbatch: --requeue, or --requeue=expedite on 25.11+.
    submitted = read_envelope(smoke.spot("sbatch", "--json", "-p", "spot", "-N", "2",
                                      "-o", "/dev/null", str(script)).stdout)
    job = int(submitted["job_id"])
    requeue = smoke.slurm("scontrol", "write", "batch_script", str(job), "-")
    assert ("--requeue=expedite" in requeue) is v.expedited_requeue, requeue
    wait_for(lambda: smoke.job(job).get("JobState") == "RUNNING", timeout=120, what="job running")
    nodes = expand(smoke.job(job)["NodeList"])
    if v.instance_fields:  # 23.11+: the resume hook recorded each node's instance
        ids = {i["node"]: i["instance_id"] for i in smoke.instances()}
        for node in nodes:
            shown = smoke.node(node)
            assert shown.get("InstanceId") == ids[node], (v, shown)
            assert shown.get("InstanceType") == "local", (v, shown)
    _check_json(smoke, v, job, nodes)

    smoke.spot("local", "preempt", nodes[0], "--notice", "5", "--conf-dir", str(smoke.conf_dir))
    wait_for(lambda: smoke.job(job).get("Restarts") == "1", timeout=60, what="requeue (notice)")
    wait_for(lambda: smoke.job(job).get("JobState") == "RUNNING", timeout=150,
             what="running after the notice")
    watched = [e for e in smoke.events() if e["source"] == "watch" and e["action"] == "requeued"]
    assert any(job in e["job_ids"] for e in watched), smoke.events()

    victim = expand(smoke.job(job)["NodeList"])[0]
    killed = time.monotonic()
    smoke.spot("local", "preempt", victim, "--notice", "0", "--conf-dir", str(smoke.conf_dir))
    wait_for(lambda: smoke.job(job).get("Restarts") == "2", timeout=90, what="requeue (kill)")
    wait_for(lambda: smoke.job(job).get("JobState") == "RUNNING", timeout=150,
             what="running after the kill")
    print(f"\nSlurm {v}: running again {time.monotonic() - killed:.0f} s after a kill "
          "without notice")
    reclaimed = [e for e in smoke.events() if e["source"] == "reconcile"
                 and e["action"] == "reclaimed" and e["node"] == victim]
    assert reclaimed and reclaimed[-1]["job_ids"] == [job]
    subprocess.run(["scancel", str(job)], env=smoke.env, check=False, timeout=30)


def data_parsers() -> list[str]:
    """The data_parser plugins this Slurm ships (23.02+: ``data_parser_v0_0_42.so``), oldest
    first; 22.05 has none (its ``--json`` is always v0.0.38)."""
    found = sorted(Path("/usr/lib/x86_64-linux-gnu/slurm-wlm").glob("data_parser_v*.so"))
    return [p.stem.replace("data_parser_", "").replace("_", ".") for p in found]


def _check_json(c: Cluster, v: SlurmVersion, job: int, nodes: list[str]) -> None:
    """Every ``--json`` output this version can write (each data_parser it ships) parses into
    the same nodes and job."""
    parsers = data_parsers() or [v.data_parser]
    capture = os.environ.get("SLURM_SPOT_CAPTURE_JSON")
    for parser in parsers:
        flag = "--json" if parser == v.data_parser else f"--json={parser}"
        outputs = {"sinfo": c.slurm("sinfo", flag), "squeue": c.slurm("squeue", flag)}
        if v.scontrol_json:
            outputs["scontrol-show-node"] = c.slurm("scontrol", "show", "node", flag)
        if capture:
            folder = Path(capture) / str(v) / parser
            folder.mkdir(parents=True, exist_ok=True)
            for name, text in outputs.items():
                (folder / f"{name}.json").write_text(text)
        for name in ("sinfo", "scontrol-show-node"):
            if name not in outputs:
                continue
            parsed = {n["name"]: n for n in nodes_from_json(json.loads(outputs[name]))}
            assert set(parsed) >= {f"spot-{i}" for i in range(1, 5)}, (v, parser, name)
            for node in nodes:
                state = parsed[node]["state"]
                assert state.base in ("ALLOCATED", "MIXED"), (v, parser, name, parsed[node])
        jobs = {j["job_id"]: j for j in jobs_from_json(json.loads(outputs["squeue"]))}
        assert jobs[job]["state"].base == "RUNNING", (v, parser, jobs[job])
        assert set(expand(jobs[job]["nodes"])) == set(nodes), (v, parser, jobs[job])


SHARED_STATE = Path("/tmp/slurm-spot-versions-state")
