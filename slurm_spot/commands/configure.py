"""``slurm-spot config check`` and ``slurm-spot render``."""

from __future__ import annotations

import json
from pathlib import Path

import click
import yaml

from slurm_spot.commands.common import AppContext, json_option, pass_app, print_json
from slurm_spot.config import credentials_file_problems, slurm_bin_problems
from slurm_spot.errors import BadInputError, ConfigError
from slurm_spot.lifecycle.weights import name_order_warnings
from slurm_spot.providers import check_config, check_online, cloud_permissions
from slurm_spot.render import render, slurm_version, write_rendered
from slurm_spot.slurm.version import SlurmVersion


@click.group("config")
def config_group() -> None:
    """Inspect the configuration (spot.yaml)."""


@config_group.command("check")
@click.option("--online", is_flag=True,
              help="Also ask each cloud (read-only calls, DryRun launches) about the subnets, "
                   "templates, zones, machine types, images, quotas and permissions spot.yaml "
                   "names. A check the credentials may not make is a warning.")
@json_option
@pass_app
def check_command(app: AppContext, online: bool, as_json: bool) -> None:
    """Validate spot.yaml: exit 0 if good, 2 with every problem (file, line, field, reason)
    if not."""
    config = app.config
    problems = (check_config(config) + slurm_bin_problems(config)
                + credentials_file_problems(config))
    if problems:
        raise ConfigError(str(config.source_path), config.with_lines(problems))
    # Node sets whose names sort against their cost order: tried in name order while
    # powered down on Slurm before 23.02 (weights.name_order_warnings).
    warnings: list[str] = config.with_lines(name_order_warnings(config, slurm_version()))
    errors: list[str] = []
    if online:
        findings = check_online(config)
        warnings += config.with_lines([str(f) for f in findings if f.severity != "error"])
        errors = config.with_lines([str(f) for f in findings if f.severity == "error"])
    for warning in warnings:
        click.echo(f"slurm-spot: warning: {config.source_path}: {warning}", err=True)
    if errors:
        raise ConfigError(str(config.source_path), errors)
    summary = {
        "config": str(config.source_path),
        "cluster": config.cluster,
        "node_sets": {ns.name: ns.hostlist for ns in config.node_sets},
        "partitions": [p.name for p in config.partitions],
        "nodes": len(config.all_nodes()),
    }
    if as_json:
        print_json({"ok": True, **summary, **({"online": True} if online else {}),
                    **({"warnings": warnings} if online or warnings else {})})
    else:
        checked = " checked online" if online else ""
        click.echo(f"{config.source_path}: OK{checked} ({summary['nodes']} nodes in "
                   f"{len(config.node_sets)} node set(s), partitions: "
                   f"{', '.join(summary['partitions'])})"  # type: ignore[arg-type]
                   + (f", {len(warnings)} warning(s)" if warnings else ""))


@config_group.command("iam")
@click.option("--provider", "provider_name", default=None,
              help="Only this provider of spot.yaml (a key under 'providers:').")
@json_option
@pass_app
def iam_command(app: AppContext, provider_name: str | None, as_json: bool) -> None:
    """The permissions slurm-spot's cloud calls need: the IAM policies (AWS) for the
    controller and the checkpoint store, the permissions and roles (GCP) for the controller.
    Derived from the calls the code makes (slurm_spot/providers/*/iam.py)."""
    config = app.config
    names = list(config.providers)
    if provider_name is not None:
        if provider_name not in config.providers:
            raise BadInputError(f"--provider {provider_name}: not a provider of "
                                f"{config.source_path} (it has: "
                                f"{', '.join(sorted(config.providers))})")
        names = [provider_name]
    out = cloud_permissions(config, names)
    clouds = {name: config.providers[name].type for name in out}
    if as_json:
        print_json(out)
        return
    if not out:
        click.echo(f"{config.source_path}: no provider that needs cloud permissions (the "
                   "local provider needs none)")
    for name, grants in out.items():
        assert isinstance(grants, dict)
        for who, what in grants.items():
            click.echo(f"# {name} ({clouds[name]}), {who}: {what['attach']}")
            if what.get("policy"):
                click.echo(json.dumps(what["policy"], indent=2))
            elif what.get("custom_role"):
                click.echo(f"# gcloud iam roles create slurmSpotController --project "
                           f"{getattr(config.providers[name], 'project', 'PROJECT')} --file ROLE.yaml, "
                           f"ROLE.yaml being:")
                click.echo(yaml.safe_dump(what["custom_role"], sort_keys=False), nl=False)


def _dir_given(_ctx: click.Context, param: click.Parameter, value: str | None) -> Path | None:
    """A directory option's value as a Path; an empty one is an error (it would silently
    mean the current directory)."""
    if value is None:
        return None
    if not value.strip():
        raise click.BadParameter("empty path (leave the option out for its default)")
    return Path(value)


def _version_given(_ctx: click.Context, _param: click.Parameter,
                   value: str | None) -> SlurmVersion | None:
    """``--slurm-version``: None (detect the installed one) or a parsed release; an empty
    value is an error, not "the installed one"."""
    return None if value is None else _parse_version(value)


@click.command("render")
@click.option("--output-dir", type=click.Path(file_okay=False), default=None,
              callback=_dir_given,
              help="Write slurm-spot.conf and gres.conf here (default: print them).")
@click.option("--hooks-dir", type=click.Path(file_okay=False), default=None,
              callback=_dir_given,
              help="Where the slurm-spot-* hook executables are (default: this install's).")
@click.option("--slurm-version", "version_given", default=None, callback=_version_given,
              help="Render for this Slurm release (e.g. 23.11); default: the installed one.")
@json_option
@pass_app
def render_command(app: AppContext, output_dir: Path | None, hooks_dir: Path | None,
                   version_given: SlurmVersion | None, as_json: bool) -> None:
    """Render the slurm.conf fragment (slurm-spot.conf) and gres.conf from spot.yaml."""
    config = app.config
    problems = check_config(config)
    if problems:
        raise ConfigError(str(config.source_path), config.with_lines(problems))
    version = version_given if version_given is not None else slurm_version()
    rendered = render(config, hooks_dir=hooks_dir, version=version)
    if output_dir is None:
        if as_json:
            print_json(rendered.files)
        else:
            for name, text in sorted(rendered.files.items()):
                click.echo(f"# ===== {name} =====")
                click.echo(text, nl=False)
        return
    try:
        written = write_rendered(rendered, output_dir)
    except OSError as exc:
        raise BadInputError(f"--output-dir {output_dir}: cannot write: {exc.strerror}") from None
    if as_json:
        print_json({"written": [str(p) for p in written]})
    else:
        for path in written:
            click.echo(f"wrote {path}")
        click.echo(f"Add 'Include {output_dir / 'slurm-spot.conf'}' to slurm.conf, then "
                   "'scontrol reconfigure'.")


def _parse_version(text: str) -> SlurmVersion:
    try:
        return SlurmVersion.parse(text)
    except BadInputError as exc:
        raise click.BadParameter(str(exc), param_hint="--slurm-version") from None


COMMANDS = [config_group, render_command]
