"""``slurm-spot resume|suspend|resume-fail HOSTLIST``: the power-saving hooks.

slurmctld runs them as the ``slurm-spot-*`` entry points (``--detach``): the hook validates its
input, copies ``SLURM_RESUME_FILE`` (a /proc fd path that vanishes with the hook), then
returns at once while a detached child does the slow work (Slurm 23.02+ kills the hook's
process group at ResumeTimeout) and logs to ``<log_dir>/hooks.log``.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence

import click

from slurm_spot.commands.common import AppContext, json_option, pass_app, print_json
from slurm_spot.hooks import power_action, run_detached
from slurm_spot.hostlist import expand
from slurm_spot.lifecycle import power
from slurm_spot.slurm.resume_file import read_resume_file

log = logging.getLogger("slurm_spot.hooks")


def _run_hook(app: AppContext, name: str, hostlist: str, detach: bool, as_json: bool,
              jobs: Mapping[int, Sequence[str]] | None = None) -> None:
    config = app.config
    action = power_action(config, name, hostlist, jobs)
    if detach:
        run_detached(config, name, hostlist, action)
        return
    power.group_by_node_set(config, hostlist)  # validate first: exit 2 on bad input
    result = action()
    for failure in result.failed:
        log.warning("%s: %s", ",".join(failure.nodes), failure.reason)
    for error in result.errors:
        log.error("%s", error)
    if as_json:
        print_json(result.to_json())
    else:
        for inst in result.launched:
            click.echo(f"launched {inst.node} {inst.instance_id} ({inst.market}, {inst.zone})")
        for inst in result.terminated:
            click.echo(f"terminated {inst.node} {inst.instance_id}")
        for failure in result.failed:
            click.echo(f"failed {','.join(failure.nodes)} {failure.reason}", err=True)
        if not (result.launched or result.terminated or result.failed):
            click.echo(f"nothing to do for {len(expand(hostlist))} node(s)")
    for error in result.errors:
        click.echo(f"slurm-spot: error: {error}", err=True)
    if result.errors:
        raise SystemExit(1)


_detach_option = click.option(
    "--detach", is_flag=True,
    help="Return at once and do the work in a detached process (how slurmctld runs hooks).")


def _hook_command(name: str) -> Callable[[Callable[..., None]], click.Command]:
    """``@click.command(name)`` of a power-saving hook: the decorated function gets the app
    context, then HOSTLIST, ``--detach`` and ``--json`` (``detach``, ``as_json``)."""
    def command(func: Callable[..., None]) -> click.Command:
        return click.command(name)(click.argument("hostlist")(
            _detach_option(json_option(pass_app(func)))))

    return command


@_hook_command("resume")
def resume_command(app: AppContext, hostlist: str, detach: bool, as_json: bool) -> None:
    """ResumeProgram: launch instances for HOSTLIST such as 'gpu-[1-4]'.

    SLURM_RESUME_FILE (set by slurmctld) is read first, while it exists: with
    power.all_or_nothing, a job that cannot get all its nodes has the launched ones given back;
    a job whose nodes got no capacity runs on another node set at once (slurm_spot.lifecycle.failover).
    """
    _run_hook(app, "resume", hostlist, detach, as_json, read_resume_file())


@_hook_command("suspend")
def suspend_command(app: AppContext, hostlist: str, detach: bool, as_json: bool) -> None:
    """SuspendProgram: terminate the instances behind HOSTLIST (idempotent)."""
    _run_hook(app, "suspend", hostlist, detach, as_json)


@_hook_command("resume-fail")
def resume_fail_command(app: AppContext, hostlist: str, detach: bool, as_json: bool) -> None:
    """ResumeFailProgram: terminate what is behind nodes that failed to resume (idempotent)."""
    _run_hook(app, "resume-fail", hostlist, detach, as_json)


COMMANDS = [resume_command, suspend_command, resume_fail_command]
