"""A real Slurm cluster on this machine whose cloud nodes are ``local`` provider instances.

``slurm-spot local up`` starts munge (if it is not running), slurmctld with a rendered
``slurm.conf`` + ``slurm-spot.conf`` fragment, and the reconciler, as a controller's units
would; slurmctld itself then powers nodes up and down through the slurm-spot hooks. It installs
nothing: Slurm and munge come from the distribution (``apt-get install slurm-wlm munge``).
``local down`` stops everything it started and every instance.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import yaml

from slurm_spot.config import LocalProviderConfig, SpotConfig, load_config
from slurm_spot.errors import BadInputError, ConfigError, SlurmCommandError, SlurmSpotError
from slurm_spot.localcluster import accounting as dbd
from slurm_spot.localcluster.daemons import Under, socket_answers, terminate
from slurm_spot.render import render, slurm_version, write_rendered
from slurm_spot.resources import render_template
from slurm_spot.slurm.client import CommandResult, SlurmClient, run_command
from slurm_spot.slurm.version import SlurmVersion

MANAGED_MARK = "Managed by slurm-spot"
MUNGE_SOCKET = Path("/run/munge/munge.socket.2")
LOCAL_REQUEUE_DELAY_S = 1
#: SchedulerParameters=batch_sched_delay for the local cluster (seconds; Slurm's default is 3):
#: slurmctld's event-triggered scheduling of batch jobs (a requeued job released with
#: StartTime=now) waits until this long after its previous scheduling pass (slurm.conf(5)
#: 22.05; docs/admin.md, "Recovery speed").
LOCAL_BATCH_SCHED_DELAY_S = 0


@dataclass(frozen=True)
class LocalClusterPaths:
    """Files of one local cluster: ``conf_dir`` holds slurm.conf, slurm-spot.conf, gres.conf
    and spot.yaml; ``state`` is the JSON record of what ``local up`` started."""

    conf_dir: Path
    state_dir: Path
    slurm_conf = Under("conf_dir", "slurm.conf")
    spot_yaml = Under("conf_dir", "spot.yaml")
    record = Under("state_dir", "local/cluster.json")


def _run(argv: list[str], timeout_s: float = 30) -> CommandResult:
    try:
        return run_command(argv, timeout_s)
    except SlurmCommandError:
        if shutil.which(argv[0]) is None:
            raise SlurmSpotError(
                f"{argv[0]} is not installed: apt-get install slurm-wlm munge (see README)"
            ) from None
        raise


def _munge_running() -> bool:
    return socket_answers(MUNGE_SOCKET)


def start_munge() -> int | None:
    """Start munged as user munge unless one answers. Returns its pid if started here."""
    if _munge_running():
        return None
    MUNGE_SOCKET.parent.mkdir(parents=True, exist_ok=True)
    _run(["chown", "munge:munge", str(MUNGE_SOCKET.parent)])
    result = _run(["runuser", "-u", "munge", "--", "munged"])
    if result.returncode != 0:
        raise SlurmSpotError(f"munged did not start: {result.stderr.strip()}")
    for _ in range(50):
        if _munge_running():
            pid_file = Path("/run/munge/munged.pid")
            return int(pid_file.read_text()) if pid_file.exists() else None
        time.sleep(0.1)
    raise SlurmSpotError("munged started but its socket does not answer")


def write_cluster_files(config: SpotConfig, paths: LocalClusterPaths,
                        dbd_port: int | None = None) -> None:
    """Render slurm.conf (a full one for the local cluster), the fragment and gres.conf;
    with ``dbd_port``, accounting goes to the slurmdbd listening there.

    Raises:
        BadInputError: ``slurm.conf`` exists and was not written by slurm-spot.
    """
    if paths.slurm_conf.exists() and MANAGED_MARK not in paths.slurm_conf.read_text()[:200]:
        raise BadInputError(
            f"{paths.slurm_conf} exists and is not managed by slurm-spot; refusing to overwrite "
            "it. Use --conf-dir to put the local cluster elsewhere."
        )
    local = next(
        (p for p in config.providers.values() if isinstance(p, LocalProviderConfig)),
        LocalProviderConfig(),
    )
    version = slurm_version()
    state_save = state_save_dir(config, version)
    for folder in (state_save, config.state_dir / "slurmd", config.log_dir):
        folder.mkdir(parents=True, exist_ok=True)
    write_rendered(render(config, version=version), paths.conf_dir)
    text = render_template("slurm.conf.j2",
        version=_version(), cluster=config.cluster, slurmctld_port=6817,
        state_dir=config.state_dir, state_save=state_save, log_dir=config.log_dir,
        # 25.11+: a requeued job is eligible after this many seconds instead of ~121 s
        # (slurm.conf(5) 26.05, SchedulerParameters=requeue_delay).
        requeue_delay_s=LOCAL_REQUEUE_DELAY_S if version and version.requeue_delay else None,
        batch_sched_delay_s=LOCAL_BATCH_SCHED_DELAY_S,
        kill_wait_s=local.kill_wait_s, slurmd_timeout_s=local.slurmd_timeout_s,
        fragment=paths.conf_dir / "slurm-spot.conf", dbd_port=dbd_port,
    )
    paths.slurm_conf.write_text(text)


def state_save_dir(config: SpotConfig, version: SlurmVersion | None) -> Path:
    """slurmctld's StateSaveLocation for the installed Slurm: one directory per Slurm series
    (``<state_dir>/slurmctld-24.11``), so a cluster brought up under another Slurm starts
    from a clean state of its own. slurmctld refuses the state of another release at start:
    24.11.5 on a 22.05 directory exits with "fatal: Can not recover assoc_usage state,
    incompatible version" (docs/slurm-versions.md)."""
    series = f"{version.series[0]}.{version.series[1]:02d}" if version else "unknown"
    return config.state_dir / f"slurmctld-{series}"


