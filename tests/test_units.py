"""One copy of each systemd unit, hardened, rendered by the CLI and by the Ansible role alike.

The role renders ``templates/*.service.j2`` with Ansible's template settings (``trim_blocks``)
and its own ``ansible_managed`` header; the CLI with slurm-spot's jinja2 environment. Both must
give the same unit (tests/test_ansible.py runs the role itself).
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import jinja2
import pytest
from click.testing import CliRunner

from slurm_spot.cli import cli
from slurm_spot.resources import template_env, templates

ROOT = Path(__file__).resolve().parent.parent
HARDENING = ["NoNewPrivileges=true", "PrivateTmp=true",
             "ProtectHome=read-only", "ProtectKernelTunables=true", "ProtectKernelModules=true",
             "ProtectControlGroups=true", "RestrictSUIDSGID=true", "LockPersonality=true"]
DAEMONS = ["slurm-spot-reconcile.service.j2", "slurm-spot-watch.service.j2"]
# The bar (issue 28): `systemd-analyze security` below 5 ("OK"), Type=notify + watchdog.
MAX_EXPOSURE = 5.0
UNITS = ["slurm-spot-reconcile.service.j2", "slurm-spot-watch.service.j2",
         "slurm-spot-node.service.j2"]
CONTEXT = {"__slurm_spot_unit_header": "Managed by test", "__slurm_spot_unit_user": "slurm",
           "__slurm_spot_unit_exec_start": "/opt/bin/slurm-spot --config /etc/slurm/spot.yaml x",
           "__slurm_spot_unit_environment": {"SLURM_CONF": "/etc/slurm/slurm.conf", "A": "b"},
           "__slurm_spot_unit_env_file": "/run/slurm-spot/node.env"}


def config(tmp_path: Path) -> Path:
    path = tmp_path / "spot.yaml"
    path.write_text("cluster: c\nnode_sets: [{name: spot, provider: local, count: 1}]\n"
                    "partitions: [{name: spot, node_sets: [spot]}]\n")
    return path


def test_the_role_has_no_unit_templates_of_its_own() -> None:
    role_templates = ROOT / "ansible" / "roles" / "slurm_spot" / "templates"
    assert sorted(p.name for p in role_templates.iterdir()) == ["spot.yaml.j2"]
    units = (ROOT / "ansible" / "roles" / "slurm_spot" / "tasks" / "units.yml").read_text()
    for unit in [*UNITS, "slurmd-slurm-spot.conf.j2"]:
        assert f'src: "{{{{ __slurm_spot_templates_dir }}}}/{unit}"' in units
        assert templates().joinpath(unit).is_file()


@pytest.mark.parametrize("unit", UNITS)
def test_unit_renders_the_same_with_ansible_settings_and_is_hardened(unit: str) -> None:
    ours = template_env().get_template(unit).render(**CONTEXT)
    ansible_like = template_env()
    ansible_like.trim_blocks = True  # ansible.builtin.template's default
    theirs = ansible_like.get_template(unit).render(**CONTEXT)
    assert ours == theirs
    lines = ours.splitlines()
    assert lines[0] == "# Managed by test"
    assert "[Service]" in lines and "[Install]" in lines
    assert 'Environment="A=b"' in lines and 'Environment="SLURM_CONF=/etc/slurm/slurm.conf"' in lines
    assert "ExecStart=/opt/bin/slurm-spot --config /etc/slurm/spot.yaml x" in lines
    for setting in HARDENING:
        assert setting in lines, (unit, setting)
    assert "" not in lines[: lines.index("[Install]") - 1][lines.index("[Service]"):]


def test_ansible_managed_header_wins_when_defined() -> None:
    env = jinja2.Environment(loader=template_env().loader, undefined=jinja2.StrictUndefined,
                             trim_blocks=True)
    env.filters.update(template_env().filters)
    text = env.get_template(UNITS[1]).render(ansible_managed="Ansible managed", **CONTEXT)
    assert text.startswith("# Ansible managed\n")


def test_cli_units_are_the_shared_hardened_templates(tmp_path: Path) -> None:
    path = config(tmp_path)
    runner = CliRunner()
    reconcile = runner.invoke(cli, ["--config", str(path), "reconcile", "--systemd-unit"])
    watch = runner.invoke(cli, ["--config", str(path), "watch", "--systemd-unit", "--node", "spot-1"])
    for result, command in ((reconcile, "reconcile"), (watch, "watch --node spot-1")):
        assert result.exit_code == 0, result.output
        assert result.output.startswith("# Managed by slurm-spot (")
        assert f" --config {path} {command}\n" in result.output
        for setting in HARDENING:
            assert f"\n{setting}\n" in result.output


def _sandbox(text: str) -> list[str]:
    """The unit's sandbox lines (from "# Sandbox" to the end of [Service])."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("# Sandbox"))
    return [line for line in lines[start:lines.index("[Install]")] if line and
            not line.startswith("#")]


