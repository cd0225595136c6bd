"""Everything about a user's job, split by who runs it:

- :mod:`.submit`: ``slurm-spot sbatch``, run by the user at submission (the batch script and
  its options);
- :mod:`.node`: slurmd's Prolog, TaskProlog and Epilog on each node of the job;
- :mod:`.injob`: what runs inside the job's own processes (the job's environment, the torchrun
  agent and its warm workers, the elastic replacement supervisor, the rendezvous client);
- :mod:`.services`: the long-running services jobs connect to, on a machine that is not
  reclaimed (the rendezvous service and its store, torchft's lighthouse);
- :mod:`.interruption`: what slurm-spot's daemons do to a job whose node is taken (the
  watcher on the node, with notice; the reconciler on the controller, without).

Modules at this level are shared by several of them: :mod:`.contract` (the job contract's
environment-variable names and the elastic mark, written by one part and read by others) and
:mod:`.rendezvous_wire` (the frames and handshake between the rendezvous client and service).
"""
