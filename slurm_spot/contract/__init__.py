"""What a job's parts agree on, low in the house: the standard library and
:mod:`slurm_spot.errors` only, so the submit side, the node's hooks, the daemons and the
training process can all import it (tests/test_architecture.py keeps it so).

- :mod:`~slurm_spot.contract.names`: the environment variables and marks the parts exchange;
- :mod:`~slurm_spot.contract.location`: checkpoint locations, ``<root>/<user>/<key>``;
- :mod:`~slurm_spot.contract.jobenv`: the signal, job-id, restart and checkpoint readers of a job's
  environment;
- :mod:`~slurm_spot.contract.directives`: ``#SBATCH`` directives, read as sbatch reads them;
- :mod:`~slurm_spot.contract.sbatch_options`: sbatch's option grammar.
"""
