"""``slurm-spot demo``: the main job, end to end, on a local spot cluster."""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click

from slurm_spot.commands.common import json_option, print_json
from slurm_spot.commands.progress import waiting
from slurm_spot.errors import BadInputError
from slurm_spot.localcluster.demo import Demo, DemoSettings, example_script, summary_lines


class _Seconds(click.FloatRange):
    """``click.FloatRange`` that also refuses NaN (every comparison with NaN is false, so
    FloatRange lets ``nan`` through: the demo would run with a NaN notice or boot delay)."""

    def convert(self, value: Any, param: click.Parameter | None,
                ctx: click.Context | None) -> float:
        number = super().convert(value, param, ctx)
        if number != number:
            self.fail(f"{value!r} is not a number of seconds", param, ctx)
        return float(number)


@click.command("demo")
@click.option("--workdir", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="Where the demo cluster's config, state, logs and checkpoints go "
                   "[default: /tmp/slurm-spot-demo; --elastic: /tmp/slurm-spot-demo-elastic].")
@click.option("--elastic", is_flag=True,
              help="The elastic demo instead: 1 on-demand coordinator (the rendezvous) + 3 "
                   "spot workers; one reclaimed with notice, one without; the survivors go on, "
                   "replacements join, the job is never requeued.")
@click.option("--fault-tolerant", "fault_tolerant", is_flag=True,
              help="The fault-tolerant (torchft) demo instead: a lighthouse on 1 on-demand node "
                   "+ 3 replica groups on spot nodes; one reclaimed with notice, one killed "
                   "without; the others train on, each replacement heals from a live peer. "
                   "Needs the ft extra (pip install 'slurm-spot[ft]').")
@click.option("--steps", type=click.IntRange(min=160), default=None,
              help="Training steps [default: 240 (0.25 s each: the notice comes at step 50, "
                   "the kill at least 45 steps before the end; fewer would end before the "
                   "kill); --elastic: 500 (0.15 s each; at least 400, so that the second "
                   "replacement joins before the end)].")
@click.option("--keep-cluster", is_flag=True, help="Leave the local cluster running.")
@click.option("--boot-delay", "boot_delay_s", type=_Seconds(1, 3600), default=2.0,
              show_default=True,
              help="Simulated boot of a local node, seconds (a cloud GPU node: 60-180).")
@click.option("--notice", "notice_s", type=_Seconds(10, 3600), default=None,
              help="Seconds of notice before the first interruption [default: 30; "
                   "--elastic: 20].")
@click.option("--prewarm/--no-prewarm", default=True,
              help="preemption.prewarm: boot the replacement during the notice [default: on; "
                   "--elastic: off, so that the survivors train with the smaller world before "
                   "the replacement, which then needs a power-up, joins].")
@click.option("--spares", type=click.IntRange(0, 2), default=0, show_default=True,
              help="Hot spares kept powered up in the demo's node set (node_sets[].spares): "
                   "the job requeued after the kill without notice starts on one instead of "
                   "waiting for a boot. Not with --elastic/--fault-tolerant.")
@click.option("--preload/--no-preload", default=True,
              help="The job's workers start warm (forks of a server that imported torch and "
                   "the script's imports), or, --no-preload, each as a new 'python -u "
                   "SCRIPT' (slurm-spot sbatch --torchrun --no-preload) [default: warm].")
@click.option("--timeout", "timeout_s", type=_Seconds(60, 86400), default=None,
              help="Give up after this many seconds, with what the cluster's queue, nodes and "
                   "logs showed [default: 900; --elastic: 600; --fault-tolerant: 420].")
@click.option("--checkpoint-root", default=None, metavar="s3://BUCKET/PREFIX",
              help="Keep the job's checkpoints in S3 (credentials: boto3's standard chain).")
@click.option("--s3-endpoint-url", default=None, help="S3 endpoint (MinIO, moto, ...).")
@click.option("--s3-addressing-style", type=click.Choice(["auto", "path", "virtual"]),
              default="auto", show_default=True,
              help="With an s3:// --checkpoint-root: bucket in the path or in the host name "
                   "(path for most S3-compatible stores).")
