"""Elastic training pieces that need no cluster: options, torchrun arguments, the data order,
the rendezvous service (a real TCPStore), and the batch script."""

from __future__ import annotations

import json
import os
import random
import signal
import socket
import subprocess
import sys
import threading
from datetime import timedelta
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from slurm_spot.checkpoint.elastic import (
    epoch_order,
    global_batch_indices,
    micro_batches,
    rank_share,
    steps_per_epoch,
)
from slurm_spot.cli import cli
from slurm_spot.contract.names import ELASTIC_MARK
from slurm_spot.errors import BadInputError
from slurm_spot.jobs.injob.torchrun_agent import ElasticSettings, elastic_torchrun_args, parse_nnodes
from slurm_spot.jobs.services.rendezvous import format_endpoint, parse_endpoint, serve
from slurm_spot.jsonenvelope import read_envelope
from tests.elastic_runs import rendezvous_service


def test_nnodes_and_endpoint_are_parsed_and_bad_ones_named() -> None:
    assert parse_nnodes("2:4") == (2, 4)
    assert parse_nnodes("3") == (3, 3)
    for bad in ("4:2", "0:2", "a:b", "2:", "-1:3"):
        with pytest.raises(BadInputError, match="--elastic"):
            parse_nnodes(bad)
    assert parse_endpoint("10.0.0.1:29500") == ("10.0.0.1", 29500)
    assert parse_endpoint("ctl") == ("ctl", 29390)
    assert parse_endpoint("ctl-1.example.org:5") == ("ctl-1.example.org", 5)
    assert parse_endpoint("[::1]:29500") == ("::1", 29500)
    assert parse_endpoint("[fe80::1]") == ("fe80::1", 29390)
    assert format_endpoint("::1", 5) == "[::1]:5" and format_endpoint("ctl", 5) == "ctl:5"
    for bad in (":1", "h:0", "h:99999", "h:x", "h;touch${IFS}/tmp/x:5", "h:1:2", "::1",
                "[::1]:", "[ctl]:5", "[::g]:5", "-h:5", "h_1:5", "a..b:5", "1.2.3.999:5",
                "h:\n5", "h\n:5", "h:\uff15", "x" * 64 + ":5", "[::1]:5:6"):
        with pytest.raises(BadInputError, match="--rendezvous") as caught:
            parse_endpoint(bad)
        assert repr(bad) in str(caught.value)


def test_elastic_torchrun_args_use_the_external_store_and_short_timeouts() -> None:
    env = {"SLURM_JOB_ID": "42", "SLURM_RESTART_COUNT": "1"}
    args = elastic_torchrun_args(env, ElasticSettings(2, 4, "ctl:29390", 30), "10.0.0.5", 1,
                                 ["train.py", "--x"])
    assert "--nnodes=2:4" in args and "--rdzv-endpoint=ctl:29390" in args
    assert "--rdzv-id=42-1" in args  # a requeued job forms a rendezvous of its own
    conf = next(a for a in args if a.startswith("--rdzv-conf="))
    assert "is_host=false" in conf and "join_timeout=30" in conf
    assert "last_call_timeout=2" in conf
    assert args[-2:] == ["train.py", "--x"]


def test_every_sample_once_per_epoch_whatever_the_world_sizes() -> None:
    samples, batch = 1797, 96
    per_epoch = steps_per_epoch(samples, batch)
    order = epoch_order(samples, epoch=3, seed=7)
    assert sorted(order) == list(range(samples))
    assert order == epoch_order(samples, epoch=3, seed=7) != epoch_order(samples, 4, 7)
    rng = random.Random(1)
    seen: list[int] = []
    for step in range(per_epoch):
        world = rng.choice([1, 2, 3, 5])  # the world changes between steps
        shares = [rank_share(global_batch_indices(order, step, batch), r, world)
                  for r in range(world)]
        assert max(map(len, shares)) - min(map(len, shares)) <= 1
        for share in shares:
            for part in micro_batches(share, 16):
                assert len(part) <= 16
                seen.extend(part)
    assert len(seen) == len(set(seen)) == per_epoch * batch
    assert set(seen) == set(order[:per_epoch * batch])
    with pytest.raises(IndexError):
        global_batch_indices(order, per_epoch, batch)
    with pytest.raises(ValueError):
        steps_per_epoch(10, 11)