def test_daemons_are_notify_services_with_a_watchdog_and_a_strict_sandbox() -> None:
    context = {**CONTEXT, "__slurm_spot_unit_write_paths": ["/var/lib/ss", "/var/log/ss"]}
    texts = {u: template_env().get_template(u).render(**context) for u in DAEMONS}
    for unit, text in texts.items():
        lines = text.splitlines()
        for setting in ("Type=notify", "NotifyAccess=main", "ProtectSystem=strict",
                        "ReadWritePaths=-/var/lib/ss", "ReadWritePaths=-/var/log/ss",
                        "SystemCallFilter=@system-service", "MemoryDenyWriteExecute=true"):
            assert setting in lines, (unit, setting)
        assert any(line.startswith("WatchdogSec=") for line in lines), unit
    # The same sandbox in both, but for what only one needs (capabilities, /proc).
    reconcile, watch = (_sandbox(texts[u]) for u in DAEMONS)
    differ = {line for line in set(reconcile) ^ set(watch)}
    assert differ == {"ProtectProc=invisible", "CapabilityBoundingSet=",
                      "CapabilityBoundingSet=CAP_KILL CAP_DAC_OVERRIDE CAP_DAC_READ_SEARCH "
                      "CAP_SYS_PTRACE"}


def test_cli_units_may_write_only_the_configured_directories(tmp_path: Path) -> None:
    path = config(tmp_path)
    path.write_text(path.read_text() + f"state_dir: {tmp_path}/st\nlog_dir: {tmp_path}/lg\n"
                    f"reconcile: {{metrics_file: {tmp_path}/prom/slurm_spot.prom}}\n")
    runner = CliRunner()
    reconcile = runner.invoke(cli, ["--config", str(path), "reconcile", "--systemd-unit"])
    watch = runner.invoke(cli, ["--config", str(path), "watch", "--systemd-unit"])
    assert [line for line in reconcile.output.splitlines() if line.startswith("ReadWritePaths")] \
        == [f"ReadWritePaths=-{tmp_path}/st", f"ReadWritePaths=-{tmp_path}/lg",
            f"ReadWritePaths=-{tmp_path}/prom"]
    assert [line for line in watch.output.splitlines() if line.startswith("ReadWritePaths")] \
        == [f"ReadWritePaths=-{tmp_path}/st", f"ReadWritePaths=-{tmp_path}/lg"]


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="needs systemd-analyze")
@pytest.mark.parametrize(("unit", "user"), [(DAEMONS[0], "slurm"), (DAEMONS[0], "root"),
                                            (DAEMONS[1], "root")])
def test_exposure_measured_by_systemd_analyze_is_below_5(tmp_path: Path, unit: str,
                                                         user: str) -> None:
    context = {**CONTEXT, "__slurm_spot_unit_user": user,
               "__slurm_spot_unit_write_paths": ["/var/lib/slurm-spot", "/var/log/slurm-spot"]}
    file = tmp_path / unit.removesuffix(".j2")
    file.write_text(template_env().get_template(unit).render(**context))
    done = subprocess.run(["systemd-analyze", "security", "--offline=true", str(file)],
                          capture_output=True, text=True, timeout=60, check=False)
    match = re.search(r"Overall exposure level for \S+: ([0-9.]+)", done.stdout + done.stderr)
    assert match, done.stdout + done.stderr
    assert float(match.group(1)) < MAX_EXPOSURE, done.stdout
