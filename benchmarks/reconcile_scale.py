"""A reconciler pass over 1k, 10k and 50k nodes and instances, and the reconciler's and
``slurm-spot events``' cost as the events file grows to 1M lines, before and after issue 18.

Method:

- Pass: one node set of N nodes in mixed states, per 100 nodes: 70 up with their instance
  (half of them running a job), 5 whose spot instance was reclaimed under a running job,
  5 powered down with an instance still alive (orphans), 2 up with two instances
  (duplicates), 3 up with no instance at all (missing), 15 powered down with none. Slurm is
  benchmarks/slurm_canned.py: ``sinfo --json`` (Slurm 22.05's node listing) and ``squeue``
  output of that size, rendered before the clock starts, and every command also starts
  ``/bin/true`` so each Slurm command pays a process start as on a controller (slurmctld's
  own work is not in the figures). The provider is an in-memory list (the clouds' calls are
  in cloud_scale.py). CPU = user + system time of the measuring process around
  ``Reconciler.run_pass()`` (parsing Slurm's output, planning, acting, events), plus the
  started processes' (``RUSAGE_CHILDREN``).
- Events: an events file of 10k, 100k and 1M lines (one event every 2.6 s, ~200 bytes a
  line); the reconciler's first pass (it reads the file's last 8 MB) and a second pass after
  10 new events, on 1000 nodes; ``slurm-spot events --since 10m --json`` as its own process
  (CPU from ``wait4``, interpreter start included).
- Each measurement runs in a fresh process with ``PYTHONPATH`` set to the tree under test:
  the baseline (``--baseline``, the tree before issue 18) as a temporary git worktree, and
  this checkout, alternating. Median ± spread (max - min) over ``--runs`` (``--big-runs`` at
  50k nodes and 1M lines; the baseline once at 10k and not above ``--baseline-max-nodes``:
  it is quadratic in lost nodes x jobs).

Targets (issue 18): < 2 s CPU for a pass at 10k, linear growth; flat cost as the events
file grows.

Usage (repository root): ``python benchmarks/reconcile_scale.py [--sizes 1000,10000,50000]
[--lines 10000,100000,1000000] [--runs 3] [--big-runs 1] [--baseline REF] [--smoke]
[--no-write]``; writes the ``reconcile-scale`` section of BENCHMARKS.md.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
HERE = Path(__file__).resolve().parent
BEGIN, END = "<!-- reconcile-scale:begin -->", "<!-- reconcile-scale:end -->"
BASELINE = "28e281b"  # the tree before issue 18's fixes
EVENT_GAP_S = 2.6


# -- the measuring child (the tree's slurm_spot on PYTHONPATH) --------------------------------
class MemoryProvider:
    """Instances in a list; terminations mark them terminated."""

    def __init__(self, instances: list[Any]) -> None:
        self.name = "mem"
        self.instances = {i.instance_id: i for i in instances}
        self.terminated = 0

    def list_instances(self) -> list[Any]:
        return list(self.instances.values())

    def terminate_instances(self, instance_ids: Sequence[str]) -> None:
        from dataclasses import replace

        from slurm_spot.providers.base import InstanceState

        for iid in instance_ids:
            self.terminated += 1
            self.instances[iid] = replace(self.instances[iid], state=InstanceState.TERMINATED)

    def terminate(self, nodes: Sequence[str]) -> list[Any]:
        return []

    def launch(self, request: Any) -> Any:
        raise NotImplementedError


def world(nodes: int, now: datetime, log_dir: str, state_dir: str) -> tuple[Any, Any, Any]:
    """(config, CannedSlurm, MemoryProvider) of ``nodes`` nodes in the mix of the docstring."""
    import slurm_canned

    from slurm_spot.config import SpotConfig
    from slurm_spot.providers.base import Instance, InstanceState

    per_set = 10_000  # a node set's largest count
    sets = [f"spot{k}" if nodes > per_set else "spot" for k in range(-(-nodes // per_set))]
    # an aws provider in the config (a local one caps nodes at its port range); the pass
    # only ever calls the in-memory provider below
    config = SpotConfig.model_validate({
        "cluster": "bench", "providers": {"mem": {"type": "aws", "region": "us-east-1"}},
        "node_sets": [{"name": name, "provider": "mem", "instance_types": ["g5.xlarge"],
                       "aws": {"launch_template": "bench", "subnets": ["subnet-0a1"]},
                       "count": min(per_set, nodes - k * per_set)}
                      for k, name in enumerate(sets)],
        "partitions": [{"name": "spot", "node_sets": sets}],
        "state_dir": state_dir, "log_dir": log_dir,
        "reconcile": {"missing_grace_s": 0, "orphan_grace_s": 60}})
    canned, instances, pending = [], [], []
    old = now - timedelta(hours=1)

    def inst(i: int, node: str, ip: str, state: Any = InstanceState.RUNNING, reason: str = "",
             age: datetime = old) -> Any:
        return Instance(f"i-{i:08d}", node, node.rsplit("-", 1)[0], state, "spot", "g5.xlarge", "us-east-1a",
                        age, private_ip=ip, hostname=node, state_reason=reason)

    for i in range(1, nodes + 1):
        name = f"{sets[(i - 1) // per_set]}-{(i - 1) % per_set + 1}"
        ip, kind = f"10.{i // 65536}.{i // 256 % 256}.{i % 256}", i % 100
        job = (i,) if kind < 35 or 70 <= kind < 75 else ()
        if kind < 70:
            canned.append(slurm_canned.CannedNode(name, "ALLOCATED" if job else "IDLE",
                                                  ("CLOUD",), ip, jobs=job))
            instances.append(inst(i, name, ip))
        elif kind < 75:  # reclaimed under a running job
            canned.append(slurm_canned.CannedNode(name, "ALLOCATED", ("CLOUD",), ip, jobs=job))
            instances.append(inst(i, name, ip, InstanceState.TERMINATED,
                                  "Server.SpotInstanceTermination"))
            pending.append(i)
        elif kind < 80:  # orphan
            canned.append(slurm_canned.CannedNode(name))
            instances.append(inst(i, name, ip))
        elif kind < 82:  # duplicate
            canned.append(slurm_canned.CannedNode(name, "IDLE", ("CLOUD",), ip))
            instances.append(inst(i, name, ip))
            instances.append(inst(i + 10_000_000, name, "192.168.0.1", age=old - timedelta(hours=1)))
        elif kind < 85:  # missing
            canned.append(slurm_canned.CannedNode(name, "IDLE", ("CLOUD",), ip))
        else:
            canned.append(slurm_canned.CannedNode(name))
    slurm = slurm_canned.CannedSlurm(canned, pending_jobs=pending, spawn=True)
    return config, slurm, MemoryProvider(instances)


def write_events(log_dir: Path, lines: int, now: datetime) -> None:
    """``lines`` ordinary events ending at ``now``, one every EVENT_GAP_S seconds."""
    log_dir.mkdir(parents=True, exist_ok=True)
    start = now - timedelta(seconds=EVENT_GAP_S * lines)
    with open(log_dir / "events.jsonl", "w") as fh:
        for i in range(lines):
            when = (start + timedelta(seconds=EVENT_GAP_S * i)).isoformat()
            fh.write(json.dumps({"action": "launched", "extra": {"market": "spot", "type":
                     "g5.xlarge", "zone": "us-east-1a"}, "instance": f"i-{i:012d}",
                     "node": f"spot-{i % 1000 + 1}", "source": "resume", "time": when},
                     sort_keys=True) + "\n")


def child(spec: dict[str, Any]) -> dict[str, Any]:
    from slurm_spot.events import Event, emit
    from slurm_spot.reconcile.reconciler import Reconciler
    from slurm_spot.slurm.client import SlurmClient

    now = datetime.now(timezone.utc)
    log_dir, state_dir = spec["log_dir"], spec["state_dir"]
    config, slurm, provider = world(spec["nodes"], now, log_dir, state_dir)
    reconciler = Reconciler(config, SlurmClient("/usr/bin", runner=slurm),
                            providers=lambda c, n: provider, clock=lambda: now,
                            sleep=lambda s: None, expedite_wait_s=0)
    slurm.calls.clear()
    samples = []
    for n in range(spec.get("passes", 1)):
        if n:
            for k in range(10):
                emit(Path(log_dir), Event("launched", "resume", node=f"spot-{k + 1}",
                                          time=now.isoformat()))  # type: ignore[arg-type]
        kids = resource.getrusage(resource.RUSAGE_CHILDREN)
        cpu, wall = time.process_time(), time.perf_counter()
        result = reconciler.run_pass()
        own = time.process_time() - cpu
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        samples.append({"own_cpu_s": own, "wall_s": time.perf_counter() - wall,
                        "children_cpu_s": (after.ru_utime + after.ru_stime)
                        - (kids.ru_utime + kids.ru_stime),
                        "verdicts": result.verdicts, "actions": len(result.actions),
                        "errors": result.errors[:3]})
    return {"passes": samples, "commands": dict(slurm.calls),
            "terminated": provider.terminated,
            "tree_file": sys.modules["slurm_spot"].__file__}


# -- the parent -------------------------------------------------------------------------------
def run_child(tree: Path, spec: dict[str, Any]) -> dict[str, Any]:
    env = {**os.environ, "PYTHONPATH": f"{tree}{os.pathsep}{HERE}"}
    proc = subprocess.run([sys.executable, __file__, "--child", json.dumps(spec)],  # noqa: S603
                          capture_output=True, text=True, env=env, timeout=1800, cwd=tree)
    if proc.returncode != 0:
        raise RuntimeError(f"pass {spec}: {proc.stderr[-2000:]}")
    out: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    if not str(out["tree_file"]).startswith(str(tree)):
        raise RuntimeError(f"measured {out['tree_file']}, not the tree {tree}")
    return out


def events_cli(tree: Path, folder: Path) -> tuple[float, float, int]:
    """(CPU s, wall s, events printed) of ``slurm-spot events --since 10m --json``."""
    spot = {"cluster": "bench", "providers": {"local": {"type": "local"}},
            "node_sets": [{"name": "spot", "provider": "local", "count": 4}],
            "partitions": [{"name": "spot", "node_sets": ["spot"]}],
            "state_dir": str(folder / "state"), "log_dir": str(folder / "log")}
    (folder / "spot.yaml").write_text(json.dumps(spot))
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(tree)}
    cpu, wall, out = _timed([sys.executable, "-m", "slurm_spot", "--config",
                             str(folder / "spot.yaml"), "events", "--since", "10m", "--json"],
                            env, tree)
    doc = json.loads(out)  # the baseline tree prints a bare list; this one its envelope
    return cpu, wall, len(doc["data"] if isinstance(doc, dict) else doc)


def _timed(argv: list[str], env: dict[str, str], cwd: Path) -> tuple[float, float, bytes]:
    started = time.perf_counter()
    proc = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE,  # noqa: S603
                            stderr=subprocess.DEVNULL, cwd=cwd)
    assert proc.stdout
    out = proc.stdout.read()
    _pid, status, usage = os.wait4(proc.pid, 0)
    if os.waitstatus_to_exitcode(status) != 0:
        raise RuntimeError(f"{argv} failed")
    return usage.ru_utime + usage.ru_stime, time.perf_counter() - started, out


def median_spread(values: list[float]) -> tuple[float, float]:
    return statistics.median(values), max(values) - min(values)


def measure_passes(trees: dict[str, Path], sizes: list[int], runs: int, big_runs: int,
                   work: Path, baseline_max: int) -> list[dict[str, Any]]:
    rows = []
    for nodes in sizes:
        samples: dict[str, list[dict[str, Any]]] = {name: [] for name in trees}
        for run in range(big_runs if nodes >= 50_000 else runs):
            for name, tree in trees.items():
                if name == "baseline" and (nodes > baseline_max or (
                        nodes >= 10_000 and run >= big_runs)):
                    continue  # quadratic before issue 18: minutes per pass (see the section)
                site = work / f"pass-{nodes}-{name}-{run}"
                out = run_child(tree, {"nodes": nodes, "log_dir": str(site / "log"),
                                       "state_dir": str(site / "state")})
                out["pass"] = out["passes"][0]
                samples[name].append(out)
                p = out["pass"]
                print(f"pass {nodes} {name}: own {p['own_cpu_s']:.2f} s, children "
                      f"{p['children_cpu_s']:.2f} s, commands {sum(out['commands'].values())}, "
                      f"actions {p['actions']}", p["errors"], flush=True)
        for name, outs in samples.items():
            if not outs:
                continue
            own = [o["pass"]["own_cpu_s"] for o in outs]
            kids = [o["pass"]["children_cpu_s"] for o in outs]
            total = [a + b for a, b in zip(own, kids, strict=True)]
            rows.append({"nodes": nodes, "tree": name, "runs": len(outs),
                         "own_cpu_s": median_spread(own), "children_cpu_s": median_spread(kids),
                         "total_cpu_s": median_spread(total),
                         "commands": sum(outs[-1]["commands"].values()),
                         "by_command": outs[-1]["commands"],
                         "actions": outs[-1]["pass"]["actions"],
                         "verdicts": outs[-1]["pass"]["verdicts"],
                         "errors": outs[-1]["pass"]["errors"]})
    return rows


def measure_events(trees: dict[str, Path], line_counts: list[int], runs: int, big_runs: int,
                   work: Path, baseline_max_lines: int) -> list[dict[str, Any]]:
    rows = []
    for lines in line_counts:
        here = {n: t for n, t in trees.items() if n != "baseline" or lines <= baseline_max_lines}
        folder = work / f"events-{lines}"
        now = datetime.now(timezone.utc)
        write_events(folder / "log", lines, now)
        size = (folder / "log" / "events.jsonl").stat().st_size
        samples: dict[str, dict[str, list[float]]] = {
            name: {"first": [], "second": [], "cli": []} for name in here}
        printed = 0
        for run in range(big_runs if lines >= 1_000_000 else runs):
            for name, tree in here.items():
                out = run_child(tree, {"nodes": 1000, "log_dir": str(folder / "log"),
                                       "state_dir": str(folder / f"state-{name}-{run}"),
                                       "passes": 2})
                samples[name]["first"].append(out["passes"][0]["own_cpu_s"])
                samples[name]["second"].append(out["passes"][1]["own_cpu_s"])
                cpu, _wall, printed = events_cli(tree, folder)
                samples[name]["cli"].append(cpu)
                print(f"events {lines} {name}: first pass {out['passes'][0]['own_cpu_s']:.2f} s,"
                      f" second {out['passes'][1]['own_cpu_s']:.2f} s, events --since 10m "
                      f"{cpu:.2f} s ({printed} events)", flush=True)
        for name, s in samples.items():
            rows.append({"lines": lines, "mb": size / 1e6, "tree": name, "runs": len(s["cli"]),
                         "first_pass_cpu_s": median_spread(s["first"]),
                         "second_pass_cpu_s": median_spread(s["second"]),
                         "events_cli_cpu_s": median_spread(s["cli"]), "printed": printed})
        (folder / "log" / "events.jsonl").unlink()
    return rows


def _ms(pair: Sequence[float]) -> str:
    return f"{pair[0]:.2f} ± {pair[1]:.2f}"


def _when(row: dict[str, Any], before: dict[str, Any] | None) -> str:
    """When a row was measured; the baseline's date too where it was kept from another run."""
    after = str(row.get("when", ""))
    if before is not None and before.get("when", after) != after:
        return f"{after} (before: {before.get('when')})"
    return after


