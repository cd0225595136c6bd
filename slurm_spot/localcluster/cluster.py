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
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import yaml

from slurm_spot.config import LocalProviderConfig, SpotConfig, load_config
from slurm_spot.errors import BadInputError, ConfigError, SlurmCommandError, SlurmSpotError
from slurm_spot.render import render, render_template, slurm_version, write_rendered
from slurm_spot.slurm.client import CommandResult, SlurmClient, run_command

MANAGED_MARK = "Managed by slurm-spot"
MUNGE_SOCKET = Path("/run/munge/munge.socket.2")


@dataclass(frozen=True)
class LocalClusterPaths:
    """Files of one local cluster: ``conf_dir`` holds slurm.conf, slurm-spot.conf, gres.conf
    and spot.yaml; ``state`` is the JSON record of what ``local up`` started."""

    conf_dir: Path
    state_dir: Path

    @property
    def slurm_conf(self) -> Path:
        return self.conf_dir / "slurm.conf"

    @property
    def spot_yaml(self) -> Path:
        return self.conf_dir / "spot.yaml"

    @property
    def record(self) -> Path:
        return self.state_dir / "local" / "cluster.json"


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
    if not MUNGE_SOCKET.exists():
        return False
    with socket.socket(socket.AF_UNIX) as sock:
        try:
            sock.connect(str(MUNGE_SOCKET))
        except OSError:
            return False
    return True


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


def write_cluster_files(config: SpotConfig, paths: LocalClusterPaths) -> None:
    """Render slurm.conf (a full one for the local cluster), the fragment and gres.conf.

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
    for folder in (config.state_dir / "slurmctld", config.state_dir / "slurmd", config.log_dir):
        folder.mkdir(parents=True, exist_ok=True)
    write_rendered(render(config, version=slurm_version()), paths.conf_dir)
    text = render_template("slurm.conf.j2",
        version=_version(), cluster=config.cluster, slurmctld_port=6817,
        state_dir=config.state_dir, log_dir=config.log_dir,
        kill_wait_s=local.kill_wait_s, slurmd_timeout_s=local.slurmd_timeout_s,
        fragment=paths.conf_dir / "slurm-spot.conf",
    )
    paths.slurm_conf.write_text(text)


def _version() -> str:
    from slurm_spot import __version__

    return __version__


def up(config: SpotConfig, conf_dir: Path, keep_state: bool = False,
       reconcile: bool = True) -> dict[str, object]:
    """Start the local cluster (see the module docstring). Returns the record it writes.

    Raises:
        SlurmSpotError: Slurm or munge is missing, or slurmctld does not answer within 30 s.
        BadInputError: see :func:`write_cluster_files`.
    """
    paths = LocalClusterPaths(conf_dir, config.state_dir)
    if paths.record.exists() and _alive(_read_record(paths).get("slurmctld_pid")):
        raise BadInputError(
            f"a local cluster is already up ({paths.record}); run 'slurm-spot local down' first")
    conf_dir.mkdir(parents=True, exist_ok=True)
    write_cluster_files(config, paths)
    munge_pid = start_munge()
    env = {**os.environ, "SLURM_CONF": str(paths.slurm_conf)}
    os.environ["SLURM_CONF"] = str(paths.slurm_conf)
    client = SlurmClient(config.slurm_bin_dir)
    if client.ping():
        raise SlurmSpotError(
            "another slurmctld already answers on this machine's port 6817; stop it first "
            "(slurm-spot local down with its --conf-dir, or scontrol shutdown)")
    argv = ["/usr/sbin/slurmctld", "-f", str(paths.slurm_conf)]
    if not keep_state:
        argv.append("-c")
    started = run_command(argv, 30, env=env)
    if started.returncode != 0:
        raise SlurmSpotError(f"slurmctld did not start: {started.stderr.strip()} "
                             f"(see {config.log_dir / 'slurmctld.log'})")
    pid_file = config.state_dir / "slurmctld.pid"
    deadline = time.monotonic() + 30
    while not (client.ping() and pid_file.exists() and _alive(_read_pid(pid_file))):
        if time.monotonic() > deadline:
            raise SlurmSpotError(f"slurmctld does not answer; see {config.log_dir / 'slurmctld.log'}")
        time.sleep(0.3)
    record: dict[str, object] = {
        "slurm_conf": str(paths.slurm_conf),
        "spot_yaml": str(config.source_path),
        "slurmctld_pid": int(pid_file.read_text()) if pid_file.exists() else None,
        "munge_pid": munge_pid,
        "reconciler_pid": _start_reconciler(config, paths) if reconcile else None,
        "started": time.time(),
    }
    paths.record.parent.mkdir(parents=True, exist_ok=True)
    paths.record.write_text(json.dumps(record, indent=2))
    return record


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
    os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout_s
    while _alive(pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    if _alive(pid):
        os.kill(pid, signal.SIGKILL)


def down(config: SpotConfig) -> list[str]:
    """Stop every instance, the reconciler, slurmctld and (if ``up`` started it) munged.
    Returns what was stopped, one line each."""
    from slurm_spot.providers.local.provider import LocalProvider

    stopped = []
    paths = LocalClusterPaths(Path("/nonexistent"), config.state_dir)
    record = _read_record(paths)
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
    """What runs: the record of ``up``, liveness of each daemon, and the instances."""
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
