"""Training time lost per interruption with notice: an elastic job vs. checkpoint-and-requeue.

Method (one local cluster, the same training script, the runs of both modes interleaved):

1. ``slurm-spot local up`` with the reconciler (tests/cluster.py ``base_config``: 4 one-CPU
   nodes, reconcile interval 5 s, SuspendTime 10 s) and ``slurm-spot rendezvous`` on this host.
2. The job: ``examples/train_elastic.py --step-sleep 0.15 --checkpoint-every 20 --log-every 1``
   (scikit-learn's digits, an MLP, gloo on CPU; global batch 96 whatever the world size) on 3
   nodes, submitted either
   - *elastic*: ``slurm-spot sbatch --torchrun --elastic 2:3 --rendezvous HOST:PORT -N 3``
     (workers start warm: forks of a server that imported torch and the script's imports,
     slurm_spot.jobs.injob.warm_worker), or
   - *elastic-no-preload*: the same with ``--no-preload`` (each worker a new ``python -u``
     that imports torch and scikit-learn: the elastic mode before the warm start), or
   - *requeue*: ``slurm-spot sbatch --torchrun -N 3`` (one torchrun agent per node, a fixed
     world: on the preemption signal every rank saves and exits 85, the job is requeued with
     its job id and resumes from that checkpoint on 3 nodes, one of them a replacement).
3. Once the job reached step 15, ``slurm-spot local preempt NODE --notice 20`` on a node that
   is not the batch host (what the watcher then does is the product's normal path: drain,
   prewarm a replacement, signal, release (elastic) or requeue (requeue)).
4. From rank 0's events (one ``step`` event per step, each with its time): *last* = the last
   step completed before the interruption, *next* = the first step completed after it that
   is new progress. **Training time lost** = (time of *next* - time of *last*) - (*next* -
   *last*) x the median step time before the interruption: the wall time during which no new
   step completed, plus the steps redone from the checkpoint. *Pause* = from *last* to the
   first step completed after the restart (redone or not); *redone* = *last* - the step the
   run resumed from.
5. The job is cancelled a few steps after *next*; the cluster is left to settle (every node
   idle or powered down) before the next run.

The elastic pause is also split by the events: *last* -> ``leave`` (the agreed save at the
step boundary), ``leave`` -> ``resume`` (the agents see their workers exit, torchrun's
re-rendezvous, the workers' start, the process group and the checkpoint load), ``resume`` ->
the first step.

Run from the repository root on a machine with slurm-wlm and munge:
``python benchmarks/elastic_vs_requeue.py [--runs N] [--modes M,...] [--no-write]``. It holds
/tmp/slurm-spot-test-cluster.lock while its cluster runs, like the e2e tests.
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import os
import platform
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from datetime import datetime, timezone
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(ROOT))

from report import write_section  # noqa: E402 - benchmarks/report.py, beside this script

from slurm_spot.hostlist import expand  # noqa: E402
from slurm_spot.jsonenvelope import read_envelope  # noqa: E402
from tests.cluster import Cluster, base_config, wait_for  # noqa: E402

BEGIN, END = "<!-- elastic-vs-requeue:begin -->", "<!-- elastic-vs-requeue:end -->"
EXAMPLE = ROOT / "examples" / "train_elastic.py"
TRAIN_ARGS = ("--steps", "400", "--step-sleep", "0.15", "--checkpoint-every", "20",
              "--log-every", "1")
NOTICE_S = 20
AFTER_STEPS = 5  # steps past *next* before the job is cancelled
MODES = ("elastic", "elastic-no-preload", "requeue")
#: The events of a restarted training: ``resume`` from a checkpoint, or ``start`` at step 0
#: when there was none yet (a node killed without notice before the first checkpoint).
RESTARTS = ("resume", "start")


class EventLog:
    """Rank 0's JSON lines of one job, kept as they appear (a requeued job's output file may
    be truncated when it starts again: every line ever seen is kept)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.events: list[dict] = []
        self._seen: set[str] = set()

    def poll(self) -> list[dict]:
        if self.path.exists():
            for line in self.path.read_text(errors="replace").splitlines():
                if line.startswith("{") and line not in self._seen:
                    self._seen.add(line)
                    try:
                        self.events.append(json.loads(line))
                    except ValueError:
                        continue
        return self.events


