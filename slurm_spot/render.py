"""``slurm-spot render``: the slurm.conf fragment and gres.conf for the configured node sets.

The lines are built by pure functions (tested against golden files) and poured into the jinja2
templates under ``templates/``. Keys and their meaning: slurm.conf(5) and gres.conf(5).
"""

from __future__ import annotations

import sysconfig
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from slurm_spot import __version__
from slurm_spot.config import (
    LocalProviderConfig,
    NodeSetConfig,
    PartitionConfig,
    SpotConfig,
)
from slurm_spot.errors import BadInputError
from slurm_spot.hostlist import compress
from slurm_spot.resources import render_template
from slurm_spot.slurm.version import OLDEST_SUPPORTED, SlurmVersion

HOOK_NAMES = ("resume", "suspend", "resume-fail", "prolog", "task-prolog", "epilog",
              "prolog-slurmctld")
FRAGMENT_NAME = "slurm-spot.conf"
GRES_NAME = "gres.conf"


def systemd_unit(name: str, header: str, exec_start: str, user: str,
                 environment: dict[str, str] | None = None,
                 write_paths: Sequence[Path] = ()) -> str:
    """A slurm-spot systemd unit from ``templates/<name>.service.j2``, the copy the Ansible role
    renders too (same variables; the role passes its ``ansible_managed`` header).

    Args:
        name: ``slurm-spot-reconcile`` or ``slurm-spot-watch``.
        header: comment text for the top (lines get ``# ``).
        exec_start: the ``ExecStart=`` command line.
        user: the ``User=`` of the service.
        environment: ``Environment=`` variables (``SLURM_CONF``).
        write_paths: the directories the daemon writes (``ReadWritePaths=``; the rest of the
            file system is read-only to it, ``ProtectSystem=strict``).
    """
    return render_template(f"{name}.service.j2", __slurm_spot_unit_header=header,
                           __slurm_spot_unit_exec_start=exec_start, __slurm_spot_unit_user=user,
                           __slurm_spot_unit_environment=environment or {},
                           __slurm_spot_unit_write_paths=[str(p) for p in dict.fromkeys(write_paths)])


def hook_paths(hooks_dir: Path | None = None) -> dict[str, str]:
    """Absolute paths of the installed hook executables, keyed ``resume``, ``resume_fail``...

    They are installed next to the interpreter's scripts (``<venv>/bin/slurm-spot-resume``)
    with an absolute shebang, because slurmctld runs them with an empty environment.
    """
    folder = hooks_dir or Path(sysconfig.get_path("scripts"))
    return {name.replace("-", "_"): str(folder / f"slurm-spot-{name}") for name in HOOK_NAMES}


def slurm_version() -> SlurmVersion | None:
    """The installed Slurm (:meth:`SlurmVersion.detect`), or None if no Slurm program answers."""
    return SlurmVersion.detect()


def node_shape(config: SpotConfig, index: int) -> NodeSetConfig:
    """Node set ``index`` with what its provider knows filled in where the admin left it unset
    (an EC2 type's CPUs, memory and GPUs from the shipped catalogue, providers/aws/catalog.py);
    see :meth:`~slurm_spot.providers.base.ProviderPackage.node_shape`."""
    from slurm_spot.providers import package_for

    return package_for(config, config.node_sets[index].provider).node_shape(config, index)


def node_lines(config: SpotConfig) -> list[str]:
    """``NodeName=`` lines: one per node set, or one per node for the local provider (each
    local slurmd needs its own ``Port``). ``Weight`` is the node set's place in the cost order
    (:func:`slurm_spot.lifecycle.weights.static_weights`; spot.yaml's ``weight`` with ``power.order:
    weight``).

    Raises:
        ConfigError: an EC2 instance type whose shape is unknown (see :func:`node_shape`).
    """
    from slurm_spot.lifecycle.weights import static_weights

    weights = static_weights(config)
    lines = []
    for index in range(len(config.node_sets)):
        ns = node_shape(config, index)
        common = _node_attributes(ns, weights[ns.name])
        provider = config.providers[ns.provider]
        if isinstance(provider, LocalProviderConfig):
            for i, node in enumerate(ns.node_names, start=1):
                port = provider.port_base + _node_offset(config, ns) + i
                lines.append(
                    f"NodeName={node} NodeHostname=localhost NodeAddr=127.0.0.1 Port={port} {common}"
                )
        else:
            lines.append(f"NodeName={ns.hostlist} {common}")
    return lines


def _node_offset(config: SpotConfig, node_set: NodeSetConfig) -> int:
    offset = 0
    for ns in config.node_sets:
        if ns.name == node_set.name:
            return offset
        offset += ns.count
    return offset


def _node_attributes(ns: NodeSetConfig, weight: int) -> str:
    parts = [f"CPUs={ns.cpus}", f"RealMemory={ns.memory_mib}"]
    if ns.gpus:
        parts.append(f"Gres=gpu:{ns.gpus.type}:{ns.gpus.count}")
    features = [ns.name, ns.market, *ns.features]
    parts.append(f"Feature={','.join(dict.fromkeys(features))}")
    parts.append(f"Weight={weight}")
    parts.append("State=CLOUD")
    return " ".join(parts)


def partition_lines(config: SpotConfig, version: SlurmVersion | None) -> list[str]:
    """``PartitionName=`` lines.

    Raises:
        BadInputError: a partition overrides SuspendTime/ResumeTimeout but the installed Slurm
            is older than 23.02, which has no such partition options (slurm.conf(5)).
    """
    return [_partition_line(config, part, version) for part in config.partitions]


