"""Running a command at a terminal, as a user at a shell does: for output that differs on a
terminal (rich tables, spinners) from what a pipe gets."""

from __future__ import annotations

import os
import pty
import subprocess
from collections.abc import Collection

#: A terminal 160 columns wide and 40 lines high, as the tests' commands see it.
TERMINAL_ENV = {"COLUMNS": "160", "LINES": "40", "TERM": "xterm"}


def run_in_terminal(argv: list[str], timeout_s: float = 60,
                    on_terminal: Collection[str] = ("stdout", "stderr")) -> tuple[int, str, str]:
    """Run ``argv`` with the streams named in ``on_terminal`` (``stdout``, ``stderr``) on one
    pseudo-terminal and the other one, if any, on a pipe; the environment plus
    :data:`TERMINAL_ENV`.

    Returns (exit code, what the terminal showed, what the pipe got), both decoded as UTF-8
    with bad bytes replaced.

    Raises:
        subprocess.TimeoutExpired: the command had not exited ``timeout_s`` seconds after it
            closed the terminal.
    """
    controller, terminal = pty.openpty()
    proc = subprocess.Popen(
        argv, env={**os.environ, **TERMINAL_ENV},
        stdout=terminal if "stdout" in on_terminal else subprocess.PIPE,
        stderr=terminal if "stderr" in on_terminal else subprocess.PIPE)
    os.close(terminal)
    seen = b""
    while True:
        try:
            chunk = os.read(controller, 4096)
        except OSError:  # EIO: the child closed the terminal
            break
        if not chunk:
            break
        seen += chunk
    os.close(controller)
    out, err = proc.communicate(timeout=timeout_s)
    piped = (out or b"") + (err or b"")
    return proc.returncode, seen.decode(errors="replace"), piped.decode(errors="replace")
