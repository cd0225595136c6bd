"""Replacement nodes for elastic jobs, without a cluster: the companion job's options and
script, the cap at MAX, and the supervisor requesting and cancelling companions (real
processes as agents, stand-ins for Slurm's commands)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from slurm_spot.cli import cli
from slurm_spot.jobs.injob.elastic_replacement import (
    Supervisor,
    companion_options,
    companion_script,
    leftovers,
    wanted,
)
from slurm_spot.jobs.injob.torchrun_agent import ElasticSettings, elastic_torchrun_args
from slurm_spot.jsonenvelope import read_envelope
from slurm_spot.slurm.states import parse_oneline
from tests.elastic_runs import rendezvous_service

AGENT = ["/venv/bin/python", "-m", "slurm_spot.jobs.injob.torchrun_agent", "--nproc-per-node=1",
         "--elastic=2:3", "--rendezvous=ctl:29390", "--join-timeout=30", "--",
         "/home/u/train.py", "--steps", "100"]

#: ``scontrol -o show job`` of a running elastic job, as Slurm 22.05 prints it (shortened).
JOB_LINE = (
    "JobId=42 JobName=train UserId=u(1000) GroupId=u(1000) MCS_label=N/A Priority=1 Account=ml QOS=normal "
    "JobState=RUNNING Reason=None Requeue=1 Restarts=0 BatchFlag=1 ExitCode=0:0 "
    "TimeLimit=02:00:00 Partition=spot NodeList=spot-[1-3] BatchHost=spot-1 NumNodes=3 "
    "MinCPUsNode=4 MinMemoryNode=16G MinTmpDiskNode=0 Features=(null) Reservation=(null) "
    "WorkDir=/home/u Comment=(null) StdErr=/home/u/out-42.txt StdOut=/home/u/out-42.txt "
    "TresPerNode=gres:gpu:8")


def test_never_more_requested_than_the_target_capped_at_max() -> None:
    assert wanted(3, 3, 3, 0) == 0  # all there
    assert wanted(3, 3, 2, 0) == 1  # one lost: one replacement
    assert wanted(3, 3, 2, 1) == 0  # its replacement is pending: nothing more
    assert wanted(3, 3, 0, 0) == 3
    assert wanted(5, 3, 2, 0) == 1  # the target never exceeds MAX
    assert wanted(3, 3, 3, 2) == 0  # never negative


def test_companion_asks_for_what_the_job_asked_per_node() -> None:
    options = companion_options(parse_oneline(JOB_LINE), "42", "train", "spot", "USR2@120")
    assert options[:3] == ["--parsable", "--no-requeue", "--nodes=1"]
    for wanted_option in ("--partition=spot", "--job-name=train+replacement",
                          "--comment=slurm-spot replacement for job 42", "--signal=USR2@120",
                          "--account=ml", "--qos=normal", "--time=02:00:00", "--mincpus=4",
                          "--mem=16G", "--gres=gpu:8", "--chdir=/home/u",
                          "--output=/home/u/out-42.txt", "--error=/home/u/out-42.txt",
                          "--open-mode=append"):
        assert wanted_option in options
    assert not [o for o in options if "(null)" in o or o.startswith(("--constraint",
                                                                      "--reservation"))]


@pytest.mark.parametrize(("tres", "gpus"), [
    ("TresPerJob=gres:gpu:24", "--gpus-per-node=8"),  # sbatch --gpus=24 on 3 nodes
    ("TresPerJob=gres:gpu:a100:16", "--gpus-per-node=a100:6"),  # rounded up
    ("TresPerTask=gres:gpu:2", "--gpus-per-node=2"),  # --gpus-per-task (one agent task)
    ("TresPerJob=gres/gpu:3", "--gpus-per-node=1"),  # Slurm 23.02+ spelling
])
def test_a_companion_of_a_job_asking_gpus_per_job_or_task_gets_them_per_node(
        tres: str, gpus: str) -> None:
    """sbatch --gpus/--gpus-per-task leave TresPerNode unset: the companion must still ask for
    the GPUs its agent's workers use (it asked for none, and its workers had no GPU)."""
    line = JOB_LINE.replace("TresPerNode=gres:gpu:8", tres)
    options = companion_options(parse_oneline(line), "42", "train", "spot", "USR2@120")
    assert gpus in options
    assert not [o for o in options if o.startswith("--gres")]
    assert "--gres=gpu:8" in companion_options(parse_oneline(JOB_LINE), "42", "train", "spot",
                                               "USR2@120")
    assert not [o for o in companion_options(parse_oneline(JOB_LINE), "42", "train", "spot",
                                             "USR2@120") if o.startswith("--gpus")]


