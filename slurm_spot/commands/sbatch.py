"""``slurm-spot sbatch [--torchrun] [--dry-run] [sbatch options] SCRIPT [ARGS]``."""

from __future__ import annotations

import os
import shlex
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

import click

from slurm_spot import __version__
from slurm_spot.commands.common import AppContext, pass_app, print_json
from slurm_spot.config import SpotConfig
from slurm_spot.errors import BadInputError, SlurmCommandError
from slurm_spot.jobs.contract import (
    ELASTIC_MARK,
    ENV_CHECKPOINT_ROOT,
    ENV_RENDEZVOUS,
    ENV_S3_ADDRESSING_STYLE,
    ENV_S3_ENDPOINT_URL,
)
from slurm_spot.jobs.submit.sbatch import Submission, plan_submission
from slurm_spot.jobs.submit.sbatch_options import CommandLine, parse_command_line
from slurm_spot.render import render_template
from slurm_spot.slurm.client import run_command
from slurm_spot.slurm.version import SlurmVersion


def torchrun_script(config: SpotConfig, script: str, args: list[str], nproc_per_node: int,
                    python: str, env: list[tuple[str, str]]) -> str:
    """The batch script that starts one torchrun agent per node for ``script`` (pure)."""
    return render_template("torchrun-batch.sh.j2",
                           **_torchrun_fields(config, script, args, nproc_per_node, python, env))


def _torchrun_fields(config: SpotConfig, script: str, args: list[str], nproc_per_node: int,
                     python: str, env: list[tuple[str, str]]) -> dict[str, object]:
    """The template fields both torchrun batch scripts share, shell-quoted."""
    command = " ".join(shlex.quote(w) for w in [str(Path(script).absolute()), *args])
    return {"version": __version__, "python": shlex.quote(python), "elastic_mark": ELASTIC_MARK,
            "nproc_per_node": nproc_per_node, "command": command,
            "requeue_exit_code": config.preemption.requeue_exit_code,
            "env": [(k, shlex.quote(v)) for k, v in env]}


def elastic_script(config: SpotConfig, script: str, args: list[str], nproc_per_node: int,
                   python: str, env: list[tuple[str, str]], nodes: tuple[int, int],
                   endpoint: str, join_timeout_s: int, replacements: bool = True,
                   preload: bool = True) -> str:
    """The batch script of an elastic torchrun job: one job step (one agent) per node,
    ``--no-kill``, ``--nodes=MIN-MAX`` (pure). An agent told to leave exits 128 + the
    preemption signal (``preemption.signal``, slurm_spot.jobs.injob.torchrun_agent); when every
    agent did, the script exits with the requeue code, as below MIN nodes. With
    ``replacements``, lost nodes are replaced by one-node companion jobs that join the
    rendezvous (slurm_spot.jobs.injob.elastic_replacement; their ``--signal`` is
    ``preemption.signal@preemption.lead_s``, as the job's). ``preload`` False: the agents
    get ``--no-preload`` (workers start as ``python -u SCRIPT``, not warm:
    :mod:`slurm_spot.jobs.injob.warm_worker`).

    Raises:
        BadInputError: ``endpoint`` or ``python`` is not one line.
    """
    from slurm_spot.jobs.injob.jobenv import parse_signal

    preempt = parse_signal(config.preemption.signal)
    _one_line("--rendezvous", endpoint)
    _one_line("--python", python)
    return render_template("torchrun-elastic-batch.sh.j2",
        **_torchrun_fields(config, script, args, nproc_per_node, python, env),
        min_nodes=nodes[0], max_nodes=nodes[1], endpoint=shlex.quote(endpoint),
        join_timeout_s=join_timeout_s, signal_name=preempt.name,
        signalled_exit_code=128 + preempt.number, replacements=replacements,
        companion_signal=shlex.quote(f"{preempt.name}@{config.preemption.lead_s}"),
        preload=preload,
    )


