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
from slurm_spot.jsonenvelope import read_envelope
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
    data = read_envelope(out)
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
    ranked = read_envelope(out)
    assert [r["instance_type"] for r in ranked] == ["p4d.24xlarge", "g5.xlarge"]
    assert ranked[1]["meets_deadline"] is False


def test_simulate_json_and_plot(tmp_path: Path) -> None:
    png = tmp_path / "sim.png"
    code, out = run("simulate", "--nodes", "8", "--job-hours", "24", "--checkpoint-s", "60",
                    "--interruption-band", ">20%", "--spot-usd-h", "10", "--on-demand-usd-h",
                    "30", "--runs", "50", "--seed", "2", "--json", "--plot", str(png))
    assert code == 0, out
    data = read_envelope(out)
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


def test_simulate_compares_like_with_like_and_says_how() -> None:
    args = ["simulate", "--nodes", "20", "--on-demand-nodes", "1", "--job-hours", "72",
            "--checkpoint-s", "60", "--interruption-band", ">20%", "--spot-usd-h", "9.8",
            "--on-demand-usd-h", "21.96", "--runs", "40"]
    code, out = run(*args)
    assert code == 0, out
    assert ("compared like with like: every strategy checkpoints at Daly's interval for the "
            "job's MTBF (125.9 min); each run's interruption times are the same for every "
            "strategy") in out
    assert out.count("checkpoint every 125.9 min") == 4
    data = read_envelope(run(*args, "--json")[1], "simulate")
    assert {s["interval_s"] for s in data["strategies"]} == {data["strategies"][0]["interval_s"]}
    assert "Daly's interval" in data["comparison"]["interval"]
    code, out = run(*args, "--interval-s", "1200")
    assert "every strategy checkpoints every 20.0 min (--interval-s)" in out
    assert out.count("checkpoint every 20.0 min") == 4


