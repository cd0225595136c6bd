"""The local provider's state directory (``<state_dir>/local``): its instance records name
the pids root SIGKILLs, so a directory another account can write (or a link planted in its
place) is refused with an error naming it, and nothing is killed or launched through it."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from slurm_spot.config import SpotConfig, parse_config
from slurm_spot.errors import BadInputError
from slurm_spot.providers.local.provider import LocalProvider
from tests.cluster import base_config
from tests.fakes.local_instance import sleeping_instance


@pytest.fixture
def provider(tmp_path: Path) -> LocalProvider:
    config: SpotConfig = parse_config(base_config(tmp_path))
    return LocalProvider(config, "local", config.providers["local"])  # type: ignore[arg-type]


@pytest.fixture
def victim(provider: LocalProvider) -> Iterator[subprocess.Popen[bytes]]:
    """A record for spot-1 whose pid is a process nobody asked the provider to start."""
    with sleeping_instance(provider) as proc:
        yield proc


@pytest.mark.parametrize("which", ["root", "records"])
def test_a_directory_other_accounts_can_write_is_refused_and_nothing_is_killed(
        provider: LocalProvider, victim: subprocess.Popen[bytes], which: str) -> None:
    path = provider.root if which == "root" else provider.records
    os.chmod(path, 0o777)
    with pytest.raises(BadInputError, match=f"{path}: writable by other accounts"):
        provider.reclaim("spot-1")
    with pytest.raises(BadInputError, match="chmod go-w"):
        provider.list_instances()
    assert victim.poll() is None  # still running
    os.chmod(path, 0o755)
    assert [i.node for i in provider.list_instances()] == ["spot-1"]


def test_a_directory_owned_by_another_account_is_refused(
        provider: LocalProvider, victim: subprocess.Popen[bytes]) -> None:
    if os.geteuid() != 0:
        pytest.skip("chown needs root")
    os.chown(provider.records, 65534, 65534)
    with pytest.raises(BadInputError, match="owned by uid 65534"):
        provider.reclaim("spot-1")
    assert victim.poll() is None


def test_a_symlink_in_place_of_the_directory_is_refused(
        provider: LocalProvider, tmp_path: Path) -> None:
    elsewhere = tmp_path / "elsewhere"
    (elsewhere / "instances").mkdir(parents=True)
    provider.root.parent.mkdir(parents=True, exist_ok=True)
    provider.root.symlink_to(elsewhere)
    with pytest.raises(BadInputError, match="must be a directory, not a symlink"):
        provider.list_instances()
    assert not (elsewhere / "lock").exists()


def test_directories_it_creates_under_a_group_writable_umask_are_accepted(
        provider: LocalProvider) -> None:
    old = os.umask(0o002)  # a developer's login default on Debian/Ubuntu
    try:
        provider.set_capacity("spot", 1)
        provider._make_dir(provider.notices)
    finally:
        os.umask(old)
    assert provider.capacity() == {"spot": 1}
    for path in (provider.root, provider.records, provider.notices):
        assert oct(os.stat(path).st_mode & 0o777) == "0o755"
    assert provider.list_instances() == []


@pytest.mark.parametrize(("body", "why"), [
    (b"[1]", "a JSON list, not an object"),
    (b"{}", "instance_id missing or not text"),
    (b'{"instance_id": "loc-x", "node": "spot-2", "pid": 0, "start_ticks": null,'
     b' "launch_time": "2026-01-01T00:00:00+00:00"}', "pid 0 is not a process id above 1"),
    (b'{"instance_id": "loc-x", "node": "spot-2", "pid": 5, "launch_time": "yesterday"}',
     "launch_time 'yesterday' is not ISO 8601"),
    (b"\xff\xfe{", "codec can't decode"),
])
def test_a_damaged_record_is_named_and_skipped_and_the_others_still_listed(
        provider: LocalProvider, victim: subprocess.Popen[bytes], body: bytes, why: str,
        caplog: pytest.LogCaptureFixture) -> None:
    """One damaged record (an admin's edit, a disk that filled) stopped every listing with a
    TypeError/KeyError/ValueError; pid 0 with no start time read as alive, and killing it
    would have been killpg(0): this process's own group."""
    damaged = provider.records / "loc-damaged.json"
    damaged.write_bytes(body)
    assert [i.node for i in provider.list_instances()] == ["spot-1"]
    assert f"{damaged}: not an instance record" in caplog.text and why in caplog.text
    provider.terminate(["spot-2"])  # nothing of the damaged record is killed
    assert victim.poll() is None


def test_a_damaged_capacity_file_limits_nothing_it_cannot_read_and_can_be_rewritten(
        provider: LocalProvider, caplog: pytest.LogCaptureFixture) -> None:
    """capacity.json is read at every launch: a list or a limit that is no count raised an
    AttributeError/ValueError there, and no node of any set could be launched."""
    provider.root.mkdir(parents=True, exist_ok=True)
    path = provider.root / "capacity.json"
    path.write_text('{"spot": "x", "cheap": 2, "other": -1}')
    assert provider.capacity() == {"cheap": 2}
    assert f"{path}: node set spot: limit 'x' is no count" in caplog.text
    path.write_text("[1]")
    assert provider.capacity() == {}
    provider.set_capacity("spot", 1)
    assert provider.capacity() == {"spot": 1}


def _provider_under(tmp_path: Path, state_dir: Path) -> LocalProvider:
    config: SpotConfig = parse_config(base_config(tmp_path, state_dir=str(state_dir)))
    return LocalProvider(config, "local", config.providers["local"])  # type: ignore[arg-type]


def test_a_state_dir_under_a_directory_any_account_can_write_is_refused(
        tmp_path: Path) -> None:
    """``state_dir: /srv/shared/spot`` with /srv/shared 0777 (no sticky bit): whoever can
    write it could rename ``spot`` between the checks and the kill and put their own in its
    place; refused before anything is created, read or killed through it."""
    shared = tmp_path / "shared"
    shared.mkdir()
    os.chmod(shared, 0o777)
    provider = _provider_under(tmp_path, shared / "spot")
    with pytest.raises(BadInputError, match=f"{shared}: writable by other accounts"):
        provider.set_capacity("spot", 1)
    assert not (shared / "spot").exists()
    os.chmod(shared, 0o755)
    with sleeping_instance(provider) as victim:
        os.chmod(shared, 0o777)
        with pytest.raises(BadInputError, match="chmod go-w"):
            provider.reclaim("spot-1")
        assert victim.poll() is None
        os.chmod(shared, 0o755)
        assert [i.node for i in provider.list_instances()] == ["spot-1"]


def test_in_a_sticky_directory_only_ones_own_or_roots_state_dir_is_used(
        tmp_path: Path) -> None:
    """/tmp-like (1777): the state directory there must be this user's or root's, or it was
    made by someone else (e.g. before the demo first ran) who can swap what is inside."""
    if os.geteuid() != 0:
        pytest.skip("chown needs root")
    sticky = tmp_path / "tmp"
    sticky.mkdir()
    os.chmod(sticky, 0o1777)
    provider = _provider_under(tmp_path, sticky / "spot")
    provider.set_capacity("spot", 1)  # made here by this user: used
    assert provider.capacity() == {"spot": 1}
    os.chown(sticky / "spot", 65534, 65534)
    with pytest.raises(BadInputError, match=f"{sticky / 'spot'}: owned by uid 65534"):
        provider.list_instances()


def test_a_link_on_the_way_is_followed_only_if_this_user_or_root_owns_it(
        tmp_path: Path) -> None:
    """A link of one's own (``/var/run -> /run`` style) to a good directory is fine; a link
    another account planted in a sticky directory is not, whatever it points to."""
    real = tmp_path / "real"
    real.mkdir()
    link = tmp_path / "via"
    link.symlink_to(real)
    provider = _provider_under(tmp_path, link / "spot")
    provider.set_capacity("spot", 2)
    assert (real / "spot" / "local" / "capacity.json").exists()
    if os.geteuid() != 0:
        return
    sticky = tmp_path / "tmp"
    sticky.mkdir()
    os.chmod(sticky, 0o1777)
    planted = sticky / "spot"
    planted.symlink_to(real / "spot")
    os.lchown(planted, 65534, 65534)
    other = _provider_under(tmp_path, planted)
    with pytest.raises(BadInputError, match=f"{planted}: .*uid 65534"):
        other.list_instances()


def test_group_write_is_refused_unless_the_group_is_the_owners_private_one(
        tmp_path: Path) -> None:
    """umask 002 with user private groups (Debian's default for logins) makes state
    directories group-writable by a group only their owner is in: accepted; the same mode
    with a group shared with other accounts is not."""
    import grp
    import pwd

    state = tmp_path / "state"
    provider = _provider_under(tmp_path, state)
    provider.set_capacity("spot", 1)
    own = pwd.getpwuid(os.geteuid()).pw_gid
    if grp.getgrgid(own).gr_mem:
        pytest.skip("this user's primary group has other members")
    os.chmod(state, 0o775)
    os.chmod(provider.root, 0o775)
    assert provider.capacity() == {"spot": 1}
    assert provider.list_instances() == []
    if os.geteuid() != 0:
        return
    shared = next((g.gr_gid for g in grp.getgrall() if g.gr_gid != own), None)
    if shared is None:
        pytest.skip("no second group on this machine")
    os.chown(state, 0, shared)
    with pytest.raises(BadInputError, match=f"{state}: writable by other accounts"):
        provider.list_instances()
