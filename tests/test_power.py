"""The power-saving hooks against the fake provider and the fake Slurm that keeps node state
(tests/fakes)."""

from __future__ import annotations

import pytest

from slurm_spot.config import SpotConfig, parse_config
from slurm_spot.errors import HostlistError, UnknownNodeError
from slurm_spot.lifecycle import power
from slurm_spot.providers.base import (
    ErrorClass,
    LaunchFailure,
)
from slurm_spot.slurm.client import CommandResult, SlurmClient
from tests.fakes.fake_provider import FakeProvider
from tests.fakes.fake_slurm import FakeSlurm


def make_config(tmp_path) -> SpotConfig:
    return parse_config({
        "cluster": "c1",
        "providers": {"cloud": {"type": "local"}, "other": {"type": "local"}},
        "node_sets": [
            {"name": "gpu", "provider": "cloud", "count": 4},
            {"name": "cpu", "provider": "other", "count": 2},
        ],
        "partitions": [{"name": "p", "node_sets": ["gpu", "cpu"]}],
        "log_dir": str(tmp_path / "log"),
        "state_dir": str(tmp_path / "state"),
    })


def _slurm(version: str = "22.05.8") -> FakeSlurm:
    """Slurm running ResumeProgram for the config's nodes: each is idle# (POWERING_UP) until
    the hook records its address or gives it up."""
    fake = FakeSlurm(version)
    for name in [*(f"gpu-{i}" for i in range(1, 5)), "cpu-1", "cpu-2"]:
        fake.add_node(name, "IDLE+CLOUD+POWERING_UP")
    return fake


@pytest.fixture
def setup(tmp_path):  # type: ignore[no-untyped-def]
    config = make_config(tmp_path)
    clouds = {"cloud": FakeProvider("fake", capacity=100),
              "other": FakeProvider("fake", capacity=100)}
    scontrol = _slurm()
    return config, clouds, scontrol, scontrol.client()


def test_resume_launches_one_request_per_node_set_and_records_addresses(setup) -> None:  # type: ignore[no-untyped-def]
    config, clouds, scontrol, slurm = setup
    result = power.resume(config, "gpu-[1-3],cpu-1", slurm, lambda c, name: clouds[name])
    assert [r.nodes for r in clouds["cloud"].requests] == [("gpu-1", "gpu-2", "gpu-3")]
    assert [r.nodes for r in clouds["other"].requests] == [("cpu-1",)]
    assert sorted(i.node for i in result.launched) == ["cpu-1", "gpu-1", "gpu-2", "gpu-3"]
    assert (scontrol.nodes["gpu-2"].addr, scontrol.nodes["gpu-2"].hostname) == (
        "10.0.0.2", "ip-gpu-2")
    # One scontrol call for the addresses of a whole node set, not one per node.
    updates = [c for c in scontrol.calls if any(a.startswith("nodeaddr=") for a in c)]
    assert len(updates) == 2


def test_resume_twice_starts_no_second_instance(setup) -> None:  # type: ignore[no-untyped-def]
    config, clouds, _, slurm = setup
    power.resume(config, "gpu-[1-2]", slurm, lambda c, name: clouds[name])
    power.resume(config, "gpu-[1-2]", slurm, lambda c, name: clouds[name])
    assert len(clouds["cloud"].instances) == 2


def test_capacity_failure_sets_down_with_code_then_powers_down(setup) -> None:  # type: ignore[no-untyped-def]
    config, clouds, scontrol, slurm = setup
    clouds["cloud"].capacity = 1
    result = power.resume(config, "gpu-[1-3]", slurm, lambda c, name: clouds[name])
    assert [i.node for i in result.launched] == ["gpu-1"]
    assert result.failed[0].nodes == ("gpu-2", "gpu-3")
    states = [(c[2], c[3]) for c in scontrol.calls if c[1] == "update" and c[3].startswith("state=")]
    assert states == [("nodename=gpu-[2-3]", "state=DOWN"), ("nodename=gpu-[2-3]", "state=POWER_DOWN")]
    assert scontrol.nodes["gpu-3"].reason == (
        "(Code:InsufficientInstanceCapacity)no g5 in us-east-1a")
    assert scontrol.nodes["gpu-3"].state == "DOWN+CLOUD+POWER_DOWN"
    assert scontrol.nodes["gpu-1"].state == "IDLE+CLOUD+POWERING_UP"  # left to boot


