"""A node's life, from power-up to power-down: what the hooks, the watcher and the reconciler
do to one node or node set.

- :mod:`~slurm_spot.lifecycle.power`: the power-saving hooks' work (resume, suspend, resume-fail);
- :mod:`~slurm_spot.lifecycle.failover`: a job whose node's launch failed, moved to the next node set;
- :mod:`~slurm_spot.lifecycle.bootwait`: PrologSlurmctld, the launch held until the node is up;
- :mod:`~slurm_spot.lifecycle.watch`: the compute node's interruption watcher;
- :mod:`~slurm_spot.lifecycle.prewarm`: replacements powered up when a notice comes;
- :mod:`~slurm_spot.lifecycle.spares`: hot spares kept powered up;
- :mod:`~slurm_spot.lifecycle.weights`: node Weights in the cost order;
- :mod:`~slurm_spot.lifecycle.node_identity`: which instance a node is, from inside it;
- :mod:`~slurm_spot.lifecycle.status`: what ``slurm-spot status`` shows of each node and node set.

Nothing is imported here: the hooks import only the module they use (slurmctld runs them with a
time limit, and every import is paid for at each call).
"""
