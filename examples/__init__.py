"""The demo's training script and example configs, shipped in the wheel as
``slurm_spot.examples`` so that ``slurm-spot demo`` runs from an installed package too."""
