"""What the authenticated lighthouse's relay adds to each quorum of a fault-tolerant job.

Method:

1. One process (``--serve``) runs what ``slurm-spot lighthouse --job JOB`` runs
   (:func:`slurm_spot.jobs.services.ft_lighthouse.serve_authenticated`, real MUNGE; the
   job's owner is this uid, given instead of asked of squeue): a torchft lighthouse on
   127.0.0.1 and its front door. A second process is ``slurm-spot lighthouse-relay`` (the
   replica's side), printing its URL.
2. This process is the replica: torchft's own client (``torchft._torchft.LighthouseClient``,
   Rust/tonic, HTTP/2 on one kept connection, as a manager holds it) asks for a quorum of one
   replica (``min_replicas`` 1), alternately straight to the lighthouse (the baseline:
   ``--unauthenticated``) and through relay + front door (two extra hops, each a Python
   thread copying bytes), as one replica id (so each quorum forms at once, and the time is
   the round trip). Each client's first quorum is left out (warm-up).
3. Per path the median and the 90th percentile of ``--runs`` quorums; and the cost of a new
   connection (connect + first quorum: on the relayed path a MUNGE credential, ``unmunge``
   and the handshake), median of ``--connects`` new clients.

All on one machine (loopback), so the hops cost CPU and scheduling, not network. Run from the
repository root: ``python benchmarks/ft_lighthouse_relay.py [--runs N] [--no-write]
[--smoke]``. Results go to stdout (JSON) and BENCHMARKS.md between the ft-lighthouse-relay
markers.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from datetime import timedelta
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from report import write_section  # noqa: E402 - benchmarks/report.py, beside this script

BEGIN, END = "<!-- ft-lighthouse-relay:begin -->", "<!-- ft-lighthouse-relay:end -->"
JOB = "42"


def serve() -> None:
    """The lighthouse side: prints ``<front door endpoint> <lighthouse URL>``, then serves
    until SIGTERM."""
    from slurm_spot.jobs.services import ft_lighthouse

    started: list[ft_lighthouse.Lighthouse] = []
    original = ft_lighthouse.Lighthouse

    class Recorded(original):  # type: ignore[misc,valid-type]
        def __init__(self, *args, **kwargs) -> None:  # type: ignore[no-untyped-def]
            super().__init__(*args, **kwargs)
            started.append(self)

    ft_lighthouse.Lighthouse = Recorded  # type: ignore[misc]

    def ready(endpoint: str, _owner: int) -> None:
        print(endpoint, started[0].address, flush=True)

    ft_lighthouse.serve_authenticated(
        "127.0.0.1", 0, JOB, 1, ft_lighthouse.LighthouseTimeouts(), ready,
        owner_of=lambda job: os.getuid() if job == JOB else None)


#: One replica id on both paths: the lighthouse sees one replica, whose quorum forms at once
#: (a second id would wait for the first one's heartbeat to lapse).
REPLICA = "bench"


def _quorums(url: str, runs: int) -> list[float]:
    from torchft._torchft import LighthouseClient

    client = LighthouseClient(url, connect_timeout=timedelta(seconds=10))
    times = []
    for _ in range(runs + 1):
        start = time.perf_counter()
        client.quorum(replica_id=REPLICA, timeout=timedelta(seconds=10))
        times.append(time.perf_counter() - start)
    return times[1:]


def _connects(url: str, count: int) -> list[float]:
    from torchft._torchft import LighthouseClient

    times = []
    for _ in range(count):
        start = time.perf_counter()
        client = LighthouseClient(url, connect_timeout=timedelta(seconds=10))
        client.quorum(replica_id=REPLICA, timeout=timedelta(seconds=10))
        times.append(time.perf_counter() - start)
        del client
    return times


def _p90(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(0.9 * len(ordered)))]


def measure(runs: int, connects: int) -> dict[str, float]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    server = subprocess.Popen([sys.executable, __file__, "--serve"],  # noqa: S603
                              stdout=subprocess.PIPE, text=True, env=env)
    relay = None
    try:
        assert server.stdout is not None
        endpoint, direct = server.stdout.readline().split()
        relay = subprocess.Popen([sys.executable, "-m", "slurm_spot",  # noqa: S603
                                  "lighthouse-relay",
                                  "--lighthouse", endpoint, "--job", JOB],
                                 stdout=subprocess.PIPE, text=True, env=env)
        assert relay.stdout is not None
        relayed = relay.stdout.readline().strip()
        direct_s: list[float] = []
        relayed_s: list[float] = []
        for chunk in range(0, runs, 10):  # interleaved, 10 quorums at a time
            n = min(10, runs - chunk)
            direct_s += _quorums(direct, n)
            relayed_s += _quorums(relayed, n)
        connect_direct = _connects(direct, connects)
        connect_relayed = _connects(relayed, connects)
    finally:
        for proc in (relay, server):
            if proc is not None:
                proc.terminate()
                proc.wait(30)
    ms = 1000.0
    return {
        "runs": runs, "connects": connects,
        "direct_quorum_median_ms": round(statistics.median(direct_s) * ms, 3),
        "direct_quorum_p90_ms": round(_p90(direct_s) * ms, 3),
        "relayed_quorum_median_ms": round(statistics.median(relayed_s) * ms, 3),
        "relayed_quorum_p90_ms": round(_p90(relayed_s) * ms, 3),
        "added_per_quorum_median_ms": round((statistics.median(relayed_s)
                                             - statistics.median(direct_s)) * ms, 3),
        "direct_connect_median_ms": round(statistics.median(connect_direct) * ms, 2),
        "relayed_connect_median_ms": round(statistics.median(connect_relayed) * ms, 2),
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--runs", type=int, default=200, help="quorums per path")
    parser.add_argument("--connects", type=int, default=10, help="new clients per path")
    parser.add_argument("--no-write", action="store_true")
    parser.add_argument("--smoke", action="store_true", help="5 quorums, 2 connects, no write")
    args = parser.parse_args()
    if args.serve:
        serve()
        return
    result = measure(5, 2) if args.smoke else measure(args.runs, args.connects)
    print(json.dumps(result, indent=2))
    if args.no_write or args.smoke:
        return
    r = result
    text = (
        f"{BEGIN}\n## The authenticated lighthouse: what the relay adds per quorum (issue 27)\n\n"
        "`python benchmarks/ft_lighthouse_relay.py`: torchft's own client asks for a quorum of "
        "one replica, straight to the lighthouse on 127.0.0.1 (baseline, what "
        "`--unauthenticated` serves) and through `slurm-spot lighthouse-relay` and the front "
        "door of `slurm-spot lighthouse --job` (real MUNGE), interleaved 10 at a time, "
        f"{r['runs']} quorums per path on one kept connection; new connection = connect + "
        f"first quorum, median of {r['connects']} (relayed: with the MUNGE handshake). "
        "Loopback on this machine: the hops cost CPU and scheduling.\n\n"
        "| path | quorum median | quorum p90 | new connection (median) |\n|---|---|---|---|\n"
        f"| direct (unauthenticated) | {r['direct_quorum_median_ms']:.2f} ms | "
        f"{r['direct_quorum_p90_ms']:.2f} ms | {r['direct_connect_median_ms']:.1f} ms |\n"
        f"| relay + front door (MUNGE) | {r['relayed_quorum_median_ms']:.2f} ms | "
        f"{r['relayed_quorum_p90_ms']:.2f} ms | {r['relayed_connect_median_ms']:.1f} ms |\n\n"
        f"Added per quorum (median): {r['added_per_quorum_median_ms']:.2f} ms.\n{END}")
    write_section(ROOT / "BENCHMARKS.md", BEGIN, END, text)


if __name__ == "__main__":
    main()
