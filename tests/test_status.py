"""``slurm-spot status``: one row per cloud node, what a person and a script see."""

from __future__ import annotations

import json
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest
from click.testing import CliRunner

from slurm_spot.cli import cli
from slurm_spot.commands import status as status_module
from slurm_spot.commands.common import AppContext
from slurm_spot.commands.status import format_uptime
from slurm_spot.config import SpotConfig
from slurm_spot.jsonenvelope import read_envelope
from slurm_spot.lifecycle.status import status_rows
from slurm_spot.providers.base import InstanceState
from tests.fakes.fake_provider import FakeProvider
from tests.fakes.fake_slurm import FakeSlurm

NOW = datetime(2026, 3, 1, 12, 0, tzinfo=timezone.utc)


@pytest.fixture
def world(tmp_path: Path) -> tuple[SpotConfig, FakeSlurm, FakeProvider, Path]:
    path = tmp_path / "spot.yaml"
    path.write_text(json.dumps({
        "cluster": "test",
        "node_sets": [{"name": "spot", "provider": "local", "count": 3}],
        "partitions": [{"name": "spot", "node_sets": ["spot"]}],
        "state_dir": str(tmp_path / "state"), "log_dir": str(tmp_path / "log"),
    }))
    from slurm_spot.config import load_config

    config = load_config(path)
    slurm = FakeSlurm()
    slurm.add_node("spot-1", "ALLOCATED+CLOUD", addr="10.0.0.1")
    slurm.add_node("spot-2", "IDLE+CLOUD+POWERED_DOWN")
    slurm.add_node("spot-3", "DOWN+CLOUD+POWERED_DOWN", reason="ResumeTimeout reached")
    slurm.add_node("static-1", "IDLE")
    slurm.add_job(42, ["spot-1"])
    provider = FakeProvider()
    provider.add("spot-1", 3725, NOW, ip="10.0.0.1", market="on-demand")
    provider.add("spot-1", 9000, NOW, InstanceState.TERMINATED)
    provider.add("spot-9", 50, NOW)
    return config, slurm, provider, path


def test_rows_join_slurm_and_the_provider(world: tuple) -> None:
    config, slurm, provider, _ = world
    rows, errors = status_rows(config, slurm.client(), lambda c, n: provider, now=NOW)
    assert errors == []
    by_node = {r["node"]: r for r in rows}
    assert set(by_node) == {"spot-1", "spot-2", "spot-3", "spot-9"}  # not static-1
    one = by_node["spot-1"]
    assert (one["state"], one["instance"], one["market"], one["type"], one["zone"]) == (
        "alloc", "i-0001", "on-demand", "g5.xlarge", "us-east-1a")
    assert (one["uptime_s"], one["jobs"], one["provider"]) == (3725.0, [42], "local")
    assert by_node["spot-2"]["instance"] is None and by_node["spot-2"]["state"] == "idle~"
    assert by_node["spot-3"]["reason"] == "ResumeTimeout reached"
    assert by_node["spot-9"]["state"] == "(not in Slurm)"


def test_a_provider_that_fails_still_shows_the_nodes(world: tuple) -> None:
    config, slurm, provider, _ = world
    provider.fail_listing = RuntimeError("AuthFailure")
    rows, errors = status_rows(config, slurm.client(), lambda c, n: provider, now=NOW)
    assert errors == ["provider local: AuthFailure"]
    assert [r["instance"] for r in rows] == [None, None, None]


@pytest.mark.parametrize(("seconds", "text"), [
    (None, "-"), (45, "45s"), (725, "12m05s"), (3725, "1h02m"), (187200, "2d04h")])
def test_uptime_format(seconds: float | None, text: str) -> None:
    assert format_uptime(seconds) == text


def _invoke(world: tuple, monkeypatch: pytest.MonkeyPatch, *args: str):  # type: ignore[no-untyped-def]
    _, slurm, provider, path = world
    monkeypatch.setattr(AppContext, "slurm", lambda self: slurm.client())
    monkeypatch.setattr(status_module, "get_provider", lambda c, n: provider)
    return CliRunner().invoke(cli, ["--config", str(path), "status", *args])


def test_cli_table_for_people(world: tuple, monkeypatch: pytest.MonkeyPatch) -> None:
    result = _invoke(world, monkeypatch)
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    header = next(line for line in lines if "node" in line and "instance" in line)
    for column in ("state", "market", "type", "zone", "uptime", "job"):
        assert column in header
    row = next(line for line in lines if "spot-1" in line)
    for cell in ("alloc", "i-0001", "on-demand", "g5.xlarge", "us-east-1a", "42"):
        assert cell in row


