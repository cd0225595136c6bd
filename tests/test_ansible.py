"""The Ansible role (issue 7): ``ansible/tests/run.sh`` runs ``ansible/roles/slurm_spot`` in
check mode on a fresh scratch prefix (issue 16: no failure, nothing written), applies it to
localhost there twice (the second run must change nothing), checks what it wrote
(``slurm-spot config check``, a real slurmctld on the rendered fragment) and runs ansible-lint
with the production profile on ``ansible/``. An OS family the role is not tested on is refused
before anything changes.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.netns import host_network

ROOT = Path(__file__).resolve().parent.parent
RUN = ROOT / "ansible" / "tests" / "run.sh"
RUN_MARK = "=== ansible-playbook tests/test.yml: run "
CHECK_MARK = "=== ansible-playbook --check tests/check.yml: fresh host"
RECAP_LINE = re.compile(r"^(?P<host>\S+)\s+:\s+(?P<counts>(?:\w+=\d+\s*)+)$")


def play_recap(output: str) -> dict[str, dict[str, int]]:
    """The PLAY RECAP of one ansible-playbook run: host -> {ok, changed, failed, ...}."""
    _, _, tail = output.rpartition("PLAY RECAP")
    recap: dict[str, dict[str, int]] = {}
    for line in tail.splitlines()[1:]:
        match = RECAP_LINE.match(line.strip())
        if match:
            counts = dict(pair.split("=") for pair in match.group("counts").split())
            recap[match.group("host")] = {k: int(v) for k, v in counts.items()}
    return recap


def test_play_recap_parser() -> None:
    out = ("PLAY RECAP ****\n"
           "localhost                  : ok=58   changed=0    unreachable=0    failed=0    "
           "skipped=7    rescued=1    ignored=0   \n\n")
    assert play_recap(out) == {"localhost": {"ok": 58, "changed": 0, "unreachable": 0,
                                             "failed": 0, "skipped": 7, "rescued": 1,
                                             "ignored": 0}}


def _environment() -> dict[str, str]:
    # The tools of this interpreter's environment first (make test: .venv/bin).
    path = f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"
    return {**os.environ, "PATH": path}


def _require(env: dict[str, str]) -> None:
    missing = [tool for tool in ("ansible-playbook", "ansible-lint")
               if shutil.which(tool, path=env["PATH"]) is None]
    if missing:
        pytest.fail(f"{' and '.join(missing)} not found: `make test` installs them through the "
                    "dev extra (pip install -e '.[dev]')")
    if shutil.which("slurmctld", path=env["PATH"] + ":/usr/sbin") is None:
        pytest.fail("slurmctld is not installed: run 'make test', which installs slurm-wlm")
    if os.geteuid() != 0:
        pytest.fail("the role test runs as root (it gives directories to SlurmUser)")


@pytest.mark.e2e
@pytest.mark.timeout(1800)
def test_role_converges_is_idempotent_and_lints() -> None:
    env = _environment()
    _require(env)
    # On the host's network: pip reaches the package index for the role's virtualenv, and
    # check-slurmctld.sh takes the host network's test-cluster lock for its slurmctld.
    with host_network():
        proc = subprocess.run(["bash", str(RUN)], capture_output=True, text=True, env=env,
                              timeout=1700, check=False)
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, f"ansible/tests/run.sh failed:\n{output[-12000:]}"
    check, _, rest = output.partition(CHECK_MARK)[2].partition(RUN_MARK)
    check_recap = play_recap(check)["localhost"]
    assert check_recap["failed"] == 0 and check_recap["changed"] > 0, check
    assert "=== check mode wrote nothing" in check
    runs = (RUN_MARK + rest).split(RUN_MARK)[1:]
    assert len(runs) == 2, output[-4000:]
    first, second = play_recap(runs[0]), play_recap(runs[1])
    assert first["localhost"]["failed"] == 0 and first["localhost"]["changed"] > 0, runs[0]
    assert second["localhost"]["failed"] == 0, runs[1]
    assert second["localhost"]["changed"] == 0, f"second run changed something:\n{runs[1]}"
    assert "Profile 'production' was required, and it passed" in output, output[-4000:]


# ---- slurmd's drop-in on a cloud instance (issue 15): --instance-id/--instance-type ---------
# The role's units step renders the node-name unit and slurmd's drop-in into a scratch prefix
# for a compute host of an aws provider; the node-name command of the rendered unit then runs
# against a fake IMDS and a fake `slurmd -V`, and the drop-in's ExecStart is expanded the way
# systemd does (systemd.service(5), "Command lines"): the slurmd command line a node starts.

UNITS_PLAY = """
- name: Render the units of a compute host
  hosts: compute
  gather_facts: false
  tasks:
    - name: The role's units step
      ansible.builtin.include_role:
        name: slurm_spot
        tasks_from: units.yml
