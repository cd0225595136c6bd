"""What one reconciler pass spends reading the events file, as the file grows.

Method:

1. An events file of N MB of ordinary events (``launched``, one node each, ~200 bytes a line),
   for N in 1, 8, 32 and 128.
2. Baseline: :func:`slurm_spot.reconcile.history.read_tail` (the last 8 MB, parsed every pass,
   what the reconciler did before issue 11).
3. Now: one :class:`slurm_spot.reconcile.history.EventTail` that read the file once; then 10
   new events are appended and it is read again (one pass's worth of new lines).
4. Median of 5 runs of each read; wall time on this machine, bytes parsed from ``bytes_read``.

Run from the repository root: ``python benchmarks/events_tail.py [--no-write] [--smoke]``
(``--smoke``: the 1 MB file only, nothing written). Results go to
stdout (JSON) and into BENCHMARKS.md between the events-tail markers.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from report import write_section  # noqa: E402 - benchmarks/report.py, beside this script

from slurm_spot.events import EVENTS_FILE, Action, Event  # noqa: E402
from slurm_spot.reconcile.history import EventTail, read_tail  # noqa: E402

BEGIN, END = "<!-- events-tail:begin -->", "<!-- events-tail:end -->"
RUNS = 5


def _fill(path: Path, megabytes: int) -> None:
    now = datetime.now(timezone.utc).isoformat()
    line = (Event(Action.LAUNCHED, "resume", node="spot-1", instance="i-0123456789abcdef0",
                  time=now).to_json() + "\n").encode()
    with open(path, "wb") as fh:
        fh.write(line * (megabytes * 1024 * 1024 // len(line)))


def _median_s(action) -> float:  # type: ignore[no-untyped-def]
    times = []
    for _ in range(RUNS):
        start = time.perf_counter()
        action()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def measure(megabytes: int) -> dict[str, float]:
    with tempfile.TemporaryDirectory() as tmp:
        log_dir = Path(tmp)
        _fill(log_dir / EVENTS_FILE, megabytes)
        baseline = _median_s(lambda: read_tail(log_dir))
        tail = EventTail(log_dir, keep_s=7200)
        tail.read(datetime.now(timezone.utc))
        new_bytes = []

        def one_pass() -> None:
            with open(log_dir / EVENTS_FILE, "ab") as fh:
                for _ in range(10):
                    fh.write((Event(Action.TERMINATED, "reconcile", node="spot-2").to_json()
                              + "\n").encode())
            tail.read(datetime.now(timezone.utc))
            new_bytes.append(tail.bytes_read)

        now = _median_s(one_pass)
    return {"file_mb": megabytes, "baseline_read_tail_s": round(baseline, 4),
            "event_tail_pass_s": round(now, 4), "bytes_parsed_per_pass": statistics.median(new_bytes)}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--no-write", action="store_true")
    parser.add_argument("--smoke", action="store_true", help="a 1 MB file only, no writing")
    args = parser.parse_args()
    rows = [measure(mb) for mb in ((1,) if args.smoke else (1, 8, 32, 128))]
    print(json.dumps(rows, indent=2))
    if args.no_write or args.smoke:
        return
    table = "\n".join(
        f"| {r['file_mb']} MB | {r['baseline_read_tail_s'] * 1000:.1f} ms | "
        f"{r['event_tail_pass_s'] * 1000:.2f} ms | {int(r['bytes_parsed_per_pass'])} B |"
        for r in rows)
    text = (f"{BEGIN}\n## Events file read per reconciler pass\n\n"
            "`python benchmarks/events_tail.py`: median of 5 reads; baseline = last 8 MB "
            "parsed every pass (before issue 11), now = EventTail after its first read, with "
            "10 new events per pass.\n\n"
            "| events file | baseline read_tail | EventTail pass | bytes parsed per pass |\n"
            "|---|---|---|---|\n" + table + f"\n{END}")
    write_section(ROOT / "BENCHMARKS.md", BEGIN, END, text)


if __name__ == "__main__":
    main()
