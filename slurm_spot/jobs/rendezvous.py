"""``slurm-spot rendezvous``: the store elastic torchrun jobs rendezvous through, hosted on the
controller (or another node that is not reclaimed), not on a spot node.

torchrun's c10d rendezvous backend keeps its state in a ``torch.distributed.TCPStore``. Left to
itself, torchrun hosts that store inside the agent of the node named in ``--rdzv-endpoint``:
when that node is a spot node and is reclaimed, the store and every survivor's rendezvous go
with it. This service hosts the store on a machine that stays, and each agent is told it is a
client (``--rdzv-conf is_host=false``).

Why the c10d store and not etcd: the c10d backend is part of torch itself (nothing else to
install or run on the nodes: the ``etcd``/``etcd-v2`` backends need the ``python-etcd``
client on every node and an etcd server), it is what torchrun's documentation recommends for
new jobs, and a rendezvous is a few small keys for a few seconds per round, which needs no
replicated store. One store serves every job: torchrun prefixes all its keys with the
rendezvous id (the job id), so jobs do not see each other's keys. What it costs: the store
keeps its keys in memory only; if the service restarts, running elastic jobs keep training
(the workers' process group is already formed), but the next re-rendezvous fails and those
jobs fall back to requeue.

The service is ``TCPStore(host, port, is_master=True, wait_for_workers=False,
multi_tenant=True)`` (torch.distributed's TCPStore documentation); it runs until SIGTERM or
SIGINT.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Callable
from datetime import timedelta
from types import FrameType
from typing import Any

#: The line that marks an elastic job's batch script: the watcher releases a departing node
#: from such a job instead of requeueing it (slurm_spot.watch).
ELASTIC_MARK = "# slurm-spot: elastic job (one job step per node)"

#: The service's port unless told otherwise (torchrun's own default c10d port is 29400; the
#: per-job agents of non-elastic jobs use 29400 + job id % 1000, see torchrun_agent).
DEFAULT_PORT = 29390


def parse_endpoint(text: str, where: str = "--rendezvous") -> tuple[str, int]:
    """``HOST:PORT`` -> (host, port); ``HOST`` alone -> port :data:`DEFAULT_PORT`.

    Raises:
        BadInputError: an empty host, or a port that is no number in 1..65535 (names ``where``).
    """
    from slurm_spot.errors import BadInputError

    host, sep, port_text = text.strip().rpartition(":")
    if not sep:
        host, port_text = text.strip(), str(DEFAULT_PORT)
    if not host or any(c.isspace() for c in host):
        raise BadInputError(f"{where}={text!r}: expected HOST:PORT")
    if not port_text.isdigit() or not 1 <= int(port_text) <= 65535:
        raise BadInputError(f"{where}={text!r}: the port must be a number in 1..65535")
    return host, int(port_text)


def open_store(host: str, port: int) -> Any:
    """Start hosting a TCPStore on ``host:port`` (``0.0.0.0`` for every interface); returns it.

    Raises:
        RuntimeError: the port is taken (torch's message says so).
    """
    from torch.distributed import TCPStore

    return TCPStore(host, port, is_master=True, wait_for_workers=False, multi_tenant=True,
                    timeout=timedelta(seconds=30))


def serve(host: str, port: int, ready: Callable[[int], None] | None = None,
          stop: threading.Event | None = None) -> None:
    """Host the store until SIGTERM/SIGINT (or ``stop`` is set); calls ``ready(port)`` once
    the store accepts connections.

    Raises:
        RuntimeError: the port is taken.
    """
    stop = stop or threading.Event()

    def _stop(_signum: int, _frame: FrameType | None) -> None:
        stop.set()

    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, _stop)
        signal.signal(signal.SIGINT, _stop)
    store = open_store(host, port)
    if ready is not None:
        ready(store.port)
    while not stop.wait(1.0):
        pass
    del store
