"""The batch scripts ``slurm-spot sbatch --torchrun`` generates (plain, elastic, elastic with
an on-demand coordinator), and the checks of what goes into them: run as the user at
submission. The command (``commands/sbatch.py``) only parses options and prints; what it asks
of Slurm goes through :class:`~slurm_spot.slurm.client.SlurmClient`.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Mapping, Sequence
from pathlib import Path

from slurm_spot import __version__
from slurm_spot.config import SpotConfig
from slurm_spot.contract.directives import option_values, read_directives
from slurm_spot.contract.jobenv import parse_signal
from slurm_spot.contract.names import ELASTIC_MARK, ENV_RENDEZVOUS
from slurm_spot.errors import BadInputError, SlurmCommandError
from slurm_spot.jobs.services.rendezvous import (
    DEFAULT_PORT,
    HETJOB_PORT_BASE,
    format_endpoint,
    parse_endpoint,
    parse_host,
)
from slurm_spot.jobs.submit.sbatch import take_option
from slurm_spot.rawtext import decode
from slurm_spot.resources import render_template
from slurm_spot.slurm.client import SlurmClient


def torchrun_script(config: SpotConfig, script: str, args: list[str], nproc_per_node: int,
                    python: str, env: list[tuple[str, str]], preload: bool = True) -> str:
    """The batch script that starts one torchrun agent per node for ``script`` (pure), one
    job step on every node (``srun --ntasks-per-node=1``). ``preload`` (the default): the
    agents start their workers warm, as forks of a server that imported torch and the
    script's imports (:mod:`slurm_spot.jobs.injob.warm_worker`); False: the agents get
    ``--no-preload`` and each worker starts as ``python -u SCRIPT`` (torchrun's own way).
    The script's first line of output names the job, its restart count, its nodes and the
    time it started (bash's ``$EPOCHREALTIME``, seconds since the epoch), which
    ``slurm-spot demo`` reads for its start-up breakdown (slurm_spot/recovery.py)."""
    return render_template("torchrun-batch.sh.j2",
                           **_torchrun_fields(config, script, args, nproc_per_node, python, env),
                           preload=preload)


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
    preempt = parse_signal(config.preemption.signal)
    one_line("--rendezvous", endpoint)
    one_line("--python", python)
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
    preempt = parse_signal(config.preemption.signal)
    one_line("--coordinator-partition", coordinator_partition)
    one_line("--partition", partition or "")
    one_line("--python", python)
    return render_template("torchrun-elastic-hetjob.sh.j2",
        **_torchrun_fields(config, script, args, nproc_per_node, python, env),
        min_nodes=nodes[0], max_nodes=nodes[1], join_timeout_s=join_timeout_s,
        signal_name=preempt.name, signalled_exit_code=128 + preempt.number,
        coordinator_partition=coordinator_partition, partition=partition,
        worker_nodes=worker_nodes or f"{nodes[0]}-{nodes[1]}", port_base=HETJOB_PORT_BASE,
        worker_options=list(worker_options), preload=preload,
    )


def check_coordinator_partition(slurm: SlurmClient, coordinator: str,
                                 partition: str | None) -> None:
    """``--coordinator-partition P`` must name a partition Slurm has (``scontrol show
    partition P`` through ``slurm``; skipped where there is no scontrol, as for a
    ``--dry-run`` elsewhere) and not the workers' (``-p``).

    Raises:
        BadInputError: P is the workers' partition, or Slurm does not know it.
        SlurmCommandError: scontrol is there but did not answer.
    """
    if not re.fullmatch(r"[A-Za-z0-9._-]+", coordinator):
        raise BadInputError(f"--coordinator-partition={coordinator!r}: not a partition name")
    if partition is not None and coordinator == partition:
        raise BadInputError(f"--coordinator-partition={coordinator} is also the workers' "
                            "partition (-p): the coordinator belongs on an on-demand partition "
                            "of its own")
    if not slurm.has_command("scontrol"):
        return
    if not slurm.partition_exists(coordinator):
        raise BadInputError(f"--coordinator-partition={coordinator}: Slurm has no such "
                            "partition (scontrol show partition)")


def refuse_spot_coordinator(config: SpotConfig, coordinator: str) -> None:
    """``--coordinator-partition P`` must not be a spot partition of spot.yaml: the coordinator
    (the elastic job's rendezvous store, the fault-tolerant job's lighthouse) must run where no
    reclaim takes it (docs/ml-engineer.md). A partition spot.yaml does not define (the
    site's own) is not judged here.

    Raises:
        BadInputError: every node set of spot.yaml's partition P is on the spot market (names
            the partition, its node sets and the config file).
    """
    for partition in config.partitions:
        if partition.name != coordinator:
            continue
        markets = {name: config.node_set(name).market for name in partition.node_sets}
        if all(market == "spot" for market in markets.values()):
            raise BadInputError(
                f"--coordinator-partition={coordinator}: its node sets "
                f"({', '.join(markets)}) are spot in {config.source_path}, so a reclaim can "
                "take the coordinator; give an on-demand partition")


def default_rendezvous(slurm: SlurmClient, env: Mapping[str, str]) -> str:
    """Where elastic jobs rendezvous unless ``--rendezvous`` says: ``$SLURM_SPOT_RENDEZVOUS``
    in ``env`` (checked as ``--rendezvous`` is; set but empty is an error too), else the
    controller (``SlurmctldHost``'s address, else its name, from ``scontrol show config``
    through ``slurm``) at :data:`~slurm_spot.jobs.services.rendezvous.DEFAULT_PORT`.

    Raises:
        BadInputError: neither is known, or scontrol cannot be run (names --rendezvous);
            ``$SLURM_SPOT_RENDEZVOUS`` is no HOST:PORT (names the variable).
    """
    if ENV_RENDEZVOUS in env:
        return format_endpoint(*parse_endpoint(env[ENV_RENDEZVOUS], f"${ENV_RENDEZVOUS}"))
    try:
        host = slurm.controller_host()
    except SlurmCommandError as exc:  # no scontrol here (a --dry-run off the cluster)
        raise BadInputError(f"--elastic: cannot tell where the controller is ({exc}); give "
                            "--rendezvous HOST:PORT (slurm-spot rendezvous)") from None
    if host is None:
        raise BadInputError("--elastic: cannot tell where the controller is (scontrol show "
                            "config); give --rendezvous HOST:PORT (slurm-spot rendezvous)")
    return format_endpoint(parse_host(host, "SlurmctldHost (scontrol show config); give "
                                      "--rendezvous HOST:PORT instead"), DEFAULT_PORT)


def one_line(where: str, value: str) -> str:
    """``value`` if it has no line break (a value rendered into the batch script must not
    start a line of its own there).

    Raises:
        BadInputError: it has one (names ``where``).
    """
    if any(c in value for c in "\n\r\x0b\x0c\x1c\x1d\x1e\x85\u2028\u2029"):
        raise BadInputError(f"{where}={value!r}: the value must be one line")
    return value


def check_nodes_within(options: list[str], elastic: tuple[int, int]) -> None:
    """An ``-N``/``--nodes`` given with ``--elastic MIN:MAX`` must lie within MIN..MAX: sbatch's
    -N replaces the script's ``--nodes=MIN-MAX``, and a job given fewer than MIN nodes can
    never form its rendezvous (it would be requeued forever); nodes beyond MAX get no rank.

    Raises:
        BadInputError: it does not, or it is not ``N`` or ``A-B`` (names both options).
    """
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


def refuse_training_directives(path: Path) -> None:
    """With ``--torchrun`` the batch script is generated: ``#SBATCH`` lines in the training
    script (as users of plain sbatch write them in a Python script) would be silently
    dropped, and the job would run without the GPUs, time or partition they ask for.

    Raises:
        BadInputError: the script has some (names them and where they belong).
    """
    try:
        text = decode(path.read_bytes())  # a Latin-1 comment does not hide its directives
    except OSError:
        return  # unreadable: the job's own start says so
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
WORKER_RESOURCES = (
    ("--gres", ""), ("--gpus", "-G"), ("--gpus-per-node", ""), ("--gpus-per-task", ""),
    ("--gpus-per-socket", ""), ("--cpus-per-gpu", ""), ("--mem-per-gpu", ""),
    ("--constraint", "-C"), ("--cpus-per-task", "-c"), ("--mem", ""), ("--mem-per-cpu", ""),
    ("--mincpus", ""), ("--tmp", ""),
)



def split_hetjob_options(options: Sequence[str]) -> tuple[str | None, str | None, list[str],
                                                          list[str]]:
    """For ``--coordinator-partition``: ``(partition, nodes, worker_options, rest)``, the
    workers' ``-p`` and ``-N`` (None when not given) and :data:`WORKER_RESOURCES` (as
    shell-quoted ``--option=value`` words) taken out of the command line's sbatch
    ``options``, which go into the workers' component instead, and the options left
    (:func:`~slurm_spot.jobs.submit.sbatch.take_option`).

    Raises:
        BadInputError: ``-p`` given twice with different partitions; a value is not one line.
    """
    partitions, rest = take_option(options, "--partition", "-p")
    nodes, rest = take_option(rest, "--nodes", "-N")
    worker_options = []
    for long, short in WORKER_RESOURCES:
        values, rest = take_option(rest, long, short or long)
        worker_options += [shlex.quote(f"{long}={one_line(long, v)}") for v in values]
    if len(set(partitions)) > 1:
        raise BadInputError(f"-p/--partition given twice ({', '.join(partitions)}): the "
                            "workers run on one partition")
    return (partitions[-1] if partitions else None, nodes[-1] if nodes else None,
            worker_options, rest)
