"""Warm worker start for elastic torchrun agents: workers fork from a process that has already
imported torch and the training script's imports, instead of each starting as a new
``python -u SCRIPT`` that imports them again.

Why: every re-rendezvous (a node left, a replacement joined) restarts every worker, and a new
interpreter importing torch (2.4 s) and scikit-learn's datasets (1.9 s) on the idle 2-CPU test
machine, 6-9 s under load, was most of the training time an elastic job lost per interruption
(BENCHMARKS.md, "elastic-vs-requeue").

How (:func:`slurm_spot.jobs.injob.torchrun_agent.run_torchrun` with ``preload``): torchrun's launcher
is given a function entrypoint, :func:`run_script`, so torch starts the workers with
``multiprocessing`` (``MultiprocessContext``, torch/distributed/elastic/multiprocessing/api.py)
and start method ``forkserver``; the fork server (Python's ``multiprocessing.forkserver``) is
started before the first rendezvous with :mod:`slurm_spot.jobs.injob.warm_preload` as its preload,
which imports torch, torch.distributed and the script's own top-level imports
(:func:`preload_modules`). Each worker is then a fork of that server: no interpreter start, no
imports, for the first round and every restart.

The worker's side, :func:`run_script`, makes the fork look like ``python -u SCRIPT ARGS``:
``sys.argv``, ``sys.path[0]`` (the folder of the script's real path), an absolute
``__file__``, unbuffered stdout/stderr, default dispositions of the signals the fork server
ignores, no ``multiprocessing`` start method chosen yet, ``sys.exit()``/``sys.exit(0)`` ending
the worker successfully, an uncaught ``KeyboardInterrupt`` ending it by SIGINT, non-daemon
threads joined and ``atexit`` handlers run when the script returns (a fork-server child ends
with ``os._exit``, which would skip them).

What differs from ``python -u SCRIPT`` (why ``--no-preload`` exists):

- the preloaded modules are imported once, in the fork server, *before* any worker's
  environment is set: a module that reads ``RANK``, ``LOCAL_RANK``, ``MASTER_ADDR``,
  ``CUDA_VISIBLE_DEVICES`` etc. at import time sees the agent's environment, not the worker's,
  and one that initialises CUDA or starts threads at import makes forking unsafe;
- module-level state of those modules is shared by every restart (it is copied from the
  server, not rebuilt);
- stdin is ``/dev/null`` (the fork server closes it).
"""

from __future__ import annotations

import ast
import atexit
import builtins
import io
import multiprocessing
import os
import runpy
import signal
import sys
import threading
import traceback
import zipfile
from pathlib import Path

#: Imported in the fork server whatever the script imports: what every training worker under
#: torchrun needs, and the worker's entrypoint module.
BASE_PRELOAD = ("torch", "torch.distributed", "slurm_spot.jobs.injob.warm_worker")

#: Environment variable through which the agent tells :mod:`slurm_spot.jobs.injob.warm_preload` what
#: to import (comma-separated module names); the fork server removes it once read.
PRELOAD_ENV = "SLURM_SPOT_WARM_PRELOAD"

#: Environment variable with the agent's process id, for the fork server (see
#: :func:`exit_with_parent`).
AGENT_ENV = "SLURM_SPOT_WARM_AGENT"

#: Environment variable with the folder the fork server puts first on ``sys.path`` before it
#: preloads (the script's, :func:`script_folder`): the workers' ``sys.path[0]``, not the
#: agent's (its working directory under ``python -m``), whose modules would shadow installed
#: ones of the same name for the preloaded imports only.
PATH0_ENV = "SLURM_SPOT_WARM_PATH0"


def exit_with_parent(parent: int) -> None:
    """Have the kernel SIGKILL this process when its parent ends (``prctl(PR_SET_PDEATHSIG,
    SIGKILL)``, prctl(2); Linux only, elsewhere nothing happens); exit now if the parent is
    no longer ``parent`` (it ended before the request was made). ``parent`` 0: no check."""
    if not sys.platform.startswith("linux"):
        return
    import ctypes

    pr_set_pdeathsig = 1  # linux/prctl.h
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(pr_set_pdeathsig, int(signal.SIGKILL), 0, 0, 0) != 0:
        return
    if parent and os.getppid() != parent:
        os._exit(0)


