"""The local cluster (a real slurmctld and ``slurmd`` processes on this machine) and the demo.

Modules: :mod:`.cluster` (``slurm-spot local up/down/status``), :mod:`.demo` (``slurm-spot demo``).
"""