def _until(log: EventLog, test: Callable[[list[dict]], bool], timeout_s: float,
           what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if test(log.poll()):
            return
        time.sleep(0.25)
    raise RuntimeError(f"timed out after {timeout_s:.0f} s waiting for {what}; events: "
                       f"{log.events[-5:]}")


def _steps(events: list[dict]) -> list[dict]:
    return [e for e in events if e["event"] == "step"]


def lost_time(events: list[dict], interrupted_at: float) -> dict[str, object]:
    """Step 4 of the method, from rank 0's events (each with ``time``, epoch seconds)."""
    before = [e for e in _steps(events) if e["time"] <= interrupted_at]
    restart = next(e for e in events if e["event"] in RESTARTS and e["time"] > interrupted_at)
    before += [e for e in _steps(events) if interrupted_at < e["time"] < restart["time"]]
    last = max(before, key=lambda e: e["step"])
    gaps = [b["time"] - a["time"] for a, b in itertools.pairwise(before)
            if b["step"] == a["step"] + 1]
    step_s = statistics.median(gaps)
    after = [e for e in _steps(events) if e["time"] > restart["time"]]
    first_after = min(after, key=lambda e: e["time"])
    nxt = next(e for e in after if e["step"] > last["step"])
    leave = next((e for e in events if e["event"] == "leave"), None)
    return {
        "lost_s": round(nxt["time"] - last["time"] - (nxt["step"] - last["step"]) * step_s, 2),
        "pause_s": round(first_after["time"] - last["time"], 2),
        "redone_steps": last["step"] - restart["step"],
        "step_s": round(step_s, 3), "last_step": last["step"], "resumed_at": restart["step"],
        "world_after": restart.get("world_size"), "restarts_after": restart.get("restarts"),
        "to_leave_s": round(leave["time"] - last["time"], 2) if leave else None,
        "leave_to_resume_s": round(restart["time"] - leave["time"], 2) if leave else None,
        "resume_to_step_s": round(first_after["time"] - restart["time"], 2),
    }


def _settle(cluster: Cluster, timeout_s: float = 180.0, nodes: int = 4) -> None:
    """Wait until every one of the ``nodes`` nodes is idle or powered down (no job, no
    drain, no down)."""
    def quiet() -> bool:
        out = cluster.slurm("sinfo", "-h", "-N", "-o", "%N %T", check=False)
        states = [line.split()[1] for line in out.splitlines() if len(line.split()) == 2]
        return len(states) == nodes and all(s.rstrip("~*") == "idle" for s in states)
    wait_for(quiet, timeout_s, what="every node idle or powered down")


def measure(cluster: Cluster, mode: str, rendezvous: str, notice_s: float = NOTICE_S,
            nodes: int = 4) -> dict[str, object]:
    """One run of ``mode`` (one of :data:`MODES`), steps 2-5 of the method; ``notice_s`` 0:
    the node is killed without notice (``local preempt NODE --notice 0``) instead of step 3's
    notice. ``nodes``: how many nodes the cluster has (what step 5 waits to be idle)."""
    out = cluster.root / f"{mode}-%j.out"
    elastic = ["--elastic", "2:3", "--rendezvous", rendezvous, "--join-timeout", "30"] \
        if mode.startswith("elastic") else []
    if mode == "elastic-no-preload":
        elastic.append("--no-preload")
    env = {**cluster.env, "GLOO_SOCKET_IFNAME": "lo"}
    proc = subprocess.run(  # noqa: S603 - our own CLI, argv list
        [sys.executable, "-m", "slurm_spot", "--config", str(cluster.spot_yaml), "sbatch",
         "--torchrun", *elastic, "--json", "-p", "spot", "-N", "3", "-o", str(out),
         str(EXAMPLE), *TRAIN_ARGS], env=env, capture_output=True, text=True, timeout=120)
    if proc.returncode != 0:
        raise RuntimeError(f"sbatch failed: {proc.stderr}")
    job = int(read_envelope(proc.stdout, "sbatch")["job_id"])
    log = EventLog(Path(str(out).replace("%j", str(job))))
    try:
        _until(log, lambda ev: any(e["step"] >= 15 for e in _steps(ev)), 300,
               "3-node training to reach step 15")
        fields = cluster.job(job)
        node = next(n for n in reversed(expand(fields["NodeList"])) if n != fields["BatchHost"])
        interrupted_at = time.time()
        cluster.spot("local", "preempt", node, "--notice", str(notice_s), "--conf-dir",
                     str(cluster.conf_dir))

        def progressed(ev: list[dict]) -> bool:
            resumed = [e for e in ev if e["event"] in RESTARTS and e["time"] > interrupted_at]
            if not resumed:
                return False
            top = max((e["step"] for e in _steps(ev) if e["time"] <= resumed[0]["time"]),
                      default=0)
            return any(e["step"] >= top + AFTER_STEPS for e in _steps(ev)
                       if e["time"] > resumed[0]["time"])
        _until(log, progressed, 400, "training to go on after the interruption")
        result = {"mode": mode, "job": job, "node": node, **lost_time(log.events, interrupted_at)}
        result["job_restarts"] = int(cluster.job(job).get("Restarts", "0"))
        return result
    finally:
        cluster.slurm("scancel", str(job), check=False)
        wait_for(lambda: cluster.job(job).get("JobState") not in
                 ("RUNNING", "COMPLETING", "PENDING", "CONFIGURING", "REQUEUED"), 120,
                 what=f"job {job} to end")
        _settle(cluster, nodes=nodes)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextlib.contextmanager
def cluster_and_rendezvous(root: Path, config: dict) -> Iterator[tuple[Cluster, str]]:
    """A local cluster (reconciler on) at ``root`` and ``slurm-spot rendezvous`` on a free
    loopback port: ``(cluster, "127.0.0.1:PORT")``; both stopped, and root's jobs cancelled,
    on the way out."""
    cluster = Cluster(root, config, reconcile=True)
    cluster.start()
    port = _free_port()
    service = subprocess.Popen([sys.executable, "-m", "slurm_spot",  # noqa: S603 - ours
                                "rendezvous", "--listen",
                                "127.0.0.1", "--port", str(port)], stderr=subprocess.PIPE,
                               text=True, env=cluster.env)
    try:
        assert service.stderr is not None
        if "listening" not in service.stderr.readline():
            raise RuntimeError("slurm-spot rendezvous did not start")
        yield cluster, f"127.0.0.1:{port}"
    finally:
        service.terminate()
        service.wait(30)
        cluster.slurm("scancel", "-u", "root", check=False)
        cluster.stop()


def run_all(runs: int, modes: tuple[str, ...] = MODES) -> list[dict[str, object]]:
    """Start the cluster and the rendezvous service; ``runs`` runs of each mode, interleaved."""
    root = Path(tempfile.mkdtemp(prefix="elastic-bench-"))
    results: list[dict[str, object]] = []
    with cluster_and_rendezvous(root, base_config(root)) as (cluster, address):
        for i in range(runs):
            for mode in modes:
                try:
                    results.append(measure(cluster, mode, address))
                except (RuntimeError, AssertionError, StopIteration, ValueError) as exc:
                    results.append({"mode": mode, "error": str(exc)[:300]})
                print(json.dumps({"run": i + 1, **results[-1]}), flush=True)
    return results


def _median(rows: list[dict[str, object]], key: str, digits: int = 1) -> str:
    values = [float(r[key]) for r in rows if isinstance(r.get(key), (int, float))]  # type: ignore[arg-type]
    if not values:
        return "-"
    return (f"{statistics.median(values):.{digits}f} "
            f"({min(values):.{digits}f}-{max(values):.{digits}f})")


def section(results: list[dict[str, object]]) -> str:
    """The BENCHMARKS.md section (between the markers) for ``results``."""
    when = next((str(r["measured"]) for r in results if "measured" in r), "?")
    table = []
    for mode in [m for m in MODES if any(r["mode"] == m for r in results)]:
        ok = [r for r in results if r["mode"] == mode and "error" not in r]
        failed = sum(1 for r in results if r["mode"] == mode and "error" in r)
        table.append(
            f"| {mode} | {len(ok)}{f' (+{failed} failed)' if failed else ''} | "
            f"{_median(ok, 'lost_s')} | {_median(ok, 'pause_s')} | "
            f"{_median(ok, 'redone_steps', 0)} | {_median(ok, 'step_s', 2)} | "
            f"{', '.join(str(r.get('world_after')) for r in ok) or '-'} | "
            f"{', '.join(str(r.get('job_restarts')) for r in ok) or '-'} |")
    elastic = [r for r in results if r["mode"] == "elastic" and "error" not in r]

    def split(rows: list[dict[str, object]]) -> str:
        return (f"{_median(rows, 'to_leave_s', 2)} s to the agreed save and `leave`,\n  "
                f"{_median(rows, 'leave_to_resume_s')} s from `leave` to `resume`, "
                f"{_median(rows, 'resume_to_step_s', 2)} s from `resume` to the first step")
    splits = "\n".join(
        f"- *{mode}*: {split([r for r in results if r['mode'] == mode and 'error' not in r])}."
        for mode in MODES[:2] if any(r["mode"] == mode for r in results))
    lost = [float(r["lost_s"]) for r in elastic]  # type: ignore[arg-type]
    verdict = (f"met (median {statistics.median(lost):.1f} s, slowest run {max(lost):.1f} s)"
               if lost and statistics.median(lost) < 10 else
               "not met on this machine" if lost else "not measured")
    errors = "".join(f"\n- {r['mode']}: {r['error']}" for r in results if "error" in r)
    return f"""{BEGIN}
## Training time lost per interruption with notice: elastic vs. requeue

The same job (`examples/train_elastic.py`, 3 nodes, 0.15 s sleep per step, a checkpoint every
20 steps) loses one worker (not the batch host) with a {NOTICE_S} s notice at step ~15
(`slurm-spot local preempt NODE --notice {NOTICE_S}`), as an *elastic* job (`--elastic 2:3`:
the other two go on) and as a plain `--torchrun` job (*requeue*: every rank saves, the job is
requeued and resumes on 3 nodes). Seconds; median (min-max) of the runs; both modes measured
side by side in this run, interleaved, on one cluster.

| mode | runs | time lost (s) | pause (s) | redone steps | step (s) | world after | restarts |
|---|---|---|---|---|---|---|---|
{chr(10).join(table)}

*Training time lost* = wall time with no new step completed, plus steps redone, less the
time the steps in that gap would have taken anyway (method: the script's docstring).
Elastic pause, split by rank 0's events:

{splits}

Where it goes: `leave` -> `resume` is the agents noticing their workers' exit (torchrun polls
every 0.5 s here), the new rendezvous round (it completes `last_call_timeout` = 2 s after
MIN nodes joined: the third node is gone, so the round always waits that long), then the
workers' start: *elastic-no-preload* starts each worker as a new `python -u`, which imports
torch and scikit-learn again (2.4 + 1.9 s on an idle machine, more when the 2 CPUs are busy
with 3 nodes' agents); *elastic* forks them from the agent's fork server, which imported both
before the first round (slurm_spot.jobs.injob.warm_worker). What is left of a warm worker's start
is the script's own: the gloo process group (a new store per round), the data set and the
checkpoint load. With torchrun's INFO log (`LOGLEVEL=INFO`) the agents show the two parts:
"Rendezvous'ing worker group" -> "Rendezvous complete", and "Starting worker group" -> the
`resume` event.
Target (issue 13): elastic loses < 10 s per interruption with notice: {verdict}.

Method: `python benchmarks/elastic_vs_requeue.py --runs N` ({when}; {os.cpu_count()} CPUs,
{platform.system()} {platform.release()}, a machine shared with other work). Local cluster
of tests/cluster.py `base_config` with the reconciler (interval 5 s); `slurm-spot rendezvous`
on the controller; the watcher's normal path (prewarm on: the signal comes when the
replacement is up). The requeue mode's pause includes the job leaving, its requeue
(`StartTime=now` clears the ~121 s hold), a fresh allocation with the replacement node, torch
imports on every node and the checkpoint load.{errors}
{END}"""


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=3, help="runs of each mode (default 3)")
    parser.add_argument("--modes", default=",".join(MODES),
                        help=f"comma-separated, of {', '.join(MODES)} (default: all)")
    parser.add_argument("--smoke", action="store_true",
                        help="check the arithmetic on canned events; no cluster, nothing written")
    parser.add_argument("--no-write", action="store_true", help="do not update BENCHMARKS.md")
    parser.add_argument("--output", type=Path, default=ROOT / "BENCHMARKS.md")
    parser.add_argument("--json", type=Path, default=HERE / "elastic_vs_requeue.json",
                        help="the runs' results are kept here")
    parser.add_argument("--from-json", action="store_true",
                        help="no runs: rewrite the section from the results kept in --json")
    args = parser.parse_args(argv)
    if args.smoke:
        canned = ([{"event": "step", "step": s, "time": 100.0 + s * 0.2} for s in range(1, 31)]
                  + [{"event": "leave", "step": 30, "time": 106.5},
                     {"event": "resume", "step": 30, "time": 110.0, "world_size": 2},
                     *({"event": "step", "step": s, "time": 111.0 + (s - 31) * 0.2}
                       for s in range(31, 40))])
        print(json.dumps(lost_time(canned, 103.0)))
        return
    if args.from_json:
        write_section(args.output, BEGIN, END, section(json.loads(args.json.read_text())))
        return
    stamp = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    modes = tuple(m for m in args.modes.split(",") if m)
    if not modes or any(m not in MODES for m in modes):
        parser.error(f"--modes={args.modes}: expected some of {', '.join(MODES)}")
    results = [{**r, "measured": stamp} for r in run_all(args.runs, modes)]
    if not args.no_write:
        args.json.write_text(json.dumps(results, indent=1) + "\n")
        write_section(args.output, BEGIN, END, section(results))
    if all("error" in r for r in results):
        sys.exit(1)


if __name__ == "__main__":
    main()
