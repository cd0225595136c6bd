"""The reconciler as a program: lock, loop, reloads, --once output, metrics, its memory."""

from __future__ import annotations

import json
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest
from click.testing import CliRunner

from slurm_spot.cli import cli
from slurm_spot.commands import reconcile as reconcile_command
from slurm_spot.commands.common import AppContext
from slurm_spot.config import load_config
from slurm_spot.errors import SlurmCommandError
from slurm_spot.events import EVENTS_FILE
from slurm_spot.jsonenvelope import read_envelope
from slurm_spot.providers.base import InstanceState
from slurm_spot.reconcile.history import build_history, read_tail
from slurm_spot.reconcile.loop import AlreadyRunning, ConfigSource, Loop, single_instance
from slurm_spot.reconcile.metrics import ReconcileMetrics
from slurm_spot.reconcile.rules import Settings
from tests.fakes.fake_provider import FakeProvider
from tests.fakes.fake_slurm import FakeSlurm
from tests.test_reconcile_rules import NOW, World

CONFIG = {
    "cluster": "test",
    "node_sets": [{"name": "spot", "provider": "local", "count": 2}],
    "partitions": [{"name": "spot", "node_sets": ["spot"]}],
}


def write_config(tmp_path: Path, **extra: object) -> Path:
    path = tmp_path / "spot.yaml"
    path.write_text(json.dumps({**CONFIG, "state_dir": str(tmp_path / "state"),
                                "log_dir": str(tmp_path / "log"), **extra}))
    return path


# -- one instance at a time --------------------------------------------------------------
def test_second_instance_is_refused_with_the_holders_pid(tmp_path: Path) -> None:
    with single_instance(tmp_path / "state") as lock:
        with pytest.raises(AlreadyRunning, match=r"is running \(pid \d+; lock .*reconcile.lock\)"):
            with single_instance(tmp_path / "state"):
                pass
    with single_instance(tmp_path / "state") as again:
        assert again == lock


def test_cli_once_exits_1_with_a_clear_message_while_another_runs(tmp_path: Path) -> None:
    path = write_config(tmp_path)
    with single_instance(tmp_path / "state"):
        result = CliRunner().invoke(cli, ["--config", str(path), "reconcile", "--once"])
    assert result.exit_code == 1
    assert "another 'slurm-spot reconcile' is running" in result.output


# -- --once ------------------------------------------------------------------------------
def _patch(monkeypatch: pytest.MonkeyPatch, slurm: FakeSlurm, provider: FakeProvider) -> None:
    monkeypatch.setattr(reconcile_command, "SlurmClient", lambda bin_dir: slurm.client())
    monkeypatch.setattr(reconcile_command, "get_provider", lambda c, n: provider)
    monkeypatch.setattr(AppContext, "slurm", lambda self: slurm.client())


