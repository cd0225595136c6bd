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


def test_links_inside_a_root_resolve_inside_it_never_on_the_host(tmp_path: Path) -> None:
    root = tmp_path / "root"
    (root / "usr/bin").mkdir(parents=True)
    (root / "usr/bin/python3.13").write_text("")
    (root / "usr/bin/python3").symlink_to("python3.13")
    (root / "usr/bin/py").symlink_to("/usr/bin/python3")  # absolute: taken inside the root
    assert slurmroots._resolve_inside(root, Path("/usr/bin/python3")) == root / "usr/bin/python3.13"
    assert slurmroots._resolve_inside(root, Path("/usr/bin/py")) == root / "usr/bin/python3.13"


def test_mounts_are_refused_on_the_hosts_mount_namespace(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(slurmroots.MOUNT_NS_ENV, raising=False)
    with pytest.raises(RuntimeError, match="private mount namespace"):
        with slurmroots.mounted(slurmroots.SUITES["24.11"]):
            pass


def test_a_run_makes_its_mounts_in_a_namespace_of_its_own() -> None:
    argv = slurmroots.isolated_argv(slurmroots.SUITES["24.11"], ["true"])
    assert argv[:5] == ["unshare", "--mount", "--propagation", "private", "--"]
    assert f"{slurmroots.MOUNT_NS_ENV}=1" in argv and argv[-2:] == ["--", "true"]
