"""``slurm-spot sbatch --torchrun --elastic MIN:MAX --coordinator-partition P`` without a cluster:
the heterogeneous batch script, the sbatch command line, bad input, and the script run with
stand-ins for scontrol and srun (the rendezvous store it starts is the real one)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from slurm_spot.cli import cli
from slurm_spot.config import parse_config
from slurm_spot.contract.directives import read_directives
from slurm_spot.contract.names import ELASTIC_MARK
from slurm_spot.events import read_events
from slurm_spot.jobs.services.rendezvous import HETJOB_PORT_BASE
from slurm_spot.jobs.submit.sbatch import take_option
from slurm_spot.jsonenvelope import read_envelope
from slurm_spot.lifecycle.watch import Watcher, source_for
from slurm_spot.slurm.client import CommandResult, SlurmClient

#: A stand-in for scontrol: the partitions spot and coord exist; a node's address is 127.0.0.1;
#: ``show hostnames`` prints $NODES.
FAKE_SCONTROL = """#!/bin/bash
case "$*" in
  *"show partition coord"*) echo "PartitionName=coord Nodes=coord-1 State=UP" ;;
  *"show partition spot"*) echo "PartitionName=spot Nodes=spot-[1-3] State=UP" ;;
  *"show partition"*) echo "slurm_load_partitions: Invalid partition name specified" >&2; exit 1 ;;
  *"show node"*) echo "NodeName=$4 Arch=x86_64 NodeAddr=127.0.0.1 NodeHostName=$4 Port=1" ;;
  *"show hostnames"*) printf '%s\\n' $NODES ;;
  *) exit 1 ;;
esac
"""


def _setup(tmp_path: Path) -> tuple[Path, Path]:
    """A config whose slurm_bin_dir holds the scontrol stand-in, and a training script."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "scontrol").write_text(FAKE_SCONTROL)
    (bin_dir / "scontrol").chmod(0o755)
    config = tmp_path / "spot.yaml"
    config.write_text(yaml.safe_dump({
        "cluster": "c", "slurm_bin_dir": str(bin_dir),
        "node_sets": [{"name": "spot", "provider": "local", "count": 3},
                      {"name": "coord", "provider": "local", "count": 1,
                       "market": "on-demand"}],
        "partitions": [{"name": "spot", "node_sets": ["spot"]},
                       {"name": "coord", "node_sets": ["coord"]}],
        "preemption": {"signal": "SIGUSR2", "lead_s": 120}}))
    train = tmp_path / "train.py"
    train.write_text("print('hi')\n")
    return config, train


def _dry_run(tmp_path: Path, *words: str) -> dict:
    config, train = _setup(tmp_path)
    result = CliRunner().invoke(cli, ["--config", str(config), "sbatch", "--torchrun",
                                      *words, "--dry-run", "--json", str(train), "--lr", "1"])
    assert result.exit_code == 0, result.output
    return dict(read_envelope(result.output))


def _components(script: str) -> list[list[str]]:
    """The script's directives per component (split at ``hetjob``)."""
    parts: list[list[str]] = [[]]
    for option in read_directives(script).options():
        if option == "hetjob":
            parts.append([])
        else:
            parts[-1].append(option)
    return parts


def test_hetjob_puts_one_on_demand_coordinator_first_and_the_workers_second(
        tmp_path: Path) -> None:
    out = _dry_run(tmp_path, "--elastic", "2:3", "--coordinator-partition", "coord",
                   "-p", "spot", "-N", "3", "--time=10", "--join-timeout", "20")
    script = out["script"]
    assert ELASTIC_MARK in script  # the watcher releases a node instead of requeueing
    coordinator, workers = _components(script)
    assert "--partition=coord" in coordinator and "--nodes=1" in coordinator
    assert "--no-kill" in coordinator and "--requeue" in coordinator
    assert any(o.startswith("--signal=USR2@") for o in coordinator)
    assert workers == ["--partition=spot", "--no-kill", "--nodes=3"]
    # sbatch applies command-line options to every component: -p and -N moved into the
    # workers' component, the others stay on the command line.
    assert "-p" not in out["argv"] and "-N" not in out["argv"] and "--time=10" in out["argv"]
    assert 'srun --het-group=1 --nodes=1 --ntasks=1 --nodelist="${node}"' in script
    assert '--rendezvous="${rdzv_endpoint}"' in script and "--join-timeout=20" in script
    assert f"rdzv_port=$(( {HETJOB_PORT_BASE} + SLURM_JOB_ID % 1000 ))" in script
    assert "-m slurm_spot rendezvous --listen" in script
    check = subprocess.run(["bash", "-n"], input=script, text=True, capture_output=True,
                           timeout=30)
    assert check.returncode == 0, check.stderr


