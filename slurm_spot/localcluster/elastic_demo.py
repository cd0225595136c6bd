"""``slurm-spot demo --elastic``: elastic training around an on-demand coordinator, on local
spot nodes that are reclaimed twice while the job goes on.

1. bring up the local cluster with two node sets: ``spot`` (5 spot nodes, partition ``spot``)
   and ``ondemand`` (1 node, ``market: on-demand``, partition ``ondemand``), plus the
   reconciler (it is what tells the job about a node lost without notice);
2. the coordinator: ``slurm-spot rendezvous`` (torch's c10d store) as a one-node job of its own
   on the on-demand partition, listening on its node's NodeAddr; meanwhile the reference
   training runs on this machine (:meth:`ElasticDemo._reference_argv`);
3. the training: ``slurm-spot sbatch --torchrun --elastic 2:3 --rendezvous <NodeAddr>:<port>
   -p spot -N 3 examples/train_elastic.py``: 3 spot workers;
4. one worker (never the job's batch host: Slurm 22.05 refuses to shrink a job off its first
   node, docs/ml-engineer.md) is reclaimed **with notice** (``local preempt NODE --notice``):
   the watcher signals it, its ranks save and leave, the other two go on; a replacement
   companion job joins and the world is 3 again;
5. another non-batch-host worker of the job is reclaimed **without notice** (its instance is
   killed): the survivors' next collective fails, they re-rendezvous and resume from the
   last periodic checkpoint, the reconciler releases the dead node from the job, a
   replacement joins;
6. the job must finish COMPLETED, never requeued (restart count 0), with a final loss within
   :data:`~slurm_spot.localcluster.elastic_report.LOSS_TOLERANCE` of the reference.

Why not a heterogeneous job (``slurm-spot sbatch --coordinator-partition``): on Slurm 22.05 a
hetjob worker lost without notice makes Slurm cancel the whole hetjob, and replacements are
not built for hetjob workers (jobs/injob/elastic_replacement.py serves plain elastic jobs). A
separate one-node job on the on-demand partition hosts the store just as well, and the
training job is a plain elastic job that both reclaims and replacements work with.
"""

from __future__ import annotations

import os
import shutil
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import yaml

from slurm_spot.errors import SlurmSpotError
from slurm_spot.jobs.injob.torchrun_agent import node_addr
from slurm_spot.jsonenvelope import read_envelope
from slurm_spot.localcluster import elastic_report as report
from slurm_spot.localcluster.demo import Demo, DemoSettings, TrainingLog, demo_config
from slurm_spot.resources import example
from slurm_spot.slurm.client import SlurmClient

#: What ``coordinator.description`` of the JSON says.
COORDINATOR_DESCRIPTION = (
    "one on-demand node runs the rendezvous store (slurm-spot rendezvous) as a one-node job on "
    "the on-demand partition; the training is a plain elastic job on 3 spot workers "
    "(--elastic 2:3 --rendezvous <its NodeAddr>:<port>), not a heterogeneous job "
    "(--coordinator-partition): on Slurm 22.05 a hetjob worker lost without notice makes Slurm "
    "cancel the whole hetjob, and replacements are not built for hetjob workers")