"""


def _render_units(tmp_path: Path, providers: dict) -> tuple[str, str]:
    """(node-name unit, slurmd drop-in) as the role writes them for ``providers``."""
    env = _environment()
    if shutil.which("ansible-playbook", path=env["PATH"]) is None:
        pytest.fail("ansible-playbook not found: `make test` installs it (the dev extra)")
    prefix = tmp_path / "prefix"
    (tmp_path / "inventory.ini").write_text("[compute]\nlocalhost ansible_connection=local\n")
    (tmp_path / "play.yml").write_text(UNITS_PLAY)
    (tmp_path / "vars.json").write_text(json.dumps({
        "slurm_spot_prefix": str(prefix), "slurm_spot_manage_services": False,
        "slurm_spot_providers": providers,
        "ansible_python_interpreter": sys.executable}))
    proc = subprocess.run(
        ["ansible-playbook", "-i", str(tmp_path / "inventory.ini"), str(tmp_path / "play.yml"),
         "-e", f"@{tmp_path / 'vars.json'}"],
        capture_output=True, text=True, timeout=300, check=False,
        env={**env, "ANSIBLE_ROLES_PATH": str(ROOT / "ansible" / "roles"), "ANSIBLE_NOCOLOR": "1",
             "ANSIBLE_LOCAL_TEMP": str(tmp_path / "ansible-tmp")})
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    units = prefix / "etc" / "systemd" / "system"
    return ((units / "slurm-spot-node.service").read_text(),
            (units / "slurmd.service.d" / "slurm-spot.conf").read_text())


@pytest.fixture(scope="module")
def aws_units(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, str]:
    return _render_units(tmp_path_factory.mktemp("role"),
                         {"ec2": {"type": "aws", "region": "us-east-1"}})


def _exec_start(unit: str) -> str:
    return [line for line in unit.splitlines() if line.startswith("ExecStart=")][-1][10:]


def _systemd_argv(exec_start: str, environment: dict[str, str]) -> list[str]:
    """ExecStart as systemd expands it: ``${VAR}`` is exactly one argument, ``$VAR`` as a word
    of its own splits at whitespace (zero or more arguments)."""
    argv: list[str] = []
    for word in exec_start.split():
        if word.startswith("${") and word.endswith("}"):
            argv.append(environment.get(word[2:-1], ""))
        elif word.startswith("$"):
            argv.extend(environment.get(word[1:], "").split())
        else:
            argv.append(word)
    return argv


def _env_file(path: Path) -> dict[str, str]:
    """KEY=value / KEY="value" lines, as systemd's EnvironmentFile= reads them."""
    values = {}
    for line in path.read_text().splitlines():
        key, _, value = line.partition("=")
        values[key] = value[1:-1] if value.startswith('"') and value.endswith('"') else value
    return values


