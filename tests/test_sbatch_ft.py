"""``slurm-spot sbatch --torchrun --fault-tolerant N`` (slurm_spot/jobs/submit/ft_scripts.py):
the jobs it plans, the option errors (exit 2, naming the option), and its two batch scripts run
by bash against stand-ins for Slurm's commands (the cluster itself: tests/test_demo_ft_e2e.py)."""

from __future__ import annotations

import os
import stat
import subprocess
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from slurm_spot.cli import cli
from slurm_spot.contract import jobenv
from slurm_spot.jobs.submit.ft_scripts import LIGHTHOUSE_PORT_BASE, LIGHTHOUSE_PORT_TRIES
from slurm_spot.jsonenvelope import read_envelope


def _config(tmp_path: Path) -> Path:
    path = tmp_path / "spot.yaml"
    path.write_text(yaml.safe_dump({
        "cluster": "c", "slurm_bin_dir": str(tmp_path / "no-slurm"),
        "node_sets": [{"name": "spot", "provider": "local", "count": 3},
                      {"name": "od", "provider": "local", "count": 1, "market": "on-demand"}],
        "partitions": [{"name": "spot", "node_sets": ["spot"]},
                       {"name": "ondemand", "node_sets": ["od"]}],
        "preemption": {"signal": "USR2", "lead_s": 60}}))
    return path


def _sbatch(tmp_path: Path, *words: str) -> tuple[int, str]:
    train = tmp_path / "train_ft.py"
    train.write_text("print('hi')\n")
    result = CliRunner().invoke(cli, ["--config", str(_config(tmp_path)), "sbatch", *words,
                                      str(train), "--steps", "9"])
    return result.exit_code, result.output


def _plan(tmp_path: Path, *words: str) -> dict:
    code, output = _sbatch(tmp_path, "--torchrun", "--fault-tolerant", "3",
                           "--coordinator-partition", "ondemand", "--dry-run", "--json", *words)
    assert code == 0, output
    return dict(read_envelope(output))


def test_one_lighthouse_job_on_demand_and_one_requeueable_job_per_group(tmp_path: Path) -> None:
    plan = _plan(tmp_path, "-p", "spot", "--gres=gpu:1", "-J", "big", "-t", "60")
    lighthouse, *groups = plan["jobs"]
    assert lighthouse["role"] == "lighthouse"
    argv = lighthouse["argv"]
    assert "--partition=ondemand" in argv and "--job-name=big-lighthouse" in argv
    assert "-t" in argv and "--gres=gpu:1" not in argv and "spot" not in argv
    text = lighthouse["script"]
    assert "lighthouse --listen \"${addr}\" --port \"${port}\"" in text
    assert '--job "${SLURM_JOB_ID}"' in text and "--unauthenticated" not in text
    assert "0.0.0.0" not in text
    assert f"port=$(( {LIGHTHOUSE_PORT_BASE} + SLURM_JOB_ID % 1000 ))" in text
    assert [g["role"] for g in groups] == ["group g0", "group g1", "group g2"]
    for index, group in enumerate(groups):
        argv = group["argv"]
        assert "--partition=spot" in argv and "--gres=gpu:1" in argv and "-t" in argv
        assert f"--job-name=big-g{index}" in argv
        assert not [w for w in argv if w.startswith("--dependency")]  # both boot at once
        assert (f"--export=ALL,REPLICA_GROUP_ID=g{index},"
                "SLURM_SPOT_FT_LIGHTHOUSE_JOB=<lighthouse job id>") in argv
        script = group["script"]
        assert "#SBATCH --requeue" in script and "#SBATCH --signal=USR2@60" in script
        assert "--steps 9" in script and "srun --nodes=1 --ntasks=1" in script
        assert "ELASTIC" not in script.upper().replace("NOT ELASTIC", "")  # requeued, not released


def test_a_users_dependency_goes_to_every_job(tmp_path: Path) -> None:
    plan = _plan(tmp_path, "-p", "spot", "--dependency=afterok:7")
    for job in plan["jobs"]:
        assert "--dependency=afterok:7" in job["argv"]


