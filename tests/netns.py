"""Private network namespaces for parallel end-to-end test workers.

A local test cluster listens on fixed ports (slurmctld 6817, one slurmd port per node from the
local provider's ``port_base``, slurmdbd 6819, the demo's rendezvous), so two clusters on one
network collide. ``make test`` runs pytest-xdist workers; each worker moves itself into a new
network namespace of its own (``unshare(2)`` with ``CLONE_NEWNET``, loopback up) before its
first test, so every worker can run a cluster at the same time as the others: the same
127.0.0.1 ports, nothing shared but the file system, munged's socket and the CPUs.

Namespaces are per thread in Linux (unshare(2), "CLONE_NEWNET"): everything the worker's main
thread starts afterwards (slurmctld, slurmd, sbatch, threads it creates) lives in the private
namespace. A test that needs the outside world (pip reaching the package index, debootstrap
reaching the Debian mirror) runs its part inside :func:`host_network`.

Each namespace has its own name (:data:`NETNS_ENV`, the xdist worker id), and with it its own
test-cluster lock and cluster registry (:func:`lock_path`, :func:`registry_dir` in
tests/cluster.py): a worker waits only for its own clusters and stops only its own strays.
"""

from __future__ import annotations

import contextlib
import ctypes
import fcntl
import os
import socket
import struct
from collections.abc import Iterator

NETNS_ENV = "SLURM_SPOT_TEST_NETNS"
"""Set to the namespace's name in a process that runs in a private test network namespace (and
so in everything it starts); unset on the host's network."""

CLONE_NEWNET = 0x40000000  # <sched.h>
_SIOCGIFFLAGS = 0x8913  # <linux/sockios.h>
_SIOCSIFFLAGS = 0x8914
_SIOCSIFADDR = 0x8916
_IFF_UP = 0x1  # <net/if.h>

_host_fd: int | None = None
_private_fd: int | None = None


def _libc() -> ctypes.CDLL:
    return ctypes.CDLL(None, use_errno=True)


def _setns(fd: int) -> None:
    if _libc().setns(fd, CLONE_NEWNET) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"setns(CLONE_NEWNET): {os.strerror(err)}")


def _set_up(sock: socket.socket, name: bytes) -> None:
    request = struct.pack("16sH", name, 0)
    flags = struct.unpack("16sH", fcntl.ioctl(sock, _SIOCGIFFLAGS, request)[:18])[1]
    fcntl.ioctl(sock, _SIOCSIFFLAGS, struct.pack("16sH", name, flags | _IFF_UP))


def _loopback_up() -> None:
    """Bring ``lo`` up in the current network namespace (a new one has it down), with a second
    loopback address, 127.0.0.2 (alias ``lo:1``): glibc's ``getaddrinfo`` with ``AI_ADDRCONFIG``
    counts 127.0.0.1 as no address at all, and Slurm 22.05's slurmctld, resolving its listening
    address that way, exits with "getaddrinfo() failed: Name or service not known" where
    127.0.0.1 is the only one. The ioctls of netdevice(7), so no ``ip`` program is needed."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        _set_up(sock, b"lo")
        address = struct.pack("HH4s8s", socket.AF_INET, 0, socket.inet_aton("127.0.0.2"),
                              bytes(8))
        fcntl.ioctl(sock, _SIOCSIFADDR, struct.pack("16s", b"lo:1") + address)
        _set_up(sock, b"lo:1")


def enter_private_network(name: str) -> None:
    """Move the calling thread (and so everything it starts from now on) into a new network
    namespace with only loopback, up; remember the host's namespace for :func:`host_network`;
    set :data:`NETNS_ENV` to ``name``.

    Raises:
        OSError: unshare(2) refused (not root, or a seccomp policy without namespaces).
    """
    global _host_fd, _private_fd
    host = os.open("/proc/thread-self/ns/net", os.O_RDONLY | os.O_CLOEXEC)
    if _libc().unshare(CLONE_NEWNET) != 0:
        err = ctypes.get_errno()
        os.close(host)
        raise OSError(err, f"unshare(CLONE_NEWNET): {os.strerror(err)}")
    _loopback_up()
    _host_fd = host
    _private_fd = os.open("/proc/thread-self/ns/net", os.O_RDONLY | os.O_CLOEXEC)
    os.environ[NETNS_ENV] = name


def in_private_network() -> bool:
    """Whether this process moved itself into a private namespace (:func:`enter_private_network`)."""
    return _private_fd is not None


@contextlib.contextmanager
def host_network() -> Iterator[None]:
    """Run the body on the host's network (the package index, the Debian mirror), then return
    to the private namespace. A no-op where :func:`enter_private_network` was not called."""
    if _host_fd is None or _private_fd is None:
        yield
        return
    _setns(_host_fd)
    before = os.environ.pop(NETNS_ENV, None)
    try:
        yield
    finally:
        _setns(_private_fd)
        if before is not None:
            os.environ[NETNS_ENV] = before
