"""The daemons speak systemd's notify protocol (Type=notify, WatchdogSec=) over a real datagram
socket, as systemd would receive it: READY=1 when they run, WATCHDOG=1 while they loop and
wait, STATUS= after each reconcile pass, STOPPING=1 at the end."""

from __future__ import annotations

import json
import os
import socket
from collections.abc import Iterator
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest

from slurm_spot.config import load_config, parse_config
from slurm_spot.lifecycle.watch import Watcher, source_for
from slurm_spot.reconcile.loop import ConfigSource, Loop
from slurm_spot.reconcile.reconciler import PassResult
from slurm_spot.sdnotify import Notifier
from slurm_spot.slurm.client import SlurmClient
from tests.test_watch import ScriptedSlurm


@pytest.fixture
def systemd(tmp_path: Path) -> Iterator[tuple[socket.socket, dict[str, str]]]:
    """A datagram socket standing in for systemd's, and the environment a unit with
    ``WatchdogSec=2`` gives its main process."""
    path = tmp_path / "notify"
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
        sock.bind(str(path))
        sock.settimeout(0)
        yield sock, {"NOTIFY_SOCKET": str(path), "WATCHDOG_USEC": "2000000",
                     "WATCHDOG_PID": str(os.getpid())}


def received(sock: socket.socket) -> list[str]:
    """Every message systemd got so far, one string each."""
    out = []
    while True:
        try:
            out.append(sock.recv(4096).decode())
        except BlockingIOError:
            return out


def test_outside_systemd_nothing_is_sent() -> None:
    notifier = Notifier({})
    assert notifier.address is None and notifier.ping_every_s is None
    assert notifier.ready() is False and notifier.watchdog() is False


def test_abstract_socket_and_watchdog_of_another_process() -> None:
    notifier = Notifier({"NOTIFY_SOCKET": "@slurm-spot-test", "WATCHDOG_USEC": "1000000",
                         "WATCHDOG_PID": "1"})
    assert notifier.address == "\0slurm-spot-test"
    assert notifier.watchdog_s is None  # meant for pid 1, not us


def test_watchdog_pings_are_spaced_by_a_quarter_period(systemd) -> None:
    sock, env = systemd
    now = [100.0]
    notifier = Notifier(env, clock=lambda: now[0])
    assert notifier.ping_every_s == 1.0
    assert notifier.ready("up")
    assert notifier.watchdog() is False  # just said READY
    now[0] += 0.6
    assert notifier.watchdog() is True
    assert notifier.watchdog() is False
    assert received(sock) == ["READY=1\nSTATUS=up", "WATCHDOG=1"]


def test_a_gone_socket_is_a_warning_not_a_failure(tmp_path: Path,
                                                  caplog: pytest.LogCaptureFixture) -> None:
    notifier = Notifier({"NOTIFY_SOCKET": str(tmp_path / "none")})
    assert notifier.ready() is False and notifier.stopping() is False
    assert caplog.text.count("cannot notify systemd") == 1


def test_reconcile_loop_is_ready_pings_and_reports_each_pass(tmp_path: Path, systemd) -> None:
    sock, env = systemd
    path = tmp_path / "spot.yaml"
    path.write_text(json.dumps({
        "cluster": "c", "node_sets": [{"name": "spot", "provider": "local", "count": 1}],
        "partitions": [{"name": "spot", "node_sets": ["spot"]}],
        "state_dir": str(tmp_path / "state"), "log_dir": str(tmp_path / "log"),
        "reconcile": {"interval_s": 0.3}}))

    class Pass:
        def run_pass(self) -> PassResult:
            return PassResult(0.0)

    loop = Loop(ConfigSource(load_config(path)), lambda c: Pass(),  # type: ignore[arg-type,return-value]
                notifier=Notifier({**env, "WATCHDOG_USEC": "400000"}))
    assert loop.run(max_passes=3) == 3
    messages = received(sock)
    assert messages[0] == "READY=1\nSTATUS=reconciling every 0.3 s"
    assert messages.count("STATUS=pass: no nodes; 0 action(s), 0 error(s) in 0.00 s") == 3
    assert "WATCHDOG=1" in messages  # 0.3 s waits are longer than a quarter of 0.4 s
    assert messages[-1] == "STOPPING=1"


def test_watcher_is_ready_and_pings_while_it_handles_a_notice(tmp_path: Path, systemd) -> None:
    sock, env = systemd
    config = parse_config({
        "cluster": "c", "node_sets": [{"name": "spot", "provider": "local", "count": 1}],
        "partitions": [{"name": "spot", "node_sets": ["spot"]}],
        "state_dir": str(tmp_path / "state"), "log_dir": str(tmp_path / "log")})
    notices = config.state_dir / "local" / "notices"
    notices.mkdir(parents=True)
    deadline = datetime.now(timezone.utc) + timedelta(seconds=30)
    (notices / "spot-1.json").write_text(json.dumps({"action": "terminate",
                                                     "time": deadline.isoformat()}))
    watcher = Watcher(config, "spot-1", SlurmClient("/usr/bin", runner=ScriptedSlurm(with_job=False)),
                      source_for(config, "spot-1"), sleep=lambda s: None, notifier=Notifier(env))
    outcome = watcher.run(once=True)
    assert outcome is not None
    messages = received(sock)
    assert messages[0] == "READY=1\nSTATUS=watching node spot-1 for interruption notices"
