"""``check_gcp_node_set``: each rule gives one clear line naming the field."""

from __future__ import annotations

import pytest

from slurm_spot.config import GcpProviderConfig, NodeSetConfig
from slurm_spot.providers.gcp.checks import check_gcp_node_set

PROVIDER = GcpProviderConfig(project="p", region="us-central1")
GOOD = {"name": "gpu", "provider": "gcp", "count": 8,
        "gcp": {"zones": ["us-central1-a", "us-central1-b"], "machine_type": "n1-standard-8",
                "image": "debian-12"}}


def _check(changes: dict | None = None, gcp: dict | None = None, cluster: str | None = "demo",
           ) -> list[str]:
    data = {**GOOD, **(changes or {}), "gcp": {**GOOD["gcp"], **(gcp or {})}}  # type: ignore[dict-item]
    return check_gcp_node_set(NodeSetConfig.model_validate(data), PROVIDER, "node_sets.0",
                              cluster=cluster)


def test_a_good_node_set_has_no_problem() -> None:
    assert _check() == []
    assert _check(gcp={"machine_type": None, "image": None, "instance_template": "t"}) == []


def test_the_three_argument_call_still_works() -> None:
    node_set = NodeSetConfig.model_validate(GOOD)
    assert check_gcp_node_set(node_set, PROVIDER, "node_sets.0") == []


def test_zones_outside_the_region_are_named_by_index() -> None:
    assert _check(gcp={"zones": ["us-central1-a", "europe-west4-b"]}) == [
        "node_sets.0.gcp.zones.1: zone 'europe-west4-b' is not in the provider's region "
        "'us-central1'"]


def test_instance_names_too_long_for_gce() -> None:
    (problem,) = _check({"name": "g" * 35, "count": 12}, cluster="c" * 30)
    assert problem.startswith(f"node_sets.0.name: instance name '{'c' * 30}-{'g' * 35}-12'")
    assert "69 characters, at most 63" in problem


def test_spot_and_preemptible_together() -> None:
    assert _check(gcp={"preemptible": True}) == [
        "node_sets.0.gcp.preemptible: a node set is either Spot (market: spot) or legacy "
        "preemptible, not both"]
    assert _check({"market": "on-demand"}, gcp={"preemptible": True}) == []


def test_stop_with_local_ssds() -> None:
    (problem,) = _check(gcp={"termination_action": "STOP", "local_ssds": 2})
    assert problem.startswith("node_sets.0.gcp.termination_action: STOP is not allowed with "
                              "local SSDs")
    assert _check(gcp={"termination_action": "STOP"}) == []


@pytest.mark.parametrize(("gcp", "field"), [
    ({"machine_type": None}, "machine_type"),
    ({"image": None}, "image"),
    ({"machine_type": None, "image": None}, "machine_type"),
])
def test_neither_template_nor_machine_type_and_image(gcp: dict, field: str) -> None:
    (problem,) = _check(gcp=gcp)
    assert problem.startswith(f"node_sets.0.gcp.{field}: set instance_template, or "
                              "machine_type and image")


def test_several_problems_are_all_reported() -> None:
    problems = _check(gcp={"zones": ["europe-west4-a"], "preemptible": True,
                           "termination_action": "STOP", "local_ssds": 1})
    assert [p.split(":")[0] for p in problems] == [
        "node_sets.0.gcp.zones.0", "node_sets.0.gcp.preemptible",
        "node_sets.0.gcp.termination_action"]
