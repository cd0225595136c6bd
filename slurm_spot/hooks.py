"""Entry points of the ``slurm-spot-*`` executables that slurm.conf points at.

slurmctld (power saving) and slurmd (Prolog/Epilog/TaskProlog) run them with an almost empty
environment, so each is installed with an absolute interpreter path, and the config is found
through ``SLURM_CONF`` (see :func:`slurm_spot.config.config_path`). They are the package's
``console_scripts`` (pyproject.toml): :func:`resume`, :func:`suspend`, :func:`resume_fail`,
:func:`prolog`, :func:`task_prolog`, :func:`epilog`, and :func:`prolog_slurmctld` (the
PrologSlurmctld, :mod:`slurm_spot.lifecycle.bootwait`).

A hook is started for every resume and suspend and, on every compute node, for every job
(Prolog, Epilog) and every task (TaskProlog), so it imports only what it runs: the config,
the one service, and neither click, rich, jinja2, prometheus_client, a cloud SDK nor torch;
its config comes from the validated-config cache (:mod:`slurm_spot.config.cache`) when
spot.yaml's bytes are those validated before, so pydantic is not imported either.
The form Slurm uses (``slurm-spot-resume HOSTLIST``, ``slurm-spot-task-prolog``) runs here
directly; any other argument list (``--json``, ``--config F``, ``--help``) goes to the full
command line, ``slurm-spot <hook> ...``, which behaves the same.

Exit codes as on the command line: 0 done, 1 an operation failed, 2 bad input (message on
stderr naming what is wrong). The power hooks detach (:func:`run_detached`): slurmctld gets
its answer once the input is validated, and the work goes on in a detached process that logs
to ``<log_dir>/hooks.log``.
"""

from __future__ import annotations

import logging
import os
import shutil
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING

from slurm_spot.errors import BadInputError, SlurmSpotError
from slurm_spot.rawtext import use_escaped_output

if TYPE_CHECKING:
    from slurm_spot.config import SpotConfig
    from slurm_spot.lifecycle.power import PowerResult

log = logging.getLogger("slurm_spot.hooks")

POWER_HOOKS = ("resume", "suspend", "resume-fail")
JOB_HOOKS = ("prolog", "task-prolog", "epilog")
CTLD_HOOKS = ("prolog-slurmctld",)


def main(name: str, argv: list[str] | None = None) -> int:
    """Run hook ``name`` (one of :data:`POWER_HOOKS`, :data:`JOB_HOOKS` or
    :data:`CTLD_HOOKS`) with the process arguments; power hooks detach. Returns the exit
    code."""
    args = list(sys.argv[1:] if argv is None else argv)
    plain = (len(args) == 1 and not args[0].startswith("-")) if name in POWER_HOOKS else not args
    if not plain or os.environ.get("SLURM_SPOT_VERBOSE"):
        return _full_cli(name, args)
    if name in CTLD_HOOKS:  # always exits 0: a failing PrologSlurmctld requeues the job
        from slurm_spot.lifecycle import bootwait

        return bootwait.main()
    logging.basicConfig(level=logging.WARNING,
                        format="%(asctime)s %(name)s %(levelname)s %(message)s")
    use_escaped_output()  # a job's invalid UTF-8 byte is logged as \xff, never a traceback
    # pydantic looks up plugins through every installed distribution's entry points on its
    # first model (~20 ms); a hook uses none.
    os.environ.setdefault("PYDANTIC_DISABLE_PLUGINS", "__all__")
    _skip_plugin_loader()
    try:
        # spot.yaml as validated by an earlier hook when its bytes are unchanged: no pydantic
        from slurm_spot.config.cache import as_model, load_hook_config

        config = load_hook_config(None)
        if name in POWER_HOOKS:
            hostlist = args[0]
            jobs = _resume_jobs() if name == "resume" else None  # gone once the hook returns
            run_detached(config, name, hostlist,
                         lambda: power_action(as_model(config), name, hostlist, jobs)())
        else:
            for line in job_hook_lines(name, config, os.environ):
                print(line)
    except BadInputError as exc:
        print(f"slurm-spot: error: {exc}", file=sys.stderr)
        return 2
    except SlurmSpotError as exc:
        print(f"slurm-spot: failed: {exc}", file=sys.stderr)
        return 1
    return 0


