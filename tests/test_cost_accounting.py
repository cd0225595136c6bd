"""The cost of a recorded job (fixture events, checkpoints and prices), computed by hand, and
the figures ``cost --plot`` draws."""

from __future__ import annotations

import json
import struct
from datetime import datetime
from pathlib import Path

import pytest

from slurm_spot.checkpoint.files import FORMAT
from slurm_spot.config import parse_config
from slurm_spot.cost.accounting import (
    CheckpointRecord,
    cost_report,
    job_ids_in_events,
    observed_node_rate_per_h,
    read_checkpoints,
    usage_from_events,
    usage_from_sacct,
)
from slurm_spot.cost.prices import site_prices

DAY = "2026-03-01T"


def at(hhmm: str) -> datetime:
    return datetime.fromisoformat(f"{DAY}{hhmm}:00+00:00")


def site(tmp_path: Path) -> dict:
    return {
        "cluster": "acct",
        "providers": {"aws": {"type": "aws", "region": "us-east-1"}},
        "node_sets": [{"name": "gpu", "provider": "aws", "count": 4,
                       "instance_types": ["g5.xlarge"],
                       "aws": {"launch_template": "lt-1", "subnets": ["subnet-1"]}}],
        "partitions": [{"name": "gpu", "node_sets": ["gpu"]}],
        "state_dir": str(tmp_path / "state"), "log_dir": str(tmp_path / "log"),
        "checkpoint": {"root": str(tmp_path / "ckpt"), "keep": 2},
        "cost": {"spot_usd_per_hour": {"g5.xlarge": 0.40},
                 "on_demand_usd_per_hour": {"g5.xlarge": 1.00},
                 "storage_usd_per_gb_month": {"aws": 0.023}, "egress_usd_per_gb": {"aws": 0.01}},
    }


def launched(hhmm: str, node: str, inst: str, market: str, zone: str) -> dict:
    return {"time": at(hhmm).isoformat(), "action": "launched", "source": "resume", "node": node,
            "instance": inst, "extra": {"market": market, "type": "g5.xlarge", "zone": zone}}


def ev(hhmm: str, action: str, node: str, job: int, source: str = "watch") -> dict:
    return {"time": at(hhmm).isoformat(), "action": action, "source": source, "node": node,
            "job_ids": [job]}


EVENTS = [
    launched("10:00", "gpu-1", "i-1", "spot", "us-east-1a"),
    launched("10:00", "gpu-2", "i-2", "spot", "us-east-1a"),
    ev("12:00", "notice", "gpu-2", 7),
    ev("12:02", "requeued", "gpu-2", 7),
    {"time": at("12:03").isoformat(), "action": "terminated", "source": "suspend",
     "node": "gpu-2", "instance": "i-2"},
    launched("12:05", "gpu-3", "i-3", "on-demand", "us-east-1b"),
    ev("16:00", "job_end", "gpu-1", 7, "epilog"),
    ev("16:00", "job_end", "gpu-3", 7, "epilog"),
    launched("09:00", "gpu-4", "i-4", "spot", "us-east-1a"),
    ev("09:30", "job_end", "gpu-4", 9, "epilog"),
]


def write_checkpoint(folder: Path, step: int, hhmm: str, size: int) -> None:
    d = folder / f"step_{step:09d}"
    d.mkdir(parents=True)
    (d / "manifest.json").write_text(json.dumps({
        "format": FORMAT, "step": step, "kind": "torch", "world_size": 2,
        "created_unix_s": at(hhmm).timestamp(), "files": {"model.pt": {"size": size}}}))


def test_cost_of_a_recorded_job_by_hand(tmp_path: Path) -> None:
    config = parse_config(site(tmp_path))
    ckpt = tmp_path / "ckpt" / "alice" / "7"
    for step, hhmm in ((100, "11:00"), (200, "11:40"), (300, "13:05"), (400, "13:45")):
        write_checkpoint(ckpt, step, hhmm, 10**9)
    (ckpt / "step_000000500.tmp-abcd").mkdir()  # an unfinished save is not a checkpoint
    assert job_ids_in_events(EVENTS) == [7, 9]
    usage = usage_from_events(7, EVENTS, config)
    usage.checkpoints = read_checkpoints(ckpt)
    assert [c.step for c in usage.checkpoints] == [100, 200, 300, 400]
    report = cost_report(usage, site_prices(config, live_spot=False), at("17:00"))
    # gpu-1 10:00-16:00 and gpu-2 10:00-12:00 on spot (8 h), gpu-3 12:05-16:00 on-demand
    by_market = {ln.market: ln for ln in report.lines}
    assert by_market["spot"].node_hours == pytest.approx(8.0)
    assert by_market["on-demand"].node_hours == pytest.approx(3 + 55 / 60)
    assert report.compute_usd == pytest.approx(8 * 0.40 + (3 + 55 / 60) * 1.00)
    assert report.on_demand_usd == pytest.approx(8 + 3 + 55 / 60)
    assert report.saving_percent == pytest.approx(100 * (1 - 7.116667 / 11.916667), abs=1e-3)
    assert report.interruptions == 1  # the notice and its requeue are one interruption
    # 20 min since the 11:40 checkpoint on the 2 nodes running at 12:00
    assert report.lost_compute_node_h == pytest.approx(2 * 20 / 60)
    # median checkpointed rate 100 steps / 40 min -> 20 min is 50 steps
    assert report.recomputed_steps == 50
    assert report.restart_h == pytest.approx(5 / 60)  # 12:00 -> 12:05
    # the 2 newest checkpoints (2 GB) for 6 h of a 30-day month; one restore of 1 GB
    assert report.checkpoint_bytes == 2 * 10**9
    assert report.storage_usd == pytest.approx(2 * 6 / 720 * 0.023)
    assert report.egress_usd == pytest.approx(0.01)
    assert report.total_usd == pytest.approx(report.compute_usd + report.storage_usd + 0.01)