def test_rendezvous_service_hosts_a_store_clients_share() -> None:
    from slurm_spot.jobs.injob.rendezvous_client import RendezvousStore

    class Slurm:  # every job is this user's
        def job_owner_uid(self, _job: str) -> int:
            return os.getuid()

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ready = threading.Event()
    stop = threading.Event()
    thread = threading.Thread(target=serve, args=("127.0.0.1", port, lambda _p: ready.set(),
                                                   stop), kwargs={"client": Slurm()},
                              daemon=True)
    thread.start()
    assert ready.wait(30)
    a = RendezvousStore("127.0.0.1", port, "42", timeout=timedelta(seconds=10))
    b = RendezvousStore("127.0.0.1", port, "42", timeout=timedelta(seconds=10))
    a.set("torch.rendezvous.42", "round-1")
    assert b.get("torch.rendezvous.42") == b"round-1"
    stop.set()
    thread.join(10)
    assert not thread.is_alive()


def test_rendezvous_command_refuses_a_taken_port_with_exit_2() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        proc = subprocess.run([sys.executable, "-m", "slurm_spot", "rendezvous", "--listen",
                               "127.0.0.1", "--port", str(port)], capture_output=True,
                              text=True, timeout=120)
    assert proc.returncode == 2, proc.stderr
    assert f"127.0.0.1:{port}" in proc.stderr


def _start_rendezvous(listen: str, port: int) -> subprocess.Popen[str]:
    store = subprocess.Popen([sys.executable, "-m", "slurm_spot", "rendezvous", "--listen",
                              listen, "--port", str(port)], stderr=subprocess.PIPE, text=True)
    assert store.stderr is not None
    seen = []
    for _ in range(20):  # a warning (torch, a loaded machine) may come before the line
        line = store.stderr.readline()
        seen.append(line)
        if "listening" in line or not line:
            break
    assert "listening" in seen[-1], "".join(seen)
    return store


