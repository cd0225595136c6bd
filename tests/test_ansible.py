"""The Ansible role (issue 7): ``ansible/tests/run.sh`` runs ``ansible/roles/slurm_spot`` in
check mode on a fresh scratch prefix (issue 16: no failure, nothing written), applies it to
localhost there twice (the second run must change nothing), checks what it wrote
(``slurm-spot config check``, a real slurmctld on the rendered fragment) and runs ansible-lint
with the production profile on ``ansible/``. An OS family the role is not tested on is refused
before anything changes.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

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
