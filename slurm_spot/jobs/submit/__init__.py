"""``slurm-spot sbatch``: run as the user at submission (the batch script, sbatch's options)."""