@pytest.mark.parametrize(("slurm", "expected"), [
    ("24.11.5", ["--instance-id", "i-0123456789abcdef0", "--instance-type", "g5.xlarge"]),
    ("23.11.4", ["--instance-id", "i-0123456789abcdef0", "--instance-type", "g5.xlarge"]),
    ("22.05.8", []),  # slurmd(8) has no --instance-id before 23.11
])
def test_slurmd_drop_in_registers_the_instance_id_on_23_11_and_later(
    tmp_path: Path, aws_units: tuple[str, str], slurm: str, expected: list[str]
) -> None:
    from tests.fakes.imds import FakeImds

    node_unit, drop_in = aws_units
    assert _exec_start(drop_in).endswith(" -N ${SLURM_SPOT_NODE} $SLURM_SPOT_SLURMD_ARGS")
    assert "EnvironmentFile=/run/slurm-spot/node.env" in drop_in.splitlines()
    node_command = _exec_start(node_unit).split()
    assert node_command[-2:] == ["--slurmd", "/usr/sbin/slurmd"]

    # The node-name unit's command, with this checkout's CLI, a test spot.yaml, a slurmd that
    # answers -V like the given release, and the instance's IMDS.
    slurmd = tmp_path / "slurmd"
    slurmd.write_text(f"#!/bin/sh\necho 'slurm {slurm}'\n")
    slurmd.chmod(0o755)
    config = tmp_path / "spot.yaml"
    config.write_text(json.dumps({
        "cluster": "c", "providers": {"ec2": {"type": "aws", "region": "us-east-1"}},
        "node_sets": [{"name": "g5", "provider": "ec2", "count": 2, "instance_types": ["g5.xlarge"],
                       "aws": {"launch_template": "lt", "subnets": ["subnet-1"]}}],
        "partitions": [{"name": "gpu", "node_sets": ["g5"]}],
        "state_dir": str(tmp_path / "state"), "log_dir": str(tmp_path / "log")}))
    env_file = tmp_path / "node.env"
    args = node_command[node_command.index("node-name"):]
    args = [str(env_file) if a == "/run/slurm-spot/node.env" else str(slurmd)
            if a == "/usr/sbin/slurmd" else a for a in args]
    args[args.index("--wait") + 1] = "0"
    imds = FakeImds().start()  # instance i-0123456789abcdef0, a g5.xlarge
    try:
        proc = subprocess.run(
            [str(Path(sys.executable).parent / "slurm-spot"), "--config", str(config), *args,
             "--node", "g5-1"],
            capture_output=True, text=True, timeout=60, check=False,
            env={**os.environ, "AWS_EC2_METADATA_SERVICE_ENDPOINT": imds.url})
    finally:
        imds.stop()
    assert proc.returncode == 0, proc.stderr
    environment = _env_file(env_file)
    argv = _systemd_argv(_exec_start(drop_in), {**environment, "SLURMD_OPTIONS": ""})
    assert argv == ["/usr/sbin/slurmd", "-D", "-s", "-N", "g5-1", *expected]


def test_slurmd_drop_in_of_a_local_only_cluster_asks_no_metadata(tmp_path: Path) -> None:
    """Without cloud providers the node-name unit gets no --slurmd (no metadata service to
    ask); the drop-in's $SLURM_SPOT_SLURMD_ARGS then expands to no argument at all."""
    node_unit, drop_in = _render_units(tmp_path, {"local": {"type": "local"}})
    assert "--slurmd" not in _exec_start(node_unit)
    argv = _systemd_argv(_exec_start(drop_in), {"SLURM_SPOT_NODE": "spot-1"})
    assert argv == ["/usr/sbin/slurmd", "-D", "-s", "-N", "spot-1"]


def test_role_refuses_an_os_family_it_is_not_tested_on(tmp_path: Path) -> None:
    """RHEL-family hosts are refused with a message saying why and what to set, before the
    role changes anything (here: the facts of a Rocky 9 host, in check mode)."""
    env = {**_environment(), "SLURM_SPOT_ANSIBLE_PREFIX": str(tmp_path / "prefix"),
           "ANSIBLE_CONFIG": str(ROOT / "ansible" / "ansible.cfg"), "ANSIBLE_NOCOLOR": "1"}
    if shutil.which("ansible-playbook", path=env["PATH"]) is None:
        pytest.fail("ansible-playbook not found: pip install -e '.[dev]'")
    proc = subprocess.run(
        ["ansible-playbook", "--check", "-i", "tests/inventory.ini", "tests/check.yml",
         "-e", "__slurm_spot_os_family=RedHat", "-e", "__slurm_spot_os_distribution=Rocky"],
        cwd=ROOT / "ansible", env=env, capture_output=True, text=True, timeout=600, check=False)
    output = proc.stdout + proc.stderr
    assert proc.returncode != 0, output[-4000:]
    assert "Check that the OS is one the role is tested on" in output
    assert "runs Rocky (RedHat family): the slurm_spot role is tested on Debian and Ubuntu" in output
    assert "slurm_spot_allow_untested_os=true" in output
    assert play_recap(output)["localhost"]["failed"] == 1, output[-4000:]
    # only the test's own Slurm install (prepared for real) is there, nothing of the role's
    prefix = tmp_path / "prefix"
    assert sorted(str(p.relative_to(prefix)) for p in prefix.rglob("*") if p.is_file()) == [
        "etc/slurm/slurm.conf"]
