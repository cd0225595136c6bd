"""``slurm-spot demo``: a torchrun job on local spot nodes, interrupted twice, that finishes.

1. bring up the local cluster (real slurmctld, local instances, the reconciler);
2. submit the training with ``slurm-spot sbatch --torchrun`` on 2 nodes, and meanwhile compute
   the reference: the same training, uninterrupted, on this machine (it runs while the job
   waits for its nodes, so it adds no time);
4. preempt one of its nodes with a notice (the watcher drains it and signals the job, which
   checkpoints and requeues); wait until training resumes on fresh nodes;
5. kill one of its nodes without notice (the reconciler notices, requeues and expedites);
   wait until training resumes again (at the latest :data:`DemoSettings.tail_steps` before
   the end, so the job is still running when its node dies);
6. wait for the job to complete and compare the final weights with the reference.

The training prints JSON events (examples/train_digits.py); the demo reads them from the job's
output file and times each interruption from the moment it caused it to the first event of
the resumed run.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

import yaml

from slurm_spot.config import LOCAL_COST
from slurm_spot.errors import SlurmSpotError
from slurm_spot.events import read_events
from slurm_spot.jsonenvelope import read_envelope
from slurm_spot.recovery import PARTS, STARTUP_PARTS, breakdown, startup_times
from slurm_spot.resources import example
from slurm_spot.slurm.client import SlurmClient, run_command


def example_script() -> Path:
    """The demo's training script, ``examples/train_digits.py`` of the repository
    (:func:`slurm_spot.resources.example`: the same lookup in a wheel and a checkout)."""
    return example("train_digits.py")


@dataclass
class Interruption:
    """One interruption the demo caused and what it cost."""

    kind: str  # "notice" | "kill"
    node: str
    at_step: int
    started: float
    resumed_from: int | None = None
    recovery_s: float | None = None
    breakdown: dict[str, object] = field(default_factory=dict)

    @property
    def lost_steps(self) -> int | None:
        """Steps computed twice: last step seen before the interruption minus the step the
        resumed run started from."""
        return None if self.resumed_from is None else max(0, self.at_step - self.resumed_from)

    def to_json(self) -> dict[str, object]:
        return {"kind": self.kind, "node": self.node, "at_step": self.at_step,
                "resumed_from": self.resumed_from, "lost_steps": self.lost_steps,
                "recovery_s": None if self.recovery_s is None else round(self.recovery_s, 1),
                "prewarmed": bool(self.breakdown.get("prewarmed")),
                "breakdown": self.breakdown}


def tail_lines(path: Path, lines: int) -> list[str]:
    """The last ``lines`` lines of the file at ``path`` (read from its last 64 KiB; bytes that
    are not UTF-8 replaced), for a diagnosis.

    Raises:
        OSError: the file cannot be read.
    """
    with open(path, "rb") as fh:
        fh.seek(0, os.SEEK_END)
        fh.seek(max(0, fh.tell() - 64 * 1024))
        return fh.read().decode(errors="replace").splitlines()[-lines:]


@dataclass
class DemoSettings:
    """Knobs of the demo run (seconds, steps)."""

    workdir: Path = Path("/tmp/slurm-spot-demo")
    steps: int = 240
    step_sleep_s: float = 0.25
    checkpoint_every: int = 40
    notice_s: float = 30.0
    first_at_step: int = 50
    second_after_steps: int = 60
    #: the kill comes at least this many steps before the last one (or a quarter of ``steps``
    #: if that is more): at ``step_sleep_s`` a step it leaves the job ~10 s to still be running
    #: when its node dies, however late the notice's signal stopped it
    tail_steps: int = 45
    timeout_s: float = 900.0
    keep_cluster: bool = False
    boot_delay_s: float = 2.0
    prewarm: bool = True
    #: hot spares kept up in the node set (``node_sets[].spares``): a job requeued after a
    #: kill without notice starts on one instead of waiting for a boot
    spares: int = 0
    #: the job's workers start warm (False: ``slurm-spot sbatch --torchrun --no-preload``)
    preload: bool = True
    #: an ``s3://bucket/prefix`` checkpoint root (None: a directory in ``workdir``), and how
    #: to reach it; credentials come from the environment (boto3's chain)
    checkpoint_root: str | None = None
    s3_endpoint_url: str | None = None
    s3_addressing_style: str = "auto"


@dataclass
class TrainingLog:
    """Reads the job's output file incrementally; remembers when each event was first seen,
    and keeps slurm-spot's own lines (the batch script's and the agents', ``slurm-spot: ...``)."""

    path: Path
    events: list[tuple[float, dict]] = field(default_factory=list)
    lines: list[str] = field(default_factory=list)
    _offset: int = 0

    def poll(self) -> None:
        if not self.path.exists():
            return
        with open(self.path, "rb") as fh:
            fh.seek(self._offset)
            data = fh.read()
        complete = data[: data.rfind(b"\n") + 1]
        self._offset += len(complete)
        now = time.monotonic()
        for line in complete.decode(errors="replace").splitlines():
            if line.startswith("slurm-spot: "):
                self.lines.append(line)
            if line.startswith("{"):
                try:
                    self.events.append((now, json.loads(line)))
                except ValueError:
                    continue

    def of(self, kind: str) -> list[tuple[float, dict]]:
        return [(t, e) for t, e in self.events if e.get("event") == kind]

    def last_step(self) -> int:
        steps = [int(e["step"]) for _, e in self.events if "step" in e]
        return max(steps) if steps else 0


