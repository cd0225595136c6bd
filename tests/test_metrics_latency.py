"""Issue 16, metrics: launch latency, time to running and recovery time as histograms fed from
what the reconciler sees (events, nodes, jobs), the events of hooks and watchers counted, a
configurable bind address, and an example Grafana dashboard that uses only exported names."""

from __future__ import annotations

import json
import re
import socket
import urllib.request
from datetime import timedelta
from pathlib import Path

import pytest
from click.testing import CliRunner
from prometheus_client import generate_latest

from slurm_spot.cli import cli
from slurm_spot.config import SpotConfig, load_config
from slurm_spot.errors import ConfigError
from slurm_spot.reconcile.latency import LAUNCH, RECOVERY, TIME_TO_RUNNING, LatencyTracker, Observation
from slurm_spot.reconcile.metrics import METRIC_NAMES, ReconcileMetrics
from slurm_spot.slurm.client import Job, Node
from slurm_spot.slurm.states import JobState, parse_node_state
from tests.fakes.fake_provider import FakeProvider
from tests.fakes.fake_slurm import FakeSlurm
from tests.test_reconcile_daemon import _patch, write_config
from tests.test_reconcile_rules import NOW, World

ROOT = Path(__file__).resolve().parent.parent
T0 = NOW.timestamp()
SETS = {"spot-1": "spot", "spot-2": "spot"}


def at(offset_s: float) -> str:
    return (NOW + timedelta(seconds=offset_s)).isoformat()


def node(name: str, slurmd_start: float | None) -> Node:
    return Node(name, parse_node_state("IDLE+CLOUD"), slurmd_start_time=slurmd_start)


def job(job_id: int, state: str, submit: float, start: float | None, restarts: int = 0,
        partition: str = "spot") -> Job:
    return Job(job_id, JobState(state), partition=partition, restarts=restarts,
               submit_time=submit, start_time=start)


# -- the bookkeeping ---------------------------------------------------------------------
def test_launch_latency_is_request_to_slurmd_registration_counted_once() -> None:
    tracker = LatencyTracker(started=T0 - 600)
    launched = [{"action": "launched", "source": "resume", "node": "spot-1", "instance": "i-1",
                 "time": at(3), "extra": {"requested": at(0)}}]
    # not registered yet (no SlurmdStartTime, or one from before this launch)
    assert tracker.observe(launched, [node("spot-1", None)], [], SETS, ["spot"], T0 + 30) == []
    assert tracker.observe(launched, [node("spot-1", T0 - 900)], [], SETS, ["spot"], T0 + 40) == []
    found = tracker.observe(launched, [node("spot-1", T0 + 47)], [], SETS, ["spot"], T0 + 60)
    assert found == [Observation(LAUNCH, "spot", 47.0)]
    assert tracker.observe(launched, [node("spot-1", T0 + 47)], [], SETS, ["spot"], T0 + 90) == []
    # an earlier launch whose instance never registered is not counted with this registration
    relaunched = [{"action": "launched", "source": "resume", "node": "spot-2", "instance": "i-2",
                   "time": at(0)},
                  {"action": "launched", "source": "resume", "node": "spot-2", "instance": "i-3",
                   "time": at(300)}]
    assert tracker.observe(relaunched, [node("spot-2", T0 + 340)], [], SETS, ["spot"], T0 + 400) == [
        Observation(LAUNCH, "spot", 40.0)]


def test_time_to_running_counts_each_job_of_our_partitions_once_after_the_reconciler_started() -> None:
    tracker = LatencyTracker(started=T0)
    jobs = [job(1, "RUNNING", T0 - 20, T0 + 25),                   # ours: 45 s
            job(2, "RUNNING", T0 - 900, T0 - 100),                  # started before us
            job(3, "RUNNING", T0, T0 + 5, partition="cpu"),         # not a spot partition
            job(4, "RUNNING", T0, T0 + 5, restarts=1),              # requeued before it was seen
            job(5, "PENDING", T0, T0 + 500)]                        # squeue's estimate only
    found = tracker.observe([], [], jobs, SETS, ["spot"], T0 + 30)
    assert found == [Observation(TIME_TO_RUNNING, "spot", 45.0),
                     Observation(TIME_TO_RUNNING, "spot", 5.0)]
    assert tracker.observe([], [], jobs, SETS, ["spot"], T0 + 60) == []
    # once per job: its next run after a requeue is recovery's, not a second start
    again = [job(1, "RUNNING", T0 + 100, T0 + 130, restarts=1)]
    assert tracker.observe([], [], again, SETS, ["spot"], T0 + 140) == []