def test_companion_script_joins_the_jobs_rendezvous(tmp_path: Path) -> None:
    script = companion_script(AGENT, "42-1", "/ck/u/42", "42")
    srun = script.splitlines()[-1]
    assert srun.startswith("srun --nodes=1 --ntasks=1 ")
    assert ("--join-timeout=30 --rdzv-run-id=42-1 --checkpoint-dir=/ck/u/42 -- "
            "/home/u/train.py --steps 100") in srun
    check = subprocess.run(["bash", "-n"], input=script, text=True, capture_output=True,
                           timeout=30)
    assert check.returncode == 0, check.stderr
    with pytest.raises(ValueError, match="'--'"):
        companion_script(AGENT[:7], "42-1", None, "42")
    args = elastic_torchrun_args({"SLURM_JOB_ID": "77"},
                                 ElasticSettings(2, 3, "ctl:1", run_id="42-1"), "10.0.0.9", 1,
                                 ["t.py"])
    assert "--rdzv-id=42-1" in args  # not the companion's own 77-0


def test_only_this_jobs_companions_are_left_overs() -> None:
    lines = ("101|slurm-spot replacement for job 42\n102|slurm-spot replacement for job 420\n"
             "103|(null)\n104|slurm-spot replacement for job 42\n")
    assert leftovers(lines, "42") == ["101", "104"]


def _sleepers(count: int) -> list[subprocess.Popen[bytes]]:
    return [subprocess.Popen(["sleep", "300"]) for _ in range(count)]


def test_supervisor_replaces_each_lost_agent_once_and_cancels_at_stop() -> None:
    """Real processes stand for the agents' sruns; an in-memory queue for Slurm."""
    agents = _sleepers(3)
    queue: dict[str, str] = {}
    said: list[str] = []

    def submit() -> str:
        job = str(100 + len(queue))
        queue[job] = "PENDING"
        return job

    def cancel(jobs: list[str]) -> None:
        for job in jobs:
            queue[job] = "CANCELLED"

    sup = Supervisor(3, 3, [p.pid for p in agents], submit,
                     lambda j: queue[j] in ("PENDING", "RUNNING"), cancel, said.append)
    try:
        assert sup.step(0) == 0 and not queue  # all running: nothing requested
        agents[2].kill()
        agents[2].wait()
        assert sup.step(1) == 1 and queue == {"100": "PENDING"}
        assert sup.step(2) == 0  # pending counts toward the target
        queue["100"] = "RUNNING"
        assert sup.step(3) == 0
        queue["100"] = "NODE_FAIL"  # the replacement's node was lost too
        assert sup.step(4) == 1 and queue["101"] == "PENDING"
        agents[1].kill()
        agents[1].wait()
        assert sup.step(5) == 1 and len([s for s in queue.values() if s == "PENDING"]) == 2
        sup.stop()
        assert queue == {"100": "NODE_FAIL", "101": "CANCELLED", "102": "CANCELLED"}
        assert any("cancelled replacement job(s) 101,102" in line for line in said)
    finally:
        for proc in agents:
            proc.kill()
            proc.wait()


def test_supervisor_retries_a_refused_sbatch_later() -> None:
    agents = _sleepers(1)
    calls: list[float] = []

    def refuse() -> str:
        calls.append(1)
        raise RuntimeError("sbatch: error: Batch job submission failed")

    said: list[str] = []
    sup = Supervisor(2, 3, [agents[0].pid], refuse, lambda j: True, lambda j: None, said.append)
    try:
        assert sup.step(0) == 0 and sup.step(10) == 0 and len(calls) == 1
        assert "retrying in 30 s" in said[0] and "submission failed" in said[0]
        sup.step(31)
        assert len(calls) == 2
    finally:
        agents[0].kill()
        agents[0].wait()


def _fake_slurm(tmp_path: Path) -> Path:
    """Stand-ins for sbatch/scontrol/squeue/scancel that keep a little queue in files."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    state = tmp_path / "state"
    state.mkdir()
    scripts = {
        "sbatch": f"""n=$(ls {state} | grep -c '^job') ; id=$((500 + n))
printf '%s\\n' "$@" > {state}/job$id.argv ; cp "${{@: -1}}" {state}/job$id.sh
echo RUNNING > {state}/job$id ; echo $id""",
        "scontrol": f"""if [ "$4" = 42 ]; then echo "{JOB_LINE}"; exit 0; fi
