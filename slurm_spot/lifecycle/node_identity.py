"""Which Slurm node this host is, for the watcher and slurmd on a cloud instance.

A cloud instance boots with its provider's hostname (``ip-10-0-1-23`` on EC2,
``<cluster>-<node>`` on GCE, where slurm-spot names instances so), not with its Slurm node name,
and a watcher started by systemd has no ``SLURMD_NODENAME``. The resume hook records every
instance's private address as its node's ``NodeAddr`` (``scontrol update nodename=...
nodeaddr=...``), so an instance can find its node by its own address. The first rule that
gives a node of the config wins:

1. the name given (``--node``);
2. ``SLURMD_NODENAME`` (set by slurmd for prologs, epilogs and job steps);
3. the short hostname, or the hostname without the ``<cluster>-`` prefix of GCE instance names;
4. the one node of the config whose ``NodeAddr`` is an address of this host, asked of
   slurmctld (loopback addresses never count: every local-provider node has 127.0.0.1), and
   that is not powered down or powering down: such a node keeps the address of its reclaimed
   instance, which the provider may hand to a new one.

:func:`slurmd_instance_args` gives the same unit the ``--instance-id``/``--instance-type`` that
slurmd 23.11+ registers with (``slurm-spot node-name --slurmd``).
"""

from __future__ import annotations

import ipaddress
import logging
import math
import os
import re
import socket
import time
from collections.abc import Callable, Collection, Iterable, Mapping

from slurm_spot.config import SpotConfig
from slurm_spot.errors import BadInputError, SlurmCommandError
from slurm_spot.slurm.client import CommandResult, Node, SlurmClient, run_command

log = logging.getLogger(__name__)


def host_addresses() -> set[str]:
    """This host's non-loopback IP addresses (IPv4 and IPv6, no prefix length).

    Read from ``ip -o addr show`` (iproute2), plus what the hostname resolves to; an empty set
    when neither answers.
    """
    found: set[str] = set()
    try:
        out = run_command(["ip", "-o", "addr", "show"], 5).stdout
    except SlurmCommandError:
        out = ""
    for line in out.splitlines():
        words = line.split()
        for key in ("inet", "inet6"):
            if key in words and words.index(key) + 1 < len(words):
                found.add(words[words.index(key) + 1].split("/")[0])
    try:
        for info in socket.getaddrinfo(socket.gethostname(), None):
            found.add(str(info[4][0]))
    except OSError:
        pass
    return {a for a in found if _usable(a)}