def _version() -> str:
    from slurm_spot import __version__

    return __version__


def up(config: SpotConfig, conf_dir: Path, keep_state: bool = False,
       reconcile: bool = True, accounting: bool | None = None,
       on_step: Callable[[str], None] = lambda _step: None) -> dict[str, object]:
    """Start the local cluster (see the module docstring). Returns the record it writes.

    ``accounting``: run a private MariaDB server and slurmdbd so ``sacct`` works
    (:mod:`.accounting`); None means "if mariadb-server and slurmdbd are installed".
    ``on_step`` is told each step as it starts (``starting slurmctld``), for progress.

    Raises:
        SlurmSpotError: Slurm or munge is missing, accounting is asked for but not installed,
            or a daemon does not answer in time.
        BadInputError: see :func:`write_cluster_files`.
    """
    paths = LocalClusterPaths(conf_dir, config.state_dir)
    if paths.record.exists() and _alive(_read_record(paths).get("slurmctld_pid")):
        raise BadInputError(
            f"a local cluster is already up ({paths.record}); run 'slurm-spot local down' first")
    if accounting is None:
        accounting = dbd.available()
    elif accounting and not dbd.available():
        raise SlurmSpotError("accounting needs MariaDB and slurmdbd: apt-get install "
                             "mariadb-server slurmdbd (make setup does)")
    conf_dir.mkdir(parents=True, exist_ok=True)
    write_cluster_files(config, paths, dbd.DBD_PORT if accounting else None)
    on_step("starting munge")
    munge_pid = start_munge()
    record: dict[str, object] = {}
    try:
        return _start(config, paths, munge_pid, keep_state, reconcile, accounting, record,
                      on_step)
    except BaseException:
        _undo_failed_up(config, paths, munge_pid, record)
        raise


