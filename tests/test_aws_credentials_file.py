"""``providers.<aws>.credentials_file``: the hooks slurmctld runs get an empty environment, so a
controller outside EC2 (and the end-to-end tests) name a shared credentials file in spot.yaml."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from slurm_spot.config import AwsProviderConfig
from slurm_spot.providers.aws.provider import boto_session


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
