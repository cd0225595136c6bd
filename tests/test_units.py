"""One copy of each systemd unit, hardened, rendered by the CLI and by the Ansible role alike.

The role renders ``templates/*.service.j2`` with Ansible's template settings (``trim_blocks``)
and its own ``ansible_managed`` header; the CLI with slurm-spot's jinja2 environment. Both must
give the same unit (tests/test_ansible.py runs the role itself).
"""

from __future__ import annotations

from pathlib import Path

import jinja2
import pytest
from click.testing import CliRunner

from slurm_spot.cli import cli
from slurm_spot.render import template_env
from slurm_spot.resources import templates

ROOT = Path(__file__).resolve().parent.parent
HARDENING = ["NoNewPrivileges=true", "PrivateTmp=true", "ProtectSystem=full",
             "ProtectHome=read-only", "ProtectKernelTunables=true", "ProtectKernelModules=true",
             "ProtectControlGroups=true", "RestrictSUIDSGID=true", "LockPersonality=true"]
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
