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
and start method ``forkserver``. The fork server (Python's ``multiprocessing.forkserver``) is a
fork of the agent itself (:func:`fork_fork_server`), taken before the first rendezvous, once
the agent has imported torch and torch.distributed.run and before it starts any thread: it
inherits those modules, imports the script's own top-level imports (:func:`preload_modules`)
while the agent forms the rendezvous, and serves the workers. Each worker is then a fork of
that server: the node starts one interpreter and imports torch once (issue 26, "One Python
start per node"), for the first round and every restart. Where the agent cannot be forked
safely (another Python thread runs in it) or this Python's ``multiprocessing.forkserver``
differs from the one :func:`fork_fork_server` knows, the server is started as Python starts
it, a new interpreter with :mod:`slurm_spot.jobs.injob.warm_preload` as its preload
(:func:`start_fork_server`), which imports torch again; the agent's log line says which.

The worker's side, :func:`run_script`, makes the fork look like ``python -u SCRIPT ARGS``:
``sys.argv``, ``sys.path[0]`` (the folder of the script's real path), an absolute
``__file__``, unbuffered stdout/stderr, default dispositions of the signals the fork server
ignores, no ``multiprocessing`` start method chosen yet, ``sys.exit()``/``sys.exit(0)`` ending
the worker successfully, an uncaught ``KeyboardInterrupt`` ending it by SIGINT, non-daemon
threads joined and ``atexit`` handlers run when the script returns (a fork-server child ends
with ``os._exit``, which would skip them).

What differs from ``python -u SCRIPT`` (why ``--no-preload`` exists):

- the preloaded modules are imported once, in the fork server (never in the agent), *before*
  any worker's environment is set: a module that reads ``RANK``, ``LOCAL_RANK``, ``MASTER_ADDR``,
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
from typing import Any

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
    multiprocessing.set_start_method(None, force=True)
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
        setattr(sys, name, io.TextIOWrapper(raw, encoding=stream.encoding,
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


class ForkUnavailable(RuntimeError):
    """The fork server cannot be forked from this process (why, in the message): the caller
    starts it as a new interpreter instead (:func:`start_fork_server`)."""


#: Keyword parameters of ``multiprocessing.forkserver.main`` this module knows how to fill
#: (CPython 3.11-3.13: ``main_path``, ``sys_path``; 3.14 adds ``authkey_r``, the read end of
#: a pipe with the key the clients' connections are checked with, gh-97514).
_KNOWN_MAIN_PARAMS = ("listener_fd", "alive_r", "preload", "main_path", "sys_path", "authkey_r")


def _fork_unsupported() -> str | None:
    """Why this Python's ``multiprocessing.forkserver`` cannot be forked into (None: it
    can): its ``main`` takes parameters this module does not know, or its ``ForkServer``
    lacks the attributes the clients read (CPython's Lib/multiprocessing/forkserver.py)."""
    import inspect
    import multiprocessing.forkserver as forkserver

    try:
        params = inspect.signature(forkserver.main).parameters
    except (AttributeError, TypeError, ValueError) as exc:
        return f"multiprocessing.forkserver.main: {exc}"
    names = list(params)
    if names[:3] != ["listener_fd", "alive_r", "preload"]:
        return f"multiprocessing.forkserver.main takes {names}"
    unknown = [n for n, p in params.items() if n not in _KNOWN_MAIN_PARAMS
               and p.default is inspect.Parameter.empty
               and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]
    if unknown:
        return f"multiprocessing.forkserver.main needs {unknown}"
    server = getattr(forkserver, "_forkserver", None)
    wanted = ["_forkserver_address", "_forkserver_alive_fd", "_forkserver_pid"]
    if "authkey_r" in params:
        wanted.append("_forkserver_authkey")
    missing = [a for a in wanted if not hasattr(server, a)]
    if missing:
        return f"multiprocessing.forkserver._forkserver has no {', '.join(missing)}"
    if server._forkserver_pid is not None:  # type: ignore[union-attr]
        return "a fork server is already running"
    return None


def fork_fork_server(modules: list[str], ignore: list[int], folder: str) -> int:
    """Make a fork of this process (the agent) Python's multiprocessing fork server, so that
    the node starts one interpreter and imports torch once: the fork has every module this
    process imported (torch, torch.distributed.run), imports ``modules`` not imported yet
    (the script's top-level imports, with ``folder``, the script's, first on ``sys.path``, as
    the workers will have it: :func:`preload`, failures skipped), and runs
    ``multiprocessing.forkserver.main``; this process then connects to it as to a server of
    its own (``multiprocessing.forkserver._forkserver``'s address, alive pipe, process id
    and, on Pythons that have it, authentication key: CPython's Lib/multiprocessing/
    forkserver.py ``ensure_running``, which is what it replaces). The script's modules are
    imported in the fork only, never in this process: one that reads ``RANK`` or starts
    threads or CUDA at import (see the module docstring) affects the server and its workers,
    as before, but not the agent.

    The fork is what a new fork-server interpreter would be: the signals ``ignore`` ignored,
    every other signal with a Python handler of this process back at its default action
    (``SIGINT``: Python's ``default_int_handler``, or ignored if this process inherited it
    ignored), multiprocessing's finalizers of this process dropped, stdin closed (by
    ``main``), killed when this process ends (:func:`exit_with_parent`), ending with
    ``os._exit`` (this process's ``atexit`` handlers are not its own). Its command line and
    ``/proc/PID/exe`` are this process's: it never runs ``exec``.

    Must be called from the main thread (the parent-death signal follows the thread that
    forks) before any other Python thread is started (forking a process whose other threads
    hold locks can deadlock the child); native threads of libraries (OpenBLAS's pool, which
    numpy starts at import) are fork-safe by their own ``pthread_atfork`` handlers, as in any
    fork server that imported them. Returns the server's process id.

    Raises:
        ForkUnavailable: another Python thread runs, a fork server is already running, or
            this Python's ``multiprocessing.forkserver`` differs from the one described
            (:func:`_fork_unsupported`); nothing was started.
        OSError: the socket, pipes or fork failed.
    """
    import multiprocessing.forkserver as forkserver
    import socket
    from multiprocessing import connection, resource_tracker, util

    if threading.current_thread() is not threading.main_thread():
        raise ForkUnavailable("not called from the main thread")
    if threading.active_count() != 1:
        names = [t.name for t in threading.enumerate() if t is not threading.current_thread()]
        raise ForkUnavailable(f"other Python threads run: {', '.join(names)}")
    reason = _fork_unsupported()
    if reason:
        raise ForkUnavailable(reason)
    import inspect

    # Private attributes (the clients read them; typeshed does not list them).
    server: Any = forkserver._forkserver
    with_key = "authkey_r" in inspect.signature(forkserver.main).parameters
    resource_tracker.ensure_running()  # as ensure_running: its fd goes to every worker
    listener = socket.socket(socket.AF_UNIX)
    try:
        address = connection.arbitrary_address("AF_UNIX")  # type: ignore[attr-defined]
        listener.bind(address)
        if not util.is_abstract_socket_namespace(address):
            os.chmod(address, 0o600)
        listener.listen()
        alive_r, alive_w = os.pipe()
        authkey = os.urandom(32) if with_key else b""
        key_r = -1
        if with_key:
            key_r, key_w = os.pipe()
            os.write(key_w, authkey)  # 32 bytes: fits an empty pipe's buffer
            os.close(key_w)
        agent = os.getpid()
        _flush()
        pid = os.fork()
    except BaseException:
        listener.close()
        raise
    if pid == 0:
        _serve_forked(listener, alive_r, alive_w, key_r, agent, modules, ignore, folder)
    os.close(alive_r)
    if with_key:
        os.close(key_r)
    listener.close()
    server._forkserver_address = address
    server._forkserver_alive_fd = alive_w
    server._forkserver_pid = pid
    if with_key:
        server._forkserver_authkey = authkey
    return pid


def _serve_forked(listener: object, alive_r: int, alive_w: int, key_r: int, agent: int,
                  modules: list[str], ignore: list[int], folder: str) -> None:
    """The forked fork server's life (:func:`fork_fork_server`); never returns."""
    code = 1
    try:
        import multiprocessing.forkserver as forkserver
        from multiprocessing import util

        os.close(alive_w)  # the agent's: EOF on alive_r once the agent and workers are gone
        exit_with_parent(agent)
        util._finalizer_registry.clear()  # type: ignore[attr-defined]
        util._run_after_forkers()  # type: ignore[attr-defined]
        default_int = signal.default_int_handler
        for number in signal.valid_signals():
            handler = signal.getsignal(number)
            if callable(handler) and handler is not default_int:
                signal.signal(number, signal.SIG_DFL)
        for ignored in ignore:
            signal.signal(ignored, signal.SIG_IGN)
        if sys.path:
            sys.path[0] = folder
        else:
            sys.path.append(folder)
        preload([m for m in modules if m not in sys.modules])
        fd = listener.detach()  # type: ignore[attr-defined]
        keys = {"authkey_r": key_r} if key_r >= 0 else {}
        serve: Any = forkserver.main  # authkey_r: not in every Python's (nor typeshed's)
        serve(fd, alive_r, [], **keys)
        code = 0
    except SystemExit as exc:  # main's way out: every client (agent, workers) is gone
        code = exc.code if isinstance(exc.code, int) else 0
    except BaseException:
        traceback.print_exc()
    finally:
        _flush()
        os._exit(code)


def start_fork_server(modules: list[str], ignore: list[int], folder: str | None = None) -> int:
    """The fallback of :func:`fork_fork_server` (a second interpreter, which imports torch
    again): start Python's multiprocessing fork server now (``multiprocessing.forkserver.
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
