"""``--json`` of every data_parser version from v0.0.38 (22.05) to v0.0.45 (26.05), read by
slurm_spot.slurm.output (the reader SlurmClient uses) into SlurmClient's Node and Job.

The fixtures are captured from the real releases by the version smoke
(``SLURM_SPOT_CAPTURE_JSON=tests/data/slurm-json``, tests/test_slurm_smoke.py) while a 2-node
job runs on a 4-node local cluster, one folder per release and data_parser: 22.05.8 on the host
wrote v0.0.38, 24.11.5 in the trixie root v0.0.40 to v0.0.42, 26.05.5 in the forky root
v0.0.42 to v0.0.45 (``--json=<version>``). The smoke parses every data_parser
each release ships live on every run of the matrix (22.05.8: v0.0.38; 24.11.5: v0.0.40 to
v0.0.42); v0.0.39 (23.02) is the one version no Debian release ships.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from slurm_spot.hostlist import expand
from slurm_spot.slurm.client import Job, Node
from slurm_spot.slurm.output import (
    data_parser,
    job_fields_json,
    jobs_from_json,
    nodes_from_json,
    nodes_json,
    number,
)
from slurm_spot.slurm.version import DATA_PARSERS, SlurmVersion

ROOT = Path(__file__).parent / "data" / "slurm-json"
CAPTURES = sorted(p for p in ROOT.glob("*/*") if p.is_dir())
NODES = {f"spot-{i}" for i in range(1, 5)}


def _id(path: Path) -> str:
    return f"{path.parent.name}-{path.name}"


def parse_nodes(document: dict) -> list[Node]:
    return [Node(**fields) for fields in nodes_from_json(document)]


def parse_jobs(document: dict) -> list[Job]:
    return [Job(**fields) for fields in jobs_from_json(document)]


def test_captures_are_named_by_release_and_data_parser() -> None:
    known = set(DATA_PARSERS.values())
    assert CAPTURES, "no captures under tests/data/slurm-json"
    for capture in CAPTURES:
        release = SlurmVersion.parse(capture.parent.name)
        assert capture.name in known, capture
        # A release writes its own data_parser and the older ones it still ships.
        assert capture.name <= release.data_parser, capture


@pytest.mark.parametrize("capture", CAPTURES, ids=_id)
def test_nodes_and_the_running_job_read_the_same_on_every_version(capture: Path) -> None:
    squeue = json.loads((capture / "squeue.json").read_text())
    jobs = [j for j in parse_jobs(squeue) if j.state.base == "RUNNING"]
    assert len(jobs) == 1, jobs
    job = jobs[0]
    allocated = set(expand(job.nodes))
    assert len(allocated) == 2 and allocated <= NODES and job.partition == "spot"
    found = data_parser(squeue)
    assert found in (None, capture.name)  # 22.05 names no data_parser
    sources = [name for name in ("scontrol-show-node.json", "sinfo.json")
               if (capture / name).exists()]
    assert sources, capture
    for name in sources:
        nodes = {n.name: n for n in parse_nodes(json.loads((capture / name).read_text()))}
        assert set(nodes) == NODES, (name, sorted(nodes))
        for node_name, node in nodes.items():
            assert node.state.is_cloud, (name, node)
            if node_name in allocated:
                assert node.state.base in ("ALLOCATED", "MIXED"), (name, node)
            else:
                assert not node.state.has_jobs, (name, node)
    if (capture / "scontrol-show-node.json").exists():
        full = parse_nodes(json.loads((capture / "scontrol-show-node.json").read_text()))
        up = [n for n in full if n.name in allocated]
        # 23.11+: the resume hook recorded each instance; the address is the instance's.
        assert all(n.instance_id.startswith("loc-") and n.instance_type == "local" for n in up)
        assert all(n.addr == "127.0.0.1" and n.boot_time != "None" for n in up)


@pytest.mark.parametrize("capture", CAPTURES, ids=_id)
def test_the_client_reads_each_node_listing_it_uses_in_full(capture: Path) -> None:
    """What SlurmClient reads (:func:`nodes_json` of the command's stdout): 22.05's ``sinfo
    --json`` and 23.02+'s ``scontrol --json show node`` give every field; 24.11+'s ``sinfo``
    groups are not a node listing (None; the client reads ``scontrol --json`` there)."""
    for name in ("scontrol-show-node.json", "sinfo.json"):
        if not (capture / name).exists():
            continue
        text = (capture / name).read_text()
        found = nodes_json("sinfo: warning: something first\n" + text)
        if not isinstance(json.loads(text).get("nodes"), list):  # 24.11+ sinfo groups
            assert found is None
            continue
        assert found is not None and {n["name"] for n in found} == NODES, name
        assert all(n["addr"] and n["hostname"] and n["partitions"] == ("spot",) for n in found)


def test_numbers_in_every_form() -> None:
    assert number(5) == 5 and number("7") == 7
    assert number({"set": True, "infinite": False, "number": 3}) == 3
    assert number({"set": False, "infinite": False, "number": 0}) is None
    assert number({"set": True, "infinite": True, "number": 0}) is None
    assert number(None) is None and number(True) is None and number("x") is None


def test_a_job_object_without_an_id_or_state_is_an_error_naming_it() -> None:
    with pytest.raises(ValueError, match="without a job_id"):
        job_fields_json({"name": "x"})
    with pytest.raises(ValueError, match="job 4"):
        job_fields_json({"job_id": 4, "job_state": ["NOT_A_STATE"]})
    with pytest.raises(ValueError, match="neither 'nodes' nor 'sinfo'"):
        parse_nodes({"meta": {}})
