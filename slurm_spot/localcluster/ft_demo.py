"""``slurm-spot demo --fault-tolerant``: torchft replica groups on local spot nodes that train
on while one group is reclaimed with notice and another is lost without, each replaced by a
requeued run that heals from a live peer.

1. bring up the local cluster of the elastic demo (5 spot nodes, partition ``spot``; one
   on-demand node ``coord-1``, partition ``ondemand``; the reconciler);
2. submit ``slurm-spot sbatch --torchrun --fault-tolerant 3 --coordinator-partition ondemand
   -p spot examples/train_ft.py``: the lighthouse job on ``coord-1`` and 3 group jobs on spot
   nodes (slurm_spot.jobs.submit.ft_scripts);
3. once every group trains, group g1's node is reclaimed **with notice** (``local preempt
   NODE --notice``): the watcher boots a replacement and signals g1, which leaves at a step
   boundary without a checkpoint and exits 85; its job is requeued, lands on the prewarmed
   node, and its new run joins the next quorum and heals from a peer;
4. once g1 left, group g2's node is **killed without notice**: the survivors' all-reduce fails, the
   next quorum forms without g2 (the lighthouse's heartbeat timeout); the reconciler requeues
   g2's job, which heals from a peer on a new node;
5. once both healed, every group is told to end a few steps later (``--steps-file``) and the
   one-process reference of that many steps runs here;
6. every group job must end COMPLETED with the same weights, and the final loss within
   :data:`LOSS_TOLERANCE` of the reference.

What the JSON reports (:func:`survivor_gap`, :func:`joins`): per interruption the longest
wait between two consecutive steps of any surviving group from the interruption for
:data:`LOSS_WINDOW_S` or until the next one (``survivor_max_gap_s``); per join (a heal) the
heal's time and bytes, and the survivors' longest wait within 2 s of it.
"""

from __future__ import annotations

import itertools
import shutil
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from slurm_spot.errors import SlurmSpotError
from slurm_spot.jsonenvelope import read_envelope
from slurm_spot.localcluster.demo import Demo, DemoSettings, TrainingLog
from slurm_spot.localcluster.elastic_demo import start_elastic_cluster
from slurm_spot.resources import example

#: How far the groups' final loss may be from the one-process reference: every step is the
#: mean-loss gradient over the same global batch whatever the number of groups, only summed
#: in another order (gloo), so the losses agree to float rounding (measured: 1e-6 and below).
LOSS_TOLERANCE = 1e-3
TOLERANCE_REASON = ("every step is the mean-loss gradient over the same global batch in any "
                    "number of groups, summed in another order: float rounding only")
#: An interruption's ``survivor_max_gap_s`` counts the survivors' steps from the interruption
#: (the group left, or was killed) for this long, or until the next interruption: the pause a
#: loss causes comes within a second (the lighthouse's 0.5 s heartbeat timeout); the pause when
#: the replacement joins is its join's own ``survivor_max_gap_s`` (2 s either side of its heal).
LOSS_WINDOW_S = 15.0
#: Job states after which a job runs no more.
FINAL_STATES = ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY")


def ft_script() -> Path:
    """``examples/train_ft.py`` (:func:`slurm_spot.resources.example`)."""
    return example("train_ft.py")


@dataclass
class FtDemoSettings(DemoSettings):
    """Knobs of the fault-tolerant demo (seconds, steps): at most ``steps`` at ``step_sleep_s``
    each; once both replacements healed, every group ends ``tail_steps`` after the furthest
    (``train_ft.py --steps-file``: the end is not a race against the replacements' start-up);
    the notice when every group reached ``first_at_step``; the kill ``kill_after_steps``
    steps after the noticed group left (~5 s: the notice's own pause is over by then; both
    replacements start meanwhile, so the demo does not wait for a requeue, a node and Python's
    start-up twice). A replacement took 50-70 s from its group's loss to its heal on the
    shared, loaded 2-CPU test machine (most of it slurmctld's power-up check and importing
    torch and torchft), 300-500 steps there."""

    steps: int = 5000
    step_sleep_s: float = 0.1
    checkpoint_every: int = 100
    notice_s: float = 10.0
    first_at_step: int = 5
    kill_after_steps: int = 25
    tail_steps: int = 40
    timeout_s: float = 420.0
    workdir: Path = Path("/tmp/slurm-spot-demo-ft")