def test_rendezvous_listens_only_on_the_address_given() -> None:
    """TCPStore(host, is_master=True) alone listens on every interface (ss: *:PORT)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    store = _start_rendezvous("127.0.0.1", port)
    try:
        ss = subprocess.run(["ss", "-Hltn", f"sport = :{port}"], capture_output=True,
                            text=True, timeout=30, check=True)
        listening = [line.split()[3] for line in ss.stdout.splitlines()]
        assert listening == [f"127.0.0.1:{port}"], ss.stdout
        with socket.create_connection(("127.0.0.1", port), timeout=10):
            pass  # reachable where told
        with socket.socket() as other, pytest.raises(ConnectionRefusedError):
            other.settimeout(10)
            other.connect(("127.0.0.2", port))  # another loopback address: nobody there
    finally:
        store.terminate()
        store.wait(30)


def test_rendezvous_stops_at_once_on_sigterm_whichever_thread_the_kernel_picks() -> None:
    """systemd stops the service with kill(2); the kernel hands a process-directed signal to any
    thread not blocking it. When that was the accept thread, the main thread slept on in its
    600 s wait and the service outlived the SIGTERM (1 start in 6 here; CI, stop 31)."""
    for attempt in range(12):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        store = _start_rendezvous("127.0.0.1", port)
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=10):
                pass  # a connection: the accept thread runs, then blocks in accept() again
            os.kill(store.pid, signal.SIGTERM)
            assert store.wait(10) == 0, f"start {attempt}: still running 10 s after SIGTERM"
        finally:
            store.kill()
            store.wait(30)


@pytest.mark.parametrize("listen", ["no-such-host.invalid", "192.0.2.1", "127.0.0.1;x"])
def test_rendezvous_refuses_an_address_it_cannot_listen_on_at_once(listen: str) -> None:
    proc = subprocess.run([sys.executable, "-m", "slurm_spot", "rendezvous", "--listen", listen,
                           "--port", "29390"], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2, proc.stderr
    assert f"cannot listen on {listen}:29390" in proc.stderr
    assert "Traceback" not in proc.stderr and len(proc.stderr.splitlines()) <= 3


def _config(tmp_path: Path) -> Path:
    config = tmp_path / "spot.yaml"
    config.write_text(yaml.safe_dump({
        "cluster": "c", "node_sets": [{"name": "spot", "provider": "local", "count": 3}],
        "partitions": [{"name": "spot", "node_sets": ["spot"]}],
        "preemption": {"signal": "SIGUSR2", "lead_s": 120}}))
    return config


def test_elastic_dry_run_one_step_per_node_no_kill(tmp_path: Path) -> None:
    train = tmp_path / "train.py"
    train.write_text("print('hi')\n")
    result = CliRunner().invoke(cli, [
        "--config", str(_config(tmp_path)), "sbatch", "--torchrun", "--elastic", "2:3",
        "--rendezvous", "10.1.2.3:29390", "--join-timeout", "20", "--dry-run", "--json",
        "-p", "spot", str(train), "--lr", "1"])
    assert result.exit_code == 0, result.output
    script = read_envelope(result.output)["script"]
    assert ELASTIC_MARK in script
    assert "#SBATCH --no-kill" in script and "#SBATCH --nodes=2-3" in script
    assert "#SBATCH --nodes=1" not in script and "#SBATCH --requeue" in script
    assert '--nodelist="${node}"' in script and " &\n" in script
    assert "--elastic=2:3 --rendezvous=10.1.2.3:29390" in script
    assert "--join-timeout=20" in script and f"{train} --lr 1" in script
    assert "--no-preload" not in script  # workers start warm by default
    check = subprocess.run(["bash", "-n"], input=script, text=True, capture_output=True,
                           timeout=30)
    assert check.returncode == 0, check.stderr


@pytest.mark.parametrize("hybrid", [False, True], ids=["controller", "coordinator"])
def test_no_preload_reaches_every_agent_and_replacement(tmp_path: Path, hybrid: bool) -> None:
    """``--no-preload`` goes into the agents' command (which the replacement companions copy),
    in the plain elastic and the hetjob batch script."""
    train = tmp_path / "train.py"
    train.write_text("print('hi')\n")
    where = (["--coordinator-partition", "ondemand"] if hybrid
             else ["--rendezvous", "10.1.2.3:29390"])
    config = _config(tmp_path)
    no_slurm = tmp_path / "no-slurm"  # no scontrol: the partition is not looked up
    no_slurm.mkdir()
    config.write_text(config.read_text() + f"slurm_bin_dir: {no_slurm}\n")
    result = CliRunner().invoke(cli, [
        "--config", str(config), "sbatch", "--torchrun", "--elastic", "2:3",
        *where, "--no-preload", "--dry-run", "--json", "-p", "spot", str(train)])
    assert result.exit_code == 0, result.output
    script = read_envelope(result.output)["script"]
    assert "--join-timeout=60 --no-preload -- \\\n" in script, script
    check = subprocess.run(["bash", "-n"], input=script, text=True, capture_output=True,
                           timeout=30)
    assert check.returncode == 0, check.stderr


@pytest.mark.parametrize(("words", "message"), [
    (["--elastic", "2:3"], "--elastic needs --torchrun"),
    (["--torchrun", "--elastic", "3:2"], "MIN <= MAX"),
    (["--torchrun", "--rendezvous", "h:1"], "--rendezvous is for elastic jobs"),
    (["--no-preload"], "--no-preload is for --torchrun jobs"),
    (["--torchrun", "--elastic", "2:3", "--rendezvous", "h:0"], "1..65535"),
    (["--torchrun", "--elastic", "2:3", "--join-timeout", "0"], "--join-timeout"),
    (["--torchrun", "--elastic", "2:3", "--rendezvous", "h;touch${IFS}/tmp/x:5"],
     "--rendezvous='h;touch${IFS}/tmp/x:5'"),
    (["--torchrun", "--elastic", "2:3", "--rendezvous", "::1"], "--rendezvous='::1'"),
    (["--torchrun", "--elastic", "2:4", "-N", "1"], "-N 1 is outside --elastic 2:4"),
    (["--torchrun", "--elastic", "2:4", "--nodes=3-5"], "3-5 is outside --elastic 2:4"),
    (["--torchrun", "--elastic", "2:4", "-N", "x"], "'x' with --elastic 2:4"),
    (["--torchrun", "--elastic", "2:4", "-HN", "5"], "-N 5 is outside --elastic 2:4"),
    (["--torchrun", "--elastic", "2:3", "--elastic", "1:2"], "--elastic given twice"),
    (["--torchrun", "--elastic", "1:99999999999999999999"], "MAX <= 100000"),
    (["--torchrun", "--python", "python3\ntouch /tmp/x"], "--python"),
    # str.isdigit() accepts superscripts that int() refuses: a traceback, not exit 2
    (["--torchrun", "--elastic", "2:3", "--join-timeout", "\u00b2"], "--join-timeout"),
    (["--torchrun", "--nproc-per-node", "\u00b2"], "--nproc-per-node"),
])
def test_bad_elastic_options_exit_2_naming_the_option(tmp_path: Path, words: list[str],
                                                      message: str) -> None:
    train = tmp_path / "train.py"
    train.write_text("print('hi')\n")
    result = CliRunner().invoke(cli, ["--config", str(_config(tmp_path)), "sbatch", *words,
                                      "--dry-run", str(train)])
    assert result.exit_code == 2
    assert message in result.output


def test_no_scontrol_to_find_the_controller_asks_for_rendezvous(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Off the cluster (no scontrol in slurm_bin_dir) an elastic --dry-run without --rendezvous
    is a usage error naming --rendezvous (it was exit 1, "cannot run .../scontrol")."""
    monkeypatch.delenv("SLURM_SPOT_RENDEZVOUS", raising=False)
    config = _config(tmp_path)
    config.write_text(config.read_text() + f"slurm_bin_dir: {tmp_path / 'no-slurm'}\n")
    train = tmp_path / "train.py"
    train.write_text("print('hi')\n")
    result = CliRunner().invoke(cli, ["--config", str(config), "sbatch", "--torchrun",
                                      "--elastic", "2:3", "--dry-run", str(train)])
    assert result.exit_code == 2, result.output
    assert "give --rendezvous HOST:PORT" in result.output
    result = CliRunner().invoke(cli, ["--config", str(config), "sbatch", "--torchrun",
                                      "--elastic", "2:3", "--rendezvous", "10.0.0.1:29390",
                                      "--dry-run", str(train)])
    assert result.exit_code == 0, result.output


