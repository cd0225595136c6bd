"""``slurm-spot rendezvous`` lets nobody in (issue 25): only a job's owner reaches its keys,
each job's keys are bounded, and the service never listens on every interface."""

from __future__ import annotations

import os
import socket
import struct
import subprocess
import sys
import threading
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import pytest

from slurm_spot.jobs.injob.rendezvous_client import RendezvousStore, RendezvousStoreError
from slurm_spot.jobs.rendezvous_wire import (
    MungeAuthenticator,
    RendezvousAuthError,
    WireError,
    credential_payload,
    recv_frame,
    send_frame,
)
from slurm_spot.jobs.services.rendezvous import default_listen_host, listen_socket, open_server
from slurm_spot.jobs.services.rendezvous_store import RendezvousServer, StoreLimits
from slurm_spot.slurm.client import Node, SlurmClient
from slurm_spot.slurm.states import parse_node_state
from tests.elastic_runs import rendezvous_service

OWNER = os.getuid()
OTHER_UID = OWNER + 4242


def _munge_works() -> bool:
    try:
        MungeAuthenticator().make(b"probe")
        return True
    except RendezvousAuthError:
        return False


needs_munge = pytest.mark.skipif(not _munge_works(), reason="needs a running munged")


def _owner_of(job: str) -> int | None:
    return {"9": OWNER, "10": OTHER_UID}.get(job)


@pytest.fixture
def server() -> Iterator[RendezvousServer]:
    srv = RendezvousServer(listen_socket("127.0.0.1", 0), MungeAuthenticator(), _owner_of,
                           StoreLimits(max_keys=8, max_value_bytes=1024, max_job_bytes=4096))
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    yield srv
    srv.close()


def _store(srv: RendezvousServer, job: str) -> RendezvousStore:
    return RendezvousStore("127.0.0.1", srv.port, job, timeout=timedelta(seconds=2))


def _attacker_session(srv: RendezvousServer, job: str, credential: str) -> dict:
    """A client that speaks the protocol and sends ``credential``; then tries to read, write
    and delete the job's key. Returns the handshake's answer; asserts nothing got through."""
    with socket.create_connection(("127.0.0.1", srv.port), timeout=10) as sock:
        recv_frame(sock)
        send_frame(sock, {"job": job, "credential": credential})
        answer = recv_frame(sock)
        for request in ({"op": "get", "key": "k"}, {"op": "set", "key": "k", "value": "eA=="},
                        {"op": "delete", "key": "k"}):
            try:
                send_frame(sock, request)
                reply = recv_frame(sock)
            except Exception:
                continue
            raise AssertionError(f"the server answered {request}: {reply}")
    return answer


@needs_munge
def test_a_client_without_a_credential_reads_writes_deletes_nothing(
        server: RendezvousServer) -> None:
    _store(server, "9").set("k", b"the owner's")
    answer = _attacker_session(server, "9", "MUNGE:forged-credential:")
    assert answer["ok"] is False and "invalid credential" in answer["error"]
    assert _store(server, "9").get("k") == b"the owner's"
    assert _store(server, "9").num_keys() == 1


@needs_munge
def test_a_client_of_another_user_is_refused(server: RendezvousServer) -> None:
    with pytest.raises(RendezvousAuthError, match=f"uid {OWNER} does not own job 10"):
        _store(server, "10").set("k", b"x")


@needs_munge
def test_a_credential_made_for_another_job_or_connection_is_refused(
        server: RendezvousServer) -> None:
    """The owner of job 9 cannot carry a credential of job 9 over to job 10, nor replay a
    credential made for another connection (nonce)."""
    _store(server, "9").set("k", b"nine")
    made_for_9 = MungeAuthenticator().make(credential_payload("0" * 32, "9"))
    answer = _attacker_session(server, "9", made_for_9)  # another nonce
    assert answer["ok"] is False and "not made for this connection" in answer["error"]
    with socket.create_connection(("127.0.0.1", server.port), timeout=10) as sock:
        nonce = recv_frame(sock)["nonce"]
        credential = MungeAuthenticator().make(credential_payload(nonce, "9"))
        send_frame(sock, {"job": "10", "credential": credential})
        assert recv_frame(sock)["ok"] is False


@needs_munge
def test_jobs_do_not_see_each_others_keys() -> None:
    srv = RendezvousServer(listen_socket("127.0.0.1", 0), MungeAuthenticator(),
                           lambda _job: OWNER)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        _store(srv, "9").set("torch.rendezvous.9-0", b"round")
        other = _store(srv, "11")
        assert other.num_keys() == 0 and not other.check(["torch.rendezvous.9-0"])
        assert other.delete_key("torch.rendezvous.9-0") is False
        assert _store(srv, "9").get("torch.rendezvous.9-0") == b"round"
    finally:
        srv.close()