def script_imports(script: str | Path) -> list[str]:
    """The absolute modules ``script`` imports at module level, in order, without duplicates:
    ``import a.b`` -> ``a.b``, ``from a.b import c`` -> ``a.b`` and ``a.b.c`` (``c`` may be
    a submodule, or a name: :func:`preload` skips a module that does not exist). Statements
    inside functions, classes, ``if``/``try`` blocks are not looked at (they may be
    conditional: ``if TYPE_CHECKING:``, an optional dependency); relative imports
    (``from . import x``) and modules that live next to the script (``<dir>/<name>.py`` or a
    package ``<dir>/<name>/``, which the worker finds through ``sys.path[0]`` only) are left
    out, as is ``__future__``.

    Returns [] when the script cannot be read or parsed (the worker then reports the error as
    ``python SCRIPT`` would).
    """
    path = Path(script)
    try:
        tree = ast.parse(path.read_bytes(), filename=str(path))
    except (OSError, SyntaxError, ValueError):
        return []
    names: list[str] = []
    for node in tree.body:
        if isinstance(node, ast.Import):
            names += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.append(node.module)
            names += [f"{node.module}.{alias.name}" for alias in node.names if alias.name != "*"]
    folder = Path(script_folder(path))
    found: list[str] = []
    for name in names:
        top = name.split(".")[0]
        if (name in found or top == "__future__" or (folder / f"{top}.py").exists()
                or (folder / top).is_dir()):
            continue
        found.append(name)
    return found


def preload_modules(script: str | Path) -> list[str]:
    """What the fork server imports for ``script``: :data:`BASE_PRELOAD`, the imports of this
    process's ``__main__`` module (the agent's: a fork-server child runs it again as
    ``__mp_main__`` before the script, multiprocessing/spawn.py ``prepare``; preloading the
    module itself would make ``runpy`` warn in every worker), then :func:`script_imports`,
    without duplicates."""
    main_file = getattr(sys.modules.get("__main__"), "__file__", None)
    modules = list(BASE_PRELOAD)
    for name in [*(script_imports(main_file) if main_file else []), *script_imports(script)]:
        if name not in modules:
            modules.append(name)
    return modules


def preload(modules: list[str]) -> list[str]:
    """Import ``modules`` in this process (the fork server); a module whose import fails is
    skipped with a line on stderr (the worker imports it itself and fails as it would have),
    whatever the exception: Python's fork server skips only ``ImportError`` and dies of any
    other. A module that does not exist (``from a import name`` gives ``a.name``) is skipped
    silently. Returns the modules that failed, the missing ones too."""
    import importlib

    failed = []
    for name in modules:
        try:
            importlib.import_module(name)
        except ModuleNotFoundError as exc:
            failed.append(name)
            if exc.name != name:
                print(f"slurm-spot: preloading {name} failed ({type(exc).__name__}: {exc}); the "
                      "workers import it themselves", file=sys.stderr, flush=True)
        except BaseException as exc:  # a module may raise anything, even SystemExit
            failed.append(name)
            print(f"slurm-spot: preloading {name} failed ({type(exc).__name__}: {exc}); the "
                  "workers import it themselves", file=sys.stderr, flush=True)
    return failed


def run_script(reset_signals: str, script: str, *args: str) -> None:
    """A worker's entrypoint (in a fork of the fork server): run ``script`` with ``args`` as
    ``python -u SCRIPT ARGS`` would, in this process.

    ``reset_signals``: comma-separated signal numbers the agent made the fork server ignore
    (the preemption signal, SIGTERM, SIGHUP: Slurm sends them to every process of the job
    step, and the server must outlive its workers); they get their default action back here,
    as in a new process, until the script installs its own handlers.

    Exit: returns when the script ends normally or with ``sys.exit()``/``sys.exit(0)``/
    ``sys.exit(None)`` (torch's launcher reads that as success); ``sys.exit(N)`` and
    exceptions propagate (torch reports the worker failed with that exit code, 1 for an
    exception, as the subprocess start does; the traceback is printed on stderr first); an
    uncaught ``KeyboardInterrupt`` ends the worker by SIGINT, as the interpreter does;
    ``os._exit`` ends the process at once as always (the agent's warm context,
    :func:`slurm_spot.jobs.injob.torchrun_agent.launch_warm`, takes an exit 0 without a return
    value as success).
    """
    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        # The worker ends with the fork server through torch's parent-death signal, SIGINT
        # (torch/multiprocessing/spawn.py ``_wrap``); a job started in the background of a
        # non-interactive shell (``cmd &``, nohup) inherits SIGINT ignored (POSIX: exec keeps
        # SIG_IGN), and the worker ran on after its agent was killed. SIGKILL instead.
        exit_with_parent(os.getppid())
    for number in filter(None, reset_signals.split(",")):
        signal.signal(int(number), signal.SIG_DFL)
    # No start method chosen yet, as in a new interpreter: the fork server's child inherits
    # its parent's, and a script's own multiprocessing.set_start_method("spawn") (a common
    # line in training scripts) would raise "context has already been set".
    multiprocessing.set_start_method(None, force=True)  # type: ignore[arg-type]
    _unbuffered()
    sys.argv = [script, *args]
    folder = script_folder(script)
    if sys.path:
        sys.path[0] = folder
    else:
        sys.path.append(folder)
    interrupted = False
    try:
        _run_main(script)
    except SystemExit as exc:
        if exc.code is not None and exc.code != 0:
            raise
    except KeyboardInterrupt:
        # torch's worker wrapper (torch/multiprocessing/spawn.py ``_wrap``) swallows it and
        # the worker would exit 0: the job would look finished. Python ends a script that
        # raised it by SIGINT (exit -2 as torch reports it), as below.
        traceback.print_exc()
        interrupted = True
    except BaseException:
        # As the interpreter would: torch's process wrapper only writes it to an error file.
        traceback.print_exc()
        raise
    finally:
        _join_threads()
        atexit._run_exitfuncs()
        _flush()
    if interrupted:
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGINT)


