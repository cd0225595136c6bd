"""The ``local`` provider: each "instance" is a ``slurmd -D -N <node>`` on this machine.

An instance runs in its own UTS namespace (its own hostname) and time namespace (its own boot
time, which slurmctld compares with the resume request; see docs/local-slurm.md), next to a
``slurm-spot watch`` of its own, as a cloud instance would. It starts ``boot_delay_s`` (>= 1 s)
after the request, like a real boot. Terminating it SIGKILLs every process in its UTS
namespace: slurmd, slurmstepd, the job's processes and the watcher, as a reclaim would.

State of record: one JSON file per instance under ``<state_dir>/local/instances``, written
under a lock, so two hooks at once never start two instances for one node. A simulated spot
market publishes notices under ``<state_dir>/local/notices`` (:meth:`LocalProvider.preempt`);
every end of an instance is published in ``<state_dir>/local/events.jsonl`` (:mod:`.events`).
"""

from __future__ import annotations

import fcntl
import grp
import json
import logging
import os
import pwd
import secrets
import signal
import stat
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from datetime import datetime, timedelta, timezone
from pathlib import Path

from slurm_spot.config import LocalProviderConfig, SpotConfig
from slurm_spot.errors import BadInputError
from slurm_spot.providers.base import (
    ErrorClass,
    Instance,
    InstanceState,
    LaunchFailure,
    LaunchRequest,
    LaunchResult,
)
from slurm_spot.providers.local.events import events_path, publish

log = logging.getLogger(__name__)

LOOPBACK = "127.0.0.1"
RECORD_KEEP_S = 3600.0  # ended instances stay listed this long, for the reconciler and status
CAPACITY_CODE = "InsufficientInstanceCapacity"
RECLAIM_REASON = "Server.SpotInstanceTermination: reclaimed by the simulated spot market"


def _proc_start_ticks(pid: int) -> int | None:
    """Field 22 of /proc/<pid>/stat (start time in clock ticks), or None if gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat[stat.rindex(")") + 2 :].split()
    return int(fields[19])


def check_private_dir(path: Path) -> None:
    """Refuse a directory of the local provider's state that another account could write.

    The instance records there hold the pids root SIGKILLs (with every process in their UTS
    namespace) and the files root writes; an account that could write the directory could
    plant a record or a link. ``path`` must be a real directory (not a symlink), owned by this
    process's user or by root, and writable by no other account (:func:`writable_by_others`: a
group-writable directory is fine only when the group is its owner's private group).

    Raises:
        BadInputError: ``path`` is a symlink or not a directory, has another owner, or is
            group/world-writable (the message names the path and what is wrong).
        OSError: ``path`` cannot be examined (other than missing: then nothing to check).
    """
    try:
        found = os.lstat(path)
    except FileNotFoundError:
        return
    if not stat.S_ISDIR(found.st_mode):
        raise BadInputError(f"{path}: the local provider's state must be a directory, not a "
                            f"{'symlink' if stat.S_ISLNK(found.st_mode) else 'file'}")
    if found.st_uid not in (os.geteuid(), 0):
        raise BadInputError(f"{path}: owned by uid {found.st_uid}, not by this user "
                            f"({os.geteuid()}) or root; the local provider will not use it")
    if writable_by_others(found):
        raise BadInputError(f"{path}: writable by other accounts (mode "
                            f"{stat.S_IMODE(found.st_mode):04o}); chmod go-w it")


def writable_by_others(found: os.stat_result) -> bool:
    """Whether an account other than the owner of ``found`` (an ``os.stat`` result) could
    write it: writable by others, or by a group other than the owner's private one (a group
    that is the owner's primary group and lists no members: the user private groups a
    ``umask 002`` relies on, as OpenSSH's StrictModes also allows)."""
    if found.st_mode & stat.S_IWOTH:
        return True
    if not found.st_mode & stat.S_IWGRP:
        return False
    try:
        group = grp.getgrgid(found.st_gid)
        owner = pwd.getpwuid(found.st_uid)
    except KeyError:
        return True
    return bool(group.gr_mem) or owner.pw_gid != found.st_gid


#: How many symbolic links :func:`check_trusted_ancestors` follows before it gives up.
MAX_LINKS = 8


