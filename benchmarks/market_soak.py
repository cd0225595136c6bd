"""Chaos-market soak: interruptions, failovers, goodput measured vs simulated (issue 24 part 5).

Method: for each seed a fresh local cluster (partition ``spot`` = ``cheap``, Weight 1, +
``other``, Weight 10; the demo's timers) runs the demo's 2-node torchrun training job
(examples/train_digits.py, 0.25 s per step, a checkpoint every 40 steps) under the chaos
market (``slurm-spot local market``): ``cheap`` has no capacity for the first 30 s, both node
sets see ``--rate`` interruptions per node-hour, half of them with 15 s of notice, for
``--market-s`` seconds. Each row: what the job went through, whether its final weights equal
an uninterrupted run's, its goodput (compute seconds / seconds from submission to end) and
``slurm-spot simulate``'s prediction for the same settings (:mod:`slurm_spot.localcluster.
market_report`: capacity outages are not simulated). A job's luck differs by seed, so compare
the mean of several seeds with the prediction.

Usage (repository root, slurm-wlm and munge installed; each run holds
/tmp/slurm-spot-test-cluster.lock while its cluster runs)::

    python benchmarks/market_soak.py [--seeds 0,1,2] [--steps 240] [--rate 60]
        [--market-s 150] [--json-out FILE] [--no-write] [--smoke]
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import tempfile
from datetime import datetime, timezone
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from report import write_section  # noqa: E402 - benchmarks/report.py, beside this script

from slurm_spot.localcluster.soak import Soak, SoakSettings  # noqa: E402
from tests.cluster import acquire_cluster_lock  # noqa: E402

BENCHMARKS = ROOT / "BENCHMARKS.md"
BEGIN, END = "<!-- market-soak:begin -->", "<!-- market-soak:end -->"


def markets(rate: float) -> tuple[str, ...]:
    """The soak's market at ``rate`` interruptions per node-hour."""
    return (f"cheap:rate={rate:g},notice=0.5,notice_s=15,start=down,down=30,up=86400",
            f"other:rate={rate:g},notice=0.5,notice_s=15")


def run_one(seed: int, steps: int, rate: float, market_s: float) -> dict[str, object]:
    """One soak (a fresh cluster); its row."""
    with tempfile.TemporaryDirectory(prefix="market-soak-") as tmp, acquire_cluster_lock():
        settings = SoakSettings(workdir=Path(tmp), steps=steps, seed=seed,
                                markets=markets(rate), market_s=market_s, timeout_s=900)
        result = Soak(settings, lambda line: print(f"  [seed {seed}] {line}", flush=True)).run()
    market = result["market"]
    assert isinstance(market, dict)
    job = market["jobs"][0] if market["jobs"] else {}
    prediction = market.get("prediction") or {}
    return {
        "seed": seed, "state": result["state"], "exact_resume": result["exact_resume"],
        "with_notice": job.get("interruptions_with_notice", 0),
        "without_notice": job.get("interruptions_without_notice", 0),
        "capacity_errors": market["capacity_errors"], "failovers": job.get("failovers", 0),
        "requeues": job.get("requeues", 0), "wall_s": job.get("wall_s"),
        "goodput": job.get("goodput"), "simulated": prediction.get("goodput"),
        "restart_s": result["restart_s"],
    }


def table(rows: list[dict[str, object]]) -> str:
    """The rows as a Markdown table, with the mean goodputs last."""
    lines = ["| seed | state | bit-exact | with notice | without | capacity errors | failovers "
             "| requeues | restart (s) | wall (s) | goodput measured | goodput simulated |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['seed']} | {r['state']} | {r['exact_resume']} | {r['with_notice']} "
                     f"| {r['without_notice']} | {r['capacity_errors']} | {r['failovers']} | "
                     f"{r['requeues']} | {r.get('restart_s')} | {r['wall_s']} | {r['goodput']} | "
                     f"{r['simulated'] if r['simulated'] is not None else 'none'} |")
    measured = [float(r["goodput"]) for r in rows if r["goodput"] is not None]  # type: ignore[arg-type]
    simulated = [float(r["simulated"]) for r in rows if r["simulated"] is not None]  # type: ignore[arg-type]
    if measured and simulated:
        lines.append(f"| mean | | | | | | | | | | {statistics.fmean(measured):.4f} | "
                     f"{statistics.fmean(simulated):.4f} |")
    return "\n".join(lines)


def section(rows: list[dict[str, object]], args: argparse.Namespace) -> str:
    when = datetime.now(timezone.utc).strftime("%Y-%m-%d")
    return f"""{BEGIN}
## Chaos-market soak: interruptions, failovers, goodput measured vs simulated (issue 24)

The demo's 2-node training job ({args.steps} steps) under `slurm-spot local market`: `cheap`
(Weight 1) without capacity for 30 s, {args.rate:g} interruptions per node-hour on both node
sets (half with 15 s notice) for {args.market_s:g} s. Goodput = compute seconds / seconds from
submission to end; simulated: `slurm-spot simulate` for the same settings (outages not
simulated). Restart: the prediction's restart input, measured at the job's first start (from
RUNNING to its first step), interruptions and requeues during that start included, so on a
loaded machine it can be large, and the prediction then falls below the measured goodput; `none`:
the simulator gave no prediction for that seed's inputs (`slurm-spot local market report
--json` shows its message).

{table(rows)}

Method: `python benchmarks/market_soak.py --seeds {args.seeds} --steps {args.steps} --rate
{args.rate:g} --market-s {args.market_s:g}` ({when}; {platform.system()}, other work was
running on the machine). One fresh local cluster per seed.
{END}"""


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", default="2,28,32", help="market seeds, one soak each")
    parser.add_argument("--steps", type=int, default=240, help="training steps")
    parser.add_argument("--rate", type=float, default=60.0, help="interruptions per node-hour")
    parser.add_argument("--market-s", type=float, default=150.0, help="seconds the market runs")
    parser.add_argument("--json-out", type=Path, default=None, help="also write the rows here")
    parser.add_argument("--no-write", action="store_true", help="do not update BENCHMARKS.md")
    parser.add_argument("--smoke", action="store_true",
                        help="one seed, 160 steps, 90 s of market; nothing written")
    args = parser.parse_args(argv)
    if args.smoke:
        args.seeds, args.steps, args.market_s, args.no_write = "2", 160, 90.0, True
    seeds = [int(s) for s in args.seeds.split(",") if s.strip()]
    rows = [run_one(seed, args.steps, args.rate, args.market_s) for seed in seeds]
    print(table(rows))
    if args.json_out:
        args.json_out.write_text(json.dumps(rows, indent=2))
    if not args.no_write:
        write_section(BENCHMARKS, BEGIN, END, section(rows, args))
        print(f"wrote {BENCHMARKS}")


if __name__ == "__main__":
    main()
