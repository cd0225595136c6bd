"""``SLURM_RESUME_FILE``: which jobs a ResumeProgram call powers nodes up for.

slurm.conf(5) (22.05), ResumeProgram: slurmctld sets ``SLURM_RESUME_FILE`` to a file (a
``/proc/<pid>/fd/N`` path, gone with the hook) holding JSON like::

    {"all_nodes_resume": "cloud[1-3]",
     "jobs": [{"job_id": 140814, "nodes_alloc": "cloud[1-4]", "nodes_resume": "cloud[1-3]",
               "partition": "cloud", "features": "c1,c2", "extra": "", "oversubscribe": "OK",
               "reservation": "resv_1234"}]}

``nodes_alloc`` is the job's whole allocation (nodes already up included); ``nodes_resume``
the part this call powers up. slurmctld 22.05.8 itself writes only ``{"jobs": [{"job_id": 1,
"nodes": "cheap-1"}], "all_nodes": "cheap-1"}`` (seen on the local cluster), so ``nodes`` is
read where ``nodes_alloc`` is absent. Read tolerantly: unknown keys are ignored, a job whose node list
cannot be read is skipped (logged), and a missing or unreadable file means "unknown" (None).
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Mapping

from slurm_spot.errors import HostlistError
from slurm_spot.hostlist import expand
from slurm_spot.rawtext import DECODE_ERRORS

log = logging.getLogger(__name__)


def parse_resume_file(text: str) -> dict[int, tuple[str, ...]]:
    """``{job id: the job's allocated nodes}`` from the file's JSON text.

    Raises:
        ValueError: not JSON, or no ``jobs`` list.
    """
    data = json.loads(text)
    if not isinstance(data, dict) or not isinstance(data.get("jobs"), list):
        raise ValueError("no 'jobs' list")
    jobs: dict[int, tuple[str, ...]] = {}
    for entry in data["jobs"]:
        if not isinstance(entry, dict):
            continue
        try:
            job_id = int(entry["job_id"])
            nodes = str(entry.get("nodes_alloc") or entry.get("nodes")
                        or entry.get("nodes_resume") or "")
            jobs[job_id] = tuple(expand(nodes, allow_duplicates=True)) if nodes else ()
        except (KeyError, TypeError, ValueError, HostlistError) as exc:
            log.warning("SLURM_RESUME_FILE: skipping job entry %r: %s", entry, exc)
    return jobs


def read_resume_file(env: Mapping[str, str] = os.environ) -> dict[int, tuple[str, ...]] | None:
    """The jobs of ``$SLURM_RESUME_FILE``, or None when it is unset or unreadable (logged)."""
    path = env.get("SLURM_RESUME_FILE")
    if not path:
        return None
    try:
        # Jobs' fields (extra, features) hold whatever bytes their users gave: kept, not an error.
        with open(path, encoding="utf-8", errors=DECODE_ERRORS) as fh:
            return parse_resume_file(fh.read(1 << 24))
    except (OSError, ValueError) as exc:
        log.warning("SLURM_RESUME_FILE %s unreadable: %s; no all-or-nothing per job", path, exc)
        return None
