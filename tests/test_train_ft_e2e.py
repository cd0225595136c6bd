"""Fault-tolerant training (examples/train_ft.py, torchft) with real processes on CPU and a real
lighthouse, no Slurm: survivors keep training through a loss without notice and a leave with
notice, the returning replicas heal from a peer, every replica ends with the same weights and
the one-process loss; and when every replica is lost, they resume from the checkpoint."""

from __future__ import annotations

import signal
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from slurm_spot.jobs.services.ft_lighthouse import Lighthouse, LighthouseTimeouts
from tests.ft_runs import Replica, events, max_gap, reference, step_times

pytestmark = pytest.mark.e2e

#: A step's gradient is the same sum over the same global batch in any number of replicas,
#: summed in another order: the losses agree to float rounding.
LOSS_TOLERANCE = 1e-3


@pytest.fixture
def lighthouse() -> Iterator[Lighthouse]:
    server = Lighthouse("127.0.0.1", 0, min_replicas=1,
                        timeouts=LighthouseTimeouts(join_timeout_ms=1000,
                                                    heartbeat_timeout_ms=1000))
    yield server
    server.shutdown()


def _replicas(names: list[str], folder: Path, args: list[str]) -> list[Replica]:
    return [Replica(name, folder, args) for name in names]


def test_survivors_never_stop_and_returning_replicas_heal_from_a_peer(
        lighthouse: Lighthouse, tmp_path: Path) -> None:
    steps = 400  # ~0.12 s a step: a restarted replica (~10 s to import torch) rejoins in time
    common = ["--steps", str(steps), "--log-every", "1", "--step-sleep", "0.1",
              "--checkpoint-every", "1000", "--lighthouse", lighthouse.address,
              "--host", "127.0.0.1", "--checkpoint-dir", str(tmp_path / "ck"),
              "--timeout", "10"]
    r0, r1, r2 = replicas = _replicas(["r0", "r1", "r2"], tmp_path, common)
    try:
        for replica in replicas:
            replica.start()
        r1.wait_step(60, 180)
        killed_at = r1.signal(signal.SIGKILL)  # lost without notice
        assert r1.wait(30) == -signal.SIGKILL
        time.sleep(2.0)
        r1.start()
        r2.wait_step(150, 300)
        noticed_at = r2.signal(signal.SIGUSR2)  # the preemption signal: leave at a boundary
        assert r2.wait(60) == 85, r2.stderr_tail()
        time.sleep(2.0)
        r2.start()
        for replica in replicas:
            assert replica.wait(600) == 0, replica.stderr_tail()
    finally:
        for replica in replicas:
            replica.stop()

    survivor = step_times(events(r0.current))
    first = survivor[0][0]  # a replica that started late healed before its first step
    assert [s for s, _ in survivor] == list(range(first, steps + 1))  # every step, one run
    assert r0.runs == 1
    gap_kill = max_gap(survivor, (killed_at, killed_at + 30))
    gap_notice = max_gap(survivor, (noticed_at, noticed_at + 30))
    print(f"survivor's longest gap: {gap_kill:.2f} s after the kill, {gap_notice:.2f} s after "
          f"the notice; {max_gap(survivor):.2f} s over the run")
    # The quorum waits for a lost replica's heartbeat to lapse (1 s here); the rest is the
    # shared 2-CPU machine under load.
    assert gap_kill < 10.0
    assert gap_notice < 10.0

    left = [e for e in events(r2.outputs[0]) if e["event"] == "leave"]
    assert len(left) == 1 and left[0]["signal"] == signal.SIGUSR2
    for replica, after in ((r1, 60), (r2, left[0]["step"])):
        evs = events(replica.current)
        heals = [e for e in evs if e["event"] == "heal"]
        assert len(heals) == 1, evs[:5]
        assert heals[0]["from_peer"] and heals[0]["step"] >= after and heals[0]["bytes"] > 0
        assert not [e for e in evs if e["event"] == "restore"]  # no storage read
        print(f"{replica.name} healed at step {heals[0]['step']} in {heals[0]['heal_s']} s, "
              f"{heals[0]['bytes']} bytes")

    done = [next(e for e in events(r.current) if e["event"] == "done") for r in replicas]
    assert {d["step"] for d in done} == {steps}
    assert len({d["weights_sha256"] for d in done}) == 1  # identical weights
    alone = reference(["--steps", str(steps)])
    assert abs(done[0]["loss"] - alone["loss"]) <= LOSS_TOLERANCE * max(1.0, alone["loss"])


def test_every_replica_lost_resumes_from_the_checkpoint(
        lighthouse: Lighthouse, tmp_path: Path) -> None:
    common = ["--steps", "50", "--log-every", "1", "--checkpoint-every", "20", "--step-sleep",
              "0.05", "--lighthouse", lighthouse.address, "--host", "127.0.0.1",
              "--checkpoint-dir", str(tmp_path / "ck")]
    first = _replicas(["a", "b"], tmp_path, common)
    second = _replicas(["c", "d"], tmp_path, common)
    try:
        for replica in first:
            replica.start()
        first[0].wait_step(25, 300)
        for replica in first:  # every replica lost, without notice
            replica.signal(signal.SIGKILL)
            replica.wait(30)
        for replica in second:
            replica.start()
        for replica in second:
            assert replica.wait(300) == 0, replica.stderr_tail()
    finally:
        for replica in first + second:
            replica.stop()
    # The first to form a quorum finds nobody ahead of step 0 and restores the checkpoint of
    # step 20; one that joins after it heals from it instead (or, if it came after the end,
    # restores the last step's checkpoint).
    kinds = [[(e["event"], e["step"]) for e in events(r.current)
              if e["event"] in ("restore", "heal")] for r in second]
    assert ("restore", 20) in kinds[0] + kinds[1], kinds
    assert all(len(k) == 1 and k[0][1] >= 20 for k in kinds), kinds
    done = [next(e for e in events(r.current) if e["event"] == "done") for r in second]
    assert len({d["weights_sha256"] for d in done}) == 1
    assert {d["step"] for d in done} == {50}
    alone = reference(["--steps", "50"])
    assert abs(done[0]["loss"] - alone["loss"]) <= LOSS_TOLERANCE * max(1.0, alone["loss"])