def check_trusted_ancestors(path: Path, _links: int = 0) -> None:
    """Refuse ``path`` if an account other than this process's user and root could replace
    any directory on the way to it (what OpenSSH's StrictModes checks for a key file).

    Walks ``path`` from ``/`` one name at a time, without following links on the way:

    - a directory that other accounts can write (group or others) must have the sticky bit
      (``/tmp``), and then each name in it on the way must belong to this user or root:
      otherwise whoever can write it could rename a directory on the way and put their own,
      or a link, in its place between this check and the use;
    - a symbolic link on the way must belong to this user or root; its target (resolved) is
      then walked the same way, at most :data:`MAX_LINKS` links in all.

    Names from the first one missing onwards are not checked (this process creates them).

    Raises:
        BadInputError: the message names the directory or link and what is wrong.
        OSError: a name cannot be examined (other than missing).
    """
    mine = (os.geteuid(), 0)
    parent = Path("/")
    for name in Path(os.path.abspath(path)).parts[1:]:
        child = parent / name
        above = os.stat(parent)
        shared = writable_by_others(above)
        if shared and not above.st_mode & stat.S_ISVTX:
            raise BadInputError(
                f"{parent}: writable by other accounts (mode "
                f"{stat.S_IMODE(above.st_mode):04o}, no sticky bit), so {path} under it "
                "could be replaced; chmod go-w it or keep the state directory elsewhere")
        try:
            found = os.lstat(child)
        except FileNotFoundError:
            return
        if shared:
            if found.st_uid not in mine:
                raise BadInputError(
                    f"{child}: owned by uid {found.st_uid} in {parent}, which every account "
                    f"can write; the local provider will not use {path} through it")
        if stat.S_ISLNK(found.st_mode):
            if found.st_uid not in mine:
                raise BadInputError(f"{child}: a link owned by uid {found.st_uid}; the local "
                                    f"provider will not use {path} through it")
            if _links >= MAX_LINKS:
                raise BadInputError(f"{path}: more than {MAX_LINKS} links on the way")
            target = Path(os.path.realpath(child))
            check_trusted_ancestors(target, _links + 1)
            parent = target
        else:
            parent = child


def _record_problem(record: object) -> str | None:
    """What makes ``record`` (a parsed record file) unusable, or None: it must be an object
    with ``instance_id`` and ``node`` (text), ``pid`` (an integer above 1: pid 0 or a negative
    one would make ``killpg`` hit this process's own group) and ``launch_time`` (ISO 8601)."""
    if not isinstance(record, dict):
        return f"a JSON {type(record).__name__}, not an object"
    for key in ("instance_id", "node", "launch_time"):
        if not isinstance(record.get(key), str):
            return f"{key} missing or not text"
    pid = record.get("pid")
    if isinstance(pid, bool) or not isinstance(pid, int) or pid <= 1:
        return f"pid {pid!r} is not a process id above 1"
    try:
        datetime.fromisoformat(record["launch_time"])
    except ValueError:
        return f"launch_time {record['launch_time']!r} is not ISO 8601"
    return None


def _uts_ns(pid: int) -> str | None:
    try:
        return os.readlink(f"/proc/{pid}/ns/uts")
    except OSError:
        return None


def _pids_in_uts_ns(ns: str) -> list[int]:
    pids = []
    for entry in os.listdir("/proc"):
        if entry.isdigit() and _uts_ns(int(entry)) == ns:
            pids.append(int(entry))
    return pids