def test_unknown_node_changes_nothing(setup) -> None:  # type: ignore[no-untyped-def]
    config, clouds, scontrol, slurm = setup
    with pytest.raises(UnknownNodeError, match="gpu-9"):
        power.resume(config, "gpu-[1-2],gpu-9", slurm, lambda c, name: clouds[name])
    with pytest.raises(HostlistError):
        power.resume(config, "gpu-[1-", slurm, lambda c, name: clouds[name])
    assert clouds["cloud"].instances == {} and scontrol.calls == []


def test_suspend_terminates_every_instance_and_is_idempotent(setup) -> None:  # type: ignore[no-untyped-def]
    config, clouds, _, slurm = setup
    power.resume(config, "gpu-[1-2],cpu-[1-2]", slurm, lambda c, name: clouds[name])
    first = power.suspend(config, "gpu-[1-2],cpu-1", lambda c, name: clouds[name])
    second = power.suspend(config, "gpu-[1-2],cpu-1", lambda c, name: clouds[name])
    assert sorted(i.node for i in first.terminated) == ["cpu-1", "gpu-1", "gpu-2"]
    assert second.terminated == [] and second.errors == []
    alive = [i.node for c in clouds.values() for i in c.instances.values() if i.state.is_alive]
    assert alive == ["cpu-2"]


def test_reason_is_one_bounded_line() -> None:
    failure = LaunchFailure(("n-1",), "SpotMaxPriceTooLow", "offered 0.1\nrequired " + "9" * 500,
                            ErrorClass.CONFIG)
    assert "\n" not in failure.reason and len(failure.reason) <= 200
    assert failure.reason.startswith("(Code:SpotMaxPriceTooLow)offered 0.1 required")


def test_instances_slurm_cannot_record_are_given_back(setup) -> None:  # type: ignore[no-untyped-def]
    config, clouds, _, _ = setup

    def refusing(argv: list[str], timeout_s: float) -> CommandResult:
        return CommandResult(argv, 1, "", "Unable to contact slurm controller (connect failure)")

    sleeps: list[float] = []
    result = power.resume(config, "gpu-[1-2]", SlurmClient("/usr/bin", runner=refusing),
                          lambda c, name: clouds[name], sleep=sleeps.append)
    assert sleeps == list(power.ADDRESS_RETRY_WAIT_S)  # ~60 s of retries first
    assert result.launched == []
    assert sorted(i.node for i in result.terminated) == ["gpu-1", "gpu-2"]
    assert "Unable to contact slurm controller" in result.errors[0]
    assert [i for i in clouds["cloud"].instances.values() if i.state.is_alive] == []


def test_unwritable_event_log_never_stops_a_hook(setup, tmp_path) -> None:  # type: ignore[no-untyped-def]
    config, clouds, scontrol, slurm = setup
    config.log_dir.mkdir(parents=True)
    (config.log_dir / "events.jsonl").mkdir()  # appending to it fails
    clouds["cloud"].capacity = 1
    result = power.resume(config, "gpu-[1-2]", slurm, lambda c, name: clouds[name])
    assert [i.node for i in result.launched] == ["gpu-1"]
    assert scontrol.nodes["gpu-2"].state == "DOWN+CLOUD+POWER_DOWN"