def test_a_plot_without_matplotlib_is_refused_before_any_work(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import sys

    monkeypatch.setitem(sys.modules, "matplotlib", None)  # as if the plot extra were missing
    # a simulation this long would be refused by its event budget: the plot check comes first
    code, out = run("simulate", "--job-hours", "10000", "--checkpoint-s", "60", "--mtbf-h",
                    "100", "--plot", str(tmp_path / "sim.png"))
    assert code == 2, out
    assert "--plot needs matplotlib, which is not installed" in out
    assert "limit" not in out and not (tmp_path / "sim.png").exists()
    code, out = run("cost", "--job", "7", "--plot", str(tmp_path / "job.png"))
    assert code == 2 and "--plot needs matplotlib" in out


def test_cost_of_recorded_jobs_from_events(tmp_path: Path) -> None:
    data = site(tmp_path)
    data["slurm_bin_dir"] = str(tmp_path / "no-slurm")  # no sacct here: the events are used
    config = tmp_path / "spot.yaml"
    config.write_text(yaml.safe_dump(data))
    (tmp_path / "log").mkdir()
    (tmp_path / "log" / "events.jsonl").write_text("".join(json.dumps(e) + "\n" for e in EVENTS))
    code, out = run("cost", "--json", config=config)
    assert code == 0, out
    reports = {r["job_id"]: r for r in read_envelope(out)}
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
    plan = read_envelope(out)
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
    assert read_envelope(again)["assumption"] == plan["assumption"]


def _unverified_catalogue(monkeypatch: pytest.MonkeyPatch) -> None:
    """The shipped catalogue plus an AWS type whose on-demand price no source confirmed."""
    from slurm_spot.providers.aws import prices

    data = json.loads(json.dumps(prices.catalogue()))
    data["on_demand"]["g5.xlarge"] = {"usd_per_h": 1.25, "source": "unverified"}
    monkeypatch.setattr(prices, "catalogue", lambda: data)


def test_plan_says_when_it_used_an_unverified_price(monkeypatch: pytest.MonkeyPatch) -> None:
    _unverified_catalogue(monkeypatch)
    args = ["plan", "--checkpoint-s", "60", "--nodes", "2", "--mtbf-h", "1000",
            "--job-hours", "10", "--instance-type", "g5.xlarge", "--spot-usd-h", "0.5"]
    code, out = run(*args, "--json")
    assert code == 0, out
    data = read_envelope(out)
    assert data["on_demand_cost_usd"] == pytest.approx(10 * 2 * 1.25)
    assert data["unverified_prices"] == ["on-demand g5.xlarge: 1.25 USD/h"]
    assert "UNVERIFIED" in data["price_source"]
    code, out = run(*args)
    assert "warning: catalogue price(s) on-demand g5.xlarge: 1.25 USD/h not confirmed" in out
    code, out = run("plan", "--compare", "--checkpoint-s", "60", "--work-steps", "1000",
                    "--candidate", "a2-highgpu-1g:1:<5%", "--json")
    assert "unverified_prices" not in read_envelope(out)[0]  # sourced entries: no warning


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
    (report,) = read_envelope(out)
    assert report["unverified_prices"] == ["on-demand g5.xlarge: 1.25 USD/h"]
    assert report["on_demand_usd"] == pytest.approx(0.5 * 1.25)
    code, out = run("cost", "--job", "9", config=config)
    assert "warning: catalogue price(s) on-demand g5.xlarge: 1.25 USD/h not confirmed" in out


@pytest.mark.parametrize(("args", "message"), [
    (["--checkpoint-s", "60", "--mtbf-h", "1e-9"], "--mtbf-h 1e-09: must be a finite number >= 0.001"),
    (["--checkpoint-s", "60", "--mtbf-h", "1", "--nodes", "1000000000000"],
     "--nodes 1e+12: must be a finite number >= 1 and at most 100000"),
    (["--checkpoint-s", "1e308", "--mtbf-h", "1"], "--checkpoint-s 1e+308: must be a finite number"),
    (["--checkpoint-s", "nan", "--mtbf-h", "100"], "--checkpoint-s nan: must be a finite number"),
    (["--checkpoint-s", "inf", "--mtbf-h", "100"], "--checkpoint-s inf: must be a finite number"),
    (["--checkpoint-s", "60", "--mtbf-h", "100", "--restart-s", "nan"], "--restart-s nan"),
    (["--checkpoint-s", "60", "--mtbf-h", "100", "--notice-s", "-1"], "--notice-s -1"),
    (["--checkpoint-s", "60", "--mtbf-h", "100", "--job-hours", "inf"], "--job-hours inf"),
    (["--compare", "--checkpoint-s", "60", "--work-steps", "nan", "--candidate",
      "g5.xlarge:nan:<5%"], "--work-steps nan: must be a finite number > 0"),
    (["--compare", "--checkpoint-s", "60", "--work-steps", "1e6", "--candidate",
      "g5.xlarge:nan:<5%"], "steps/s 'nan' must be a finite number > 0"),
])
def test_plan_refuses_non_finite_and_absurd_numbers(args: list[str], message: str) -> None:
    code, out = run("plan", *args)
    assert code == 2, out
    assert message in out
    assert "Traceback" not in out and "nan min" not in out and "inf min" not in out


def test_plan_says_a_job_never_finishes_when_the_math_overflows() -> None:
    args = ["plan", "--checkpoint-s", "86400", "--mtbf-h", "1", "--nodes", "100",
            "--job-hours", "1", "--instance-type", "g5.xlarge", "--spot-usd-h", "0.4"]
    code, out = run(*args)
    assert code == 0, out
    assert "expected waste at Daly's interval, no notice: 100.00%" in out
    assert ("the job never finishes in practice: a checkpoint (86400 s) and restart (300 s) "
            "cost about as much as, or more than, the 100-node job's MTBF (36 s)") in out
    assert "expected wall time: never (infinite) without notice" in out
    assert "spot unbounded (never finishes)" in out and "the job never finishes on spot" in out
    code, out = run(*args, "--json")
    data = read_envelope(out)
    assert data["never_finishes"] is True and data["waste_fraction"] == 1.0
    assert data["expected_wall_h"] is None and data["expected_spot_cost_usd"] is None
    # a job that does finish says nothing of the kind
    code, out = run("plan", "--checkpoint-s", "60", "--mtbf-h", "1000", "--nodes", "8")
    assert code == 0 and "never finishes" not in out


def test_plan_compare_names_a_candidate_that_never_finishes(tmp_path: Path) -> None:
    data = site(tmp_path)
    data["cost"]["spot_usd_per_hour"]["p4d.24xlarge"] = 10.0
    config = tmp_path / "spot.yaml"
    config.write_text(yaml.safe_dump(data))
    code, out = run("plan", "--compare", "--checkpoint-s", "3600", "--nodes", "1000",
                    "--mtbf-h", "0.01", "--work-steps", "1000", "--candidate",
                    "g5.xlarge:1", "--candidate", "p4d.24xlarge:1:<5%", config=config)
    assert code == 0, out
    assert "2. g5.xlarge: never finishes on spot" in out
    assert out.startswith("1. p4d.24xlarge: $")


@pytest.mark.parametrize(("args", "message"), [
    (["--nodes", "1000000", "--runs", "2"], "--nodes 1e+06: must be a finite number >= 1 and at most 100000"),
    (["--job-hours", "1e9"], "--job-hours 1e+09: must be a finite number > 0 and at most 100000 hours"),
    (["--checkpoint-s", "1e308"],
     "--checkpoint-s 1e+308: must be a finite number > 0 and at most 604800 seconds"),
    (["--mtbf-h", "1e-6"], "--mtbf-h 1e-06: must be a finite number >= 0.001 hours"),
    (["--runs", "1000000000"], "--runs 1e+09: must be a finite number >= 2 and at most 100000"),
    (["--boot-s", "inf"], "--boot-s inf"),
    (["--checkpoint-s", "600", "--nodes", "64", "--runs", "2"],
     "the job never finishes in practice with plain, periodic, slurm-spot, elastic: a checkpoint "
     "(600 s) and recovery cost about as much as, or more than, the 64-spot-node job's MTBF"),
    (["--job-hours", "10000", "--mtbf-h", "100"], "limit 3,000,000): lower --runs (to about "),
])
def test_simulate_refuses_what_it_cannot_answer_quickly(args: list[str], message: str) -> None:
    defaults = {"--job-hours": "1", "--checkpoint-s": "60", "--mtbf-h": "1"}
    given = dict(zip(args[::2], args[1::2], strict=True))
    argv = [*args, *(x for k, v in defaults.items() if k not in given for x in (k, v))]
    code, out = run("simulate", *argv)
    assert code == 2, out
    assert message in out


README = Path(__file__).resolve().parent.parent / "README.md"
EXAMPLES = README.parent / "examples"


def readme_cost_commands() -> list[list[str]]:
    """The ``$ slurm-spot ...`` commands of README.md's "What will this cost me" block, as argv
    lists (continuation lines joined, shell quoting undone)."""
    import shlex

    section = README.read_text().split("## What will this cost me", 1)[1]
    block = section.split("```console\n", 1)[1].split("```", 1)[0]
    commands, current = [], ""
    for line in block.splitlines():
        if line.startswith("$ ") or current:
            current += line.removeprefix("$ ").rstrip("\\").strip() + " "
            if not line.endswith("\\"):
                commands.append(shlex.split(current)[1:])
                current = ""
    return commands


def test_every_readme_cost_command_works_without_cloud_credentials(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)  # --plot sim.png lands here
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_PROFILE"):
        monkeypatch.delenv(name, raising=False)
    commands = readme_cost_commands()
    assert [c[0] for c in commands] == ["plan", "plan", "simulate", "cost"]
    for argv in commands[:3]:
        code, out = run(*argv)
        assert code == 0, (argv, out)
        assert "$" in out  # priced
    assert (tmp_path / "sim.png").read_bytes()[:4] == b"\x89PNG"
    # the first example's figures are the ones the README shows
    readme = README.read_text()
    code, out = run(*commands[0])
    for line in ("MTBF: one node 5466.9 h, the 19-node job 287.7 h",
                 "checkpoint every: Young 185.8 min, Daly 185.2 min (use Daly's)",
                 "expected waste at Daly's interval, no notice: 1.10%",
                 "with a checkpoint at each notice: 0.57% (saves 0.53% of wall time)"):
        assert line in out and line in readme
    # and the simulation's: the same interval and interruptions for every strategy
    code, out = run(*[a for a in commands[2] if a not in ("--plot", "sim.png")])
    rows = [ln for ln in readme.splitlines() if ln.startswith(("compared like", "     plain:",
                                                               "slurm-spot: wall"))]
    assert len(rows) == 3
    for row in rows:
        head, _, tail = row.partition("...")
        assert any(ln.startswith(head) and ln.endswith(tail) for ln in out.splitlines()), row


def test_a_missing_spot_price_says_why_and_names_spot_usd_h(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    args = ["plan", "--checkpoint-s", "60", "--mtbf-h", "100", "--job-hours", "1",
            "--instance-type", "p4d.24xlarge"]
    code, out = run(*args)
    assert code == 2
    assert ("no spot price for instance type 'p4d.24xlarge' in zone (any) (aws); AWS spot "
            "prices come from DescribeSpotPriceHistory, which was not asked: no spot.yaml with "
            "an aws provider") in out
    assert "or give --spot-usd-h PRICE" in out
    code, out = run("plan", "--compare", "--checkpoint-s", "60", "--work-steps", "1000",
                    "--candidate", "p4d.24xlarge:1:<5%")
    assert code == 2 and "--candidate p4d.24xlarge:STEPS_PER_S:BAND:SPOT_USD_H" in out
    # an aws provider without credentials: the lookup's own error is named
    data = site(tmp_path)
    config = tmp_path / "spot.yaml"
    config.write_text(yaml.safe_dump(data))
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "no-credentials"))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "no-config"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    code, out = run(*args, config=config)
    assert code == 2, out
    assert ("the AWS spot price lookup (DescribeSpotPriceHistory) failed: NoCredentialsError: "
            "Unable to locate credentials") in out
    assert "or give --spot-usd-h PRICE" in out


