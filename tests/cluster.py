"""A real local Slurm cluster for end-to-end tests (munge + slurmctld + local instances).

Only one slurmctld can listen on one network, so a cluster holds an exclusive file lock for
its whole life: concurrent test runs on the host's network wait for each other instead of
colliding. A test worker in a private network namespace (tests/netns.py, ``make test``'s
parallel workers) has a lock and a registry of its own: its clusters run beside the others'.
"""

from __future__ import annotations

import fcntl
import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import IO

import yaml

from slurm_spot.jsonenvelope import read_envelope
from slurm_spot.localcluster.demo import tail_lines
from tests.netns import NETNS_ENV

LOCK_PATH = Path("/tmp/slurm-spot-test-cluster.lock")
"""The lock of the host's network (ansible/tests/check-slurmctld.sh and the benchmarks take it
too)."""
# One file per test cluster started on this machine, naming its config, until it is stopped:
# a run that crashed leaves its file, and the next run stops exactly that cluster's processes
# (from the pids its state dir records), never other slurmctld/slurmd processes of the host.
REGISTRY_DIR = Path("/tmp/slurm-spot-test-clusters")


def _network_name() -> str | None:
    name = os.environ.get(NETNS_ENV, "")
    return name if name.replace("-", "").replace("_", "").isalnum() else None


def lock_path() -> Path:
    """The test-cluster lock of this process's network: :data:`LOCK_PATH` on the host's,
    ``/tmp/slurm-spot-test-cluster.<name>.lock`` in a private namespace named ``<name>``."""
    name = _network_name()
    return LOCK_PATH.with_name(f"slurm-spot-test-cluster.{name}.lock") if name else LOCK_PATH


def registry_dir() -> Path:
    """Where this network's clusters are registered (:data:`REGISTRY_DIR`, or a folder of it
    per private namespace): :func:`_stop_strays` stops only the strays of its own network."""
    name = _network_name()
    return REGISTRY_DIR / f"netns-{name}" if name else REGISTRY_DIR

LOCK_HELD_ENV = "SLURM_SPOT_LOCK_HELD_BY"
"""Set to the pid of a process that holds the lock for a whole run (the version matrix holds it
around everything it runs in a Slurm root); then the run's own clusters take nothing."""


def base_config(root: Path, **overrides: object) -> dict:
    """A small, fast test cluster: 4 one-CPU nodes, short timers."""
    config: dict = {
        "cluster": "test",
        "providers": {"local": {"type": "local", "slurmd_timeout_s": 300, "kill_wait_s": 5,
                                "notice_poll_s": 0.5}},
        "node_sets": [{"name": "spot", "provider": "local", "count": 4, "cpus": 1}],
        "partitions": [{"name": "spot", "node_sets": ["spot"], "default": True}],
        "power": {"suspend_time_s": 10, "suspend_timeout_s": 10, "resume_timeout_s": 60},
        "reconcile": {"interval_s": 5, "orphan_grace_s": 20, "cooldown_s": 60},
        "state_dir": str(root / "state"),
        "log_dir": str(root / "log"),
        "checkpoint": {"root": str(root / "checkpoints")},
    }
    config.update(overrides)
    return config


#: The clusters this process has started and not stopped (for :func:`wait_for`'s error).
_ACTIVE: list[Cluster] = []


