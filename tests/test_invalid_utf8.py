"""Issue 25, "Nothing lost, nobody in": bytes that are not UTF-8.

Any user can name a job ``$'bad\\xff'`` or give it such a comment; Slurm prints those bytes as
they are in ``squeue --json`` and ``scontrol -o show job``. Every reader goes on (reconcile
passes, the watcher, ``status``, ``events``), acts on the job by its id, shows the name
escaped (``bad\\xff``), and writes only valid UTF-8 JSON.

The fake Slurm answers through a real process (``FakeSlurm.through_process``), so its bytes
reach the client through the production runner as Slurm's do.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest
from click.testing import CliRunner

from slurm_spot.cli import cli
from slurm_spot.commands import status as status_module
from slurm_spot.commands.common import AppContext
from slurm_spot.config import SpotConfig, parse_config
from slurm_spot.events import EVENTS_FILE, Event, emit, read_events
from slurm_spot.jsonenvelope import read_envelope
from slurm_spot.lifecycle.watch import Watcher
from slurm_spot.providers.base import InstanceState
from slurm_spot.providers.local.notices import LocalNoticeSource
from slurm_spot.reconcile.reconciler import Reconciler
from slurm_spot.slurm.client import SlurmClient
from slurm_spot.slurm.runner import run_command
from tests.fakes.fake_provider import FakeProvider
from tests.fakes.fake_slurm import FakeSlurm

NOW = datetime(2026, 3, 1, 12, 0, tzinfo=timezone.utc)
BAD_NAME = b"job\xff\xfe".decode("utf-8", "surrogateescape")  # what sbatch -J $'job\xff\xfe' gives
BAD_COMMENT = b"c\xffomment".decode("utf-8", "surrogateescape")
BAD_REASON = b"disk \xff replaced".decode("utf-8", "surrogateescape")


def _settings(tmp_path: Path) -> dict:
    return {"cluster": "test", "node_sets": [{"name": "spot", "provider": "local", "count": 3}],
            "partitions": [{"name": "spot", "node_sets": ["spot"]}],
            "state_dir": str(tmp_path / "state"), "log_dir": str(tmp_path / "log"),
            "reconcile": {"missing_grace_s": 0}, "preemption": {"prewarm": False}}


def _slurm_with_a_bad_job() -> FakeSlurm:
    """spot-1 runs job 9, named and commented with invalid UTF-8; spot-3 is down with an
    admin's reason holding such a byte too."""
    slurm = FakeSlurm()
    slurm.add_node("spot-1", "MIXED+CLOUD", addr="10.0.0.1")
    slurm.add_node("spot-2", "IDLE+CLOUD+POWERED_DOWN")
    slurm.add_node("spot-3", "DOWN+CLOUD+POWERED_DOWN", reason=BAD_REASON)
    job = slurm.add_job(9, ["spot-1"])
    job.name, job.comment = BAD_NAME, BAD_COMMENT
    job.script = "#!/bin/sh\n#SBATCH -J " + BAD_NAME + "\n# caf\udce9\nsrun train\n"
    return slurm


def _valid_utf8_events(log_dir: Path) -> list[dict]:
    """Every line of the events file, read strictly: UTF-8 and JSON, no lone surrogate."""
    lines = (log_dir / EVENTS_FILE).read_bytes().decode("utf-8").splitlines()
    found = [json.loads(line) for line in lines]
    for line in lines:
        assert "\\ud" not in line.lower(), f"a lone surrogate escape in {line}"
    return found


def test_runner_keeps_invalid_bytes_and_shows_them_escaped() -> None:
    result = run_command(["/bin/sh", "-c", r"printf 'job\377\376'; printf 'err\377' >&2"], 10)
    assert result.returncode == 0
    assert result.stdout == BAD_NAME
    assert result.stdout.encode("utf-8", "surrogateescape") == b"job\xff\xfe"  # nothing lost
    from slurm_spot.rawtext import escaped

    assert escaped(result.stdout) == "job\\xff\\xfe"
    assert escaped(result.stderr) == "err\\xff"
    assert escaped("plain caf\u00e9") == "plain caf\u00e9"