# -- concurrency and restarts (issue 11, section 3) ------------------------------------------
def test_slurmctld_restart_while_recording_addresses_is_retried(setup) -> None:  # type: ignore[no-untyped-def]
    """slurmctld restarts while the hook records NodeAddr: retry, keep the instances."""
    config, clouds, scontrol, _ = setup
    down = {"left": 2}

    def restarting(argv: list[str], timeout_s: float) -> CommandResult:
        if any(a.startswith("nodeaddr=") for a in argv) and down["left"]:
            down["left"] -= 1
            return CommandResult(argv, 1, "",
                                 "slurm_update error: Unable to contact slurm controller "
                                 "(connect failure)")
        return scontrol(argv, timeout_s)

    sleeps: list[float] = []
    result = power.resume(config, "gpu-[1-2]", SlurmClient("/usr/bin", runner=restarting),
                          lambda c, name: clouds[name], sleep=sleeps.append)
    assert sleeps == [1.0, 2.0]
    assert sorted(i.node for i in result.launched) == ["gpu-1", "gpu-2"] and result.errors == []
    assert scontrol.nodes["gpu-1"].addr == "10.0.0.1"
    assert len([i for i in clouds["cloud"].instances.values() if i.state.is_alive]) == 2


def test_an_address_refused_for_another_reason_is_not_retried(setup) -> None:  # type: ignore[no-untyped-def]
    config, clouds, _, _ = setup

    def invalid(argv: list[str], timeout_s: float) -> CommandResult:
        return CommandResult(argv, 1, "", "Invalid node name specified")

    sleeps: list[float] = []
    result = power.resume(config, "gpu-1", SlurmClient("/usr/bin", runner=invalid),
                          lambda c, name: clouds[name], sleep=sleeps.append)
    assert sleeps == [] and result.launched == [] and len(result.terminated) == 1