class Cluster:
    """Handle on a running local cluster: run slurm-spot and Slurm commands against it."""

    def __init__(self, root: Path, config: dict, reconcile: bool = False,
                 accounting: bool = False) -> None:
        self.root = root
        self.accounting = accounting  # MariaDB + slurmdbd (sacct); off: ~7 s less per cluster
        self.conf_dir = root / "etc"
        self.config_data = config
        self.reconcile = reconcile
        self.env = {**os.environ, "SLURM_CONF": str(self.conf_dir / "slurm.conf")}
        self.env.pop("SLURM_SPOT_CONFIG", None)
        self._lock = None
        self._entry: Path | None = None

    @property
    def spot_yaml(self) -> Path:
        return self.conf_dir / "spot.yaml"

    @property
    def log_dir(self) -> Path:
        return Path(self.config_data["log_dir"])

    @property
    def state_dir(self) -> Path:
        return Path(self.config_data["state_dir"])

    def spot(self, *args: str, check: bool = True, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        """Run ``slurm-spot --config <spot.yaml> ARGS``."""
        argv = [sys.executable, "-m", "slurm_spot", "--config", str(self.spot_yaml), *args]
        proc = subprocess.run(argv, env=self.env, capture_output=True, text=True, timeout=timeout)
        if check and proc.returncode != 0:
            raise AssertionError(f"{argv} -> {proc.returncode}\n{proc.stdout}\n{proc.stderr}")
        return proc

    def slurm(self, tool: str, *args: str, check: bool = True, timeout: float = 60) -> str:
        """Run Slurm tool ``tool``; its output as text, a user's bytes that are not UTF-8
        kept as surrogates (as slurm-spot reads them: slurm_spot.rawtext)."""
        proc = subprocess.run([tool, *args], env=self.env, capture_output=True,
                              encoding="utf-8", errors="surrogateescape", timeout=timeout)
        if check and proc.returncode != 0:
            raise AssertionError(f"{tool} {args} -> {proc.returncode}\n{proc.stderr}")
        return proc.stdout

    def diagnosis(self, lines: int = 20) -> str:
        """What a timed-out wait leaves in a CI log, which holds nothing else: this cluster's
        jobs and nodes (squeue, sinfo) and the last ``lines`` lines of slurmctld's, the
        hooks', the reconciler's and the event log. Never raises."""
        parts = [f"--- cluster {self.root}"]
        for argv in (["squeue", "-a", "-o", "%i %T %r %N %S"],
                     ["sinfo", "-N", "-h", "-o", "%N %T %E"]):
            try:
                proc = subprocess.run(argv, env=self.env, capture_output=True, text=True,
                                      errors="replace", timeout=20)
                parts.append(f"{argv[0]}:\n{(proc.stdout or proc.stderr).strip()}")
            except (OSError, subprocess.SubprocessError) as exc:
                parts.append(f"{argv[0]}: {exc}")
        for name in ("slurmctld.log", "hooks.log", "reconcile.log", "events.jsonl"):
            path = self.log_dir / name
            try:
                tail = tail_lines(path, lines)
            except OSError:
                continue
            parts.append(f"last lines of {path}:\n" + "\n".join(tail))
        return "\n".join(parts)

    def start(self) -> None:
        _ACTIVE.append(self)
        self._lock = acquire_cluster_lock()
        _stop_strays()
        self.conf_dir.mkdir(parents=True, exist_ok=True)
        registry = registry_dir()
        registry.mkdir(parents=True, exist_ok=True)
        self._entry = registry / f"{os.getpid()}-{time.time_ns()}"
        self._entry.write_text(str(self.conf_dir))
        source = self.root / "spot-source.yaml"
        source.write_text(yaml.safe_dump(self.config_data))
        args = ["--config", str(source), "local", "up", "--conf-dir", str(self.conf_dir)]
        if not self.reconcile:
            args.append("--no-reconcile")
        args.append("--accounting" if self.accounting else "--no-accounting")
        proc = subprocess.run([sys.executable, "-m", "slurm_spot", *args], env=self.env,
                              capture_output=True, text=True, timeout=60)
        if proc.returncode != 0:
            self.stop()
            raise AssertionError(f"local up failed: {proc.stdout}\n{proc.stderr}")

    def stop(self) -> None:
        if self in _ACTIVE:
            _ACTIVE.remove(self)
        try:
            if self.spot_yaml.exists():
                self.spot("local", "down", "--conf-dir", str(self.conf_dir), check=False)
            if self._entry is not None:
                self._entry.unlink(missing_ok=True)
                self._entry = None
        finally:
            if self._lock is not None:
                fcntl.flock(self._lock, fcntl.LOCK_UN)
                self._lock.close()
                self._lock = None

    # -- helpers ------------------------------------------------------------------------
    def node(self, name: str) -> dict[str, str]:
        """``scontrol -o show node NAME`` as fields; ``Reason`` whole, without its suffix."""
        from slurm_spot.slurm.output import split_reason
        from slurm_spot.slurm.states import parse_oneline

        rest, reason = split_reason(self.slurm("scontrol", "-o", "show", "node", name).strip())
        fields = parse_oneline(rest)
        if reason:
            fields["Reason"] = reason
        return fields

    def job(self, job_id: int | str) -> dict[str, str]:
        """``scontrol -o show job ID`` as fields, read as slurm-spot reads them (jobtext)."""
        from slurm_spot.slurm.jobtext import job_fields_with_user_text, split_job_records

        records = split_job_records(
            self.slurm("scontrol", "-o", "show", "job", str(job_id), check=False))
        return job_fields_with_user_text(records[0]) if records else {}

    def sbatch(self, *args: str) -> int:
        out = self.slurm("sbatch", "--parsable", *args)
        return int(out.strip().split(";")[0])

    def slurmd_pids(self) -> list[int]:
        """The live slurmd processes of this cluster: their command line names its slurm.conf
        (``slurmd -D -N NODE -f CONF``); other clusters' slurmds (parallel test workers, other
        runs) are not counted."""
        conf = os.fsencode(str(self.conf_dir / "slurm.conf"))
        return [pid for pid, words in _live_processes("slurmd") if conf in words]

    def end_cooldowns(self) -> list[str]:
        """End every node set's capacity cooldown the way docs/admin.md tells an admin to when
        capacity is back (``scontrol update nodename=... state=resume`` on the nodes whose
        reason is a cooldown), so the next test's jobs can use them; returns those nodes."""
        from slurm_spot.slurm.output import split_reason
        from slurm_spot.slurm.reasons import parse_cooldown

        cooled = []
        for line in self.slurm("scontrol", "-o", "show", "node").splitlines():
            rest, reason = split_reason(line.strip())
            if line.startswith("NodeName=") and reason and parse_cooldown(reason) is not None:
                cooled.append(rest.split()[0].removeprefix("NodeName="))
        if cooled:
            self.slurm("scontrol", "update", f"nodename={','.join(cooled)}", "state=resume")
        return cooled

    def instances(self) -> list[dict]:
        return read_envelope(self.spot("instances", "--json").stdout)

    def events(self) -> list[dict]:
        return read_envelope(self.spot("events", "--json").stdout)


def acquire_cluster_lock(timeout: float | None = None) -> IO[str]:
    """Take this network's test-cluster lock (an exclusive ``flock`` on :func:`lock_path`);
    release it by closing the returned file.

    Waits up to ``timeout`` seconds (another test run may be using the cluster), then fails
    naming the processes that hold the file open: a daemon that inherited the lock (munged
    started under ``flock(1)`` without ``-o``) would otherwise hang the suite for ever.
    ``timeout`` defaults to ``$SLURM_SPOT_LOCK_WAIT_S`` or 900 s.
    """
    if timeout is None:
        timeout = float(os.environ.get("SLURM_SPOT_LOCK_WAIT_S", "900"))
    holder = os.environ.get(LOCK_HELD_ENV, "")
    if holder.isdigit() and Path(f"/proc/{holder}").exists():
        # A caller (the version matrix, flock(1)) holds the lock for this whole run.
        return open(os.devnull, "a")
    path = lock_path()
    lock = open(path, "a")  # returned to the caller; Python fds are not inherited
    deadline = time.monotonic() + timeout
    while True:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return lock
        except BlockingIOError:
            if time.monotonic() > deadline:
                lock.close()
                raise AssertionError(
                    f"{path} is still locked after {timeout:g} s; held open by: "
                    f"{', '.join(_holders(path)) or 'unknown processes'}") from None
            time.sleep(0.5)


def _holders(path: Path) -> list[str]:
    """``pid (command)`` of every process with ``path`` open, from /proc/<pid>/fd."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            fds = os.listdir(f"/proc/{entry}/fd")
            if any(os.readlink(f"/proc/{entry}/fd/{fd}") == str(path) for fd in fds):
                comm = Path(f"/proc/{entry}/comm").read_text().strip()
                found.append(f"{entry} ({comm})")
        except OSError:
            continue
    return found


def wait_for(predicate: Callable[[], object], timeout: float, interval: float = 0.5,
             what: str = "condition") -> object:
    """Poll ``predicate`` until it returns something truthy; fail after ``timeout`` seconds,
    with the diagnosis of every cluster this process runs (:meth:`Cluster.diagnosis`)."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError("\n".join([f"timed out after {timeout:g} s waiting for {what}",
                                             *(c.diagnosis() for c in _ACTIVE)]))
        time.sleep(interval)


