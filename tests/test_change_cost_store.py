"""What adding a checkpoint store costs (issue 42 item 4; docs/DESIGN.md, "Adding a checkpoint
store"): a throwaway store with its own URL scheme, written as a module of a temporary package
and registered the documented way, and only that way, is opened by ``open_store``, trains
through the unchanged Checkpointer, is read by ``plan --checkpoint-dir``'s save times
(cost/saves.py) and by ``cost``'s job report (cost/report.py, storage priced), and accepted as
a root by the config. Each registration is counted by the file it edits: a fourth file outside
the store's module fails here. Before it is registered, every one of them refuses its root
loudly (never read as a directory, never priced 0 without a word).

The provider half of "what a change costs" is tests/test_change_cost.py."""

from __future__ import annotations

import json
import re
import statistics
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pytest

from slurm_spot.checkpoint import store as store_module
from slurm_spot.config import parse_config
from slurm_spot.contract import location
from slurm_spot.cost.accounting import cost_report
from slurm_spot.cost.prices import site_prices
from slurm_spot.cost.report import job_usage
from slurm_spot.cost.saves import median_save_s
from slurm_spot.errors import BadInputError, CheckpointError, ConfigError
from slurm_spot.slurm.client import SlurmClient
from tests.test_cost_accounting import site as accounting_site
from tests.test_one_home import ROOT, _listed

SCHEME = "mem://"

#: The throwaway store: ``mem://<name>/<prefix>`` keeps its checkpoints under
#: ``$MEMSTORE_DIR/<name>/<prefix>`` (the bytes are a LocalStore's; what matters here is that
#: nothing outside this module knows the scheme or the class).
STORE_MODULE = '''
"""A checkpoint store for mem://<name>/<prefix> roots (a test's throwaway)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from slurm_spot.checkpoint.store import LocalStore

SCHEME = "mem://"


class MemStore:
    """The checkpoints of ``url`` under ``$MEMSTORE_DIR``; no options."""

    opened: list[str] = []

    def __init__(self, url: str) -> None:
        if not url.startswith(SCHEME):
            raise ValueError(url)
        self.url = url.rstrip("/")
        self._bytes = LocalStore(Path(os.environ["MEMSTORE_DIR"]) / url[len(SCHEME):])
        MemStore.opened.append(self.url)

    @property
    def location(self) -> str:
        return self.url

    def committed(self) -> list[tuple[int, dict[str, Any]]]:
        return self._bytes.committed()

    def __getattr__(self, name: str) -> Any:  # the rest of the protocol
        return getattr(self._bytes, name)
'''