def _skip_plugin_loader() -> None:
    """Spare a hook pydantic's plugin loader while plugins are disabled.

    pydantic asks ``pydantic.plugin._loader.get_plugins()`` when it builds its first model
    class, and that module imports ``importlib.metadata`` (and with it ``email``, ``zipfile``,
    ``csv`` ...) before it reads ``PYDANTIC_DISABLE_PLUGINS``: ~0.05 s of CPU, a sixth of a
    job hook's, to learn that there are no plugins. With ``PYDANTIC_DISABLE_PLUGINS=__all__``
    (set just above unless the admin set it otherwise) ``get_plugins()`` returns ``()``, so
    this puts a module answering exactly that in its place before pydantic is imported
    (pydantic 2's ``plugin/_schema_validator.py`` imports nothing else from it). Plugins are
    documented in pydantic's "Plugins" concept page (``PYDANTIC_DISABLE_PLUGINS``).
    """
    import types

    if os.environ.get("PYDANTIC_DISABLE_PLUGINS") != "__all__" or "pydantic" in sys.modules:
        return
    stub = types.ModuleType("pydantic.plugin._loader", "no plugins: PYDANTIC_DISABLE_PLUGINS")
    stub.get_plugins = lambda: ()  # type: ignore[attr-defined]
    sys.modules.setdefault("pydantic.plugin._loader", stub)


def _entry_point(name: str, doc: str, returns: str = "Returns the exit code.") -> Callable[[], int]:
    """The ``console_scripts`` function (pyproject.toml) of hook ``name``: ``main(name)``
    with the process arguments, returning the exit code; its docstring is ``doc`` and
    ``returns``."""
    def entry_point() -> int:
        return main(name)

    entry_point.__name__ = entry_point.__qualname__ = name.replace("-", "_")
    entry_point.__doc__ = f"{doc} {returns}"
    return entry_point


resume = _entry_point("resume", "``slurm-spot-resume HOSTLIST`` (ResumeProgram).")
suspend = _entry_point("suspend", "``slurm-spot-suspend HOSTLIST`` (SuspendProgram).")
resume_fail = _entry_point("resume-fail",
                           "``slurm-spot-resume-fail HOSTLIST`` (ResumeFailProgram).")
prolog = _entry_point("prolog", "``slurm-spot-prolog`` (Prolog, as root on the node).")
task_prolog = _entry_point("task-prolog",
                           "``slurm-spot-task-prolog`` (TaskProlog: prints ``export`` lines).")
epilog = _entry_point("epilog", "``slurm-spot-epilog`` (Epilog, as root on the node).")
prolog_slurmctld = _entry_point(
    "prolog-slurmctld", "``slurm-spot-prolog-slurmctld`` (PrologSlurmctld, on the slurmctld "
    "host): wait until the job's powered-up nodes registered "
    "(:mod:`slurm_spot.lifecycle.bootwait`).", returns="Always returns 0.")


def _full_cli(name: str, args: list[str]) -> int:
    from slurm_spot.cli import main as cli_main

    command = [name, *args]
    if name in POWER_HOOKS:
        command.append("--detach")
    try:
        cli_main(command)
    except SystemExit as exc:
        return int(exc.code or 0) if not isinstance(exc.code, str) else 1
    return 0


def _resume_jobs() -> dict[int, tuple[str, ...]] | None:
    """``SLURM_RESUME_FILE``'s jobs (read in the hook's own process, while the file exists)."""
    from slurm_spot.slurm.resume_file import read_resume_file

    return read_resume_file()


def power_action(config: SpotConfig, name: str, hostlist: str,
                 jobs: Mapping[int, Sequence[str]] | None = None) -> Callable[[], PowerResult]:
    """The work of power hook ``name`` on ``hostlist``, to be called (in the worker).
    ``jobs``: job id -> its nodes, from ``SLURM_RESUME_FILE`` (all-or-nothing per job, and
    the jobs a failover moves: :mod:`slurm_spot.lifecycle.failover`)."""
    from slurm_spot.lifecycle import power
    from slurm_spot.slurm.client import SlurmClient

    if name == "resume":
        from slurm_spot.lifecycle.failover import resume_and_fail_over

        return lambda: resume_and_fail_over(config, hostlist, SlurmClient(config.slurm_bin_dir),
                                            jobs)
    if name == "suspend":
        return lambda: power.suspend(config, hostlist)
    return lambda: power.resume_fail(config, hostlist)