[ -f {state}/job$4 ] || {{ echo 'Invalid job id specified' >&2; exit 1; }}
echo "JobId=$4 JobName=r UserId=u(1000) GroupId=u(1000) MCS_label=N/A JobState=$(cat {state}/job$4)" """,
        "squeue": "echo '400|slurm-spot replacement for job 42'; echo '401|(null)'",
        "scancel": f"""for j in "$@"; do echo "$j" >> {state}/cancelled
[ -f {state}/job$j ] && echo CANCELLED > {state}/job$j; done; exit 0""",
    }
    for name, body in scripts.items():
        (bin_dir / name).write_text("#!/bin/bash\n" + body + "\n")
        (bin_dir / name).chmod(0o755)
    return state


def test_supervisor_process_requests_a_companion_and_cancels_it_on_sigterm(
        tmp_path: Path) -> None:
    """The CLI the batch script runs: cancels a left-over companion of an earlier run, requests
    one companion when an agent ends, and cancels it when the batch script stops it."""
    state = _fake_slurm(tmp_path)
    agents = _sleepers(3)
    env = {**os.environ, "SLURM_SPOT_SLURM_BIN_DIR": str(tmp_path / "bin"),
           "SLURM_JOB_ID": "42", "SLURM_RESTART_COUNT": "1", "SLURM_JOB_NAME": "train",
           "SLURM_JOB_PARTITION": "spot", "SLURM_SPOT_CHECKPOINT_DIR": "/ck/u/42"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "slurm_spot.jobs.injob.elastic_replacement", "--target=3", "--max=3",
         f"--pids={' '.join(str(p.pid) for p in agents)}", "--signal=USR2@120",
         "--interval=0.2", "--", *AGENT], env=env, stdout=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 30
        while not (state / "cancelled").exists() and time.monotonic() < deadline:
            time.sleep(0.1)
        assert (state / "cancelled").read_text().split() == ["400"]  # the earlier run's
        time.sleep(1)
        assert not list(state.glob("job*.sh"))  # all agents run: nothing requested
        agents[0].kill()
        agents[0].wait()
        while not (state / "job500").exists() and time.monotonic() < deadline:
            time.sleep(0.1)
        time.sleep(1)
        assert [p.name for p in state.glob("job*.sh")] == ["job500.sh"]  # one, not more
        argv = (state / "job500.argv").read_text().splitlines()
        assert "--job-name=train+replacement" in argv and "--no-requeue" in argv
        assert "--rdzv-run-id=42-1 --checkpoint-dir=/ck/u/42 --" in (
            state / "job500.sh").read_text()
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=30)
        assert proc.returncode == 0
        assert (state / "cancelled").read_text().split() == ["400", "500"]
        assert "replacement job 500 requested" in out
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        for agent in agents:
            agent.kill()
            agent.wait()


def test_supervisor_waits_to_read_the_job_before_sizing_a_companion(tmp_path: Path) -> None:
    """slurmctld not answering ``scontrol show job`` when the supervisor starts (a busy
    controller): the companion must still ask for the job's GPUs, memory and time limit, not
    go out bare (it went out without --gres, so its workers had no GPU)."""
    state = _fake_slurm(tmp_path)
    scontrol = tmp_path / "bin" / "scontrol"
    scontrol.write_text(  # job 42 unreadable for its first 3 reads
        f"#!/bin/bash\nif [ \"$4\" = 42 ]; then echo x >> {state}/reads\n"
        f"  [ $(wc -l < {state}/reads) -le 3 ] && {{ echo 'Socket timed out' >&2; exit 1; }}\n"
        "fi\n"
        + scontrol.read_text().split("\n", 1)[1])
    agents = _sleepers(2)
    agents[0].kill()
    agents[0].wait()
    env = {**os.environ, "SLURM_SPOT_SLURM_BIN_DIR": str(tmp_path / "bin"),
           "SLURM_JOB_ID": "42", "SLURM_RESTART_COUNT": "0", "SLURM_JOB_NAME": "train",
           "SLURM_JOB_PARTITION": "spot"}
    main_code = ("import sys\nimport slurm_spot.jobs.injob.elastic_replacement as r\n"
                 "orig = r.Supervisor.step\n"
                 "def step(self, now): self.retry_at = min(self.retry_at, now); "
                 "return orig(self, now)\n"  # no 30 s pause between retries here
                 "r.Supervisor.step = step\nsys.exit(r.main())\n")
    proc = subprocess.Popen(
        [sys.executable, "-c", main_code, "--target=2", "--max=2",
         f"--pids={agents[0].pid} {agents[1].pid}", "--signal=USR2@120", "--interval=0.2",
         "--", *AGENT], env=env, stdout=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 30
        while not (state / "job500.argv").exists() and time.monotonic() < deadline:
            time.sleep(0.1)
        time.sleep(0.5)
        argv = (state / "job500.argv").read_text().splitlines()
        assert "--gres=gpu:8" in argv and "--mem=16G" in argv and "--time=02:00:00" in argv
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=30)
        assert "cannot read job 42" in out and "Socket timed out" in out
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        agents[1].kill()
        agents[1].wait()


def _config(tmp_path: Path) -> Path:
    config = tmp_path / "spot.yaml"
    config.write_text(yaml.safe_dump({
        "cluster": "c", "node_sets": [{"name": "spot", "provider": "local", "count": 3}],
        "partitions": [{"name": "spot", "node_sets": ["spot"]}],
        "preemption": {"signal": "SIGUSR2", "lead_s": 120}}))
    return config


@pytest.mark.parametrize("replacements", [True, False])
def test_dry_run_starts_the_supervisor_unless_no_replacements(tmp_path: Path,
                                                              replacements: bool) -> None:
    train = tmp_path / "train.py"
    train.write_text("print('hi')\n")
    result = CliRunner().invoke(cli, [
        "--config", str(_config(tmp_path)), "sbatch", "--torchrun", "--elastic", "2:3",
        "--rendezvous", "ctl:29390", *([] if replacements else ["--no-replacements"]),
        "--dry-run", "--json", str(train)])
    assert result.exit_code == 0, result.output
    script = read_envelope(result.output)["script"]
    supervisor = "-m slurm_spot.jobs.injob.elastic_replacement --target=\"${agents}\" --max=3"
    assert (supervisor in script) is replacements
    assert ("--pids=\"${pids[*]}\" --signal=USR2@120" in script) is replacements
    assert ("trap " in script) is replacements
    assert '"${agent[@]}" &' in script
    check = subprocess.run(["bash", "-n"], input=script, text=True, capture_output=True,
                           timeout=30)
    assert check.returncode == 0, check.stderr


def test_no_replacements_needs_elastic(tmp_path: Path) -> None:
    train = tmp_path / "train.py"
    train.write_text("print('hi')\n")
    result = CliRunner().invoke(cli, ["--config", str(_config(tmp_path)), "sbatch",
                                      "--torchrun", "--no-replacements", "--dry-run",
                                      str(train)])
    assert result.exit_code == 2 and "--no-replacements is for elastic jobs" in result.output


def test_a_replacement_agent_leaves_with_0_when_the_run_is_over(tmp_path: Path) -> None:
    """A real torchrun agent given --rdzv-run-id of a run whose rendezvous is closed (training
    finished before the replacement started) exits 0 at once: its job ends, nothing requeued."""
    with rendezvous_service(os.environ, fake_owner=True) as endpoint:
        close = (
            "from torch.distributed.elastic.rendezvous import RendezvousParameters\n"
            "from slurm_spot.jobs.injob.rendezvous_client import register_backend\n"
            "register_backend()\n"
            "from torch.distributed.elastic.rendezvous.registry import "
            "get_rendezvous_handler\n"
            f"p = RendezvousParameters('slurm-spot', '{endpoint}', '9-0', 2, 3, "
            "is_host='false')\n"
            "get_rendezvous_handler(p).set_closed()\n")
        closed = subprocess.run([sys.executable, "-c", close], capture_output=True, text=True,
                                timeout=120)
        assert closed.returncode == 0, closed.stderr[-2000:]
        train = tmp_path / "train.py"
        train.write_text("raise SystemExit('never started')\n")
        code = (
            "import os, sys\n"
            "from slurm_spot.jobs.injob import torchrun_agent as a\n"
            "os.environ.update(a.ELASTIC_ENV)\n"
            f"s = a.ElasticSettings(2, 3, '{endpoint}', join_timeout_s=60, "
            "run_id='9-0')\n"
            f"args = a.elastic_torchrun_args(os.environ, s, '127.0.0.1', 1, [{str(train)!r}])\n"
            "sys.exit(a.run_torchrun(args, 85, elastic=True, joining=True))\n")
        start = time.monotonic()
        proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                              timeout=180, env={**os.environ, "SLURM_JOB_ID": "77"})
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "rendezvous is closed" in proc.stderr
    assert time.monotonic() - start < 60  # not after the join timeout
