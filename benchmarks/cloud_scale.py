"""Resume and suspend of 1, 100, 1000 and 5000 nodes of one node set on the AWS fake (moto) and
the GCE fake, and a reconciler pass that terminates 20 orphans among 200 AWS / 1000 GCE
instances: API calls by operation and CPU time in slurm-spot's process, before and after.

Method:

- The fakes run in processes of their own (moto's server; tests/fakes/gce_api.py's
  FakeCompute behind a small control loop), so their work is not in the figures: CPU is the
  user + system time of the measuring process (``time.process_time``, every thread) around
  the call alone: ``power.resume(config, hostlist, slurm)``, ``power.suspend(config,
  hostlist)``, ``Reconciler.run_pass()``. It includes importing the cloud library and building
  its clients (the hooks pay that on every call) and the HTTP client; not the interpreter's
  start or the config. Wall time is reported but is mostly the fakes'.
- Each measurement is a fresh process with ``PYTHONPATH`` set to the tree under test: the
  baseline (``--baseline``, default the tree before issue 18) checked out as a temporary git
  worktree, and this checkout. Trees alternate run by run so both see the same load.
- API calls: AWS by operation through botocore (``BaseClient._make_api_call``, counted in the
  measuring process); GCE from the fake's own request log. Slurm commands go to a stand-in
  (benchmarks/slurm_canned.py) that counts them.
- One node set: AWS 2 instance types x 2 subnets, spot with on-demand fallback; GCE one zone,
  a machine type and an image. Before each run the fakes are reset.
- Figures: median over ``--runs`` runs (``--big-runs`` from 1000 nodes on: moto needs ~1.5
  min of its own per 1000 instances launched) and the spread (max - min).
  Results are kept in benchmarks/cloud_scale.json; a row this run did not measure (AWS at
  5000 nodes is not in ``make bench``: ~10 min of moto per run) is taken from there, dated.

Targets (issue 18): resume calls = ceil(nodes / provider batch limit) + a constant number of
lookups, suspend likewise; < 5 s CPU for 1000 nodes.

Usage (repository root): ``python benchmarks/cloud_scale.py [--aws-sizes 1,100,1000]
[--gce-sizes 1,100,1000,5000] [--runs 3] [--big-runs 1] [--baseline REF] [--smoke]
[--no-write]``; writes the ``cloud-scale`` section of BENCHMARKS.md and cloud_scale.json.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
HERE = Path(__file__).resolve().parent
BEGIN, END = "<!-- cloud-scale:begin -->", "<!-- cloud-scale:end -->"
BASELINE = "28e281b"  # the tree before issue 18's fixes
REGION = "us-east-1"
AWS_ENV = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
           "AWS_DEFAULT_REGION": REGION, "AWS_EC2_METADATA_DISABLED": "true",
           "MOTO_EC2_LOAD_DEFAULT_AMIS": "false"}
PASS_SIZE = {"aws": 200, "gce": 1000}
ORPHANS = 20


# -- the measuring child (runs under the tree's PYTHONPATH) -----------------------------------
def child(spec: dict[str, Any]) -> dict[str, Any]:
    """One phase in this process: ``resume``, ``suspend`` or ``pass`` (see the docstring)."""
    from collections import Counter

    import slurm_canned

    from slurm_spot.config import SpotConfig
    from slurm_spot.lifecycle import power
    from slurm_spot.slurm.client import SlurmClient

    calls: Counter[str] = Counter()
    if spec["cloud"] == "aws":
        from botocore.client import BaseClient

        original = BaseClient._make_api_call

        def counted(self: Any, operation: str, params: Any) -> Any:
            calls[operation] += 1
            return original(self, operation, params)

        BaseClient._make_api_call = counted  # count only; the call goes through unchanged
    config = SpotConfig.model_validate(spec["config"])
    nodes = spec["nodes"]
    hostlist = f"gpu-[1-{nodes}]" if nodes > 1 else "gpu-1"
    result: dict[str, Any] = {"tree_file": power.__file__}
    if spec["phase"] in ("resume", "suspend"):
        slurm = slurm_canned.CannedSlurm([])
        client = SlurmClient("/usr/bin", runner=slurm)
        cpu, wall = time.process_time(), time.perf_counter()
        if spec["phase"] == "resume":
            out = power.resume(config, hostlist, client)
            result["done"] = len(out.launched)
        else:
            out = power.suspend(config, hostlist)
            result["done"] = len(out.terminated)
        result["errors"] = out.errors[:3]
    else:
        from slurm_spot.providers import get_provider
        from slurm_spot.reconcile.reconciler import Reconciler

        listed = get_provider(config, config.node_sets[0].provider).list_instances()
        by_node = {i.node: i for i in listed if i.node}
        canned = []
        for i in range(1, nodes + 1):
            inst = by_node.get(f"gpu-{i}")
            if i <= nodes - ORPHANS and inst is not None:
                canned.append(slurm_canned.CannedNode(f"gpu-{i}", "IDLE", ("CLOUD",),
                                                      addr=inst.private_ip or ""))
            else:  # powered down, its instance still alive: an orphan
                canned.append(slurm_canned.CannedNode(f"gpu-{i}"))
        slurm = slurm_canned.CannedSlurm(canned)
        client = SlurmClient("/usr/bin", runner=slurm)
        calls.clear()
        print("READY", flush=True)  # the parent clears the fake's request log, then answers
        sys.stdin.readline()
        later = datetime.fromtimestamp(time.time() + 7200, timezone.utc)
        reconciler = Reconciler(config, client, clock=lambda: later, sleep=lambda s: None,
                                expedite_wait_s=0)
        cpu, wall = time.process_time(), time.perf_counter()
        out = reconciler.run_pass()
        result["done"] = sum(1 for a in out.actions if a["action"] == "terminated")
        result["errors"] = out.errors[:3]
    result["cpu_s"] = time.process_time() - cpu
    result["wall_s"] = time.perf_counter() - wall
    result["calls"] = dict(calls)
    result["slurm_commands"] = slurm.commands
    return result


# -- the fakes, each in its own process --------------------------------------------------------
def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def serve_moto(port: int) -> None:
    """moto's server with benchmarks/fast_moto.py's speed fix (same answers, faster fake)."""
    import fast_moto
    from moto.server import main as moto_main

    fast_moto.patch()
    moto_main(["-H", "127.0.0.1", "-p", str(port)])


@contextmanager
def moto_server() -> Iterator[str]:
    """moto's server (:func:`serve_moto`) on 127.0.0.1 in a process of its own; yields its
    endpoint."""
    port = free_port()
    proc = subprocess.Popen([sys.executable, __file__, "--serve-moto", str(port)],  # noqa: S603
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            env={**os.environ, **AWS_ENV, "PYTHONPATH": str(HERE)})
    endpoint = f"http://127.0.0.1:{port}"
    try:
        for _ in range(200):
            try:
                urllib.request.urlopen(f"{endpoint}/moto-api/", timeout=1)
                break
            except OSError:
                time.sleep(0.1)
        yield endpoint
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def aws_world(endpoint: str, nodes: int) -> dict[str, Any]:
    """Reset moto, make a VPC, subnets and a launch template; the config of one node set."""
    import boto3

    sys.path.insert(0, str(ROOT))
    from tests.fakes.ec2 import make_world

    req = urllib.request.Request(f"{endpoint}/moto-api/reset", method="POST")
    urllib.request.urlopen(req, timeout=30).close()
    ec2 = boto3.client("ec2", region_name=REGION, endpoint_url=endpoint)
    world = make_world(ec2)
    return {"providers": {"aws": {"type": "aws", "region": REGION, "endpoint_url": endpoint}},
            "node_sets": [{"name": "gpu", "provider": "aws", "count": nodes,
                           "instance_types": ["g5.xlarge", "g6.xlarge"], "fallback": "on-demand",
                           "aws": {"launch_template": world.template_name,
                                   "subnets": world.subnets}}]}


def serve_gce() -> None:
    """FakeCompute in this process; stdin commands: ``stats`` (print the request counts by
    method as JSON and clear them), ``reset`` (forget every instance and operation)."""
    from collections import Counter

    sys.path.insert(0, str(ROOT))
    from tests.fakes.gce_api import FakeCompute

    with FakeCompute() as fake:
        print(fake.endpoint, flush=True)
        for line in sys.stdin:
            with fake._lock:
                if line.strip() == "stats":
                    print(json.dumps(Counter(r["method"] for r in fake.requests)), flush=True)
                    fake.requests.clear()
                elif line.strip() == "reset":
                    fake.instances.clear()
                    fake.operations.clear()
                    fake.requests.clear()
                    fake._request_ids.clear()
                    fake._polls.clear()
                    print("{}", flush=True)


@contextmanager
def gce_server() -> Iterator[subprocess.Popen[str]]:
    proc = subprocess.Popen([sys.executable, __file__, "--serve-gce"], text=True,  # noqa: S603
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, cwd=ROOT)
    try:
        yield proc
    finally:
        if proc.stdin:
            proc.stdin.close()
        proc.wait(timeout=30)


def gce_command(proc: subprocess.Popen[str], command: str) -> dict[str, int]:
    assert proc.stdin and proc.stdout
    proc.stdin.write(command + "\n")
    proc.stdin.flush()
    return json.loads(proc.stdout.readline())


def gce_world(endpoint: str, nodes: int) -> dict[str, Any]:
    return {"providers": {"gcp": {"type": "gcp", "project": "test-project",
                                  "region": "us-central1", "api_endpoint": endpoint}},
            "node_sets": [{"name": "gpu", "provider": "gcp", "count": nodes,
                           "gcp": {"zones": ["us-central1-a"], "machine_type": "n1-standard-8",
                                   "image": "projects/debian-cloud/global/images/family/"
                                            "debian-12"}}]}


# -- the parent ----------------------------------------------------------------------------------
def run_child(tree: Path, spec: dict[str, Any], ready: Any = None) -> dict[str, Any]:
    """Run one phase in a fresh process on ``tree``; ``ready()`` is called when a ``pass``
    child has done its set-up, before it measures."""
    env = {**os.environ, **AWS_ENV, "PYTHONPATH": f"{tree}{os.pathsep}{HERE}"}
    proc = subprocess.Popen([sys.executable, __file__, "--child", json.dumps(spec)],  # noqa: S603
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env, cwd=tree)
    assert proc.stdin and proc.stdout
    if spec["phase"] == "pass":
        line = proc.stdout.readline()
        if line.strip() == "READY" and ready is not None:
            ready()
        proc.stdin.write("go\n")
        proc.stdin.flush()
    stdout, stderr = proc.communicate(timeout=1800)
    if proc.returncode != 0:
        raise RuntimeError(f"{spec['cloud']} {spec['phase']} {spec['nodes']}: {stderr[-2000:]}")
    out: dict[str, Any] = json.loads(stdout.strip().splitlines()[-1])
    if not str(out["tree_file"]).startswith(str(tree)):
        raise RuntimeError(f"measured {out['tree_file']}, not the tree {tree}")
    return out


def measure(trees: dict[str, Path], sizes: dict[str, list[int]], runs: int,
            big_runs: int, workdir: Path, baseline_ops: set[str]) -> list[dict[str, Any]]:
    """One row per (cloud, operation, nodes, tree): medians, spreads and calls."""
    rows: list[dict[str, Any]] = []
    with moto_server() as moto, gce_server() as gce:
        assert gce.stdout
        gce_endpoint = gce.stdout.readline().strip()
        for cloud, counts in sizes.items():
            if not counts:
                continue
            cases = [(n, ("resume", "suspend")) for n in counts]
            cases.append((PASS_SIZE[cloud] if max(counts) >= 100 else max(counts) + ORPHANS,
                          ("resume", "pass")))
            for nodes, phases in cases:
                samples: dict[tuple[str, str], list[dict[str, Any]]] = {}
                many = nodes >= 1000
                measured = set(phases[1:]) if "pass" in phases else set(phases)
                here = {n: t for n, t in trees.items()
                        if n != "baseline" or measured & baseline_ops}
                for run in range(big_runs if many else runs):
                    for name, tree in here.items():
                        site = workdir / f"{cloud}-{nodes}-{name}-{run}"
                        if cloud == "aws":
                            world = aws_world(moto, nodes)
                        else:
                            gce_command(gce, "reset")
                            world = gce_world(gce_endpoint, nodes)
                        config = {"cluster": "bench", **world,
                                  "partitions": [{"name": "gpu", "node_sets": ["gpu"]}],
                                  "state_dir": str(site / "state"), "log_dir": str(site / "log"),
                                  "reconcile": {"orphan_grace_s": 60}}
                        for phase in phases:
                            if cloud == "gce":
                                gce_command(gce, "stats")
                            out = run_child(tree, {"cloud": cloud, "phase": phase,
                                                   "nodes": nodes, "config": config},
                                            ready=lambda c=cloud: c == "gce" and gce_command(
                                                gce, "stats"))
                            if cloud == "gce":
                                out["calls"] = gce_command(gce, "stats")
                            samples.setdefault((phase, name), []).append(out)
                            print(cloud, phase, nodes, name, f"cpu {out['cpu_s']:.2f} s",
                                  f"done {out['done']}", out["calls"], out["errors"], flush=True)
                for (phase, name), outs in samples.items():
                    if phases[0] == "resume" and phase == "resume" and "pass" in phases:
                        continue  # only the set-up for the pass
                    cpu = [o["cpu_s"] for o in outs]
                    rows.append({
                        "cloud": cloud, "operation": phase, "nodes": nodes, "tree": name,
                        "runs": len(outs), "cpu_s": statistics.median(cpu),
                        "cpu_spread_s": max(cpu) - min(cpu),
                        "wall_s": statistics.median(o["wall_s"] for o in outs),
                        "done": outs[-1]["done"], "calls": outs[-1]["calls"],
                        "slurm_commands": outs[-1]["slurm_commands"],
                        "errors": outs[-1]["errors"]})
    return rows


def _calls(calls: dict[str, int]) -> str:
    total = sum(calls.values())
    return f"**{total}** ({', '.join(f'{k} {v}' for k, v in sorted(calls.items()))})"


HEADER = ("| cloud | operation, nodes | done | API calls after | API calls before | CPU after (s) "
          "| CPU before (s) | wall after (s) | runs | measured |\n" + "|---" * 10 + "|")


def section(rows: list[dict[str, Any]], baseline: str) -> str:
    by_key = {(r["cloud"], r["operation"], r["nodes"], r["tree"]): r for r in rows}
    lines = []
    for (cloud, op, nodes, tree), r in by_key.items():
        if tree != "current":
            continue
        b = by_key.get((cloud, op, nodes, "baseline"))
        what = f"{op} {nodes}" if op != "pass" else f"pass, {ORPHANS} orphans among {nodes}"
        before_cpu = f"{b['cpu_s']:.2f} ± {b['cpu_spread_s']:.2f}" if b else "-"
        before_calls = _calls(b["calls"]) if b else "-"
        done = f"{r['done']}" + (f" (error: {r['errors'][0][:90]})" if r["errors"] else "")
        when = str(r.get("date", ""))
        if b and b.get("date", when) != when:
            when += f" (before: {b.get('date')})"
        lines.append(
            f"| {cloud} | {what} | {done} | {_calls(r['calls'])} | {before_calls} | "
            f"**{r['cpu_s']:.2f}** ± {r['cpu_spread_s']:.2f} | {before_cpu} | "
            f"{r['wall_s']:.1f} | {r['runs']} | {when} |")
    verdicts = []
    for (cloud, op, nodes, tree), r in by_key.items():
        if tree == "current" and nodes == 1000 and op in ("resume", "suspend"):
            miss = r["cpu_s"] - 5.0
            verdict = "meets" if miss < 0 else f"misses by {miss:.2f} s"
            one = by_key.get((cloud, op, 1, tree))
            split = (f"; {one['cpu_s']:.2f} s of it is the 1-node cost (importing the cloud "
                     f"library, building its clients, the listing), then "
                     f"{(r['cpu_s'] - one['cpu_s']) / 999 * 1000:.1f} ms per node"
                     if one else "")
            verdicts.append(f"{cloud} {op} of 1000 nodes: {r['cpu_s']:.2f} s CPU "
                            f"({verdict} the < 5 s target{split})")
    load = os.getloadavg()[0]
    return f"""{BEGIN}