def test_squeue_json_and_scontrol_text_with_invalid_bytes_are_read(tmp_path: Path) -> None:
    slurm = _slurm_with_a_bad_job()
    client = SlurmClient("/usr/bin", runner=slurm.through_process(tmp_path / "out"))
    [job] = client.jobs()
    assert (job.job_id, job.name, job.state.base) == (9, BAD_NAME, "RUNNING")
    record = client.job_record(9)
    assert record is not None and (record.job_id, record.state.base) == (9, "RUNNING")
    assert [r.job_id for r in client.job_records()] == [9]
    nodes = {n.name: n for n in client.nodes()}
    assert nodes["spot-1"].jobs == (9,)
    assert nodes["spot-3"].reason == BAD_REASON
    assert client.batch_script(9) == slurm.jobs[9].script
    slurm.json_nodes = False  # the text fallback: scontrol -o show node
    text_client = SlurmClient("/usr/bin", runner=slurm.through_process(tmp_path / "out"))
    assert {n.name: n.reason for n in text_client.nodes()}["spot-3"] == BAD_REASON


def test_reconcile_pass_requeues_a_job_named_with_invalid_bytes(tmp_path: Path) -> None:
    """The job's instance is gone: the pass takes the node down and requeues the job (by its
    id), though its name and comment, and another node's reason, are not UTF-8."""
    config = SpotConfig.model_validate(_settings(tmp_path))
    slurm = _slurm_with_a_bad_job()
    provider = FakeProvider()
    provider.add("spot-1", 900, NOW, InstanceState.TERMINATED,
                 reason="Server.SpotInstanceTermination")
    reconciler = Reconciler(config, SlurmClient("/usr/bin",
                                                runner=slurm.through_process(tmp_path / "out")),
                            providers=lambda c, name: provider, clock=lambda: NOW,
                            sleep=lambda s: None, expedite_wait_s=0)
    result = reconciler.run_pass()
    assert result.errors == []
    assert slurm.jobs[9].state == "PENDING" and slurm.jobs[9].restarts == 1
    assert slurm.nodes["spot-1"].reason.startswith("spot-interruption:reclaimed@")
    assert slurm.nodes["spot-3"].reason == BAD_REASON  # an admin's reason: left as it is
    reclaimed = [e for e in _valid_utf8_events(config.log_dir) if e["action"] == "reclaimed"]
    assert [(e["node"], e["job_ids"]) for e in reclaimed] == [("spot-1", [9])]


def test_watcher_handles_a_notice_for_a_job_with_invalid_bytes(tmp_path: Path) -> None:
    """Its batch script, its name and its process's name hold invalid bytes: the watcher
    still signals the job's process, powers the node down, requeues and expedites the job."""
    config = parse_config(_settings(tmp_path))
    slurm = _slurm_with_a_bad_job()
    slurm.add_node("spot-1", "MIXED+CLOUD", addr="10.0.0.1")
    deadline = datetime.now(timezone.utc) + timedelta(seconds=30)
    notice_file = tmp_path / "notice.json"
    notice_file.write_text(json.dumps({"action": "terminate", "time": deadline.isoformat()}))
    clock = [deadline.timestamp() - 30]
    watcher = Watcher(config, "spot-1",
                      SlurmClient("/usr/bin", runner=slurm.through_process(tmp_path / "out")),
                      LocalNoticeSource(notice_file, 0.5), clock=lambda: clock[0],
                      sleep=lambda s: clock.__setitem__(0, clock[0] + s))
    # scontrol listpids does not answer: the job's processes are found by their environment.
    # Both catch SIGUSR2 (bit 12); their names, and the step id one of them claims, are not
    # UTF-8 (a process's user sets them).
    proc = tmp_path / "proc"
    for pid, step in (("4242", b""), ("4243", b"SLURM_STEP_ID=0\xff\0")):
        (proc / pid).mkdir(parents=True)
        (proc / pid / "environ").write_bytes(b"SLURM_JOB_ID=9\0SLURMD_NODENAME=spot-1\0" + step)
        (proc / pid / "status").write_bytes(
            b"Name:\ttrain\xff\nSigIgn:\t0000000000000000\nSigCgt:\t0000000000000800\n")
    killed: list[tuple[int, int]] = []
    watcher.signaller.proc_root = proc
    watcher.signaller.kill = lambda pid, sig: killed.append((pid, sig))
    outcome = watcher.run(once=True)
    assert outcome is not None and outcome.jobs == [9] and outcome.requeued == [9]
    assert killed and {pid for pid, _ in killed} == {4242}  # the batch step's process
    assert slurm.signals == [["-s", "USR2", "9.0\udcff"]]  # the claimed step, bytes as given
    assert slurm.jobs[9].state == "PENDING" and 9 in slurm.expedited
    assert [e["action"] for e in _valid_utf8_events(config.log_dir)] == [
        "notice", "signalled", "requeued"]