PASS_HEADER = ("| nodes | actions | Slurm commands after | before | CPU after: slurm-spot "
               "| after: commands | **after: total** | before: total | runs | measured |\n"
               + "|---" * 10 + "|")
EVENTS_HEADER = ("| events file | reconciler first pass | **next pass** | next pass before "
                 "| **`events --since 10m`** | before | events printed | runs | measured |\n"
                 + "|---" * 9 + "|")


def section(passes: list[dict[str, Any]], events: list[dict[str, Any]], baseline: str) -> str:
    p = {(r["nodes"], r["tree"]): r for r in passes}
    pass_rows = []
    for (nodes, tree), r in p.items():
        if tree != "current":
            continue
        b = p.get((nodes, "baseline"))
        pass_rows.append(
            f"| {nodes:,} | {r['actions']} | **{r['commands']}** | {b['commands'] if b else '-'} | "
            f"{_ms(r['own_cpu_s'])} | {_ms(r['children_cpu_s'])} | **{_ms(r['total_cpu_s'])}** | "
            f"{_ms(b['total_cpu_s']) if b else '-'} | {r['runs']} | {_when(r, b)} |")
    e = {(r["lines"], r["tree"]): r for r in events}
    event_rows = []
    for (lines, tree), r in e.items():
        if tree != "current":
            continue
        b = e.get((lines, "baseline"))
        event_rows.append(
            f"| {lines:,} ({r['mb']:.0f} MB) | {_ms(r['first_pass_cpu_s'])} | "
            f"**{_ms(r['second_pass_cpu_s'])}** | {_ms(b['second_pass_cpu_s']) if b else '-'} | "
            f"**{_ms(r['events_cli_cpu_s'])}** | {_ms(b['events_cli_cpu_s']) if b else '-'} | "
            f"{r['printed']} | {r['runs']} | {_when(r, b)} |")
    notes = []
    ten = p.get((10_000, "current"))
    if ten:
        total = ten["total_cpu_s"][0]
        verdict = "meets" if total < 2 else f"misses by {total - 2:.2f} s"
        notes.append(f"10k nodes: {total:.2f} s CPU per pass ({verdict} the < 2 s target; "
                     f"{ten['own_cpu_s'][0]:.2f} s in slurm-spot's process, "
                     f"{ten['children_cpu_s'][0]:.2f} s starting {ten['commands']} Slurm "
                     "commands).")
    sizes = sorted(n for n, t in p if t == "current")
    if len(sizes) >= 2:
        lo, hi = p[(sizes[0], "current")], p[(sizes[-1], "current")]
        per = [x["total_cpu_s"][0] / n * 1000 for x, n in ((lo, sizes[0]), (hi, sizes[-1]))]
        notes.append(f"Growth: {per[0]:.3f} ms per node at {sizes[0]:,}, {per[1]:.3f} ms at "
                     f"{sizes[-1]:,} (linear would keep these equal).")
    return f"""{BEGIN}
## Reconciler at scale, and the events file growing to 1M lines

`python benchmarks/reconcile_scale.py` ({datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC, \
{platform.machine()}, {os.cpu_count()} CPUs shared with other work, load average \
{os.getloadavg()[0]:.1f} at the end; method in its docstring): one pass over N nodes and as
many instances (70 % up, 5 % reclaimed under a job, 5 % orphans, 2 % duplicates, 3 % missing,
15 % powered down), Slurm's output of that size parsed, every Slurm command started as a
process; CPU in seconds, median ± spread (max - min); *before* = {baseline} (the tree before
issue 18), *after* = this checkout, interleaved.

{PASS_HEADER}
{chr(10).join(pass_rows)}

{chr(10).join('- ' + n for n in notes)}

*Before* is measured up to 10k nodes (one run at 10k; `make bench` measures it at 1k only and
keeps the 10k figure from the run named in *measured*, benchmarks/reconcile_scale.json, as it
takes ~2 minutes of CPU per pass): that tree read every job Slurm holds
(`scontrol -o show job`) once per lost node and parsed it whole each time, nodes x jobs, which
at 10k nodes (800 lost, 5000 jobs) is the largest part of its CPU and grows quadratically.

What is left per node: each reclaimed job gets its AdminComment note (`scontrol update
jobid=N AdminComment=...`; the text names the node, so one update per job; the earlier
comments of all of them come from one `scontrol -o show job`), and every action is one event
line; Slurm updates are one `scontrol update
nodename=<hostlist>` per verdict and reason (a reclaim's reason carries the pass's time, so
all nodes of a pass share it), terminations one call per provider, expedites one `scontrol
update jobid=<list>`.

Events file growing (1000 nodes as above; the file holds one event every {EVENT_GAP_S} s, so
10 minutes hold ~230):

{EVENTS_HEADER}
{chr(10).join(event_rows)}

The reconciler reads the file's last 8 MB once at start (first pass) and then only what was
appended (issue 11); `events --since` now seeks from the end (the first line older than the
window minus 10 minutes of writer skew) instead of parsing the whole file; `events` without
`--since` still reads all of it. The `events` figures include starting Python and the CLI;
*events printed* also counts the events the measured passes wrote into the same file (each
run's passes add ~400). The reconciler's *next pass* is mostly the pass itself over 1000
nodes (before: its per-lost-node job reads), flat in the file's length on both trees.
{END}"""


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--sizes", default="1000,10000,50000")
    parser.add_argument("--lines", default="10000,100000,1000000")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--big-runs", type=int, default=1)
    parser.add_argument("--baseline", default=BASELINE, help="git ref to compare with ('' none)")
    parser.add_argument("--baseline-max-nodes", type=int, default=10_000,
                        help="largest pass measured on the baseline (it is quadratic)")
    parser.add_argument("--baseline-max-lines", type=int, default=1_000_000,
                        help="largest events file measured on the baseline")
    parser.add_argument("--json", type=Path, default=HERE / "reconcile_scale.json",
                        help="results kept here; rows this run did not measure are taken "
                             "from it (with their date)")
    parser.add_argument("--smoke", action="store_true",
                        help="200 nodes, 2000 lines, one run, this tree only, no BENCHMARKS.md")
    parser.add_argument("--no-write", action="store_true")
    parser.add_argument("--output", type=Path, default=ROOT / "BENCHMARKS.md")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        print(json.dumps(child(json.loads(args.child))))
        return 0
    if args.smoke:
        args.sizes, args.lines, args.runs, args.baseline, args.no_write = \
            "200", "2000", 1, "", True
    with tempfile.TemporaryDirectory(prefix="reconcile-scale-") as tmp:
        work = Path(tmp)
        trees = {"current": ROOT}
        if args.baseline:
            subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--quiet",  # noqa: S603
                            "--detach", str(work / "baseline"), args.baseline],
                           check=True, timeout=120)
            trees = {"baseline": work / "baseline", "current": ROOT}
        try:
            passes = measure_passes(trees, [int(s) for s in args.sizes.split(",")], args.runs,
                                    args.big_runs, work, args.baseline_max_nodes)
            events = measure_events(trees, [int(s) for s in args.lines.split(",")], args.runs,
                                    args.big_runs, work, args.baseline_max_lines)
        finally:
            if args.baseline:
                subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force",  # noqa: S603
                                str(work / "baseline")], check=False, timeout=120)
    print(json.dumps({"passes": passes, "events": events}, indent=1))
    if any(r["errors"] for r in passes if r["tree"] == "current"):
        print("errors in a pass", file=sys.stderr)
        return 1
    if not args.no_write:
        from report import write_section

        stamp = f"{datetime.now(timezone.utc):%Y-%m-%d %H:%M}"
        for row in (*passes, *events):
            row["when"] = stamp
        kept = json.loads(args.json.read_text()) if args.json.exists() else {}
        passes = _merge(passes, kept.get("passes", []), ("nodes", "tree"), "nodes")
        events = _merge(events, kept.get("events", []), ("lines", "tree"), "lines")
        args.json.write_text(json.dumps({"passes": passes, "events": events}, indent=1) + "\n")
        write_section(args.output, BEGIN, END, section(passes, events, args.baseline))
    return 0


def _merge(fresh: list[dict[str, Any]], kept: list[dict[str, Any]], key: tuple[str, ...],
           order: str) -> list[dict[str, Any]]:
    """This run's rows, plus the kept rows of what it did not measure (dated)."""
    have = {tuple(r[k] for k in key) for r in fresh}
    rows = fresh + [r for r in kept if tuple(r[k] for k in key) not in have]
    return sorted(rows, key=lambda r: (r[order], r["tree"] != "baseline"))


if __name__ == "__main__":
    sys.exit(main())
