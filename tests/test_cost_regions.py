"""Prices for the cluster's region: the AWS Price List API (a recorded-shaped answer, since moto
has no `pricing`: tests/data/aws-pricing/README.md), the catalogue's fallback with a warning
for another region or an old date, and what `plan` and `cost` show of it."""

from __future__ import annotations

import json
from datetime import date, datetime, timezone
from pathlib import Path

import boto3
import pytest
import yaml
from botocore.stub import Stubber
from click.testing import CliRunner

from slurm_spot.cli import cli
from slurm_spot.config import CostConfig
from slurm_spot.cost.prices import PriceBook
from slurm_spot.jsonenvelope import read_envelope
from slurm_spot.providers.aws.prices import AwsOnDemandPrices, AwsPrices, parse_price_list
from slurm_spot.providers.prices import UnknownPriceError
from tests.test_cost_accounting import EVENTS, site

ANSWER = Path(__file__).parent / "data" / "aws-pricing" / "get-products-p4d.24xlarge-eu-west-1.json"
NOW = datetime(2026, 12, 2, 12, 0, tzinfo=timezone.utc)


@pytest.fixture(autouse=True)
def _offline_aws(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """No credentials anywhere: a live lookup fails at once, as on a machine offline."""
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "no-credentials"))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "no-config"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    monkeypatch.setenv("SLURM_SPOT_CONFIG", str(tmp_path / "absent.yaml"))
    monkeypatch.delenv("SLURM_CONF", raising=False)


def stubbed_pricing(answers: list[dict]) -> tuple[object, Stubber]:
    """A real ``pricing`` client whose answers are ``answers``, in order (checked against the
    API's model by botocore)."""
    client = boto3.client("pricing", region_name="us-east-1", aws_access_key_id="x",
                          aws_secret_access_key="x")
    stub = Stubber(client)
    for answer in answers:
        stub.add_response("get_products", answer)
    stub.activate()
    return client, stub


def test_the_price_list_answer_gives_the_instances_own_row() -> None:
    items = json.loads(ANSWER.read_text())["PriceList"]
    # the SQL Server row (25.023) and the capacity-reservation row are skipped
    assert parse_price_list(items, "p4d.24xlarge", "eu-west-1") == (24.1534, "2026-11-20")
    with pytest.raises(UnknownPriceError, match=r"no hourly Linux on-demand price for "
                                                r"p4d\.24xlarge in eu-central-1"):
        parse_price_list(items, "p4d.24xlarge", "eu-central-1")


def test_a_live_on_demand_price_names_its_region_and_is_cached(tmp_path: Path) -> None:
    client, stub = stubbed_pricing([json.loads(ANSWER.read_text())])
    live = AwsOnDemandPrices(lambda: client, "eu-west-1", tmp_path / "od.json", clock=lambda: NOW)
    book = PriceBook(CostConfig(), {"aws": AwsPrices(region="eu-west-1", on_demand=live)})
    price = book.instance("aws", "on-demand", "p4d.24xlarge")
    assert (price.usd_per_h, price.source, price.region, price.as_of, price.warning) == (
        24.1534, "aws-price-list eu-west-1", "eu-west-1", "2026-11-20", None)
    stub.assert_no_pending_responses()
    # the second ask is answered from the cache file: the stub has no answer left to give
    again = AwsOnDemandPrices(lambda: client, "eu-west-1", tmp_path / "od.json",
                              clock=lambda: NOW)
    assert again.price("p4d.24xlarge").usd_per_h == 24.1534
    # the catalogue's own region needs no lookup: its price is the region's
    east = PriceBook(CostConfig(), {"aws": AwsPrices(region="us-east-1", on_demand=live)})
    assert east.instance("aws", "on-demand", "p4d.24xlarge").warning is None