def test_recovery_is_from_the_earliest_event_of_each_interruption() -> None:
    tracker = LatencyTracker(started=T0 - 3600)
    first_run = [job(7, "RUNNING", T0 - 3000, T0 - 2000)]
    assert tracker.observe([], [], first_run, SETS, ["spot"], T0 - 1000) == [
        Observation(TIME_TO_RUNNING, "spot", 1000.0)]
    events = [{"action": "notice", "source": "watch", "node": "spot-1", "time": at(0),
               "job_ids": [7]},
              {"action": "reclaimed", "source": "reconcile", "node": "spot-1", "time": at(100),
               "job_ids": [7]}]
    pending = [job(7, "PENDING", T0 - 3000, T0 + 200, restarts=1)]
    assert tracker.observe(events, [], pending, SETS, ["spot"], T0 + 150) == []
    back = [job(7, "RUNNING", T0 - 3000, T0 + 130, restarts=1)]
    assert tracker.observe(events, [], back, SETS, ["spot"], T0 + 160) == [
        Observation(RECOVERY, "spot", 130.0)]
    assert tracker.observe(events, [], back, SETS, ["spot"], T0 + 190) == []
    # a second interruption is measured from its own notice, not the first one's
    events.append({"action": "notice", "source": "watch", "node": "spot-2", "time": at(1000),
                   "job_ids": [7]})
    again = [job(7, "RUNNING", T0 - 3000, T0 + 1090, restarts=2)]
    assert tracker.observe(events, [], again, SETS, ["spot"], T0 + 1100) == [
        Observation(RECOVERY, "spot", 90.0)]


# -- through a reconcile pass: the textfile an admin's node-exporter reads ----------------
def test_a_pass_fills_the_histograms_and_counts_hook_and_watcher_events(tmp_path: Path) -> None:
    prom = tmp_path / "prom" / "slurm_spot.prom"
    world = World(tmp_path, metrics_file=str(prom))
    world.reconciler.metrics.latency.started = T0 - 600
    world.reconciler._failures_seen_after = NOW - timedelta(seconds=500)
    world.slurm.add_node("spot-1", "ALLOCATED+CLOUD").slurmd_start_time = int(T0) - 340
    world.provider.add("spot-1", 400, NOW)
    world.slurm.add_node("spot-2", "ALLOCATED+CLOUD").slurmd_start_time = int(T0) - 150
    world.provider.add("spot-2", 200, NOW)
    first = world.slurm.add_job(11, ["spot-1"])
    first.submit_time, first.start_time = int(T0) - 400, int(T0) - 330
    back = world.slurm.add_job(12, ["spot-2"])
    back.submit_time, back.start_time, back.restarts = int(T0) - 3000, int(T0) - 140, 1
    world.emit("launched", "resume", "spot-1", 400, instance="i-0001",
               extra={"requested": at(-400)})
    world.emit("notice", "watch", "spot-9", 260, job_ids=(12,))
    world.emit("launched", "resume", "spot-2", 199, instance="i-0002",
               extra={"requested": at(-200)})
    world.emit("job_end", "epilog", "spot-3", 100, job_ids=(10,))
    world.run()
    text = prom.read_text()
    for line in ('slurm_spot_launch_latency_seconds_count{node_set="spot"} 2.0',
                 'slurm_spot_launch_latency_seconds_sum{node_set="spot"} 110.0',   # 60 + 50
                 'slurm_spot_launch_latency_seconds_bucket{le="60.0",node_set="spot"} 2.0',
                 'slurm_spot_launch_latency_seconds_bucket{le="45.0",node_set="spot"} 0.0',
                 # job 11: 70 s; job 12 is first seen in its second run: 2860 s from its submission
                 'slurm_spot_time_to_running_seconds_sum{partition="spot"} 2930.0',
                 'slurm_spot_time_to_running_seconds_count{partition="spot"} 2.0',
                 'slurm_spot_recovery_seconds_sum{node_set="unknown"} 120.0',
                 'slurm_spot_events_total{action="launched",source="resume"} 2.0',
                 'slurm_spot_events_total{action="notice",source="watch"} 1.0',
                 'slurm_spot_events_total{action="job_end",source="epilog"} 1.0'):
        assert line in text, line
    world.now = NOW + timedelta(seconds=30)
    world.run()  # nothing new: nothing counted twice
    assert prom.read_text().count('slurm_spot_launch_latency_seconds_count{node_set="spot"} 2.0') == 1
    assert 'slurm_spot_events_total{action="launched",source="resume"} 2.0' in prom.read_text()


