"""The hook executables Slurm runs import only what they use (issue 10).

Each hook runs in a fresh interpreter, as slurmctld/slurmd start it: an empty environment but
``SLURM_CONF`` with spot.yaml beside it. After the hook entry returns, the interpreter reports
what it did and which modules it loaded; none of the heavy libraries may be among them. The
timing figures are in BENCHMARKS.md (benchmarks/hook_startup.py), not here.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
HEAVY = ("rich", "jinja2", "prometheus_client", "boto3", "botocore", "google", "torch", "click",
         # pydantic's plugin loader pulls this in (email, zipfile, csv ...) to find no plugins
         "importlib.metadata")
JOB_ENV = {"SLURM_JOB_ID": "77", "SLURM_JOB_USER": "root", "SLURM_JOB_UID": "0",
           "SLURM_JOB_GID": "0", "SLURM_RESTART_COUNT": "2", "SLURMD_NODENAME": "spot-1"}

PROBE = """
import json, sys
from slurm_spot import hooks
name, args, sync = sys.argv[1], json.loads(sys.argv[2]), sys.argv[3] == "sync"
if sync:  # what the detached worker of a power hook does, run in this process
    import os
    os.environ.setdefault("PYDANTIC_DISABLE_PLUGINS", "__all__")  # as hooks.main sets it
    hooks._skip_plugin_loader()
    from slurm_spot.config import load_config
    result = hooks.power_action(load_config(None), name, args[0])()
    out = {"rc": 0, "result": result.to_json()}
else:
    out = {"rc": hooks.main(name, args)}
