"""A ``local up`` that fails leaves nothing running: not its slurmctld, not the munged it
started (issue 15: a failed up or demo left daemons behind that the next run tripped over)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.cluster import acquire_cluster_lock, base_config, wait_for

pytestmark = pytest.mark.e2e


# `local up` as on a machine where no munged runs, so that it starts (and must stop) its own:
# in a mount namespace of its own, an empty /run/munge hides the munged that the test session
# (or another cluster) runs for everyone else. Processes are still seen from here (one PID
# namespace), so the munged it started is checked gone.
WITHOUT_MUNGED = ["unshare", "--mount", "--propagation", "private", "--", "sh", "-c",
                  'mount -t tmpfs -o mode=0755 tmpfs /run/munge && exec "$@"', "sh"]


def _processes_with(word: str) -> list[int]:
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            words = Path(f"/proc/{entry}/cmdline").read_bytes().decode(errors="replace").split("\0")
            state = Path(f"/proc/{entry}/stat").read_text().split()[2]
        except OSError:
            continue
        if word in words and state != "Z":
            found.append(int(entry))
    return found


def test_slurmctld_that_cannot_listen_is_stopped_and_so_is_munged(tmp_path: Path) -> None:
    config = base_config(tmp_path)
    source = tmp_path / "spot-source.yaml"
    source.write_text(yaml.safe_dump(config))
    conf_dir = tmp_path / "etc"
    with acquire_cluster_lock():
        munged_before = set(_processes_with("munged"))
        # Something that is not slurmctld holds slurmctld's port: slurmctld starts, then
        # cannot bind and never answers.
        with socket.socket() as squatter:
            squatter.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            squatter.bind(("0.0.0.0", 6817))
            squatter.listen(1)
            proc = subprocess.run(
                [*WITHOUT_MUNGED, sys.executable, "-m", "slurm_spot", "--config", str(source),
                 "local", "up", "--no-reconcile", "--conf-dir", str(conf_dir)],
                capture_output=True, text=True, timeout=120,
                env={**os.environ, "SLURM_CONF": str(conf_dir / "slurm.conf")})
        assert proc.returncode != 0
        assert "slurmctld" in proc.stderr, proc.stderr
        slurm_conf = str(conf_dir / "slurm.conf")
        wait_for(lambda: not _processes_with(slurm_conf), timeout=15,
                 what="no slurmctld of the failed cluster")
        assert set(_processes_with("munged")) <= munged_before
