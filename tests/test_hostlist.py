"""Hostlist expansion: every case of tests/data/hostlists.yaml (reference: scontrol show hostnames)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from slurm_spot.errors import HostlistError
from slurm_spot.hostlist import compress, expand

CASES = yaml.safe_load((Path(__file__).parent / "data" / "hostlists.yaml").read_text())


@pytest.mark.parametrize("case", CASES["expand"], ids=lambda c: c["in"])
def test_expand_matches_slurm(case: dict) -> None:
    names = expand(case["in"])
    if "out" in case:
        assert names == case["out"]
    else:
        assert len(names) == case["count"]


@pytest.mark.parametrize("expr", CASES["invalid"])
def test_invalid_hostlist_names_the_bad_part(expr: str) -> None:
    with pytest.raises(HostlistError) as err:
        expand(expr)
    assert repr(expr) in str(err.value)


@pytest.mark.parametrize("expr", ["", "   ", "node 1", "a,,b"])
def test_empty_or_malformed_is_refused(expr: str) -> None:
    with pytest.raises(HostlistError):
        expand(expr)


def test_compress_round_trips() -> None:
    names = ["spot-1", "spot-2", "spot-3", "spot-7", "gpu-1"]
    assert sorted(expand(compress(names))) == sorted(names)
    assert compress(["spot-1", "spot-2", "spot-3"]) == "spot-[1-3]"