class LocalProvider:
    """Instances as local slurmd processes (see the module docstring).

    Args:
        config: the whole configuration (state_dir, cluster, node sets).
        name: the provider's name in ``providers:``.
        settings: its settings (slurmd path, port base, boot delay in seconds).
    """

    def __init__(self, config: SpotConfig, name: str, settings: LocalProviderConfig) -> None:
        self.config = config
        self.name = name
        self.settings = settings
        self.root = config.state_dir / "local"
        self.records = self.root / "instances"
        self.notices = self.root / "notices"

    # -- records ----------------------------------------------------------------------------
    def _check_dirs(self) -> None:
        """:func:`check_trusted_ancestors` on the state directory, then
        :func:`check_private_dir` on it and its two subdirectories."""
        check_trusted_ancestors(self.root)
        for path in (self.root, self.records, self.notices):
            check_private_dir(path)

    def _make_dir(self, path: Path) -> None:
        """Create ``path`` (and the state directory above it) 0755 whatever the umask (a
        developer's 002 would make them group-writable, which :meth:`_check_dirs` refuses);
        nothing is created through a directory :func:`check_trusted_ancestors` refuses."""
        check_trusted_ancestors(self.root)
        missing = [p for p in (*reversed(self.root.parents), self.root, path) if not p.exists()]
        for folder in missing:
            try:
                folder.mkdir(mode=0o755)
            except FileExistsError:
                continue
            os.chmod(folder, 0o755)

    @contextmanager
    def _locked(self) -> Iterator[None]:
        self._make_dir(self.records)
        self._check_dirs()
        with open(self.root / "lock", "w") as fh:
            fcntl.flock(fh, fcntl.LOCK_EX)
            yield

    def _read(self, path: Path) -> dict | None:
        """The instance record at ``path``, or None when there is none or it is malformed
        (logged with the file and what is wrong): one damaged record must not stop the
        listing of every other instance, nor name a pid to kill that no launch wrote."""
        try:
            record = json.loads(path.read_text())
        except FileNotFoundError:
            return None
        except (OSError, ValueError) as exc:
            log.warning("%s: not an instance record (%s); ignored", path, exc)
            return None
        problem = _record_problem(record)
        if problem:
            log.warning("%s: not an instance record (%s); ignored", path, problem)
            return None
        return dict(record)

    def _write(self, record: dict) -> None:
        path = self.records / f"{record['instance_id']}.json"
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(record, sort_keys=True))
        os.replace(tmp, path)

    def _alive(self, record: dict) -> bool:
        if record.get("state") == InstanceState.TERMINATED.value:
            return False
        pid = int(record["pid"])
        ticks = _proc_start_ticks(pid)  # None for a pid that is gone: never alive
        return ticks is not None and ticks == record.get("start_ticks") and not _is_zombie(pid)

    def _to_instance(self, record: dict) -> Instance:
        alive = self._alive(record)
        launched = datetime.fromisoformat(record["launch_time"])
        booted = time.time() - launched.timestamp() >= self.settings.boot_delay_s
        state = InstanceState.TERMINATED
        if alive:
            state = InstanceState.RUNNING if booted else InstanceState.PENDING
        return Instance(
            instance_id=record["instance_id"],
            node=record.get("node"),
            node_set=record.get("node_set"),
            state=state,
            market=record.get("market", "spot"),
            instance_type="local",
            zone="local",
            launch_time=launched,
            private_ip=LOOPBACK,
            hostname=record.get("node"),
            state_reason=record.get("state_reason", "" if alive else "Instance process exited"),
        )

    def _records(self) -> list[dict]:
        self._check_dirs()
        if not self.records.is_dir():
            return []
        found = [self._read(p) for p in sorted(self.records.glob("*.json"))]
        return [r for r in found if r is not None]

    # -- Provider protocol ------------------------------------------------------------------
    def list_instances(self) -> list[Instance]:
        """Every local instance of the cluster, alive or ended within the last hour."""
        cutoff = datetime.now(timezone.utc) - timedelta(seconds=RECORD_KEEP_S)
        result = []
        for record in self._records():
            instance = self._to_instance(record)
            if instance.state.is_alive or instance.launch_time > cutoff:
                result.append(instance)
        return result

    def launch(self, request: LaunchRequest) -> LaunchResult:
        """Start one slurmd per node that has no alive instance yet (idempotent).

        Raises:
            BadInputError: a node is not part of the request's node set.
        """
        valid = set(request.node_set.node_names)
        for node in request.nodes:
            if node not in valid:
                raise BadInputError(f"node {node!r} is not in node set {request.node_set.name!r}")
        launched: list[Instance] = []
        short: list[str] = []
        with self._locked():
            alive = {r["node"]: r for r in self._records() if self._alive(r)}
            in_set = sum(1 for r in alive.values() if r.get("node_set") == request.node_set.name)
            limit = self.capacity().get(request.node_set.name)
            for node in request.nodes:
                if node in alive:
                    launched.append(self._to_instance(alive[node]))
                    continue
                if limit is not None and in_set >= limit:
                    short.append(node)
                    continue
                record = self._start(node, request.node_set.name, request.node_set.market)
                launched.append(self._to_instance(record))
                in_set += 1
        failed: tuple[LaunchFailure, ...] = ()
        if short:
            failed = (LaunchFailure(
                tuple(short), CAPACITY_CODE,
                f"simulated spot market has capacity for {limit} instance(s) of "
                f"{request.node_set.name}", ErrorClass.CAPACITY,
                pool=f"local/local/{request.node_set.market}"),)
        return LaunchResult(launched=tuple(launched), failed=failed, api_calls=1)

    # -- simulated capacity -----------------------------------------------------------------
    def capacity(self) -> dict[str, int]:
        """Capacity limits of the simulated market: ``{node set: max alive instances}``."""
        path = self.root / "capacity.json"
        try:
            data = json.loads(path.read_text())
        except FileNotFoundError:
            return {}
        except (OSError, ValueError) as exc:
            log.warning("%s: unreadable (%s); no capacity limits", path, exc)
            return {}
        if not isinstance(data, dict):
            log.warning("%s: a JSON %s, not {node set: limit}; no capacity limits", path,
                        type(data).__name__)
            return {}
        limits = {}
        for key, value in data.items():
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                log.warning("%s: node set %s: limit %r is no count; not limited", path, key,
                            value)
                continue
            limits[str(key)] = value
        return limits

    def set_capacity(self, node_set: str, limit: int | None) -> None:
        """Limit node set ``node_set`` to ``limit`` alive instances (None: unlimited).
        Launches beyond it fail with ``InsufficientInstanceCapacity``, like EC2's."""
        with self._locked():
            limits = self.capacity()
            if limit is None:
                limits.pop(node_set, None)
            else:
                limits[node_set] = limit
            (self.root / "capacity.json").write_text(json.dumps(limits))

    def _start(self, node: str, node_set: str, market: str) -> dict:
        instance_id = f"loc-{secrets.token_hex(6)}"
        log_dir = self.config.log_dir
        log_dir.mkdir(parents=True, exist_ok=True)
        argv = [sys.executable, "-m", "slurm_spot.providers.local.boot", "--config",
                str(self.config.source_path), node, instance_id]
        with open(log_dir / f"instance-{node}.log", "ab") as log:
            proc = subprocess.Popen(  # noqa: S603 - argv list
                argv, stdin=subprocess.DEVNULL, stdout=log, stderr=log,
                start_new_session=True, close_fds=True,
                env={**os.environ, "SLURM_SPOT_STATE_DIR": str(self.config.state_dir)},
            )
        record = {
            "instance_id": instance_id,
            "node": node,
            "node_set": node_set,
            "market": market,
            "launch_time": datetime.now(timezone.utc).isoformat(),
            "pid": proc.pid,
            "start_ticks": _proc_start_ticks(proc.pid),
            "state": InstanceState.PENDING.value,
            "cluster": self.config.cluster,
        }
        self._write(record)
        return record

    def terminate(self, nodes: Sequence[str]) -> list[Instance]:
        """SIGKILL every instance of ``nodes`` (all of them if a node has several)."""
        wanted = set(nodes)
        ids = [r["instance_id"] for r in self._records() if r.get("node") in wanted]
        return self._kill(ids, reason="Terminated by slurm-spot")

    def terminate_instances(self, instance_ids: Sequence[str]) -> None:
        """SIGKILL instances by id; unknown or ended ids are ignored."""
        self._kill(list(instance_ids), reason="Terminated by slurm-spot")

    def reclaim(self, node: str, instance_id: str | None = None) -> list[Instance]:
        """Simulate the provider taking a spot instance back (its state reason says so).

        Only ``instance_id`` if given (a notice names one instance: a newer instance for the
        same node is not touched), else every instance of ``node``.
        """
        ids = [
            r["instance_id"] for r in self._records()
            if r.get("node") == node and instance_id in (None, r["instance_id"])
        ]
        return self._kill(ids, reason=RECLAIM_REASON)

    def _kill(self, instance_ids: list[str], reason: str) -> list[Instance]:
        ended = []
        with self._locked():
            for instance_id in instance_ids:
                record = self._read(self.records / f"{instance_id}.json")
                if record is None or record.get("state") == InstanceState.TERMINATED.value:
                    continue
                alive = self._alive(record)
                if alive:
                    record["state_reason"] = reason
                record["state"] = InstanceState.TERMINATED.value
                self._write(record)  # first, so a listing never sees a half-killed instance
                if alive:
                    self._publish_end(record, reason)
                    _kill_instance_processes(int(record["pid"]))
                self._clear_notice(record["node"])
                ended.append(self._to_instance(record))
        return ended

    def _publish_end(self, record: dict, reason: str) -> None:
        """The instance's end in the provider's events file (:mod:`.events`), which the
        reconciler follows between passes; a failed write is logged (the passes still list)."""
        try:
            publish(events_path(self.config.state_dir), record["instance_id"],
                    record.get("node") or "", InstanceState.TERMINATED, reason)
        except OSError as exc:
            log.warning("cannot publish the end of %s: %s", record["instance_id"], exc)

    # -- the simulated spot market ----------------------------------------------------------
    def notice_path(self, node: str) -> Path:
        """Where the notice for ``node`` is published (read by the local notice source)."""
        return self.notices / f"{node}.json"

    def _clear_notice(self, node: str) -> None:
        self.notice_path(node).unlink(missing_ok=True)

    def preempt(self, node: str, notice_s: float) -> datetime:
        """Publish an interruption notice for ``node``, then reclaim it after ``notice_s``.

        Returns the deadline (UTC). With ``notice_s == 0`` the instance is killed at once, with
        no notice, as a spot reclaim without warning.

        Raises:
            BadInputError: ``node`` has no alive instance.
        """
        alive = [r for r in self._records() if r.get("node") == node and self._alive(r)]
        if not alive:
            raise BadInputError(f"node {node!r} has no running local instance to preempt")
        deadline = datetime.now(timezone.utc) + timedelta(seconds=notice_s)
        if notice_s <= 0:
            self.reclaim(node, alive[0]["instance_id"])
            return deadline
        self._make_dir(self.notices)
        tmp = self.notice_path(node).with_suffix(".tmp")
        tmp.write_text(json.dumps({"action": "terminate", "time": deadline.isoformat()}))
        os.replace(tmp, self.notice_path(node))
        argv = [sys.executable, "-m", "slurm_spot.providers.local.boot", "--config",
                str(self.config.source_path), "--reclaim-after", str(notice_s), node,
                alive[0]["instance_id"]]
        subprocess.Popen(  # noqa: S603 - argv list
            argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL, start_new_session=True, close_fds=True,
            env={**os.environ, "SLURM_SPOT_STATE_DIR": str(self.config.state_dir)},
        )
        return deadline

    def instance_record(self, instance_id: str) -> dict | None:
        """The raw record of one instance (for the boot helper)."""
        return self._read(self.records / f"{instance_id}.json")

    def mark_started(self, instance_id: str, **fields: object) -> None:
        """Merge ``fields`` into an instance record (the boot helper writes its ports)."""
        with self._locked():
            record = self._read(self.records / f"{instance_id}.json")
            if record is not None:
                self._write({**record, **fields})


def _kill_instance_processes(pid: int) -> None:
    """SIGKILL the instance's process group and everything in its UTS namespace."""
    ns = _uts_ns(pid)
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    if ns and ns != _uts_ns(os.getpid()):
        for other in _pids_in_uts_ns(ns):
            try:
                os.kill(other, signal.SIGKILL)
            except ProcessLookupError:
                pass
    for _ in range(50):  # reap-free wait: up to 0.5 s for the leader to vanish
        if _proc_start_ticks(pid) is None or _is_zombie(pid):
            break
        time.sleep(0.01)


def _is_zombie(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True
    return stat[stat.rindex(")") + 2] == "Z"


def provider_for_node(config: SpotConfig, node: str) -> LocalProvider:
    """The local provider that owns ``node``.

    Raises:
        BadInputError: ``node`` is in no node set, or its node set is not a local one.
    """
    node_set = config.node_set_of(node)
    if node_set is None:
        raise BadInputError(f"node {node!r} belongs to no node set of {config.source_path}")
    settings = config.providers[node_set.provider]
    if not isinstance(settings, LocalProviderConfig):
        raise BadInputError(f"node {node!r} is not a local-provider node")
    return LocalProvider(config, node_set.provider, settings)