def events(log: TrainingLog) -> list[dict[str, Any]]:
    """The training events read so far, in order."""
    return [e for _, e in log.events]


def max_gap(times: Sequence[float], start: float, end: float) -> float:
    """The longest wait (s) between two consecutive times whose later one lies in
    [``start``, ``end``] (0.0 if none)."""
    gaps = [b - a for a, b in itertools.pairwise(sorted(times)) if start <= b <= end]
    return round(max(gaps, default=0.0), 3)


def step_runs(evs: Sequence[dict[str, Any]]) -> list[list[float]]:
    """The times of a group's step events (seconds since the epoch), one list per run of
    the training (a ``start`` event begins one): a gap between two runs is the group's own
    absence, not a pause of a survivor."""
    runs: list[list[float]] = []
    for event in evs:
        if event.get("event") == "start" or not runs:
            runs.append([])
        if event.get("event") == "step":
            runs[-1].append(float(event["time"]))
    return runs


def survivor_gap(logs: dict[str, TrainingLog], group: str, start: float, end: float) -> float:
    """The longest wait (s) between two consecutive steps of one run of any group but
    ``group``, the later step within [``start``, ``end``] (seconds since the epoch)."""
    runs = [run for g in logs if g != group for run in step_runs(events(logs[g]))]
    return max((max_gap(times, start, end) for times in runs), default=0.0)


def joins(evs: Sequence[dict[str, Any]], group: str) -> list[dict[str, object]]:
    """A group's ``heal`` events as the JSON's ``joins``."""
    return [{"group": group, "step": e.get("step"), "healed_from_peer": bool(e.get("from_peer")),
             "heal_s": e.get("heal_s"), "bytes": e.get("bytes"), "time": e.get("time")}
            for e in evs if e.get("event") == "heal"]


