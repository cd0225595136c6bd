"""A soak under the chaos market (issue 24 part 5) on the real local cluster: the demo's
training job (2 nodes, torchrun, 200 steps) on ``cheap`` (Weight 1) + ``other`` (Weight 10)
while the market takes ``cheap``'s capacity away for its first 30 s and interrupts instances
of both node sets (60 per node-hour, half with 15 s of notice) for 150 s. The job must go
through the outage (a failover off ``cheap``) and at least two interruptions, and finish
with weights bit-identical to an uninterrupted run; the report must say so and put the
measured goodput next to simulate's.

Seed 2 is chosen for its schedule (asserted below): every node has at least two
interruptions once training runs (from 45 s on), so wherever the job lands (a requeued job
may straddle both node sets), it is hit at least twice.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from slurm_spot.config import load_config
from slurm_spot.localcluster.market import INTERRUPT, parse_market, schedule
from slurm_spot.localcluster.marketd import read_plan, running
from slurm_spot.localcluster.soak import Soak, SoakSettings
from slurm_spot.providers.local.provider import provider_for_node
from tests.cluster import acquire_cluster_lock
from tests.conftest import _slurm_available

pytestmark = pytest.mark.e2e


def test_seed_2_hits_every_node_throughout_the_soak() -> None:
    settings = SoakSettings()
    nodes = {"cheap": ["cheap-1", "cheap-2"], "other": ["other-1", "other-2"]}
    events = schedule([parse_market(s) for s in settings.markets], nodes, settings.seed,
                      settings.market_s or 0)
    for node in nodes["cheap"] + nodes["other"]:
        times = [e.at_s for e in events if e.kind == INTERRUPT and e.node == node]
        assert len([t for t in times if 45 <= t < 150]) >= 2, (node, times)


def test_a_job_soaked_in_the_market_finishes_bit_exact(tmp_path: Path) -> None:
    if not _slurm_available():
        pytest.fail("slurmctld is not installed: run 'make test', which installs slurm-wlm")
    settings = SoakSettings(workdir=tmp_path, steps=200, timeout_s=600)
    with acquire_cluster_lock():
        result = Soak(settings, print).run()
    market = result["market"]
    print(json.dumps({"wall_s": result["wall_s"], "market": market}))
    assert result["state"] == "COMPLETED"
    assert result["exact_resume"] is True and result["final_loss"] == result["reference_loss"]
    assert market["capacity_outages"] >= 1 and market["capacity_errors"] >= 1
    (job,) = market["jobs"]
    assert job["job_id"] == result["job_id"] and job["state"] == "COMPLETED"
    assert job["interruptions_with_notice"] + job["interruptions_without_notice"] >= 2
    assert job["failovers"] >= 1 and job["failed_over_to"][0]["from"] == "cheap"
    assert job["requeues"] >= 3  # the failover and each interruption
    assert 0 < job["goodput"] < 1 and 0 < market["prediction"]["goodput"] < 1
    # stopped cleanly: no daemon left, cheap's capacity limit lifted again
    config = load_config(tmp_path / "etc" / "spot.yaml")
    assert not running(read_plan(config))
    assert "cheap" not in provider_for_node(config, "cheap-1").capacity()
