"""``slurm-spot sbatch [--torchrun] [--dry-run] [sbatch options] SCRIPT [ARGS]``."""

from __future__ import annotations

import contextlib
import os
import shlex
import sys
from collections.abc import Iterator
from pathlib import Path

import click

from slurm_spot.commands.common import AppContext, pass_app, print_json
from slurm_spot.contract.sbatch_options import CommandLine, parse_command_line
from slurm_spot.errors import BadInputError
from slurm_spot.jobs.submit.sbatch import (
    JOB_ENV_OPTIONS,
    Submission,
    check_job_environment,
    plan_submission,
)
from slurm_spot.jobs.submit.torchrun_scripts import (
    check_coordinator_partition,
    check_nodes_within,
    default_rendezvous,
    elastic_script,
    hetjob_script,
    one_line,
    refuse_spot_coordinator,
    refuse_training_directives,
    split_hetjob_options,
    torchrun_script,
)
from slurm_spot.rawtext import decode
from slurm_spot.slurm.client import SlurmClient
from slurm_spot.slurm.version import SlurmVersion


def _our_options(line: CommandLine) -> dict[str, object]:
    """slurm-spot's own options from the parsed command line, checked (BadInputError names
    the option)."""
    ours = line.ours
    job_env = {JOB_ENV_OPTIONS[f"--{name}"]: str(value) for name, value in ours.items()
               if f"--{name}" in JOB_ENV_OPTIONS}
    nproc = str(ours.get("nproc-per-node", "1"))
    if not (nproc.isascii() and nproc.isdigit()) or int(nproc) < 1:
        raise BadInputError(f"--nproc-per-node={nproc}: expected a positive integer")
    elastic = None
    if "elastic" in ours:
        from slurm_spot.jobs.injob.torchrun_agent import parse_nnodes

        if not ours.get("torchrun"):
            raise BadInputError("--elastic needs --torchrun (it starts elastic torchrun agents)")
        elastic = parse_nnodes(str(ours["elastic"]))
        check_nodes_within(line.options, elastic)
    groups = None
    if "fault-tolerant" in ours:
        from slurm_spot.jobs.submit.ft_scripts import parse_groups

        if not ours.get("torchrun"):
            raise BadInputError("--fault-tolerant needs --torchrun (it submits torchft replica "
                                "groups)")
        if elastic is not None:
            raise BadInputError("--fault-tolerant and --elastic: give one (replica groups that "
                                "heal from a peer, or one elastic job)")
        groups = parse_groups(str(ours["fault-tolerant"]))
        if "coordinator-partition" not in ours:
            raise BadInputError("--fault-tolerant needs --coordinator-partition P: the on-demand "
                                "partition whose node runs the job's torchft lighthouse")
    if "no-preload" in ours and not ours.get("torchrun"):
        raise BadInputError("--no-preload is for --torchrun jobs (it changes how their "
                            "workers start)")
    for name in ("rendezvous", "join-timeout", "coordinator-partition", "no-replacements"):
        if name == "coordinator-partition" and groups is not None:
            continue
        if name in ours and elastic is None:
            raise BadInputError(f"--{name} is for elastic jobs: add --torchrun --elastic MIN:MAX")
    if "rendezvous" in ours and "coordinator-partition" in ours:
        raise BadInputError("--rendezvous and --coordinator-partition: give one (with "
                            "--coordinator-partition the store runs on the coordinator node)")
    rendezvous = None
    if "rendezvous" in ours:
        from slurm_spot.jobs.services.rendezvous import format_endpoint, parse_endpoint

        rendezvous = format_endpoint(*parse_endpoint(str(ours["rendezvous"])))
    join = str(ours.get("join-timeout", "60"))
    if not (join.isascii() and join.isdigit()) or not 1 <= int(join) <= 86400:
        raise BadInputError(f"--join-timeout={join}: expected seconds, 1..86400")
    python = str(ours.get("python", sys.executable))
    one_line("--python", python)
    return {"torchrun": bool(ours.get("torchrun")), "dry_run": bool(ours.get("dry-run")),
            "json": bool(ours.get("json")), "nproc": int(nproc),
            "python": python, "job_env": job_env,
            "elastic": elastic, "rendezvous": rendezvous, "join_timeout": int(join),
            "coordinator": ours.get("coordinator-partition"),
            "replacements": not ours.get("no-replacements"),
            "preload": not ours.get("no-preload"), "groups": groups}