@pytest.mark.parametrize(("words", "message"), [
    (["--fault-tolerant", "3", "--coordinator-partition", "ondemand"],
     "--fault-tolerant needs --torchrun"),
    (["--torchrun", "--fault-tolerant", "3"], "--fault-tolerant needs --coordinator-partition P"),
    (["--torchrun", "--fault-tolerant", "0", "--coordinator-partition", "ondemand"],
     "--fault-tolerant=0: expected the number of replica groups, 1..64"),
    (["--torchrun", "--fault-tolerant", "x", "--coordinator-partition", "ondemand"],
     "--fault-tolerant=x: expected the number of replica groups"),
    (["--torchrun", "--fault-tolerant", "2", "--elastic", "2:3", "--coordinator-partition",
      "ondemand"], "--fault-tolerant and --elastic: give one"),
    (["--torchrun", "--fault-tolerant", "2", "--coordinator-partition", "ondemand", "-N", "2"],
     "-N/--nodes 2 with --fault-tolerant: each replica group is a one-node job"),
    (["--torchrun", "--fault-tolerant", "2", "--coordinator-partition", "ondemand",
      "--nproc-per-node", "2"], "--nproc-per-node=2 with --fault-tolerant"),
    (["--torchrun", "--fault-tolerant", "2", "--coordinator-partition", "ondemand",
      "--export=NONE"], "--export without ALL with --fault-tolerant"),
    (["--torchrun", "--fault-tolerant", "2", "--coordinator-partition", "spot", "-p", "spot"],
     "--coordinator-partition=spot is also the groups' partition (-p)"),
    (["--torchrun", "--fault-tolerant", "2", "--coordinator-partition", "on demand"],
     "--coordinator-partition='on demand': not a partition name"),
    # The lighthouse on a partition spot.yaml says is spot: a reclaim would take it.
    (["--torchrun", "--fault-tolerant", "2", "--coordinator-partition", "spot"],
     "--coordinator-partition=spot: its node sets (spot) are spot in"),
    # An array would start a lighthouse per task (on ports its groups do not look at) and
    # groups of the same name.
    (["--torchrun", "--fault-tolerant", "2", "--coordinator-partition", "ondemand", "-p", "spot",
      "--array=0-3"], "--array=0-3 with --fault-tolerant"),
    (["--torchrun", "--fault-tolerant", "2", "--coordinator-partition", "ondemand", "-a", "1"],
     "--array=1 with --fault-tolerant"),
    # A group's step runs one process: more tasks would only hold the node's CPUs.
    (["--torchrun", "--fault-tolerant", "2", "--coordinator-partition", "ondemand", "-n", "4"],
     "--ntasks=4 with --fault-tolerant"),
    (["--torchrun", "--fault-tolerant", "2", "--coordinator-partition", "ondemand",
      "--ntasks-per-node=2"], "--ntasks-per-node=2 with --fault-tolerant"),
])
def test_bad_input_exits_2_naming_the_option(tmp_path: Path, words: list[str],
                                            message: str) -> None:
    code, output = _sbatch(tmp_path, "--dry-run", *words)
    assert code == 2, output
    assert message in output


def test_a_users_export_list_reaches_each_group_once(tmp_path: Path) -> None:
    """``--export=ALL,FOO=1`` (sbatch(1): ALL first, then variables): each group's one
    --export has ALL once, its own two variables and the user's FOO=1."""
    plan = _plan(tmp_path, "-p", "spot", "--export=ALL,FOO=1", "--export", "BAR=2,ALL")
    for job in plan["jobs"][1:]:
        [export] = [w for w in job["argv"] if w.startswith("--export")]
        items = export.split("=", 1)[1].split(",")
        assert items.count("ALL") == 1 and items[0] == "ALL", export
        assert "FOO=1" in items and "BAR=2" in items, export


def test_an_empty_job_name_is_the_default_name(tmp_path: Path) -> None:
    """``-J ''`` would have named the jobs ``-lighthouse`` and ``-g0`` in squeue."""
    plan = _plan(tmp_path, "-p", "spot", "-J", "")
    names = [w for job in plan["jobs"] for w in job["argv"] if w.startswith("--job-name=")]
    assert names == ["--job-name=train_ft.py-lighthouse", "--job-name=train_ft.py-g0",
                     "--job-name=train_ft.py-g1", "--job-name=train_ft.py-g2"]


def _stand_ins(folder: Path, commands: dict[str, str]) -> dict[str, str]:
    """Shell scripts named after Slurm's commands in ``folder``, first on PATH."""
    folder.mkdir()
    for name, body in commands.items():
        path = folder / name
        path.write_text("#!/bin/bash\n" + body)
        path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return {**os.environ, "PATH": f"{folder}:{os.environ['PATH']}"}


