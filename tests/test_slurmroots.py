"""The matrix's root builder finds the Debian mirror the way apt is configured (no host name of
its own), and names each version's root."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests import slurmroots


def test_mirror_from_deb822_sources_skips_security_and_disabled(tmp_path: Path) -> None:
    (tmp_path / "sources.list.d").mkdir()
    (tmp_path / "sources.list.d" / "debian.sources").write_text(
        "Types: deb\nURIs: http://security.example/debian-security\nSuites: bookworm-security\n\n"
        "Types: deb\nURIs: http://off.example/debian\nSuites: bookworm\nEnabled: no\n\n"
        "Types: deb\n# a comment\nURIs: http://mirror.example/debian\nSuites: bookworm\n")
    assert slurmroots.debian_mirror(tmp_path) == "http://mirror.example/debian"


def test_mirror_from_one_line_sources_list(tmp_path: Path) -> None:
    (tmp_path / "sources.list").write_text(
        "deb http://security.example/debian-security bookworm-security main\n"
        "deb [arch=amd64] http://mirror.example/debian bookworm main\n")
    assert slurmroots.debian_mirror(tmp_path) == "http://mirror.example/debian"


def test_no_mirror_is_an_error_naming_where_it_looked(tmp_path: Path) -> None:
    with pytest.raises(RuntimeError, match=str(tmp_path)):
        slurmroots.debian_mirror(tmp_path)


def test_versions_and_suites() -> None:
    assert slurmroots.suite_for("24.11").name == "trixie"
    assert slurmroots.suite_for("forky").short == "26.05"
    assert slurmroots.suite_for("26.05").script == "sid"  # bookworm's debootstrap has no forky
    with pytest.raises(KeyError, match=r"24\.11 \(trixie\)"):
        slurmroots.suite_for("23.02")