class _WordsAsTyped(click.Command):
    """A command that keeps its words as typed (``ctx.meta[RAW_WORDS]``): click drops the
    first ``--`` even from UNPROCESSED arguments, so ``job.sh a -- b`` would reach the script
    as ``a b``; :func:`parse_command_line` handles ``--`` itself."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        ctx.meta[RAW_WORDS] = list(args)
        return super().parse_args(ctx, args)


#: ``ctx.meta`` key of ``slurm-spot sbatch``'s words as typed.
RAW_WORDS = "slurm_spot.sbatch.words"


@click.command("sbatch", cls=_WordsAsTyped,
               context_settings={"ignore_unknown_options": True, "allow_extra_args": True,
                                 "help_option_names": []})
@click.argument("words", nargs=-1, type=click.UNPROCESSED)
@pass_app
def sbatch_command(app: AppContext, words: tuple[str, ...]) -> None:
    """sbatch for spot nodes: adds --requeue, --open-mode=append, --signal and --nodes.

    \b
    slurm-spot sbatch [--torchrun] [--nproc-per-node N] [--dry-run] [--json]
                      [sbatch options] [--] SCRIPT [ARGS]
    slurm-spot's options and sbatch's mix in any order before SCRIPT; everything after
    SCRIPT is the script's. A long option may be abbreviated where it names one option only
    (as sbatch allows); an unknown or ambiguous one is an error (exit 2).
    --torchrun           SCRIPT is a training script: one torchrun agent per node.
    --nproc-per-node N   with --torchrun: worker processes per node (default 1; GPUs).
    --python PATH        with --torchrun: the interpreter on the nodes (default: this one).
    --elastic MIN:MAX    with --torchrun: an elastic job on MIN..MAX nodes (--no-kill, one
                         job step per node): a node that is reclaimed leaves, the others
                         re-rendezvous and continue; below MIN the job is requeued.
    --rendezvous HOST:PORT  with --elastic: the 'slurm-spot rendezvous' store (default:
                         $SLURM_SPOT_RENDEZVOUS, else the controller, port 29390).
    --join-timeout S     with --elastic: how long survivors wait for MIN nodes (default 60).
    --coordinator-partition P  with --elastic: a heterogeneous job; one node of on-demand
                         partition P runs the batch script and the rendezvous store, the
                         MIN..MAX workers run on -p's partition (not with --rendezvous).
    --fault-tolerant N   with --torchrun and --coordinator-partition P: a torchft job of N
                         replica groups (examples/train_ft.py), each a one-node requeueable
                         job NAME-g<i> on -p's partition, around a lighthouse job
                         NAME-lighthouse on one node of on-demand partition P; a group that
                         is reclaimed is requeued alone and heals from a live peer.
    --no-replacements    with --elastic: do not replace lost nodes (by default one-node
                         companion jobs, <name>+replacement, join until the job is back
                         at the node count it started with, at most MAX).
    --no-preload         with --torchrun: start each worker as a new 'python -u SCRIPT'
                         (slower: torch and the script's imports again at every start)
                         instead of forking it from a server that imported them before the
                         worker's environment (RANK, CUDA_VISIBLE_DEVICES) was set; for
                         scripts whose imports read that environment.
    --dry-run            print the final batch script and sbatch command line only.
    --json               print the job id (or, with --dry-run, script and argv) as JSON.
    --checkpoint-root s3://BUCKET/PREFIX   this job's checkpoints in S3 (not the config's root).
    --s3-endpoint-url URL, --s3-addressing-style auto|path|virtual   how to reach that S3.
    Every other option and argument goes to sbatch unchanged.
    """
    words = tuple(click.get_current_context().meta.get(RAW_WORDS, words))
    line = parse_command_line(list(words))
    ours = _our_options(line)
    job_env = check_job_environment(dict(ours["job_env"]))  # type: ignore[call-overload]
    if line.help or not words:
        click.echo(click.get_current_context().get_help())
        if not words:
            raise BadInputError("no batch script given")
        return
    config = app.config
    options, script, script_args = line.options, line.script, line.script_args
    if script is None:
        raise BadInputError("no batch script given (--wrap jobs cannot be wrapped: write a script)")
    path = Path(script)
    if not path.is_file():
        raise BadInputError(f"{script}: no such file")
    if ours["torchrun"]:
        refuse_training_directives(path)
        env = [("GLOO_SOCKET_IFNAME", one_line("$GLOO_SOCKET_IFNAME",
                                                os.environ["GLOO_SOCKET_IFNAME"]))
               ] if os.environ.get("GLOO_SOCKET_IFNAME") else []
        if ours["groups"] is not None:
            with _job_environment(job_env):
                _fault_tolerant(app, line, script, script_args, env, ours)
            return
        if ours["elastic"] is not None and ours["coordinator"] is not None:
            partition, nodes, worker_options, options = split_hetjob_options(options)
            check_coordinator_partition(SlurmClient(config.slurm_bin_dir),
                                        str(ours["coordinator"]), partition)
            refuse_spot_coordinator(config, str(ours["coordinator"]))
            text = hetjob_script(config, script, script_args, int(ours["nproc"]),  # type: ignore[call-overload]
                                 str(ours["python"]), env, ours["elastic"],  # type: ignore[arg-type]
                                 str(ours["coordinator"]), partition, nodes,
                                 int(ours["join_timeout"]),  # type: ignore[call-overload]
                                 worker_options, bool(ours["preload"]))
        elif ours["elastic"] is not None:
            endpoint = str(ours["rendezvous"]
                           or default_rendezvous(SlurmClient(config.slurm_bin_dir), os.environ))
            text = elastic_script(config, script, script_args, int(ours["nproc"]),  # type: ignore[call-overload]
                                  str(ours["python"]), env, ours["elastic"],  # type: ignore[arg-type]
                                  endpoint, int(ours["join_timeout"]),  # type: ignore[call-overload]
                                  bool(ours["replacements"]), bool(ours["preload"]))
        else:
            text = torchrun_script(config, script, script_args, int(ours["nproc"]),  # type: ignore[call-overload]
                                   str(ours["python"]), env, bool(ours["preload"]))
        script_args = []
    else:
        try:  # any bytes, as sbatch takes them (a Latin-1 comment): kept, and passed on as read
            text = decode(path.read_bytes())
        except OSError as exc:
            raise BadInputError(f"{script}: cannot be read: {exc.strerror}") from None
    slurm = SlurmVersion.detect(bin_dir=str(config.slurm_bin_dir))
    plan = plan_submission(text, path.name, options, script_args, config.preemption.signal,
                           config.preemption.lead_s, env=os.environ,
                           expedite=bool(slurm and slurm.expedited_requeue))
    for warning in plan.warnings:
        click.echo(f"slurm-spot: warning: {warning}", err=True)
    if job_env and any(o.startswith("--export") and "ALL" not in o for o in options):
        raise BadInputError("--checkpoint-root/--s3-*: the job gets them through its "
                            "environment; add ALL to --export")
    with _job_environment(job_env):
        _submit(app, plan, bool(ours["dry_run"]), bool(ours["json"]))


@contextlib.contextmanager
def _job_environment(job_env: dict[str, str]) -> Iterator[None]:
    """``job_env`` in this process's environment while sbatch runs (it exports its
    environment to the job), the environment as it was afterwards."""
    before = {k: os.environ.get(k) for k in job_env}
    os.environ.update(job_env)
    try:
        yield
    finally:
        for key, value in before.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def _fault_tolerant(app: AppContext, line: CommandLine, script: str, script_args: list[str],
                    env: list[tuple[str, str]], ours: dict[str, object]) -> None:
    """``--torchrun --fault-tolerant N`` (slurm_spot.jobs.submit.ft_scripts): print the plan
    with ``--dry-run``, else submit the lighthouse job and the N group jobs."""
    from slurm_spot.jobs.submit.ft_scripts import (
        LIGHTHOUSE_JOB_PLACEHOLDER,
        plan_fault_tolerant,
        submit_fault_tolerant,
    )

    config = app.config
    slurm = SlurmClient(config.slurm_bin_dir)
    coordinator = str(ours["coordinator"])
    check_coordinator_partition(slurm, coordinator, None)
    version = SlurmVersion.detect(bin_dir=str(config.slurm_bin_dir))
    groups = int(ours["groups"])  # type: ignore[call-overload]
    plan = plan_fault_tolerant(config, script, script_args, str(ours["python"]), env, groups,
                               coordinator, line.options, Path(script).name,
                               int(ours["nproc"]), os.environ,  # type: ignore[call-overload]
                               expedite=bool(version and version.expedited_requeue))
    refuse_spot_coordinator(config, coordinator)
    for warning in plan.warnings:
        click.echo(f"slurm-spot: warning: {warning}", err=True)
    sbatch = str(slurm.bin_dir / "sbatch")
    if ours["dry_run"]:
        jobs = [{"role": "lighthouse", "script": plan.lighthouse.script,
                 "argv": plan.lighthouse.argv("<script>", sbatch)}]
        jobs += [{"role": f"group {name}", "script": plan.group.script,
                  "argv": [sbatch, *plan.group_options(i), "<script>"]}
                 for i, name in enumerate(plan.group_names)]
        if ours["json"]:
            print_json({"jobs": jobs, "warnings": plan.warnings})
            return
        shown = ""
        for job in jobs:
            if job["script"] != shown:
                click.echo(str(job["script"]), nl=False)
                shown = str(job["script"])
            click.echo(f"# {job['role']}: " + " ".join(shlex.quote(w) for w in job["argv"]))
        click.echo(f"# {LIGHTHOUSE_JOB_PLACEHOLDER}: the lighthouse job's id, once submitted")
        return
    if not slurm.has_command("sbatch"):
        raise BadInputError(f"{sbatch}: no sbatch to submit with; --dry-run shows the jobs "
                            "without it")
    submitted = submit_fault_tolerant(slurm, plan)
    if ours["json"]:
        print_json({"job_id": submitted.lighthouse, "lighthouse_job_id": submitted.lighthouse,
                    "group_job_ids": submitted.groups, "groups": plan.group_names,
                    "warnings": plan.warnings})
    else:
        click.echo(f"Submitted lighthouse job {submitted.lighthouse} and replica group jobs "
                   f"{' '.join(submitted.groups)}")


def _submit(app: AppContext, plan: Submission, dry_run: bool, as_json: bool) -> None:
    slurm = SlurmClient(app.config.slurm_bin_dir)
    if dry_run:
        argv = plan.argv("<script>", str(slurm.bin_dir / "sbatch"))
        if as_json:
            print_json({"script": plan.script, "argv": argv, "warnings": plan.warnings})
        else:
            click.echo(plan.script, nl=False)
            click.echo("# " + " ".join(shlex.quote(w) for w in argv))
        return
    if not slurm.has_command("sbatch"):
        raise BadInputError(f"{slurm.bin_dir / 'sbatch'}: no sbatch to submit with (install "
                            "Slurm's client commands, or set slurm_bin_dir in "
                            f"{app.config.source_path}); --dry-run shows the job without it")
    proc = slurm.submit_batch(plan.script, plan.options, plan.script_args)
    if as_json:
        job = proc.stdout.strip().split()[-1].split(";")[0] if proc.stdout.strip() else ""
        print_json({"job_id": job, "argv": proc.argv, "warnings": plan.warnings})
    else:
        click.echo(proc.stdout, nl=False)
        click.echo(proc.stderr, nl=False, err=True)


COMMANDS = [sbatch_command]
