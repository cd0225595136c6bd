"""What a job reads from its environment, at the path training code imported it from before
the ``contract/`` package (``from slurm_spot.jobs.injob import jobenv``). The readers live in
:mod:`slurm_spot.contract.jobenv`, where every side of the product shares them; this path stays
so that a job submitted before an upgrade, and requeued after it, still starts."""

from slurm_spot.contract.jobenv import *  # noqa: F403
