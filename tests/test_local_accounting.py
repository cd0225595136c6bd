"""The local cluster's accounting settings as written (the daemons: test_accounting_e2e.py)."""

from __future__ import annotations

import stat
from pathlib import Path

from slurm_spot.config import default_local_config
from slurm_spot.localcluster.accounting import DBD_PORT, write_slurmdbd_conf
from slurm_spot.localcluster.cluster import LocalClusterPaths, write_cluster_files


def _slurm_conf(tmp_path: Path, dbd_port: int | None) -> str:
    config = default_local_config(tmp_path / "state", tmp_path / "log")
    paths = LocalClusterPaths(tmp_path / "etc", config.state_dir)
    paths.conf_dir.mkdir(parents=True)
    write_cluster_files(config, paths, dbd_port)
    return paths.slurm_conf.read_text()


def test_slurm_conf_points_at_slurmdbd_only_with_accounting(tmp_path: Path) -> None:
    on = _slurm_conf(tmp_path / "on", DBD_PORT)
    assert "AccountingStorageType=accounting_storage/slurmdbd" in on
    assert f"AccountingStoragePort={DBD_PORT}" in on
    off = _slurm_conf(tmp_path / "off", None)
    assert "AccountingStorageType=accounting_storage/none" in off
    assert "AccountingStoragePort" not in off


def test_slurmdbd_conf_is_private_and_names_the_database(tmp_path: Path) -> None:
    path = write_slurmdbd_conf(tmp_path, tmp_path / "state", tmp_path / "log")
    assert stat.S_IMODE(path.stat().st_mode) == 0o600  # slurmdbd refuses a readable one
    text = path.read_text()
    assert "StorageType=accounting_storage/mysql" in text and "StorageLoc=slurm_acct_db" in text
    assert f"DbdPort={DBD_PORT}" in text and "SlurmUser=root" in text
