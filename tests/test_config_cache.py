"""The validated-config cache (slurm_spot/config/cache.py): a hook gets the config an earlier
hook validated, and never a stale one."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import yaml

from slurm_spot.config import load_config
from slurm_spot.config.cache import CACHE_DIR, SpotConfigView, as_model, load_hook_config
from slurm_spot.errors import ConfigError

ROOT = Path(__file__).resolve().parent.parent


def write_site(tmp_path: Path, text: str | None = None, **changes: object) -> Path:
    """spot.yaml with its state_dir in tmp_path; ``changes`` are top-level settings."""
    if text is None:
        data = yaml.safe_load((ROOT / "examples" / "spot-cloud.yaml").read_text())
        data.update(state_dir=str(tmp_path / "state"), log_dir=str(tmp_path / "log"), **changes)
        text = yaml.safe_dump(data)
    (tmp_path / "state").mkdir(exist_ok=True)
    path = tmp_path / "spot.yaml"
    path.write_text(text)
    return path


def entries(tmp_path: Path) -> list[Path]:
    return sorted((tmp_path / "state" / CACHE_DIR).glob("*.json"))


def fields(value: object) -> object:
    """Every field of a model or a view, recursively, for comparing the two."""
    names = getattr(type(value), "model_fields", None)
    if names is None and hasattr(value, "_model"):
        names = [k for k in vars(value) if not k.startswith("_")]
    if names is not None:
        return {n: fields(getattr(value, n)) for n in names}
    if isinstance(value, dict):
        return {k: fields(v) for k, v in value.items()}
    if isinstance(value, list):
        return [fields(v) for v in value]
    return (type(value).__name__, value)


@pytest.mark.parametrize("example", ["spot-cloud.yaml", "spot-local.yaml"])
def test_second_load_is_a_view_equal_to_the_validated_model(tmp_path: Path, example: str) -> None:
    data = yaml.safe_load((ROOT / "examples" / example).read_text())
    data.update(state_dir=str(tmp_path / "state"), log_dir=str(tmp_path / "log"))
    path = write_site(tmp_path, yaml.safe_dump(data))
    first = load_hook_config(path)
    assert not isinstance(first, SpotConfigView) and len(entries(tmp_path)) == 1
    second = load_hook_config(path)
    assert isinstance(second, SpotConfigView)
    model = load_config(path)
    assert fields(second) == fields(model)  # same values, same types (Path stays Path)
    assert second.source_path == model.source_path == path.absolute()
    assert second.all_nodes() == model.all_nodes()
    for node in [*model.all_nodes(), "nope-1", f"{model.node_sets[0].name}-0",
                 f"{model.node_sets[0].name}-01"]:
        found, expected = second.node_set_of(node), model.node_set_of(node)
        assert (found.name if found else None) == (expected.name if expected else None)
    assert [ns.hostlist for ns in second.node_sets] == [ns.hostlist for ns in model.node_sets]
    assert second.checkpoint.is_s3 == model.checkpoint.is_s3
    assert as_model(second) == model
    with pytest.raises(AttributeError, match="read-only"):
        second.cluster = "other"  # type: ignore[misc]


def test_a_file_edited_between_two_loads_is_never_read_from_the_cache(tmp_path: Path) -> None:
    path = write_site(tmp_path, preemption={"signal": "USR2"})
    assert load_hook_config(path).preemption.signal == "USR2"
    assert load_hook_config(path).preemption.signal == "USR2"  # from the cache
    before = os.stat(path)
    # the same size and, put back, the same mtime: only the bytes differ
    path.write_text(path.read_text().replace("signal: USR2", "signal: USR1"))
    os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns))
    after = os.stat(path)
    assert (after.st_size, after.st_mtime_ns, after.st_ino) == (
        before.st_size, before.st_mtime_ns, before.st_ino)
    edited = load_hook_config(path)
    assert edited.preemption.signal == "USR1" and not isinstance(edited, SpotConfigView)
    assert load_hook_config(path).preemption.signal == "USR1"  # the new entry
    path.write_text(path.read_text().replace("signal: USR1", "signal: BOGUS"))
    with pytest.raises(ConfigError, match=r"preemption\.signal"):
        load_hook_config(path)  # an invalid edit is an error, not the last good config


def test_an_entry_from_another_version_of_the_file_or_code_is_not_used(tmp_path: Path) -> None:
    path = write_site(tmp_path)
    load_hook_config(path)
    (entry,) = entries(tmp_path)
    stored = json.loads(entry.read_text())
    stored["config"]["fields"]["cluster"] = "forged"
    stored["key"]["code"][0] = "0.0.0-old"
    entry.write_text(json.dumps(stored))
    assert load_hook_config(path).cluster == "research"


@pytest.mark.parametrize("spoil", ["group-writable", "symlink", "not-a-file", "garbage"])
def test_an_untrusted_or_broken_cache_is_ignored(tmp_path: Path, spoil: str) -> None:
    path = write_site(tmp_path)
    load_hook_config(path)
    cache = tmp_path / "state" / CACHE_DIR
    (entry,) = entries(tmp_path)
    stored = json.loads(entry.read_text())
    stored["config"]["fields"]["cluster"] = "forged"  # key still matches: only trust keeps it out
    entry.write_text(json.dumps(stored))
    if spoil == "group-writable":
        cache.chmod(0o775)
    elif spoil == "symlink":
        cache.rename(tmp_path / "elsewhere")
        cache.symlink_to(tmp_path / "elsewhere")
    elif spoil == "not-a-file":
        entry.unlink()
        os.mkfifo(entry)
    else:
        entry.write_text("{not json")
    config = load_hook_config(path)
    assert config.cluster == "research" and not isinstance(config, SpotConfigView)


def test_the_entry_is_no_more_readable_than_the_config(tmp_path: Path) -> None:
    path = write_site(tmp_path)
    path.chmod(0o600)
    load_hook_config(path)
    (entry,) = entries(tmp_path)
    assert entry.stat().st_mode & 0o777 == 0o600
    assert not list((tmp_path / "state" / CACHE_DIR).glob(".*"))  # no temporary left


def test_no_state_dir_means_no_cache_and_no_error(tmp_path: Path) -> None:
    path = write_site(tmp_path)
    (tmp_path / "state").rmdir()
    assert load_hook_config(path).cluster == "research"
    assert not (tmp_path / "state").exists()  # the admin's to create; never made here
