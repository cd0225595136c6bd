"""``python -m slurm_spot`` runs the same command line as ``slurm-spot``."""

from slurm_spot.cli import main

if __name__ == "__main__":
    main()