def test_offline_the_catalogue_is_used_with_a_warning_naming_both_regions(
        tmp_path: Path) -> None:
    def no_network() -> object:
        return boto3.Session(region_name="us-east-1").client("pricing")

    live = AwsOnDemandPrices(no_network, "eu-west-1", None)
    book = PriceBook(CostConfig(), {"aws": AwsPrices(region="eu-west-1", on_demand=live)})
    price = book.instance("aws", "on-demand", "p4d.24xlarge")
    assert price.region == "us-east-1" and price.usd_per_h == pytest.approx(21.957642)
    assert price.warning is not None
    assert "it is us-east-1's price, not eu-west-1's" in price.warning
    assert ("the AWS Price List lookup (GetProducts) for eu-west-1 failed: NoCredentialsError"
            in price.warning)


def test_an_old_catalogue_figure_is_warned_about() -> None:
    book = PriceBook(CostConfig(), today=lambda: date(2027, 9, 1))
    price = book.instance("gcp", "spot", "a2-highgpu-1g")
    assert price.warning is not None and "it was read on 2026-12-01, 274 days ago" in price.warning
    assert PriceBook(CostConfig(), today=lambda: date(2026, 12, 2)).instance(
        "gcp", "spot", "a2-highgpu-1g").warning is None


def test_plan_for_a_region_outside_the_catalogue_warns() -> None:
    args = ["plan", "--checkpoint-s", "60", "--mtbf-h", "100", "--job-hours", "10",
            "--instance-type", "p4d.24xlarge", "--spot-usd-h", "9", "--region", "eu-west-1"]
    result = CliRunner().invoke(cli, [*args, "--json"])
    assert result.exit_code == 0, result.output
    data = read_envelope(result.stdout, "plan")
    assert data["region"] == "eu-west-1"
    (warning,) = data["price_warnings"]
    assert "on-demand p4d.24xlarge 21.9576 USD/h from the shipped catalogue: it is us-east-1's " \
           "price, not eu-west-1's" in warning
    text = CliRunner().invoke(cli, args).output
    assert f"warning: {warning}" in text
    # the catalogue's region: no warning
    same = CliRunner().invoke(cli, [*args[:-1], "us-east-1"]).output
    assert "warning" not in same


def test_plan_takes_the_region_from_spot_yaml_and_says_why_no_live_price(tmp_path: Path) -> None:
    data = site(tmp_path)
    data["providers"]["aws"]["region"] = "ap-southeast-2"
    config = tmp_path / "spot.yaml"
    config.write_text(yaml.safe_dump(data))
    result = CliRunner().invoke(cli, ["--config", str(config), "plan", "--checkpoint-s", "60",
                                      "--mtbf-h", "100", "--job-hours", "1", "--instance-type",
                                      "p4d.24xlarge", "--spot-usd-h", "9", "--json"])
    assert result.exit_code == 0, result.output
    (warning,) = read_envelope(result.stdout)["price_warnings"]
    assert "not ap-southeast-2's" in warning and "NoCredentialsError" in warning


def test_cost_warns_about_another_regions_price_and_an_upper_bound(tmp_path: Path) -> None:
    data = site(tmp_path)
    data["providers"]["aws"]["region"] = "eu-west-1"
    data["cost"]["on_demand_usd_per_hour"] = {}  # priced from the catalogue (us-east-1's)
    data["slurm_bin_dir"] = str(tmp_path / "no-slurm")
    config = tmp_path / "spot.yaml"
    config.write_text(yaml.safe_dump(data))
    (tmp_path / "log").mkdir()
    (tmp_path / "log" / "events.jsonl").write_text("".join(json.dumps(e) + "\n" for e in EVENTS))
    out = CliRunner().invoke(cli, ["--config", str(config), "cost", "--job", "7"]).output
    assert "lost compute at most " in out
    assert "note: lost compute is an upper bound: no checkpoint of the job was read" in out
    assert "warning: on-demand g5.xlarge 1.006 USD/h from the shipped catalogue: it is " \
           "us-east-1's price, not eu-west-1's" in out
    result = CliRunner().invoke(cli, ["--config", str(config), "cost", "--job", "7", "--json"])
    (report,) = read_envelope(result.stdout, "cost")
    assert report["lost_compute_upper_bound"] is True and report["price_warnings"]
