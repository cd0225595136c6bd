"""Imported by the fork server of a torchrun agent where it is started as a new interpreter,
and only there (:func:`slurm_spot.jobs.injob.warm_worker.start_fork_server` makes it the
server's preload; the fallback of :func:`~slurm_spot.jobs.injob.warm_worker.fork_fork_server`,
whose fork of the agent does the same without this module):

- ties the server's life to the agent's: ``prctl(PR_SET_PDEATHSIG, SIGKILL)`` (prctl(2),
  Linux), so that an agent killed outright (SIGKILL, the OOM killer) takes the server with it,
  and the workers, whose parent-death signal is SIGINT (torch/multiprocessing/spawn.py
  ``_wrap``), with the server; otherwise workers hold the server's "alive" pipe open and both
  would run on. If the agent (``$SLURM_SPOT_WARM_AGENT``) is already gone, the server exits;
- puts ``$SLURM_SPOT_WARM_PATH0`` (the script's folder) first on ``sys.path``, as the workers
  have it: the agent's first entry is its working directory (``python -m``), where a module
  of an installed one's name would be preloaded instead of it (``python SCRIPT`` never
  looks there);
- imports the modules named in ``$SLURM_SPOT_WARM_PRELOAD`` (comma-separated), skipping any that
  fails whatever it raises (:func:`~slurm_spot.jobs.injob.warm_worker.preload`);
- removes the variables, so that the workers forked from the server do not see them.
"""

from __future__ import annotations

import os
import sys

from slurm_spot.jobs.injob.warm_worker import (
    AGENT_ENV,
    PATH0_ENV,
    PRELOAD_ENV,
    exit_with_parent,
    preload,
)

exit_with_parent(int(os.environ.pop(AGENT_ENV, "0") or 0))
_folder = os.environ.pop(PATH0_ENV, "")
if _folder:
    if sys.path:
        sys.path[0] = _folder
    else:
        sys.path.append(_folder)
preload([m for m in os.environ.pop(PRELOAD_ENV, "").split(",") if m])