def _undo_failed_up(config: SpotConfig, paths: LocalClusterPaths, munge_pid: int | None,
                    record: dict[str, object]) -> None:
    """A failed ``up`` leaves nothing running: the slurmctld of this cluster (found by its pid
    file and its ``-f <slurm.conf>`` argument, never by name), the slurmdbd and MariaDB it
    started (their pids in ``record``) and munged if ``up`` started it."""
    for name in ("slurmdbd", "mysqld"):
        if _alive(record.get(f"{name}_pid")):
            _stop(record.get(f"{name}_pid"), timeout_s=30)
    pid = _read_pid(config.state_dir / "slurmctld.pid")
    if pid is not None and _alive(pid):
        try:
            words = Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").split("\0")
        except OSError:
            words = []
        if str(paths.slurm_conf) in words:
            _stop(pid)
    if munge_pid is not None:
        _stop(munge_pid)
    _kill_leftovers(config)


def _start(config: SpotConfig, paths: LocalClusterPaths, munge_pid: int | None,
           keep_state: bool, reconcile: bool, accounting: bool,
           record: dict[str, object],
           on_step: Callable[[str], None] = lambda _step: None) -> dict[str, object]:
    env = {**os.environ, "SLURM_CONF": str(paths.slurm_conf)}
    os.environ["SLURM_CONF"] = str(paths.slurm_conf)
    client = SlurmClient(config.slurm_bin_dir)
    if client.ping():
        raise SlurmSpotError(
            "another slurmctld already answers on this machine's port 6817; stop it first "
            "(slurm-spot local down with its --conf-dir, or scontrol shutdown)")
    record.update({"slurm_conf": str(paths.slurm_conf),
                   "spot_yaml": str(config.source_path), "munge_pid": munge_pid})
    if accounting:
        on_step("starting MariaDB and slurmdbd (accounting)")
        _start_accounting(config, paths, env, record, fresh=not keep_state)
    on_step("starting slurmctld")
    pid_file = config.state_dir / "slurmctld.pid"
    if not _alive(_read_pid(pid_file)):
        # A pid file left by an earlier slurmctld that is gone: the wait below takes a pid
        # file naming a dead process for this slurmctld having died at start.
        pid_file.unlink(missing_ok=True)
    argv = ["/usr/sbin/slurmctld", "-f", str(paths.slurm_conf)]
    if not keep_state:
        argv.append("-c")
    started = run_command(argv, 30, env=env)
    if started.returncode != 0:
        raise SlurmSpotError(f"slurmctld did not start: {started.stderr.strip()} "
                             f"(see {config.log_dir / 'slurmctld.log'})")
    on_step("waiting for slurmctld to answer")
    deadline = time.monotonic() + 30
    while not (client.ping() and pid_file.exists() and _alive(_read_pid(pid_file))):
        pid = _read_pid(pid_file)
        if pid is not None and not _alive(pid):
            # It wrote its pid file and died (a port in use, a bad slurm.conf: "fatal: ..." in
            # its log): say so now rather than after the whole wait.
            raise SlurmSpotError(f"slurmctld exited at start; see {config.log_dir / 'slurmctld.log'}")
        if time.monotonic() > deadline:
            raise SlurmSpotError(f"slurmctld does not answer; see {config.log_dir / 'slurmctld.log'}")
        time.sleep(0.3)
    if reconcile:
        on_step("starting the reconciler")
    record.update({
        "slurmctld_pid": int(pid_file.read_text()) if pid_file.exists() else None,
        "reconciler_pid": _start_reconciler(config, paths) if reconcile else None,
        "started": time.time(),
    })
    _write_record(paths, record)
    return record


def _write_record(paths: LocalClusterPaths, record: dict[str, object]) -> None:
    paths.record.parent.mkdir(parents=True, exist_ok=True)
    paths.record.write_text(json.dumps(record, indent=2))


