"""``slurm-spot reconcile [--once] [--json]``: the controller loop (docs/DESIGN.md flow 6)."""

from __future__ import annotations

import logging
import os
import sysconfig
from pathlib import Path

import click

from slurm_spot import __version__
from slurm_spot.commands.common import AppContext, json_option, pass_app, print_json
from slurm_spot.config import SpotConfig, check_listen_address
from slurm_spot.errors import BadInputError
from slurm_spot.providers import get_provider
from slurm_spot.reconcile.loop import ConfigSource, Loop, single_instance, summarize
from slurm_spot.reconcile.metrics import ReconcileMetrics
from slurm_spot.reconcile.reconciler import PassResult, Reconciler
from slurm_spot.slurm.client import SlurmClient

log = logging.getLogger("slurm_spot.reconcile.reconciler")
UNIT_NAME = "slurm-spot-reconcile"


def render_unit(
    config: SpotConfig,
    scripts_dir: Path | None = None,
    slurm_conf: str | None = None,
    metrics_port: int | None = None,
    user: str = "root",
    metrics_addr: str | None = None,
) -> str:
    """The systemd unit that runs the reconciler for ``config`` (pure: writes nothing).

    ``slurm_conf`` defaults to ``$SLURM_CONF``, else ``slurm.conf`` beside spot.yaml if that
    is not the default ``/etc/slurm/slurm.conf``.
    """
    from slurm_spot.render import systemd_unit

    if slurm_conf is None:
        beside = config.source_path.parent / "slurm.conf"
        slurm_conf = os.environ.get("SLURM_CONF") or (
            str(beside) if beside.exists() and str(beside) != "/etc/slurm/slurm.conf" else "")
    folder = scripts_dir or Path(sysconfig.get_path("scripts"))
    port = f" --metrics-port {metrics_port}" if metrics_port else ""
    port += f" --metrics-addr {metrics_addr}" if metrics_addr else ""
    return systemd_unit(
        UNIT_NAME,
        header=f"Managed by slurm-spot ({__version__}): `slurm-spot reconcile --systemd-unit` "
               f"for {config.source_path}.\nInstall as /etc/systemd/system/{UNIT_NAME}.service "
               f"on the Slurm controller, then\n  systemctl daemon-reload && systemctl enable "
               f"--now {UNIT_NAME}",
        exec_start=f"{folder / 'slurm-spot'} --config {config.source_path} reconcile{port}",
        user=user, environment={"SLURM_CONF": slurm_conf} if slurm_conf else {},
        write_paths=[config.state_dir, config.log_dir,
                     *([config.reconcile.metrics_file.parent] if config.reconcile.metrics_file
                       else [])])


def _print_pass(result: PassResult, as_json: bool) -> None:
    if as_json:
        print_json(result.to_json())
        return
    for action in result.actions:
        jobs = ",".join(str(j) for j in action.get("job_ids", ()) or ())  # type: ignore[attr-defined]
        click.echo(" ".join(str(x) for x in (
            action.get("action"), action.get("node") or "-", action.get("instance") or "-",
            f"jobs={jobs}" if jobs else "", action.get("reason") or "") if x != ""))
    for error in result.errors:
        click.echo(f"slurm-spot: error: {error}", err=True)
    click.echo(summarize(result))


def _listen_address(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    if value is None:
        return None
    try:
        return check_listen_address(value)
    except ValueError as exc:
        raise click.BadParameter(str(exc)) from None


@click.command("reconcile")
@click.option("--once", is_flag=True,
              help="Run one pass and exit (exit code 1 if an action or a listing failed).")
@click.option("--metrics-port", type=click.IntRange(1, 65535), default=None,
              help="Also serve Prometheus metrics over HTTP on this port "
                   "[default: reconcile.metrics_port; unset: none].")
@click.option("--metrics-addr", callback=_listen_address, default=None, metavar="ADDRESS",
              help="Address the metrics endpoint listens on: 0.0.0.0 or :: for every "
                   "interface [default: reconcile.metrics_addr, 127.0.0.1].")
@click.option("--systemd-unit", is_flag=True,
              help="Print the systemd unit that runs this reconciler, and exit.")
@json_option
@pass_app
def reconcile_command(app: AppContext, once: bool, metrics_port: int | None,
                      metrics_addr: str | None, systemd_unit: bool, as_json: bool) -> None:
    """Compare Slurm's cloud nodes with the providers' instances and repair the difference.

    Reclaimed instances: node powered down, jobs requeued at once. Orphan instances:
    terminated after reconcile.orphan_grace_s. Failed resumes: nodes back to idle~. Capacity
    failures: node set cooled down. Runs every reconcile.interval_s until SIGTERM, and at once
    when a provider's event (EC2 via providers.<name>.events_queue_url, GCE preemption
    operations) says an instance ended; one at a time (lock in state_dir); every action is an
    event ('slurm-spot events').
    """
    config = app.config
    if systemd_unit:
        click.echo(render_unit(config, metrics_port=metrics_port, metrics_addr=metrics_addr),
                   nl=False)
        return
    port = metrics_port or config.reconcile.metrics_port
    addr = metrics_addr or config.reconcile.metrics_addr
    with single_instance(config.state_dir):
        metrics = ReconcileMetrics()
        if port is not None:
            where = "--metrics-port" if metrics_port else "reconcile.metrics_port"
            shown = f"[{addr}]" if ":" in addr else addr
            try:
                metrics.serve(port, addr)
            except OSError as exc:  # EADDRINUSE, EACCES, EADDRNOTAVAIL: the operator's choice
                raise BadInputError(
                    f"{where} {port}: cannot listen on {shown}:{port}: "
                    f"{exc.strerror or exc}; pick a free port and an address of this host "
                    f"(see 'ss -ltnp sport = :{port}')") from None

        def make(cfg: SpotConfig) -> Reconciler:
            return Reconciler(cfg, SlurmClient(cfg.slurm_bin_dir), providers=get_provider,
                              metrics=metrics)

        if once:
            result = make(config).run_pass()
            _print_pass(result, as_json)
            if result.errors:
                raise SystemExit(1)
            return
        package_log = logging.getLogger("slurm_spot")
        if package_log.getEffectiveLevel() > logging.INFO:
            package_log.setLevel(logging.INFO)
        from slurm_spot.providers.events import event_sources

        loop = Loop(ConfigSource(config), make, events=event_sources)
        loop.install_signals()
        log.info("reconciling %s every %g s (pid %d)", config.source_path,
                 config.reconcile.interval_s, os.getpid())
        loop.run()
        log.info("stopped")


COMMANDS = [reconcile_command]