def hetjob_script(config: SpotConfig, script: str, args: list[str], nproc_per_node: int,
                  python: str, env: list[tuple[str, str]], nodes: tuple[int, int],
                  coordinator_partition: str, partition: str | None, worker_nodes: str | None,
                  join_timeout_s: int, worker_options: Sequence[str] = (),
                  preload: bool = True) -> str:
    """The batch script of an elastic torchrun job with an on-demand coordinator (pure): a
    heterogeneous job (sbatch(1), ``#SBATCH hetjob``; Slurm 17.11+) whose component 0 is one
    node of ``coordinator_partition``, which runs the script and hosts the rendezvous store
    there (``slurm-spot rendezvous`` at its NodeAddr, port
    :data:`~slurm_spot.jobs.services.rendezvous.HETJOB_PORT_BASE` + job id % 1000), and whose
    component 1 is the workers on ``partition`` (None: the default partition),
    ``worker_nodes`` of them (None: ``MIN-MAX``), ``--no-kill``, one job step (one agent)
    per node (``srun --het-group=1 --nodelist=<node>``), each with ``worker_options`` (sbatch
    options, shell-quoted: what a worker node needs). The agents' wait loop, exit codes and
    ``preload`` are :func:`elastic_script`'s.

    Raises:
        BadInputError: a partition or ``python`` is not one line.
    """
    from slurm_spot.jobs.injob.jobenv import parse_signal
    from slurm_spot.jobs.services.rendezvous import HETJOB_PORT_BASE

    preempt = parse_signal(config.preemption.signal)
    _one_line("--coordinator-partition", coordinator_partition)
    _one_line("--partition", partition or "")
    _one_line("--python", python)
    return render_template("torchrun-elastic-hetjob.sh.j2",
        **_torchrun_fields(config, script, args, nproc_per_node, python, env),
        min_nodes=nodes[0], max_nodes=nodes[1], join_timeout_s=join_timeout_s,
        signal_name=preempt.name, signalled_exit_code=128 + preempt.number,
        coordinator_partition=coordinator_partition, partition=partition,
        worker_nodes=worker_nodes or f"{nodes[0]}-{nodes[1]}", port_base=HETJOB_PORT_BASE,
        worker_options=list(worker_options), preload=preload,
    )


def check_coordinator_partition(config: SpotConfig, coordinator: str,
                                 partition: str | None) -> None:
    """``--coordinator-partition P`` must name a partition Slurm has (``scontrol show
    partition P``; skipped where there is no scontrol, as for a ``--dry-run`` elsewhere) and
    not the workers' (``-p``).

    Raises:
        BadInputError: P is the workers' partition, or Slurm does not know it.
    """
    import re

    if not re.fullmatch(r"[A-Za-z0-9._-]+", coordinator):
        raise BadInputError(f"--coordinator-partition={coordinator!r}: not a partition name")
    if partition is not None and coordinator == partition:
        raise BadInputError(f"--coordinator-partition={coordinator} is also the workers' "
                            "partition (-p): the coordinator belongs on an on-demand partition "
                            "of its own")
    scontrol = str(config.slurm_bin_dir / "scontrol")
    if not os.access(scontrol, os.X_OK):
        return
    proc = run_command([scontrol, "-o", "show", "partition", coordinator], 30)
    if proc.returncode != 0 or f"PartitionName={coordinator} " not in proc.stdout + " ":
        raise BadInputError(f"--coordinator-partition={coordinator}: Slurm has no such "
                            "partition (scontrol show partition)")


