"""Training time lost per interruption, with notice and without, in four modes of the same job
on one cluster: requeue, elastic, elastic warm, fault-tolerant (issue 27's Targets).

Method (one local cluster, the runs of every mode and kind interleaved):

1. ``slurm-spot local up`` with the reconciler (tests/cluster.py ``base_config``: interval 5 s,
   SuspendTime 10 s) with 5 one-CPU spot nodes (partition ``spot``) and one on-demand node
   ``coord-1`` (partition ``ondemand``, for the lighthouse), ``slurm-spot rendezvous`` on this
   host.
2. The job trains scikit-learn's digits with an MLP (gloo on CPU, global batch 96 whatever the
   number of workers, 0.15 s sleep per step, a checkpoint every 20 steps, one event per step):
   - *requeue*, *elastic*, *elastic warm*: ``examples/train_elastic.py`` on 3 nodes, the modes
     ``requeue``, ``elastic-no-preload`` and ``elastic`` of benchmarks/elastic_vs_requeue.py
     (its docstring: a fixed world that saves and is requeued; ``--elastic 2:3`` whose workers
     start as new processes; the same whose workers are forks of a server that imported torch);
   - *fault-tolerant*: ``examples/train_ft.py`` through ``slurm-spot sbatch --torchrun
     --fault-tolerant 3 --coordinator-partition ondemand -p spot``: the lighthouse job on
     ``coord-1``, 3 replica-group jobs of one node each.
3. Once the job reached step 15, one worker node (not the batch host; for fault-tolerant, group
   g1's node) is reclaimed, either **with notice** (``slurm-spot local preempt NODE --notice
   20``: the watcher prewarms a replacement, then signals) or **without** (``--notice 0``: the
   instance is killed at once; the reconciler finds it and requeues what needs it).
4. **Training time lost**, the same quantity in every mode: the wall time during which the job
   completed no new step, less the time one step takes anyway, plus the steps redone:
   - requeue, elastic, elastic warm (rank 0's events; elastic_vs_requeue.lost_time): *last* =
     the last step completed before the interruption, *next* = the first new step after it;
     lost = (time of *next* - time of *last*) - (*next* - *last*) x the median step time
     before the interruption (steps redone from the checkpoint are in that gap);
   - fault-tolerant: the surviving groups never restart: lost = the survivors' longest gap
     between two consecutive steps (of one group's run) whose later step lies between the
     interruption (g1's ``leave`` event with notice, the kill otherwise) and the replacement's
     ``start`` (at most 15 s), less the median step time before the interruption. A step that
     was not committed (a peer lost in its all-reduce) is done again and lies in that gap.
     Reported beside it: *gap* (the survivors' longest gap itself, issue 27's target), and the
     replacement's heal from a peer (``heal_s``, ``bytes``) with the survivors' longest gap
     within 2 s of the heal (*join pause*: a second, smaller pause the other modes do not
     have, as their replacement joins at the restart).
5. The job(s) are cancelled once the measurement is in (fault-tolerant: once the replacement
   healed); the cluster is left to settle (every node idle or powered down) before the next run.

Run from the repository root on a machine with slurm-wlm and munge, the ft extra installed
(``pip install -e '.[ft]'``): ``python benchmarks/four_modes.py [--runs N] [--modes M,...]
[--kinds notice,kill] [--no-write]``. It holds the test-cluster lock while its cluster runs,
like the e2e tests; run it in a private network namespace (tests/netns.py). One round (the
8 runs of 4 modes x 2 kinds) took ~12 minutes on the shared 2-CPU test machine, so ``make
bench`` (benchmarks/run.py, under 20 minutes in all) leaves it out; ``--from-json`` rewrites
the section from the results kept in four_modes.json, ``--smoke`` checks the fault-tolerant
arithmetic on canned events.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from datetime import datetime, timezone
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import elastic_vs_requeue as evr  # noqa: E402 - benchmarks/, beside this script
from report import write_section  # noqa: E402

from slurm_spot.jobs.submit import ft_scripts  # noqa: E402
from slurm_spot.jsonenvelope import read_envelope  # noqa: E402
from slurm_spot.localcluster.ft_demo import max_gap, step_runs  # noqa: E402
from tests.cluster import Cluster, base_config, wait_for  # noqa: E402

BEGIN, END = "<!-- four-modes:begin -->", "<!-- four-modes:end -->"
FT_EXAMPLE = evr.ROOT / "examples" / "train_ft.py"
#: The fault-tolerant job's arguments: those of the other modes' job, more steps (it runs
#: until its replacement healed, 50-70 s after the loss on the loaded test machine).
FT_ARGS = ("--steps", "3000", "--step-sleep", "0.15", "--checkpoint-every", "20",
           "--log-every", "1")
#: Mode names here -> the modes of elastic_vs_requeue.py, and the fault-tolerant one.
MODES = {"requeue": "requeue", "elastic": "elastic-no-preload", "elastic warm": "elastic",
         "fault-tolerant": None}
KINDS = {"notice": evr.NOTICE_S, "kill": 0}
SPOT_NODES = 5
LOSS_WINDOW_S = 15.0
JOIN_WINDOW_S = 2.0
#: Targets: issue 27 (fault-tolerant, survivors' longest gap) and the earlier measurements of
#: elastic and requeue with notice (BENCHMARKS.md, elastic-vs-requeue).
TARGETS = {"notice": "< 1 s", "kill": "< 5 s"}


def cluster_config(root: Path) -> dict:
    """``base_config`` with :data:`SPOT_NODES` spot nodes and one on-demand node ``coord-1``
    in partition ``ondemand`` (the lighthouse's)."""
    return base_config(
        root,
        node_sets=[{"name": "spot", "provider": "local", "count": SPOT_NODES, "cpus": 1},
                   {"name": "coord", "provider": "local", "count": 1, "cpus": 1,
                    "market": "on-demand"}],
        partitions=[{"name": "spot", "node_sets": ["spot"], "default": True},
                    {"name": "ondemand", "node_sets": ["coord"]}])


def ft_lost(logs: dict[str, list[dict]], group: str, interrupted_at: float) -> dict[str, object]:
    """Step 4 of the method for fault-tolerant, from every group's events (``logs``: group
    name -> its events in order, each with ``time`` in epoch seconds); ``group`` is the one
    reclaimed at ``interrupted_at``.

    Raises:
        ValueError: no survivor completed two steps before the interruption.
    """
    survivors = {g: step_runs(ev) for g, ev in logs.items() if g != group}
    before = [b - a for runs in survivors.values() for times in runs
              for a, b in itertools.pairwise(times) if b <= interrupted_at]
    if not before:
        raise ValueError("no survivor step before the interruption")
    step_s = statistics.median(before)
    mine = logs[group]
    starts = [float(e["time"]) for e in mine
              if e.get("event") == "start" and float(e["time"]) > interrupted_at]
    end = min([interrupted_at + LOSS_WINDOW_S, *starts[:1]])
    gap = max((max_gap(times, interrupted_at, end) for runs in survivors.values()
               for times in runs), default=0.0)
    heal = next((e for e in mine if e.get("event") == "heal"
                 and float(e["time"]) > interrupted_at), None)
    join_gap = None
    if heal is not None:
        at = float(heal["time"])
        join_gap = max((max_gap(times, at - JOIN_WINDOW_S, at + JOIN_WINDOW_S)
                        for runs in survivors.values() for times in runs), default=0.0)
    return {"lost_s": round(gap - step_s, 2), "gap_s": gap, "step_s": round(step_s, 3),
            "window_s": round(end - interrupted_at, 1),
            "heal_s": heal.get("heal_s") if heal else None,
            "heal_bytes": heal.get("bytes") if heal else None,
            "heal_after_s": round(float(heal["time"]) - interrupted_at, 1) if heal else None,
            "join_pause_s": join_gap}


def measure_ft(cluster: Cluster, notice_s: float) -> dict[str, object]:
    """One fault-tolerant run (steps 2-5 of the method); ``notice_s`` 0: killed without notice."""
    out = cluster.root / "ft-%j.out"
    env = {**cluster.env, "GLOO_SOCKET_IFNAME": "lo", "PYTHONUNBUFFERED": "1"}
    for name in ("SLURM_SPOT_CHECKPOINT_DIR", "TORCHFT_LIGHTHOUSE", "REPLICA_GROUP_ID"):
        env.pop(name, None)
    proc = subprocess.run(  # noqa: S603 - our own CLI, argv list
        [sys.executable, "-m", "slurm_spot", "--config", str(cluster.spot_yaml), "sbatch",
         "--torchrun", "--fault-tolerant", "3", "--coordinator-partition", "ondemand",
         "--json", "-p", "spot", "-o", str(out), str(FT_EXAMPLE), *FT_ARGS],
        env=env, capture_output=True, text=True, timeout=120)
    if proc.returncode != 0:
        raise RuntimeError(f"sbatch failed: {proc.stderr}")
    submitted = read_envelope(proc.stdout, "sbatch")
    groups = dict(zip(submitted["groups"], (int(j) for j in submitted["group_job_ids"]),
                      strict=True))
    jobs = [int(submitted["lighthouse_job_id"]), *groups.values()]
    logs = {g: evr.EventLog(Path(str(out).replace("%j", str(job)))) for g, job in groups.items()}

    def every() -> dict[str, list[dict]]:
        return {g: log.poll() for g, log in logs.items()}

    def until(test, timeout_s: float, what: str) -> None:  # type: ignore[no-untyped-def]
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if test(every()):
                return
            time.sleep(0.25)
        raise RuntimeError(f"timed out after {timeout_s:.0f} s waiting for {what}; last "
                           f"events: { {g: ev[-2:] for g, ev in every().items()} }")
    try:
        until(lambda ev: all(any(e["event"] == "step" and e["step"] >= 15 for e in evs)
                             for evs in ev.values()), 300, "every group to reach step 15")
        node = cluster.job(groups["g1"])["NodeList"]
        killed_at = time.time()
        cluster.spot("local", "preempt", node, "--notice", str(notice_s), "--conf-dir",
                     str(cluster.conf_dir))
        interrupted_at = killed_at
        if notice_s:
            until(lambda ev: any(e["event"] == "leave" and e["time"] >= killed_at
                                 for e in ev["g1"]), notice_s + 60, "g1 to leave")
            interrupted_at = next(float(e["time"]) for e in every()["g1"]
                                  if e["event"] == "leave" and e["time"] >= killed_at)
        until(lambda ev: any(e["event"] == "heal" and e["time"] > interrupted_at
                             for e in ev["g1"]), 300, "g1's replacement to heal from a peer")
        time.sleep(JOIN_WINDOW_S + 0.5)
        result = {"mode": "fault-tolerant", "job": groups["g1"], "node": node,
                  **ft_lost(every(), "g1", interrupted_at)}
        result["job_restarts"] = int(cluster.job(groups["g1"]).get("Restarts", "0"))
        result["heartbeat_timeout_ms"] = ft_scripts.HEARTBEAT_TIMEOUT_MS
        result["join_timeout_ms"] = ft_scripts.JOIN_TIMEOUT_MS
        return result
    finally:
        cluster.slurm("scancel", *map(str, jobs), check=False)
        for job in jobs:
            wait_for(lambda job=job: cluster.job(job).get("JobState") not in  # type: ignore[misc]
                     ("RUNNING", "COMPLETING", "PENDING", "CONFIGURING", "REQUEUED"), 120,
                     what=f"job {job} to end")
        evr._settle(cluster, nodes=SPOT_NODES + 1)


def run_all(runs: int, modes: tuple[str, ...], kinds: tuple[str, ...],
            keep: Callable[[list[dict[str, object]]], None]) -> list[dict[str, object]]:
    """Start the cluster and the rendezvous service; ``runs`` rounds, each one run of every
    mode and kind, interleaved; ``keep`` gets the results so far after every run (a
    benchmark stopped half-way keeps what it measured)."""
    root = Path(tempfile.mkdtemp(prefix="four-modes-", dir="/tmp"))
    results: list[dict[str, object]] = []
    with evr.cluster_and_rendezvous(root, cluster_config(root)) as (cluster, address):
        for i in range(runs):
            for kind in kinds:
                for mode in modes:
                    load = os.getloadavg()[0]
                    try:
                        if MODES[mode] is None:
                            row = measure_ft(cluster, KINDS[kind])
                        else:
                            row = evr.measure(cluster, str(MODES[mode]), address,
                                              notice_s=KINDS[kind], nodes=SPOT_NODES + 1)
                    except (RuntimeError, AssertionError, StopIteration, ValueError,
                            KeyError) as exc:
                        row = {"error": str(exc)[:300]}
                    results.append({**row, "mode": mode, "kind": kind, "load_1m": load})
                    print(json.dumps({"run": i + 1, **results[-1]}), flush=True)
                    keep(results)
    return results


def section(results: list[dict[str, object]]) -> str:
    """The BENCHMARKS.md section (between the markers) for ``results``."""
    when = next((str(r["measured"]) for r in results if "measured" in r), "?")
    med = evr._median
    rows = []
    for mode in [m for m in MODES if any(r["mode"] == m for r in results)]:
        cells = []
        for kind in KINDS:
            ok = [r for r in results if (r["mode"], r["kind"]) == (mode, kind) and "error" not in r]
            failed = sum(1 for r in results
                         if (r["mode"], r["kind"]) == (mode, kind) and "error" in r)
            runs = f"{len(ok)}{f' (+{failed} failed)' if failed else ''}"
            pause = med(ok, "gap_s" if MODES[mode] is None else "pause_s", 2)
            cells.append(f"{med(ok, 'lost_s', 2)} | {pause} | {med(ok, 'redone_steps', 0)} "
                         f"| {runs}")
        rows.append(f"| {mode} | {' | '.join(cells)} |")
    ft = [r for r in results if r["mode"] == "fault-tolerant" and "error" not in r]
    worlds = "\n".join(
        f"- {mode}, {kind}: " + "; ".join(
            f"{r.get('world_after')} nodes, {r.get('job_restarts', '?')} job restart(s)"
            for r in results if (r["mode"], r["kind"]) == (mode, kind) and "error" not in r)
        for mode in MODES if MODES[mode] is not None for kind in KINDS
        if any((r["mode"], r["kind"]) == (mode, kind) and "error" not in r for r in results))
    verdicts = []
    for kind, target in TARGETS.items():
        gaps = [float(r["gap_s"]) for r in ft if r["kind"] == kind]  # type: ignore[arg-type]
        limit = float(target.split()[1])
        verdicts.append(
            f"{kind}: target {target}, " + (
                f"{'met' if statistics.median(gaps) < limit else 'not met'} (median "
                f"{statistics.median(gaps):.2f} s, slowest run {max(gaps):.2f} s)"
                if gaps else "not measured"))
    heals = "\n".join(
        f"- {kind}: heal {med([r for r in ft if r['kind'] == kind], 'heal_s', 2)} s, "
        f"{med([r for r in ft if r['kind'] == kind], 'heal_bytes', 0)} bytes, "
        f"{med([r for r in ft if r['kind'] == kind], 'heal_after_s', 0)} s after the loss; "
        f"the survivors' longest gap around the heal (join pause) "
        f"{med([r for r in ft if r['kind'] == kind], 'join_pause_s', 2)} s"
        for kind in KINDS if any(r["kind"] == kind for r in ft))
    timing = sorted({(r.get("heartbeat_timeout_ms"), r.get("join_timeout_ms")) for r in ft})
    timing_text = ", ".join(f"heartbeat timeout {h} ms, join timeout {j} ms" for h, j in timing)
    loads = [float(r["load_1m"]) for r in results if isinstance(r.get("load_1m"), (int, float))]  # type: ignore[arg-type]
    load = (f"1-minute load average at each run's start {statistics.median(loads):.1f} "
            f"(median; {min(loads):.1f}-{max(loads):.1f})" if loads else "load not recorded")
    errors = "".join(f"\n- {r['mode']}, {r['kind']}: {r['error']}" for r in results if "error" in r)
    errors += "".join(f"\n- {r['mode']}, {r['kind']}: {r['note']}" for r in results if "note" in r)
    return f"""{BEGIN}
## Training time lost per interruption, four modes, with notice and without (issue 27)

The same training (scikit-learn's digits, an MLP, global batch 96, 0.15 s sleep per step, a
checkpoint every 20 steps) on 3 spot nodes loses one of them at step ~15, with a
{evr.NOTICE_S} s notice (`slurm-spot local preempt NODE --notice {evr.NOTICE_S}`) or killed
without one (`--notice 0`). Modes: *requeue* (plain `--torchrun`: every rank saves, the job is
requeued and resumes from the checkpoint), *elastic* (`--elastic 2:3 --no-preload`: the
survivors restart their workers as new processes), *elastic warm* (`--elastic 2:3`: workers
forked from a server that imported torch), *fault-tolerant* (`--fault-tolerant 3
--coordinator-partition ondemand`, examples/train_ft.py: torchft replica groups; the survivors
never restart, the replacement heals from a peer). Seconds; median (min-max) of the runs, all
interleaved on one cluster.

| mode | notice: lost (s) | pause (s) | redone | runs | kill: lost (s) | pause (s) | redone | runs |
|---|---|---|---|---|---|---|---|---|
{chr(10).join(rows)}

What is measured (method: the script's docstring): *lost* = the wall time in which the job
completed no new step, less one step's time, plus the steps redone. For requeue and elastic it
is rank 0's, from the last step before the interruption to the first new step after the
restart; *pause* is from that last step to the first step after the restart (redone or not).
For fault-tolerant the surviving groups keep training: *pause* is their longest gap between
two consecutive steps after the interruption (the group's `leave` with notice, the kill
without) until the replacement starts, *lost* that gap less one step; a step whose all-reduce
lost a peer is not committed and is done again inside that gap (so *redone* is 0). Without
notice, requeue and elastic redo the steps since the last checkpoint (every 20 steps here, so
0-19 depending on where the kill lands; at step ~15-19 before the first one, all of them): a
property of the checkpoint interval, which fault-tolerant training does not have.
Fault-tolerant targets (issue 27, the survivors' longest gap): {'; '.join(verdicts)}.
Per run, the world the training went on with and the job's restarts (Slurm's count; an
elastic job with a restart was requeued instead of going on, why was not examined here; 3
nodes after a notice: the prewarmed replacement joined the new round):

{worlds}

Earlier measurements with notice: elastic (warm) ~9 s, requeue ~37 s (section
elastic-vs-requeue). Where the fault-tolerant pause goes: the survivors' next quorum waits until
the lost group's last heartbeat is older than the lighthouse's heartbeat timeout (below), then
they take their step; nobody restarts, loads a checkpoint or redoes a step (docs/ml-engineer.md,
"How long the survivors wait"). The replacement group's join, later:

{heals or '- not measured'}

Method: `python benchmarks/four_modes.py --runs N` ({when}; {os.cpu_count()} CPUs,
{platform.system()} {platform.release()}, a machine shared with other work: {load}).
Local cluster of tests/cluster.py `base_config` with the reconciler (interval 5 s), 5 spot
nodes and one on-demand node for the lighthouse; `slurm-spot rendezvous` on the controller;
the watcher's normal path (prewarm on). The lighthouse's timing is the one `sbatch
--fault-tolerant` renders (slurm_spot/jobs/submit/ft_scripts.py): {timing_text or '-'}.{errors}
{END}"""


def _canned() -> dict[str, list[dict]]:
    """Three groups stepping every 0.2 s; g1 leaves at 105.0, the others pause 0.7 s, g1's
    replacement starts at 130.0 and heals at 131.0 (what ``--smoke`` measures: gap 0.7 s,
    lost 0.5 s)."""
    times = [100 + 0.2 * i for i in range(26)] + [105.7 + 0.2 * i for i in range(200)]
    logs = {g: [{"event": "start", "time": 99.0}]
            + [{"event": "step", "step": i + 1, "time": t} for i, t in enumerate(times)]
            for g in ("g0", "g2")}
    logs["g1"] = [{"event": "start", "time": 99.0}, {"event": "leave", "time": 105.0},
                  {"event": "start", "time": 130.0},
                  {"event": "heal", "time": 131.0, "heal_s": 0.2, "bytes": 1000}]
    return logs


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=2,
                        help="runs of each mode and kind (default 2)")
    parser.add_argument("--modes", default=",".join(MODES),
                        help=f"comma-separated, of {', '.join(MODES)} (default: all)")
    parser.add_argument("--kinds", default=",".join(KINDS),
                        help="comma-separated, of notice, kill (default: both)")
    parser.add_argument("--smoke", action="store_true",
                        help="check the arithmetic on canned events; no cluster, nothing written")
    parser.add_argument("--no-write", action="store_true", help="do not update BENCHMARKS.md")
    parser.add_argument("--output", type=Path, default=evr.ROOT / "BENCHMARKS.md")
    parser.add_argument("--json", type=Path, default=HERE / "four_modes.json",
                        help="the runs' results are kept here")
    parser.add_argument("--from-json", action="store_true",
                        help="no runs: rewrite the section from the results kept in --json")
    args = parser.parse_args(argv)
    if args.smoke:
        print(json.dumps(ft_lost(_canned(), "g1", 105.0)))
        return
    if args.from_json:
        write_section(args.output, BEGIN, END, section(json.loads(args.json.read_text())))
        return
    modes = tuple(m for m in args.modes.split(",") if m)
    kinds = tuple(k for k in args.kinds.split(",") if k)
    if not modes or any(m not in MODES for m in modes):
        parser.error(f"--modes={args.modes}: expected some of {', '.join(MODES)}")
    if not kinds or any(k not in KINDS for k in kinds):
        parser.error(f"--kinds={args.kinds}: expected some of {', '.join(KINDS)}")
    stamp = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")

    def keep(rows: list[dict[str, object]]) -> None:
        if not args.no_write:
            args.json.write_text(json.dumps([{**r, "measured": stamp} for r in rows],
                                            indent=1) + "\n")
    results = [{**r, "measured": stamp} for r in run_all(args.runs, modes, kinds, keep)]
    if not args.no_write:
        keep(results)
        write_section(args.output, BEGIN, END, section(results))
    if all("error" in r for r in results):
        sys.exit(1)


if __name__ == "__main__":
    main()