def demo_config(workdir: Path, boot_delay_s: float = 2.0, prewarm: bool = True,
                checkpoint: dict | None = None, spares: int = 0) -> dict:
    """The demo's spot.yaml: 4 one-CPU local nodes, short timers, a fast reconciler.

    ``boot_delay_s`` is the local instances' simulated boot (seconds; slurmd adds ~2-3 s);
    ResumeTimeout and the orphan grace grow with it. ``prewarm`` is ``preemption.prewarm``.
    ``checkpoint`` replaces the default checkpoint section (a directory in ``workdir``).
    ``spares`` (0-2) is the node set's ``spares`` (hot spares kept up; 0: none).
    """
    node_set: dict[str, object] = {"name": "spot", "provider": "local", "count": 4, "cpus": 1}
    if spares:
        node_set["spares"] = spares
    return {
        "cluster": "demo",
        "providers": {"local": {"type": "local", "kill_wait_s": 10, "notice_poll_s": 0.5,
                                "boot_delay_s": boot_delay_s}},
        "node_sets": [node_set],
        "partitions": [{"name": "spot", "node_sets": ["spot"], "default": True}],
        "power": {"suspend_time_s": 20, "suspend_timeout_s": 10,
                  "resume_timeout_s": int(90 + boot_delay_s)},
        "reconcile": {"interval_s": 5, "orphan_grace_s": int(60 + boot_delay_s),
                      "cooldown_s": 60},
        "preemption": {"signal": "USR2", "lead_s": 90, "prewarm": prewarm},
        "state_dir": str(workdir / "state"),
        "log_dir": str(workdir / "log"),
        "checkpoint": checkpoint or {"root": str(workdir / "checkpoints"), "keep": 2},
        "cost": LOCAL_COST,  # so `slurm-spot cost --job N` prices the demo's jobs
    }


