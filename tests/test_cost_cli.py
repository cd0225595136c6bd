"""``slurm-spot plan``, ``simulate`` and ``cost`` as a user runs them."""

from __future__ import annotations

import json
import math
import struct
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from slurm_spot.cli import cli
from tests.test_cost_accounting import EVENTS, site


def run(*args: str, config: Path | None = None) -> tuple[int, str]:
    argv = (["--config", str(config)] if config else []) + list(args)
    result = CliRunner().invoke(cli, argv)
    return result.exit_code, result.output


@pytest.fixture(autouse=True)
def _no_site_config(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("SLURM_SPOT_CONFIG", str(tmp_path / "absent.yaml"))
    monkeypatch.delenv("SLURM_CONF", raising=False)


def test_plan_json_has_the_promised_fields() -> None:
    code, out = run("plan", "--checkpoint-s", "300", "--restart-s", "600", "--nodes", "1",
                    "--mtbf-h", "24", "--notice-s", "0", "--json")
    assert code == 0, out
    data = json.loads(out)
    assert data["mtbf_job_h"] == pytest.approx(24)
    assert data["young_interval_s"] == pytest.approx(math.sqrt(2 * 300 * 86400))
    assert data["daly_interval_s"] / 60 == pytest.approx(116.69, abs=0.01)  # Daly 2006, fig. 3
    assert 0 < data["waste_fraction"] < 0.1
    assert data["waste_fraction_with_notice"] is None  # no notice, no notice checkpoint


def test_plan_prices_a_job_and_states_the_band_assumption() -> None:
    code, out = run("plan", "--checkpoint-s", "60", "--nodes", "8", "--interruption-band", "<5%",
                    "--job-hours", "10", "--instance-type", "p4d.24xlarge", "--spot-usd-h", "10")
    assert code == 0, out
    assert "band <5% taken as 2.5% of nodes interrupted a month" in out
    assert "constant hazard" in out
    assert "on-demand $1,756.61" in out  # 10 h * 8 * 21.957642 (catalogue, vantage data)
    assert "warning" not in out  # every price used has a source
    assert "with a checkpoint at each notice" in out


@pytest.mark.parametrize(("args", "message"), [
    (["--interruption-band", "3%"], "interruption band '3%'"),
    (["--interruption-band", "<5%", "--mtbf-h", "3"], "exactly one of"),
    ([], "exactly one of"),
    (["--interruption-rate", "lots"], "--interruption-rate 'lots'"),
    (["--mtbf-h", "1", "--job-hours", "1", "--instance-type", "x1.tiny"],
     "no spot price for instance type 'x1.tiny'"),
])
def test_plan_bad_input_exits_2_naming_it(args: list[str], message: str) -> None:
    code, out = run("plan", "--checkpoint-s", "60", *args)
    assert code == 2
    assert message in out


def test_plan_compare_ranks_by_expected_cost(tmp_path: Path) -> None:
    data = site(tmp_path)
    data["cost"]["spot_usd_per_hour"]["p4d.24xlarge"] = 10.0
    config = tmp_path / "spot.yaml"
    config.write_text(yaml.safe_dump(data))
    code, out = run("--config", str(config), "plan", "--compare", "--checkpoint-s", "60", "--nodes", "4",
                    "--work-steps", "360000", "--candidate", "g5.xlarge:1:<5%",
                    "--candidate", "p4d.24xlarge:40:>20%", "--json", "--deadline-h", "20")
    assert code == 0, out
    ranked = json.loads(out)
    assert [r["instance_type"] for r in ranked] == ["p4d.24xlarge", "g5.xlarge"]
    assert ranked[1]["meets_deadline"] is False


def test_simulate_json_and_plot(tmp_path: Path) -> None:
    png = tmp_path / "sim.png"
    code, out = run("simulate", "--nodes", "8", "--job-hours", "24", "--checkpoint-s", "60",
                    "--interruption-band", ">20%", "--spot-usd-h", "10", "--on-demand-usd-h",
                    "30", "--runs", "50", "--seed", "2", "--json", "--plot", str(png))
    assert code == 0, out
    data = json.loads(out)
    assert [s["strategy"] for s in data["strategies"]] == ["plain", "periodic", "slurm-spot",
                                                            "elastic"]
    for s in data["strategies"]:
        assert 0.9 < s["goodput"]["mean"] <= 1 and s["goodput"]["ci95"] >= 0
    assert data["on_demand"]["cost_usd"] == pytest.approx(24 * 8 * 30)
    blob = png.read_bytes()
    assert blob[:8] == b"\x89PNG\r\n\x1a\n" and len(blob) > 15_000
    assert struct.unpack(">II", blob[16:24]) == (1100, 450)
    code, out = run("simulate", "--job-hours", "1", "--checkpoint-s", "6", "--mtbf-h", "9",
                    "--plot", str(tmp_path / "x.jpg"))
    assert code == 2 and "must end in .png" in out


def test_cost_of_recorded_jobs_from_events(tmp_path: Path) -> None:
    data = site(tmp_path)
    data["slurm_bin_dir"] = str(tmp_path / "no-slurm")  # no sacct here: the events are used
    config = tmp_path / "spot.yaml"
    config.write_text(yaml.safe_dump(data))
    (tmp_path / "log").mkdir()
    (tmp_path / "log" / "events.jsonl").write_text("".join(json.dumps(e) + "\n" for e in EVENTS))
    code, out = run("cost", "--json", config=config)
    assert code == 0, out
    reports = {r["job_id"]: r for r in json.loads(out)}
    assert set(reports) == {7, 9}
    assert reports[7]["source"] == "events" and reports[7]["interruptions"] == 1
    assert reports[7]["compute_usd"] == pytest.approx(8 * 0.4 + (3 + 55 / 60))
    assert reports[9]["compute_usd"] == pytest.approx(0.5 * 0.4)
    png = tmp_path / "job.png"
    code, out = run("cost", "--job", "7", "--plot", str(png), config=config)
    assert code == 0, out
    assert "job 7 (from events)" in out and "interruptions: 1" in out
    assert png.read_bytes()[:4] == b"\x89PNG"
    code, out = run("cost", "--plot", str(png), config=config)
    assert code == 2 and "need --job" in out
    code, out = run("cost", "--job", "12345", config=config)
    assert code == 2 and "job 12345" in out


def test_plan_with_the_rate_observed_in_the_event_log(tmp_path: Path) -> None:
    data = site(tmp_path)
    config = tmp_path / "spot.yaml"
    config.write_text(yaml.safe_dump(data))
    (tmp_path / "log").mkdir()
    (tmp_path / "log" / "events.jsonl").write_text("".join(json.dumps(e) + "\n" for e in EVENTS))
    code, out = run("plan", "--checkpoint-s", "60", "--interruption-rate", "observed", "--json",
                    config=config)
    assert code == 0, out
    plan = json.loads(out)
    assert plan["assumption"].startswith("observed: 1 interruptions in ")
    # the fixture's spot instances are still alive "now", so the rate is below 1 per 15.05 h
    assert 0 < plan["node_rate_per_h"] < 1 / 15.05
    # JSON lines that are not events (wrong shape) are skipped, not counted as interruptions
    notice = next(e for e in EVENTS if e["action"] == "notice")  # gpu-2 at 12:00
    odd = [{**notice, "node": 5}, {**notice, "node": "gpu-1", "job_ids": "12"},
           {**notice, "node": "gpu-4", "extra": []}]  # each another node: would count
    with open(tmp_path / "log" / "events.jsonl", "a") as fh:
        fh.write("".join(json.dumps(e) + "\n" for e in odd))
    code, again = run("plan", "--checkpoint-s", "60", "--interruption-rate", "observed", "--json",
                      config=config)
    assert code == 0, again
    assert json.loads(again)["assumption"] == plan["assumption"]


def _unverified_catalogue(monkeypatch: pytest.MonkeyPatch) -> None:
    """The shipped catalogue plus an AWS type whose on-demand price no source confirmed."""
    from slurm_spot.cost import prices

    data = json.loads(json.dumps(prices.catalogue()))
    data["aws"]["on_demand"]["g5.xlarge"] = {"usd_per_h": 1.25, "source": "unverified"}
    monkeypatch.setattr(prices, "catalogue", lambda: data)


def test_plan_says_when_it_used_an_unverified_price(monkeypatch: pytest.MonkeyPatch) -> None:
    _unverified_catalogue(monkeypatch)
    args = ["plan", "--checkpoint-s", "60", "--nodes", "2", "--mtbf-h", "1000",
            "--job-hours", "10", "--instance-type", "g5.xlarge", "--spot-usd-h", "0.5"]
    code, out = run(*args, "--json")
    assert code == 0, out
    data = json.loads(out)
    assert data["on_demand_cost_usd"] == pytest.approx(10 * 2 * 1.25)
    assert data["unverified_prices"] == ["on-demand g5.xlarge: 1.25 USD/h"]
    assert "UNVERIFIED" in data["price_source"]
    code, out = run(*args)
    assert "warning: catalogue price(s) on-demand g5.xlarge: 1.25 USD/h not confirmed" in out
    code, out = run("plan", "--compare", "--checkpoint-s", "60", "--work-steps", "1000",
                    "--candidate", "a2-highgpu-1g:1:<5%", "--json")
    assert "unverified_prices" not in json.loads(out)[0]  # sourced entries: no warning


def test_cost_says_when_it_used_an_unverified_price(tmp_path: Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    _unverified_catalogue(monkeypatch)
    data = site(tmp_path)
    data["slurm_bin_dir"] = str(tmp_path / "no-slurm")
    del data["cost"]["on_demand_usd_per_hour"]  # the catalogue's, unverified, is used
    config = tmp_path / "spot.yaml"
    config.write_text(yaml.safe_dump(data))
    (tmp_path / "log").mkdir()
    (tmp_path / "log" / "events.jsonl").write_text("".join(json.dumps(e) + "\n" for e in EVENTS))
    code, out = run("cost", "--job", "9", "--json", config=config)
    assert code == 0, out
    (report,) = json.loads(out)
    assert report["unverified_prices"] == ["on-demand g5.xlarge: 1.25 USD/h"]
    assert report["on_demand_usd"] == pytest.approx(0.5 * 1.25)
    code, out = run("cost", "--job", "9", config=config)
    assert "warning: catalogue price(s) on-demand g5.xlarge: 1.25 USD/h not confirmed" in out
