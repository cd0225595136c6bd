"""A local provider instance record whose process is a real ``sleep`` (tests of the local
provider that need an alive instance without a slurmd)."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime, timezone

from slurm_spot.providers.local.provider import LocalProvider, _proc_start_ticks

INSTANCE_ID = "loc-0123456789ab"


@contextmanager
def sleeping_instance(provider: LocalProvider, node: str = "spot-1",
                      ) -> Iterator[subprocess.Popen[bytes]]:
    """Record :data:`INSTANCE_ID` for ``node`` with a ``sleep 600`` in a session of its own as
    its process; the process is killed on exit if still running."""
    proc = subprocess.Popen(["sleep", "600"], start_new_session=True)
    try:
        provider.records.mkdir(parents=True, exist_ok=True)
        provider._write({"instance_id": INSTANCE_ID, "node": node, "node_set": "spot",
                         "market": "spot", "launch_time": datetime.now(timezone.utc).isoformat(),
                         "pid": proc.pid, "start_ticks": _proc_start_ticks(proc.pid),
                         "state": "running", "cluster": "test"})
        yield proc
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait()
