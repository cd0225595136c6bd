"""A soak under the chaos market: the demo's training job (examples/train_digits.py, 2 nodes,
torchrun) on a local cluster of two node sets, ``cheap`` (Weight 1) and ``other`` (Weight 10),
while the market (:mod:`.marketd`) takes capacity away and interrupts instances; the job must
finish with weights bit-identical to an uninterrupted run.

Used by the e2e test (tests/test_market_e2e.py) and benchmarks/market_soak.py. The result
has the market's report (:mod:`.market_report`): interruptions with and without notice,
capacity errors, failovers and requeues, and the job's goodput measured next to ``slurm-spot
simulate``'s prediction for the same settings. The job's compute seconds (what goodput
divides) are its steps times the median seconds between consecutive steps in its log; its
restart seconds (an input of the prediction) are measured at its first start: from the job
seen RUNNING to its first step.
"""

from __future__ import annotations

import itertools
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from slurm_spot.errors import SlurmSpotError
from slurm_spot.jsonenvelope import read_envelope
from slurm_spot.localcluster.demo import Demo, DemoSettings, TrainingLog, demo_config

#: The soak's default market: ``cheap`` has no capacity for its first 30 s (the job fails
#: over to ``other``), then always; both node sets see 60 interruptions per node-hour, half
#: of them with 15 s of notice.
DEFAULT_MARKETS = (
    "cheap:rate=60,notice=0.5,notice_s=15,start=down,down=30,up=86400",
    "other:rate=60,notice=0.5,notice_s=15",
)


@dataclass
class SoakSettings(DemoSettings):
    """The demo's knobs plus the market's: ``markets`` (``NODE_SET:key=value,...`` specs),
    ``seed``, ``market_s`` (seconds the market runs; None: until the job ends)."""

    workdir: Path = Path("/tmp/slurm-spot-soak")
    markets: tuple[str, ...] = DEFAULT_MARKETS
    seed: int = 2
    market_s: float | None = 150.0
    checkpoint_s: float = 1.0
    extra_nodes: int = 0
    cooldown_s: int = 30
    steps: int = 240
    timeout_s: float = 600.0
    node_sets: tuple[str, ...] = field(default=("cheap", "other"))


def soak_config(settings: SoakSettings, checkpoint: dict | None = None) -> dict:
    """The soak's spot.yaml: the demo's (:func:`demo_config`) with partition ``spot`` made of
    ``cheap`` (Weight 1) and ``other`` (Weight 10), 2 + ``extra_nodes`` one-CPU nodes each,
    and a capacity cooldown of ``cooldown_s`` seconds."""
    data = demo_config(settings.workdir, settings.boot_delay_s, settings.prewarm, checkpoint)
    count = 2 + settings.extra_nodes
    data["cluster"] = "soak"
    data["node_sets"] = [
        {"name": name, "provider": "local", "count": count, "cpus": 1, "weight": weight}
        for name, weight in zip(settings.node_sets, (1, 10), strict=True)]
    data["partitions"] = [{"name": "spot", "node_sets": list(settings.node_sets),
                           "default": True}]
    data["reconcile"]["cooldown_s"] = settings.cooldown_s
    return data


class Soak(Demo):
    """Runs the soak; ``progress`` receives one human line per stage."""

    s: SoakSettings

    def __init__(self, settings: SoakSettings, progress: Callable[[str], None]) -> None:
        super().__init__(settings, progress)

    def config_data(self, checkpoint: dict | None) -> dict:
        return soak_config(self.s, checkpoint)

    def _run_job(self) -> dict[str, object]:
        self.say("computing the reference (uninterrupted run on this machine) meanwhile")
        started = self.start_reference()
        conf = ("--conf-dir", str(self.conf_dir))
        try:
            market = ["local", "market", "start", "--seed", str(self.s.seed), *conf]
            for spec in self.s.markets:
                market += ["--node-set", spec]
            if self.s.market_s is not None:
                market += ["--duration", str(self.s.market_s)]
            self.spot(*market)
            self.say(f"market started (seed {self.s.seed}): {'; '.join(self.s.markets)}")
            job, log = self._submit(self.s.steps)
            running_at = float(self.wait(
                "the job to run", lambda: self.job_fields(job).get("JobState") == "RUNNING"
                and time.monotonic(), log))  # type: ignore[arg-type]
            self.wait("training to start", lambda: log.last_step() >= 1, log)
            restart_s = log.of("step")[0][0] - running_at
            self.wait("the job to finish", lambda: log.of("done") and self.job_fields(job).get(
                "JobState") in ("COMPLETED", "FAILED", "CANCELLED"), log)
            reference = self.reference(started)
        finally:
            if started.poll() is None:
                started.kill()
                started.communicate()
        self.spot("local", "market", "stop", *conf)
        compute_s = self.s.steps * _step_seconds(log)
        report = read_envelope(self.spot(
            "local", "market", "report", "--json", "--job", str(job), "--compute-s",
            f"{compute_s:.2f}", "--checkpoint-s", str(self.s.checkpoint_s), "--interval-s",
            str(self.s.checkpoint_every * self.s.step_sleep_s), "--restart-s",
            f"{max(restart_s, 0.0):.1f}", *conf), "local market report")
        fields = self.job_fields(job)
        done = log.of("done")[-1][1]
        return {
            "job_id": job, "state": fields.get("JobState"), "steps": int(done["step"]),
            "final_loss": done.get("loss"), "reference_loss": reference.get("loss"),
            "exact_resume": done.get("weights_sha256") == reference.get("weights_sha256"),
            "restart_s": round(restart_s, 1), "market": report,
            "wall_s": round(time.monotonic() - self.started, 1),
            "workdir": str(self.s.workdir),
        }


def _step_seconds(log: TrainingLog) -> float:
    """Median seconds between consecutive steps of one run (by the training's own clock).

    Raises:
        SlurmSpotError: the log has no two consecutive timed steps.
    """
    steps = [e for _, e in log.events if e.get("event") == "step" and "time" in e]
    gaps = [float(b["time"]) - float(a["time"]) for a, b in itertools.pairwise(steps)
            if int(b["step"]) == int(a["step"]) + 1 and float(b["time"]) > float(a["time"])]
    if not gaps:
        raise SlurmSpotError("the training log has no consecutive timed steps")
    return statistics.median(gaps)


def summary_lines(result: dict[str, object]) -> list[str]:
    """The human summary of a soak."""
    from slurm_spot.localcluster.market_report import summary_lines as market_lines

    lines = [f"job {result['job_id']}: {result['state']} after {result['wall_s']} s, "
             f"{result['steps']} steps; weights "
             f"{'identical to' if result['exact_resume'] else 'DIFFERENT from'} the "
             "uninterrupted run"]
    return lines + market_lines(result["market"])  # type: ignore[arg-type]