def _start_accounting(config: SpotConfig, paths: LocalClusterPaths, env: dict[str, str],
                      record: dict[str, object], fresh: bool) -> None:
    """MariaDB, then slurmdbd, then the cluster's registration; each pid goes into the record
    at once so that ``local down`` stops what started even if a later step fails."""
    record["mysqld_pid"] = dbd.start_database(config.state_dir, config.log_dir, fresh=fresh)
    _write_record(paths, record)
    dbd.write_slurmdbd_conf(paths.conf_dir, config.state_dir, config.log_dir)
    record["slurmdbd_pid"] = dbd.start_slurmdbd(paths.slurm_conf, config.state_dir, config.log_dir)
    _write_record(paths, record)
    dbd.register_cluster(config.cluster, config.slurm_bin_dir, env)


def _start_reconciler(config: SpotConfig, paths: LocalClusterPaths) -> int | None:
    """Run ``slurm-spot reconcile`` in the background, as the controller's unit would."""
    try:
        import slurm_spot.reconcile.reconciler  # noqa: F401 - present once the reconciler is installed
    except ImportError:
        return None
    log = open(config.log_dir / "reconcile.log", "ab")
    proc = subprocess.Popen(  # noqa: S603 - argv list
        [sys.executable, "-m", "slurm_spot", "--config", str(config.source_path), "reconcile"],
        stdin=subprocess.DEVNULL, stdout=log, stderr=log, start_new_session=True,
        env={**os.environ, "SLURM_CONF": str(paths.slurm_conf)},
    )
    return proc.pid


def _read_pid(path: Path) -> int | None:
    try:
        return int(path.read_text().strip())
    except (OSError, ValueError):
        return None


def _read_record(paths: LocalClusterPaths) -> dict[str, object]:
    try:
        return dict(json.loads(paths.record.read_text()))
    except (OSError, ValueError):
        return {}


def read_record(config: SpotConfig) -> dict[str, object]:
    """What ``local up`` recorded for the cluster of ``config`` (pids of the daemons it
    started); ``{}`` when it is not up or never was."""
    return _read_record(LocalClusterPaths(Path("/nonexistent"), config.state_dir))


def update_record(config: SpotConfig, **fields: object) -> None:
    """Add ``fields`` to ``local up``'s record (a daemon started later, such as the market's
    pid), so that ``local down`` finds what to stop."""
    paths = LocalClusterPaths(Path("/nonexistent"), config.state_dir)
    _write_record(paths, {**_read_record(paths), **fields})


def alive(pid: object) -> bool:
    """Whether process ``pid`` (an int; anything else: False) exists."""
    return _alive(pid)


def _alive(pid: object) -> bool:
    if not isinstance(pid, int):
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def _stop(pid: object, timeout_s: float = 10) -> None:
    if not _alive(pid):
        return
    assert isinstance(pid, int)
    terminate(pid, lambda: _alive(pid), timeout_s)


def down(config: SpotConfig) -> list[str]:
    """Stop the chaos market (:mod:`.marketd`), every instance, the reconciler, slurmctld,
    slurmdbd and MariaDB (if ``up`` started them) and munged (if ``up`` started it).
    Returns what was stopped, one line each."""
    from slurm_spot.localcluster import marketd
    from slurm_spot.providers.local.provider import LocalProvider

    stopped = []
    paths = LocalClusterPaths(Path("/nonexistent"), config.state_dir)
    record = _read_record(paths)
    if marketd.stop(config):  # first: it would reclaim instances while they are stopped
        stopped.append("market")
    if _alive(record.get("reconciler_pid")):
        _stop(record.get("reconciler_pid"))
        stopped.append("reconciler")
    for name, settings in config.providers.items():
        if isinstance(settings, LocalProviderConfig):
            provider = LocalProvider(config, name, settings)
            alive = [i for i in provider.list_instances() if i.state.is_alive]
            provider.terminate_instances([i.instance_id for i in alive])
            stopped += [f"instance {i.instance_id} ({i.node})" for i in alive]
    if _alive(record.get("slurmctld_pid")):
        _stop(record.get("slurmctld_pid"))
        stopped.append("slurmctld")
    for name in ("slurmdbd", "mysqld"):  # slurmdbd first: it flushes to the database
        if _alive(record.get(f"{name}_pid")):
            _stop(record.get(f"{name}_pid"), timeout_s=30)
            stopped.append(name)
    if record.get("munge_pid") and _alive(record.get("munge_pid")):
        _stop(record.get("munge_pid"))
        stopped.append("munged")
    _kill_leftovers(config)
    paths.record.unlink(missing_ok=True)
    return stopped