def test_a_group_script_finds_its_lighthouse_and_exits_85_for_requeue(tmp_path: Path) -> None:
    """The group's script, run by bash: the lighthouse's URL from its job's node and id, this
    node's address, the shared checkpoint key; the training's exit 85 is the script's."""
    group = _plan(tmp_path, "-p", "spot")["jobs"][1]["script"].replace("seq 300", "seq 2")
    env = _stand_ins(tmp_path / "bin", {
        "squeue": 'case "$*" in *%T*) echo RUNNING ;; *%N*) echo coord-1 ;; esac\n',
        "scontrol": 'case "$*" in *coord-1*) echo "NodeName=coord-1 NodeAddr=10.0.0.9 X=1" ;;'
                    ' *) echo "NodeName=spot-2 NodeAddr=10.0.0.22 X=1" ;; esac\n',
        "srun": f'env | grep -E "^(TORCHFT|SLURM_SPOT_FT)" | sort > {tmp_path}/env\n'
                f'echo "$@" > {tmp_path}/argv\nexit 85\n'})
    env.update({"SLURM_SPOT_FT_LIGHTHOUSE_JOB": "1234", "REPLICA_GROUP_ID": "g1",
                "SLURM_JOB_ID": "1240", "SLURMD_NODENAME": "spot-2"})
    proc = subprocess.run(["bash", "-c", group], env=env, capture_output=True, text=True,
                          timeout=60, check=False)
    assert proc.returncode == 85, proc.stdout + proc.stderr
    assert "exiting 85 for requeue" in proc.stdout
    assert (tmp_path / "env").read_text().splitlines() == [
        "SLURM_SPOT_FT_CHECKPOINT_KEY=1234", "SLURM_SPOT_FT_HOST=10.0.0.22",
        "SLURM_SPOT_FT_LIGHTHOUSE_JOB=1234"]
    # the training runs under the relay to the lighthouse's authenticated front door, which
    # sets TORCHFT_LIGHTHOUSE for it
    argv = (tmp_path / "argv").read_text().split()
    relay = argv.index("lighthouse-relay")
    # the relay looks for the front door at the lighthouse's first port and the next ones
    # (another job's lighthouse may hold the first on that node), for up to 120 s
    assert argv[relay + 1:relay + 10] == [
        "--lighthouse", f"10.0.0.9:{LIGHTHOUSE_PORT_BASE + 234}",
        "--port-tries", str(LIGHTHOUSE_PORT_TRIES), "--wait", "120", "--job", "1234", "--"]
    assert argv[-2:] == ["--steps", "9"]


def test_a_group_whose_lighthouse_is_gone_exits_1(tmp_path: Path) -> None:
    group = _plan(tmp_path, "-p", "spot")["jobs"][1]["script"].replace("seq 300", "seq 2")
    env = _stand_ins(tmp_path / "bin", {"squeue": "exit 1\n", "scontrol": "exit 0\n",
                                        "srun": "exit 0\n"})
    env.update({"SLURM_SPOT_FT_LIGHTHOUSE_JOB": "1234", "SLURMD_NODENAME": "spot-2",
                "SLURM_JOB_ID": "1240"})
    proc = subprocess.run(["bash", "-c", group], env=env, capture_output=True, text=True,
                          timeout=60, check=False)
    assert proc.returncode == 1
    assert "the lighthouse job 1234 is not running" in proc.stdout


def test_the_lighthouse_script_stops_once_its_groups_are_gone(tmp_path: Path) -> None:
    """Bound to its node's NodeAddr; once no group of its Comment is queued it stops the
    lighthouse and ends 0 (a stand-in python prints its arguments and waits)."""
    text = _plan(tmp_path, "-p", "spot")["jobs"][0]["script"].replace("sleep 2", "sleep 0.2")
    python = tmp_path / "python"
    python.write_text(f'#!/bin/bash\necho "$@" > {tmp_path}/lighthouse-argv\n'
                      "trap 'exit 0' TERM\nwhile :; do sleep 0.1; done\n")
    python.chmod(0o755)
    text = text.replace(text.split(" -m slurm_spot lighthouse")[0].rsplit("\n", 1)[1],
                        str(python))
    env = _stand_ins(tmp_path / "bin", {
        "squeue": 'case "$*" in *%k*) echo slurm-spot-ft-groups:11,12 ;;'
                  f' *) cat {tmp_path}/queued 2>/dev/null ;; esac\n',
        "scontrol": 'echo "NodeName=coord-1 NodeAddr=10.0.0.9 X=1"\n'})
    env.update({"SLURM_JOB_ID": "1234", "SLURMD_NODENAME": "coord-1"})
    (tmp_path / "queued").write_text("11\n99\n")
    proc = subprocess.Popen(["bash", "-c", text], env=env, stdout=subprocess.PIPE, text=True)
    try:
        with pytest.raises(subprocess.TimeoutExpired):
            proc.wait(2)  # group 11 is still queued
        (tmp_path / "queued").write_text("99\n")
        assert proc.wait(20) == 0
    finally:
        proc.kill()
    assert "every replica group (11,12) ended" in (proc.stdout.read() if proc.stdout else "")
    argv = (tmp_path / "lighthouse-argv").read_text().split()
    assert argv[argv.index("--listen") + 1] == "10.0.0.9"
    assert argv[argv.index("--port") + 1] == str(LIGHTHOUSE_PORT_BASE + 234)
    # the first free of 8 ports: job 234's lighthouse may already hold 31634 on this node
    assert argv[argv.index("--port-tries") + 1] == str(LIGHTHOUSE_PORT_TRIES)
    assert argv[argv.index("--job") + 1] == "1234"  # only this job's owner gets in
    assert "--unauthenticated" not in argv