def default_rendezvous(config: SpotConfig) -> str:
    """Where elastic jobs rendezvous unless ``--rendezvous`` says: ``$SLURM_SPOT_RENDEZVOUS``
    (checked as ``--rendezvous`` is; set but empty is an error too), else the controller
    (``SlurmctldHost``'s address, else its name, from ``scontrol show config``) at
    :data:`~slurm_spot.jobs.services.rendezvous.DEFAULT_PORT`.

    Raises:
        BadInputError: neither is known, or scontrol cannot be run (names --rendezvous);
            ``$SLURM_SPOT_RENDEZVOUS`` is no HOST:PORT (names the variable).
    """
    import re

    from slurm_spot.jobs.services.rendezvous import (
        DEFAULT_PORT,
        format_endpoint,
        parse_endpoint,
        parse_host,
    )

    if ENV_RENDEZVOUS in os.environ:
        return format_endpoint(*parse_endpoint(os.environ[ENV_RENDEZVOUS], f"${ENV_RENDEZVOUS}"))
    try:
        proc = run_command([str(config.slurm_bin_dir / "scontrol"), "show", "config"], 30)
    except SlurmCommandError as exc:  # no scontrol here (a --dry-run off the cluster)
        raise BadInputError(f"--elastic: cannot tell where the controller is ({exc}); give "
                            "--rendezvous HOST:PORT (slurm-spot rendezvous)") from None
    found = re.search(r"^SlurmctldHost\[0\]\s*=\s*([^\s(]+)(?:\(([^)]+)\))?", proc.stdout,
                      re.MULTILINE) if proc.returncode == 0 else None
    if found is None:
        raise BadInputError("--elastic: cannot tell where the controller is (scontrol show "
                            "config); give --rendezvous HOST:PORT (slurm-spot rendezvous)")
    host = parse_host(found.group(2) or found.group(1), "SlurmctldHost (scontrol show config); "
                      "give --rendezvous HOST:PORT instead")
    return format_endpoint(host, DEFAULT_PORT)


#: Per-job checkpoint settings: passed to the job in its environment (sbatch's default
#: --export=ALL), read by the TaskProlog (slurm_spot.jobs.node.prolog.checkpoint_root).
_JOB_ENV_OPTIONS = {"--checkpoint-root": ENV_CHECKPOINT_ROOT,
                    "--s3-endpoint-url": ENV_S3_ENDPOINT_URL,
                    "--s3-addressing-style": ENV_S3_ADDRESSING_STYLE}


def _job_env(values: dict[str, str]) -> dict[str, str]:
    """Validate the per-job checkpoint settings (BadInputError names the option)."""
    import re

    from slurm_spot.config import S3_ROOT_PATTERN

    names = {v: k for k, v in _JOB_ENV_OPTIONS.items()}
    for var, value in values.items():
        option = names[var]
        if any(c in value for c in "\n\r"):
            raise BadInputError(f"{option}: the value must be one line")
        if var == ENV_CHECKPOINT_ROOT and not re.fullmatch(S3_ROOT_PATTERN, value):
            raise BadInputError(f"{option}={value!r}: expected s3://bucket/prefix (a job may "
                                "choose an S3 root; directory roots are the admin's)")
        if var == ENV_S3_ENDPOINT_URL and not re.fullmatch(r"https?://\S+", value):
            raise BadInputError(f"{option}={value!r}: expected an http(s):// URL")
        if var == ENV_S3_ADDRESSING_STYLE and value not in ("auto", "path", "virtual"):
            raise BadInputError(f"{option}={value!r}: expected auto, path or virtual")
    return values


def _one_line(where: str, value: str) -> str:
    """``value`` if it has no line break (a value rendered into the batch script must not
    start a line of its own there).

    Raises:
        BadInputError: it has one (names ``where``).
    """
    if any(c in value for c in "\n\r\x0b\x0c\x1c\x1d\x1e\x85\u2028\u2029"):
        raise BadInputError(f"{where}={value!r}: the value must be one line")
    return value


def _check_nodes_within(options: list[str], elastic: tuple[int, int]) -> None:
    """An ``-N``/``--nodes`` given with ``--elastic MIN:MAX`` must lie within MIN..MAX: sbatch's
    -N replaces the script's ``--nodes=MIN-MAX``, and a job given fewer than MIN nodes can
    never form its rendezvous (it would be requeued forever); nodes beyond MAX get no rank.

    Raises:
        BadInputError: it does not, or it is not ``N`` or ``A-B`` (names both options).
    """
    from slurm_spot.jobs.submit.sbatch import option_values

    low, high = elastic
    for value in option_values(options, "--nodes", "-N"):
        first, sep, last = value.partition("-")
        last = last if sep else first
        if not (first.isascii() and first.isdigit() and last.isascii() and last.isdigit()):
            raise BadInputError(f"--nodes/-N {value!r} with --elastic {low}:{high}: expected "
                                f"N or A-B within {low}..{high} (or leave -N out)")
        if not low <= int(first) <= int(last) <= high:
            raise BadInputError(f"--nodes/-N {value} is outside --elastic {low}:{high}: the "
                                f"job needs {low} to {high} nodes (leave -N out, or give a "
                                f"count within {low}..{high})")