def test_a_notice_time_checkpoint_loses_nothing(tmp_path: Path) -> None:
    config = parse_config(site(tmp_path))
    usage = usage_from_events(7, EVENTS, config)
    usage.checkpoints = [CheckpointRecord(at("11:40"), 200, 1), CheckpointRecord(at("12:01"), 260, 1)]
    report = cost_report(usage, site_prices(config, live_spot=False), at("17:00"))
    assert report.lost_compute_node_h == 0


def test_sacct_runs_give_the_segments(tmp_path: Path) -> None:
    config = parse_config(site(tmp_path))
    rows = [{"JobIDRaw": "7", "User": "alice", "Start": "2026-03-01T10:00:00+00:00",
             "End": "2026-03-01T12:00:00+00:00", "NodeList": "gpu-[1-2]"},
            {"JobIDRaw": "7", "User": "alice", "Start": "2026-03-01T12:05:00+00:00",
             "End": "Unknown", "NodeList": "gpu-[1,3]"}]
    usage = usage_from_sacct(7, rows, EVENTS, config, now=at("16:00"))
    assert usage.user == "alice" and len(usage.runs) == 2
    report = cost_report(usage, site_prices(config, live_spot=False), at("16:00"))
    by_market = {ln.market: ln.node_hours for ln in report.lines}
    # run 1: 2 nodes x 2 h spot; run 2 (still running at 16:00): gpu-1 spot, gpu-3 on-demand
    assert by_market == pytest.approx({"spot": 4 + 3 + 55 / 60, "on-demand": 3 + 55 / 60})
    assert report.restart_h == pytest.approx(5 / 60)


def test_missing_prices_name_the_type_and_zone(tmp_path: Path) -> None:
    data = site(tmp_path)
    data["cost"] = {"on_demand_usd_per_hour": {"g5.xlarge": 1.0}}
    config = parse_config(data)
    usage = usage_from_events(7, EVENTS, config)
    from slurm_spot.providers.prices import UnknownPriceError
    with pytest.raises(UnknownPriceError, match=r"'g5\.xlarge' in zone us-east-1a"):
        cost_report(usage, site_prices(config, live_spot=False), at("17:00"))


def test_observed_rate(tmp_path: Path) -> None:
    rate, how = observed_node_rate_per_h(EVENTS, at("16:00"))
    # spot instance-hours: i-1 10-16 (6), i-2 10-12:03 (2.05), i-4 09-16 (7); one interruption
    assert rate == pytest.approx(1 / (6 + 2.05 + 7))
    assert "1 interruptions" in how


def _png_size(path: Path) -> tuple[int, int]:
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    assert data[12:16] == b"IHDR"
    return struct.unpack(">II", data[16:24])


def test_job_figure_has_its_elements_and_is_a_png(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    from slurm_spot.cost.plots import job_figure, save_png

    config = parse_config(site(tmp_path))
    usage = usage_from_events(7, EVENTS, config)
    report = cost_report(usage, site_prices(config, live_spot=False), at("17:00"))
    fig = job_figure(usage, report)
    top, bottom = fig.axes
    assert len(top.patches) == len(usage.segments) == 3  # one bar per node segment
    assert [c.get_offsets().shape[0] for c in top.collections] == [1]  # one interruption mark
    labels = {t.get_text() for t in top.get_legend().get_texts()}
    assert {"spot g5.xlarge", "on-demand g5.xlarge", "interruption", "restart"} <= labels
    lines = {ln.get_label(): ln for ln in bottom.get_lines()}
    assert set(lines) == {"this job (USD)", "same node-hours on-demand (USD)"}
    assert lines["this job (USD)"].get_ydata()[-1] == pytest.approx(report.compute_usd)
    assert lines["same node-hours on-demand (USD)"].get_ydata()[-1] == pytest.approx(report.on_demand_usd)
    out = tmp_path / "job.png"
    save_png(fig, out)
    assert _png_size(out) == (1000, 700)
    assert out.stat().st_size > 20_000


def test_cost_finds_an_array_tasks_checkpoints_in_its_own_directory(tmp_path: Path) -> None:
    """Issue 23: ``cost --job`` looked in ``<root>/<user>/<raw job id>``, but an array task's
    checkpoints live in ``<root>/<user>/<array job>_<task>`` (the key the prolog uses), so an
    array task's storage and lost steps were never read."""
    from slurm_spot.cost.report import job_usage
    from slurm_spot.slurm.client import SlurmClient

    config = parse_config(site(tmp_path))
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    sacct = bin_dir / "sacct"  # what sacct -X -D -P prints for array task 1234_2 (raw id 1237)
    sacct.write_text("#!/bin/sh\necho '1237|1234_2|alice|2026-03-01T10:00:00|"
                     "2026-03-01T12:00:00|gpu-1|COMPLETED|'\n")
    sacct.chmod(0o755)
    for key, step in (("1234_2", 10), ("1237", 99)):  # 1237: where cost looked before
        folder = tmp_path / "ckpt" / "alice" / key / f"step_{step}"
        folder.mkdir(parents=True)
        (folder / "manifest.json").write_text(json.dumps(
            {"format": FORMAT, "step": step, "created_unix_s": at("11:00").timestamp(),
             "files": {"model.pt": {"size": 123}}}))
    usage = job_usage(config, SlurmClient(str(bin_dir)), 1237, [], None, at("16:00"))
    assert usage.user == "alice"
    assert [(c.step, c.size_bytes) for c in usage.checkpoints] == [(10, 123)]