class FtDemo(Demo):
    """Runs the fault-tolerant demo (module docstring)."""

    s: FtDemoSettings

    def __init__(self, settings: FtDemoSettings, progress: Callable[[str], None]) -> None:
        super().__init__(settings, progress)
        self.s = settings

    def _up(self) -> None:
        start_elastic_cluster(self)

    def _reference_argv(self) -> list[str]:
        return [sys.executable, str(ft_script()), "--reference", "--steps", str(self.s.steps)]

    def _run_job(self) -> dict[str, object]:
        for name in ("SLURM_SPOT_CHECKPOINT_DIR", "TORCHFT_LIGHTHOUSE", "REPLICA_GROUP_ID"):
            self.env.pop(name, None)
        shutil.rmtree(self.s.workdir / "checkpoints", ignore_errors=True)
        stop = self.s.workdir / "steps"
        stop.unlink(missing_ok=True)
        started = None
        try:
            lighthouse, groups = self._submit_ft(stop)
            logs = {name: TrainingLog(self.s.workdir / f"ft-{job}.out")
                    for name, job in groups.items()}
            every = _AllLogs(logs)
            self.wait("every group to train", lambda: all(
                log.last_step() >= self.s.first_at_step for log in logs.values()), every)
            caused = [self._reclaim("notice", "g1", groups, logs, every)]
            self.wait("g1 to leave", lambda: logs["g1"].of("leave"), every)
            at = logs["g0"].last_step() + self.s.kill_after_steps
            self.wait(f"step {at}", lambda: logs["g0"].last_step() >= at, every)
            caused.append(self._reclaim("kill", "g2", groups, logs, every))
            for item in caused:
                self._healed(item, logs, every)
            # Both replacements train: end every group at the same step, a little later.
            self.s.steps = max(log.last_step() for log in logs.values()) + self.s.tail_steps
            partial = stop.with_suffix(".partial")
            partial.write_text(f"{self.s.steps}\n")
            partial.replace(stop)
            self.say(f"every group ends at step {self.s.steps}; computing the reference "
                     "(one process, no torchft) meanwhile")
            started = self.start_reference()
            reference = self.reference(started)
        finally:
            if started is not None and started.poll() is None:
                started.kill()
                started.communicate()
        self.wait("every group to finish", lambda: all(
            self.job_fields(int(job)).get("JobState") in FINAL_STATES
            for job in groups.values()), every)
        self.wait("the lighthouse job to end", lambda: self.job_fields(int(lighthouse)).get(
            "JobState") in FINAL_STATES, every)
        return self._result(lighthouse, groups, logs, caused, reference)

    def _submit_ft(self, stop: Path) -> tuple[str, dict[str, str]]:
        submitted = read_envelope(self.spot(
            "sbatch", "--torchrun", "--fault-tolerant", "3", "--coordinator-partition",
            "ondemand", "--json", "-p", "spot", "-J", "ft-demo",
            "-o", str(self.s.workdir / "ft-%j.out"), str(ft_script()),
            "--steps", str(self.s.steps), "--step-sleep", str(self.s.step_sleep_s),
            "--checkpoint-every", str(self.s.checkpoint_every), "--log-every", "1",
            "--steps-file", str(stop)), "sbatch")
        groups = dict(zip(submitted["groups"], submitted["group_job_ids"], strict=True))
        lighthouse = str(submitted["lighthouse_job_id"])
        self.say(f"submitted the lighthouse job {lighthouse} (on-demand) and 3 replica groups "
                 + ", ".join(f"{g}={j}" for g, j in groups.items())
                 + f": at most {self.s.steps} steps")
        return lighthouse, groups

    def _reclaim(self, kind: str, group: str, jobs: dict[str, str],
                 logs: dict[str, TrainingLog], every: _AllLogs) -> dict[str, object]:
        """Reclaim ``group``'s node: with notice (``local preempt --notice``), or killed;
        returns the interruption's JSON so far (:meth:`_healed` adds the rest)."""
        job = int(jobs[group])
        node = self.job_fields(job).get("NodeList", "")
        notice = self.s.notice_s if kind == "notice" else 0
        self.spot("local", "preempt", node, "--notice", str(notice),
                  "--conf-dir", str(self.conf_dir), "--json")
        self.say(f"reclaimed {group}'s node {node} at step {logs[group].last_step()} "
                 + (f"with {notice:.0f} s notice" if notice else "without notice"))
        return {"kind": kind, "group": group, "node": node, "job_id": job,
                "heals_before": len(logs[group].of("heal")), "at": time.time()}

    def _healed(self, item: dict[str, object], logs: dict[str, TrainingLog],
                every: _AllLogs) -> None:
        """Wait until the reclaimed group's requeued run healed from a peer; adds when it
        was interrupted (it left, or was killed) and healed to ``item``."""
        group, before = str(item.pop("group")), int(item.pop("heals_before"))  # type: ignore[call-overload]
        at = float(item.pop("at"))  # type: ignore[arg-type]
        log = logs[group]
        self.wait(f"{group} to heal from a peer", lambda: len(log.of("heal")) > before
                  or log.of("done"), every)
        if len(log.of("heal")) == before:
            raise SlurmSpotError(f"{group} finished before it was replaced: give --steps more")
        heal = log.of("heal")[before][1]
        left = [e for _, e in log.of("leave") if float(e["time"]) >= at - 1]
        interrupted = float(left[0]["time"]) if left else at
        self.say(f"  {group} healed from a peer at step {heal['step']} in {heal['heal_s']} s "
                 f"({heal['bytes']} bytes), {float(heal['time']) - interrupted:.1f} s after it "
                 f"{'left' if left else 'was killed'}")
        item.update({"group": group, "left_at_step": left[0]["step"] if left else None,
                     "interrupted_at": round(interrupted, 3), "healed_at": heal["time"]})

    def _result(self, lighthouse: str, groups: dict[str, str], logs: dict[str, TrainingLog],
                caused: list[dict[str, object]], reference: dict) -> dict[str, object]:
        for log in logs.values():
            log.poll()
        fields = {name: self.job_fields(int(job)) for name, job in groups.items()}
        done = {name: log.of("done")[-1][1] for name, log in logs.items() if log.of("done")}
        starts = sorted(float(i["interrupted_at"]) for i in caused)  # type: ignore[arg-type]
        for item in caused:
            start = float(item["interrupted_at"])  # type: ignore[arg-type]
            end = min([t for t in starts if t > start] + [start + LOSS_WINDOW_S])
            item["survivor_max_gap_s"] = survivor_gap(logs, str(item["group"]), start, end)
        joined = [j for name, log in logs.items() for j in joins(events(log), name)]
        for join in joined:
            at = float(join["time"])  # type: ignore[arg-type]
            join["survivor_max_gap_s"] = survivor_gap(logs, str(join["group"]), at - 2.0,
                                                      at + 2.0)
        losses = {d.get("loss") for d in done.values()}
        final = done["g0"].get("loss") if "g0" in done else None
        ref = reference.get("loss")
        difference = None if final is None or ref is None else round(abs(final - ref), 6)
        states = {name: f.get("JobState") for name, f in fields.items()}
        lighthouse_state = self.job_fields(int(lighthouse)).get("JobState")
        return {
            "mode": "fault-tolerant",
            "state": "COMPLETED" if set(states.values()) == {"COMPLETED"} and len(done) == 3
            else "FAILED",
            "jobs": {name: {"job_id": int(groups[name]), "state": states[name],
                            "restarts": int(fields[name].get("Restarts", "0"))}
                     for name in groups},
            "lighthouse": {"job_id": int(lighthouse), "state": lighthouse_state,
                           "node": self.job_fields(int(lighthouse)).get("NodeList")},
            "restarts": sum(int(f.get("Restarts", "0")) for f in fields.values()),
            "steps": max((int(d["step"]) for d in done.values()), default=0),
            "interruptions": caused,
            "joins": joined,
            "replicas_identical": len(done) == 3
            and len({d.get("weights_sha256") for d in done.values()}) == 1,
            "final_loss": final,
            "final_losses_equal": len(losses) == 1,
            "reference_loss": ref,
            "loss_difference": difference,
            "loss_tolerance": LOSS_TOLERANCE,
            "loss_within_tolerance": difference is not None and difference <= LOSS_TOLERANCE,
            "tolerance_reason": TOLERANCE_REASON,
            "wall_s": round(time.monotonic() - self.started, 1),
            "workdir": str(self.s.workdir),
        }


