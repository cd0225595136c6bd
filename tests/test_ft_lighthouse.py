"""The torchft lighthouse of fault-tolerant jobs (slurm_spot/jobs/services/ft_lighthouse.py): bound to
the address it is given only, every interface refused, bad settings named."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from slurm_spot.errors import BadInputError
from slurm_spot.jobs.services.ft_lighthouse import Lighthouse, LighthouseTimeouts, serve_authenticated


def _listening(port: int) -> list[str]:
    """Local addresses (hex, as /proc/net/tcp writes them) of sockets listening on ``port``."""
    out = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            address, hex_port = fields[1].rsplit(":", 1)
            if int(hex_port, 16) == port and fields[3] == "0A":  # LISTEN
                out.append(address)
    return out


def test_it_listens_on_the_given_address_only() -> None:
    lighthouse = Lighthouse("127.0.0.1", 0)
    try:
        port = int(lighthouse.address.rsplit(":", 1)[1])
        assert lighthouse.address == f"http://127.0.0.1:{port}"
        assert _listening(port) == ["0100007F"]  # 127.0.0.1, not 0.0.0.0
        with socket.create_connection(("127.0.0.1", port), timeout=5):
            pass
    finally:
        lighthouse.shutdown()


@pytest.mark.parametrize("host", ["0.0.0.0", "::", "", "[::]"])
def test_every_interface_is_refused(host: str) -> None:
    with pytest.raises(BadInputError, match="every interface"):
        Lighthouse(host, 0)


@pytest.mark.parametrize("host", ["0x0", "::ffff:0.0.0.0"])
def test_other_spellings_of_every_interface_are_refused(host: str) -> None:
    """``0x0`` passes as a hostname and ``::ffff:0.0.0.0`` as an IPv6 address, but either
    binds every IPv4 interface (a connection to this machine's cluster address got in)."""
    with pytest.raises(BadInputError, match="every interface"):
        Lighthouse(host, 0)
    with pytest.raises(BadInputError, match="every interface"):
        serve_authenticated(host, 0, "42", 1, LighthouseTimeouts(), owner_of=lambda job: 1000)


@pytest.mark.parametrize(("kwargs", "named"), [
    ({"host": "bad host"}, "lighthouse address"),
    ({"host": "127.0.0.1", "port": 70000}, "port"),
    ({"host": "127.0.0.1", "min_replicas": 0}, "min_replicas"),
])
def test_bad_settings_are_named(kwargs: dict[str, object], named: str) -> None:
    with pytest.raises(BadInputError, match=named):
        Lighthouse(**kwargs)  # type: ignore[arg-type]


def test_bad_timeouts_are_named() -> None:
    with pytest.raises(BadInputError, match="heartbeat_timeout_ms"):
        LighthouseTimeouts(heartbeat_timeout_ms=0)


def test_a_taken_port_is_an_error_naming_the_address() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(BadInputError, match=f"127.0.0.1:{port}"):
            Lighthouse("127.0.0.1", port)


def _cli(*args: str) -> list[str]:
    import sys

    return [sys.executable, "-m", "slurm_spot", "lighthouse", *args]


def test_the_command_refuses_every_interface_with_exit_2() -> None:
    import subprocess

    for listen in ("0.0.0.0", "0x0"):
        proc = subprocess.run(_cli("--listen", listen, "--unauthenticated"),
                              capture_output=True, text=True, timeout=120)
        assert proc.returncode == 2, proc.stderr
        assert "every interface" in proc.stderr and "Traceback" not in proc.stderr


def test_the_command_starts_only_authenticated_or_when_told_it_is_not() -> None:
    """Secure by default: without --job (only that job's owner gets in) nor --unauthenticated
    nothing starts; both at once contradict each other."""
    import subprocess

    for extra, words in (([], ("--job JOBID", "--unauthenticated")),
                         (["--job", "42", "--unauthenticated"], ("contradict",)),
                         (["--job", "4;2"], ("--job", "expected a Slurm job id"))):
        proc = subprocess.run(_cli("--listen", "127.0.0.1", "--port", "0", *extra),
                              capture_output=True, text=True, timeout=120)
        assert proc.returncode == 2, proc.stderr
        assert all(word in proc.stderr for word in words), proc.stderr
        assert "Traceback" not in proc.stderr


def test_the_relay_command_names_what_failed() -> None:
    import subprocess
    import sys

    with socket.socket() as unused:
        unused.bind(("127.0.0.1", 0))
        free = unused.getsockname()[1]
    relay = [sys.executable, "-m", "slurm_spot", "lighthouse-relay"]
    proc = subprocess.run([*relay, "--lighthouse", f"127.0.0.1:{free}", "--job", "42", "--",
                           "true"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1
    assert f"cannot reach the lighthouse front door 127.0.0.1:{free}" in proc.stderr
    proc = subprocess.run([*relay, "--lighthouse", "127.0.0.1:1", "--job", "x"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and "--job 'x'" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_the_command_serves_on_its_address_until_sigterm() -> None:
    import re
    import signal
    import subprocess

    proc = subprocess.Popen(_cli("--listen", "127.0.0.1", "--port", "0", "--unauthenticated"),
                            stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stderr is not None
        lines = []  # torchft's own log lines may come first, on the same stderr
        found = None
        while found is None and len(lines) < 20:
            lines.append(proc.stderr.readline())
            found = re.search(r"listening on http://127\.0\.0\.1:(\d+)", lines[-1])
        assert found, lines
        port = int(found.group(1))
        assert _listening(port) == ["0100007F"]
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(60) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_a_group_gone_silent_holds_the_next_quorum_up_only_until_its_heartbeat_lapses() -> None:
    """Why the survivors' pause after a group leaves or dies is ``heartbeat_timeout_ms``
    (docs/ml-engineer.md, "How long the survivors wait"): a group that has stopped
    heartbeating is left out of the next quorum once its last heartbeat is older than that,
    even when ``join_timeout_ms`` (how long a quorum waits for a group that heartbeats but
    has not joined) is a minute; the real torchft lighthouse and client, over gRPC."""
    import threading
    from datetime import timedelta

    torchft = pytest.importorskip("torchft._torchft")
    defaults = LighthouseTimeouts()
    assert defaults.heartbeat_timeout_ms < defaults.join_timeout_ms  # the default is that case
    lighthouse = Lighthouse("127.0.0.1", 0, timeouts=LighthouseTimeouts(
        join_timeout_ms=60_000, heartbeat_timeout_ms=defaults.heartbeat_timeout_ms))
    try:
        client = torchft.LighthouseClient(lighthouse.address, timedelta(seconds=10))
        for replica in ("a", "b"):  # both heartbeat: the first quorum waits for both
            client.heartbeat(replica)
        quorums: dict[str, list[str]] = {}

        def join(replica: str) -> None:
            quorum = client.quorum(replica_id=replica, timeout=timedelta(seconds=30), step=1)
            quorums[replica] = sorted(p.replica_id for p in quorum.participants)
        both = [threading.Thread(target=join, args=(r,)) for r in ("a", "b")]
        for thread in both:
            thread.start()
        for thread in both:
            thread.join(60)
        assert quorums == {"a": ["a", "b"], "b": ["a", "b"]}
        # "b" goes (no more heartbeats, no quorum request); "a" asks for the next quorum and
        # heartbeats meanwhile every 100 ms, as torchft's Manager does from its own thread.
        stop = threading.Event()

        def heartbeat() -> None:
            while not stop.wait(0.1):
                client.heartbeat("a")
        beating = threading.Thread(target=heartbeat)
        beating.start()
        try:
            quorum = client.quorum(replica_id="a", timeout=timedelta(seconds=30), step=2)
        finally:
            stop.set()
            beating.join(10)
        assert [p.replica_id for p in quorum.participants] == ["a"]  # no 60 s wait: no timeout
    finally:
        lighthouse.shutdown()