def _partition_line(
    config: SpotConfig, part: PartitionConfig, version: SlurmVersion | None
) -> str:
    nodes = compress(n for name in part.node_sets for n in config.node_set(name).node_names)
    line = f"PartitionName={part.name} Nodes={nodes} MaxTime={part.max_time} State=UP"
    if part.default:
        line += " Default=YES"
    overrides = {"SuspendTime": part.suspend_time_s, "ResumeTimeout": part.resume_timeout_s}
    for key, value in overrides.items():
        if value is None:
            continue
        if version is not None and not version.partition_power_options:
            raise BadInputError(
                f"partitions: {part.name}: {key} per partition needs Slurm 23.02 or newer; "
                f"this Slurm is {version}. Remove the override or set it under 'power:'."
            )
        line += f" {key}={value}"
    return line


def gres_lines(config: SpotConfig) -> list[str]:
    """gres.conf lines for every node set with GPUs (``File=/dev/nvidia[0-N]``)."""
    lines = []
    for index in range(len(config.node_sets)):
        ns = node_shape(config, index)
        if ns.gpus:
            last = ns.gpus.count - 1
            files = "/dev/nvidia0" if last == 0 else f"/dev/nvidia[0-{last}]"
            lines.append(f"NodeName={ns.hostlist} Name=gpu Type={ns.gpus.type} File={files}")
    return lines


def slurm_parameters(version: SlurmVersion | None) -> list[str]:
    """The power-saving parameter lines that depend on the Slurm release.

    - ``SlurmctldParameters=idle_on_node_suspend`` always; ``cloud_reg_addrs`` and
      ``CommunicationParameters=NoAddrCache`` only before 23.11, which made cloud_reg_addrs'
      behaviour the default and removed both (a 24.11/26.05 slurmctld logs them as "defunct",
      :attr:`SlurmVersion.addr_cache_options`).
    - ``enable_expedited_requeue`` from 25.11, without which ``--requeue=expedite`` (added by
      ``slurm-spot sbatch`` there) does nothing (:attr:`SlurmVersion.expedited_requeue`).
    - ``SchedulerParameters=requeue_delay=`` is not rendered here: this fragment is included
      into the site's slurm.conf, whose own SchedulerParameters line it would replace. The
      local cluster, whose slurm.conf is all ours, sets it (templates/slurm.conf.j2).
    """
    slurm = version or OLDEST_SUPPORTED
    ctld = ["idle_on_node_suspend"]
    if slurm.addr_cache_options:
        ctld.append("cloud_reg_addrs")
    if slurm.expedited_requeue:
        ctld.append("enable_expedited_requeue")
    lines = [f"SlurmctldParameters={','.join(ctld)}"]
    if slurm.addr_cache_options:
        lines.append("CommunicationParameters=NoAddrCache")
    return lines


def suspend_exc_nodes(config: SpotConfig) -> str | None:
    """slurm.conf's ``SuspendExcNodes`` for the node sets with hot spares (``spares: N``):
    ``<node set hostlist>:<N>`` per node set, comma separated (``spot-[1-4]:1,gpu-[1-2]:2``),
    or None when no node set has spares (:func:`slurm_spot.lifecycle.spares.suspend_exc_value`).

    slurm.conf(5) of 22.05 (the man page installed here), 24.11 and 26.05: the ``:<count>``
    form keeps that many nodes of the set from being powered down. It powers none up, which
    the reconciler does (:func:`slurm_spot.lifecycle.spares.spares_to_power_up`); from 24.05 the count
    includes busy nodes, which the reconciler adds at run time. Not ``SuspendExcStates``,
    which is 23.02+ (a 22.05 daemon refuses the unknown key).
    """
    from slurm_spot.lifecycle.spares import suspend_exc_value

    return suspend_exc_value(config)


@dataclass(frozen=True)
class Rendered:
    """The rendered files: name -> text."""

    files: dict[str, str]


def render(
    config: SpotConfig,
    hooks_dir: Path | None = None,
    version: SlurmVersion | tuple[int, int] | str | None = None,
) -> Rendered:
    """Render ``slurm-spot.conf`` and ``gres.conf`` (pure: writes nothing) for the Slurm
    ``version`` the controller runs (see :func:`slurm_parameters`); None when unknown renders
    for the oldest supported release and says so in the file.

    Raises:
        BadInputError: see :func:`partition_lines`; ``version`` is not a Slurm version.
    """
    slurm = SlurmVersion.of(version)
    gres = gres_lines(config)
    context = {
        "version": __version__,
        "config_path": str(config.source_path),
        "hooks": hook_paths(hooks_dir),
        "power": config.power,
        "requeue_exit_code": config.preemption.requeue_exit_code,
        "node_lines": node_lines(config),
        "partition_lines": partition_lines(config, slurm),
        "slurm_version": str(slurm) if slurm else None,
        "oldest": str(OLDEST_SUPPORTED),
        "parameters": slurm_parameters(slurm),
        "one_prolog_slurmctld": not (slurm or OLDEST_SUPPORTED).multiple_prolog_slurmctld,
        "suspend_exc_nodes": suspend_exc_nodes(config),
        "gres_types": ["gpu"] if gres else [],
        "gres_lines": gres,
    }
    return Rendered(
        {
            FRAGMENT_NAME: render_template("slurm-spot.conf.j2", **context),
            GRES_NAME: render_template("gres.conf.j2", **context),
        }
    )


def write_rendered(rendered: Rendered, output_dir: Path) -> list[Path]:
    """Write each file atomically (temp file + rename) into ``output_dir``; returns paths."""
    output_dir.mkdir(parents=True, exist_ok=True)
    written = []
    for name, text in sorted(rendered.files.items()):
        path = output_dir / name
        tmp = path.with_name(f".{name}.tmp")
        tmp.write_text(text)
        tmp.replace(path)
        written.append(path)
    return written