@pytest.mark.parametrize("elastic", [[], ["--elastic", "2:3", "--rendezvous", "h:1"]])
def test_sbatch_lines_in_a_torchrun_training_script_are_refused(tmp_path: Path,
                                                              elastic: list[str]) -> None:
    """A Python script written for plain sbatch carries its own #SBATCH lines; --torchrun
    generates the batch script, so they were dropped without a word (no GPUs, no time
    limit): exit 2 naming them. #SBATCH text after the first command is no directive."""
    train = tmp_path / "train.py"
    train.write_text("#!/usr/bin/env python\n#SBATCH --gres=gpu:8\n#SBATCH -t 2:00:00\n"
                     "import sys\n#SBATCH --mem=1G\nprint('hi')\n")
    words = ["--config", str(_config(tmp_path)), "sbatch", "--torchrun", *elastic,
             "--dry-run", "-N", "2", str(train)]
    result = CliRunner().invoke(cli, words)
    assert result.exit_code == 2, result.output
    assert "--gres=gpu:8; -t 2:00:00" in result.output and "--mem" not in result.output
    train.write_text("import sys\n#SBATCH --mem=1G\nprint('hi')\n")
    assert CliRunner().invoke(cli, words).exit_code == 0


def test_elastic_nodes_within_min_max_are_kept(tmp_path: Path) -> None:
    train = tmp_path / "train.py"
    train.write_text("print('hi')\n")
    result = CliRunner().invoke(cli, [
        "--config", str(_config(tmp_path)), "sbatch", "--torchrun", "--elastic", "2:4",
        "--elastic", "2:4", "--rendezvous", "[::1]:29390", "-N", "3", "--dry-run", "--json",
        str(train)])
    assert result.exit_code == 0, result.output
    out = read_envelope(result.output)
    assert "-N" in out["argv"] and "3" in out["argv"]
    assert "--rendezvous='[::1]:29390'" in out["script"]


@pytest.mark.parametrize(("value", "message"), [
    ("ctl:1\ntouch /tmp/x", "'ctl:1\\ntouch /tmp/x'"),
    ("ctl:99999", "1..65535"),
    ("h:1:2", "expected HOST:PORT"),
    ("", "expected HOST:PORT"),
])
def test_bad_rendezvous_variable_exits_2_naming_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                   value: str, message: str) -> None:
    train = tmp_path / "train.py"
    train.write_text("print('hi')\n")
    monkeypatch.setenv("SLURM_SPOT_RENDEZVOUS", value)
    result = CliRunner().invoke(cli, ["--config", str(_config(tmp_path)), "sbatch", "--torchrun",
                                      "--elastic", "2:3", "--dry-run", str(train)])
    assert result.exit_code == 2, result.output
    assert "$SLURM_SPOT_RENDEZVOUS" in result.output and message in result.output