## Cloud scale: resume, suspend and a reconciler pass, before and after issue 18

`python benchmarks/cloud_scale.py` ({datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC, \
{platform.machine()}, {os.cpu_count()} CPUs shared with other work, load average {load:.1f} at
the end; method in its docstring): the fakes (moto's server, the GCE fake) in processes of their
own; CPU = slurm-spot's process only (user + system, the call alone, including the cloud
library's import and clients), median ± spread (max - min) over the runs; API calls of one run;
*before* = {baseline} (the tree before issue 18), *after* = this checkout, interleaved.

{HEADER}
{chr(10).join(lines)}

{chr(10).join('- ' + v for v in verdicts)}

Why these calls. AWS resume: one DescribeInstances for what exists, one CreateFleet per 1000
nodes, DescribeInstances by launch tag (a page per 1000), CreateTags for the node mapping (one
per bit of the largest node index, plus the completion mark); suspend: one DescribeInstances
(a page per 1000) and one TerminateInstances per 1000 ids. GCE resume: one aggregatedList page
per 500 instances, one bulkInsert (up to 5000 VMs per call, [About bulk creation of
VMs](https://cloud.google.com/compute/docs/instances/multiple/about-bulk-creation)), operation
waits, the listing again; suspend: the listing and
one `instances.delete` per instance: Compute Engine has no bulk delete for instances outside a
managed instance group, and its HTTP batch endpoint (up to 1000 calls in one request) still
counts every call against the quota
([Batching requests](https://cloud.google.com/compute/docs/api/how-tos/batch)) and is not
offered by google-cloud-compute; the deletes go out 8 at a time instead of one by one, so their
wall time is ~1/8 of the serial one while the call count stays N. The reconciler pass: before,
every orphan built a new provider (a boto3 session and EC2 client each on AWS) and on GCE
listed every instance again; after, one provider per pass, one TerminateInstances for all
orphans, and GCE deletes by the zones of the pass's own listing.

Where a figure is missing or odd. AWS at 5000 nodes is not in `make bench`: moto needs
minutes of its own per 1000 instances launched (its XML serializer), so the 5000-node rows
come from a run of this script alone (`--aws-sizes 5000 --gce-sizes '' --baseline ''`, ~25
minutes of moto's time here) and say when; benchmarks/fast_moto.py makes moto's instance
lookups and serializer fast enough for a 1000-instance DescribeInstances page to come back
within slurm-spot's 30 s read timeout (the earlier 5000-node attempt failed on that). At 5000
the CPU includes botocore parsing every instance record of the lookups (five pages of 1000)
and of CreateFleet's answers. A batched TerminateInstances that EC2 refuses because of one
instance (termination protection; moto's `InvalidAttachment.NotFound` from its volume
bookkeeping, seen once at 1000 nodes) is split in halves until the failing instance is
alone: every other instance is terminated and the one left is named (tests/test_batching.py),
at about 2 log2(n) extra calls per bad instance. GCE suspend is one `instances.delete` per
node (no bulk delete exists, see above): its fixed cost is importing google-cloud-compute
and building its clients (~1.5-2.5 s here, the 1-node row), and each delete costs
google-cloud-compute ~1-2 ms of CPU (building the request, parsing the operation into a
proto and back to JSON); the per-request scan of the process environment by requests for
proxy settings is gone (read once per client since this run's tree). Above ~1000 nodes the
per-call part dominates; only an HTTP batch client (not in google-cloud-compute) would
change that.
{END}"""


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--aws-sizes", default="1,100,1000",
                        help="node counts on moto (5000: ~10 min of moto's time per run)")
    parser.add_argument("--gce-sizes", default="1,100,1000,5000")
    parser.add_argument("--json", type=Path, default=HERE / "cloud_scale.json",
                        help="results kept here; rows this run did not measure are taken "
                             "from it (with their date)")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--big-runs", type=int, default=1, help="runs at 1000 nodes and more")
    parser.add_argument("--baseline", default=BASELINE, help="git ref to compare with ('' none)")
    parser.add_argument("--baseline-ops", default="resume,suspend,pass",
                        help="operations measured on the baseline too (the others' before "
                             "figures are kept from cloud_scale.json, dated)")
    parser.add_argument("--smoke", action="store_true",
                        help="10 nodes, one run, this tree only, no BENCHMARKS.md update")
    parser.add_argument("--no-write", action="store_true")
    parser.add_argument("--output", type=Path, default=ROOT / "BENCHMARKS.md")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--serve-gce", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--serve-moto", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        print(json.dumps(child(json.loads(args.child))))
        return 0
    if args.serve_gce:
        serve_gce()
        return 0
    if args.serve_moto:
        serve_moto(args.serve_moto)
        return 0
    if args.smoke:
        args.aws_sizes = args.gce_sizes = "10"
        args.runs, args.big_runs, args.baseline, args.no_write = 1, 1, "", True
    sizes = {"aws": [int(s) for s in args.aws_sizes.split(",") if s],
             "gce": [int(s) for s in args.gce_sizes.split(",") if s]}
    os.environ.update(AWS_ENV)
    for key in ("AWS_PROFILE", "AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_EC2"):
        os.environ.pop(key, None)
    with tempfile.TemporaryDirectory(prefix="cloud-scale-") as tmp:
        work = Path(tmp)
        trees = {"current": ROOT}
        if args.baseline:
            subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--quiet",  # noqa: S603
                            "--detach", str(work / "baseline"), args.baseline],
                           check=True, timeout=120)
            trees = {"baseline": work / "baseline", "current": ROOT}
        try:
            rows = measure(trees, sizes, args.runs, args.big_runs, work,
                           {o.strip() for o in args.baseline_ops.split(",") if o.strip()})
        finally:
            if args.baseline:
                subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force",  # noqa: S603
                                str(work / "baseline")], check=False, timeout=120)
    print(json.dumps(rows, indent=1))
    failed = [r for r in rows if r["tree"] == "current" and r["errors"]]
    if failed:
        print(f"errors: {failed}", file=sys.stderr)
    if not args.no_write:
        from report import write_section

        stamp = f"{datetime.now(timezone.utc):%Y-%m-%d %H:%M}"
        for row in rows:
            row["date"] = stamp
        key = ("cloud", "operation", "nodes", "tree")
        fresh = {tuple(r[k] for k in key) for r in rows}
        kept = json.loads(args.json.read_text()) if args.json.exists() else []
        rows += [r for r in kept if tuple(r[k] for k in key) not in fresh]
        rows.sort(key=lambda r: (r["cloud"], r["operation"] == "pass", r["nodes"],
                                 r["operation"] != "resume"))
        args.json.write_text(json.dumps(rows, indent=1) + "\n")
        write_section(args.output, BEGIN, END, section(rows, args.baseline))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
