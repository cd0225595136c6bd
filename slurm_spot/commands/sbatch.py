"""``slurm-spot sbatch [--torchrun] [--dry-run] [sbatch options] SCRIPT [ARGS]``."""

from __future__ import annotations

import os
import shlex
import sys
import tempfile
from pathlib import Path

import click

from slurm_spot import __version__
from slurm_spot.commands.common import AppContext, pass_app, print_json
from slurm_spot.config import SpotConfig
from slurm_spot.errors import BadInputError, SlurmCommandError
from slurm_spot.jobs.sbatch import Submission, plan_submission, split_command_line
from slurm_spot.render import render_template
from slurm_spot.slurm.client import run_command


def torchrun_script(config: SpotConfig, script: str, args: list[str], nproc_per_node: int,
                    python: str, env: list[tuple[str, str]]) -> str:
    """The batch script that starts one torchrun agent per node for ``script`` (pure)."""
    command = " ".join(shlex.quote(w) for w in [str(Path(script).absolute()), *args])
    return render_template("torchrun-batch.sh.j2",
        version=__version__, python=shlex.quote(python),
        nproc_per_node=nproc_per_node, command=command,
        requeue_exit_code=config.preemption.requeue_exit_code,
        env=[(k, shlex.quote(v)) for k, v in env],
    )


def _our_options(words: list[str]) -> tuple[dict[str, object], list[str]]:
    ours: dict[str, object] = {"torchrun": False, "dry_run": False, "nproc": 1, "json": False,
                               "python": sys.executable}
    rest: list[str] = []
    i = 0
    while i < len(words):
        word = words[i]
        if word in ("--torchrun", "--dry-run", "--json"):
            ours[word[2:].replace("-", "_")] = True
        elif word.startswith("--nproc-per-node") or word.startswith("--python"):
            key, _, value = word.partition("=")
            if not value:
                if i + 1 >= len(words):
                    raise BadInputError(f"{key} needs a value")
                value = words[i + 1]
                i += 1
            if key == "--python":
                ours["python"] = value
            elif not value.isdigit() or int(value) < 1:
                raise BadInputError(f"--nproc-per-node={value}: expected a positive integer")
            else:
                ours["nproc"] = int(value)
        elif not word.startswith("-") or word == "--":
            rest.extend(words[i:])
            break
        else:
            rest.append(word)
        i += 1
    return ours, rest


@click.command("sbatch", context_settings={"ignore_unknown_options": True,
                                           "allow_extra_args": True, "help_option_names": []})
@click.argument("words", nargs=-1, type=click.UNPROCESSED)
@pass_app
def sbatch_command(app: AppContext, words: tuple[str, ...]) -> None:
    """sbatch for spot nodes: adds --requeue, --open-mode=append, --signal and --nodes.

    \b
    slurm-spot sbatch [--torchrun] [--nproc-per-node N] [--dry-run] [--json]
                      [sbatch options] SCRIPT [ARGS]
    --torchrun           SCRIPT is a training script: one torchrun agent per node.
    --nproc-per-node N   with --torchrun: worker processes per node (default 1; GPUs).
    --python PATH        with --torchrun: the interpreter on the nodes (default: this one).
    --dry-run            print the final batch script and sbatch command line only.
    --json               print the job id (or, with --dry-run, script and argv) as JSON.
    Every other option and argument goes to sbatch unchanged.
    """
    ours, rest = _our_options(list(words))
    if rest[:1] in (["-h"], ["--help"]) or not rest:
        click.echo(click.get_current_context().get_help())
        if not rest:
            raise BadInputError("no batch script given")
        return
    config = app.config
    options, script, script_args = split_command_line(rest)
    if script is None:
        raise BadInputError("no batch script given (--wrap jobs cannot be wrapped: write a script)")
    path = Path(script)
    if not path.is_file():
        raise BadInputError(f"{script}: no such file")
    if ours["torchrun"]:
        env = [("GLOO_SOCKET_IFNAME", os.environ["GLOO_SOCKET_IFNAME"])] if os.environ.get(
            "GLOO_SOCKET_IFNAME") else []
        text = torchrun_script(config, script, script_args, int(ours["nproc"]),  # type: ignore[call-overload]
                               str(ours["python"]), env)
        script_args = []
    else:
        try:
            text = path.read_text()
        except UnicodeDecodeError:
            raise BadInputError(f"{script}: not a text file (UTF-8)") from None
    plan = plan_submission(text, path.name, options, script_args, config.preemption.signal,
                           config.preemption.lead_s, env=os.environ)
    for warning in plan.warnings:
        click.echo(f"slurm-spot: warning: {warning}", err=True)
    _submit(app, plan, bool(ours["dry_run"]), bool(ours["json"]))


def _submit(app: AppContext, plan: Submission, dry_run: bool, as_json: bool) -> None:
    sbatch = str(app.config.slurm_bin_dir / "sbatch")
    if dry_run:
        argv = plan.argv("<script>", sbatch)
        if as_json:
            print_json({"script": plan.script, "argv": argv, "warnings": plan.warnings})
        else:
            click.echo(plan.script, nl=False)
            click.echo("# " + " ".join(shlex.quote(w) for w in argv))
        return
    with tempfile.TemporaryDirectory(prefix="slurm-spot-sbatch-") as folder:
        script_path = Path(folder) / "batch.sh"
        script_path.write_text(plan.script)
        argv = plan.argv(str(script_path), sbatch)
        proc = run_command(argv, 60)
    if proc.returncode != 0:
        raise SlurmCommandError(argv, proc.returncode, proc.stderr or proc.stdout)
    if as_json:
        job = proc.stdout.strip().split()[-1].split(";")[0] if proc.stdout.strip() else ""
        print_json({"job_id": job, "argv": argv, "warnings": plan.warnings})
    else:
        click.echo(proc.stdout, nl=False)
        click.echo(proc.stderr, nl=False, err=True)


COMMANDS = [sbatch_command]
