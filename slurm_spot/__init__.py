"""slurm-spot: a Slurm cloud-burst partition of spot instances whose jobs survive interruptions."""

__version__ = "0.1.0"

__all__ = ["__version__"]