def test_status_shows_invalid_bytes_escaped(tmp_path: Path,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "spot.yaml"
    path.write_text(json.dumps(_settings(tmp_path)))
    slurm = _slurm_with_a_bad_job()
    provider = FakeProvider()
    provider.add("spot-1", 600, NOW, ip="10.0.0.1")
    monkeypatch.setattr(AppContext, "slurm", lambda self: SlurmClient(
        "/usr/bin", runner=slurm.through_process(tmp_path / "out")))
    monkeypatch.setattr(status_module, "get_provider", lambda c, n: provider)
    table = CliRunner().invoke(cli, ["--config", str(path), "status"])
    assert table.exit_code == 0, table.output
    row = next(line for line in table.stdout.splitlines() if line.startswith("spot-3"))
    assert row.endswith("disk \\xff replaced")
    shown = CliRunner().invoke(cli, ["--config", str(path), "status", "--json"])
    assert shown.exit_code == 0, shown.output
    rows = {r["node"]: r for r in read_envelope(shown.stdout)["nodes"]}
    assert rows["spot-3"]["reason"] == "disk \\xff replaced"
    assert rows["spot-1"]["jobs"] == [9]


def test_events_file_and_events_command_stay_valid_utf8(tmp_path: Path) -> None:
    """An event that carries text read from Slurm is written escaped; a line someone wrote
    with a lone surrogate escape is printed escaped too, by the real command (no
    traceback from a strict stdout)."""
    log_dir = tmp_path / "log"
    emit(log_dir, Event("undrained", "reconcile", node="spot-3", reason=BAD_REASON,
                        extra={"name": BAD_NAME, BAD_COMMENT: [BAD_NAME]}))
    with open(log_dir / EVENTS_FILE, "a", encoding="ascii") as fh:
        fh.write('{"action": "notice", "source": "watch", "node": "spot-2", '
                 '"reason": "x\\udcff", "job_ids": [9], "time": "2026-03-01T12:00:00+00:00"}\n')
    written, _written_by_someone_else = (log_dir / EVENTS_FILE).read_bytes().decode("utf-8").splitlines()
    event = json.loads(written)
    assert event["reason"] == "disk \\xff replaced"
    assert event["extra"] == {"name": "job\\xff\\xfe", "c\\xffomment": ["job\\xff\\xfe"]}
    assert [e["reason"] for e in read_events(log_dir)] == ["disk \\xff replaced", "x\udcff"]
    path = tmp_path / "spot.yaml"
    path.write_text(json.dumps(_settings(tmp_path)))
    env = {**os.environ, "PYTHONIOENCODING": "utf-8"}  # strict, as on a UTF-8 terminal

    def shown(*args: str) -> str:
        proc = subprocess.run([sys.executable, "-m", "slurm_spot", "--config", str(path),
                               *args], capture_output=True, env=env, timeout=60)
        assert proc.returncode == 0 and b"Traceback" not in proc.stderr, proc.stderr
        return proc.stdout.decode("utf-8")

    table = shown("events", "--format", "node,reason")
    assert "spot-3  disk \\xff replaced" in table and "spot-2  x\\xff" in table
    assert [e["reason"] for e in read_envelope(shown("events", "--json"))] == [
        "disk \\xff replaced", "x\\xff"]