@pytest.mark.parametrize("words", [["-Hp", "spot", "-HN3"], ["-Hpspot", "-HN", "3"]])
def test_partition_and_nodes_inside_clustered_short_options_go_to_the_workers(
        tmp_path: Path, words: list[str]) -> None:
    """getopt reads ``-Hp spot`` as ``-H -p spot``: left on the command line, sbatch put the
    coordinator on the spot partition (and ``-HN3`` gave it 3 nodes)."""
    out = _dry_run(tmp_path, "--elastic", "2:3", "--coordinator-partition", "coord", *words)
    coordinator, workers = _components(out["script"])
    assert "--partition=coord" in coordinator and "--nodes=1" in coordinator
    assert workers == ["--partition=spot", "--no-kill", "--nodes=3"]
    assert "-H" in out["argv"]  # the flag clustered with them still reaches sbatch
    assert not [w for w in out["argv"] if w.startswith(("-Hp", "-HN", "-p", "-N"))]
    assert "spot" not in out["argv"] and "3" not in out["argv"]


def test_what_each_worker_needs_goes_to_the_workers_not_the_coordinator(
        tmp_path: Path) -> None:
    """sbatch applies its command line to every component: ``--gres=gpu:8`` asked for GPUs on
    the on-demand coordinator too (which runs no worker), so the job could not start on a
    CPU-only on-demand partition."""
    out = _dry_run(tmp_path, "--elastic", "2:3", "--coordinator-partition", "coord",
                   "-p", "spot", "-H", "--gres=gpu:8", "-C", "a100&ib", "--mem", "64G",
                   "-c8", "--time=10", "--gpus-per-n=8")
    coordinator, workers = _components(out["script"])
    assert workers == ["--partition=spot", "--no-kill", "--nodes=2-3", "--gres=gpu:8",
                       "--gpus-per-node=8", "--constraint=a100&ib", "--cpus-per-task=8",
                       "--mem=64G"]
    assert not [o for o in coordinator if o.startswith(("--gres", "--gpus", "--mem", "-C",
                                                        "--constraint", "-c"))]
    assert out["argv"][1:] == ["-H", "--time=10", "<script>"]
    check = subprocess.run(["bash", "-n"], input=out["script"], text=True,
                           capture_output=True, timeout=30)
    assert check.returncode == 0, check.stderr


def test_hetjob_without_n_takes_min_to_max_workers_on_the_default_partition(
        tmp_path: Path) -> None:
    out = _dry_run(tmp_path, "--elastic", "2:4", "--coordinator-partition", "coord")
    assert _components(out["script"])[1] == ["--no-kill", "--nodes=2-4"]


@pytest.mark.parametrize(("words", "message"), [
    (["--elastic", "2:3", "--coordinator-partition", "coord", "--rendezvous", "ctl:1"],
     "--rendezvous and --coordinator-partition: give one"),
    (["--elastic", "2:3", "--coordinator-partition", "nope", "-p", "spot"],
     "--coordinator-partition=nope: Slurm has no such partition"),
    (["--elastic", "2:3", "--coordinator-partition", "spot", "-p", "spot"],
     "is also the workers' partition"),
    (["--elastic", "2:3", "--coordinator-partition", "co;rd"], "not a partition name"),
    (["--elastic", "2:3", "--coordinator-partition", "spot"],
     "--coordinator-partition=spot: its node sets (spot) are spot in"),
    (["--coordinator-partition", "coord"], "--coordinator-partition is for elastic jobs"),
    (["--elastic", "2:3", "--coordinator-partition", "coord", "-p", "spot", "-p", "gpu"],
     "-p/--partition given twice"),
])
def test_bad_coordinator_input_exits_2_naming_the_problem(tmp_path: Path, words: list[str],
                                                          message: str) -> None:
    config, train = _setup(tmp_path)
    result = CliRunner().invoke(cli, ["--config", str(config), "sbatch", "--torchrun", *words,
                                      "--dry-run", str(train)])
    assert result.exit_code == 2, result.output
    assert message in result.output