@needs_munge
def test_oversized_writes_are_refused_with_the_limit_named(server: RendezvousServer) -> None:
    store = _store(server, "9")
    with pytest.raises(RendezvousStoreError, match=r"a value of 1025 bytes .* limit of 1024"):
        store.set("big", b"x" * 1025)
    for i in range(4):
        store.set(f"k{i}", b"y" * 1000)
    with pytest.raises(RendezvousStoreError, match="bytes of keys and values, over the limit"):
        store.set("k4", b"y" * 1000)
    for i in range(4, 8):
        store.set(f"k{i}", b"")
    with pytest.raises(RendezvousStoreError, match="9 keys, over the limit of 8"):
        store.set("k8", b"")
    assert store.num_keys() == 8 and not store.check(["big"])
    store.set("k0", b"z")  # rewriting a key within the limits still works


def test_a_huge_frame_before_the_handshake_is_not_read(server: RendezvousServer) -> None:
    """An unauthenticated client announcing a 1 GiB frame is cut off at once: the server
    never buffers what a stranger sends."""
    with socket.create_connection(("127.0.0.1", server.port), timeout=10) as sock:
        recv_frame(sock)
        sock.sendall(struct.pack(">I", 1 << 30) + b"x" * 65536)
        sock.settimeout(10)
        with pytest.raises((ConnectionError, WireError)):
            recv_frame(sock)


def test_every_interface_is_refused_with_exit_2() -> None:
    for listen in ("0.0.0.0", "::", "0", "0x0", "::ffff:0.0.0.0"):
        proc = subprocess.run([sys.executable, "-m", "slurm_spot", "rendezvous", "--listen",
                               listen, "--port", "29390"], capture_output=True, text=True,
                              timeout=60)
        assert proc.returncode == 2, proc.stderr
        assert "is every interface" in proc.stderr


def test_default_address_is_this_machines_not_every_interface() -> None:
    server = open_server(default_listen_host(env={}), 0, client=SlurmClient())
    try:
        bound = server.sock.getsockname()[0]
        assert bound not in ("0.0.0.0", "::"), bound
        assert bound == socket.getaddrinfo(socket.gethostname(), None)[0][4][0]
    finally:
        server.close()


def test_default_address_on_a_slurm_node_is_its_nodeaddr() -> None:
    class Slurm:
        def nodes(self, names: list[str], with_jobs: bool = True) -> list[Node]:
            assert names == ["od-1"]
            return [Node(name="od-1", state=parse_node_state("IDLE"), addr="10.1.2.3")]

    assert default_listen_host(Slurm(), {"SLURMD_NODENAME": "od-1"}) == "10.1.2.3"  # type: ignore[arg-type]


AGENT = """
import sys
from slurm_spot.jobs.injob import torchrun_agent as a
a.node_addr = lambda client, node: "127.0.0.1"  # no Slurm here: this node's address
a.leave(a.main(sys.argv[1:]))
"""

ALL_REDUCE = """
import torch, torch.distributed as dist
dist.init_process_group("gloo")
total = torch.ones(1)
dist.all_reduce(total)
print(f"world {dist.get_world_size()} sum {int(total.item())}", flush=True)
dist.destroy_process_group()
"""


@needs_munge
def test_two_agents_of_a_job_rendezvous_through_the_service(tmp_path: Path) -> None:
    """Two real torchrun agents of job 73 (--elastic 2:2) form their rendezvous through
    ``slurm-spot rendezvous`` as the job's owner, and their workers all-reduce in a world of 2."""
    train = tmp_path / "train.py"
    train.write_text(ALL_REDUCE)
    env = {**os.environ, "GLOO_SOCKET_IFNAME": "lo", "SLURM_JOB_ID": "73",
           "SLURM_RESTART_COUNT": "0", "SLURMD_NODENAME": "localhost",
           "SLURM_JOB_NODELIST": "localhost"}
    with rendezvous_service(os.environ, fake_owner=True) as endpoint:
        agents = [subprocess.Popen(
            [sys.executable, "-c", AGENT, "--elastic=2:2", f"--rendezvous={endpoint}",
             "--join-timeout=120", "--no-preload", "--", str(train)],
            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            for _ in range(2)]
        outputs = [agent.communicate(timeout=240) for agent in agents]
    for agent, (out, err) in zip(agents, outputs, strict=True):
        assert agent.returncode == 0, err[-3000:]
        assert "world 2 sum 2" in out


def test_a_slow_drip_does_not_hold_a_connection_past_the_handshake_timeout(
        monkeypatch: pytest.MonkeyPatch, server: RendezvousServer) -> None:
    """A socket timeout bounds each read only: a client sending a byte every 0.2 s held its
    connection (one of MAX_CONNECTIONS) for ever. The handshake has a deadline as a whole."""
    from slurm_spot.jobs.services import rendezvous_store
    from tests.slow_clients import drip_until_closed

    monkeypatch.setattr(rendezvous_store, "HANDSHAKE_TIMEOUT_S", 1.0)
    assert drip_until_closed(server.port) < 25