def test_rendezvous_variable_without_port_gets_the_services_port(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    train = tmp_path / "train.py"
    train.write_text("print('hi')\n")
    monkeypatch.setenv("SLURM_SPOT_RENDEZVOUS", "ctl")
    result = CliRunner().invoke(cli, ["--config", str(_config(tmp_path)), "sbatch", "--torchrun",
                                      "--elastic", "2:3", "--dry-run", "--json", str(train)])
    assert result.exit_code == 0, result.output
    assert "--rendezvous=ctl:29390 " in read_envelope(result.output)["script"]


def test_no_option_value_breaks_a_line_of_the_script(tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    train = tmp_path / "train.py"
    train.write_text("print('hi')\n")
    monkeypatch.setenv("GLOO_SOCKET_IFNAME", "eth0\ntouch /tmp/x")
    result = CliRunner().invoke(cli, ["--config", str(_config(tmp_path)), "sbatch", "--torchrun",
                                      "--elastic", "2:3", "--rendezvous", "ctl:1", "--dry-run",
                                      str(train)])
    assert result.exit_code == 2 and "$GLOO_SOCKET_IFNAME" in result.output
    monkeypatch.delenv("GLOO_SOCKET_IFNAME")
    result = CliRunner().invoke(cli, ["--config", str(_config(tmp_path)), "sbatch", "--torchrun",
                                      "--elastic", "2:3", "--rendezvous", "ctl:1", "--dry-run",
                                      "--json", str(train), "a\nb", "--x=1\n2"])
    assert result.exit_code == 0, result.output
    script = read_envelope(result.output)["script"]
    # The script's arguments stay inside single quotes: the only lines that hold them are the
    # srun command's, no comment line holds them.
    assert not [ln for ln in script.splitlines() if ln.startswith("#") and "touch" in ln]
    assert "'a\nb' '--x=1\n2'" in script


def _run_batch_script(tmp_path: Path, outcomes: dict[str, str],
                      job_nodes: list[str] | None = None) -> subprocess.CompletedProcess:
    """Run the rendered elastic batch script with stand-ins for scontrol and srun on PATH:
    ``outcomes`` maps a node to what its agent does (``exit N`` or ``hang``); ``job_nodes``:
    the job's nodes by then, as ``scontrol show job`` gives them (default: all of them)."""
    from slurm_spot.config import load_config
    from slurm_spot.jobs.submit.torchrun_scripts import elastic_script

    train = tmp_path / "train.py"
    train.write_text("print('hi')\n")
    script = elastic_script(load_config(_config(tmp_path)), str(train), [], 1, "python3", [],
                            (2, 3), "ctl:29390", 30)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    now = ",".join(job_nodes if job_nodes is not None else outcomes)
    (bin_dir / "scontrol").write_text(
        "#!/bin/bash\n"
        f"if [ \"$1\" = -o ]; then echo 'JobId=5 JobState=RUNNING NodeList={now} Foo=1'; exit; fi\n"
        f"if [ \"$3\" = '{now}' ]; then printf '%s\\n' {now.replace(',', ' ')}; exit; fi\n"
        "printf '%s\\n' " + " ".join(outcomes) + "\n")
    cases = "\n".join(f"  --nodelist={node}) {'exec sleep 600' if what == 'hang' else what} ;;"
                      for node, what in outcomes.items())
    (bin_dir / "srun").write_text(
        "#!/bin/bash\nfor a in \"$@\"; do case \"$a\" in\n" + cases + "\nesac; done\nexit 3\n")
    for tool in ("scontrol", "srun"):
        (bin_dir / tool).chmod(0o755)
    env = {"PATH": f"{bin_dir}:/usr/bin:/bin", "SLURM_JOB_ID": "5",
           "SLURM_JOB_NODELIST": "n[1-3]"}
    return subprocess.run(["bash", "-c", script], env=env, capture_output=True, text=True,
                          timeout=120)


def test_batch_script_ends_when_training_finished_even_if_a_lost_nodes_step_hangs(
        tmp_path: Path) -> None:
    proc = _run_batch_script(tmp_path, {"n1": "exit 0", "n2": "exit 0", "n3": "hang"})
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "elastic training finished" in proc.stdout


def test_batch_script_goes_on_when_a_lost_nodes_step_ends_0_on_node_failure(
        tmp_path: Path) -> None:
    """The reconciler set n3 DOWN: Slurm took it out of the job and its srun ended 0 ("Node
    failure"). That is no finished training: the script waits for the others (here they
    cannot rendezvous again, so the job is requeued instead of COMPLETED)."""
    proc = _run_batch_script(tmp_path, {"n1": "sleep 1; exit 85", "n2": "sleep 1; exit 85",
                                        "n3": "exit 0"}, job_nodes=["n1", "n2"])
    assert "n3 was removed from the job (node failure)" in proc.stdout, proc.stdout
    assert proc.returncode == 85 and "elastic training finished" not in proc.stdout


def test_batch_script_requeues_when_the_rendezvous_cannot_form_again(tmp_path: Path) -> None:
    proc = _run_batch_script(tmp_path, {"n1": "exit 85", "n2": "exit 140", "n3": "hang"})
    assert proc.returncode == 85
    assert "for requeue" in proc.stdout


def test_batch_script_requeues_when_every_agent_was_told_to_leave(tmp_path: Path) -> None:
    """The time limit's --signal (no B:) or scancel --signal reaches every step: each agent
    exits 128 + SIGUSR2 = 140 (the config's preemption signal); nobody is left to train."""
    proc = _run_batch_script(tmp_path, {"n1": "exit 140", "n2": "exit 140", "n3": "exit 140"})
    assert proc.returncode == 85, proc.stdout + proc.stderr
    assert "every agent left on SIGUSR2" in proc.stdout and "for requeue" in proc.stdout


def test_batch_script_reports_a_crash_as_a_failure(tmp_path: Path) -> None:
    proc = _run_batch_script(tmp_path, {"n1": "exit 1", "n2": "exit 1", "n3": "exit 140"})
    assert proc.returncode == 1
    assert "no agent finished training" in proc.stdout


def test_agent_falls_back_to_requeue_when_fewer_than_min_nodes_rendezvous(
        tmp_path: Path) -> None:
    """A real torchrun agent alone in a 2:3 rendezvous (the store of slurm-spot rendezvous):
    after --join-timeout it exits with the requeue code, so the batch script requeues the job."""
    with rendezvous_service(os.environ, fake_owner=True) as endpoint:
        train = tmp_path / "train.py"
        train.write_text("raise SystemExit('never started')\n")
        code = (
            "import os, sys\n"
            "from slurm_spot.jobs.injob import torchrun_agent as a\n"
            "os.environ.update(a.ELASTIC_ENV)\n"
            f"s = a.ElasticSettings(2, 3, '{endpoint}', join_timeout_s=3)\n"
            f"args = a.elastic_torchrun_args(os.environ, s, '127.0.0.1', 1, [{str(train)!r}])\n"
            "sys.exit(a.run_torchrun(args, 85, elastic=True))\n")
        proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                              timeout=180, env={**os.environ,
                                                "SLURM_JOB_ID": "9"})
    assert proc.returncode == 85, proc.stderr[-2000:]
    assert "falling back to requeue" in proc.stderr


def test_example_trains_when_the_world_is_larger_than_the_global_batch(tmp_path: Path) -> None:
    """2 ranks, a global batch of 1: rank 1's share is empty every step; it adds zero
    gradients, so both ranks make the same collective calls (gloo aborts otherwise)."""
    example = Path(__file__).resolve().parent.parent / "examples" / "train_elastic.py"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM", "TORCHELASTIC"))}
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone",
                           "--nproc-per-node", "2", str(example), "--global-batch", "1",
                           "--micro-batch", "1", "--steps", "3", "--checkpoint-every", "2",
                           "--checkpoint-dir", str(tmp_path / "ck")],
                          capture_output=True, text=True, timeout=300, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    events = [json.loads(ln) for ln in proc.stdout.splitlines() if ln.startswith("{")]
    assert events[-1]["event"] == "done" and events[-1]["step"] == 3
    assert events[-1]["world_size"] == 2


@pytest.mark.parametrize("words", [["--micro-batch", "0"], ["--checkpoint-every", "0"],
                                   ["--log-every", "0"], ["--global-batch", "0"],
                                   ["--global-batch", "1798"], ["--steps", "-1"]])
def test_example_refuses_bad_arguments_with_a_usage_error(tmp_path: Path,
                                                          words: list[str]) -> None:
    example = Path(__file__).resolve().parent.parent / "examples" / "train_elastic.py"
    proc = subprocess.run([sys.executable, str(example), "--checkpoint-dir", str(tmp_path),
                           *words], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2, proc.stderr
    assert f"argument {words[0]}" in proc.stderr and "Traceback" not in proc.stderr