class Demo:
    """Runs the demo; ``progress`` receives one human line per stage."""

    def __init__(self, settings: DemoSettings, progress: Callable[[str], None]) -> None:
        self.s = settings
        self.say = progress
        self.conf_dir = settings.workdir / "etc"
        self.env = {**os.environ, "SLURM_CONF": str(self.conf_dir / "slurm.conf"),
                    "GLOO_SOCKET_IFNAME": "lo", "PYTHONUNBUFFERED": "1"}
        self.env.pop("SLURM_SPOT_CONFIG", None)
        self.started = time.monotonic()

    # -- plumbing -------------------------------------------------------------------------
    def spot(self, *args: str) -> str:
        argv = [sys.executable, "-m", "slurm_spot", "--config", str(self.conf_dir / "spot.yaml"),
                *args]
        proc = run_command(argv, 120, env=self.env)
        if proc.returncode != 0:
            raise SlurmSpotError(f"{' '.join(args)}: {proc.stderr.strip() or proc.stdout}")
        return proc.stdout

    def job_fields(self, job_id: int) -> dict[str, str]:
        from slurm_spot.slurm.jobtext import job_fields_with_user_text, split_job_records

        os.environ["SLURM_CONF"] = self.env["SLURM_CONF"]
        result = SlurmClient().run("scontrol", "-o", "show", "job", str(job_id), check=False)
        records = split_job_records(result.stdout) if result.returncode == 0 else []
        try:
            return job_fields_with_user_text(records[0]) if records else {}
        except ValueError:
            return {}

    def wait(self, what: str, predicate: Callable[[], object], log: TrainingLog) -> object:
        last_report = 0.0
        while True:
            log.poll()
            value = predicate()
            if value:
                return value
            now = time.monotonic()
            if now - self.started > self.s.timeout_s:
                raise SlurmSpotError(f"demo timed out after {self.s.timeout_s:.0f} s waiting "
                                     f"for {what}; logs in {self.s.workdir / 'log'}\n"
                                     + self.diagnosis(log))
            if now - last_report > 15:
                last_report = now
                self.say(f"  ... waiting for {what} ({now - self.started:.0f} s, "
                         f"step {log.last_step()})")
            time.sleep(0.5)

    def diagnosis(self, log: TrainingLog, lines: int = 15) -> str:
        """What a timed-out wait leaves for whoever reads the error (a CI log has nothing
        else): the cluster's jobs and nodes as squeue and sinfo show them, and the last ``lines`` lines of the
        job's output, the reconciler's log and the event log. Never raises."""
        parts = []
        conf = Path(self.env["SLURM_CONF"])
        if not conf.exists():
            parts.append(f"squeue: no cluster ({conf} does not exist)")
        else:
            try:
                os.environ["SLURM_CONF"] = str(conf)
                client = SlurmClient(timeout_s=10)
                queue = client.run("squeue", "-a", "-o", "%i %T %r %N %S", check=False)
                parts.append(f"squeue:\n{(queue.stdout or queue.stderr).strip()}")
                nodes = client.run("sinfo", "-N", "-h", "-o", "%N %T %E", check=False)
                parts.append(f"sinfo:\n{(nodes.stdout or nodes.stderr).strip()}")
            except (OSError, SlurmSpotError) as err:
                parts.append(f"squeue: {err}")
        logs = self.s.workdir / "log"
        for path in (log.path, logs / "reconcile.log", logs / "events.jsonl"):
            try:
                tail = tail_lines(path, lines)
            except OSError as err:
                parts.append(f"{path}: {err.strerror}")
                continue
            parts.append(f"last lines of {path}:\n" + "\n".join(tail))
        return "\n".join(parts)

    # -- stages ---------------------------------------------------------------------------
    def _reference_argv(self) -> list[str]:
        return [sys.executable, "-m", "torch.distributed.run", "--standalone",
                "--nproc-per-node=2", str(example_script()), "--reference", "--steps",
                str(self.s.steps)]

    def start_reference(self) -> subprocess.Popen[str]:
        """Start the reference training (:meth:`reference`) in the background; the job on
        the cluster spends its first half minute waiting for nodes, so both fit."""
        return subprocess.Popen(  # noqa: S603 - argv list, no shell
            self._reference_argv(), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
            stderr=subprocess.PIPE, text=True, env=self.env)

    def reference(self, started: subprocess.Popen[str] | None = None) -> dict:
        """Train uninterrupted on this machine (2 ranks, same seed) for the reference: the
        ``done`` event of ``examples/train_digits.py --reference``. ``started`` is a run from
        :meth:`start_reference` to collect first (10 minutes at most); a failed run is
        retried, 3 runs in all.

        Raises:
            SlurmSpotError: every run failed (the last one's stderr is in the message).
        """
        errors = ""
        for attempt in range(3):  # deterministic, so a retry changes nothing but luck with gloo
            if attempt == 0 and started is not None:
                try:
                    stdout, stderr = started.communicate(timeout=600)
                except subprocess.TimeoutExpired:
                    started.kill()
                    stdout, stderr = started.communicate()
                code = started.returncode
            else:
                proc = run_command(self._reference_argv(), 600, env=self.env)
                code, stdout, stderr = proc.returncode, proc.stdout, proc.stderr
            done = [json.loads(line) for line in stdout.splitlines()
                    if line.startswith("{") and '"done"' in line]
            if code == 0 and done:
                return dict(done[-1])
            errors = stderr[-2000:]
            self.say(f"  reference run failed (attempt {attempt + 1} of 3), retrying")
        raise SlurmSpotError(f"reference run failed: {errors}")

    def run(self) -> dict[str, object]:
        """The whole demo (module docstring); returns what ``demo --json`` prints."""
        self._up()
        try:
            return self._run_job()
        finally:
            self._down()

    def measure(self, kind: str, repetitions: int) -> list[Interruption]:
        """For benchmarks: one long training job on a fresh cluster, interrupted
        ``repetitions`` times the same way (``notice`` or ``kill``), the first at
        ``first_at_step``, each next one ``second_after_steps`` steps after the last resume;
        then the job is cancelled and the cluster stopped. Returns each interruption."""
        self._up()
        try:
            job, log = self._submit(steps=100_000)
            self.wait("training to start", lambda: log.last_step() >= 1, log)
            result = []
            at = self.s.first_at_step
            for _ in range(repetitions):
                result.append(self._interrupt(kind, job, log, at))
                at = log.last_step() + self.s.second_after_steps
            self.spot("local", "status")  # the cluster still answers
            SlurmClient().run("scancel", str(job), check=False)
            return result
        finally:
            self._down()

    def config_data(self, checkpoint: dict | None) -> dict:
        """The cluster's spot.yaml as data (:func:`demo_config`); the soak's has two node
        sets. ``checkpoint``: the checkpoint section, None for the default."""
        return demo_config(self.s.workdir, self.s.boot_delay_s, self.s.prewarm, checkpoint,
                           self.s.spares)

    def _up(self) -> None:
        workdir = self.s.workdir
        workdir.mkdir(parents=True, exist_ok=True)
        source = workdir / "demo-spot.yaml"
        checkpoint = None
        if self.s.checkpoint_root:
            checkpoint = {"root": self.s.checkpoint_root, "keep": 2,
                          "s3": {"endpoint_url": self.s.s3_endpoint_url,
                                 "addressing_style": self.s.s3_addressing_style}}
        source.write_text(yaml.safe_dump(self.config_data(checkpoint), sort_keys=False))
        self.say("starting the local spot cluster (munge, slurmctld, reconciler)")
        self.spot_with_config(source, "local", "up", "--conf-dir", str(self.conf_dir))

    def _down(self) -> None:
        if not self.s.keep_cluster:
            try:
                self.say("stopping the local cluster")
            except OSError:
                pass  # the terminal or pipe is gone (its reader died): still stop the cluster
            self.spot("local", "down", "--conf-dir", str(self.conf_dir))

    def spot_with_config(self, config: Path, *args: str) -> None:
        argv = [sys.executable, "-m", "slurm_spot", "--config", str(config), *args]
        proc = run_command(argv, 120, env=self.env)
        if proc.returncode != 0:
            raise SlurmSpotError(proc.stderr.strip() or proc.stdout)

    def _run_job(self) -> dict[str, object]:
        self.say("computing the reference (uninterrupted run on this machine) meanwhile")
        started = self.start_reference()
        try:
            job, log = self._submit(self.s.steps)
            self.wait("training to start", lambda: log.last_step() >= 1, log)
            interruptions = [self._interrupt("notice", job, log, self.s.first_at_step)]
            nxt = min(log.last_step() + self.s.second_after_steps,
                      self.s.steps - max(self.s.tail_steps, self.s.steps // 4))
            interruptions.append(self._interrupt("kill", job, log, nxt))
            reference = self.reference(started)
        finally:
            if started.poll() is None:  # the demo failed first: stop the reference too
                started.kill()
                started.communicate()
        self.wait("the job to finish", lambda: log.of("done") and
                  self.job_fields(job).get("JobState") in ("COMPLETED", "FAILED", "CANCELLED"),
                  log)
        fields = self.job_fields(job)
        done = log.of("done")[-1][1]
        return {
            "job_id": job,
            "state": fields.get("JobState"),
            "preemptions": len(interruptions),
            "restarts": int(fields.get("Restarts", "0")),
            "steps": int(done["step"]),
            "lost_steps": sum(i.lost_steps or 0 for i in interruptions),
            "interruptions": [i.to_json() for i in interruptions],
            "final_loss": done.get("loss"),
            "reference_loss": reference.get("loss"),
            "exact_resume": done.get("weights_sha256") == reference.get("weights_sha256"),
            "wall_s": round(time.monotonic() - self.started, 1),
            "preload": self.s.preload,
            "spares": self.s.spares,
            "workdir": str(self.s.workdir),
        }

    def _submit(self, steps: int) -> tuple[int, TrainingLog]:
        out = self.s.workdir / "train-%j.out"
        submitted = read_envelope(self.spot(
            "sbatch", "--torchrun", *([] if self.s.preload else ["--no-preload"]),
            "--json", "-p", "spot", "-N", "2", "-o", str(out),
            str(example_script()), "--steps", str(steps), "--step-sleep", str(self.s.step_sleep_s),
            "--checkpoint-every", str(self.s.checkpoint_every), "--log-every", "1",
            "--timestamps"), "sbatch")
        job = int(submitted["job_id"])
        self.say(f"submitted job {job}: 2 nodes, {steps} steps")
        return job, TrainingLog(Path(str(out).replace("%j", str(job))))

    def _job_nodes(self, job: int) -> list[str]:
        from slurm_spot.hostlist import expand

        nodes = self.job_fields(job).get("NodeList", "")
        return expand(nodes) if nodes and nodes != "(null)" else []

    def _interrupt(self, kind: str, job: int, log: TrainingLog, at_step: int) -> Interruption:
        """Interrupt the job's first node at ``at_step`` (with notice, or a kill), wait for
        the first step of the resumed run and time each part (:mod:`slurm_spot.recovery`)."""
        resumes_before = len(log.of("resume")) + len(log.of("start"))
        self.wait(f"step {at_step}", lambda: log.last_step() >= at_step, log)
        node = self._job_nodes(job)[0]
        notice = self.s.notice_s if kind == "notice" else 0
        answer = read_envelope(self.spot("local", "preempt", node, "--notice", str(notice),
                                         "--conf-dir", str(self.conf_dir), "--json"),
                               "local preempt")
        interrupted_at = datetime.fromisoformat(answer["deadline"]).timestamp() - notice
        log.poll()
        event = Interruption(kind, node, log.last_step(), time.monotonic())
        step_at_notice = event.at_step
        self.say(f"{'preempted' if notice else 'killed'} {node} at step {event.at_step}"
                 + (f" with {notice:.0f} s notice" if notice else " without notice"))
        self.wait("training to resume on fresh nodes",
                  lambda: len(log.of("resume")) + len(log.of("start")) > resumes_before, log)
        when, first = sorted(log.of("resume") + log.of("start"), key=lambda pair: pair[0])[-1]
        # A step of the resumed run is one logged after its resume line: after a kill the old
        # run's later steps (lost work) are already in the log with higher step numbers.
        resumed_at = max(i for i, (_, e) in enumerate(log.events)
                         if e.get("event") in ("resume", "start"))
        self.wait("the first resumed step",
                  lambda: any(e.get("event") == "step" for _, e in log.events[resumed_at + 1:]),
                  log)
        if kind == "notice" and log.of("preempted"):
            # Training ran on until the signal reached it; its stop step is what was done.
            event.at_step = max(event.at_step, int(log.of("preempted")[-1][1]["step"]))
        event.resumed_from = int(first.get("step", 0))
        event.recovery_s = when - event.started
        since = [e for _, e in log.events if float(e.get("time", 0)) >= interrupted_at]
        watch = [e for e in read_events(self.s.workdir / "log")
                 if e.get("source") == "watch" and job in list(e.get("job_ids") or [])  # type: ignore[call-overload]
                 and datetime.fromisoformat(str(e["time"])).timestamp() >= interrupted_at - 1]
        logs = [path.read_text(errors="replace")
                for path in sorted((self.s.workdir / "log").glob("slurmd-*.log"))]
        startup = startup_times(job, interrupted_at, log.lines, logs)
        event.breakdown = breakdown(kind, interrupted_at, step_at_notice, since, watch,
                                    self.job_fields(job), job, startup)
        self.say(f"resumed from step {event.resumed_from} after {event.recovery_s:.0f} s "
                 f"({event.lost_steps} step(s) lost); exit -> first resumed step "
                 f"{event.breakdown['exit_to_first_step_s']} s, prewarmed "
                 f"{event.breakdown['prewarmed']}")
        return event


def summary_lines(result: dict[str, object]) -> list[str]:
    """The human summary of a demo result."""
    lines = [f"job {result['job_id']}: {result['state']} after {result['wall_s']} s, "
             f"{result['steps']} steps, {result['restarts']} restart(s)"]
    for item in result["interruptions"]:  # type: ignore[attr-defined]
        lines.append(f"  {item['kind']:6} on {item['node']}: at step {item['at_step']}, resumed "
                     f"from {item['resumed_from']} after {item['recovery_s']} s, "
                     f"{item['lost_steps']} step(s) recomputed, prewarmed {item['prewarmed']}")
        parts = item.get("breakdown") or {}
        shown = [f"{p.removesuffix('_s').replace('_to_', '->')} {parts.get(p)}"
                 for p in PARTS if parts.get(p) is not None]
        lines.append(f"    {', '.join(shown)} (s); exit->first step "
                     f"{parts.get('exit_to_first_step_s')} s")
        startup = parts.get("startup") or {}
        shown = [f"{p.removesuffix('_s').replace('_to_', '->')} {startup.get(p)}"
                 for p in STARTUP_PARTS if startup.get(p) is not None]
        if shown:
            lines.append(f"    allocation->first step: {', '.join(shown)} (s)")
    lines.append(f"final loss {result['final_loss']} (reference {result['reference_loss']}); "
                 f"weights {'identical to' if result['exact_resume'] else 'DIFFERENT from'} "
                 "the uninterrupted run")
    return lines
