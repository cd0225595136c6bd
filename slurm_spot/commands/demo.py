"""``slurm-spot demo``: the main job, end to end, on a local spot cluster."""

from __future__ import annotations

import sys
from pathlib import Path

import click

from slurm_spot.commands.common import json_option, print_json
from slurm_spot.errors import BadInputError
from slurm_spot.localcluster.demo import Demo, DemoSettings, example_script, summary_lines


@click.command("demo")
@click.option("--workdir", type=click.Path(file_okay=False, path_type=Path),
              default=Path("/tmp/slurm-spot-demo"), show_default=True,
              help="Where the demo cluster's config, state, logs and checkpoints go.")
@click.option("--steps", type=click.IntRange(min=100), default=240, show_default=True,
              help="Training steps.")
@click.option("--keep-cluster", is_flag=True, help="Leave the local cluster running.")
@json_option
def demo_command(workdir: Path, steps: int, keep_cluster: bool, as_json: bool) -> None:
    """Run a 2-node torchrun job on local spot nodes, preempt it twice, watch it finish."""
    script = example_script()
    if not script.exists():
        raise BadInputError(f"the demo's training script is missing: {script} (reinstall "
                            "slurm-spot, or run 'make demo' in a source checkout)")
    settings = DemoSettings(workdir=workdir, steps=steps, keep_cluster=keep_cluster)

    def progress(line: str) -> None:
        click.echo(line, err=as_json)
        sys.stderr.flush()

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
