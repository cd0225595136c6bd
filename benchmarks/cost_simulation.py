"""Goodput of the four recovery strategies by interruption band and job size, and the canonical
20-node setup's saving and extra wall time, from ``slurm_spot.cost.simulator``.

Writes the ``cost-simulation`` section of BENCHMARKS.md (``--no-write``: print only;
``--smoke``: 10 runs per cell, print only).
Deterministic: every figure comes from seeded runs, so a re-run gives the same table.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import replace
from datetime import datetime, timezone
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from report import write_section  # noqa: E402 - benchmarks/report.py, beside this script

from slurm_spot.config.plain import band_fraction  # noqa: E402
from slurm_spot.cost.planner import rate_from_monthly_fraction  # noqa: E402
from slurm_spot.cost.prices import PriceBook  # noqa: E402
from slurm_spot.cost.simulator import STRATEGIES, SimParams, simulate  # noqa: E402

BEGIN, END = "<!-- cost-simulation:begin -->", "<!-- cost-simulation:end -->"
BANDS = ("<5%", "10-15%", ">20%")
NODE_COUNTS = (8, 32)
# One job as the goodput table assumes it (seconds; see the section text).
JOB = {"job_hours": 48.0, "checkpoint_s": 120.0, "restart_s": 120.0, "boot_s": 120.0,
       "notice_s": 120.0}
FIXED_INTERVAL_S = 1200.0  # the canonical setup's "a checkpoint every 20 minutes"
CANONICAL_TYPE = "p4d.24xlarge"
SPOT_SHARES = (0.30, 0.40)  # spot price as a share of on-demand (a 70 % / 60 % discount)


def goodput_table(runs: int, seed: int) -> list[str]:
    rows = ["| band (per month) | nodes | job MTBF (h) | " + " | ".join(STRATEGIES) + " |",
            "|---|---|---|" + "---|" * len(STRATEGIES)]
    for band in BANDS:
        rate = rate_from_monthly_fraction(band_fraction(band))
        for nodes in NODE_COUNTS:
            p = SimParams(nodes=nodes, node_rate_per_h=rate, **JOB)  # type: ignore[arg-type]
            _, results = simulate(p, STRATEGIES, runs, seed)
            cells = [f"{r.goodput.mean:.4f} ± {r.goodput.ci95:.4f}" for r in results]
            rows.append(f"| {band} | {nodes} | {p.job_mtbf_s / 3600:.0f} | " + " | ".join(cells) + " |")
        print(rows[-1], flush=True)
    return rows


def canonical_table(runs: int, seed: int) -> tuple[list[str], float]:
    on_demand = PriceBook(_cost_config()).instance("aws", "on-demand", CANONICAL_TYPE).usd_per_h
    rows = ["| band | spot price | strategy | checkpoint every | saving vs on-demand | "
            "extra wall time | interruptions |", "|---|---|---|---|---|---|---|"]
    for band in ("10-15%", ">20%"):
        rate = rate_from_monthly_fraction(band_fraction(band))
        for share in SPOT_SHARES:
            p = SimParams(nodes=20, on_demand_nodes=1, node_rate_per_h=rate,
                          interval_s=FIXED_INTERVAL_S,
                          spot_usd_per_h=share * on_demand, on_demand_usd_per_h=on_demand,
                          **{**JOB, "checkpoint_s": 60.0, "job_hours": 72.0})  # type: ignore[arg-type]
            _, fixed = simulate(p, ("plain", "periodic", "slurm-spot"), runs, seed)
            _, daly = simulate(replace(p, interval_s=None), ("plain", "periodic", "slurm-spot"),
                               runs, seed)
            for r in [*fixed, *daly]:
                rows.append(f"| {band} | {share:.0%} of on-demand | {r.strategy} | "
                            f"{r.interval_s / 60:.0f} min | {r.saving_vs_on_demand:.1%} | "
                            f"{r.extra_wall_vs_on_demand:+.2%} | {r.interruptions.mean:.2f} |")
            print(rows[-1], flush=True)
    return rows, on_demand


def _cost_config() -> object:
    from slurm_spot.config import CostConfig

    return CostConfig()


def section(runs: int, seed: int) -> str:
    goodput = goodput_table(runs, seed)
    canonical, on_demand = canonical_table(runs, seed)
    when = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    return "\n".join([
        BEGIN,
        "## What interruptions cost: simulated goodput and the canonical setup",
        "",
        "Goodput (useful compute / paid compute, mean ± 95 % CI over the runs) of one job of "
        f"{JOB['job_hours']:g} h compute; checkpoint {JOB['checkpoint_s']:g} s, restart "
        f"{JOB['restart_s']:g} s, boot {JOB['boot_s']:g} s, notice {JOB['notice_s']:g} s; "
        "every strategy checkpoints at Daly's interval for the job's MTBF (`simulate`'s "
        "default), and run i of every strategy sees the same interruption times. "
        "`plain` = SlurmdTimeout 300 s + requeue hold 121 s + boot + restart "
        "(661 s, close to the 660 s measured in the recovery section above); `periodic` = "
        "reconciler detection 30 s + boot + restart. A band stands for its midpoint "
        "(>20 %: 25 %) of nodes interrupted a month, constant hazard.",
        "",
        *goodput,
        "",
        "Target check (slurm-spot above 0.95 where plain Slurm is below 0.9): slurm-spot is "
        "above 0.98 in every cell, but plain Slurm is never below 0.9 in these bands: at the "
        "same interval it loses 0.3-3 % to interruptions where slurm-spot loses 0.2-1.5 %. Even "
        "at >20 % a month, 32 nodes see one interruption every ~79 h. Spot Advisor's bands are "
        "far from the failure rates where plain Slurm falls below 0.9. (Before issue 29 this "
        "table gave `plain` and `periodic` a fixed 20-minute interval against Daly's for the "
        "others, and showed ~0.91 against ~0.99: most of that gap was the interval, not the "
        "recovery.)",
        "",
        "### The canonical setup: 20 nodes (1 on-demand coordinator + 19 spot), a checkpoint "
        "every 20 minutes",
        "",
        f"{CANONICAL_TYPE} at ${on_demand:g}/h on-demand (catalogue, us-east-1); a 72 h job, "
        "checkpoint 60 s; each strategy first at the fixed 20-minute interval (`simulate "
        "--interval-s 1200`), then at Daly's interval (`simulate`'s default), every strategy at "
        "the same interval and under the same interruptions in each pair. Saving and extra wall "
        "time are against the same 72 compute hours on 20 on-demand nodes.",
        "",
        *canonical,
        "",
        "The claim \"more than 70 % cheaper than on-demand\" does not hold for this setup at a "
        "70 % spot discount: the on-demand coordinator alone caps the saving at "
        "1 - (1 + 19 x 0.3) / 20 = 66.5 %, and the 20-minute checkpoints add ~4-5 % wall time "
        "(and cost) on top. It needs a spot discount above ~75 % (or no on-demand "
        "coordinator). At 20 minutes the extra wall time is almost all checkpointing, for "
        "every strategy. Checkpointing at Daly's interval cuts it for every strategy: plain "
        "Slurm to ~1-2 %, slurm-spot (whose notice-time checkpoint saves the work an "
        "interruption would lose) to ~0.5-0.8 %, bringing its saving close to that cap.",
        "",
        f"Method: `python benchmarks/cost_simulation.py` ({when}); {runs} seeded runs per cell "
        f"(seed {seed}); `slurm-spot simulate` gives any cell with the same options.",
        END,
    ])


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=1000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--no-write", action="store_true", help="do not update BENCHMARKS.md")
    parser.add_argument("--output", type=Path, default=ROOT / "BENCHMARKS.md")
    parser.add_argument("--smoke", action="store_true", help="10 runs per cell, print only")
    args = parser.parse_args(argv)
    if args.smoke:
        args.runs, args.no_write = 10, True
    text = section(args.runs, args.seed)
    if args.no_write:
        print(text)
    else:
        write_section(args.output, BEGIN, END, text)


if __name__ == "__main__":
    main()