def test_cost_works_on_the_local_cluster_with_the_example_config(tmp_path: Path) -> None:
    data = yaml.safe_load((EXAMPLES / "spot-local.yaml").read_text())
    data.update(state_dir=str(tmp_path / "state"), log_dir=str(tmp_path / "log"),
                checkpoint={"root": str(tmp_path / "ckpt")},
                slurm_bin_dir=str(tmp_path / "no-slurm"))  # no sacct: the events are used
    config = tmp_path / "spot.yaml"
    config.write_text(yaml.safe_dump(data))
    local = json.loads(json.dumps(EVENTS).replace("gpu-", "spot-").replace("g5.xlarge", "local"))
    (tmp_path / "log").mkdir()
    (tmp_path / "log" / "events.jsonl").write_text("".join(json.dumps(e) + "\n" for e in local))
    code, out = run("cost", "--job", "7", config=config)
    assert code == 0, out
    assert "job 7 (from events)" in out and "interruptions: 1" in out
    assert "spot      local" in out and "$0.4000/h" in out
    code, out = run("cost", "--job", "7", "--json", config=config)
    (report,) = read_envelope(out)
    assert report["on_demand_usd"] > report["compute_usd"] > 0


def test_local_up_and_demo_configs_price_the_local_nodes_like_the_example(tmp_path: Path) -> None:
    from slurm_spot.config import SpotConfig, default_local_config
    from slurm_spot.localcluster.demo import demo_config

    example = yaml.safe_load((EXAMPLES / "spot-local.yaml").read_text())["cost"]
    assert default_local_config().cost.model_dump(exclude_defaults=True) == example
    demo = SpotConfig.model_validate(demo_config(tmp_path))
    assert demo.cost.model_dump(exclude_defaults=True) == example