def test_take_option_reads_every_spelling() -> None:
    values, rest = take_option(["--part=a", "-pb", "--time", "5", "-p", "c", "--partition",
                                "d", "-H"], "--partition", "-p")
    assert values == ["a", "b", "c", "d"] and rest == ["--time", "5", "-H"]


def _free_job_id() -> int:
    """A job id whose rendezvous port (HETJOB_PORT_BASE + id % 1000) is free here now."""
    for job in range(1000 + os.getpid() % 1000, 3000):
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", HETJOB_PORT_BASE + job % 1000))
            except OSError:
                continue
            return job
    raise AssertionError("no free port")


def _run(tmp_path: Path, outcomes: dict[str, str], job: int) -> subprocess.CompletedProcess:
    """Run the hetjob script with the scontrol stand-in and an srun stand-in (``outcomes``:
    node -> what its agent does); the rendezvous store is the real service."""
    config, train = _setup(tmp_path)
    result = CliRunner().invoke(cli, ["--config", str(config), "sbatch", "--torchrun",
                                      "--elastic", "2:3", "--coordinator-partition", "coord",
                                      "--python", sys.executable, "--dry-run", "--json",
                                      str(train)])
    assert result.exit_code == 0, result.output
    script = read_envelope(result.output)["script"]
    cases = "\n".join(f"  --nodelist={node}) {what} ;;" for node, what in outcomes.items())
    (tmp_path / "bin" / "srun").write_text(
        "#!/bin/bash\nfor a in \"$@\"; do case \"$a\" in\n" + cases + "\nesac; done\nexit 3\n")
    (tmp_path / "bin" / "srun").chmod(0o755)
    env = {**os.environ, "PATH": f"{tmp_path / 'bin'}:{os.environ['PATH']}",
           "SLURM_JOB_ID": str(job), "SLURMD_NODENAME": "coord-1",
           "SLURM_JOB_NODELIST_HET_GROUP_1": "spot-[1-3]", "NODES": " ".join(outcomes),
           "TMPDIR": str(tmp_path)}
    return subprocess.run(["bash", "-c", script], env=env, capture_output=True, text=True,
                          timeout=180)


def test_hetjob_script_hosts_the_store_on_the_coordinator_and_stops_it(
        tmp_path: Path) -> None:
    job = _free_job_id()
    port = HETJOB_PORT_BASE + job % 1000
    # Each worker's "agent" checks that the store answers at the endpoint it was given.
    probe = (f"{sys.executable} -c \"import socket; socket.create_connection(('127.0.0.1', "
             f"{port}), 5).close()\" && exit 0 || exit 1")
    proc = _run(tmp_path, {"spot-1": probe, "spot-2": probe, "spot-3": probe}, job)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"rendezvous on the coordinator coord-1 at 127.0.0.1:{port}" in proc.stdout
    assert "elastic training finished" in proc.stdout
    with socket.socket() as s:  # the store ended with the script
        s.bind(("127.0.0.1", port))
    assert not list(tmp_path.glob("slurm-spot-rendezvous-*"))


def test_hetjob_script_falls_back_to_requeue_below_min(tmp_path: Path) -> None:
    proc = _run(tmp_path, {"spot-1": "exit 85", "spot-2": "exit 140", "spot-3": "exit 140"},
                _free_job_id())
    assert proc.returncode == 85, proc.stdout + proc.stderr
    assert "for requeue" in proc.stdout


def test_hetjob_script_fails_clearly_when_the_store_cannot_listen(tmp_path: Path) -> None:
    job = _free_job_id()
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", HETJOB_PORT_BASE + job % 1000))
        taken.listen(1)
        proc = _run(tmp_path, {"spot-1": "exit 0", "spot-2": "exit 0"}, job)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "the rendezvous store did not start on coord-1" in proc.stdout
    assert "cannot listen on 127.0.0.1" in proc.stdout  # the service's own message