@json_option
@click.pass_context
def demo_command(ctx: click.Context, elastic: bool, fault_tolerant: bool, workdir: Path | None,
                 steps: int | None, keep_cluster: bool, boot_delay_s: float,
                 notice_s: float | None, prewarm: bool, spares: int, preload: bool,
                 timeout_s: float | None, checkpoint_root: str | None, s3_endpoint_url: str | None,
                 s3_addressing_style: str, as_json: bool) -> None:
    """Run a 2-node torchrun job on local spot nodes, preempt it twice, watch it finish.

    The result (--json) has, per interruption, the recovery broken down into its parts
    (notice -> signal -> job exit -> requeue -> allocation -> job start -> first step) and
    whether a replacement was prewarmed.

    --elastic: an elastic job (--elastic 2:3) on 3 spot workers around an on-demand
    coordinator that hosts the rendezvous; one worker is reclaimed with notice, one without;
    the result has the world sizes, each interruption's and each replacement's pause, and the
    final loss against an uninterrupted reference (exit 1 if the job was requeued, did not
    complete, or the loss is off by more than the stated tolerance).

    --fault-tolerant: torchft replica groups (slurm-spot sbatch --torchrun --fault-tolerant 3);
    the result has each interruption's survivor_max_gap_s (the survivors' longest pause
    between two steps), each join's heal_s and bytes, replicas_identical and the final loss
    against a one-process reference (exit 1 unless every group COMPLETED, the replicas are
    identical, every replacement healed from a peer and the loss is within tolerance)."""
    if spares and (elastic or fault_tolerant):
        raise BadInputError("--spares goes with the plain demo only (not with --elastic or "
                            "--fault-tolerant)")
    if fault_tolerant:
        if elastic:
            raise BadInputError("--fault-tolerant and --elastic: give one")
        from click.core import ParameterSource

        if ctx.get_parameter_source("preload") not in (ParameterSource.DEFAULT, None):
            raise BadInputError("--preload/--no-preload does not go with --fault-tolerant (each "
                                "replica group starts its training as a new 'python -u')")
        _ft_demo(ctx, workdir, steps, keep_cluster, boot_delay_s, notice_s, prewarm, timeout_s,
                 as_json)
        return
    if elastic:
        from click.core import ParameterSource

        if ctx.get_parameter_source("preload") not in (ParameterSource.DEFAULT, None):
            raise BadInputError("--preload/--no-preload does not go with --elastic (the "
                                "elastic demo's workers always start warm)")
        _elastic_demo(ctx, workdir, steps, keep_cluster, boot_delay_s, notice_s, prewarm,
                      timeout_s, as_json)
        return
    workdir = workdir or Path("/tmp/slurm-spot-demo")
    from slurm_spot.localcluster.elastic_demo import check_workdir

    check_workdir(workdir)  # the plain demo's nodes keep their step sockets there too
    steps = 240 if steps is None else steps
    notice_s = 30.0 if notice_s is None else notice_s
    script = example_script()
    if not script.exists():
        raise BadInputError(f"the demo's training script is missing: {script} (reinstall "
                            "slurm-spot, or run 'make demo' in a source checkout)")
    if checkpoint_root is not None:
        import re

        from slurm_spot.config import S3_ROOT_PATTERN

        if not re.fullmatch(S3_ROOT_PATTERN, checkpoint_root):
            raise BadInputError(f"--checkpoint-root {checkpoint_root!r}: expected "
                                "s3://bucket/prefix")
    settings = DemoSettings(workdir=workdir, steps=steps, keep_cluster=keep_cluster,
                            boot_delay_s=boot_delay_s, notice_s=notice_s, prewarm=prewarm,
                            spares=spares, preload=preload, checkpoint_root=checkpoint_root,
                            s3_endpoint_url=s3_endpoint_url,
                            s3_addressing_style=s3_addressing_style)
    if timeout_s is not None:
        settings.timeout_s = timeout_s

    # The demo's lines go to stdout (stderr with --json); at a terminal a spinner with the
    # latest step and the elapsed time stays below them.
    result = _run_with_progress(lambda progress: Demo(settings, progress).run(), as_json)
    _show(result, summary_lines, as_json)
    if result["state"] != "COMPLETED" or not result["exact_resume"]:
        raise SystemExit(1)


def _show(result: dict[str, object], lines: Callable[[dict[str, object]], list[str]],
          as_json: bool) -> None:
    """Print a demo's result: its JSON with ``--json``, else a blank line and ``lines(result)``."""
    if as_json:
        print_json(result)
        return
    click.echo("")
    for line in lines(result):
        click.echo(line)


def _run_with_progress(run: Callable[[Callable[[str], None]], dict[str, object]],
                       as_json: bool) -> dict[str, object]:
    """Run a demo: its lines go to stdout (stderr with --json); at a terminal a spinner with
    the latest step and the elapsed time stays below them."""
    with waiting("demo: starting", err=as_json,
                 echo=lambda text: click.echo(text, err=as_json)) as shown:

        def progress(line: str) -> None:
            shown.line(line)
            if shown.live:
                shown.step(f"demo: {line.strip()[:100]}")
            (sys.stderr if as_json else sys.stdout).flush()

        return run(progress)