def _run_main(script: str) -> None:
    """Run ``script`` as the ``__main__`` module, as ``python SCRIPT`` does: ``__file__`` and
    tracebacks name its absolute path (Python 3.9+), ``sys.argv[0]`` stays as typed
    (``runpy.run_path`` would set it to the path it is given), and the module stays
    ``sys.modules["__main__"]`` after the script returns (threads and ``atexit`` handlers
    that pickle the script's classes still find them). A folder or zip file with a
    ``__main__.py`` runs through ``runpy.run_path``, as the interpreter runs it.

    Raises what the script raises; OSError when it cannot be read, SyntaxError."""
    import importlib.machinery
    import types

    path = os.path.abspath(script)
    if not os.path.isfile(path) or zipfile.is_zipfile(path):
        runpy.run_path(script, run_name="__main__")
        return
    with io.open_code(path) as file:
        code = compile(file.read(), path, "exec", dont_inherit=True)
    main = types.ModuleType("__main__")
    main.__dict__.update(__file__=path, __cached__=None, __package__=None, __spec__=None,
                         __builtins__=builtins,
                         __loader__=importlib.machinery.SourceFileLoader("__main__", path))
    sys.modules["__main__"] = main
    exec(code, main.__dict__)


def script_folder(script: str | Path) -> str:
    """``sys.path[0]`` of ``python SCRIPT``: the folder of the script's real path (symlinks
    resolved, as CPython does: a script linked from elsewhere imports the modules next to its
    target, Python docs, "sys.path" initialization)."""
    return os.path.dirname(os.path.realpath(script))


def _unbuffered() -> None:
    """stdout and stderr as ``python -u`` has them: no buffer between a write and the file
    descriptor (torchrun starts workers with ``-u``; a line printed before ``os._exit`` must
    not be lost)."""
    for name in ("stdout", "stderr"):
        stream = getattr(sys, name)
        try:
            fd = stream.fileno()
        except (AttributeError, OSError, ValueError):
            continue  # no file descriptor (a redirect to an object): leave it
        stream.flush()
        raw = io.FileIO(fd, "w", closefd=False)
        setattr(sys, name, io.TextIOWrapper(raw, encoding=stream.encoding,  # type: ignore[arg-type]
                                            errors=stream.errors, write_through=True))


def _join_threads() -> None:
    """Wait for the script's non-daemon threads, as the interpreter does before ``atexit``."""
    current = threading.current_thread()
    for thread in threading.enumerate():
        if thread is not current and not thread.daemon and thread.is_alive():
            thread.join()


def _flush() -> None:
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (AttributeError, OSError, ValueError):
            pass


def start_fork_server(modules: list[str], ignore: list[int], folder: str | None = None) -> int:
    """Start Python's multiprocessing fork server now (``multiprocessing.forkserver.
    ensure_running``), preloading ``modules`` through :mod:`slurm_spot.jobs.injob.warm_preload`, with
    the signals ``ignore`` ignored in it (``SIG_IGN`` is kept across ``exec``; the handlers of
    this process are restored at once), and ``folder`` (the script's, where given) first on
    its ``sys.path`` while it imports, as the workers will have it. Its imports then overlap
    the first rendezvous. The
    server is killed when this process ends (:func:`exit_with_parent`). Must be called from
    the thread that outlives the workers (the kernel's parent-death signal follows the thread
    that started the server): the main thread. Returns the server's process id.

    Raises:
        OSError: the server could not be started.
    """
    import multiprocessing
    import multiprocessing.forkserver as forkserver

    multiprocessing.set_forkserver_preload(["slurm_spot.jobs.injob.warm_preload"])
    saved = {number: signal.signal(number, signal.SIG_IGN) for number in ignore}
    before = {name: os.environ.get(name) for name in (PRELOAD_ENV, AGENT_ENV, PATH0_ENV)}
    os.environ[PRELOAD_ENV] = ",".join(modules)
    os.environ[AGENT_ENV] = str(os.getpid())
    if folder is not None:
        os.environ[PATH0_ENV] = folder
    try:
        forkserver.ensure_running()
    finally:
        for number, handler in saved.items():
            signal.signal(number, handler)
        for name, value in before.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
    return int(forkserver._forkserver._forkserver_pid)  # type: ignore[attr-defined]