class HetJobSlurm:
    """Slurm as the watcher on spot-3 sees a hetjob (leader 1 on coord-1, workers' component 2
    on spot-[1-3], BatchHost spot-1 as Slurm 22.05.8 prints it), until the watcher releases
    spot-3 from component 2."""

    def __init__(self) -> None:
        self.commands: list[str] = []
        self.released = False
        self.signalled = False

    def __call__(self, argv: list[str], timeout_s: float) -> CommandResult:
        tool, args = argv[0].rsplit("/", 1)[-1], argv[1:]
        self.commands.append(" ".join([tool, *args]))
        out = ""
        workers = "spot-[1-2]" if self.released else "spot-[1-3]"
        if tool == "scontrol" and args[:3] == ["-o", "show", "node"]:
            out = "NodeName=spot-3 State=MIXED+CLOUD+DRAIN Reason=x\n"
        elif tool == "scontrol" and args == ["-V"]:
            out = "slurm 22.05.8\n"
        elif tool == "squeue" and "--json" in args:
            out = json.dumps({"jobs": [{"job_id": 2, "job_state": "RUNNING"}]})
        elif tool == "squeue":
            out = "" if self.released else "2 N/A N/A spot-[1-3]\n"
        elif tool == "scontrol" and args[:3] == ["-o", "show", "job"]:
            out = (f"JobId={args[3]} HetJobId=1 HetJobOffset={int(args[3]) - 1} JobName=t "
                   "UserId=u(1000) GroupId=u(1000) MCS_label=N/A "
                   "JobState=RUNNING Restarts=0 BatchFlag=1 ExitCode=0:0 "
                   + ("NodeList=coord-1 BatchHost=coord-1\n" if args[3] == "1" else
                      f"NodeList={workers} BatchHost=spot-1\n"))
        elif tool == "scontrol" and args[:2] == ["write", "batch_script"]:
            # the leader's script; a component's own is a stub of its directives
            out = (f"#!/bin/bash\n{ELASTIC_MARK}\n" if args[2] == "1" else
                   "#!/bin/bash\n#SBATCH --no-kill --nodes=2-3\nexit 0\n")
        elif tool == "scontrol" and args[:3] == ["-o", "show", "step"]:
            here = "" if self.signalled else "StepId=2.3 NodeList=spot-3\n"
            out = "StepId=2.1 NodeList=spot-1\nStepId=2.2 NodeList=spot-2\n" + here
        elif tool == "scontrol" and args[:1] == ["listpids"]:
            out = "PID      JOBID    STEPID   LOCALID GLOBALID\n4242     2        3        0  0\n"
        elif tool == "scancel":
            self.signalled = True  # the agent there saves, leaves; its step ends
        elif tool == "scontrol" and args[:1] == ["update"] and args[1].startswith("JobId="):
            self.released = True
        return CommandResult(argv, 0, out, "")


def test_watcher_shrinks_the_workers_component_of_a_hetjob(tmp_path: Path) -> None:
    """The workers' component's own batch script is a stub: the watcher reads the leader's,
    signals the step on the node under notice, then releases the node from component 2 (not
    the leader), and nothing is requeued."""
    config = parse_config({
        "cluster": "c", "node_sets": [{"name": "spot", "provider": "local", "count": 3}],
        "partitions": [{"name": "spot", "node_sets": ["spot"]}],
        "preemption": {"prewarm": False},
        "state_dir": str(tmp_path / "state"), "log_dir": str(tmp_path / "log")})
    notices = config.state_dir / "local" / "notices"
    notices.mkdir(parents=True)
    deadline = datetime.now(timezone.utc) + timedelta(seconds=30)
    (notices / "spot-3.json").write_text(json.dumps({"action": "terminate",
                                                     "time": deadline.isoformat()}))
    slurm = HetJobSlurm()
    clock = [deadline.timestamp() - 30]
    watcher = Watcher(config, "spot-3", SlurmClient("/usr/bin", runner=slurm),
                      source_for(config, "spot-3"), clock=lambda: clock[0],
                      sleep=lambda s: clock.__setitem__(0, clock[0] + s))
    (tmp_path / "proc" / "4242").mkdir(parents=True)
    (tmp_path / "proc" / "4242" / "status").write_text(  # catches SIGUSR2
        "Name:\tpython\nSigIgn:\t0000000000000000\nSigCgt:\t0000000000000800\n")
    watcher.signaller.proc_root = tmp_path / "proc"
    outcome = watcher.run(once=True)
    assert outcome is not None and outcome.released == [2] and outcome.requeued == []
    assert "scancel -s USR2 2.3" in slurm.commands
    assert "scontrol update JobId=2 NodeList=spot-[1-2]" in slurm.commands
    assert not [c for c in slurm.commands if "requeue" in c or "StartTime=now" in c]
    assert [e["action"] for e in read_events(config.log_dir)] == [
        "notice", "signalled", "released", "powered_down"]