# -- where the endpoint listens ------------------------------------------------------------
def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def test_bind_address_defaults_to_loopback_and_is_validated(tmp_path: Path) -> None:
    base = {"cluster": "t", "node_sets": [{"name": "spot", "provider": "local", "count": 1}],
            "partitions": [{"name": "spot", "node_sets": ["spot"]}]}
    assert SpotConfig.model_validate(base).reconcile.metrics_addr == "127.0.0.1"
    assert SpotConfig.model_validate(
        {**base, "reconcile": {"metrics_addr": "[::]", "metrics_port": 9105}}).reconcile.metrics_addr == "::"
    path = tmp_path / "spot.yaml"
    path.write_text(json.dumps({**base, "reconcile": {"metrics_addr": "controller.example"}}))
    with pytest.raises(ConfigError, match=r"reconcile\.metrics_addr.*not an IPv4 or IPv6 address"):
        load_config(path)


def test_cli_serves_on_the_configured_address_and_port(tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    port = _free_port()
    path = write_config(tmp_path, reconcile={"metrics_port": port, "interval_s": 0.01})
    slurm, provider = FakeSlurm(), FakeProvider()
    slurm.add_node("spot-1")
    _patch(monkeypatch, slurm, provider)
    result = CliRunner().invoke(cli, ["--config", str(path), "reconcile", "--once"])
    assert result.exit_code == 0, result.output
    # prometheus_client's server thread outlives --once in this process: it is still there
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
        assert "slurm_spot_reconcile_pass_duration_seconds_count" in response.read().decode()


def test_cli_refuses_a_bad_or_foreign_address_with_exit_2(tmp_path: Path,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    path = write_config(tmp_path)
    slurm, provider = FakeSlurm(), FakeProvider()
    slurm.add_node("spot-1")
    _patch(monkeypatch, slurm, provider)
    bad = CliRunner().invoke(cli, ["--config", str(path), "reconcile", "--once",
                                   "--metrics-port", "9", "--metrics-addr", "somehost"])
    assert bad.exit_code == 2 and "--metrics-addr" in bad.output and "'somehost'" in bad.output
    foreign = CliRunner().invoke(cli, ["--config", str(path), "reconcile", "--once",
                                       "--metrics-port", str(_free_port()),
                                       "--metrics-addr", "192.0.2.1"])  # TEST-NET: not ours
    assert foreign.exit_code == 2, foreign.output
    assert "cannot listen on 192.0.2.1:" in foreign.output and "Traceback" not in foreign.output


def test_systemd_unit_carries_the_address() -> None:
    result = CliRunner().invoke(cli, ["--config", str(ROOT / "examples" / "spot-local.yaml"),
                                      "reconcile", "--systemd-unit", "--metrics-port", "9105",
                                      "--metrics-addr", "0.0.0.0"])
    assert result.exit_code == 0, result.output
    assert "reconcile --metrics-port 9105 --metrics-addr 0.0.0.0\n" in result.output


# -- the example dashboard ---------------------------------------------------------------
def exported_names() -> set[str]:
    """Every sample name the exporter shows (``_created`` timestamps aside), from its registry."""
    names = set()
    for family in ReconcileMetrics().registry.collect():
        names |= {"histogram": {f"{family.name}_bucket", f"{family.name}_sum",
                                f"{family.name}_count"},
                  "counter": {f"{family.name}_total"}}.get(family.type, {family.name})
    return names


def test_dashboard_uses_exactly_the_exported_metric_names() -> None:
    exported = exported_names()
    families = {re.sub(r"_(bucket|sum|count)$", "", n) for n in exported}
    assert families == set(METRIC_NAMES)
    # and what a scrape really shows, once each family has a sample
    metrics = ReconcileMetrics()
    metrics.observe([Observation(LAUNCH, "spot", 1), Observation(TIME_TO_RUNNING, "spot", 1),
                     Observation(RECOVERY, "spot", 1)])
    metrics.events.labels("watch", "notice").inc()
    scraped = set(re.findall(r"^(slurm_spot_[a-z_]+)[{ ]", generate_latest(metrics.registry).decode(),
                             re.M))
    assert {"slurm_spot_events_total", "slurm_spot_recovery_seconds_bucket"} <= scraped <= exported | {
        n for n in scraped if n.endswith("_created")}
    dashboard = json.loads((ROOT / "examples" / "grafana-dashboard.json").read_text())
    exprs = [t["expr"] for p in dashboard["panels"] for t in p["targets"]]
    used = set(re.findall(r"\bslurm_spot_[a-z_]+", " ".join(exprs)))
    assert used and used <= exported, f"not exported: {sorted(used - exported)}"
    for histogram in ("slurm_spot_launch_latency_seconds", "slurm_spot_time_to_running_seconds",
                      "slurm_spot_recovery_seconds"):
        assert f"{histogram}_bucket" in used
    assert len({p["id"] for p in dashboard["panels"]}) == len(dashboard["panels"])