def test_piped_table_keeps_long_reasons_on_one_line(world: tuple,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """``slurm-spot status | grep spot-3`` must show the whole reason, not a cut one."""
    _, slurm, _, _ = world
    reason = ("(Code:InsufficientInstanceCapacity)capacity: no spot capacity for g5.xlarge in "
              "us-east-1a, us-east-1b, us-east-1c; pool cooled down for 600 s")
    slurm.nodes["spot-3"].reason = reason
    result = _invoke(world, monkeypatch)
    assert result.exit_code == 0, result.output
    (row,) = [line for line in result.output.splitlines() if "spot-3" in line]
    assert reason in row


def test_cli_json_for_scripts(world: tuple, monkeypatch: pytest.MonkeyPatch) -> None:
    result = _invoke(world, monkeypatch, "--json")
    assert result.exit_code == 0
    data = read_envelope(result.output)
    assert data["errors"] == []
    assert {r["node"]: r["jobs"] for r in data["nodes"]}["spot-1"] == [42]


def test_cli_exit_1_when_a_provider_fails(world: tuple, monkeypatch: pytest.MonkeyPatch) -> None:
    world[2].fail_listing = RuntimeError("AuthFailure")
    result = _invoke(world, monkeypatch, "--json")
    assert result.exit_code == 1
    assert "provider local: AuthFailure" in result.output


def test_cli_uptime_is_counted_from_launch(world: tuple, monkeypatch: pytest.MonkeyPatch) -> None:
    provider = world[2]
    provider.instances.clear()
    provider.add("spot-1", 0, datetime.now(timezone.utc) - timedelta(seconds=125), ip="10.0.0.1")
    data = read_envelope(_invoke(world, monkeypatch, "--json").output)
    assert 124 <= {r["node"]: r["uptime_s"] for r in data["nodes"]}["spot-1"] <= 140


def test_no_slurm_conf_is_a_clear_error_not_scontrols(world: tuple,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """No cluster set up (no $SLURM_CONF, no /etc/slurm/slurm.conf): the real scontrol fails
    with "fatal: Could not establish a configuration source" after its DNS SRV attempt; the
    user sees which slurm.conf was meant and what to do, exit 2."""
    if not Path("/usr/bin/scontrol").exists() or Path("/etc/slurm/slurm.conf").exists():
        pytest.skip("needs Slurm's scontrol and no system slurm.conf")
    monkeypatch.delenv("SLURM_CONF", raising=False)
    monkeypatch.setattr(status_module, "get_provider", lambda c, n: world[2])
    result = CliRunner().invoke(cli, ["--config", str(world[3]), "status"])
    assert result.exit_code == 2, result.output
    assert "no Slurm controller answered: /usr/bin/scontrol found no slurm.conf" in result.output
    assert "/etc/slurm/slurm.conf" in result.output and "slurm-spot local up" in result.output
    assert "resolve_ctls_from_dns_srv" not in result.output


def test_a_controller_that_does_not_answer_is_named(world: tuple, tmp_path: Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """A slurm.conf whose slurmctld is not running: exit 1 (an operation failed, cli.py's
    contract) with the slurm.conf used and the same advice."""
    if not Path("/usr/bin/scontrol").exists():
        pytest.skip("needs Slurm's scontrol")
    import socket

    with socket.socket() as sock:  # a port nothing listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    conf = tmp_path / "slurm.conf"
    conf.write_text(f"ClusterName=t\nSlurmctldHost=localhost(127.0.0.1)\nSlurmctldPort={port}\n"
                    f"MessageTimeout=2\nNodeName=n1 CPUs=1 State=UNKNOWN\n"
                    f"PartitionName=p Nodes=n1\n")
    monkeypatch.setenv("SLURM_CONF", str(conf))
    monkeypatch.setattr(status_module, "get_provider", lambda c, n: world[2])
    result = CliRunner().invoke(cli, ["--config", str(world[3]), "status"])
    assert result.exit_code == 1, result.output
    assert f"no Slurm controller answered (SLURM_CONF={conf}): is slurmctld running?" \
        in result.output


def test_cli_shows_each_node_sets_capacity(world: tuple, monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 24 part 6: a node set in cooldown says until when and why, in the table and
    in --json; --noheader (for awk over node rows) prints node rows only."""
    _, slurm, _, _ = world
    until = (datetime.now(timezone.utc) + timedelta(minutes=5)).strftime("%Y-%m-%dT%H:%M:%SZ")
    slurm.nodes["spot-3"].reason = f"(Code:InsufficientInstanceCapacity)Temporarily disabled until {until}"
    assert not [line for line in _invoke(world, monkeypatch).output.splitlines()
                if line.startswith("spot ")]  # piped: node rows only, for awk
    text = _invoke(world, monkeypatch, "--capacity")
    assert text.exit_code == 0, text.output
    (row,) = [line for line in text.output.splitlines() if line.startswith("spot ")]
    assert "cooldown" in row and until in row and "InsufficientInstanceCapacity" in row
    data = read_envelope(_invoke(world, monkeypatch, "--json").output, "status")
    (only,) = data["node_sets"]
    assert (only["node_set"], only["capacity"], only["code"]) == (
        "spot", "cooldown", "InsufficientInstanceCapacity")
    bare = _invoke(world, monkeypatch, "--noheader", "--capacity")
    assert not [line for line in bare.output.splitlines() if line.startswith("spot ")]


def test_cli_shows_where_the_last_failovers_went(world: tuple,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 24 part 6: after the capacity table, the last failovers (job, from, to, nodes,
    after how long, why), and ``failovers`` in --json; none: no table, an empty list."""
    config, _, _, _ = world
    assert read_envelope(_invoke(world, monkeypatch, "--json").output, "status")[
        "failovers"] == []
    assert "last failovers" not in _invoke(world, monkeypatch, "--capacity").output
    from slurm_spot import events

    events.emit(config.log_dir, events.Event(
        events.Action.FAILOVER, "resume", reason="slurm-spot: failover: no capacity",
        job_ids=(42,), extra={"from_node_set": "spot", "code": "InsufficientInstanceCapacity",
                              "candidates": ["gpu"], "expedited": True}))
    events.emit(config.log_dir, events.Event(
        events.Action.FAILOVER_STARTED, "resume", reason="started on node set gpu",
        job_ids=(42,), extra={"from_node_set": "spot", "node_set": "gpu",
                              "nodes": ["gpu-1", "gpu-2"], "seconds_from_error": 9.4}))
    text = _invoke(world, monkeypatch, "--capacity").output
    lines = text.splitlines()
    at = lines.index(next(line for line in lines if line.startswith("last failovers")))
    assert lines[at + 1].split() == ["time", "job", "from", "to", "nodes", "after", "why"]
    row = lines[at + 2].split()
    assert row[1:6] == ["42", "spot", "gpu", "gpu-1,gpu-2", "9s"]
    assert " ".join(row[6:]) == "no capacity (InsufficientInstanceCapacity)"
    (move,) = read_envelope(_invoke(world, monkeypatch, "--json").output, "status")["failovers"]
    assert (move["job"], move["from_node_set"], move["to_node_set"], move["nodes"]) == (
        42, "spot", "gpu", ["gpu-1", "gpu-2"])
    bare = _invoke(world, monkeypatch, "--noheader", "--capacity").output
    assert "last failovers" not in bare  # node rows only, for awk


def test_a_failover_line_of_another_shape_does_not_stop_status(world: tuple,
                                                             monkeypatch: pytest.MonkeyPatch
                                                             ) -> None:
    """An events line whose ``extra`` has odd values (a number for ``nodes`` and
    ``candidates``, text for ``seconds_from_error``: a damaged file, a hand edit) stopped
    `status` with a TypeError/ValueError traceback; it now shows the move without them, and
    the other rows still show."""
    config, _, _, _ = world
    config.log_dir.mkdir(parents=True, exist_ok=True)
    now = datetime.now(timezone.utc).isoformat()
    lines = [
        {"time": now, "action": "failover", "source": "resume", "job_ids": [42],
         "extra": {"from_node_set": "spot", "code": "Ice", "candidates": 5,
                   "expedited": "false"}},
        {"time": now, "action": "failover_started", "source": "resume", "job_ids": [42],
         "extra": {"from_node_set": "spot", "node_set": ["gpu"], "nodes": 7,
                   "seconds_from_error": "soon"}},
    ]
    with open(config.log_dir / "events.jsonl", "a") as fh:
        fh.writelines(json.dumps(line) + "\n" for line in lines)
    result = _invoke(world, monkeypatch, "--capacity")
    assert result.exit_code == 0, result.output
    assert "no capacity (Ice)" in result.output
    (move,) = read_envelope(_invoke(world, monkeypatch, "--json").output, "status")["failovers"]
    assert (move["job"], move["candidates"], move["to_node_set"], move["nodes"],
            move["seconds_from_error"], move["expedited"]) == (42, [], None, [], None, False)