def test_a_notice_checkpoint_that_does_not_pay_reads_as_a_cost() -> None:
    code, out = run("plan", "--checkpoint-s", "30", "--restart-s", "600", "--mtbf-h", "0.5")
    assert code == 0, out
    assert ("with a checkpoint at each notice: 40.75% (costs 0.11% more wall time: the save at "
            "each notice costs more than the recomputation it avoids)") in out
    assert "saves -" not in out


def test_plan_with_spot_dearer_than_on_demand_says_so() -> None:
    code, out = run("plan", "--checkpoint-s", "60", "--mtbf-h", "100", "--job-hours", "10",
                    "--instance-type", "g5.xlarge", "--spot-usd-h", "2", "--on-demand-usd-h", "1")
    assert code == 0, out
    # 10.10 h expected wall (with notice checkpoints) at 2 USD/h against 10 h at 1 USD/h
    assert "spot $20.20 vs on-demand $10.00 (spot costs 102.0 % more" in out and "-1" not in out
    code, out = run("plan", "--checkpoint-s", "60", "--mtbf-h", "100", "--job-hours", "10",
                    "--instance-type", "g5.xlarge", "--spot-usd-h", "2", "--on-demand-usd-h", "0")
    assert code == 0, out
    assert "no saving known: on-demand price 0" in out


