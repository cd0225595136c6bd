"""Plays the cloud's part after a fake cloud (moto, the fake Compute API) created an instance:
the instance "boots" as a local ``slurmd`` for its node, and dies when the instance ends.

:class:`BootSimulator` polls one or several providers' ``list_instances()`` from a thread
(several: a partition whose node sets are on two AWS regions, or on AWS and GCE, issue 24). For an alive
instance of an allowed node (:meth:`BootSimulator.allow`) it waits ``boot_delay_s`` after first
seeing it (slurmctld accepts a CLOUD node only if its boot time is later than the resume
request) and until the resume hook has recorded the instance's address in Slurm, then sets
``NodeAddr=127.0.0.1`` (the instance's private address does not exist here) and starts

    unshare --uts --time --boottime=-<host uptime> -- python -c <sethostname; exec slurmd>
        -> slurmd -D -N <node> -f <slurm.conf>

with the instance's hostname (what the resume hook recorded as NodeHostName), as
``slurm_spot.providers.local.boot`` does for the local provider. When the instance is no
longer alive (suspend, a reclaim), the slurmd and everything below it get SIGKILL, as a real
instance vanishes.

The node lines rendered for a cloud node set have no ``Port=``, so every such slurmd listens
on the default SlurmdPort: with ``exclusive`` (default) at most one runs at a time, and an
instance waits for the previous one to end before it boots.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from slurm_spot.providers.base import Instance

#: One provider's listing of its instances (``provider.list_instances``).
Listing = Callable[[], Sequence[Instance]]

_INSIDE = (
    "import os, socket, sys\n"
    "socket.sethostname(sys.argv[1])\n"
    "os.execv(sys.argv[2], [sys.argv[2], '-D', '-N', sys.argv[3], '-f', sys.argv[4]])\n"
)


@dataclass
class Booted:
    """One simulated instance that is up: its slurmd process and the instance behind it."""

    node: str
    instance_id: str
    hostname: str
    process: subprocess.Popen[bytes]
    started: float


class BootSimulator:
    """Boots and kills local slurmds for a fake cloud's instances (see the module docstring).

    Args:
        list_instances: the provider's listing (``AwsProvider(...).list_instances``), or a
            sequence of several providers' listings. A listing that fails is one line in
            ``errors`` and leaves that provider's slurmds as they are for the round (a failed
            listing is not a vanished instance).
        slurm_conf: the cluster's slurm.conf.
        log_dir: where ``boot-<node>.log`` (output of unshare/slurmd) goes.
        boot_delay_s: seconds between first seeing an instance and starting its slurmd.
        address_wait_s: longest wait for the resume hook to record the instance's address.
        poll_s: seconds between two listings.
        exclusive: at most one slurmd at a time (they share the default port).
        slurmd: path of slurmd.

    Attributes:
        events: ``(node, instance id, "booted"|"killed"|"exited")`` in order.
        errors: listing or boot failures (a test can assert there are none).
    """

    def __init__(self, list_instances: Listing | Sequence[Listing], slurm_conf: Path,
                 log_dir: Path, *, boot_delay_s: float = 2.0, address_wait_s: float = 10.0,
                 poll_s: float = 0.5, exclusive: bool = True,
                 slurmd: str = "/usr/sbin/slurmd") -> None:
        self.listings: tuple[Listing, ...] = (
            (list_instances,) if callable(list_instances) else tuple(list_instances))
        self.slurm_conf = slurm_conf
        self.log_dir = log_dir
        self.boot_delay_s = boot_delay_s
        self.address_wait_s = address_wait_s
        self.poll_s = poll_s
        self.exclusive = exclusive
        self.slurmd = slurmd
        self.events: list[tuple[str, str, str]] = []
        self.errors: list[str] = []
        self.timeouts: list[str] = []  # scontrol calls slurmctld was too busy to answer
        self.booted: dict[str, Booted] = {}
        self._allowed: set[str] = set()
        self._first_seen: dict[str, float] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._env: Mapping[str, str] = {**os.environ, "SLURM_CONF": str(slurm_conf)}

    # ---- control from the test ----------------------------------------------------------
    def allow(self, *nodes: str) -> None:
        """Instances of ``nodes`` boot from now on (others stay unbooted)."""
        with self._lock:
            self._allowed.update(nodes)

    def disallow(self, *nodes: str) -> None:
        """Instances of ``nodes`` no longer boot (a running one stays up)."""
        with self._lock:
            self._allowed.difference_update(nodes)

    def running(self) -> dict[str, str]:
        """node -> instance id of every slurmd up now."""
        with self._lock:
            return {n: b.instance_id for n, b in self.booted.items()}

    def kill(self, node: str) -> None:
        """SIGKILL ``node``'s slurmd and everything below it (a silent reclaim)."""
        with self._lock:
            booted = self.booted.pop(node, None)
        if booted is not None:
            _kill_tree(booted.process)
            self.events.append((node, booted.instance_id, "killed"))

    # ---- life cycle ---------------------------------------------------------------------
    def start(self) -> BootSimulator:
        self._thread = threading.Thread(target=self._loop, name="boot-simulator", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop polling and kill every slurmd it started."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=30)
        for node in list(self.booted):
            self.kill(node)

    def __enter__(self) -> BootSimulator:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # ---- the loop -----------------------------------------------------------------------
    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                self.step()
            except Exception as exc:  # keep simulating; the test reads .errors
                self.errors.append(f"{type(exc).__name__}: {exc}")
            self._stop.wait(self.poll_s)

    def step(self) -> None:
        """One round: kill slurmds whose instance ended, boot the instances that are due."""
        alive: dict[str, Instance] = {}
        unlisted: set[str] = set()  # nodes of a booted instance whose provider failed to list
        failed = False
        for listing in self.listings:
            try:
                instances = listing()
            except Exception as exc:  # keep the others; the test reads .errors
                self.errors.append(f"listing: {type(exc).__name__}: {exc}")
                failed = True
                continue
            alive.update((i.instance_id, i) for i in instances if i.state.is_alive and i.node)
        if failed:
            unlisted = {n for n, b in self.booted.items() if b.instance_id not in alive}
        for node, booted in list(self.booted.items()):
            if booted.instance_id not in alive:
                if node not in unlisted:
                    self.kill(node)
            elif booted.process.poll() is not None:
                with self._lock:
                    self.booted.pop(node, None)
                self.events.append((node, booted.instance_id, "exited"))
        now = time.monotonic()
        for inst in sorted(alive.values(), key=lambda i: i.launch_time):
            self._first_seen.setdefault(inst.instance_id, now)
            node = inst.node or ""
            with self._lock:
                wanted = node in self._allowed and node not in self.booted
                blocked = self.exclusive and bool(self.booted)
            if not wanted or blocked:
                continue
            seen_for = now - self._first_seen[inst.instance_id]
            if seen_for < self.boot_delay_s:
                continue
            recorded = self._node_addr(node) == inst.private_ip
            if not recorded and seen_for < self.address_wait_s:
                continue
            self._boot(inst)
            if self.exclusive:
                return

    def _boot(self, inst: Instance) -> None:
        node = inst.node or ""
        hostname = inst.hostname or node
        self._scontrol("update", f"nodename={node}", "nodeaddr=127.0.0.1")
        uptime_s = int(float(Path("/proc/uptime").read_text().split()[0]))
        argv = ["unshare", "--uts", "--time", f"--boottime=-{uptime_s}", "--",
                sys.executable, "-c", _INSIDE, hostname, self.slurmd, node, str(self.slurm_conf)]
        self.log_dir.mkdir(parents=True, exist_ok=True)
        with open(self.log_dir / f"boot-{node}.log", "ab") as log:
            process = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log, stderr=log,
                                       start_new_session=True, env=dict(self._env))
        with self._lock:
            self.booted[node] = Booted(node, inst.instance_id, hostname, process,
                                       time.monotonic())
        self.events.append((node, inst.instance_id, "booted"))

    def _node_addr(self, node: str) -> str | None:
        out = self._scontrol("-o", "show", "node", node)
        for word in out.split():
            if word.startswith("NodeAddr="):
                return word.split("=", 1)[1]
        return None

    def _scontrol(self, *args: str) -> str:
        proc = subprocess.run(["scontrol", *args], env=dict(self._env), capture_output=True,
                              text=True, timeout=30, check=False)
        if proc.returncode != 0:
            text = f"scontrol {' '.join(args)}: {proc.stderr.strip()}"
            # slurmctld busy (seen: 10 s per node failing to resolve names in a test's network
            # namespace): the node is looked at again on the next tick, so not an error
            (self.timeouts if "timed out" in proc.stderr else self.errors).append(text)
        return proc.stdout


def _uts_ns(pid: int) -> str | None:
    try:
        return os.readlink(f"/proc/{pid}/ns/uts")
    except OSError:
        return None


def _kill_tree(process: subprocess.Popen[bytes]) -> None:
    """SIGKILL ``process`` (which it started) and every process in its own UTS namespace:
    slurmstepd and the job's processes are not its descendants (slurmd double-forks them),
    but they share the instance's namespace. Then reap it."""
    ns = _uts_ns(process.pid)
    pids = [process.pid]
    if ns and ns != _uts_ns(os.getpid()):
        pids += [int(e) for e in os.listdir("/proc") if e.isdigit() and _uts_ns(int(e)) == ns]
    for pid in dict.fromkeys(pids):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    try:
        process.wait(timeout=10)
    except subprocess.TimeoutExpired:
        pass