def _kill_leftovers(config: SpotConfig) -> None:
    """Detached helpers of this cluster (notice timers, hook workers) that outlived it."""
    marker = str(config.source_path)
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            cmdline = Path(f"/proc/{entry}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        words = [w.decode(errors="replace") for w in cmdline]
        if marker in words and any("slurm_spot" in w or "slurm-spot" in w for w in words):
            try:
                os.kill(int(entry), signal.SIGKILL)
            except ProcessLookupError:
                pass


def status(config: SpotConfig) -> dict[str, object]:
    """What runs: the record of ``up``, liveness of each daemon (the chaos market's too),
    and the instances."""
    from slurm_spot.localcluster import marketd
    from slurm_spot.providers.local.provider import LocalProvider

    record = _read_record(LocalClusterPaths(Path("/nonexistent"), config.state_dir))
    instances = []
    for name, settings in config.providers.items():
        if isinstance(settings, LocalProviderConfig):
            instances += [i.to_json() for i in LocalProvider(config, name, settings).list_instances()]
    return {
        "up": _alive(record.get("slurmctld_pid")),
        "slurm_conf": record.get("slurm_conf"),
        "slurmctld": _alive(record.get("slurmctld_pid")),
        "reconciler": _alive(record.get("reconciler_pid")),
        "market": marketd.running(marketd.read_plan(config)),
        "munge": _munge_running(),
        "instances": instances,
    }


def prepare_config(config_path: str | None, conf_dir: Path) -> SpotConfig:
    """The config for the local cluster, always read from ``<conf_dir>/spot.yaml``, where the
    hooks find it (beside slurm.conf, through ``SLURM_CONF``).

    A given file is validated, then copied there; with none, the default local cluster is
    written there unless a spot.yaml already exists.

    Raises:
        ConfigError: the given file is invalid.
        BadInputError: ``<conf_dir>/spot.yaml`` exists, differs, and is not managed by
            slurm-spot.
    """
    target = conf_dir / "spot.yaml"
    try:
        current = load_config(target) if target.exists() else None
    except ConfigError:
        current = None  # an invalid old file may be replaced (below, if it is ours)
    if current is not None:
        record = _read_record(LocalClusterPaths(conf_dir, current.state_dir))
        if _alive(record.get("slurmctld_pid")):
            raise BadInputError(
                f"a local cluster is already up with {target}; run 'slurm-spot local down "
                f"--conf-dir {conf_dir}' first")
    if config_path and Path(config_path).absolute() != target.absolute():
        load_config(config_path)  # validate before touching anything
        text = Path(config_path).read_text()
        if target.exists() and target.read_text() != text and MANAGED_MARK not in target.read_text():
            raise BadInputError(f"{target} exists and is not managed by slurm-spot; refusing to "
                                "overwrite it. Use --conf-dir to put the local cluster elsewhere.")
        conf_dir.mkdir(parents=True, exist_ok=True)
        if not text.startswith(f"# {MANAGED_MARK}"):
            text = f"# {MANAGED_MARK}: copied from {Path(config_path).absolute()}.\n" + text
        target.write_text(text)
    elif not target.exists():
        from slurm_spot.config import default_local_config

        conf_dir.mkdir(parents=True, exist_ok=True)
        data = default_local_config().model_dump(mode="json", exclude_defaults=True)
        target.write_text(f"# {MANAGED_MARK}: the default local spot cluster.\n"
                          + yaml.safe_dump(data, sort_keys=False))
    return load_config(target)
