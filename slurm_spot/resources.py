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

import jinja2


def templates() -> Traversable:
    """The folder of the jinja2 templates (``templates/`` of the repository)."""
    return resources.files("slurm_spot").joinpath("templates")


def example(name: str = "train_digits.py") -> Path:
    """The path of example file ``name`` (``examples/<name>`` of the repository), as a real
    file path a job script can run (the package is never imported from a zip)."""
    return Path(str(resources.files("slurm_spot").joinpath("examples", name)))


def template_env() -> jinja2.Environment:
    """The jinja2 environment over the shipped templates (:func:`slurm_spot.resources.templates`).
    Undefined variables are errors; ``comment`` prefixes each line with ``# `` (the name and
    meaning of Ansible's filter, so the systemd unit templates render in both)."""
    folder = templates()
    env = jinja2.Environment(
        loader=jinja2.FunctionLoader(lambda name: folder.joinpath(name).read_text()),
        undefined=jinja2.StrictUndefined,
        keep_trailing_newline=True,
        autoescape=False,
    )
    env.filters["comment"] = lambda text: "\n".join(
        f"# {line}".rstrip() for line in str(text).splitlines())
    env.filters["dirname"] = lambda path: str(Path(str(path)).parent)
    return env


def render_template(name: str, **context: object) -> str:
    """Render template ``name`` (``templates/<name>``) with ``context``: every file slurm-spot
    generates from a template goes through here.

    Raises:
        jinja2.UndefinedError: the template uses a variable ``context`` lacks (a bug).
    """
    return template_env().get_template(name).render(**context)
