"""``providers.<aws>.credentials_file``: the hooks slurmctld runs get an empty environment, so a
controller outside EC2 (and the end-to-end tests) name a shared credentials file in spot.yaml."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from slurm_spot.config import AwsProviderConfig, SpotConfig, parse_config
from slurm_spot.providers.aws.session import boto_session
from slurm_spot.providers.prices import UnknownPriceError


@pytest.fixture(autouse=True)
def _no_aws_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Nothing from the environment or ~/.aws: only what the config names counts."""
    for key in list(os.environ):
        if key.startswith("AWS_"):
            monkeypatch.delenv(key)
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "no-config"))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "no-credentials"))


def test_credentials_file_is_read_instead_of_the_default(tmp_path: Path) -> None:
    creds = tmp_path / "credentials"
    creds.write_text("[default]\naws_access_key_id = AKIDDEFAULT\naws_secret_access_key = x\n"
                     "[burst]\naws_access_key_id = AKIDBURST\naws_secret_access_key = y\n")
    plain = boto_session(AwsProviderConfig(region="us-east-1", credentials_file=creds))
    assert plain.get_credentials().access_key == "AKIDDEFAULT"
    assert plain.region_name == "us-east-1"
    named = boto_session(AwsProviderConfig(region="eu-west-1", credentials_file=creds,
                                           profile="burst"))
    assert named.get_credentials().access_key == "AKIDBURST"


def test_without_credentials_file_the_standard_chain_applies(tmp_path: Path,
                                                             monkeypatch: pytest.MonkeyPatch
                                                             ) -> None:
    assert boto_session(AwsProviderConfig(region="us-east-1")).get_credentials() is None
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKIDENV")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "z")
    assert boto_session(AwsProviderConfig(region="us-east-1")).get_credentials().access_key \
        == "AKIDENV"


def _site(tmp_path: Path, creds: Path, state: str) -> SpotConfig:
    return parse_config({
        "cluster": "c1",
        "providers": {"ec2": {"type": "aws", "region": "us-east-1", "profile": "burst",
                              "credentials_file": str(creds)}},
        "node_sets": [{"name": "gpu", "provider": "ec2", "count": 1,
                       "instance_types": ["g5.xlarge"],
                       "aws": {"launch_template": "t", "subnets": ["subnet-1"]}}],
        "partitions": [{"name": "gpu", "node_sets": ["gpu"]}],
        "state_dir": str(tmp_path / state), "log_dir": str(tmp_path / "log"),
        "checkpoint": {"root": str(tmp_path / "ckpt")},
    }, "spot.yaml")


def test_prices_are_asked_with_the_providers_credentials_file(tmp_path: Path) -> None:
    """``plan``/``cost`` (site_prices) and the reconciler's cost order (price_books) ask
    DescribeSpotPriceHistory through the provider's own session: profile ``burst`` exists only
    in the configured credentials file, so a session that ignored it would fail
    (ProfileNotFound) and no spot price would be had (the catalogue has no AWS spot prices)."""
    from moto import mock_aws

    from slurm_spot.cost.prices import price_books, site_prices

    creds = tmp_path / "credentials"
    creds.write_text("[burst]\naws_access_key_id = AKIDBURST\naws_secret_access_key = y\n")
    with mock_aws():
        for book in (site_prices(_site(tmp_path, creds, "a")),
                     price_books(_site(tmp_path, creds, "b"), live=True)["ec2"]):
            price = book.instance("aws", "spot", "g5.xlarge")
            assert price.source == "aws-spot-price-history", price
            assert price.zone is not None and price.zone.startswith("us-east-1")
    # without the file (and outside moto, which sets credentials of its own) the profile is
    # nowhere: the error names the failed lookup, nothing is priced
    bare = _site(tmp_path, creds, "c").model_copy(update={"providers": {
        "ec2": AwsProviderConfig(region="us-east-1", profile="burst")}})
    with pytest.raises(UnknownPriceError, match=r"DescribeSpotPriceHistory.*failed: ProfileNotFound"):
        site_prices(bare).instance("aws", "spot", "g5.xlarge")