def test_two_overlapping_resumes_never_give_a_node_two_instances(setup) -> None:  # type: ignore[no-untyped-def]
    import threading

    config, _, _, slurm = setup
    # looks up alive instances, then takes a while before creating (an API round trip): two
    # unserialized launches for the same nodes would both create
    cloud = FakeProvider("fake", capacity=100, launch_delay_s=0.3)
    results: list[power.PowerResult] = []
    threads = [threading.Thread(target=lambda: results.append(
        power.resume(config, "gpu-[1-3]", slurm, lambda c, name: cloud))) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(i.node or "" for i in cloud.instances.values()) == ["gpu-1", "gpu-2", "gpu-3"]
    assert [sorted(i.instance_id for i in r.launched) for r in results] == [
        ["i-0001", "i-0002", "i-0003"]] * 2


def test_a_stuck_hook_holding_the_node_set_is_reported_not_doubled(setup) -> None:  # type: ignore[no-untyped-def]
    config, clouds, _, slurm = setup
    with power.node_set_lock(config, "gpu"):
        result = power.resume(config, "gpu-1,cpu-1", slurm, lambda c, name: clouds[name],
                              lock_timeout_s=0.3)
    assert [i.node for i in result.launched] == ["cpu-1"]  # the other node set went ahead
    assert "another resume still holds" in result.errors[0] and "resume-gpu.lock" in result.errors[0]
    assert clouds["cloud"].instances == {}


# -- all-or-nothing per job (issue 11, section 2) ---------------------------------------------
RESUME_FILE = {  # slurm.conf(5) 22.05, ResumeProgram: the SLURM_RESUME_FILE example's shape
    "all_nodes_resume": "gpu-[1-4]",
    "jobs": [
        {"extra": "", "features": "", "job_id": 7, "nodes_alloc": "gpu-[1-3]",
         "nodes_resume": "gpu-[1-3]", "oversubscribe": "OK", "partition": "p",
         "reservation": ""},
        {"job_id": 8, "nodes_alloc": "gpu-4", "nodes_resume": "gpu-4"},
        {"job_id": "not-a-number"},  # skipped, the others still read
    ],
}


def test_resume_file_maps_jobs_to_their_nodes(tmp_path) -> None:  # type: ignore[no-untyped-def]
    import json

    from slurm_spot.slurm.resume_file import parse_resume_file, read_resume_file

    assert parse_resume_file(json.dumps(RESUME_FILE)) == {
        7: ("gpu-1", "gpu-2", "gpu-3"), 8: ("gpu-4",)}
    path = tmp_path / "resume.json"
    path.write_text(json.dumps(RESUME_FILE))
    assert read_resume_file({"SLURM_RESUME_FILE": str(path)}) == parse_resume_file(
        path.read_text())
    assert read_resume_file({}) is None
    assert read_resume_file({"SLURM_RESUME_FILE": str(tmp_path / "gone")}) is None
    path.write_text("not json")
    assert read_resume_file({"SLURM_RESUME_FILE": str(path)}) is None


def test_a_job_that_cannot_get_all_its_nodes_gives_the_launched_ones_back(setup) -> None:  # type: ignore[no-untyped-def]
    import json

    from slurm_spot.slurm.resume_file import parse_resume_file

    config, clouds, scontrol, slurm = setup
    clouds["cloud"].capacity = 2  # gpu-1, gpu-2 launch; gpu-3, gpu-4 get none
    jobs = parse_resume_file(json.dumps(RESUME_FILE))
    result = power.resume(config, "gpu-[1-4]", slurm, lambda c, name: clouds[name], jobs=jobs)
    assert [i for i in clouds["cloud"].instances.values() if i.state.is_alive] == []
    assert result.launched == []
    assert sorted(i.node for i in result.terminated) == ["gpu-1", "gpu-2"]
    assert scontrol.nodes["gpu-1"].state == "IDLE+CLOUD+POWERING_DOWN"  # POWER_DOWN_FORCE
    assert scontrol.nodes["gpu-3"].state == "DOWN+CLOUD+POWER_DOWN"  # DOWN first: job 7 requeues
    from slurm_spot.events import read_events

    given_back = [e for e in read_events(config.log_dir) if e["action"] == "terminated"]
    assert {e["node"] for e in given_back} == {"gpu-1", "gpu-2"}
    assert all(e["job_ids"] == [7] and "job 7" in str(e["reason"]) and "gpu-3" in str(e["reason"])
               for e in given_back)


def test_nodes_of_complete_jobs_are_kept_and_the_option_turns_it_off(setup, tmp_path) -> None:  # type: ignore[no-untyped-def]
    config, clouds, _, slurm = setup
    clouds["cloud"].capacity = 2
    jobs = {7: ("gpu-1", "gpu-2"), 8: ("gpu-2", "gpu-3")}  # gpu-2 shared by a complete job
    power.resume(config, "gpu-[1-3]", slurm, lambda c, name: clouds[name], jobs=jobs)
    assert sorted(i.node for i in clouds["cloud"].instances.values() if i.state.is_alive) == [
        "gpu-1", "gpu-2"]
    keep = config.model_copy(update={"power": config.power.model_copy(
        update={"all_or_nothing": False})})
    clouds2 = {"cloud": FakeProvider("fake", capacity=1),
               "other": FakeProvider("fake", capacity=100)}
    power.resume(keep, "gpu-[1-2]", slurm, lambda c, name: clouds2[name],
                 jobs={9: ("gpu-1", "gpu-2")})
    assert [i.node for i in clouds2["cloud"].instances.values() if i.state.is_alive] == ["gpu-1"]


@pytest.mark.parametrize(("version", "recorded"), [("22.05.8", False), ("24.11.5", True)])
def test_resume_records_instance_id_and_type_where_slurm_has_them(  # type: ignore[no-untyped-def]
        setup, version: str, recorded: bool) -> None:
    config, clouds, _, _ = setup
    scontrol = _slurm(version)
    result = power.resume(config, "gpu-[1-2]", scontrol.client(), lambda c, name: clouds[name])
    assert len(result.launched) == 2
    for inst in result.launched:
        node = scontrol.nodes[str(inst.node)]
        assert node.addr == inst.private_ip
        if recorded:  # 23.11+: InstanceId/InstanceType, the reconciler's key for the node
            assert (node.instance_id, node.instance_type) == (inst.instance_id,
                                                              inst.instance_type)
        else:  # 22.05 has no such fields (the fake refuses them, as scontrol does)
            assert (node.instance_id, node.instance_type) == ("", "")
