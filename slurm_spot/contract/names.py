"""The job contract: the names through which slurm-spot's parts and a user's job talk.

One home for each name, so that the part that writes a variable and the parts that read it
cannot drift apart. Who writes and who reads each:

- :data:`ENV_CHECKPOINT_ROOT`, :data:`ENV_S3_ENDPOINT_URL`, :data:`ENV_S3_ADDRESSING_STYLE`:
  written by ``slurm-spot sbatch --checkpoint-root/--s3-endpoint-url/--s3-addressing-style``
  into sbatch's environment (sbatch's default ``--export=ALL`` passes it to the job); read by
  the Prolog and TaskProlog (:mod:`slurm_spot.jobs.node.prolog`), which exports the S3 pair
  again for the checkpoint library;
- :data:`ENV_CHECKPOINT_DIR`, :data:`ENV_RESTART_COUNT`, :data:`ENV_PREEMPT_SIGNAL`,
  :data:`ENV_REQUEUE_EXIT_CODE`, :data:`ENV_SLURM_BIN_DIR`: exported by the TaskProlog into
  every task (``export NAME=value`` lines, slurm.conf(5) TaskProlog); read inside the job by
  :mod:`slurm_spot.contract.jobenv`, the torchrun agent and the checkpoint library;
- :data:`ENV_RENDEZVOUS`: set by the user (or the admin's profile) for ``slurm-spot sbatch
  --elastic``, ``HOST:PORT`` of ``slurm-spot rendezvous``;
- :data:`ENV_FT_LIGHTHOUSE_JOB`, :data:`ENV_FT_GROUP`: written by ``slurm-spot sbatch
  --torchrun --fault-tolerant`` into each replica group's job (``--export``); read by the
  group's batch script (which finds the lighthouse from the job id and exports
  ``TORCHFT_LIGHTHOUSE``, :data:`ENV_FT_HOST` and :data:`ENV_FT_CHECKPOINT_KEY`) and by the
  training (``examples/train_ft.py``, :func:`slurm_spot.contract.jobenv.ft_checkpoint_dir`);
- :data:`ELASTIC_MARK`: the line ``slurm-spot sbatch --elastic`` writes into the batch
  script; the watcher and the reconciler read it back (``scontrol write batch_script``) to
  release a departing node from the job instead of requeueing it
  (:mod:`slurm_spot.jobs.interruption.elastic_release`).

The documented meaning of each variable for users is docs/ml-engineer.md.
"""

from __future__ import annotations

#: The job's checkpoint root when the job chose one: an ``s3://bucket/prefix`` URL
#: (``slurm-spot sbatch --checkpoint-root``); unset: spot.yaml's ``checkpoint.root``.
ENV_CHECKPOINT_ROOT = "SLURM_SPOT_CHECKPOINT_ROOT"
#: The S3 endpoint URL of an S3 checkpoint root (``--s3-endpoint-url``, or spot.yaml's).
ENV_S3_ENDPOINT_URL = "SLURM_SPOT_S3_ENDPOINT_URL"
#: The S3 addressing style, ``auto``, ``path`` or ``virtual`` (``--s3-addressing-style``).
ENV_S3_ADDRESSING_STYLE = "SLURM_SPOT_S3_ADDRESSING_STYLE"
#: The job's checkpoint directory, ``<root>/<user>/<job key>`` (a path or an ``s3://`` URL).
ENV_CHECKPOINT_DIR = "SLURM_SPOT_CHECKPOINT_DIR"
#: How many times the job was requeued (Slurm's ``SLURM_RESTART_COUNT``, 0 when unset).
ENV_RESTART_COUNT = "SLURM_SPOT_RESTART_COUNT"
#: The signal Slurm sends before a preemption (spot.yaml's ``preemption.signal``), in any form
#: sbatch's ``--signal`` accepts.
ENV_PREEMPT_SIGNAL = "SLURM_SPOT_PREEMPT_SIGNAL"
#: The exit code that asks for a requeue (spot.yaml's ``preemption.requeue_exit_code``).
ENV_REQUEUE_EXIT_CODE = "SLURM_SPOT_REQUEUE_EXIT_CODE"
#: spot.yaml's ``slurm_bin_dir``: where rank 0 finds ``scontrol`` for the requeue when the
#: job's own PATH has no Slurm commands.
ENV_SLURM_BIN_DIR = "SLURM_SPOT_SLURM_BIN_DIR"
#: ``HOST:PORT`` of the rendezvous service for ``slurm-spot sbatch --elastic`` when
#: ``--rendezvous`` is not given.
ENV_RENDEZVOUS = "SLURM_SPOT_RENDEZVOUS"

#: A local directory the S3 checkpoint store stages uploads and downloads in (default: the
#: system's temporary directory); set by the user or the admin's TaskProlog.
ENV_STAGING_DIR = "SLURM_SPOT_STAGING_DIR"
#: ``1``/``true``/``yes``: a job whose every checkpoint is unreadable starts from step 0
#: instead of stopping (the Checkpointer's ``start_fresh_if_invalid``); set by the user.
ENV_START_FRESH_IF_INVALID = "SLURM_SPOT_START_FRESH_IF_INVALID"

#: The job id of a fault-tolerant job's lighthouse job (``slurm-spot sbatch --fault-tolerant``),
#: in each replica group's environment: the group's script finds the lighthouse's node from it.
ENV_FT_LIGHTHOUSE_JOB = "SLURM_SPOT_FT_LIGHTHOUSE_JOB"
#: The replica group's name (``g0``, ``g1``, ...), torchft's ``replica_id``: what
#: ``examples/train_ft.py`` reads by default.
ENV_FT_GROUP = "REPLICA_GROUP_ID"
#: This node's address on the cluster network (its NodeAddr), where the other groups reach the
#: group's torchft manager, store and checkpoint server.
ENV_FT_HOST = "SLURM_SPOT_FT_HOST"
#: The checkpoint key every replica group of one fault-tolerant job shares (the lighthouse
#: job's id): its checkpoints are ``<root>/<user>/<key>``, the lighthouse job's checkpoint
#: directory, not each group's own.
ENV_FT_CHECKPOINT_KEY = "SLURM_SPOT_FT_CHECKPOINT_KEY"

#: The line that marks an elastic job's batch script: the watcher releases a departing node
#: from such a job instead of requeueing it (slurm_spot.lifecycle.watch).
ELASTIC_MARK = "# slurm-spot: elastic job (one job step per node)"