def _our_options(line: CommandLine) -> dict[str, object]:
    """slurm-spot's own options from the parsed command line, checked (BadInputError names
    the option)."""
    ours = line.ours
    job_env = {_JOB_ENV_OPTIONS[f"--{name}"]: str(value) for name, value in ours.items()
               if f"--{name}" in _JOB_ENV_OPTIONS}
    nproc = str(ours.get("nproc-per-node", "1"))
    if not (nproc.isascii() and nproc.isdigit()) or int(nproc) < 1:
        raise BadInputError(f"--nproc-per-node={nproc}: expected a positive integer")
    elastic = None
    if "elastic" in ours:
        from slurm_spot.jobs.injob.torchrun_agent import parse_nnodes

        if not ours.get("torchrun"):
            raise BadInputError("--elastic needs --torchrun (it starts elastic torchrun agents)")
        elastic = parse_nnodes(str(ours["elastic"]))
        _check_nodes_within(line.options, elastic)
    for name in ("rendezvous", "join-timeout", "coordinator-partition", "no-replacements",
                 "no-preload"):
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
    _one_line("--python", python)
    return {"torchrun": bool(ours.get("torchrun")), "dry_run": bool(ours.get("dry-run")),
            "json": bool(ours.get("json")), "nproc": int(nproc),
            "python": python, "job_env": job_env,
            "elastic": elastic, "rendezvous": rendezvous, "join_timeout": int(join),
            "coordinator": ours.get("coordinator-partition"),
            "replacements": not ours.get("no-replacements"),
            "preload": not ours.get("no-preload")}


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
    --no-replacements    with --elastic: do not replace lost nodes (by default one-node
                         companion jobs, <name>+replacement, join until the job is back
                         at the node count it started with, at most MAX).
    --no-preload         with --elastic: start each worker as a new 'python -u SCRIPT'
                         (slow: torch and the script's imports every restart) instead of
                         forking it from a server that imported them before the worker's
                         environment (RANK, CUDA_VISIBLE_DEVICES) was set; for scripts
                         whose imports read that environment.
    --dry-run            print the final batch script and sbatch command line only.
    --json               print the job id (or, with --dry-run, script and argv) as JSON.
    --checkpoint-root s3://BUCKET/PREFIX   this job's checkpoints in S3 (not the config's root).
    --s3-endpoint-url URL, --s3-addressing-style auto|path|virtual   how to reach that S3.
    Every other option and argument goes to sbatch unchanged.
    """
    words = tuple(click.get_current_context().meta.get(RAW_WORDS, words))
    line = parse_command_line(list(words))
    ours = _our_options(line)
    job_env = _job_env(dict(ours["job_env"]))  # type: ignore[call-overload]
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
        _refuse_training_directives(path)
        env = [("GLOO_SOCKET_IFNAME", _one_line("$GLOO_SOCKET_IFNAME",
                                                os.environ["GLOO_SOCKET_IFNAME"]))
               ] if os.environ.get("GLOO_SOCKET_IFNAME") else []
        if ours["elastic"] is not None and ours["coordinator"] is not None:
            text, options = _hetjob(config, ours, script, script_args, env, options)
        elif ours["elastic"] is not None:
            endpoint = str(ours["rendezvous"] or default_rendezvous(config))
            text = elastic_script(config, script, script_args, int(ours["nproc"]),  # type: ignore[call-overload]
                                  str(ours["python"]), env, ours["elastic"],  # type: ignore[arg-type]
                                  endpoint, int(ours["join_timeout"]),  # type: ignore[call-overload]
                                  bool(ours["replacements"]), bool(ours["preload"]))
        else:
            text = torchrun_script(config, script, script_args, int(ours["nproc"]),  # type: ignore[call-overload]
                                   str(ours["python"]), env)
        script_args = []
    else:
        try:
            text = path.read_text()
        except UnicodeDecodeError:
            raise BadInputError(f"{script}: not a text file (UTF-8)") from None
    slurm = SlurmVersion.detect(bin_dir=str(config.slurm_bin_dir))
    plan = plan_submission(text, path.name, options, script_args, config.preemption.signal,
                           config.preemption.lead_s, env=os.environ,
                           expedite=bool(slurm and slurm.expedited_requeue))
    for warning in plan.warnings:
        click.echo(f"slurm-spot: warning: {warning}", err=True)
    if job_env and any(o.startswith("--export") and "ALL" not in o for o in options):
        raise BadInputError("--checkpoint-root/--s3-*: the job gets them through its "
                            "environment; add ALL to --export")
    before = {k: os.environ.get(k) for k in job_env}
    os.environ.update(job_env)  # sbatch (run below) exports its environment to the job
    try:
        _submit(app, plan, bool(ours["dry_run"]), bool(ours["json"]))
    finally:
        for key, value in before.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def _refuse_training_directives(path: Path) -> None:
    """With ``--torchrun`` the batch script is generated: ``#SBATCH`` lines in the training
    script (as users of plain sbatch write them in a Python script) would be silently
    dropped, and the job would run without the GPUs, time or partition they ask for.

    Raises:
        BadInputError: the script has some (names them and where they belong).
    """
    from slurm_spot.jobs.submit.sbatch import read_directives

    try:
        text = path.read_text()
    except (UnicodeDecodeError, OSError):
        return  # not a text script: nothing sbatch would read either
    found = [" ".join(d.options) for d in read_directives(text).active]
    if found:
        raise BadInputError(
            f"{path}: #SBATCH lines in a --torchrun training script are not applied (the "
            f"batch script is generated): {'; '.join(found)}; give them on the slurm-spot "
            "sbatch command line instead, and remove them from the script")


#: What each worker node needs (sbatch(1) options, long and short): with
#: ``--coordinator-partition`` they go into the workers' component, not on the command line,
#: which sbatch applies to every component (src/sbatch/opt.c, process_options_second_pass:
#: the command line is read again for each component), so ``--gres=gpu:8`` would ask for
#: GPUs on the coordinator's on-demand node too.
_WORKER_RESOURCES = (
    ("--gres", ""), ("--gpus", "-G"), ("--gpus-per-node", ""), ("--gpus-per-task", ""),
    ("--gpus-per-socket", ""), ("--cpus-per-gpu", ""), ("--mem-per-gpu", ""),
    ("--constraint", "-C"), ("--cpus-per-task", "-c"), ("--mem", ""), ("--mem-per-cpu", ""),
    ("--mincpus", ""), ("--tmp", ""),
)


def _hetjob(config: SpotConfig, ours: dict[str, object], script: str, script_args: list[str],
            env: list[tuple[str, str]], options: list[str]) -> tuple[str, list[str]]:
    """The hetjob batch script, and the command-line options without ``-p``/``-N``, which go
    into the workers' component instead (:func:`~slurm_spot.jobs.submit.sbatch.take_option`).

    Raises:
        BadInputError: see :func:`check_coordinator_partition`; ``-p`` given twice.
    """
    from slurm_spot.jobs.submit.sbatch import take_option

    partitions, options = take_option(options, "--partition", "-p")
    nodes, options = take_option(options, "--nodes", "-N")
    worker_options = []
    for long, short in _WORKER_RESOURCES:
        values, options = take_option(options, long, short or long)
        worker_options += [shlex.quote(f"{long}={_one_line(long, v)}") for v in values]
    if len(set(partitions)) > 1:
        raise BadInputError(f"-p/--partition given twice ({', '.join(partitions)}): the "
                            "workers run on one partition")
    partition = partitions[-1] if partitions else None
    coordinator = str(ours["coordinator"])
    check_coordinator_partition(config, coordinator, partition)
    text = hetjob_script(config, script, script_args, int(ours["nproc"]),  # type: ignore[call-overload]
                         str(ours["python"]), env, ours["elastic"], coordinator,  # type: ignore[arg-type]
                         partition, nodes[-1] if nodes else None,
                         int(ours["join_timeout"]),  # type: ignore[call-overload]
                         worker_options, bool(ours["preload"]))
    return text, options


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
    if not os.access(sbatch, os.X_OK):
        raise BadInputError(f"{sbatch}: no sbatch to submit with (install Slurm's client "
                            "commands, or set slurm_bin_dir in "
                            f"{app.config.source_path}); --dry-run shows the job without it")
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
