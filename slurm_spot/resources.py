"""Files slurm-spot ships besides its modules: the jinja2 templates and the example training
script, found one way whether slurm-spot runs from a wheel, an editable install or a source
checkout (``PYTHONPATH=<checkout> python -m slurm_spot``).

They live in the top-level ``templates/`` and ``examples/`` folders of the repository; the
package sees them as ``slurm_spot/templates`` and ``slurm_spot/examples`` (symlinks in the
checkout, real folders in a wheel, which setuptools fills through the symlinks). Nothing here
reads a file at import time.
"""

from __future__ import annotations

from importlib import resources
from importlib.resources.abc import Traversable
from pathlib import Path


def templates() -> Traversable:
    """The folder of the jinja2 templates (``templates/`` of the repository)."""
    return resources.files("slurm_spot").joinpath("templates")


def example(name: str = "train_digits.py") -> Path:
    """The path of example file ``name`` (``examples/<name>`` of the repository), as a real
    file path a job script can run (the package is never imported from a zip)."""
    return Path(str(resources.files("slurm_spot").joinpath("examples", name)))