def test_cli_once_json_reports_the_actions(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = write_config(tmp_path)
    slurm, provider = FakeSlurm(), FakeProvider()
    slurm.add_node("spot-1", "DOWN+CLOUD+POWERED_DOWN", reason="ResumeTimeout reached")
    slurm.add_node("spot-2")
    _patch(monkeypatch, slurm, provider)
    result = CliRunner().invoke(cli, ["--config", str(path), "reconcile", "--once", "--json"])
    assert result.exit_code == 0, result.output
    data = read_envelope(result.output)
    assert data["verdicts"] == {"resume-failed": 1, "ok": 1}
    assert [(a["action"], a["node"]) for a in data["actions"]] == [("resume_failed", "spot-1")]
    assert slurm.nodes["spot-1"].state == "IDLE+CLOUD+POWERED_DOWN"


def test_cli_once_text_and_exit_1_on_a_failed_action(tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    path = write_config(tmp_path)
    slurm, provider = FakeSlurm(), FakeProvider()
    slurm.add_node("spot-1", "DOWN+CLOUD+POWERED_DOWN", reason="ResumeTimeout reached")
    slurm.add_node("spot-2", "DOWN+CLOUD+POWERED_DOWN", reason="ResumeTimeout reached")
    slurm.refuse["spot-2"] = "Access/permission denied"
    _patch(monkeypatch, slurm, provider)
    result = CliRunner().invoke(cli, ["--config", str(path), "reconcile", "--once"])
    assert result.exit_code == 1
    assert "resume_failed spot-1" in result.output
    assert "spot-2: resume-failed" in result.output and "permission denied" in result.output


def test_cli_once_when_slurm_is_down(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = write_config(tmp_path)

    class Down:
        def nodes(self, *a: object, **k: object) -> None:
            raise SlurmCommandError(["scontrol"], 1, "Unable to contact slurm controller")

    monkeypatch.setattr(reconcile_command, "SlurmClient", lambda bin_dir: Down())
    monkeypatch.setattr(reconcile_command, "get_provider", lambda c, n: FakeProvider())
    result = CliRunner().invoke(cli, ["--config", str(path), "reconcile", "--once"])
    assert result.exit_code == 1
    assert "Unable to contact slurm controller" in result.output


def test_systemd_unit(tmp_path: Path) -> None:
    path = write_config(tmp_path)
    result = CliRunner().invoke(cli, ["--config", str(path), "reconcile", "--systemd-unit",
                                      "--metrics-port", "9105"])
    assert result.exit_code == 0
    unit = result.output
    assert f"--config {path.absolute()} reconcile --metrics-port 9105" in unit
    assert "ExecReload=/bin/kill -HUP $MAINPID" in unit and "Restart=always" in unit
    assert unit.startswith("# Managed by slurm-spot")


# -- the loop ----------------------------------------------------------------------------
def test_bad_reload_keeps_the_last_good_config(tmp_path: Path) -> None:
    path = write_config(tmp_path, reconcile={"interval_s": 7})
    source = ConfigSource(load_config(path))
    assert source.reload() is False  # unchanged
    path.write_text("cluster: [unclosed")
    assert source.reload() is False
    assert source.config.reconcile.interval_s == 7
    write_config(tmp_path, reconcile={"interval_s": 9})
    assert source.reload() is True
    assert source.config.reconcile.interval_s == 9


def test_loop_survives_a_failing_pass_and_rebuilds_after_a_reload(tmp_path: Path) -> None:
    path = write_config(tmp_path, reconcile={"interval_s": 0.01})
    built: list[float] = []

    class Flaky:
        calls = 0

        def run_pass(self) -> object:
            Flaky.calls += 1
            if Flaky.calls == 1:
                raise SlurmCommandError(["scontrol"], 1, "timeout")
            if Flaky.calls == 2:
                raise KeyError("a bug")
            write_config(tmp_path, reconcile={"interval_s": 0.02})
            from slurm_spot.reconcile.reconciler import PassResult

            return PassResult(NOW)

    def make(config: object) -> Flaky:
        built.append(config.reconcile.interval_s)  # type: ignore[attr-defined]
        return Flaky()

    assert Loop(ConfigSource(load_config(path)), make).run(max_passes=4) == 4  # type: ignore[arg-type]
    assert built == [0.01, 0.02]


_DAEMON = """
import sys, threading
from slurm_spot.config import load_config
from slurm_spot.reconcile.loop import ConfigSource, Loop
from slurm_spot.reconcile.reconciler import PassResult

class Pass:
    def run_pass(self):
        # a helper thread, as the provider's and scontrol's thread pools start: the kernel may
        # hand it the SIGTERM
        threading.Thread(target=threading.Event().wait, daemon=True).start()
        print("pass", flush=True)
        return PassResult(0.0)

loop = Loop(ConfigSource(load_config(sys.argv[1])), lambda config: Pass())
loop.install_signals()
print("passes", loop.run(), "reload asked", loop._reload_requested, flush=True)
"""


def test_daemon_stops_at_once_on_sigterm_and_survives_sighup(tmp_path: Path) -> None:
    """The loop's 10-minute wait ends at SIGTERM at once, whichever thread the kernel signals;
    SIGHUP (reload) neither ends the wait nor kills the daemon."""
    import signal
    import subprocess
    import sys
    import time

    path = write_config(tmp_path, reconcile={"interval_s": 600})
    daemon = subprocess.Popen([sys.executable, "-c", _DAEMON, str(path)],
                              stdout=subprocess.PIPE, text=True)
    try:
        assert daemon.stdout is not None and daemon.stdout.readline() == "pass\n"
        daemon.send_signal(signal.SIGHUP)
        time.sleep(0.5)
        assert daemon.poll() is None, "SIGHUP ended the daemon"
        daemon.send_signal(signal.SIGTERM)
        out, _ = daemon.communicate(timeout=10)
    finally:
        daemon.kill()
        daemon.wait(30)
    assert daemon.returncode == 0
    assert out == "passes 1 reload asked True\n"


# -- metrics -----------------------------------------------------------------------------
def test_metrics_textfile_after_a_pass(tmp_path: Path) -> None:
    world = World(tmp_path, metrics_file=str(tmp_path / "prom" / "slurm_spot.prom"))
    world.slurm.add_node("spot-1", "ALLOCATED+CLOUD")
    world.slurm.add_job(3, ["spot-1"])
    world.slurm.add_node("spot-2", "IDLE+CLOUD")
    world.provider.add("spot-2", 60, NOW, market="on-demand")
    world.provider.add(None, 600, NOW)
    world.reconciler._failures_seen_after = NOW - timedelta(seconds=60)
    world.emit("launch_failed", "resume", "spot-3", 30,
               extra={"code": "InsufficientInstanceCapacity", "class": "capacity"})
    world.emit("launch_failed", "resume", "spot-3", 120,  # before the reconciler started
               extra={"code": "InsufficientInstanceCapacity", "class": "capacity"})
    world.run()
    text = (tmp_path / "prom" / "slurm_spot.prom").read_text()
    for line in ('slurm_spot_nodes{node_set="spot",state="alloc"} 1.0',
                 'slurm_spot_nodes{node_set="spot",state="idle~"} 2.0',
                 'slurm_spot_instances{market="on-demand",provider="local"} 1.0',
                 'slurm_spot_interruptions_total{node_set="spot"} 1.0',
                 'slurm_spot_orphans_terminated_total{provider="local"} 1.0',
                 'slurm_spot_launch_failures_total{code="InsufficientInstanceCapacity",'
                 'node_set="spot"} 1.0',
                 'slurm_spot_reconcile_actions_total{action="reclaimed",outcome="ok"} 1.0',
                 "slurm_spot_reconcile_pass_duration_seconds_count 1.0"):
        assert line in text
    assert not list((tmp_path / "prom").glob("*.tmp*"))


def test_metrics_registries_are_private() -> None:
    ReconcileMetrics()
    ReconcileMetrics()  # a second one in the same process does not collide


# -- the memory rebuilt from events ------------------------------------------------------
def _event(action: str, source: str, node: str | None, ago_s: float, **fields: object) -> dict:
    return {"action": action, "source": source, "node": node,
            "time": (NOW - timedelta(seconds=ago_s)).isoformat(), **fields}


def test_history_from_events() -> None:
    events = [
        _event("resume_failed", "reconcile", "spot-1", 4000),  # outside the window
        _event("resume_failed", "reconcile", "spot-1", 3000),
        _event("breaker", "reconcile", "spot-1", 2000),
        _event("resume_failed", "reconcile", "spot-1", 1000),
        _event("boot_lost", "reconcile", "spot-2", 100, extra={"reclaimed": True}),
        _event("boot_lost", "reconcile", "spot-2", 90, instance="i-9"),
        _event("launch_failed", "resume", "spot-3", 500,
               extra={"code": "QuotaExceeded", "class": "quota"}),
        _event("launch_failed", "resume", "spot-3", 400,
               extra={"code": "NoSpotHere", "class": "capacity"}),
        _event("cooldown", "reconcile", "spot-3", 300, extra={"node_set": "spot"}),
        _event("launch_failed", "resume", "gpu-1", 200,
               extra={"code": "STOCKOUT", "class": "capacity"}),
        _event("notice", "watch", "spot-4", 60, job_ids=[5, 6]),
        _event("requeued", "watch", "spot-4", 2000, job_ids=[7]),
    ]
    node_set_of = {"spot-1": "spot", "spot-2": "spot", "spot-3": "spot", "gpu-1": "gpu"}
    h = build_history(events, node_set_of, NOW, Settings(cooldown_s=600, failure_window_s=3600))
    # spot-3's quota failure is no resume failure (issue 11): it backs the set off instead,
    # and the cooldown after it already covers it.
    assert h.failures == {"spot-1": 1, "spot-2": 1}
    assert h.new_quota == {}
    later = build_history([*events, _event("launch_failed", "resume", "spot-3", 100,
                                           extra={"code": "QuotaExceeded", "class": "quota"})],
                          node_set_of, NOW, Settings(cooldown_s=600, failure_window_s=3600))
    assert later.new_quota == {"spot": ("QuotaExceeded", NOW - timedelta(seconds=100))}
    assert h.new_capacity == {"gpu": ("STOCKOUT", NOW - timedelta(seconds=200))}
    assert "nospothere" in h.capacity_codes and "quotaexceeded" not in h.capacity_codes
    assert h.handled_instances == frozenset({"i-9"})
    assert h.interrupted_jobs == frozenset({5, 6})


def test_read_tail_skips_a_partial_first_line_and_garbage(tmp_path: Path) -> None:
    lines = [json.dumps({"action": f"a{i}", "n": "x" * 50}) for i in range(100)]
    (tmp_path / EVENTS_FILE).write_text("\n".join([*lines, "not json", "[1, 2]", ""]))
    tail = read_tail(tmp_path, max_bytes=1000)
    assert 0 < len(tail) < 100
    assert tail[-1]["action"] == "a99"
    assert all(isinstance(e, dict) and e["action"].startswith("a") for e in tail)
    assert read_tail(tmp_path / "missing") == []


def test_events_carry_time_node_instance_action_reason_jobs(tmp_path: Path) -> None:
    world = World(tmp_path)
    world.slurm.add_node("spot-1", "MIXED+CLOUD")
    world.slurm.add_job(8, ["spot-1"])
    world.provider.add("spot-1", 100, NOW, state=InstanceState.TERMINATED)
    world.run()
    event = world.events("reclaimed")[0]
    assert event["time"] == NOW.isoformat()
    assert (event["node"], event["instance"], event["job_ids"]) == ("spot-1", "i-0001", [8])
    assert event["reason"] == "spot-interruption:reclaimed@2026-03-01T12:00:00Z"
    assert datetime.fromisoformat(event["time"]).tzinfo == timezone.utc


def test_metrics_over_http() -> None:
    import socket
    import urllib.request

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    metrics = ReconcileMetrics()
    metrics.action("reclaimed", ok=True)
    metrics.serve(port, addr="127.0.0.1")
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
        text = response.read().decode()
    assert 'slurm_spot_reconcile_actions_total{action="reclaimed",outcome="ok"} 1.0' in text


def test_metrics_port_in_use_is_a_clear_error_exit_2(tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 11, section 5: a taken --metrics-port was a traceback."""
    import socket

    path = write_config(tmp_path)
    slurm, provider = FakeSlurm(), FakeProvider()
    slurm.add_node("spot-1")
    _patch(monkeypatch, slurm, provider)
    with socket.socket() as taken:
        taken.bind(("0.0.0.0", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = CliRunner().invoke(cli, ["--config", str(path), "reconcile", "--once",
                                          "--metrics-port", str(port)])
    assert result.exit_code == 2, result.output
    assert f"--metrics-port {port}" in result.output and "in use" in result.output
    assert "Traceback" not in result.output
