"""Progress on the waits longer than a few seconds (``local up``, ``node-name --wait``,
``demo``): a rich spinner with the current step and the elapsed time when the stream is a
terminal, nothing or plain lines when it is a pipe or a file. The spinner goes to stderr
(or to stdout only where stdout carries the same lines anyway), never into ``--json`` output.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import IO, Any


def stream_is_terminal(stream: IO[str]) -> bool:
    """Whether ``stream`` is a terminal (False for a pipe, a file, a closed stream)."""
    try:
        return stream.isatty()
    except (AttributeError, ValueError):
        return False


class Waiter:
    """What a waiting command reports: ``step`` (the spinner's text, or a plain line when
    ``echo`` is given off a terminal) and ``line`` (a line printed for good, above the spinner
    on a terminal)."""

    def __init__(self, progress: Any = None, task: Any = None,
                 echo: Callable[[str], None] | None = None) -> None:
        self._progress = progress
        self._task = task
        self._echo = echo

    @property
    def live(self) -> bool:
        """True when a spinner is shown."""
        return self._progress is not None

    def step(self, text: str) -> None:
        """The current step (``starting slurmctld``)."""
        if self._progress is not None:
            self._progress.update(self._task, description=text)
        elif self._echo is not None:
            self._echo(text)

    def line(self, text: str) -> None:
        """A line of output that stays."""
        if self._progress is not None:
            self._progress.console.print(text, markup=False, highlight=False, soft_wrap=True)
        elif self._echo is not None:
            self._echo(text)


@contextmanager
def waiting(description: str, err: bool = True,
            echo: Callable[[str], None] | None = None) -> Iterator[Waiter]:
    """A spinner with ``description`` and the elapsed time on stderr (``err``) or stdout,
    when that stream is a terminal; off a terminal, the :class:`Waiter` passes steps and
    lines to ``echo`` (None: says nothing). The spinner disappears when the block ends."""
    stream = sys.stderr if err else sys.stdout
    if not stream_is_terminal(stream):
        yield Waiter(echo=echo)
        return
    from rich.console import Console
    from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

    with Progress(SpinnerColumn(), TextColumn("{task.description}"), TimeElapsedColumn(),
                  console=Console(file=stream), transient=True) as progress:
        yield Waiter(progress, progress.add_task(description, total=None))

