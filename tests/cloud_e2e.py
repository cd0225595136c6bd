"""Shared pieces of the end-to-end tests of the cloud providers (tests/test_aws_e2e.py,
tests/test_gcp_e2e.py, tests/test_instances_e2e.py): a real local slurmctld whose node sets
belong to a fake cloud, and helpers to run slurm-spot with extra environment."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from slurm_spot.jsonenvelope import read_envelope
from tests.cluster import Cluster, base_config, wait_for

#: The fields of every entry of ``slurm-spot instances --json``, whatever the provider.
INSTANCE_FIELDS = frozenset({
    "provider", "instance_id", "node", "node_set", "state", "market", "instance_type", "zone",
    "launch_time", "private_ip", "state_reason",
})


def cloud_config(root: Path, providers: dict[str, Any], node_sets: list[dict[str, Any]],
                 partitions: list[dict[str, Any]]) -> dict[str, Any]:
    """The test cluster's spot.yaml data with cloud node sets instead of local ones (short
    power timers from :func:`tests.cluster.base_config`)."""
    return base_config(root, providers=providers, node_sets=node_sets, partitions=partitions)


@contextmanager
def running_cluster(root: Path, config: dict[str, Any]) -> Iterator[Cluster]:
    """Start the cluster (holding the cluster lock), stop it whatever happens."""
    cluster = Cluster(root, config)
    cluster.start()
    try:
        yield cluster
    finally:
        cluster.stop()


def spot(cluster: Cluster, *args: str, env: Mapping[str, str] | None = None,
         check: bool = True, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """``slurm-spot --config <spot.yaml> ARGS`` with ``env`` added to the cluster's env."""
    argv = [sys.executable, "-m", "slurm_spot", "--config", str(cluster.spot_yaml), *args]
    proc = subprocess.run(argv, env={**cluster.env, **(env or {})}, capture_output=True,
                          text=True, timeout=timeout, check=False)
    if check and proc.returncode != 0:
        raise AssertionError(f"{argv} -> {proc.returncode}\n{proc.stdout}\n{proc.stderr}")
    return proc


def spot_json(cluster: Cluster, *args: str, env: Mapping[str, str] | None = None) -> Any:
    """``slurm-spot ARGS --json``, parsed."""
    return read_envelope(spot(cluster, *args, "--json", env=env).stdout)


def alive_instances(cluster: Cluster) -> dict[str, dict[str, Any]]:
    """node -> entry of ``slurm-spot instances --json`` (alive instances only)."""
    return {i["node"]: i for i in cluster.instances() if i["node"]}


def state_flags(cluster: Cluster, node: str) -> set[str]:
    """The node's state as a set of words (``IDLE``, ``CLOUD``, ``POWERED_DOWN``...)."""
    return set(cluster.node(node)["State"].split("+"))


def wait_powered_down(cluster: Cluster, node: str, timeout: float = 60) -> None:
    """Wait until ``node`` is ``idle~``: IDLE, POWERED_DOWN, not DOWN."""
    wait_for(lambda: {"IDLE", "POWERED_DOWN"} <= state_flags(cluster, node)
             and "DOWN" not in state_flags(cluster, node),
             timeout=timeout, what=f"{node} idle~")


def wait_node_set_cooled(cluster: Cluster, failed: str, others: list[str], code: str) -> None:
    """After ``failed`` got no capacity: each of ``others`` (the node set's other nodes) that
    is powered down is DOWN with ``(Code:<code>)Temporarily disabled until <T>``,
    so its jobs try the partition's next node set, not this one again (issue 24); the nodes
    that are up keep their jobs."""
    from slurm_spot.slurm.reasons import COOLDOWN_TEXT

    def cooled() -> bool:
        for node in others:
            flags = state_flags(cluster, node)
            if "POWERED_DOWN" in flags and not (
                    cluster.node(node).get("Reason", "").startswith(
                        f"(Code:{code}){COOLDOWN_TEXT}") and "DOWN" in flags):
                return False
        return True

    wait_for(cooled, timeout=20, what=f"the node set of {failed} cooled down")
    # The failed node itself keeps its launch-failure reason, or, where slurmctld kept its job
    # pending with Reason=Cleaning, the failover worker set it DOWN again with the node set's
    # cooldown (slurm_spot/lifecycle/failover.py, CLEANING_NUDGE_S): never a plain, powered-up DOWN.
    reason = cluster.node(failed).get("Reason", "")
    assert reason.startswith(f"(Code:{code})"), reason
    flags = state_flags(cluster, failed)
    assert "DOWN" not in flags or flags & {"POWERED_DOWN", "POWERING_DOWN"}, flags


def wait_failed_node_powered_down(cluster: Cluster, node: str, code: str,
                                  seen: list[set[str]] | None = None,
                                  timeout: float = 30) -> set[str]:
    """Wait until ``node``, whose launch failed with provider code ``code``, is powered down
    again, and return its state's words; ``seen`` collects every state read.

    It is ``idle~`` with its ``(Code:<code>)`` reason (slurmctld powers the hook's DOWN node
    down), or ``down~`` with its node set's cooldown reason: where slurmctld kept the node's
    requeued job pending with Reason=Cleaning, the failover worker set the node DOWN again
    with that reason (slurm_spot/lifecycle/failover.py, CLEANING_NUDGE_S). Never a plain ``down``."""
    from slurm_spot.slurm.reasons import COOLDOWN_TEXT

    states = seen if seen is not None else []

    def powered_down() -> bool:
        states.append(state_flags(cluster, node))
        return "POWERED_DOWN" in states[-1]

    wait_for(powered_down, timeout=timeout, interval=0.2, what=f"{node} powered down")
    flags = states[-1]
    reason = cluster.node(node).get("Reason", "")
    if "DOWN" in flags:
        assert reason.startswith(f"(Code:{code}){COOLDOWN_TEXT}"), (flags, reason)
    else:
        assert "IDLE" in flags and reason.startswith(f"(Code:{code})"), (flags, reason)
    return flags


def forget_addresses(cluster: Cluster, *nodes: str) -> None:
    """Point ``nodes`` back at their own names, as slurmctld does when it powers a cloud node
    down: a CLI-only suspend leaves the instance's (here unreachable) address in Slurm."""
    for node in nodes:
        cluster.slurm("scontrol", "update", f"nodename={node}", f"nodeaddr={node}",
                      f"nodehostname={node}")


def cancel_all(cluster: Cluster) -> None:
    """Cancel every job of the cluster."""
    subprocess.run(["scancel", "-u", "root"], env=cluster.env, capture_output=True,
                   timeout=30, check=False)


def run_job(cluster: Cluster, *args: str, timeout: float = 150) -> dict[str, str]:
    """Submit a batch job and wait until it has ended; returns its ``scontrol show job``
    fields then. Polls every 0.5 s: ``sbatch --wait`` notices the end up to ~20 s late, long
    enough for an idle cloud node to be suspended meanwhile."""
    job = cluster.sbatch(*args)
    ended = ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY")

    def finished() -> dict[str, str] | None:
        fields = cluster.job(job)
        return fields if fields.get("JobState") in ended else None

    fields = wait_for(finished, timeout=timeout, what=f"job {job} to end")
    assert isinstance(fields, dict)
    return fields


def log_tail(path: Path, lines: int = 40) -> str:
    """The last lines of a log file (for assertion messages)."""
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return f"({path} unreadable)"


def no_aws_env() -> dict[str, str]:
    """The test process's environment without AWS settings (a hook's view: none at all)."""
    return {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