class Registrations:
    """The documented registrations a test applies, each counted by the file it edits."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.monkeypatch = monkeypatch
        self.outside: set[str] = set()  # files outside the store's module (and store.py)

    def url_scheme(self) -> None:
        """slurm_spot/contract/location.py: the scheme in ``URL_SCHEMES``."""
        self.monkeypatch.setattr(location, "URL_SCHEMES", (*location.URL_SCHEMES, SCHEME))
        self.outside.add("slurm_spot/contract/location.py")

    def store_line(self, module: str) -> None:
        """slurm_spot/checkpoint/store.py (the store's own seam, not counted): its line in
        ``URL_STORES``."""
        self.monkeypatch.setitem(store_module.URL_STORES, SCHEME, f"{module}:MemStore")

    def root_pattern(self) -> str:
        """slurm_spot/config/plain.py: the root URL pattern (``S3_ROOT_PATTERN``) accepts the
        scheme. Its models read it when they are built, so the config is checked in a fresh
        interpreter with the pattern changed first (:func:`_config_accepts`): returns it."""
        self.outside.add("slurm_spot/config/plain.py")
        from slurm_spot.config.plain import S3_ROOT_PATTERN

        assert S3_ROOT_PATTERN.startswith("^s3://")
        return "^(s3|mem)://" + S3_ROOT_PATTERN.removeprefix("^s3://")


@pytest.fixture
def memstore(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """The throwaway store's module, importable (its package dir on sys.path); its name."""
    package = tmp_path / "pkg"
    package.mkdir()
    name = "memstore_" + re.sub(r"\W", "_", tmp_path.name)
    (package / f"{name}.py").write_text(STORE_MODULE)
    monkeypatch.syspath_prepend(str(package))
    monkeypatch.setenv("MEMSTORE_DIR", str(tmp_path / "bytes"))
    yield name
    sys.modules.pop(name, None)


def _site(tmp_path: Path) -> dict[str, Any]:
    """The cost tests' site (tests/test_cost_accounting.py), as the store's."""
    return {**accounting_site(tmp_path), "cluster": "store"}


JOB = 4711
#: The job ran 2026-03-01 10:00-12:00 (local time, as sacct prints it) on gpu-1, a spot node.
EVENTS = [{"time": "2026-02-27T00:00:00+00:00", "action": "launched", "source": "resume",
           "node": "gpu-1", "instance": "i-1",
           "extra": {"market": "spot", "type": "g5.xlarge", "zone": "us-east-1a"}}]
NOW = datetime(2026, 3, 2, tzinfo=timezone.utc)


def _slurm(tmp_path: Path) -> SlurmClient:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    sacct = bin_dir / "sacct"  # sacct -X -D -P: JobIDRaw|JobID|User|Start|End|NodeList|State|
    sacct.write_text(f"#!/bin/sh\necho '{JOB}|{JOB}|alice|2026-03-01T10:00:00|"
                     "2026-03-01T12:00:00|gpu-1|COMPLETED|'\n")
    sacct.chmod(0o755)
    return SlurmClient(str(bin_dir))


def _config(tmp_path: Path) -> Any:
    return parse_config(_site(tmp_path))


def _on_store_root(tmp_path: Path, root: str) -> Any:
    """The site's config with ``checkpoint.root`` set to ``root`` as an accepted config has it
    (a string; whether the config accepts it is :func:`_config_accepts`'s question)."""
    config = _config(tmp_path)
    return config.model_copy(update={
        "checkpoint": config.checkpoint.model_copy(update={"root": root})})


def _config_accepts(root: str, pattern: str | None, package: Path) -> dict[str, Any]:
    """Parse a spot.yaml with checkpoint root ``root`` in a fresh interpreter, with the
    documented registrations applied first (``pattern``: the root pattern; None: none), and
    report what the config and the job's side make of it."""
    program = textwrap.dedent(f"""
        import json, sys
        sys.path.insert(0, {str(package)!r})
        from slurm_spot.config import plain
        from slurm_spot.contract import location
        if {pattern!r} is not None:
            plain.S3_ROOT_PATTERN = {pattern!r}
            location.URL_SCHEMES = (*location.URL_SCHEMES, {SCHEME!r})
        from slurm_spot.config import parse_config
        from slurm_spot.errors import ConfigError
        from slurm_spot.jobs.node.prolog import checkpoint_dir
        site = json.loads(sys.argv[1])
        site["checkpoint"]["root"] = {root!r}
        try:
            config = parse_config(site)
        except ConfigError as exc:
            print(json.dumps({{"error": str(exc)}}))
            raise SystemExit(0)
        job = checkpoint_dir(config, {{"SLURM_JOB_USER": "alice", "SLURM_JOB_ID": "7"}})
        print(json.dumps({{"root": repr(config.checkpoint.root), "job": repr(job),
                           "is_s3": config.checkpoint.is_s3}}))
    """)
    done = subprocess.run([sys.executable, "-c", program, json.dumps(_site(package))],
                          capture_output=True, text=True, check=True, cwd=ROOT, timeout=120)
    return json.loads(done.stdout.strip().splitlines()[-1])


def _save_three(url: str) -> None:
    """Three checkpoints of steps 10, 20, 30 through the unchanged Checkpointer."""
    from slurm_spot.checkpoint import Checkpointer
    from tests.test_checkpoint import _state

    ckpt = Checkpointer(url, keep=3)
    assert ckpt.directory == url  # a URL stays a URL
    for step in (10, 20, 30):
        ckpt.save(_state(step))


def test_an_unregistered_store_is_refused_loudly_everywhere(tmp_path: Path,
                                                           memstore: str) -> None:
    """Before its registrations, a ``mem://`` root is never a directory and never priced 0
    without a word: open_store, plan's save times, cost's report and the config refuse it."""
    url = f"{SCHEME}bucket/alice/{JOB}"
    with pytest.raises(CheckpointError, match=r"no checkpoint store handles mem:// roots"):
        store_module.open_store(url)
    with pytest.raises(BadInputError, match=r"no checkpoint store handles mem://"):
        median_save_s(url)
    usage = job_usage(_on_store_root(tmp_path, f"{SCHEME}bucket"), _slurm(tmp_path), JOB,
                      EVENTS, None, NOW)
    assert usage.checkpoints == []
    assert [n for n in usage.notes if n.startswith("checkpoints not read")
            and "no checkpoint store handles mem://" in n and "not counted" in n]
    assert "checkpoints not read" in " ".join(
        cost_report(usage, site_prices(_config(tmp_path), live_spot=False), NOW).notes)
    # a scheme in URL_SCHEMES without its store line is refused too (not a LocalStore)
    with pytest.MonkeyPatch.context() as patch:
        Registrations(patch).url_scheme()
        with pytest.raises(CheckpointError, match=r"no checkpoint store is registered"):
            store_module.open_store(url)
    with pytest.raises(ConfigError, match=r"checkpoint\.root"):
        parse_config({**_site(tmp_path), "checkpoint": {"root": url}})


def test_a_new_store_costs_at_most_three_files_outside_its_module(
        tmp_path: Path, memstore: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The documented registrations, and nothing else, make a new store work for training,
    plan, cost and the config; they touch the files docs/DESIGN.md lists, at most three."""
    register = Registrations(monkeypatch)
    register.url_scheme()
    register.store_line(memstore)
    pattern = register.root_pattern()

    url = f"{SCHEME}bucket/alice/{JOB}"
    opened = store_module.open_store(url)
    assert type(opened).__name__ == "MemStore" and opened.location == url
    assert store_module.open_configured_store(url, _config(tmp_path).checkpoint) \
        .location == url  # a store without options_from_config gets no options
    _save_three(url)
    assert [step for step, _ in opened.committed()] == [30, 20, 10]

    # plan --checkpoint-dir: the save times, through the store
    median, saves = median_save_s(url)
    assert [s.step for s in saves] == [30, 20, 10]
    assert median == statistics.median(s.save_s for s in saves)
    assert median_save_s(url, _config(tmp_path).checkpoint) == (median, saves)

    # cost: the job's checkpoints under the root, found by the layout and priced
    config = _on_store_root(tmp_path, f"{SCHEME}bucket")
    usage = job_usage(config, _slurm(tmp_path), JOB, EVENTS, None, NOW)
    assert usage.notes == [] and [c.step for c in usage.checkpoints] == [10, 20, 30]
    report = cost_report(usage, site_prices(config, live_spot=False), NOW)
    newest_two = sum(c.size_bytes for c in usage.checkpoints[-2:])
    assert newest_two > 0 and report.checkpoint_bytes == newest_two
    hours = 2.0
    assert report.storage_usd == pytest.approx(newest_two / 1e9 * hours / 720 * 0.023)

    # the config: the root is accepted, stays a URL, and the job's directory is joined as one
    assert "error" in _config_accepts(url, None, tmp_path / "pkg")
    seen = _config_accepts(f"{SCHEME}bucket/ckpt", pattern, tmp_path / "pkg")
    assert seen == {"root": repr(f"{SCHEME}bucket/ckpt"),
                    "job": repr(f"{SCHEME}bucket/ckpt/alice/7"), "is_s3": False}

    documented = _listed("Adding a checkpoint store")
    assert register.outside <= set(documented), (register.outside, documented)
    assert len(register.outside) <= 3 and len(documented) <= 3, documented
    assert all((ROOT / path).is_file() for path in register.outside)


def test_every_store_implements_the_whole_store_protocol() -> None:
    """``committed()`` is part of the protocol ``cost`` and ``plan`` read, so every store has
    it (and the rest): a new store is read through the protocol, not by a second reader."""
    from slurm_spot.checkpoint.s3 import S3Store

    members = {name for name in vars(store_module.CheckpointStore)
               if not name.startswith("_")}
    assert {"committed", "latest", "has_committed", "location"} <= members
    for cls in (store_module.LocalStore, S3Store):
        missing = sorted(m for m in members if not hasattr(cls, m))
        assert missing == [], (cls.__name__, missing)


def test_the_local_store_lists_committed_checkpoints_and_says_when_it_is_missing(
        tmp_path: Path) -> None:
    """LocalStore.committed: the manifests of committed ``step_N`` directories, newest first
    (staging directories, symlinks and directories without a manifest left out); a missing
    directory is StoreNotFound (plan says "no such directory"), a file a CheckpointError."""
    from slurm_spot.checkpoint import commit as commit_protocol

    local = store_module.LocalStore(tmp_path / "job")
    with pytest.raises(store_module.StoreNotFound, match="no such directory"):
        local.committed()
    for step in (3, 1, 2):
        staging = commit_protocol.new_temp_dir(tmp_path / "job", step)
        (staging / "state.pt").write_bytes(b"x" * step)
        commit_protocol.write_manifest(staging, step, "torch", 1, started_s=0.0)
        commit_protocol.commit(staging, step)
    commit_protocol.new_temp_dir(tmp_path / "job", 4)  # a save in progress
    (tmp_path / "job" / "step_000000005").mkdir()  # no manifest: not committed
    (tmp_path / "job" / "step_000000006").symlink_to(tmp_path / "job" / "step_000000003")
    listed = local.committed()
    assert [step for step, _ in listed] == [3, 2, 1]
    assert listed[0][1]["files"]["state.pt"]["size"] == 3
    (tmp_path / "file").write_text("")
    with pytest.raises(CheckpointError, match="not a directory"):
        store_module.open_store(tmp_path / "file").committed()


def test_the_s3_store_takes_its_options_from_the_config_section(tmp_path: Path) -> None:
    """open_configured_store: spot.yaml's ``checkpoint.s3`` reaches the S3 store, without the
    caller (cost) naming S3; a directory store takes none."""
    site = _site(tmp_path)
    site["checkpoint"] = {"root": "s3://bucket/ckpt",
                          "s3": {"endpoint_url": "http://127.0.0.1:9", "addressing_style": "path"}}
    settings = parse_config(site).checkpoint
    opened: Any = store_module.open_configured_store("s3://bucket/ckpt/alice/7", settings)
    assert (opened.endpoint_url, opened.addressing_style) == ("http://127.0.0.1:9", "path")
    plain = store_module.open_configured_store(tmp_path / "d", settings)
    assert isinstance(plain, store_module.LocalStore)


def test_an_s3_store_that_cannot_be_listed_says_so_through_the_protocol() -> None:
    """S3Store.committed reports a refused listing as the protocol's CheckpointError (cost and
    plan catch no botocore error); restore's ``latest`` still raises what botocore raised."""
    from botocore.exceptions import ClientError

    from slurm_spot.checkpoint.s3 import S3Store

    class Refusing:
        def get_paginator(self, name: str) -> Any:
            raise ClientError({"Error": {"Code": "AccessDenied", "Message": "no"}},
                              "ListObjectsV2")

    store = S3Store("s3://bucket/alice/7", client=Refusing())
    with pytest.raises(CheckpointError,
                       match=r"^s3://bucket/alice/7: cannot list the checkpoints: .*AccessDenied"):
        store.committed()
    with pytest.raises(ClientError):
        store.latest()
