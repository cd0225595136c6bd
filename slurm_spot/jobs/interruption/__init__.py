"""What slurm-spot's daemons do to a job whose node is taken: the watcher (root, on the node,
with notice) and the reconciler (on the controller, without): which signal it gets, requeue of
a job that ended, release of the node from an elastic job."""
