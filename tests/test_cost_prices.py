"""Prices: AWS spot history (moto) cached with its age, the catalogue, config overrides."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import datetime, timedelta, timezone
from pathlib import Path

import boto3
import pytest
from moto import mock_aws

from slurm_spot.config import CostConfig
from slurm_spot.cost.prices import PriceBook
from slurm_spot.providers.aws import prices as aws_prices
from slurm_spot.providers.aws.prices import AwsPrices, AwsSpotPrices
from slurm_spot.providers.gcp import prices as gcp_prices
from slurm_spot.providers.prices import UnknownPriceError


@pytest.fixture
def aws(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    for key, value in {"AWS_ACCESS_KEY_ID": "x", "AWS_SECRET_ACCESS_KEY": "x",
                       "AWS_DEFAULT_REGION": "us-east-1", "AWS_EC2_METADATA_DISABLED": "true",
                       "MOTO_EC2_LOAD_DEFAULT_AMIS": "false"}.items():
        monkeypatch.setenv(key, value)
    with mock_aws():
        yield


class CountingFactory:
    def __init__(self) -> None:
        self.calls = 0

    def __call__(self) -> object:
        self.calls += 1
        return boto3.client("ec2", region_name="us-east-1")


def test_spot_price_from_history_is_cached_with_its_age(aws: None, tmp_path: Path) -> None:
    now = [datetime(2026, 3, 1, 12, 0, tzinfo=timezone.utc)]
    factory = CountingFactory()
    cache = tmp_path / "cost" / "spot.json"
    prices = AwsSpotPrices(factory, "us-east-1", cache, max_age_s=600, clock=lambda: now[0])
    first = prices.price("g5.xlarge")
    assert first.source == "aws-spot-price-history"
    assert first.usd_per_h > 0 and first.zone and first.zone.startswith("us-east-1")
    assert first.age_s == 0
    # the cheapest zone of the history is chosen
    hist = boto3.client("ec2", region_name="us-east-1").describe_spot_price_history(
        InstanceTypes=["g5.xlarge"], ProductDescriptions=["Linux/UNIX"])["SpotPriceHistory"]
    assert first.usd_per_h == min(float(h["SpotPrice"]) for h in hist)
    # a later call within max age reads the file; a fresh AwsSpotPrices too
    now[0] += timedelta(seconds=300)
    again = AwsSpotPrices(factory, "us-east-1", cache, max_age_s=600, clock=lambda: now[0])
    cached = again.price("g5.xlarge", first.zone)
    assert (cached.usd_per_h, cached.age_s, factory.calls) == (first.usd_per_h, 300, 1)
    now[0] += timedelta(seconds=400)  # 700 s old: fetched again
    assert again.price("g5.xlarge").age_s == 0 and factory.calls == 2


def test_unknown_zone_is_a_clear_error(aws: None) -> None:
    prices = AwsSpotPrices(CountingFactory(), "us-east-1", None)
    with pytest.raises(UnknownPriceError, match=r"g5\.xlarge in us-east-1z"):
        prices.price("g5.xlarge", "us-east-1z")


def test_config_overrides_catalogue_and_api(aws: None) -> None:
    book = PriceBook(CostConfig(spot_usd_per_hour={"g5.xlarge": 0.31},
                                on_demand_usd_per_hour={"g5.xlarge": 1.5}),
                     {"aws": AwsPrices(spot=AwsSpotPrices(CountingFactory(), "us-east-1", None))})
    assert book.instance("aws", "spot", "g5.xlarge").usd_per_h == 0.31
    assert book.instance("aws", "on-demand", "g5.xlarge").source == "config"


def test_catalogue_is_dated_and_sourced() -> None:
    cat = {"aws": aws_prices.catalogue(), "gcp": gcp_prices.catalogue()}
    for provider in ("aws", "gcp"):
        assert str(cat[provider]["as_of"]).startswith("20")
    assert "aws.amazon.com" in cat["aws"]["source"] and "cloud.google.com" in cat["gcp"]["source"]
    for provider in ("aws", "gcp"):
        sources = cat[provider]["sources"]
        for found in sources.values():
            assert found["url"].startswith("https://") and str(found["read_on"]).startswith("20")
        for market in ("on_demand", "spot"):
            for itype, entry in (cat[provider].get(market) or {}).items():
                assert entry["usd_per_h"] > 0, itype
                assert entry["source"] in sources or entry["source"] == "unverified", itype
    book = PriceBook(CostConfig())
    od = book.instance("aws", "on-demand", "p4d.24xlarge")
    # corrected from 32.7726 (its price before AWS's June 2025 cut) to the sourced rate
    assert od.usd_per_h == pytest.approx(21.957642) and od.source.startswith("catalogue 20")
    assert od.verified and "(vantage-2026-01)" in od.source
    spot = book.instance("gcp", "spot", "a2-highgpu-1g")
    od_gcp = book.instance("gcp", "on-demand", "a2-highgpu-1g")
    # machine type + its A100 in us-central1 (the catalogue's note shows the sum)
    assert spot.usd_per_h == pytest.approx(0.29576 + 1.1472)
    assert od_gcp.usd_per_h == pytest.approx(0.73948 + 2.93391)


def test_an_unverified_catalogue_entry_says_so(monkeypatch: pytest.MonkeyPatch) -> None:
    data = {"as_of": "2026-12-01", "region": "us-east-1", "sources": {}, "on_demand": {
        "x1.bare": 2.0, "x1.marked": {"usd_per_h": 3.0, "source": "unverified"},
        "x1.dangling": {"usd_per_h": 4.0, "source": "nowhere"}}}
    monkeypatch.setattr(aws_prices, "catalogue", lambda: data)
    book = PriceBook(CostConfig())
    for itype, usd in (("x1.bare", 2.0), ("x1.marked", 3.0), ("x1.dangling", 4.0)):
        found = book.instance("aws", "on-demand", itype)
        assert (found.usd_per_h, found.verified) == (usd, False)
        assert found.source.endswith("UNVERIFIED")
    configured = PriceBook(CostConfig(on_demand_usd_per_hour={"x1.marked": 3.5}))
    assert configured.instance("aws", "on-demand", "x1.marked").verified  # the admin's own


def test_unknown_prices_name_type_and_zone_never_zero() -> None:
    book = PriceBook(CostConfig())
    with pytest.raises(UnknownPriceError, match=r"'x9\.huge' in zone us-west-2a.*on_demand_usd"):
        book.instance("aws", "on-demand", "x9.huge", "us-west-2a")
    with pytest.raises(UnknownPriceError, match=r"spot_usd_per_hour\.g5\.xlarge"):
        book.instance("aws", "spot", "g5.xlarge")  # no API configured, no config price
    with pytest.raises(UnknownPriceError, match=r"storage_usd_per_gb_month\.aws"):
        book.storage_usd_per_gb_month("aws")
    with pytest.raises(UnknownPriceError, match=r"egress_usd_per_gb\.gcp"):
        book.egress_usd_per_gb("gcp")


@pytest.mark.parametrize(("body", "says"), [
    ('  g5.xlarge: {usd_per_h: "1,006", source: unverified}\n',
     "line 4: on_demand.g5.xlarge: usd_per_h '1,006' is not a price"),
    ("  g5.xlarge: {source: unverified}\n", "on_demand.g5.xlarge: usd_per_h None is not a price"),
    ("  g5.xlarge: -1.0\n", "line 4: on_demand.g5.xlarge: usd_per_h -1.0 is not a price"),
    ("  g5.xlarge: .inf\n", "usd_per_h inf is not a price"),
    ("  g5.xlarge: true\n", "usd_per_h True is not a price"),
    ("  g5.xlarge: 1.0\n  g5.xlarge: 0.5\n", "line 5: on_demand.g5.xlarge: duplicate key"),
    ("  g5.xlarge: [1.0]\n", "usd_per_h [1.0] is not a price"),
])
def test_a_damaged_catalogue_is_an_error_naming_file_line_and_entry(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, body: str, says: str) -> None:
    """A site's edit of a provider's prices.yaml ('1,006', a missing usd_per_h) stopped plan,
    render and the cost order with a KeyError/ValueError traceback, a negative one priced a
    node set below zero, and a repeated type silently kept the last figure."""
    from slurm_spot.errors import BadInputError
    from slurm_spot.providers.prices import read_catalogue

    name = f"damaged_{tmp_path.name}"  # one module per case: imports are cached
    package = tmp_path / name
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "prices.yaml").write_text(
        "as_of: 2026-12-01\nregion: us-east-1\non_demand:\n" + body)
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(BadInputError) as err:
        read_catalogue(name)
    assert str(err.value).startswith(f"{name}/prices.yaml: ") and says in str(err.value)