def test_simulate_without_prices_says_they_are_unknown() -> None:
    args = ["simulate", "--job-hours", "4", "--checkpoint-s", "60", "--mtbf-h", "50",
            "--runs", "5"]
    code, out = run(*args)
    assert code == 0, out
    assert "$0.00" not in out
    assert "on-demand: 4.00 h, price unknown" in out
    assert out.count("cost unknown (no spot price)") == 4
    data = read_envelope(run(*args, "--json")[1])
    assert data["on_demand"]["cost_usd"] is None
    assert all(s["cost_usd"] is None for s in data["strategies"])
    code, out = run(*args, "--spot-usd-h", "1")
    assert "cost $" in out and "on-demand: 4.00 h, price unknown" in out
    assert "no on-demand price: give --on-demand-usd-h" in out


@pytest.mark.parametrize(("args", "message"), [
    (["--mtbf-h", "10", "--job-hours", "1", "--instance-type", "g5.xlarge", "--spot-usd-h", "-1"],
     "--spot-usd-h -1: must be a finite number >= 0"),
    (["--compare", "--work-steps", "10", "--candidate", "g5.xlarge:1:<5%", "--deadline-h", "0"],
     "--deadline-h 0: must be a finite number > 0"),
    (["--mtbf-h", "10", "--candidate", "g5.xlarge:1:<5%"],
     "--candidate: only with --compare"),
    (["--mtbf-h", "10", "--work-steps", "100"], "--work-steps: only with --compare"),
    (["--compare", "--work-steps", "10", "--candidate", "g5.xlarge:1:<5%", "--spot-usd-h", "1"],
     "--spot-usd-h: not with --compare"),
    (["--compare", "--work-steps", "10", "--candidate", "g5.xlarge:1:<5%:-3"],
     "--candidate 'g5.xlarge:1:<5%:-3': spot price '-3' must be a finite number >= 0"),
])
def test_plan_refuses_options_it_would_ignore_or_misread(args: list[str], message: str) -> None:
    code, out = run("plan", "--checkpoint-s", "60", *args)
    assert code == 2, out
    assert message in out
