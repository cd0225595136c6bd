"""Figures for ``cost --plot`` and ``simulate --plot`` (matplotlib, Agg backend, PNG).

matplotlib is the optional extra ``plot`` (``pip install 'slurm-spot[plot]'``); it is imported
only here, only when a figure is asked for. Each ``*_figure`` function returns the
``matplotlib.figure.Figure`` (so callers and tests can inspect its artists); :func:`save_png`
writes it.
"""

from __future__ import annotations

import textwrap
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from slurm_spot.errors import BadInputError, SlurmSpotError

if TYPE_CHECKING:
    from matplotlib.figure import Figure

    from slurm_spot.cost.accounting import CostReport, JobUsage
    from slurm_spot.cost.simulator import Baseline, StrategyResult

MARKET_COLOURS = {"spot": "tab:green", "on-demand": "tab:blue"}


def _pyplot() -> Any:
    try:
        import matplotlib

        matplotlib.use("Agg")
        from matplotlib import pyplot
    except ImportError:
        raise SlurmSpotError("--plot needs matplotlib: pip install 'slurm-spot[plot]'") from None
    return pyplot


def require_matplotlib() -> None:
    """Check, before any work, that a figure can be drawn.

    Raises:
        BadInputError: matplotlib is not installed (exit 2: the option cannot work here)."""
    import importlib.util

    try:
        found = importlib.util.find_spec("matplotlib") is not None
    except (ImportError, ValueError):  # ValueError: sys.modules["matplotlib"] is None
        found = False
    if not found:
        raise BadInputError("--plot needs matplotlib, which is not installed: "
                            "pip install 'slurm-spot[plot]' (or leave --plot out)")


def check_png_path(path: str) -> Path:
    """``--plot FILE.png``: must end in ``.png`` and lie in an existing directory.

    Raises:
        BadInputError: otherwise (names the path)."""
    out = Path(path)
    if out.suffix.lower() != ".png":
        raise BadInputError(f"--plot {path!r}: the file name must end in .png")
    if not out.parent.is_dir():
        raise BadInputError(f"--plot {path!r}: directory {str(out.parent)!r} does not exist")
    return out


def save_png(fig: Figure, path: Path) -> None:
    """Write ``fig`` as a PNG and close it.

    Raises:
        SlurmSpotError: the file cannot be written."""
    try:
        fig.savefig(path, format="png", dpi=100)
    except OSError as exc:
        raise SlurmSpotError(f"cannot write {path}: {exc.strerror}") from None
    finally:
        _pyplot().close(fig)


def job_figure(usage: JobUsage, report: CostReport) -> Figure:
    """Top: one row per node, a bar per instance segment (colour = market), a red ``x`` per
    interruption and a dashed line at each restart. Bottom: cumulative cost of the job against
    the same node-hours on-demand (USD over time)."""
    plt = _pyplot()
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(10, 7), sharex=True)
    nodes = sorted({s.node for s in usage.segments})
    row = {n: i for i, n in enumerate(nodes)}
    seen: set[str] = set()
    for seg in usage.segments:
        label = f"{seg.market} {seg.instance_type}"
        top.barh(row[seg.node], (seg.end - seg.start).total_seconds() / 86400, left=seg.start,
                 height=0.6, color=MARKET_COLOURS.get(seg.market, "tab:gray"),
                 label=None if label in seen else label)
        seen.add(label)
    if usage.interruptions:
        top.scatter([i.time for i in usage.interruptions],
                    [row.get(i.node, -1) for i in usage.interruptions],
                    marker="x", color="red", s=80, zorder=3, label="interruption")
    for k, (start, _end) in enumerate(usage.runs[1:]):
        top.axvline(start, color="black", linestyle="--", label="restart" if k == 0 else None)
    top.set_yticks(range(len(nodes)), nodes)
    top.set_ylabel("node")
    top.set_title(f"job {usage.job_id}: instances over time ({usage.source})")
    top.legend(loc="upper right", fontsize="small")
    times, spot, od = _cumulative(usage, report)
    # cost accrues linearly between segment boundaries: straight lines are exact
    bottom.plot(times, spot, label="this job (USD)", color="tab:green")
    bottom.plot(times, od, label="same node-hours on-demand (USD)", color="tab:blue",
                linestyle="--")
    bottom.set_ylabel("cumulative cost (USD)")
    bottom.legend(loc="upper left", fontsize="small")
    fig.autofmt_xdate()
    fig.tight_layout()
    return fig


def _cumulative(usage: JobUsage, report: CostReport
                ) -> tuple[list[datetime], list[float], list[float]]:
    """Cost accrued by each segment boundary, priced as in ``report``."""
    rate = {(ln.provider, ln.market, ln.instance_type, ln.zone): (ln.usd_per_h, ln.on_demand_usd_per_h)
            for ln in report.lines}
    bounds = sorted({t for s in usage.segments for t in (s.start, s.end)})
    spot, od = [], []
    for t in bounds:
        a = b = 0.0
        for s in usage.segments:
            hours = max(0.0, (min(t, s.end) - s.start).total_seconds() / 3600)
            price, od_price = rate.get((s.provider, s.market, s.instance_type, s.zone), (0.0, 0.0))
            a += hours * price
            b += hours * od_price
        spot.append(a)
        od.append(b)
    return bounds, spot, od


def simulation_figure(base: Baseline, results: list[StrategyResult], title: str) -> Figure:
    """Left: goodput per strategy with 95 % CIs, its axis from 0 to 1 and each bar labelled
    with its value (small differences stay readable without a cut axis). Right: expected cost
    per strategy with 95 % CIs from 0 and the on-demand cost as a horizontal line."""
    plt = _pyplot()
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4.5))
    names = [r.strategy for r in results]
    bars = left.bar(names, [r.goodput.mean for r in results],
                    yerr=[r.goodput.ci95 for r in results], color="tab:green", capsize=4)
    left.bar_label(bars, labels=[f"{r.goodput.mean:.4f}" for r in results], label_type="center",
                   color="white", fontsize="small")
    left.set_ylim(0.0, 1.05)
    left.set_ylabel("goodput (useful / paid compute)")
    right.bar(names, [r.cost_usd.mean for r in results], yerr=[r.cost_usd.ci95 for r in results],
              color="tab:orange", capsize=4, label="spot strategies")
    right.axhline(base.cost_usd, color="tab:blue", linestyle="--", label="on-demand")
    right.set_ylim(bottom=0.0)
    right.set_ylabel("expected cost (USD)")
    right.legend(fontsize="small")
    fig.suptitle("\n".join(textwrap.fill(line, 100) for line in title.splitlines()),
                 fontsize="medium")
    fig.tight_layout()
    return fig