#: Options of the plain demo that the elastic one refuses (its checkpoints stay local: the
#: reclaimed ranks save on the shared local disk the survivors read).
_NOT_ELASTIC = ("checkpoint_root", "s3_endpoint_url", "s3_addressing_style")


def _elastic_demo(ctx: click.Context, workdir: Path | None, steps: int | None,
                  keep_cluster: bool, boot_delay_s: float, notice_s: float | None,
                  prewarm: bool, timeout_s: float | None, as_json: bool) -> None:
    """``demo --elastic`` (slurm_spot.localcluster.elastic_demo).

    Raises:
        BadInputError: an option of the plain demo only, --steps under 400, a --workdir too
            long for the local nodes' sockets.
    """
    from click.core import ParameterSource

    from slurm_spot.localcluster.elastic_demo import ElasticDemo, ElasticDemoSettings
    from slurm_spot.localcluster.elastic_report import summary_lines as elastic_lines
    from slurm_spot.localcluster.elastic_report import verdict

    for name in _NOT_ELASTIC:
        if ctx.get_parameter_source(name) not in (ParameterSource.DEFAULT, None):
            raise BadInputError(f"--{name.replace('_', '-')} does not go with --elastic: the "
                                "elastic demo keeps its checkpoints on the local cluster's disk")
    if steps is not None and steps < 400:
        raise BadInputError(f"--steps {steps} with --elastic: at least 400 (the second "
                            "replacement must join before training ends)")
    if ctx.get_parameter_source("prewarm") in (ParameterSource.DEFAULT, None):
        prewarm = False
    settings = ElasticDemoSettings(keep_cluster=keep_cluster, boot_delay_s=boot_delay_s,
                                   prewarm=prewarm)
    _run_demo("--elastic", settings, ElasticDemo, elastic_lines, verdict, workdir, steps,
              notice_s, timeout_s, as_json)


def _ft_demo(ctx: click.Context, workdir: Path | None, steps: int | None, keep_cluster: bool,
             boot_delay_s: float, notice_s: float | None, prewarm: bool, timeout_s: float | None,
             as_json: bool) -> None:
    """``demo --fault-tolerant`` (slurm_spot.localcluster.ft_demo).

    Raises:
        BadInputError: an option of the plain demo only, a --workdir too long for the local
            nodes' sockets, torchft not installed.
    """
    from click.core import ParameterSource

    from slurm_spot.jobs.services.ft_lighthouse import import_torchft_lighthouse
    from slurm_spot.localcluster.ft_demo import FtDemo, FtDemoSettings, summary_lines, verdict

    for name in _NOT_ELASTIC:
        if ctx.get_parameter_source(name) not in (ParameterSource.DEFAULT, None):
            raise BadInputError(f"--{name.replace('_', '-')} does not go with --fault-tolerant: "
                                "the demo keeps its checkpoints on the local cluster's disk")
    import_torchft_lighthouse()  # TorchftMissingError (exit 2) says how to install it
    settings = FtDemoSettings(keep_cluster=keep_cluster, boot_delay_s=boot_delay_s,
                              prewarm=prewarm)
    _run_demo("--fault-tolerant", settings, FtDemo, summary_lines, verdict, workdir, steps,
              notice_s, timeout_s, as_json)


def _run_demo(mode: str, settings: Any, demo: Any, lines: Callable[[dict], list[str]],
              verdict: Callable[[dict], list[str]], workdir: Path | None, steps: int | None,
              notice_s: float | None, timeout_s: float | None, as_json: bool) -> None:
    """Run the ``demo MODE`` on the local cluster: ``settings`` (a settings dataclass with
    ``workdir``, ``steps``, ``notice_s``, ``timeout_s``) updated from the options, ``demo(settings,
    progress).run()``, its result shown with ``lines`` (or as JSON), exit 1 with ``verdict``'s
    problems.

    Raises:
        BadInputError: a --workdir too long for the local nodes' sockets.
    """
    from slurm_spot.localcluster.elastic_demo import check_workdir

    if workdir is not None:
        settings.workdir = workdir
    check_workdir(settings.workdir)
    if steps is not None:
        settings.steps = steps
    if notice_s is not None:
        settings.notice_s = notice_s
    if timeout_s is not None:
        settings.timeout_s = timeout_s
    result = _run_with_progress(lambda progress: demo(settings, progress).run(), as_json)
    _show(result, lines, as_json)
    problems = verdict(result)
    if problems:
        click.echo(f"demo {mode} failed: {'; '.join(problems)}", err=True)
        raise SystemExit(1)


COMMANDS = [demo_command]
