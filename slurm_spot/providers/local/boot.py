"""Boot and reclaim helpers of the ``local`` provider, run as detached processes.

``python -m slurm_spot.providers.local.boot --config F NODE ID`` boots instance ID of NODE:
it waits the boot delay (slurmctld accepts a node only if its boot time is later than the
resume request), then re-executes itself inside fresh UTS and time namespaces
(``unshare --uts --time --boottime -<uptime>``: the instance's uptime starts at zero), sets
the hostname to NODE, starts the instance's own ``slurm-spot watch`` and becomes
``slurmd -D -N NODE``. The process id stays the same through every exec, so the provider's
record (pid + start time) identifies the instance.

``--reclaim-after SECONDS`` sleeps, then reclaims that one instance (the end of a notice).
"""

from __future__ import annotations

import argparse
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

from slurm_spot.config import LocalProviderConfig, SpotConfig, load_config


def _local_settings(config: SpotConfig, node: str) -> LocalProviderConfig:
    from slurm_spot.errors import BadInputError
    from slurm_spot.providers.local.provider import provider_for_node

    try:
        return provider_for_node(config, node).settings
    except BadInputError as exc:
        raise SystemExit(str(exc)) from None


def _slurm_conf() -> str:
    return os.environ.get("SLURM_CONF", "/etc/slurm/slurm.conf")


def boot(config_path: str, node: str, instance_id: str) -> None:
    """Wait the boot delay, then exec into the namespaces (never returns)."""
    config = load_config(config_path)
    settings = _local_settings(config, node)
    time.sleep(settings.boot_delay_s)
    # The namespace's uptime starts at the fraction of a second the host's uptime has past
    # its whole seconds (offsets are whole seconds and may not make it negative). slurmd
    # reports boot time = now - uptime; start just after a whole second so that boot time
    # is the namespace's creation, never a second earlier: slurmctld ignores a node whose
    # boot time is not later than the resume request ("not resumed by ResumeTimeout").
    fraction = float(Path("/proc/uptime").read_text().split()[0]) % 1.0
    time.sleep((1.0 - fraction) % 1.0 + 0.01)
    uptime_s = int(float(Path("/proc/uptime").read_text().split()[0]))
    argv = [
        "unshare", "--uts", "--time", f"--boottime=-{uptime_s}", "--",
        sys.executable, "-m", "slurm_spot.providers.local.boot", "--config", config_path,
        "--inside", node, instance_id,
    ]
    os.execvp(argv[0], argv)


def inside(config_path: str, node: str, instance_id: str) -> None:
    """Inside the namespaces: hostname, the watcher, then slurmd in the foreground."""
    config = load_config(config_path)
    settings = _local_settings(config, node)
    socket.sethostname(node)
    log_dir = config.log_dir
    watch_log = open(log_dir / f"watch-{node}.log", "ab")
    subprocess.Popen(  # noqa: S603 - argv list
        [sys.executable, "-m", "slurm_spot", "--config", config_path, "watch", "--node", node,
         "--instance-id", instance_id],
        stdin=subprocess.DEVNULL, stdout=watch_log, stderr=watch_log, close_fds=True,
    )
    argv = [settings.slurmd, "-D", "-N", node, "-f", _slurm_conf()]
    os.execv(argv[0], argv)


def reclaim_after(config_path: str, seconds: float, node: str, instance_id: str) -> None:
    """Sleep ``seconds``, then reclaim instance ``instance_id`` of ``node``."""
    from slurm_spot.providers.local.provider import LocalProvider

    time.sleep(seconds)
    config = load_config(config_path)
    node_set = config.node_set_of(node)
    if node_set is None:
        return
    provider = LocalProvider(config, node_set.provider, _local_settings(config, node))
    provider.reclaim(node, instance_id)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="slurm_spot.providers.local.boot")
    parser.add_argument("--config", required=True)
    parser.add_argument("--inside", action="store_true")
    parser.add_argument("--reclaim-after", type=float)
    parser.add_argument("node")
    parser.add_argument("instance_id")
    args = parser.parse_args(argv)
    if args.reclaim_after is not None:
        reclaim_after(args.config, args.reclaim_after, args.node, args.instance_id)
    elif args.inside:
        inside(args.config, args.node, args.instance_id)
    else:
        boot(args.config, args.node, args.instance_id)


if __name__ == "__main__":
    main()