def job_hook_lines(name: str, config: SpotConfig, env: Mapping[str, str]) -> list[str]:
    """Run job hook ``name`` (``prolog``, ``task-prolog``, ``epilog``); returns its stdout
    lines (for the TaskProlog: the ``export NAME=value`` lines slurmd adds to the task).

    Raises:
        BadInputError: the job environment is unusable (prolog, task-prolog; see
            :mod:`slurm_spot.jobs.node.prolog`). The epilog never raises: a failing Epilog drains
            the node (slurm.conf(5)); its problem goes to stderr.
    """
    from slurm_spot.jobs.node import prolog as job_prolog

    if name == "prolog":
        return [f"checkpoint directory {job_prolog.prepare_checkpoint_dir(config, env)}"]
    if name == "task-prolog":
        return job_prolog.task_prolog_lines(config, env)
    try:
        job_prolog.epilog(config, env)
    except SlurmSpotError as exc:
        print(f"slurm-spot epilog: {exc}", file=sys.stderr)
    return []


def run_detached(config: SpotConfig, name: str, hostlist: str,
                 action: Callable[[], PowerResult]) -> None:
    """Validate ``hostlist`` (:class:`BadInputError`, exit 2, before anything is done), keep
    ``SLURM_RESUME_FILE`` for a resume, then return in this process while a detached worker
    runs ``action`` and logs its outcome to ``<log_dir>/hooks.log``. Never returns in the
    worker."""
    from slurm_spot.hostlist import group_by_node_set

    group_by_node_set(config, hostlist)  # imports no provider: the worker does
    if name == "resume":
        keep_resume_file(config)
    if not detach(config, name):
        return
    log.info("%s %s", name, hostlist)
    try:
        result = action()
    except Exception:  # the worker has no caller to tell: log it, never a silent death
        log.exception("%s %s failed", name, hostlist)
        _worker_exit()
    for failure in result.failed:
        log.warning("%s: %s", ",".join(failure.nodes), failure.reason)
    for error in result.errors:
        log.error("%s", error)
    log.info("%s %s done: %d launched, %d terminated, %d failed", name, hostlist,
             len(result.launched), len(result.terminated), len(result.failed))
    _worker_exit()


def _worker_exit() -> None:
    logging.shutdown()  # os._exit skips flushing: without this hooks.log stays empty
    sys.stderr.flush()
    os._exit(0)


def detach(config: SpotConfig, name: str) -> bool:
    """Fork a detached worker (double fork, own session, stdio to ``<log_dir>/hooks.log``).
    True in the worker, False in the parent (which should return)."""
    config.log_dir.mkdir(parents=True, exist_ok=True)
    if os.fork() > 0:
        return False
    os.setsid()
    if os.fork() > 0:
        os._exit(0)
    log_fd = os.open(config.log_dir / "hooks.log", os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    null_fd = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null_fd, 0)
    os.dup2(log_fd, 1)
    os.dup2(log_fd, 2)
    logging.basicConfig(level=logging.INFO, force=True, stream=sys.stderr,
                        format=f"%(asctime)s {name}[%(process)d] %(levelname)s %(message)s")
    return True


def keep_resume_file(config: SpotConfig) -> None:
    """Copy ``SLURM_RESUME_FILE`` (JSON of the jobs behind a resume, a /proc fd path that
    vanishes with the hook) to ``<log_dir>/resume-files/``; a failure is only logged."""
    source = os.environ.get("SLURM_RESUME_FILE")
    if not source:
        return
    target = config.log_dir / "resume-files" / f"resume-{time.time():.3f}-{os.getpid()}.json"
    target.parent.mkdir(parents=True, exist_ok=True)
    try:
        shutil.copyfile(source, target)
    except OSError as exc:
        log.warning("could not copy SLURM_RESUME_FILE %s: %s", source, exc)
