"""spot.yaml under real-world input (issue 11, section 4): placeholders, duplicate keys,
numbers that make no sense, control characters, untrusted files; every error names its line.
Inputs: tests/data/config-inputs.yaml."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from click.testing import CliRunner

from slurm_spot.cli import cli
from slurm_spot.config import load_config
from slurm_spot.errors import ConfigError

CASES = __import__("yaml").safe_load(
    (Path(__file__).parent / "data" / "config-inputs.yaml").read_text())


def check(path: Path) -> tuple[int, str]:
    result = CliRunner().invoke(cli, ["--config", str(path), "config", "check"])
    return result.exit_code, result.output


@pytest.mark.parametrize("case", CASES["bad"], ids=lambda c: c["id"])
def test_config_check_rejects_naming_file_and_line(tmp_path: Path, case: dict) -> None:
    path = tmp_path / "spot.yaml"
    path.write_text(case["text"])
    code, out = check(path)
    assert code == 2, out
    assert str(path) in out
    hits = [line for line in out.splitlines() if case["says"] in line]
    assert hits, out
    assert f"line {case['line']}:" in hits[0], out


@pytest.mark.parametrize("text", CASES["good"])
def test_real_values_that_look_like_placeholders_pass(tmp_path: Path, text: str) -> None:
    path = tmp_path / "spot.yaml"
    path.write_text(text)
    config = load_config(path)
    assert config.node_sets[0].aws is not None
    assert config.node_sets[0].aws.launch_template_version == "$Latest"


GOOD = ("cluster: demo\nnode_sets: [{name: gpu, provider: local, count: 2}]\n"
        "partitions: [{name: spot, node_sets: [gpu]}]\n")


@pytest.mark.parametrize("mode", [0o666, 0o664, 0o646])
def test_config_writable_by_others_is_refused_with_a_fix(tmp_path: Path, mode: int) -> None:
    path = tmp_path / "spot.yaml"
    path.write_text(GOOD)
    path.chmod(mode)
    code, out = check(path)
    assert code == 2
    assert f"chmod go-w {path}" in out and f"mode {mode:04o}" in out
    path.chmod(0o644)
    assert check(path)[0] == 0


@pytest.mark.skipif(os.geteuid() != 0, reason="ownership matters when slurm-spot runs as root")
def test_config_not_owned_by_root_is_refused_when_running_as_root(tmp_path: Path) -> None:
    path = tmp_path / "spot.yaml"
    path.write_text(GOOD)
    os.chown(path, 65534, 65534)
    with pytest.raises(ConfigError, match=r"owned by uid 65534.*chown root:root"):
        load_config(path)


@pytest.mark.skipif(os.geteuid() != 0, reason="ownership matters when slurm-spot runs as root")
def test_credentials_file_not_owned_by_root_is_refused(tmp_path: Path) -> None:
    creds = tmp_path / "credentials"
    creds.write_text("[default]\naws_access_key_id = x\naws_secret_access_key = y\n")
    creds.chmod(0o600)
    os.chown(creds, 65534, 65534)
    path = tmp_path / "spot.yaml"
    path.write_text(
        "cluster: demo\nproviders:\n  ec2:\n    type: aws\n    region: us-east-1\n"
        f"    credentials_file: {creds}\n"
        "node_sets:\n  - {name: gpu, provider: ec2, count: 1,\n"
        "     aws: {launch_template: lt-1, subnets: [subnet-1]}}\n"
        "partitions: [{name: spot, node_sets: [gpu]}]\n")
    code, out = check(path)
    assert code == 2
    assert "line 6: providers.ec2.credentials_file" in out and "owned by uid 65534" in out
    os.chown(creds, 0, 0)
    creds.chmod(0o660)
    code, out = check(path)
    assert code == 2 and f"chmod go-w {creds}" in out
    creds.chmod(0o600)
    assert load_config(path).providers["ec2"].credentials_file == creds  # type: ignore[union-attr]


def test_provider_check_problems_name_their_line_too(tmp_path: Path) -> None:
    path = tmp_path / "spot.yaml"
    path.write_text(
        "cluster: demo\nproviders:\n  ec2: {type: aws, region: us-east-1}\nnode_sets:\n"
        "  - name: gpu\n    provider: ec2\n    count: 2\n    instance_types: [g5.xlarge]\n"
        "    aws:\n      launch_template: lt-1\n      subnets: [subnet-1]\n"
        "      max_price_usd_per_hour: 0.0005\n"
        "partitions: [{name: spot, node_sets: [gpu]}]\n")
    code, out = check(path)
    assert code == 2, out
    (line,) = [x for x in out.splitlines() if "max_price_usd_per_hour" in x]
    assert "line 12: node_sets.0.aws.max_price_usd_per_hour" in line


@pytest.mark.parametrize(("make", "kind"), [
    (lambda tmp: Path("/dev/zero"), "not a regular file (a character device)"),
    (lambda tmp: Path("/dev/null"), "not a regular file (a character device)"),
    (lambda tmp: (os.mkfifo(tmp / "fifo"), tmp / "fifo")[1], "not a regular file (a named pipe)"),
    (lambda tmp: tmp, "is a directory"),
], ids=["dev-zero", "dev-null", "fifo", "directory"])
def test_a_config_that_is_not_a_regular_file_is_refused_at_once(tmp_path: Path, make,  # type: ignore[no-untyped-def]
                                                                kind: str) -> None:
    """/dev/zero never ends and a named pipe waits for a writer: both are refused before
    anything is read (no hang), and /dev/null gets no 'chmod go-w' advice."""
    path = make(tmp_path)
    code, out = check(path)
    assert code == 2, out
    assert str(path) in out and kind in out
    assert "chmod" not in out


def test_a_config_of_absurd_size_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "spot.yaml"
    with open(path, "wb") as fh:
        fh.write(GOOD.encode())
        fh.truncate(5 * 1024 * 1024)  # sparse: 5 MiB of NULs after the settings
    code, out = check(path)
    assert code == 2, out
    assert f"{5 * 1024 * 1024} bytes" in out and "over 1024 KiB are refused" in out


@pytest.mark.parametrize(("value", "minutes"), [
    ("60", 60), ("1:30", 2), ("2:00:00", 120), ("1-0", 1440), ("7-12:30", 10830),
    ("365-23:59:59", 366 * 1440), ("INFINITE", None), ("UNLIMITED", None)])
def test_max_time_in_slurms_formats_is_accepted(tmp_path: Path, value: str,
                                                 minutes: int | None) -> None:
    from slurm_spot.config import max_time_minutes

    path = tmp_path / "spot.yaml"
    path.write_text(GOOD.replace("node_sets: [gpu]}", f"node_sets: [gpu], max_time: '{value}'}}"))
    assert load_config(path).partitions[0].max_time == value
    assert max_time_minutes(value) == minutes


def test_credentials_file_naming_no_file_is_reported_with_file_line_and_field(
        tmp_path: Path) -> None:
    """Issue 25: a credentials_file that names no file was accepted, and every launch of the
    hooks (empty environment, no other credentials) failed later."""
    missing = tmp_path / "nowhere" / "aws-credentials"
    path = tmp_path / "spot.yaml"
    path.write_text(
        "cluster: demo\nproviders:\n  ec2:\n    type: aws\n    region: us-east-1\n"
        f"    credentials_file: {missing}\n"
        "node_sets:\n  - {name: gpu, provider: ec2, count: 1,\n"
        "     aws: {launch_template: lt-1, subnets: [subnet-1]}}\n"
        "partitions: [{name: spot, node_sets: [gpu]}]\n")
    load_config(path)  # a watcher on a compute node reads it without the credentials
    code, out = check(path)
    assert code == 2
    hits = [line for line in out.splitlines() if "providers.ec2.credentials_file" in line]
    assert hits, out
    assert str(path) in out
    assert f"line 6: providers.ec2.credentials_file: {missing}: no such file" in hits[0]
