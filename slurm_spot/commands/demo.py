"""``slurm-spot demo``: the main job, end to end, on a local spot cluster."""

from __future__ import annotations

import sys
from pathlib import Path

import click

from slurm_spot.commands.common import json_option, print_json
from slurm_spot.commands.progress import waiting
from slurm_spot.errors import BadInputError
from slurm_spot.localcluster.demo import Demo, DemoSettings, example_script, summary_lines


@click.command("demo")
@click.option("--workdir", type=click.Path(file_okay=False, path_type=Path),
              default=Path("/tmp/slurm-spot-demo"), show_default=True,
              help="Where the demo cluster's config, state, logs and checkpoints go.")
@click.option("--steps", type=click.IntRange(min=160), default=240, show_default=True,
              help="Training steps (0.25 s each): the notice comes at step 50, the kill "
                   "at least 45 steps before the end; fewer would end before the kill.")
@click.option("--keep-cluster", is_flag=True, help="Leave the local cluster running.")
@click.option("--boot-delay", "boot_delay_s", type=click.FloatRange(1, 3600), default=2.0,
              show_default=True,
              help="Simulated boot of a local node, seconds (a cloud GPU node: 60-180).")
@click.option("--notice", "notice_s", type=click.FloatRange(10, 3600), default=30.0,
              show_default=True, help="Seconds of notice before the first interruption.")
@click.option("--prewarm/--no-prewarm", default=True, show_default=True,
              help="preemption.prewarm: boot the replacement during the notice.")
@click.option("--checkpoint-root", default=None, metavar="s3://BUCKET/PREFIX",
              help="Keep the job's checkpoints in S3 (credentials: boto3's standard chain).")
@click.option("--s3-endpoint-url", default=None, help="S3 endpoint (MinIO, moto, ...).")
@click.option("--s3-addressing-style", type=click.Choice(["auto", "path", "virtual"]),
              default="auto", show_default=True)
@json_option
def demo_command(workdir: Path, steps: int, keep_cluster: bool, boot_delay_s: float,
                 notice_s: float, prewarm: bool, checkpoint_root: str | None,
                 s3_endpoint_url: str | None, s3_addressing_style: str, as_json: bool) -> None:
    """Run a 2-node torchrun job on local spot nodes, preempt it twice, watch it finish.

    The result (--json) has, per interruption, the recovery broken down into its parts
    (notice -> signal -> job exit -> requeue -> allocation -> job start -> first step) and
    whether a replacement was prewarmed."""
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
                            checkpoint_root=checkpoint_root, s3_endpoint_url=s3_endpoint_url,
                            s3_addressing_style=s3_addressing_style)

    # The demo's lines go to stdout (stderr with --json); at a terminal a spinner with the
    # latest step and the elapsed time stays below them.
    with waiting("demo: starting", err=as_json,
                 echo=lambda text: click.echo(text, err=as_json)) as shown:

        def progress(line: str) -> None:
            shown.line(line)
            if shown.live:
                shown.step(f"demo: {line.strip()[:100]}")
            (sys.stderr if as_json else sys.stdout).flush()

        result = Demo(settings, progress).run()
    if as_json:
        print_json(result)
    else:
        click.echo("")
        for line in summary_lines(result):
            click.echo(line)
    if result["state"] != "COMPLETED" or not result["exact_resume"]:
        raise SystemExit(1)


COMMANDS = [demo_command]