class _AllLogs(TrainingLog):
    """Polls several groups' logs at once (what :meth:`Demo.wait` polls); ``last_step`` is
    the furthest group's."""

    def __init__(self, logs: dict[str, TrainingLog]) -> None:
        super().__init__(Path("/dev/null"))
        self.logs = logs

    def poll(self) -> None:
        for log in self.logs.values():
            log.poll()

    def last_step(self) -> int:
        return max(log.last_step() for log in self.logs.values())


def verdict(result: dict[str, Any]) -> list[str]:
    """What is wrong with a demo result (empty: it passed)."""
    problems = []
    if result["state"] != "COMPLETED":
        problems.append(f"groups ended {result['jobs']}")
    if not result["replicas_identical"]:
        problems.append("the groups' final weights differ")
    if not result["joins"] or not all(j["healed_from_peer"] for j in result["joins"]):
        problems.append("a replacement did not heal from a peer")
    if not result["loss_within_tolerance"]:
        problems.append(f"final loss {result['final_loss']} is not within "
                        f"{result['loss_tolerance']} of the reference {result['reference_loss']}")
    return problems


def summary_lines(result: dict[str, Any]) -> list[str]:
    """The human summary of a result."""
    lines = [f"fault-tolerant job: {result['state']} after {result['wall_s']} s, "
             f"{result['steps']} steps, {result['restarts']} group restart(s); lighthouse job "
             f"{result['lighthouse']['job_id']} on {result['lighthouse']['node']} "
             f"({result['lighthouse']['state']})"]
    for name, job in result["jobs"].items():
        lines.append(f"  {name}: job {job['job_id']} {job['state']}, {job['restarts']} restart(s)")
    for item in result["interruptions"]:
        lines.append(f"  {item['kind']:6} on {item['node']} ({item['group']}): the survivors' "
                     f"longest pause {item['survivor_max_gap_s']} s")
    for join in result["joins"]:
        lines.append(f"  {join['group']} healed from a peer at step {join['step']}: "
                     f"{join['heal_s']} s, {join['bytes']} bytes; the others' longest pause "
                     f"{join['survivor_max_gap_s']} s")
    lines.append(f"replicas identical: {result['replicas_identical']}; final loss "
                 f"{result['final_loss']} (reference {result['reference_loss']}, tolerance "
                 f"{result['loss_tolerance']})")
    return lines