#: Samples of one epoch of the example at the demo's global batch (96): 1797 // 96 batches.
EPOCH_SAMPLES = (1797 // 96) * 96


def elastic_script() -> Path:
    """``examples/train_elastic.py`` (:func:`slurm_spot.resources.example`)."""
    return example("train_elastic.py")


@dataclass
class ElasticDemoSettings(DemoSettings):
    """Knobs of the elastic demo (seconds, steps): ``steps`` at ``step_sleep_s`` each, the
    notice ``first_at_step``, the loss without notice ``kill_after_steps`` steps after the
    world is back to 3, ``join_timeout_s`` for the agents' rendezvous."""

    steps: int = 500
    step_sleep_s: float = 0.15
    checkpoint_every: int = 20
    notice_s: float = 20.0
    first_at_step: int = 30
    kill_after_steps: int = 10
    join_timeout_s: int = 30
    timeout_s: float = 600.0
    workdir: Path = Path("/tmp/slurm-spot-demo-elastic")


def elastic_demo_config(workdir: Path, boot_delay_s: float = 2.0, prewarm: bool = True) -> dict:
    """The demo's spot.yaml (:func:`~slurm_spot.localcluster.demo.demo_config`) with 5 spot
    nodes (3 workers, room for the replacements while the reclaimed nodes power down) and
    one on-demand node, ``coord-1`` (node set ``coord``, a short name: see
    :func:`check_workdir`), in partition ``ondemand``."""
    config = demo_config(workdir, boot_delay_s, prewarm)
    config["node_sets"] = [
        {"name": "spot", "provider": "local", "count": 5, "cpus": 1},
        {"name": "coord", "provider": "local", "count": 1, "cpus": 1, "market": "on-demand"}]
    config["partitions"] = [{"name": "spot", "node_sets": ["spot"], "default": True},
                            {"name": "ondemand", "node_sets": ["coord"]}]
    return config


#: The longest node name of :func:`elastic_demo_config` and the longest step socket name a
#: job of the demo gets there (``<node>_<job id>.<step id>``; batch step 4294967291; the
#: demo's cluster starts with a clean state, so its jobs are numbered from 1).
_LONGEST_SOCKET = "coord-1/coord-1_999.4294967291"

#: sun_path of a Unix socket holds 108 bytes with its terminating NUL (unix(7)).
_SUN_PATH_MAX = 107


def start_elastic_cluster(demo: Demo) -> None:
    """Start the local cluster of :func:`elastic_demo_config` for ``demo`` (its settings'
    workdir, boot delay and prewarm; the spot.yaml written as ``demo-spot.yaml`` there): the
    elastic and the fault-tolerant demos run on it.

    Raises:
        SlurmSpotError: ``slurm-spot local up`` failed.
    """
    workdir = demo.s.workdir
    workdir.mkdir(parents=True, exist_ok=True)
    source = workdir / "demo-spot.yaml"
    source.write_text(yaml.safe_dump(
        elastic_demo_config(workdir, demo.s.boot_delay_s, demo.s.prewarm), sort_keys=False))
    demo.say("starting the local cluster: 5 spot nodes, 1 on-demand node, the reconciler")
    demo.spot_with_config(source, "local", "up", "--conf-dir", str(demo.conf_dir))


def check_workdir(workdir: Path) -> None:
    """slurmstepd makes a Unix socket per job step in the node's spool directory
    (``<workdir>/state/slurmd/<node>/<node>_<job>.<step>``); a longer path than unix(7)
    allows makes every job on that node fail to start (slurmd 22.05: "Unix socket path ...
    is too long", then the job is requeued for ever).

    Raises:
        BadInputError: ``workdir`` is too long for that (names --workdir and the limit).
    """
    from slurm_spot.errors import BadInputError

    longest = len(str(workdir.absolute() / "state" / "slurmd" / _LONGEST_SOCKET))
    if longest > _SUN_PATH_MAX:
        allowed = len(str(workdir.absolute())) - (longest - _SUN_PATH_MAX)
        raise BadInputError(f"--workdir {workdir}: too long for the local nodes' step sockets "
                            f"(at most {allowed} characters here; unix(7) sun_path)")


def free_port() -> int:
    """A TCP port free on this machine now (the local nodes share its network)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class ElasticDemo(Demo):
    """Runs the elastic demo (module docstring); ``progress`` receives one line per stage."""

    s: ElasticDemoSettings

    def __init__(self, settings: ElasticDemoSettings, progress: Callable[[str], None]) -> None:
        super().__init__(settings, progress)
        self.s = settings
        self.samples = settings.workdir / "samples.jsonl"

    def run(self) -> dict[str, object]:
        """The whole demo; returns what ``demo --elastic --json`` prints. ``left_running``
        lists the instances still alive once the cluster is down (none, unless
        ``keep_cluster``)."""
        result = super().run()
        result["left_running"] = self._alive_instances()
        return result

    def _alive_instances(self) -> list[str]:
        from slurm_spot.config import LocalProviderConfig, load_config
        from slurm_spot.providers.local.provider import LocalProvider

        config = load_config(self.conf_dir / "spot.yaml")
        alive = []
        for name, settings in config.providers.items():
            if isinstance(settings, LocalProviderConfig):
                alive += [str(i.node) for i in
                          LocalProvider(config, name, settings).list_instances()
                          if i.state.is_alive]
        return alive

    def _up(self) -> None:
        start_elastic_cluster(self)

    def _reference_argv(self) -> list[str]:
        """One process, world 1, no step sleep: the same seed, global batch and steps."""
        import sys

        folder = self.s.workdir / "reference-checkpoints"
        shutil.rmtree(folder, ignore_errors=True)
        return [sys.executable, str(elastic_script()), "--steps", str(self.s.steps),
                "--checkpoint-dir", str(folder), "--checkpoint-every", str(self.s.steps + 1),
                "--log-every", str(self.s.steps + 1)]

    def _run_job(self) -> dict[str, object]:
        for name in ("WORLD_SIZE", "RANK", "SLURM_SPOT_CHECKPOINT_DIR"):
            self.env.pop(name, None)  # the reference runs alone, from no checkpoint
        self.samples.unlink(missing_ok=True)
        coordinator = self._coordinator()
        self.say("computing the reference (uninterrupted, one process) meanwhile")
        started = self.start_reference()
        try:
            job, log = self._submit_elastic(str(coordinator["rendezvous"]))
            self._wait_listening(coordinator, log)
            self.wait("training to start on 3 workers", lambda: log.last_step() >= 1, log)
            caused = [self._reclaim(job, log, "notice", self.s.first_at_step)]
            self._wait_world(log, 3, "a replacement to join (world 3 again)")
            caused.append(self._reclaim(job, log, "no-notice",
                                        log.last_step() + self.s.kill_after_steps))
            self._wait_world(log, 3, "a second replacement to join (world 3 again)")
            reference = self.reference(started)
        finally:
            if started.poll() is None:
                started.kill()
                started.communicate()
        self.wait("the job to finish", lambda: log.of("done") and self.job_fields(job).get(
            "JobState") in ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL"), log)
        SlurmClient().run("scancel", str(coordinator["job_id"]), check=False)
        return self._result(job, log, caused, coordinator, reference)

    def _coordinator(self) -> dict[str, object]:
        """Submit the rendezvous store as a one-node job on the on-demand partition and wait
        until its node's instance is launched (the resume hook has recorded its NodeAddr:
        the training can be submitted with it while the node boots; torchrun's agents start
        after their own nodes boot and retry the store until it listens). Returns its job id,
        node, NodeAddr and ``rendezvous`` (HOST:PORT)."""
        import sys

        from slurm_spot.events import read_events

        port = free_port()
        out = self.s.workdir / "rendezvous-%j.out"
        script = self.s.workdir / "rendezvous.sh"
        script.write_text(
            "#!/bin/bash\n# slurm-spot demo --elastic: the rendezvous store on the on-demand "
            "node, at its NodeAddr (never every interface: without one, the service's own "
            "default, this node's address)\n"
            "addr=$(scontrol -o show node \"$SLURMD_NODENAME\" | tr ' ' '\\n' "
            "| sed -n 's/^NodeAddr=//p')\n"
            f"exec {sys.executable} -m slurm_spot rendezvous ${{addr:+--listen \"$addr\"}} "
            f"--port {port}\n")
        os.environ["SLURM_CONF"] = self.env["SLURM_CONF"]
        submitted = SlurmClient().run(
            "sbatch", "--parsable", "-p", "ondemand", "-N", "1", "-J", "rendezvous",
            "-o", str(out), str(script), check=False)
        if submitted.returncode != 0:
            raise SlurmSpotError(f"sbatch of the rendezvous job: {submitted.stderr.strip()}")
        job = int(submitted.stdout.strip().split(";")[0])
        self.say(f"submitted the coordinator, job {job}: slurm-spot rendezvous on the "
                 "on-demand partition")
        nodes: list[str] = []

        def launched() -> bool:
            node = self.job_fields(job).get("NodeList", "")
            if node in ("", "(null)"):
                return False
            nodes[:] = [node]
            return any(e.get("action") == "launched" and e.get("node") == node
                       for e in read_events(self.s.workdir / "log"))

        self.wait("the on-demand node to be launched", launched, TrainingLog(out))
        addr = node_addr(SlurmClient(), nodes[0])
        return {"job_id": job, "node": nodes[0], "addr": addr, "partition": "ondemand",
                "rendezvous": f"{addr}:{port}", "description": COORDINATOR_DESCRIPTION,
                "log": str(out).replace("%j", str(job))}

    def _wait_listening(self, coordinator: dict[str, object], log: TrainingLog) -> None:
        path = Path(str(coordinator["log"]))

        def listening() -> bool:
            if path.exists() and "listening" in path.read_text():
                return True
            fields = self.job_fields(int(str(coordinator["job_id"])))
            state = fields.get("JobState", "")
            if state not in ("", "PENDING", "CONFIGURING", "RUNNING") \
                    or fields.get("Restarts", "0") != "0":
                text = path.read_text()[-500:] if path.exists() else "no output"
                raise SlurmSpotError(
                    f"the rendezvous job {coordinator['job_id']} ended or was requeued "
                    f"({state}, restarts {fields.get('Restarts')}) before it listened: "
                    f"{text.strip()}; see {self.s.workdir / 'log'}")
            return False

        self.wait("the rendezvous store to listen on the on-demand node", listening, log)
        self.say(f"rendezvous store listening on {coordinator['rendezvous']} "
                 f"({coordinator['node']}, on-demand)")

    def _submit_elastic(self, rendezvous: str) -> tuple[int, TrainingLog]:
        out = self.s.workdir / "train-%j.out"
        submitted = read_envelope(self.spot(
            "sbatch", "--torchrun", "--elastic", "2:3", "--rendezvous", rendezvous,
            "--join-timeout", str(self.s.join_timeout_s), "--json", "-p", "spot", "-N", "3",
            "-J", "elastic-demo", "-o", str(out), str(elastic_script()),
            "--steps", str(self.s.steps), "--step-sleep", str(self.s.step_sleep_s),
            "--checkpoint-every", str(self.s.checkpoint_every), "--log-every", "1",
            "--sample-log", str(self.samples)), "sbatch")
        job = int(submitted["job_id"])
        self.say(f"submitted job {job}: elastic 2:3 on 3 spot workers, {self.s.steps} steps")
        return job, TrainingLog(Path(str(out).replace("%j", str(job))))

    def _wait_world(self, log: TrainingLog, world: int, what: str) -> None:
        """Wait until the latest step ran with ``world`` ranks, or training ended (then the
        summary shows the world it ended with)."""
        self.wait(what, lambda: log.of("done") or
                  report.world_sizes(e for _, e in log.events)[-1:] == [world], log)
        if not log.of("done"):
            self.say(f"  world {world} again at step {log.last_step()}")

    def _reclaim(self, job: int, log: TrainingLog, kind: str, at_step: int
                 ) -> report.Interruption:
        """Reclaim a worker of the job that is not its batch host, at ``at_step``: with
        notice, or by killing its instance; then wait until the survivors have formed a new
        round and stepped in it."""
        from slurm_spot.hostlist import expand

        self.wait(f"step {at_step}", lambda: log.last_step() >= at_step or log.of("done"), log)
        if log.of("done"):
            raise SlurmSpotError(f"training finished before step {at_step}: give --steps more")
        fields = self.job_fields(job)
        nodes = expand(fields.get("NodeList", ""))
        node = next((n for n in reversed(nodes) if n != fields.get("BatchHost")), None)
        if node is None:
            raise SlurmSpotError(f"job {job} has no worker besides its batch host ({nodes})")
        notice = self.s.notice_s if kind == "notice" else 0
        at = time.time()
        self.spot("local", "preempt", node, "--notice", str(notice),
                  "--conf-dir", str(self.conf_dir), "--json")
        self.say(f"reclaimed {node} at step {log.last_step()} "
                 + (f"with {notice:.0f} s notice" if notice else "without notice"))

        def new_round() -> report.Round | None:
            found = [r for r in report.rounds([e for _, e in log.events]) if r.resume_time >= at]
            return found[0] if found and found[0].first_step_time is not None else None

        self.wait("the survivors to go on", lambda: log.of("done") or new_round(), log)
        found = new_round()
        if found is not None:
            self.say(f"  training goes on with {found.world_after} workers from step "
                     f"{found.resumed_from} after a pause of {found.paused_s} s")
        return report.Interruption(kind, node, at)

    def _result(self, job: int, log: TrainingLog, caused: list[report.Interruption],
                coordinator: dict[str, object], reference: dict) -> dict[str, object]:
        log.poll()
        events = report.output_events(log.path.read_text())
        found = report.rounds(events)
        fields = self.job_fields(job)
        done = log.of("done")[-1][1]
        final, ref = done.get("loss"), reference.get("loss")
        difference = None if final is None or ref is None else round(abs(final - ref), 6)
        samples = report.check_samples(self.samples.read_text().splitlines()
                                       if self.samples.exists() else [],
                                       int(done["step"]), EPOCH_SAMPLES)
        return {
            "mode": "elastic",
            "job_id": job,
            "state": fields.get("JobState"),
            "restarts": int(fields.get("Restarts", "0")),
            "steps": int(done["step"]),
            "world_sizes": report.world_sizes(events),
            "interruptions": report.match_interruptions(caused, found),
            "joins": report.joins(found),
            "final_loss": final,
            "reference_loss": ref,
            "loss_difference": difference,
            "loss_tolerance": report.LOSS_TOLERANCE,
            "loss_within_tolerance": difference is not None
            and difference <= report.LOSS_TOLERANCE,
            "tolerance_reason": report.TOLERANCE_REASON,
            "samples": samples.to_json(),
            "sample_log": str(self.samples),
            "coordinator": coordinator,
            "wall_s": round(time.monotonic() - self.started, 1),
            "workdir": str(self.s.workdir),
        }