def _stop_strays() -> None:
    """Stop what earlier test clusters left running (a crashed run holds the ports): for each
    entry of :func:`registry_dir`, ``slurm-spot local down`` of that cluster, which stops only
    the pids its state dir recorded. Processes the tests did not start are never touched."""
    _stop_namespace_strays()
    registry = registry_dir()
    if not registry.is_dir():
        return
    for entry in sorted(e for e in registry.iterdir() if e.is_file()):
        conf_dir = Path(entry.read_text().strip())
        spot_yaml = conf_dir / "spot.yaml"
        if spot_yaml.exists():
            env = {**os.environ, "SLURM_CONF": str(conf_dir / "slurm.conf")}
            env.pop("SLURM_SPOT_CONFIG", None)
            subprocess.run([sys.executable, "-m", "slurm_spot", "--config", str(spot_yaml),
                            "local", "down", "--conf-dir", str(conf_dir)],
                           env=env, capture_output=True, timeout=120, check=False)
        entry.unlink(missing_ok=True)


def _stop_namespace_strays() -> None:
    """In a worker's private network namespace (tests/netns.py), stop the local clusters that
    earlier tests of this worker left running without registering them (a ``slurm-spot demo``
    killed at its timeout skips its own ``local down``): their slurmctld still holds this
    namespace's port 6817, and the next cluster's ``local up`` would fail. Every process in the
    namespace was started by this worker's tests, so each slurmctld found here (by
    ``/proc/PID/ns/net``) is ours: ``slurm-spot local down`` of its ``-f`` conf dir stops its
    instances, reconciler and database by their recorded pids; a slurmctld still there after
    that gets SIGTERM. Nothing on the host's network is looked at."""
    if not os.environ.get(NETNS_ENV):
        return
    mine = os.readlink("/proc/thread-self/ns/net")
    for pid, conf in _slurmctlds():
        try:
            if os.readlink(f"/proc/{pid}/ns/net") != mine:
                continue
        except OSError:
            continue
        spot_yaml = conf.parent / "spot.yaml"
        if spot_yaml.exists():
            env = {**os.environ, "SLURM_CONF": str(conf)}
            env.pop("SLURM_SPOT_CONFIG", None)
            subprocess.run([sys.executable, "-m", "slurm_spot", "--config", str(spot_yaml),
                            "local", "down", "--conf-dir", str(conf.parent)],
                           env=env, capture_output=True, timeout=120, check=False)
        try:
            os.kill(pid, 15)
        except OSError:
            pass


def _slurmctlds() -> list[tuple[int, Path]]:
    """``(pid, slurm.conf)`` of every live ``slurmctld -f CONF`` on the machine."""
    found = []
    for pid, words in _live_processes("slurmctld"):
        if b"-f" in words and words.index(b"-f") + 1 < len(words):
            found.append((pid, Path(os.fsdecode(words[words.index(b"-f") + 1]))))
    return found


def _live_processes(program: str) -> list[tuple[int, list[bytes]]]:
    """``(pid, argv)`` of every process of ``program`` (by argv[0]'s name) that is not a
    zombie, from /proc."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            words = Path(f"/proc/{entry}/cmdline").read_bytes().split(b"\0")
            state = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError):
            continue
        if words and Path(os.fsdecode(words[0])).name == program and state != "Z":
            found.append((int(entry), words))
    return found