def _ip(address: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    """``address`` as an IP address (IPv6 zone id dropped), None if it is none."""
    try:
        return ipaddress.ip_address(address.split("%")[0])
    except ValueError:
        return None


def _usable(address: str) -> bool:
    ip = _ip(address)
    return ip is not None and not (ip.is_loopback or ip.is_link_local or ip.is_unspecified)


def node_by_hostname(config: SpotConfig, hostname: str) -> str | None:
    """The node named by ``hostname`` (short form, any case), also as a GCE instance name
    ``<cluster>-<node>``; None if it names no node of the config.

    Raises:
        BadInputError: both readings name a node (node sets ``gpu`` and ``<cluster>-gpu``).
    """
    short = hostname.split(".")[0].lower()
    prefix = f"{config.cluster.lower()}-"
    readings = {short, short[len(prefix):] if short.startswith(prefix) else ""}
    nodes = sorted(n for n in readings if n and config.node_set_of(n) is not None)
    if len(nodes) > 1:
        raise BadInputError(f"hostname {hostname!r} names two nodes ({', '.join(nodes)}): "
                            "pass --node")
    return nodes[0] if nodes else None


def node_by_address(config: SpotConfig, nodes: Iterable[Node], addresses: Collection[str]) -> str | None:
    """The one node of the config whose NodeAddr is in ``addresses`` (pure), compared as IP
    addresses; powered-down and powering-down nodes are left out (their address is stale).

    Raises:
        BadInputError: several nodes have one of these addresses (addresses are per instance,
            so the Slurm records are stale; the error names the nodes).
    """
    mine = {_ip(a) for a in addresses} - {None}
    matches = sorted(n.name for n in nodes
                     if _ip(n.addr) in mine and config.node_set_of(n.name) is not None
                     and not (n.state.is_powered_down or n.state.is_powering_down))
    if len(matches) > 1:
        raise BadInputError(f"several nodes have this host's address as NodeAddr: "
                            f"{', '.join(matches)}; pass --node")
    return matches[0] if matches else None


def resolve_node_name(
    config: SpotConfig,
    client: SlurmClient,
    explicit: str | None = None,
    env: Mapping[str, str] = os.environ,
    hostname: str | None = None,
    addresses: Collection[str] | None = None,
    wait_s: float = 0.0,
    poll_s: float = 5.0,
    sleep: Callable[[float], None] = time.sleep,
    clock: Callable[[], float] = time.monotonic,
) -> str:
    """This host's Slurm node name, by the rules of the module docstring.

    Args:
        explicit: a name given by the user (``--node``); must be a node of the config.
        env: for ``SLURMD_NODENAME`` (empty counts as unset).
        hostname, addresses: this host's (default: :func:`socket.gethostname`, and
            :func:`host_addresses` read again on every try: the network may come up late).
        wait_s: how long (seconds, finite) to keep asking slurmctld when no node has this
            host's address yet (the resume hook records it right after launch; an instance
            can boot first); 0 asks once. A slow scontrol can add its own timeout to this.
        poll_s: seconds between two questions.

    Raises:
        BadInputError: the name given is empty or belongs to no node set, ``wait_s`` is not
            a finite number >= 0, or no node is this host after ``wait_s`` (the message lists
            the hostname and addresses tried).
        SlurmCommandError: slurmctld never answered (scontrol missing, failing, timing out).
    """
    if explicit is not None:
        given = explicit
        if not given.strip():
            raise BadInputError("--node: empty node name")
    else:
        given = env.get("SLURMD_NODENAME", "")
    if given:
        if config.node_set_of(given) is None:
            raise BadInputError(f"node {given!r} belongs to no node set of {config.source_path}")
        return given
    if not (math.isfinite(wait_s) and wait_s >= 0):
        raise BadInputError(f"--wait: {wait_s} is not a number of seconds >= 0")
    host = hostname if hostname is not None else socket.gethostname()
    named = node_by_hostname(config, host)
    if named:
        return named
    deadline = clock() + wait_s
    answered = False
    failure: SlurmCommandError | None = None
    while True:
        mine = set(addresses) if addresses is not None else host_addresses()
        if mine:
            try:
                found = node_by_address(config, client.nodes(with_jobs=False), mine)
                answered = True
            except SlurmCommandError as exc:
                log.warning("cannot read the nodes from slurmctld: %s", exc)
                failure, found = exc, None
            if found:
                return found
        if clock() >= deadline:
            if failure is not None and not answered:
                raise failure
            raise BadInputError(
                f"this host (hostname {host!r}, addresses {', '.join(sorted(mine)) or 'none'}) "
                f"is no node of {config.source_path}: no node is named so and none has one of "
                "these addresses as NodeAddr" + (f" after {wait_s:g} s" if wait_s else "")
                + "; pass --node")
        sleep(min(poll_s, max(0.0, deadline - clock())))


#: What an instance id or type may look like on the slurmd command line (EC2 ``i-0abc...``,
#: ``g5.xlarge``; GCE instance names, ``a2-highgpu-1g``): anything else is not passed on.
_INSTANCE_WORD = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:-]{0,127}$")


def slurmd_instance_args(
    config: SpotConfig, node: str, slurmd: str,
    run: Callable[[list[str], float], CommandResult] = run_command,
) -> list[str]:
    """The options that make slurmd register node ``node`` with this instance's id and type:
    ``["--instance-id", ID, "--instance-type", TYPE]``, or ``[]`` when they cannot or need
    not be given. Never raises: slurmd must start either way (each reason is logged).

    slurmd(8) of Slurm 23.11 and later has ``--instance-id`` and ``--instance-type`` ("Set
    cloud instance ID/type on node startup"; NEWS, "Changes in Slurm 23.11.0rc1": "slurmd -
    add "instance-id", "instance-type", and "extra" options to allow them to be set on
    startup"; docs/slurm-versions.md). Without them a 23.11+ slurmd registers no id, and the
    InstanceId/InstanceType the resume hook recorded (``scontrol update``) are not what the
    node reports. The version is that of ``slurmd -V`` at ``slurmd`` (the one the drop-in
    starts); the id and type come from the node's provider
    (:meth:`~slurm_spot.providers.base.ProviderPackage.instance_identity`: IMDS on EC2, the
    metadata server on GCE; none for ``local``).
    """
    from slurm_spot.errors import ProviderError
    from slurm_spot.providers import package_for
    from slurm_spot.slurm.version import SlurmVersion

    try:
        version = SlurmVersion.parse(run([slurmd, "-V"], 10).stdout)
    except (SlurmCommandError, BadInputError) as exc:
        log.warning("slurmd at %s: no version (%s); starting it without --instance-id",
                    slurmd, exc)
        return []
    if not version.instance_fields:
        return []
    node_set = config.node_set_of(node)
    if node_set is None:
        return []
    try:
        identity = package_for(config, node_set.provider).instance_identity(
            config, node, config.providers[node_set.provider])
    except ProviderError as exc:
        log.warning("this instance's id is unknown (%s); slurmd starts without --instance-id",
                    exc)
        return []
    if identity is None:
        return []
    instance_id, instance_type = identity
    if not _INSTANCE_WORD.match(instance_id):
        log.warning("instance id %r from the metadata service is not passed to slurmd",
                    instance_id[:80])
        return []
    args = ["--instance-id", instance_id]
    if _INSTANCE_WORD.match(instance_type):
        args += ["--instance-type", instance_type]
    return args