def test_groups_share_the_lighthouse_jobs_checkpoint_directory() -> None:
    env = {"SLURM_SPOT_CHECKPOINT_DIR": "/ck/alice/1240", "SLURM_SPOT_FT_CHECKPOINT_KEY": "1234"}
    assert jobenv.ft_checkpoint_dir(env) == Path("/ck/alice/1234")
    assert jobenv.ft_checkpoint_dir({**env, "SLURM_SPOT_CHECKPOINT_DIR": "s3://b/p/alice/1240"}) \
        == "s3://b/p/alice/1234"
    assert jobenv.ft_checkpoint_dir({"SLURM_SPOT_CHECKPOINT_DIR": "/ck/alice/1240"}) \
        == Path("/ck/alice/1240")
    with pytest.raises(jobenv.JobEnvError, match="SLURM_SPOT_FT_CHECKPOINT_KEY='x'"):
        jobenv.ft_checkpoint_dir({**env, "SLURM_SPOT_FT_CHECKPOINT_KEY": "x"})


def test_the_lighthouse_job_runs_with_the_timing_slurm_spot_lighthouse_defaults_to(
        tmp_path: Path) -> None:
    """The survivors' pause after a group leaves (notice) or dies (no notice) is the
    lighthouse's heartbeat timeout only while that is below its join timeout
    (slurm_spot/jobs/services/ft_lighthouse.py): the lighthouse job passes such a timing, the
    same as ``slurm-spot lighthouse``'s defaults and ``LighthouseTimeouts``'s, so a lighthouse
    started by hand (docs/ml-engineer.md) behaves like the job's."""
    import re

    from slurm_spot.commands.lighthouse import lighthouse_command
    from slurm_spot.jobs.services.ft_lighthouse import LighthouseTimeouts

    text = _plan(tmp_path, "-p", "spot")["jobs"][0]["script"]
    found = re.search(r"--join-timeout-ms (\d+) --heartbeat-timeout-ms (\d+)", text)
    assert found, text
    join, heartbeat = int(found[1]), int(found[2])
    assert heartbeat < join
    defaults = LighthouseTimeouts()
    assert (defaults.join_timeout_ms, defaults.heartbeat_timeout_ms) == (join, heartbeat)
    options = {p.name: p.default for p in lighthouse_command.params}
    assert (options["join_timeout_ms"], options["heartbeat_timeout_ms"]) == (join, heartbeat)


def test_ctrl_c_between_two_submissions_cancels_what_was_submitted(tmp_path: Path) -> None:
    """Interrupted (SIGINT) while submitting its third job, slurm-spot sbatch cancels the
    lighthouse job and the group already submitted: the lighthouse job had no groups named
    in its Comment yet, so it would have held its on-demand node until its time limit."""
    import signal
    import sys

    bin_dir = tmp_path / "no-slurm"
    bin_dir.mkdir()
    calls = tmp_path / "calls"
    scripts = {
        "sbatch": f"""#!/bin/bash
[ "$1" = --version ] && {{ echo "slurm 24.11.5"; exit 0; }}
n=$(( $(cat {tmp_path}/count 2>/dev/null || echo 100) + 1 )); echo $n > {tmp_path}/count
echo "sbatch $n" >> {calls}
if [ "$n" -eq 103 ]; then kill -INT $PPID; sleep 5; fi
echo "Submitted batch job $n"
""",
        "scontrol": f"""#!/bin/bash
echo "scontrol $*" >> {calls}
case "$*" in *"show partition"*) echo "PartitionName=ondemand State=UP" ;; esac
""",
        "scancel": f"#!/bin/bash\necho \"scancel $*\" >> {calls}\n",
    }
    for name, body in scripts.items():
        (bin_dir / name).write_text(body)
        (bin_dir / name).chmod(0o755)
    train = tmp_path / "train_ft.py"
    train.write_text("print('hi')\n")
    done = subprocess.run(
        [sys.executable, "-m", "slurm_spot", "--config", str(_config(tmp_path)), "sbatch",
         "--torchrun", "--fault-tolerant", "3", "--coordinator-partition", "ondemand", "-p",
         "spot", str(train)], capture_output=True, text=True, timeout=120,
        # SIGINT at its default, as a terminal's Ctrl-C finds it: a test run started in the
        # background of a non-interactive shell (CI) hands it down ignored
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    assert done.returncode != 0 and "Traceback" not in done.stderr, done.stderr
    lines = calls.read_text().splitlines()
    assert "sbatch 103" in lines and "scancel 101 102" in lines, lines
    assert not [line for line in lines if "Comment=" in line]