heavy = set(json.loads(sys.argv[4]))
out["heavy"] = sorted({m.split(".")[0] for m in sys.modules} & heavy | set(sys.modules) & heavy)
print(json.dumps(out))
"""


@pytest.fixture()
def site(tmp_path: Path) -> Path:
    """spot.yaml (a local node set whose simulated market has no capacity) beside slurm.conf."""
    state = tmp_path / "state"
    (state / "local").mkdir(parents=True)
    (state / "local" / "capacity.json").write_text(json.dumps({"spot": 0}))
    (tmp_path / "ckpt").mkdir(mode=0o755)
    (tmp_path / "spot.yaml").write_text(json.dumps({
        "cluster": "light", "providers": {"local": {"type": "local"}},
        "node_sets": [{"name": "spot", "provider": "local", "count": 4}],
        "partitions": [{"name": "spot", "node_sets": ["spot"]}],
        "state_dir": str(state), "log_dir": str(tmp_path / "log"),
        "checkpoint": {"root": str(tmp_path / "ckpt")},
        "slurm_bin_dir": str(tmp_path / "no-slurm-here"),
    }))
    (tmp_path / "slurm.conf").write_text("")
    return tmp_path


def probe(site: Path, name: str, args: list[str], sync: bool = False,
          env: dict[str, str] | None = None) -> tuple[dict, str]:
    proc = subprocess.run(
        [sys.executable, "-c", PROBE, name, json.dumps(args), "sync" if sync else "main",
         json.dumps(HEAVY)],
        env={"PATH": "/usr/bin:/bin", "SLURM_CONF": str(site / "slurm.conf"),
             "PYTHONPATH": str(ROOT), **(env or {})},
        capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 0, proc.stderr
    *printed, last = proc.stdout.strip().splitlines()
    return json.loads(last), "\n".join(printed) + proc.stderr


def test_task_prolog_exports_the_job_env_without_heavy_imports(site: Path) -> None:
    out, printed = probe(site, "task-prolog", [], env=JOB_ENV)
    assert out == {"rc": 0, "heavy": []}
    assert f"export SLURM_SPOT_CHECKPOINT_DIR={site / 'ckpt' / 'root' / '77'}" in printed
    assert "export SLURM_SPOT_RESTART_COUNT=2" in printed


def test_prolog_and_epilog_do_their_work_without_heavy_imports(site: Path) -> None:
    out, _ = probe(site, "prolog", [], env=JOB_ENV)
    assert out == {"rc": 0, "heavy": []}
    assert (site / "ckpt" / "root" / "77").is_dir()
    out, _ = probe(site, "epilog", [], env=JOB_ENV)
    assert out == {"rc": 0, "heavy": []}
    (event,) = [json.loads(line) for line in (site / "log" / "events.jsonl").read_text().splitlines()]
    assert (event["action"], event["job_ids"]) == ("job_end", [77])
    # an array task: its event keeps Slurm's name for it, which 'slurm-spot events' shows
    out, _ = probe(site, "epilog", [], env={**JOB_ENV, "SLURM_ARRAY_JOB_ID": "76",
                                             "SLURM_ARRAY_TASK_ID": "1"})
    assert out == {"rc": 0, "heavy": []}
    last = json.loads((site / "log" / "events.jsonl").read_text().splitlines()[-1])
    assert last["job_ids"] == [77] and last["extra"]["job_refs"] == {"77": "76_1"}


def test_bad_job_env_is_exit_2_with_a_message(site: Path) -> None:
    out, printed = probe(site, "task-prolog", [], env={**JOB_ENV, "SLURM_JOB_USER": "../x"})
    assert out["rc"] == 2 and out["heavy"] == []
    assert "slurm-spot: error: SLURM_JOB_USER '../x'" in printed


@pytest.mark.parametrize("name", ["resume", "suspend", "resume-fail"])
def test_power_hooks_of_a_local_node_set_stay_light(site: Path, name: str) -> None:
    out, _ = probe(site, name, ["spot-[1-2]"])  # validates, detaches, returns
    assert out == {"rc": 0, "heavy": []}
    out, _ = probe(site, name, ["spot-[1-2]"], sync=True)  # the detached worker's part
    assert out["heavy"] == []
    if name == "resume":  # no capacity: both nodes failed with the provider's code
        (failure,) = out["result"]["failed"]
        assert failure["nodes"] == ["spot-1", "spot-2"] and failure["class"] == "capacity"


def test_power_hook_rejects_an_unknown_node_before_detaching(site: Path) -> None:
    out, printed = probe(site, "resume", ["gpu-[1-2]"])
    assert out["rc"] == 2 and out["heavy"] == []
    assert "slurm-spot: error:" in printed and "gpu-1" in printed
    assert not (site / "log" / "hooks.log").exists()


def test_other_arguments_go_through_the_full_command_line(site: Path) -> None:
    out, printed = probe(site, "suspend", ["--help"])
    assert out["rc"] == 0 and "click" in out["heavy"]
    assert "SuspendProgram" in printed and "--json" in printed


def test_installed_hook_entry_point_runs_with_an_empty_environment(site: Path) -> None:
    # The console_scripts executable pip wrote beside this interpreter (make setup), run as
    # slurmd runs it: by absolute path, no PATH to find python, no PYTHONPATH.
    script = Path(sys.executable).parent / "slurm-spot-task-prolog"
    assert script.read_text().startswith(f"#!{sys.executable}")
    proc = subprocess.run([str(script)], capture_output=True, text=True, timeout=120,
                          check=False, env={"SLURM_CONF": str(site / "slurm.conf"), **JOB_ENV})
    assert proc.returncode == 0, proc.stderr
    assert "export SLURM_SPOT_PREEMPT_SIGNAL=USR2" in proc.stdout


def test_a_hook_that_finds_spot_yaml_unchanged_skips_pydantic_and_sees_every_edit(
        site: Path) -> None:
    """The first hook validates spot.yaml and stores it in <state_dir>/config-cache; the next
    one, given the same bytes, loads no pydantic; an edit made between two hooks is seen by
    the next one (slurm_spot/config/cache.py)."""
    heavy_and_pydantic = [*HEAVY, "pydantic.main"]  # ("pydantic.plugin._loader" is the stub)
    for expected_signal in ("USR2", "USR2"):
        proc = subprocess.run(
            [sys.executable, "-c", PROBE, "task-prolog", "[]", "main",
             json.dumps(heavy_and_pydantic)],
            env={"PATH": "/usr/bin:/bin", "SLURM_CONF": str(site / "slurm.conf"),
                 "PYTHONPATH": str(ROOT), **JOB_ENV},
            capture_output=True, text=True, timeout=120, check=False)
        assert proc.returncode == 0, proc.stderr
        assert f"export SLURM_SPOT_PREEMPT_SIGNAL={expected_signal}" in proc.stdout
    assert json.loads(proc.stdout.splitlines()[-1]) == {"rc": 0, "heavy": []}  # the cached one
    spot = json.loads((site / "spot.yaml").read_text())
    (site / "spot.yaml").write_text(json.dumps({**spot, "preemption": {"signal": "USR1"}}))
    out, printed = probe(site, "task-prolog", [], env=JOB_ENV)
    assert out["rc"] == 0 and "export SLURM_SPOT_PREEMPT_SIGNAL=USR1" in printed
    # a power hook on the cached config detaches, and its worker acts on the real model
    probe(site, "resume", ["spot-[1-2]"])
    out, _ = probe(site, "resume", ["spot-[1-2]"])
    assert out == {"rc": 0, "heavy": []}
